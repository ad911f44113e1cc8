# expect: which the ring does not hold
# The window lists every position 0..pos, as if the cache's ring did the evicting; the ring no
# longer holds the positions that fell out of the window, so a query past S + W asks for rows
# that are gone.
s|^int window_positions(int pos, int sinks, int window, int\* positions) {|&\
    (void)sinks, (void)window;  // the mistake: no window at all\
    for (int t = 0; t <= pos; t++) positions[t] = t;\
    return pos + 1;|
