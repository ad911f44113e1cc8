// expect: attention sinks
// A plausible mistake: a plain sliding window over the last W positions, without the sinks.
// StreamingLLM's point is that softmax parks mass on the first tokens; evicting them hurts.
#include <algorithm>

#define window_positions reference_window_positions  // the reference solution, its window renamed
#include "../solution/lab.cpp"
#undef window_positions

namespace kvlab::lab09 {

int window_positions(int pos, int sinks, int window, int* positions) {
    (void)sinks;
    int n = 0;
    for (int t = std::max(0, pos - window + 1); t <= pos; t++) positions[n++] = t;
    return n;
}

}  // namespace kvlab::lab09
