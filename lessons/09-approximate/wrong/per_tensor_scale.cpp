// expect: half a step
// A plausible mistake: one scale and minimum for the whole block, stored in every group's place.
// The block has the size it should, but an outlier channel stretches every other group's step.
#define quantize reference_quantize  // the reference solution, its quantize renamed out of the way
#include "../solution/lab.cpp"
#undef quantize

namespace kvlab::lab09 {

QuantBlock quantize(std::span<const float> x, int rows, int cols, Axis axis, int group, int bits) {
    // The block as a single group of rows * cols values...
    QuantBlock q = reference_quantize(x, 1, rows * cols, Axis::per_token, rows * cols, bits);
    // ...its one range copied into each group's slot.
    const std::size_t n = std::size_t(axis == Axis::per_token ? rows * (cols / group) : (rows / group) * cols);
    q.scales.assign(n, q.scales[0]);
    q.mins.assign(n, q.mins[0]);
    return q;
}

}  // namespace kvlab::lab09
