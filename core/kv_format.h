// kvlab core: the float formats a KV cache can store, and kvlab's own conversions to and from
// fp32. Integer arithmetic only, one source for the CPU and the GPU (KVLAB_HD), so every backend
// rounds every element to the same code. The rules (rounding, subnormals, signed zero, overflow,
// NaN) are written down in NUMERICS.md, "KV formats"; tests/test_kv_format.cpp checks every code
// and every fp32 input against an oracle written another way.
//
//   format     bits  exponent  mantissa  bias  largest finite  infinity  NaN codes (quiet, as written)
//   bf16       16    8         7         127   3.3895e38       yes       0x7fc0 | sign
//   fp16       16    5         10        15    65504           yes       0x7e00 | sign
//   fp8-e5m2   8     5         2         15    57344           yes       0x7e | sign
//   fp8-e4m3   8     4         3         7     448             no (fn)   0x7f | sign (the only NaN)
//
// And two integer formats, int8 and int4: a row is cut into groups of consecutive channels, each
// stored as its own affine map (an fp32 scale and minimum) and one unsigned code per channel
// (below, "Integer formats").
#pragma once

#include <cstdint>
#include <string_view>

#include "numerics.h"

namespace kvlab {

// A binary float format of 1 sign bit, `exp_bits` exponent bits and `man_bits` mantissa bits.
struct FloatFormat {
    int exp_bits, man_bits, bias;
    bool has_inf;  // IEEE-like: the all-ones exponent is infinity and NaN; e4m3fn uses it for numbers
    KVLAB_HD constexpr int bits() const { return 1 + exp_bits + man_bits; }
    KVLAB_HD constexpr std::uint32_t sign_bit() const { return 1u << (exp_bits + man_bits); }
    // The largest finite code's magnitude: e4m3fn's is S.1111.110 (0x7f is NaN).
    KVLAB_HD constexpr std::uint32_t max_finite() const {
        return has_inf ? (((1u << exp_bits) - 2) << man_bits) | ((1u << man_bits) - 1)
                       : (((1u << exp_bits) - 1) << man_bits) | ((1u << man_bits) - 2);
    }
    KVLAB_HD constexpr std::uint32_t inf_code() const { return ((1u << exp_bits) - 1) << man_bits; }
    KVLAB_HD constexpr std::uint32_t nan_code() const {
        return has_inf ? inf_code() | (1u << (man_bits - 1)) : (1u << (exp_bits + man_bits)) - 1;
    }
    KVLAB_HD constexpr int emin() const { return 1 - bias; }  // the smallest normal's exponent
};

inline constexpr FloatFormat kBf16{8, 7, 127, true};
inline constexpr FloatFormat kFp16{5, 10, 15, true};
inline constexpr FloatFormat kFp8E5M2{5, 2, 15, true};
inline constexpr FloatFormat kFp8E4M3{4, 3, 7, false};

// fp32 -> the format's code, rounding to nearest, ties to even. A finite input past the largest
// finite value saturates to it (sign kept): stored K and V stay finite, so one overflow is a
// bounded error, not an infinity that turns an attention row into NaN. An infinite input stays
// infinite where the format has infinity, and is NaN in e4m3fn; NaN is the format's quiet NaN
// with the input's sign. -0 stays -0, and so does a negative input that rounds to zero.
KVLAB_HD inline std::uint32_t encode_float(FloatFormat f, float x) {
#if defined(__CUDA_ARCH__)
    const std::uint32_t u = __float_as_uint(x);
#else
    const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
#endif
    const std::uint32_t sign = (u >> 31) ? f.sign_bit() : 0u;
    const std::uint32_t exp = (u >> 23) & 0xffu, frac = u & 0x7fffffu;
    if (exp == 0xffu) {  // infinity or NaN
        if (frac != 0 || !f.has_inf) return sign | f.nan_code();
        return sign | f.inf_code();
    }
    // |x| = m * 2^k exactly, m < 2^24.
    const std::uint32_t m = exp ? (frac | 0x800000u) : frac;
    const int k = exp ? int(exp) - 150 : -149;
    // The exponent of the format's quantum at |x|: |x|'s own exponent, or the smallest normal's
    // (the format's subnormals share it). fp32 subnormals are below every format's emin here.
    const int e = exp ? int(exp) - 127 : -127;
    const int e_q = (e > f.emin() ? e : f.emin()) - f.man_bits;
    // n = |x| / 2^e_q, rounded to nearest even: below 2^(man_bits + 1), or equal to it when
    // rounding carried into the next binade. The quantum is coarser than fp32's, so sh >= 13.
    const int sh = e_q - k;
    std::uint64_t n = 0;  // sh >= 25: below half a quantum
    if (sh < 25) {
        const std::uint32_t rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
        n = m >> sh;
        if (rem > half || (rem == half && (n & 1))) n++;
    }
    // The code's magnitude is monotonic in the value: the binades above emin's, << man_bits, plus
    // n, whose bit man_bits (when set) is a normal's implicit 1. A carry moves to the next binade
    // by itself, and a subnormal is n alone.
    std::uint64_t code = (std::uint64_t(e_q + f.man_bits - f.emin()) << f.man_bits) + n;
    if (code > f.max_finite()) code = f.max_finite();  // saturate
    return sign | std::uint32_t(code);
}

// The format's code -> fp32, exactly (every value of these formats is an fp32).
KVLAB_HD inline float decode_float(FloatFormat f, std::uint32_t code) {
    const std::uint32_t mag = code & (f.sign_bit() - 1);
    const std::uint32_t sign = (code & f.sign_bit()) ? 0x80000000u : 0u;
    const std::uint32_t exp = mag >> f.man_bits, man = mag & ((1u << f.man_bits) - 1);
    if (f.has_inf && exp == (1u << f.exp_bits) - 1) return float_from_bits(sign | 0x7f800000u | (man ? 0x400000u : 0u));
    if (!f.has_inf && mag == f.nan_code()) return float_from_bits(sign | 0x7fc00000u);
    if (exp == 0) {
        // man * 2^(emin - man_bits), exact: 2^(emin - man_bits) is a normal fp32 for every format but
        // bf16, whose subnormals are fp32's own: those are built from their bits.
        if (f.emin() - f.man_bits < -126) return float_from_bits(sign | (man << (23 - f.man_bits)));
        const float v = float(man) * pow2_f32(f.emin() - f.man_bits);
        return sign ? -v : v;
    }
    return float_from_bits(sign | std::uint32_t(int(exp) - f.bias + 127) << 23 | man << (23 - f.man_bits));
}

// The value x becomes when stored in the format (encode, then decode).
KVLAB_HD inline float round_through(FloatFormat f, float x) { return decode_float(f, encode_float(f, x)); }

// The formats a cache stores K and V in. An int on the device (RowKV::format).
enum class KVFormat : int { fp32 = 0, bf16, fp16, fp8_e5m2, fp8_e4m3, int8, int4 };

// ----------------------------------------------------------------------------------------------
// Integer formats
//
// One group's affine quantization (asymmetric min/max with a zero point), the arithmetic of the
// int8 and int4 formats, of QuantizedCache and of lessons/09-approximate:
//   scale = (max - min) / (2^bits - 1),  code = round((x - min) / scale) in [0, 2^bits - 1],
//   x_hat = code * scale + min           (max == min: scale 0, every code 0, x_hat = min).
// round is half away from zero; a NaN quotient is code 0, so a NaN input reads back as NaN
// through its group's NaN minimum.
struct QuantRange {
    float scale, min;
};

// The range of the n floats x[0], x[stride], ..., x[(n-1) * stride], for codes 0..2^bits - 1.
// The comparisons are std::min's and std::max's, in increasing index, so -0 and +0 are kept
// the same way everywhere.
KVLAB_HD inline QuantRange quant_fit(const float* x, int n, std::int64_t stride, int bits) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        const float xi = x[i * stride];
        lo = xi < lo ? xi : lo;
        hi = hi < xi ? xi : hi;
    }
    return {(hi - lo) / float((1 << bits) - 1), lo};
}

