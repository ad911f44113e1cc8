// kvlab core: two logit vectors compared bit for bit. Every "bitwise equal" kvlab prints (demo,
// bench, pool, verify, the viewer's Exactness panel, the tests) comes from compare_bits.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace kvlab {

struct BitComparison {
    bool equal = true;          // same size, and every element has the same bits (+0 and -0 differ)
    int n_differ = 0;           // elements whose bits differ (of the common length)
    std::int64_t first = -1;    // the first of them, -1 when none
    std::uint64_t max_ulp = 0;  // the largest ulp distance (numerics.h: NaN against a number is the maximum)
    double max_abs = 0;         // the largest |a - b| over elements that are not NaN
};

BitComparison compare_bits(std::span<const float> a, std::span<const float> b);

// The first element where two vectors differ bit for bit, described for a failure message:
// index, both values in decimal and hex, their distance in ulps (none with a NaN).
std::optional<std::string> first_difference(std::span<const float> a, std::span<const float> b);

}  // namespace kvlab
