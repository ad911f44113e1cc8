#include "format_oracle.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace kvlab::proofs {

CodeMeaning code_meaning(const FloatFormat& f, std::uint32_t code) {
    const int M = f.man_bits, E = f.exp_bits;
    CodeMeaning r;
    r.negative = (code >> (E + M)) & 1;
    const std::uint32_t field = (code >> M) & ((1u << E) - 1), man = code & ((1u << M) - 1);
    const bool all_ones = field == (1u << E) - 1;
    if (f.has_inf && all_ones) {
        (man ? r.nan : r.inf) = true;
        return r;
    }
    if (!f.has_inf && all_ones && man == (1u << M) - 1) {  // e4m3fn: S.1111.111 only
        r.nan = true;
        return r;
    }
    // A normal has the implicit leading 1; a subnormal (field 0) has exponent 1 - bias.
    const double significand = field ? double((1u << M) + man) : double(man);
    r.value = std::ldexp(significand, (field ? int(field) : 1) - f.bias - M);
    if (r.negative) r.value = -r.value;
    return r;
}

FormatTable format_table(const FloatFormat& f) {
    FormatTable t;
    t.sign_bit = 1u << (f.exp_bits + f.man_bits);
    for (std::uint32_t c = 0; c < t.sign_bit; c++) {
        const CodeMeaning m = code_meaning(f, c);
        if (m.nan) {
            if (!t.nan) t.nan = c;
            continue;
        }
        if (m.inf) {
            t.inf = c;
            continue;
        }
        t.by_value.push_back({m.value, c});
    }
    std::sort(t.by_value.begin(), t.by_value.end());
    t.max_value = t.by_value.back().first;
    t.max_code = t.by_value.back().second;
    // The quiet NaN NUMERICS.md names: the top mantissa bit set (bf16, fp16, e5m2), or e4m3fn's one.
    if (f.has_inf) t.nan = t.inf | (1u << (f.man_bits - 1));
    return t;
}

std::uint32_t oracle_encode(const FloatFormat& f, const FormatTable& t, float x, std::size_t hint) {
    const std::uint32_t sign = std::signbit(x) ? t.sign_bit : 0;
    if (std::isnan(x)) return sign | t.nan;
    if (std::isinf(x)) return sign | (f.has_inf ? t.inf : t.nan);
    const double a = std::fabs(double(x));
    if (a >= t.max_value) return sign | t.max_code;  // saturation
    const std::size_t hi =
        hint != kSearch
            ? hint
            : std::size_t(std::lower_bound(t.by_value.begin(), t.by_value.end(), std::make_pair(a, std::uint32_t(0))) -
                          t.by_value.begin());
    if (t.by_value[hi].first == a) return sign | t.by_value[hi].second;
    const auto& above = t.by_value[hi];
    const auto& below = t.by_value[hi - 1];
    const double up = above.first - a, down = a - below.first;  // exact: a and both values are dyadic and close
    if (down < up) return sign | below.second;
    if (up < down) return sign | above.second;
    return sign | ((below.second & 1) == 0 ? below.second : above.second);  // a tie: the even code
}

std::vector<float> format_edge_inputs(const FormatTable& t) {
    std::vector<float> xs;
    const auto around = [&](double v) {
        const float c = float(v);  // every midpoint of these formats is an fp32 (<= 12 significant bits)
        xs.push_back(c);
        xs.push_back(std::nextafter(c, 0.0f));
        xs.push_back(std::nextafter(c, std::numeric_limits<float>::infinity()));
    };
    for (std::size_t i = 0; i < t.by_value.size(); i++) {
        around(t.by_value[i].first);
        if (i + 1 < t.by_value.size()) around((t.by_value[i].first + t.by_value[i + 1].first) / 2);
    }
    const double ulp_max = t.by_value.back().first - t.by_value[t.by_value.size() - 2].first;
    around(t.max_value + ulp_max / 2);
    around(t.max_value + ulp_max);
    around(double(std::numeric_limits<float>::max()));
    around(t.by_value[1].first / 2);  // half the smallest subnormal: a tie with zero
    around(t.by_value[1].first / 4);
    xs.push_back(std::numeric_limits<float>::denorm_min());
    xs.push_back(std::numeric_limits<float>::min());
    xs.push_back(std::numeric_limits<float>::infinity());
    xs.push_back(std::numeric_limits<float>::quiet_NaN());
    xs.push_back(std::bit_cast<float>(0x7f800001u));  // a signalling NaN
    const std::size_t n = xs.size();
    for (std::size_t i = 0; i < n; i++) xs.push_back(-xs[i]);
    return xs;
}

}  // namespace kvlab::proofs