KVLAB_HD inline unsigned quant_encode(float x, QuantRange r, int bits) {
    if (r.scale == 0.0f) return 0;
    const float q = (x - r.min) / r.scale;
    const unsigned levels = (1u << bits) - 1;
    if (!(q > 0.0f)) return 0;  // also a NaN, rather than an undefined conversion
    if (q >= float(levels)) return levels;
    const unsigned n = unsigned(q);  // q < 255: q - n is exact, and so is the test below
    return q - float(n) >= 0.5f ? n + 1 : n;
}

KVLAB_HD inline float quant_decode(unsigned code, QuantRange r) { return float(code) * r.scale + r.min; }

KVLAB_HD inline bool kv_format_int(int format) {
    return format == int(KVFormat::int8) || format == int(KVFormat::int4);
}
KVLAB_HD inline int kv_int_bits(int format) { return format == int(KVFormat::int8) ? 8 : 4; }

// The channels per group of an integer format's row: the largest divisor of head_size up to 32
// (32 is KIVI's and llama.cpp's group), so groups tile the row and a row needs nothing else.
KVLAB_HD inline int kv_int_group(int head_size) {
    for (int g = head_size < 32 ? head_size : 32; g > 1; g--)
        if (head_size % g == 0) return g;
    return 1;
}

