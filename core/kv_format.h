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
enum class KVFormat : int { fp32 = 0, bf16, fp16, fp8_e5m2, fp8_e4m3 };

// The FloatFormat of a narrow KVFormat (fp32 has none: callers test for it first).
KVLAB_HD inline FloatFormat float_format(int format) {
    switch (format) {
        case int(KVFormat::bf16): return kBf16;
        case int(KVFormat::fp16): return kFp16;
        case int(KVFormat::fp8_e5m2): return kFp8E5M2;
        default: return kFp8E4M3;
    }
}

// Bytes one element of a K or V row takes in storage: 4, 2 or 1.
KVLAB_HD inline int kv_format_bytes(int format) {
    switch (format) {
        case int(KVFormat::fp32): return 4;
        case int(KVFormat::bf16):
        case int(KVFormat::fp16): return 2;
        default: return 1;
    }
}
// Whether the format reads a scale per (layer, K or V): the fp8 ones.
KVLAB_HD inline bool kv_format_scaled(int format) {
    return format == int(KVFormat::fp8_e5m2) || format == int(KVFormat::fp8_e4m3);
}

// Element d of a stored row (`row`: its first byte) in `format`: the code of x, and back. An fp8
// format stores x / scale and reads code * scale, as engines apply k_scale and v_scale; the
// scale is the cache's, per (layer, K or V), fixed when the cache is made. Other formats ignore
// it. Both divide and multiply are IEEE-rounded, so every backend gets the same bits.
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
KVLAB_HD inline float kv_load(int format, const void* row, std::int64_t d, float scale) {
    switch (format) {
        case int(KVFormat::fp32): return static_cast<const float*>(row)[d];
        case int(KVFormat::bf16):
        case int(KVFormat::fp16): return decode_float(float_format(format), static_cast<const std::uint16_t*>(row)[d]);
        default: return decode_float(float_format(format), static_cast<const std::uint8_t*>(row)[d]) * scale;
    }
}

// What element x of a K or V row reads as once stored in `format` (an int: KVFormat's value):
// kv_load of kv_store, without the storage.
KVLAB_HD inline float store_value(int format, float x, float scale = 1.0f) {
    switch (format) {
        case int(KVFormat::fp32): return x;
        case int(KVFormat::bf16):
        case int(KVFormat::fp16): return round_through(float_format(format), x);
        default: return round_through(float_format(format), x / scale) * scale;
    }
}

#if !defined(__CUDACC__)
// Names as the command line spells them: fp32, bf16, fp16, fp8-e5m2, fp8-e4m3.
const char* kv_format_name(KVFormat format);
// Throws Error, naming the formats, for any other name.
KVFormat parse_kv_format(std::string_view name);
inline constexpr KVFormat kKVFormats[] = {KVFormat::fp32, KVFormat::bf16, KVFormat::fp16, KVFormat::fp8_e5m2,
                                          KVFormat::fp8_e4m3};
#endif

}  // namespace kvlab
