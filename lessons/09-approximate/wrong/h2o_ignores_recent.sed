# expect: inside the recent window
# Every kept position is a candidate, the recent ones too: a light recent position (the query's
# own neighbour, which no later query has had time to weigh) is evicted, which H2O never does.
s|j < int(kept.size()) && kept\[std::size_t(j)\] <= pos - recent;|j < int(kept.size());|
/^int h2o_victim/,/^}/ s|^    int best = -1;$|    int best = -1;\
    (void)pos, (void)recent;  // what the mistake leaves unused|