// An integer row as stored: the scale and minimum (fp32) of each of its head_size / group
// groups, then its head_size codes (one byte each for int8, two per byte for int4, the even
// element in the low nibble), the row padded to 4 bytes so that the next row's scales are
// aligned. Scales first: a row's bytes are its groups' scales and its codes, nothing between.
KVLAB_HD inline std::int64_t kv_int_row_bytes(int bits, int head_size, int group) {
    return std::int64_t(head_size / group) * 8 + (std::int64_t(head_size) * bits + 31) / 32 * 4;
}
// Group gi's scale and minimum, and the row's codes.
KVLAB_HD inline float* kv_int_meta(void* row, int gi) { return static_cast<float*>(row) + 2 * gi; }
KVLAB_HD inline const float* kv_int_meta(const void* row, int gi) { return static_cast<const float*>(row) + 2 * gi; }
KVLAB_HD inline std::uint8_t* kv_int_codes(void* row, int head_size, int group) {
    return static_cast<std::uint8_t*>(row) + std::int64_t(head_size / group) * 8;
}
KVLAB_HD inline const std::uint8_t* kv_int_codes(const void* row, int head_size, int group) {
    return static_cast<const std::uint8_t*>(row) + std::int64_t(head_size / group) * 8;
}

// The code of element d of an integer row, and setting it (the rest of its byte kept).
KVLAB_HD inline unsigned kv_int_code(int format, const void* row, std::int64_t d, int group, int head_size) {
    const std::uint8_t* codes = kv_int_codes(row, head_size, group);
    if (kv_int_bits(format) == 8) return codes[d];
    return d % 2 == 0 ? codes[d / 2] & 0x0fu : codes[d / 2] >> 4;
}
KVLAB_HD inline void kv_int_set_code(int format, void* row, std::int64_t d, int group, int head_size, unsigned code) {
    std::uint8_t* codes = kv_int_codes(row, head_size, group);
    if (kv_int_bits(format) == 8)
        codes[d] = std::uint8_t(code);
    else
        codes[d / 2] = d % 2 == 0 ? std::uint8_t((codes[d / 2] & 0xf0u) | (code & 0x0fu))
                                  : std::uint8_t((codes[d / 2] & 0x0fu) | (code << 4));
}

// Element d of an integer row: x is the row's head_size inputs. The group's range is fitted from
// its inputs by every element's call alike (a GPU thread per element needs no other thread); the
// group's first element writes the scale and minimum. An int4 byte holds two codes: its even
// element writes it whole, the odd one nothing, so no two elements write one byte.
KVLAB_HD inline void kv_store_int(int format, void* row, std::int64_t d, const float* x, int group, int head_size) {
    const int bits = kv_int_bits(format), gi = int(d / group);
    const QuantRange r = quant_fit(x + std::int64_t(gi) * group, group, 1, bits);
    if (d % group == 0) {
        kv_int_meta(row, gi)[0] = r.scale;
        kv_int_meta(row, gi)[1] = r.min;
    }
    std::uint8_t* codes = kv_int_codes(row, head_size, group);
    if (bits == 8) {
        codes[d] = std::uint8_t(quant_encode(x[d], r, 8));
    } else if (d % 2 == 0) {
        // d + 1 may be in the next group: its code is in its own group's range
        unsigned hi = 0;
        if (d + 1 < head_size) {
            const int g1 = int((d + 1) / group);
            hi = g1 == gi ? quant_encode(x[d + 1], r, 4)
                          : quant_encode(x[d + 1], quant_fit(x + std::int64_t(g1) * group, group, 1, 4), 4);
        }
        codes[d / 2] = std::uint8_t(quant_encode(x[d], r, 4) | hi << 4);
    }
}

// Element d of an integer row, decoded: code * scale + min of its group.
KVLAB_HD inline float kv_load_int(int format, const void* row, std::int64_t d, int group, int head_size) {
    const float* meta = kv_int_meta(row, int(d / group));
    return quant_decode(kv_int_code(format, row, d, group, head_size), QuantRange{meta[0], meta[1]});
}

// ----------------------------------------------------------------------------------------------
// All formats

// The FloatFormat of a narrow KVFormat (fp32 has none: callers test for it first).
KVLAB_HD inline FloatFormat float_format(int format) {
    switch (format) {
        case int(KVFormat::bf16): return kBf16;
        case int(KVFormat::fp16): return kFp16;
        case int(KVFormat::fp8_e5m2): return kFp8E5M2;
        default: return kFp8E4M3;
    }
}

