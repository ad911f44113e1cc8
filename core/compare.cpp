#include "compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "numerics.h"

namespace kvlab {

BitComparison compare_bits(std::span<const float> a, std::span<const float> b) {
    BitComparison c;
    c.equal = a.size() == b.size();
    const std::size_t n = std::min(a.size(), b.size());
    for (std::size_t i = 0; i < n; i++) {
        if (float_bits(a[i]) == float_bits(b[i])) continue;
        if (c.first < 0) c.first = std::int64_t(i);
        c.n_differ++;
        c.max_ulp = std::max(c.max_ulp, ulp_distance(a[i], b[i]));
        const double d = std::fabs(double(a[i]) - double(b[i]));
        if (!std::isnan(d)) c.max_abs = std::max(c.max_abs, d);
    }
    c.equal = c.equal && c.n_differ == 0;
    return c;
}

std::optional<std::string> first_difference(std::span<const float> a, std::span<const float> b) {
    if (a.size() != b.size()) return fmt::format("sizes differ: {} vs {}", a.size(), b.size());
    const BitComparison c = compare_bits(a, b);
    if (c.equal) return std::nullopt;
    const std::size_t i = std::size_t(c.first);
    const std::string values = fmt::format("first differing index {}: {:.9g} (0x{:08x}) vs {:.9g} (0x{:08x})", i, a[i],
                                           float_bits(a[i]), b[i], float_bits(b[i]));
    if (std::isnan(a[i]) || std::isnan(b[i])) return values;
    return fmt::format("{}, {} ulp", values, ulp_distance(a[i], b[i]));
}

}  // namespace kvlab
