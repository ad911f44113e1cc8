// kvlab core: the scalar functions every path shares, and tools to compare floats bit for bit.
// The contract these serve is written down in NUMERICS.md.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

// Functions marked KVLAB_HD are one source for the CPU and the GPU: nvcc compiles them for
// both sides, g++ sees plain functions.
#if defined(__CUDACC__)
#define KVLAB_HD __host__ __device__
#else
#define KVLAB_HD
#endif

namespace kvlab {

// What memory holding no row reads as: a read past a sequence's valid rows poisons the logits.
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The float whose bits are u (2^k below, and the GPU's kernels).
KVLAB_HD inline float float_from_bits(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    return std::bit_cast<float>(u);
#endif
}

// 2^k as a float for k in [-126, 127]: exponent bits only.
KVLAB_HD inline float pow2_f32(int k) { return float_from_bits(std::uint32_t(k + 127) << 23); }

// e^x in float, from plain multiplies and adds, so the same source gives the same bits on
// any IEEE machine (the C library's expf differs between libms, and the GPU's __expf differs
// again). Accurate to about 1 ulp. Needs -ffp-contract=off (no fused multiply-add).
//   x = n ln2 + r, |r| <= ln2/2   (Cody-Waite: ln2 split in a short high part and a low part,
//                                  so n * kLn2Hi is exact for every n we reach)
//   e^r = degree-7 Taylor polynomial (truncation error < 8e-9, under a tenth of an ulp)
//   e^x = e^r * 2^n               (2^n built from its bits; two steps below the normal range)
// exp_f32's constants, shared with the CPU's vector copy of it (kernels.cpp: exp_f32_n).
namespace exp_f32_constants {
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;      // 9 significant bits
inline constexpr float kLn2Lo = -2.12194440e-4f;   // ln 2 - kLn2Hi
inline constexpr float kOverflow = 88.7228394f;    // ln(FLT_MAX), rounded up
inline constexpr float kUnderflow = -103.972084f;  // below this e^x rounds to +0
}  // namespace exp_f32_constants

KVLAB_HD inline float exp_f32(float x) {
    using namespace exp_f32_constants;
    if (x != x) return x;                                    // NaN stays NaN
    if (x > kOverflow) return float_from_bits(0x7f800000u);  // +inf
    if (x < kUnderflow) return 0.0f;  // -inf included: masked scores become exact zeros
    const float n = floorf(x * kLog2e + 0.5f);  // exact: floor only drops the fraction
    const float r = (x - n * kLn2Hi) - n * kLn2Lo;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int k = int(n);  // in [-150, 128]
    if (k > 127) return p * pow2_f32(127) * 2.0f;
    if (k < -126) return p * pow2_f32(k + 100) * pow2_f32(-100);  // first product exact, second rounds once
    return p * pow2_f32(k);
}

// ln x in float from plain multiplies, adds and one division, so that, like exp_f32, the same
// source gives the same bits on any IEEE machine and the GPU. Within 2 ulp (tests/test_kernels.cpp).
//   x = m 2^e, m in [sqrt(1/2), sqrt(2))   (subnormals scaled by 2^23 first)
//   ln m = 2 atanh(s) = 2 (s + s^3/3 + ... + s^13/13), s = (m - 1) / (m + 1), |s| <= 0.1716
//                                          (truncation error < 1e-12, far under an ulp)
//   ln x = e kLn2Hi + (e kLn2Lo + ln m)    (e kLn2Hi is exact: 9 bits times at most 8)
KVLAB_HD inline float log_f32(float x) {
    constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // exp_f32's split of ln 2
    if (x != x || x < 0.0f) return float_from_bits(0x7fc00000u);      // NaN
    if (x == 0.0f) return float_from_bits(0xff800000u);               // -inf
    if (x == float_from_bits(0x7f800000u)) return x;                  // +inf
    int e = 0;
    if (x < float_from_bits(0x00800000u)) x = x * 8388608.0f, e = -23;  // subnormal: times 2^23, exact
#if defined(__CUDA_ARCH__)
    const std::uint32_t u = __float_as_uint(x);
#else
    const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
#endif
    e += int(u >> 23) - 127;
    float m = float_from_bits((u & 0x007fffffu) | 0x3f800000u);  // [1, 2)
    if (m > 1.41421356f) m = m * 0.5f, e += 1;                   // exact
    const float s = (m - 1.0f) / (m + 1.0f), s2 = s * s;         // m - 1 is exact
    float p = 1.0f / 13.0f;
    p = p * s2 + 1.0f / 11.0f;
    p = p * s2 + 1.0f / 9.0f;
    p = p * s2 + 1.0f / 7.0f;
    p = p * s2 + 1.0f / 5.0f;
    p = p * s2 + 1.0f / 3.0f;
    const float ln_m = 2.0f * s + 2.0f * s * (p * s2);
    const float ef = float(e);
    return ef * kLn2Hi + (ef * kLn2Lo + ln_m);
}

inline std::uint32_t float_bits(float x) { return std::bit_cast<std::uint32_t>(x); }

// Distance in units in the last place between two floats: 0 means bitwise equal (so +0 and
// -0 are 1 apart, as bitwise exactness demands); NaN against anything is the maximum.
inline std::uint64_t ulp_distance(float a, float b) {
    if (a != a || b != b) return float_bits(a) == float_bits(b) ? 0 : std::numeric_limits<std::uint64_t>::max();
    // Map the float bit patterns onto a line where adjacent floats differ by one.
    auto key = [](float f) -> std::int64_t {
        const std::uint32_t u = float_bits(f);
        return (u & 0x80000000u) ? -std::int64_t(u & 0x7fffffffu) - 1 : std::int64_t(u);
    };
    const std::int64_t d = key(a) - key(b);
    return std::uint64_t(d < 0 ? -d : d);
}

}  // namespace kvlab