// Bytes one element of a K or V row takes in a float format: 4, 2 or 1 (an integer format's
// element has no size of its own: kv_row_bytes).
KVLAB_HD inline int kv_format_bytes(int format) {
    switch (format) {
        case int(KVFormat::fp32): return 4;
        case int(KVFormat::bf16):
        case int(KVFormat::fp16): return 2;
        default: return 1;
    }
}
// The group of a row of head_size elements in `format`: integer formats' channels per scale, 0
// for the float formats (which have none).
KVLAB_HD inline int kv_row_group(int format, int head_size) {
    return kv_format_int(format) ? kv_int_group(head_size) : 0;
}
// Bytes of one stored row of head_size elements, scales and padding included; an integer
// format's group (a divisor of head_size) is kv_int_group's unless given.
KVLAB_HD inline std::int64_t kv_row_bytes(int format, int head_size, int group = 0) {
    if (!kv_format_int(format)) return std::int64_t(head_size) * kv_format_bytes(format);
    return kv_int_row_bytes(kv_int_bits(format), head_size, group ? group : kv_int_group(head_size));
}
// Whether the format reads a scale per (layer, K or V): the fp8 ones.
KVLAB_HD inline bool kv_format_scaled(int format) {
    return format == int(KVFormat::fp8_e5m2) || format == int(KVFormat::fp8_e4m3);
}

// Element d of a stored row (`row`: its first byte) in a float `format`: the code of x, and back.
// An fp8 format stores x / scale and reads code * scale, as engines apply k_scale and v_scale;
// the scale is the cache's, per (layer, K or V), fixed when the cache is made. Other formats
// ignore it. Both divide and multiply are IEEE-rounded, so every backend gets the same bits.
// kv_load reads every format; an integer row is stored with kv_store_int (its group's inputs
// are needed) and read with its group (kv_row_group).
KVLAB_HD inline void kv_store(int format, void* row, std::int64_t d, float x, float scale) {
    switch (format) {
        case int(KVFormat::fp32): static_cast<float*>(row)[d] = x; return;
        case int(KVFormat::bf16):
        case int(KVFormat::fp16):
            static_cast<std::uint16_t*>(row)[d] = std::uint16_t(encode_float(float_format(format), x));
            return;
        default: static_cast<std::uint8_t*>(row)[d] = std::uint8_t(encode_float(float_format(format), x / scale));
    }
}
KVLAB_HD inline float kv_load(int format, const void* row, std::int64_t d, float scale, int group = 0,
                              int head_size = 0) {
    if (kv_format_int(format)) return kv_load_int(format, row, d, group, head_size);
    switch (format) {
        case int(KVFormat::fp32): return static_cast<const float*>(row)[d];
        case int(KVFormat::bf16):
        case int(KVFormat::fp16): return decode_float(float_format(format), static_cast<const std::uint16_t*>(row)[d]);
        default: return decode_float(float_format(format), static_cast<const std::uint8_t*>(row)[d]) * scale;
    }
}

// Element d of a row of any format, from the row's inputs x (x[d] is the element): kv_store for
// a float format, kv_store_int (which fits the group from x) for an integer one. Every store of
// K and V goes through here: the backends' store_kv and Cache::write.
KVLAB_HD inline void kv_store_element(int format, void* row, std::int64_t d, const float* x, float scale, int group,
                                      int head_size) {
    if (kv_format_int(format))
        kv_store_int(format, row, d, x, group, head_size);
    else
        kv_store(format, row, d, x[d], scale);
}

// What element x of a K or V row reads as once stored in a float `format` (an int: KVFormat's
// value): kv_load of kv_store, without the storage.
KVLAB_HD inline float store_value(int format, float x, float scale = 1.0f) {
    switch (format) {
        case int(KVFormat::fp32): return x;
        case int(KVFormat::bf16):
        case int(KVFormat::fp16): return round_through(float_format(format), x);
        default: return round_through(float_format(format), x / scale) * scale;
    }
}

#if !defined(__CUDACC__)
// Names as the command line spells them: fp32, bf16, fp16, fp8-e5m2, fp8-e4m3, int8, int4.
const char* kv_format_name(KVFormat format);
// Throws Error, naming the formats, for any other name.
KVFormat parse_kv_format(std::string_view name);
inline constexpr KVFormat kKVFormats[] = {KVFormat::fp32,     KVFormat::bf16, KVFormat::fp16, KVFormat::fp8_e5m2,
                                          KVFormat::fp8_e4m3, KVFormat::int8, KVFormat::int4};
// The float formats (those with a FloatFormat: fp32's own bits apart), then the integer ones.
inline constexpr KVFormat kFloatKVFormats[] = {KVFormat::bf16, KVFormat::fp16, KVFormat::fp8_e5m2, KVFormat::fp8_e4m3};
#endif

}  // namespace kvlab
