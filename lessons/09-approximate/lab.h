// Lab 9: approximate caches. You write the int8/int4 quantizer of a KIVI cache (keys per channel,
// values per token, a scale and a minimum per group), the positions a StreamingLLM window with
// attention sinks reads, the position an H2O cache evicts, and the conversions of fp32 to two float formats engines
// store K and V in (bf16, fp8-e4m3); the grader plugs the first two into kvlab's caches (core/quantized_cache.h,
// core/window_cache.h) and holds the results to stated bounds, and checks the third against an
// oracle (proofs/format_oracle.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "quantized_cache.h"

namespace kvlab::lab09 {

using Axis = QuantSpec::Axis;

// A block of rows x cols floats (row-major: element (r, c) at r * cols + c), quantized.
//   per_token    a group is `group` consecutive columns of one row (cols % group == 0); group
//                (r, g) is number r * (cols / group) + g: values, and per-token keys
//   per_channel  a group is `group` consecutive rows of one column (rows % group == 0); group
//                (g, c) is number g * cols + c: KIVI's keys, a channel over `group` positions
// Each group has its own scale and minimum; for levels = 2^bits - 1:
//   scale = (max - min) / levels,  code = round((x - min) / scale) in [0, levels],
//   x_hat = code * scale + min     (computed in float; max == min: scale 0, code 0, x_hat = min)
struct QuantBlock {
    std::vector<std::uint8_t> codes;  // ceil(rows * cols * bits / 8) bytes: element i = r * cols + c
                                      // as QuantizedCache::put_code packs it (int4: two per byte)
    std::vector<float> scales, mins;  // [number of groups], in the group order above
};

// bits is 8 or 4; x.size() == rows * cols.
QuantBlock quantize(std::span<const float> x, int rows, int cols, Axis axis, int group, int bits);
// x_hat[rows * cols] from the codes, scales and mins alone.
void dequantize(const QuantBlock& q, int rows, int cols, Axis axis, int group, int bits, std::span<float> x_hat);

// StreamingLLM: the positions a query at pos reads with `sinks` attention sinks and a window of
// the last `window` positions, in increasing order, written to positions[0..n); returns n
// (at most pos + 1). sinks >= 0, window >= 1.
int window_positions(int pos, int sinks, int window, int* positions);

// H2O (core/h2o_cache.h): one layer's KV head keeps the positions `kept` (increasing) with their
// accumulated attention `scores`; it is full and position pos arrives. Returns the index j of the
// position to evict: the lowest score among the positions older than the recent window
// (kept[j] <= pos - recent), the oldest (lowest j) on a tie. There is always one: the cache holds
// recent + heavy positions and only the latest recent - 1 of them are that recent.
int h2o_victim(std::span<const int> kept, std::span<const float> scores, int pos, int recent);

// Float formats (core/NUMERICS.md, "KV formats"): fp32 -> the format's code. Round to nearest,
// ties to the even code; subnormals kept; -0 stays -0, and so does a negative value that rounds
// to zero; a finite value past the largest finite one saturates to it (sign kept); an infinity
// stays infinite in bf16 and is NaN in fp8-e4m3, which has no infinity; a NaN becomes the quiet
// NaN 0x7fc0 (bf16) or 0x7f (fp8-e4m3), with the input's sign bit.
std::uint16_t to_bf16(float x);     // 1 sign, 8 exponent (bias 127), 7 mantissa bits
std::uint8_t to_fp8_e4m3(float x);  // 1 sign, 4 exponent (bias 7), 3 mantissa bits; largest 448

}  // namespace kvlab::lab09
