// kvlab proofs: an oracle for the KV float formats (core/kv_format.h), written another way: a
// code's value from its fields in double precision (std::ldexp), and fp32 -> format as a nearest
// search over every code's value, ties to the even code, with NUMERICS.md's rules past the
// largest finite value, for infinities, NaN and signed zero. tests/test_kv_format.cpp checks
// kvlab's conversions against it, and lab 9's grader a student's.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kv_format.h"

namespace kvlab::proofs {

// What a code means, from its fields: NaN, +-inf, or a finite value, exact in double.
struct CodeMeaning {
    bool nan = false, inf = false, negative = false;
    double value = 0;
};
CodeMeaning code_meaning(const FloatFormat& f, std::uint32_t code);

// The format's non-negative finite codes, by value (the code order itself is not assumed).
struct FormatTable {
    std::vector<std::pair<double, std::uint32_t>> by_value;
    std::uint32_t sign_bit = 0, max_code = 0, nan = 0, inf = 0;
    double max_value = 0;
};
FormatTable format_table(const FloatFormat& f);

inline constexpr std::size_t kSearch = std::size_t(-1);

// fp32 x -> the code NUMERICS.md specifies, by search. `hint` is the index of the first table
// value >= |x| when the caller knows it (an exhaustive walk), else kSearch: a binary search.
std::uint32_t oracle_encode(const FloatFormat& f, const FormatTable& t, float x, std::size_t hint = kSearch);

// Inputs that matter: the format's own values, the midpoints between neighbours and the fp32
// floats next to them, past the largest finite value, below the smallest subnormal, infinities,
// NaNs; each with both signs.
std::vector<float> format_edge_inputs(const FormatTable& t);

}  // namespace kvlab::proofs
