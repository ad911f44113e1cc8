// Lab 9, reference solution: kvlab's own group arithmetic (core/quantized_cache.h: quant_fit,
// quant_encode, quant_decode, put_code, get_code) over the groups lab.h names, and kvlab's own
// window (core/window_cache.cpp: WindowCache::attended).
#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>

#include "lab.h"
#include "window_cache.h"

namespace kvlab::lab09 {

namespace {

// Where group gi's elements lie in a [rows, cols] block (lab.h's layout): `group` elements from
// first(gi), stride() apart.
struct Groups {
    bool per_token;
    int cols, group;
    int n;  // groups in the block
    int first(int gi) const {
        const int per_row = cols / group;
        return per_token ? (gi / per_row) * cols + (gi % per_row) * group : (gi / cols) * group * cols + gi % cols;
    }
    std::int64_t stride() const { return per_token ? 1 : cols; }
};

Groups groups(int rows, int cols, Axis axis, int group) {
    const bool per_token = axis == Axis::per_token;
    return {per_token, cols, group, per_token ? rows * (cols / group) : (rows / group) * cols};
}

}  // namespace

QuantBlock quantize(std::span<const float> x, int rows, int cols, Axis axis, int group, int bits) {
    assert(x.size() == std::size_t(rows) * cols);
    const Groups w = groups(rows, cols, axis, group);
    QuantBlock q;
    q.codes.assign((std::size_t(rows) * cols * bits + 7) / 8, 0);
    q.scales.resize(std::size_t(w.n));
    q.mins.resize(std::size_t(w.n));
    for (int gi = 0; gi < w.n; gi++) {
        const QuantRange r = quant_fit(x.data() + w.first(gi), group, w.stride(), bits);
        q.scales[std::size_t(gi)] = r.scale;
        q.mins[std::size_t(gi)] = r.min;
        for (int j = 0; j < group; j++) {
            const int i = int(w.first(gi) + j * w.stride());
            QuantizedCache::put_code(q.codes.data(), i, quant_encode(x[std::size_t(i)], r, bits), bits);
        }
    }
    return q;
}

void dequantize(const QuantBlock& q, int rows, int cols, Axis axis, int group, int bits, std::span<float> x_hat) {
    assert(x_hat.size() == std::size_t(rows) * cols);
    const Groups w = groups(rows, cols, axis, group);
    for (int gi = 0; gi < w.n; gi++)
        for (int j = 0; j < group; j++) {
            const int i = int(w.first(gi) + j * w.stride());
            x_hat[std::size_t(i)] = quant_decode(QuantizedCache::get_code(q.codes.data(), i, bits),
                                                 {q.scales[std::size_t(gi)], q.mins[std::size_t(gi)]});
        }
}

int window_positions(int pos, int sinks, int window, int* positions) {
    // A one-float model just long enough for pos: WindowCache::attended lists the positions by
    // rule, resident or not (an empty cache's slots are all -1, which is fine here).
    Config c;
    c.dim = c.hidden_dim = c.n_layers = c.n_heads = c.n_kv_heads = c.vocab_size = 1;
    c.max_seq = pos + 1;
    const WindowCache cache(c, sinks, window);
    std::vector<std::int64_t> slots(std::size_t(pos) + 1);  // [pos + 1]
    return cache.attended(pos, slots.data(), positions);
}

int h2o_victim(std::span<const int> kept, std::span<const float> scores, int pos, int recent) {
    int best = -1;
    // The candidates are a prefix: kept is increasing. Strictly lower: the oldest wins a tie.
    for (int j = 0; j < int(kept.size()) && kept[std::size_t(j)] <= pos - recent; j++)
        if (best < 0 || scores[std::size_t(j)] < scores[std::size_t(best)]) best = j;
    return best;
}

std::uint16_t to_bf16(float x) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(x), sign = u & 0x80000000u, mag = u & 0x7fffffffu;
    if (mag > 0x7f800000u) return std::uint16_t((sign >> 16) | 0x7fc0u);  // NaN
    if (mag == 0x7f800000u) return std::uint16_t(u >> 16);                // infinity
    // Round to nearest even on the 16 bits dropped: add 0x7fff plus the lowest bit kept. A carry
    // runs into the exponent, which is the next binade; it never reaches the sign.
    std::uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    if ((r & 0x7fffu) == 0x7f80u) r = (sign >> 16) | 0x7f7fu;  // a finite value rounded up to infinity: saturate
    return std::uint16_t(r);
}

std::uint8_t to_fp8_e4m3(float x) {
    const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
    if (std::isnan(x) || std::isinf(x)) return sign | 0x7f;  // e4m3fn has no infinity
    const float a = std::fabs(x);
    if (a >= 448.0f) return sign | 0x7e;  // saturate (S.1111.110 = 448)
    if (a == 0.0f) return sign;
    // a in [2^e, 2^(e+1)): its quantum is 2^(e - 3), or the subnormals' 2^-9 below 2^-6.
    int exponent;
    std::frexp(a, &exponent);  // a = f * 2^exponent, f in [0.5, 1)
    const int e = std::max(exponent - 1, -6);
    // Scaling by a power of two is exact; nearbyint rounds half to even (the default mode).
    const int n = int(std::nearbyint(std::ldexp(a, 3 - e)));
    // The binades above the subnormals', then n (its bit 3, when set, is the implicit 1; n = 16
    // carries into the next binade by itself).
    return std::uint8_t(sign | (((e + 6) << 3) + n));
}

}  // namespace kvlab::lab09
