// The KV float formats (core/kv_format.h) against an oracle written another way: each code's
// value from its fields in double precision (std::ldexp), and fp32 -> format as a nearest search
// over every code's value, ties to the even code, with NUMERICS.md's rules for what lies past the
// largest finite value, infinities, NaN and signed zero. Every code of every format is checked,
// and fp32 inputs three ways: a million drawn around the format's own values (midpoints, their
// fp32 neighbours, the overflow edge, subnormals) plus random bit patterns in the default run,
// and all 2^32 in the slow-labelled test (`KVLAB_EXHAUSTIVE=1`, `ctest -L slow`).
#include <fmt/format.h>
#include <rapidcheck/catch.h>

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kv_format.h"
#include "test_util.h"

using namespace kvlab;

namespace {

struct Named {
    const char* name;
    FloatFormat f;
};
const Named kFormats[] = {{"bf16", kBf16}, {"fp16", kFp16}, {"fp8-e5m2", kFp8E5M2}, {"fp8-e4m3", kFp8E4M3}};

// ---- The oracle

// What a code means, from its fields: NaN, +-inf, or sign * mantissa * 2^exponent in double.
struct Meaning {
    bool nan = false, inf = false, negative = false;
    double value = 0;  // finite codes: exact (at most 11 significant bits)
};

Meaning meaning(const FloatFormat& f, std::uint32_t code) {
    const int M = f.man_bits, E = f.exp_bits;
    Meaning r;
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

// The non-negative finite codes, by value (the code order itself is not assumed).
struct Table {
    std::vector<std::pair<double, std::uint32_t>> by_value;
    std::uint32_t sign_bit = 0, max_code = 0, nan = 0, inf = 0;
    double max_value = 0;
};

Table table_of(const FloatFormat& f) {
    Table t;
    t.sign_bit = 1u << (f.exp_bits + f.man_bits);
    for (std::uint32_t c = 0; c < t.sign_bit; c++) {
        const Meaning m = meaning(f, c);
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

constexpr std::size_t kSearch = std::size_t(-1);

// fp32 x -> the code NUMERICS.md specifies, by search. `hint` is the index of the first table
// value >= |x| when the caller knows it (the exhaustive walk), else kSearch: a binary search.
std::uint32_t oracle_encode(const FloatFormat& f, const Table& t, float x, std::size_t hint = kSearch) {
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

std::string hex(std::uint32_t v) { return fmt::format("0x{:x}", v); }

// One input: implementation == oracle, or a line saying how they differ.
std::optional<std::string> differs(const Named& n, const Table& t, float x, std::size_t hint = kSearch) {
    const std::uint32_t got = encode_float(n.f, x), want = oracle_encode(n.f, t, x, hint);
    if (got == want) return std::nullopt;
    return fmt::format("{}: fp32 {} ({}) encodes to {}, the oracle says {}", n.name, x,
                       hex(std::bit_cast<std::uint32_t>(x)), hex(got), hex(want));
}

// ---- Inputs that matter: the format's own values, the midpoints between neighbours and the fp32
// floats next to them, past the largest finite value, and below the smallest subnormal.
std::vector<float> edge_inputs(const Table& t) {
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

}  // namespace

TEST_CASE("KV formats: every code decodes to the value its fields give, and encodes back to itself", "[kv-format]") {
    for (const Named& n : kFormats) {
        const std::uint32_t n_codes = 1u << n.f.bits();
        int checked = 0;
        for (std::uint32_t c = 0; c < n_codes; c++) {
            const Meaning m = meaning(n.f, c);
            const float got = decode_float(n.f, c);
            INFO(n.name << " code " << hex(c));
            if (m.nan) {
                CHECK(std::isnan(got));
                CHECK(std::signbit(got) == m.negative);
                continue;
            }
            if (m.inf) {
                CHECK((std::isinf(got) && std::signbit(got) == m.negative));
                CHECK(encode_float(n.f, got) == c);
                continue;
            }
            // Bitwise: -0 and +0 are told apart.
            if (std::bit_cast<std::uint32_t>(got) != std::bit_cast<std::uint32_t>(float(m.value)))
                FAIL(n.name << " code " << hex(c) << " decodes to " << got << ", its fields say " << m.value);
            if (encode_float(n.f, got) != c)
                FAIL(n.name << " code " << hex(c) << " -> " << got << " encodes to " << hex(encode_float(n.f, got)));
            checked++;
        }
        CHECK(checked > int(n_codes) / 2);
    }
}

TEST_CASE("KV formats: the table of NUMERICS.md (largest finite value, infinity, NaN)", "[kv-format]") {
    CHECK(decode_float(kBf16, kBf16.max_finite()) == 0x1.fep127f);
    CHECK(decode_float(kFp16, kFp16.max_finite()) == 65504.0f);
    CHECK(decode_float(kFp8E5M2, kFp8E5M2.max_finite()) == 57344.0f);
    CHECK(decode_float(kFp8E4M3, kFp8E4M3.max_finite()) == 448.0f);
    CHECK(encode_float(kFp8E4M3, 1e9f) == 0x7eu);                                     // saturates
    CHECK(encode_float(kFp8E4M3, -std::numeric_limits<float>::infinity()) == 0xffu);  // no infinity: NaN
    CHECK(encode_float(kFp16, 1e9f) == 0x7bffu);
    CHECK(encode_float(kFp16, std::numeric_limits<float>::infinity()) == 0x7c00u);
    CHECK(encode_float(kBf16, -0.0f) == 0x8000u);
    CHECK(encode_float(kFp8E5M2, -1e-30f) == 0x80u);  // rounds to zero, keeps its sign
    CHECK(encode_float(kBf16, std::numeric_limits<float>::quiet_NaN()) == 0x7fc0u);
}

TEST_CASE("KV formats: fp32 -> each format equals the oracle on a million inputs around the format's values",
          "[kv-format]") {
    std::uint64_t state = 0x6b766c6162ull;  // "kvlab": a fixed stream, so a failure reruns as it was
    for (const Named& n : kFormats) {
        const Table t = table_of(n.f);
        std::vector<float> xs = edge_inputs(t);
        while (xs.size() < 250000) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            xs.push_back(std::bit_cast<float>(std::uint32_t(state >> 32)));
        }
        int wrong = 0;
        for (float x : xs)
            if (const auto d = differs(n, t, x); d && wrong++ < 5) FAIL_CHECK(*d);
        INFO(n.name << ": " << xs.size() << " inputs");
        CHECK(wrong == 0);
    }
}

TEST_CASE("KV formats counter-test: the oracle catches a conversion that truncates", "[kv-format][counter]") {
    // bf16 by dropping the low 16 bits: what engines' fast paths do, and what the format must not.
    const Table t = table_of(kBf16);
    int caught = 0;
    for (float x : edge_inputs(t)) {
        const std::uint32_t truncated = std::bit_cast<std::uint32_t>(x) >> 16;
        if (!std::isnan(x) && truncated != oracle_encode(kBf16, t, x)) caught++;
    }
    CHECK(caught > 0);
}

TEST_CASE("KV formats, exhaustive: fp32 -> each format equals the oracle on all 2^32 inputs", "[kv-format][slow]") {
    if (!std::getenv("KVLAB_EXHAUSTIVE")) {
        WARN("set KVLAB_EXHAUSTIVE=1 (ctest -L slow does) to run all 2^32 inputs");
        return;
    }
    for (const Named& n : kFormats) {
        const Table t = table_of(n.f);
        std::uint64_t wrong = 0;
        // Non-negative finite fp32 bit patterns are increasing in value: walk the table alongside.
        std::size_t hi = 0;
        for (std::uint64_t u = 0; u < 0x7f800000ull; u++) {
            const float x = std::bit_cast<float>(std::uint32_t(u));
            while (hi < t.by_value.size() && t.by_value[hi].first < double(x)) hi++;
            const std::size_t hint = hi < t.by_value.size() ? hi : kSearch;
            for (float s : {x, -x})
                if (const auto d = differs(n, t, s, hint); d && wrong++ < 5) FAIL_CHECK(*d);
        }
        for (std::uint64_t u = 0x7f800000ull; u < 0x80000000ull; u++)  // infinity and the NaNs
            for (float s : {std::bit_cast<float>(std::uint32_t(u)), -std::bit_cast<float>(std::uint32_t(u))})
                if (const auto d = differs(n, t, s); d && wrong++ < 5) FAIL_CHECK(*d);
        CHECK(wrong == 0);
    }
}
