// Lab 9: approximate caches. Fill in the six TODOs; `lessons/grade 9` grades this file.
//
// A block is rows x cols floats, row-major (element (r, c) at i = r * cols + c). In kvlab's
// quantized cache a value row is a [1, head_size] block quantized per token, and a KIVI key group
// is a [group, head_size] block (group consecutive positions) quantized per channel. lab.h says
// which elements form group number gi in each case, and the formulas for scale, code and x_hat.
//
// Helpers you may use (core/quantized_cache.h):
//   QuantizedCache::put_code(codes, i, code, bits)  stores code i (int4: two codes per byte)
//   QuantizedCache::get_code(codes, i, bits)        reads it back
#include <cmath>

#include "grader.h"
#include "lab.h"

namespace kvlab::lab09 {

// TODO 1 (quantize): for each group, its min and max, scale = (max - min) / (2^bits - 1), and
// each element's code = round((x - min) / scale) clamped to [0, 2^bits - 1] (scale 0: code 0).
// codes: ceil(rows * cols * bits / 8) bytes; scales and mins: one per group, in lab.h's order.
QuantBlock quantize(std::span<const float> x, int rows, int cols, Axis axis, int group, int bits) {
    (void)x, (void)rows, (void)cols, (void)axis, (void)group, (void)bits;
    throw lessons::NotImplemented("quantize");
}

// TODO 2 (dequantize): x_hat[i] = code_i * scale + min of element i's group, in float, from the
// block alone.
void dequantize(const QuantBlock& q, int rows, int cols, Axis axis, int group, int bits, std::span<float> x_hat) {
    (void)q, (void)rows, (void)cols, (void)axis, (void)group, (void)bits, (void)x_hat;
    throw lessons::NotImplemented("dequantize");
}

// TODO 3 (the window): the positions a query at pos reads: the sinks, then the last `window`
// positions up to pos, each once, in increasing order. Early on (pos + 1 <= sinks + window) that
// is every position 0..pos. Return how many you wrote.
int window_positions(int pos, int sinks, int window, int* positions) {
    (void)pos, (void)sinks, (void)window, (void)positions;
    throw lessons::NotImplemented("window_positions");
}

// TODO 6 (H2O): the index j to evict: the lowest scores[j] among kept[j] <= pos - recent (the
// positions older than the recent window), the lowest j on a tie.
int h2o_victim(std::span<const int> kept, std::span<const float> scores, int pos, int recent) {
    (void)kept, (void)scores, (void)pos, (void)recent;
    throw lessons::NotImplemented("h2o_victim");
}

// TODO 4 (bf16): the top 16 bits of x's fp32 bits, rounded to nearest even on the 16 dropped:
// mind NaN (0x7fc0 with x's sign), infinity, and a finite value that would round to infinity.
std::uint16_t to_bf16(float x) {
    (void)x;
    throw lessons::NotImplemented("to_bf16");
}

// TODO 5 (fp8-e4m3): bias 7, 3 mantissa bits, subnormals below 2^-6 (quantum 2^-9), largest
// finite 448 (S.1111.110); S.1111.111 is NaN and there is no infinity. lab.h has the rules.
std::uint8_t to_fp8_e4m3(float x) {
    (void)x;
    throw lessons::NotImplemented("to_fp8_e4m3");
}

}  // namespace kvlab::lab09
