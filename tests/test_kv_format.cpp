// The KV float formats (core/kv_format.h) against an oracle written another way
// (proofs/format_oracle.h: each code's value from its fields in double, and fp32 -> format as a
// nearest search over every code's value). Every code of every format is checked,
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

#include "format_oracle.h"
#include "kv_format.h"
#include "test_util.h"

using namespace kvlab;
using namespace kvlab::proofs;

namespace {

struct Named {
    const char* name;
    FloatFormat f;
};
const Named kFormats[] = {{"bf16", kBf16}, {"fp16", kFp16}, {"fp8-e5m2", kFp8E5M2}, {"fp8-e4m3", kFp8E4M3}};

std::string hex(std::uint32_t v) { return fmt::format("0x{:x}", v); }

// One input: implementation == oracle, or a line saying how they differ.
std::optional<std::string> differs(const Named& n, const FormatTable& t, float x, std::size_t hint = kSearch) {
    const std::uint32_t got = encode_float(n.f, x), want = oracle_encode(n.f, t, x, hint);
    if (got == want) return std::nullopt;
    return fmt::format("{}: fp32 {} ({}) encodes to {}, the oracle says {}", n.name, x,
                       hex(std::bit_cast<std::uint32_t>(x)), hex(got), hex(want));
}

}  // namespace

TEST_CASE("KV formats: every code decodes to the value its fields give, and encodes back to itself", "[kv-format]") {
    for (const Named& n : kFormats) {
        const std::uint32_t n_codes = 1u << n.f.bits();
        int checked = 0;
        for (std::uint32_t c = 0; c < n_codes; c++) {
            const CodeMeaning m = code_meaning(n.f, c);
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
        const FormatTable t = format_table(n.f);
        std::vector<float> xs = format_edge_inputs(t);
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
    const FormatTable t = format_table(kBf16);
    int caught = 0;
    for (float x : format_edge_inputs(t)) {
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
        const FormatTable t = format_table(n.f);
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
