// The approximate caches on their own, without a model: rows are written through the Cache
// interface and read back. QuantizedCache: every value within half a quantization step, per-channel
// keys exact until their group completes, the packing, the byte accounting, rollback inside a
// group. WindowCache: attended() is exactly the sinks plus the window, in order, after any mix of
// appends and rollbacks, and a refused rollback changes nothing. Each property has a counter-test
// that plants a wrong expectation and checks RapidCheck reports a failure.
#include <rapidcheck/catch.h>

#include <algorithm>
#include <cassert>
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "approx_metrics.h"
#include "quantized_cache.h"
#include "test_util.h"
#include "window_cache.h"

using namespace kvlab;
using kvlab::test::full_range;

namespace {


// A config with the given cache shape; the fields a cache does not use are 1.
Config cache_config(int n_layers, int n_kv_heads, int head_size, int max_seq, int group = 1) {
    return Config{n_kv_heads * group * head_size, 1, n_layers, n_kv_heads * group, n_kv_heads, 1, max_seq};
}

// How the rows' values are drawn: uniform, a few distinct values (ties, flat groups), or one
// constant (max == min everywhere, so scale 0).
enum class Fill { uniform, few_values, constant };

// The K and V rows as written, by layer and position, and the tokens.
struct Written {
    Config c;
    std::vector<float> k, v;  // [n_layers, max_seq, kv_dim] each
    std::vector<int> tokens;
    explicit Written(const Config& config)
        : c(config),
          k(std::size_t(c.n_layers) * c.max_seq * c.kv_dim(), kNaN),
          v(std::size_t(c.n_layers) * c.max_seq * c.kv_dim(), kNaN) {
        assert(k.size() == std::size_t(c.n_layers) * c.max_seq * c.kv_dim() && v.size() == k.size());
    }
    float* k_row(int l, int pos) { return k.data() + (std::size_t(l) * c.max_seq + pos) * c.kv_dim(); }
    float* v_row(int l, int pos) { return v.data() + (std::size_t(l) * c.max_seq + pos) * c.kv_dim(); }
    const float* k_head(int l, int h, int t) const {
        return k.data() + (std::size_t(l) * c.max_seq + t) * c.kv_dim() + h * c.head_size();
    }
    const float* v_head(int l, int h, int t) const {
        return v.data() + (std::size_t(l) * c.max_seq + t) * c.kv_dim() + h * c.head_size();
    }
};

// Appends count positions with random tokens, then writes every layer's K and V rows, as the
// decoder does (layer by layer, positions in order), recording them in w.
void append_rows(Cache& cache, Written& w, int count, std::mt19937& rng, Fill fill = Fill::uniform, float amp = 1.0f) {
    std::uniform_real_distribution<float> uniform(-amp, amp);
    std::uniform_int_distribution<int> few(-2, 2), token(0, 999);
    auto draw = [&] { return fill == Fill::uniform ? uniform(rng) : fill == Fill::few_values ? amp * few(rng) : amp; };
    std::vector<int> tokens(count);
    for (int& t : tokens) t = token(rng);
    const int start = cache.length();
    cache.append(tokens);
    w.tokens.resize(start);
    w.tokens.insert(w.tokens.end(), tokens.begin(), tokens.end());
    for (int l = 0; l < w.c.n_layers; l++)
        for (int pos = start; pos < start + count; pos++) {
            for (int i = 0; i < w.c.kv_dim(); i++) {
                w.k_row(l, pos)[i] = draw();
                w.v_row(l, pos)[i] = draw();
            }
            cache.write(l, pos, w.k_row(l, pos), w.v_row(l, pos));
        }
}

bool same_bits(const float* a, const float* b, int n) { return std::memcmp(a, b, sizeof(float) * n) == 0; }

// Half a quantization step, plus the float rounding of (x - min) / scale and code * scale + min.
// `factor` is 0.5 for the claim; the counter-test passes less to show the check has teeth.
double bound(double lo, double hi, int bits, double factor) {
    const double scale = (hi - lo) / ((1 << bits) - 1);
    return factor * scale + 8 * FLT_EPSILON * (std::fabs(lo) + std::fabs(hi));
}

// ----------------------------------------------------------------------------------------------
// Quantized cache

// One generated case: a config with head_size from a list of small sizes, a spec whose group
// divides head_size (and fits max_seq), and a seed and fill for the rows.
struct QuantCase {
    Config c;
    QuantSpec spec;
    std::uint32_t seed = 0;
    Fill fill = Fill::uniform;
    float amp = 1;
};

QuantCase gen_quant_case(QuantSpec::Axis key_axis) {
    QuantCase q;
    const int hs = *rc::gen::elementOf(std::vector<int>{1, 2, 4, 6, 8, 12, 16, 32});
    q.c = cache_config(*full_range(1, 3), *full_range(1, 3), hs, *full_range(1, 40), *full_range(1, 2));
    std::vector<int> groups;
    for (int g = 1; g <= hs; g++)
        if (hs % g == 0 && (key_axis == QuantSpec::Axis::per_token || g <= q.c.max_seq)) groups.push_back(g);
    q.spec.bits = *rc::gen::elementOf(std::vector<int>{4, 8});
    q.spec.key_axis = key_axis;
    q.spec.group = *rc::gen::elementOf(groups);
    q.seed = *rc::gen::arbitrary<std::uint32_t>();
    q.fill = *rc::gen::element(Fill::uniform, Fill::uniform, Fill::few_values, Fill::constant);
    q.amp = *rc::gen::element(1e-3f, 1.0f, 1e3f);
    return q;
}

// Every value read back, and per-token keys, are within `factor` steps of the row written, the
// step computed from the written group's min and max.
void check_per_token(const QuantizedCache& cache, const Written& w, bool keys_too, double factor) {
    const Config& c = w.c;
    const int hs = c.head_size(), g = cache.spec().group;
    for (int l = 0; l < c.n_layers; l++)
        for (int h = 0; h < c.n_kv_heads; h++)
            for (int t = 0; t < cache.length(); t++)
                for (int tensor = 0; tensor < (keys_too ? 2 : 1); tensor++) {
                    const float* x = tensor == 0 ? w.v_head(l, h, t) : w.k_head(l, h, t);
                    const float* x_hat = tensor == 0 ? cache.value(l, h, t) : cache.key(l, h, t);
                    for (int g0 = 0; g0 < hs; g0 += g) {
                        const float lo = *std::min_element(x + g0, x + g0 + g);
                        const float hi = *std::max_element(x + g0, x + g0 + g);
                        for (int d = g0; d < g0 + g; d++)
                            if (!(std::fabs(double(x[d]) - x_hat[d]) <= bound(lo, hi, cache.spec().bits, factor)))
                                RC_FAIL(fmt::format(
                                    "{} {}: {} at layer {}, head {}, position {}, channel {} reads "
                                    "{} (group range [{}, {}])",
                                    cache.name(), tensor == 0 ? "value" : "key", x[d], l, h, t, d, x_hat[d], lo, hi));
                    }
                }
}

// Per-channel keys: bitwise the row written while its group is incomplete, within `factor` steps
// (channel d's range over the group's positions) once it is complete. With `planted`, the check
// wrongly demands exactness of complete groups too.
void check_per_channel_keys(const QuantizedCache& cache, const Written& w, double factor, bool planted = false) {
    const Config& c = w.c;
    const int hs = c.head_size(), g = cache.spec().group;
    for (int l = 0; l < c.n_layers; l++)
        for (int h = 0; h < c.n_kv_heads; h++)
            for (int t = 0; t < cache.length(); t++) {
                const int g0 = t / g * g;
                const float* x = w.k_head(l, h, t);
                const float* x_hat = cache.key(l, h, t);
                if (g0 + g > cache.length() || planted) {
                    if (!same_bits(x, x_hat, hs))
                        RC_FAIL(
                            fmt::format("{}: key at layer {}, head {}, position {} is not the fp32 row written "
                                        "(group [{}, {}), length {})",
                                        cache.name(), l, h, t, g0, g0 + g, cache.length()));
                    continue;
                }
                for (int d = 0; d < hs; d++) {
                    float lo = x[d], hi = x[d];
                    for (int s = g0; s < g0 + g; s++) {
                        lo = std::min(lo, w.k_head(l, h, s)[d]);
                        hi = std::max(hi, w.k_head(l, h, s)[d]);
                    }
                    if (!(std::fabs(double(x[d]) - x_hat[d]) <= bound(lo, hi, cache.spec().bits, factor)))
                        RC_FAIL(fmt::format("{}: key {} at layer {}, head {}, position {}, channel {} reads {}",
                                            cache.name(), x[d], l, h, t, d, x_hat[d]));
                }
            }
}

// Rows appended in random chunks, checked after every chunk: every row per token, and for
// per-channel (KIVI) keys also the keys per channel (`planted`: that check wrongly demands exactness).
void quant_property(QuantSpec::Axis axis, double factor, bool planted = false) {
    const bool per_token = axis == QuantSpec::Axis::per_token;
    const QuantCase q = gen_quant_case(axis);
    QuantizedCache cache(q.c, q.spec);
    Written w(q.c);
    std::mt19937 rng(q.seed);
    while (cache.length() < q.c.max_seq) {
        append_rows(cache, w, *full_range(1, q.c.max_seq - cache.length() + 1), rng, q.fill, q.amp);
        check_per_token(cache, w, per_token, factor);
        if (!per_token) check_per_channel_keys(cache, w, factor, planted);
    }
}

// ----------------------------------------------------------------------------------------------
// Window cache

// The positions a query at pos attends: sinks, then the window. `shift` plants an off-by-one in
// the window's start for the counter-test.
std::vector<int> window_rule(int sinks, int window, int pos, int shift = 0) {
    std::vector<int> out;
    for (int t = 0; t < std::min(sinks, pos + 1); t++) out.push_back(t);
    for (int t = std::max(sinks, pos - window + 1 + shift); t <= pos; t++) out.push_back(t);
    return out;
}

// Every row a cache shows for positions 0..length()-1, bits and all (NaN rows included).
std::vector<float> snapshot(const Cache& cache) {
    const Config& c = cache.config();
    const int hs = c.head_size();
    std::vector<float> out;  // [n_layers, n_kv_heads, length, 2, head_size]
    for (int l = 0; l < c.n_layers; l++)
        for (int h = 0; h < c.n_kv_heads; h++)
            for (int t = 0; t < cache.length(); t++) {
                out.insert(out.end(), cache.key(l, h, t), cache.key(l, h, t) + hs);
                out.insert(out.end(), cache.value(l, h, t), cache.value(l, h, t) + hs);
            }
    assert(out.size() == std::size_t(c.n_layers) * c.n_kv_heads * cache.length() * 2 * hs);
    return out;
}

bool same_snapshot(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || same_bits(a.data(), b.data(), int(a.size())));
}

// The window property: random S, W, chunk and max_seq; random appends (each up to max_append())
// and rollbacks. After each append, every new position's attended rows are exactly the rule's,
// in order, holding the rows written; evicted positions read NaN. A rollback succeeds exactly when
// the positions a query at n would attend are resident, and a refused one changes nothing.
void window_property(int planted_shift) {
    const Config c = cache_config(*full_range(1, 2), *full_range(1, 2), *full_range(1, 4), *full_range(1, 64));
    const int S = *full_range(0, 9), W = *full_range(1, 17), chunk = *full_range(0, 9);
    WindowCache cache(c, S, W, chunk);
    const int R = W + (chunk == 0 ? W : chunk) - 1, hs = c.head_size();
    RC_ASSERT(cache.ring_size() == std::min(S + R, c.max_seq));
    std::vector<CacheEvent> events;
    cache.trace = &events;
    Written w(c);
    std::mt19937 rng(*rc::gen::arbitrary<std::uint32_t>());
    std::vector<const float*> keys(c.max_seq), values(c.max_seq);
    const int n_ops = *full_range(1, 16);
    for (int op = 0; op < n_ops; op++) {
        const bool rollback = cache.length() == c.max_seq || (cache.length() > 0 && *full_range(0, 4) == 0);
        if (!rollback) {
            const int start = cache.length();
            const int count = *full_range(1, std::min(cache.max_append(), c.max_seq - start) + 1);
            events.clear();
            append_rows(cache, w, count, rng);
            for (const CacheEvent& e : events)
                if (e.kind == EventKind::evicted) {
                    RC_ASSERT(!cache.resident(e.pos));
                    RC_ASSERT(std::isnan(cache.key(c.n_layers - 1, c.n_kv_heads - 1, e.pos)[hs - 1]));
                    RC_ASSERT(std::isnan(cache.value(0, 0, e.pos)[0]));
                }
            for (int l = 0; l < c.n_layers; l++)
                for (int h = 0; h < c.n_kv_heads; h++)
                    for (int pos = start; pos < cache.length(); pos++) {
                        const std::vector<int> expected = window_rule(S, W, pos, planted_shift);
                        const int n = kvlab::test::attended_rows(cache, l, h, pos, keys, values);
                        if (n != int(expected.size()))
                            RC_FAIL(
                                fmt::format("window(S={}, W={}, chunk={}), max_seq {}: a query at {} attends {} "
                                            "positions, expected {}",
                                            S, W, chunk, c.max_seq, pos, n, expected.size()));
                        if (pos + 1 <= S + W) RC_ASSERT(n == pos + 1);  // the exact regime
                        for (int i = 0; i < n; i++)
                            if (!same_bits(keys[i], w.k_head(l, h, expected[i]), hs) ||
                                !same_bits(values[i], w.v_head(l, h, expected[i]), hs))
                                RC_FAIL(
                                    fmt::format("window(S={}, W={}, chunk={}): a query at {} reads entry {} not "
                                                "as position {}'s rows",
                                                S, W, chunk, pos, i, expected[i]));
                    }
        } else {
            const int n = *full_range(0, cache.length() + 1);
            bool allowed = true;
            for (int t = std::max(S, n - W + 1); t < n; t++) allowed = allowed && cache.resident(t);
            const int length = cache.length();
            const std::vector<int> tokens(cache.tokens().begin(), cache.tokens().end());
            const std::vector<float> rows = snapshot(cache);
            try {
                cache.truncate(n);
                RC_ASSERT(allowed);
                RC_ASSERT(cache.length() == n);
                // The kept positions show what they showed before, resident or NaN.
                std::vector<float> kept = snapshot(cache), before;
                for (int l = 0; l < c.n_layers; l++)
                    for (int h = 0; h < c.n_kv_heads; h++) {
                        const auto from = rows.begin() + (std::ptrdiff_t(l) * c.n_kv_heads + h) * length * 2 * hs;
                        before.insert(before.end(), from, from + std::ptrdiff_t(n) * 2 * hs);
                    }
                RC_ASSERT(same_snapshot(kept, before));
            } catch (const Error& e) {
                RC_ASSERT(!allowed);
                RC_ASSERT(
                    std::string(e.what()).find(fmt::format("window cache: cannot roll back to {}: position ", n)) == 0);
                RC_ASSERT(cache.length() == length);
                RC_ASSERT(std::equal(tokens.begin(), tokens.end(), cache.tokens().begin(), cache.tokens().end()));
                RC_ASSERT(same_snapshot(rows, snapshot(cache)));
            }
        }
        RC_ASSERT(std::equal(w.tokens.begin(), w.tokens.begin() + cache.length(), cache.tokens().begin(),
                             cache.tokens().end()));
        int resident = 0;
        for (int t = 0; t < cache.length(); t++) resident += cache.resident(t);
        const MemoryStats m = cache.memory();
        RC_ASSERT(m.used_bytes == kv_bytes(c, resident));
        RC_ASSERT(m.reserved_bytes == m.allocated_bytes);
        RC_ASSERT(m.reserved_bytes == kv_bytes(c, cache.ring_size()));
    }
}

}  // namespace

// ----------------------------------------------------------------------------------------------

TEST_CASE("quantized: per-token values and keys are within half a step of what was written", "[quant]") {
    rc::prop("int8 and int4, every group size dividing head_size",
             [] { quant_property(QuantSpec::Axis::per_token, 0.5); });
}

TEST_CASE("quantized counter-test: demanding a quarter step fails", "[quant][counter]") {
    test::expect_failure([] { quant_property(QuantSpec::Axis::per_token, 0.25); }, "reads");
}

TEST_CASE("quantized: per-channel keys are exact fp32 until their group completes, within half a step after",
          "[quant]") {
    rc::prop("KIVI keys, per-token values", [] { quant_property(QuantSpec::Axis::per_channel, 0.5); });
}

TEST_CASE("quantized counter-test: demanding exact keys in complete groups fails", "[quant][counter]") {
    test::expect_failure([] { quant_property(QuantSpec::Axis::per_channel, 0.5, true); },
                         "is not the fp32 row written");
}

TEST_CASE("quantized: packed codes round-trip, int8 and int4", "[quant]") {
    for (int bits : {8, 4}) {
        const int n = 7;  // odd: the last byte of an int4 array is half used
        std::vector<std::uint8_t> codes(std::size_t(bits == 8 ? n : (n + 1) / 2), 0);  // [ceil(n * bits / 8)]
        std::vector<unsigned> expected(n, 0);
        std::mt19937 rng(7);
        for (unsigned code = 0; code < (1u << bits); code++)
            for (int i = 0; i < n; i++) {
                // Code i changes; its neighbours, sharing a byte with it, keep theirs.
                QuantizedCache::put_code(codes.data(), i, code, bits);
                expected[i] = code;
                for (int j = 0; j < n; j++) REQUIRE(QuantizedCache::get_code(codes.data(), j, bits) == expected[j]);
                const unsigned other = rng() % (1u << bits);
                QuantizedCache::put_code(codes.data(), (i + 3) % n, other, bits);
                expected[(i + 3) % n] = other;
            }
    }
}

TEST_CASE("quantized: reserved bytes equal allocated bytes for every spec, and int4 codes are half of int8's",
          "[quant]") {
    for (const Config& c : {cache_config(5, 4, 8, 512, 2), cache_config(6, 6, 48, 256), cache_config(1, 1, 6, 7)})
        for (QuantSpec::Axis axis : {QuantSpec::Axis::per_token, QuantSpec::Axis::per_channel})
            for (int group = 1; group <= c.head_size(); group++) {
                if (c.head_size() % group != 0 || group > c.max_seq) continue;
                const QuantizedCache q8(c, {8, axis, group}), q4(c, {4, axis, group});
                const MemoryStats m8 = q8.memory(), m4 = q4.memory();
                INFO(q8.name() << " on " << c.describe());
                CHECK(m8.reserved_bytes == m8.allocated_bytes);
                CHECK(m4.reserved_bytes == m4.allocated_bytes);
                CHECK(m8.reserved_bytes == m8.payload_bytes + m8.metadata_bytes);
                CHECK(m8.used_bytes == 0);
                CHECK(m8.scratch_bytes == 0);  // no fp32 copy
                // Rows of K and V for max_seq positions: each group's scale and min, then the codes
                // padded to 4 bytes; per-channel keys also hold group fp32 rows while a group is open.
                const std::int64_t heads = std::int64_t(c.n_layers) * c.n_kv_heads, hs = c.head_size();
                const std::int64_t rows = 2 * heads * c.max_seq;
                const std::int64_t residual = axis == QuantSpec::Axis::per_channel ? 4 * heads * group * hs : 0;
                const std::int64_t codes8 = rows * ((hs + 3) / 4 * 4), codes4 = rows * ((hs / 2 + 3) / 4 * 4);
                CHECK(m8.payload_bytes == codes8 + residual);
                CHECK(m4.payload_bytes == codes4 + residual);
                CHECK(codes4 * 2 == codes8);  // head_size is even in every config here
                CHECK(m4.metadata_bytes == m8.metadata_bytes);
                CHECK(m8.metadata_bytes == rows * (hs / group) * 8);
            }
    // stories260K's cache shape, group 8, int8 KIVI: per KV head and position, 8 + 8 code bytes, a
    // scale and a min for the value row (8 B), and for the keys 8 channels' scale and min over 8
    // positions (8 B, kept one channel a row in the key rows' own scale slots): 32 B against
    // fp32's 64 B, times 5 layers * 4 KV heads.
    const QuantizedCache kivi(cache_config(5, 4, 8, 512, 2), {8, QuantSpec::Axis::per_channel, 8});
    CHECK(kivi.bytes_per_token() == 640.0);
    CHECK(kivi.name() == "quant-int8(k=per-channel,v=per-token,group=8)");
    const QuantizedCache int4(cache_config(5, 4, 8, 512, 2), {4, QuantSpec::Axis::per_token, 4});
    CHECK(int4.bytes_per_token() == 20 * (4 + 4 + 2 * 2 * 8.0));
    CHECK(int4.name() == "quant-int4(k=per-token,v=per-token,group=4)");
}

TEST_CASE("quantized: specs that make no sense are one-line errors", "[quant][errors]") {
    const Config c = cache_config(1, 2, 8, 16);
    using A = QuantSpec::Axis;
    CHECK_THROWS_WITH(QuantizedCache(c, {6, A::per_token, 8}), "quantized cache: bits must be 8 or 4, not 6");
    CHECK_THROWS_WITH(QuantizedCache(c, {8, A::per_token, 0}),
                      "quantized cache: quantization group must be positive, not 0");
    CHECK_THROWS_WITH(QuantizedCache(c, {8, A::per_token, 5}), "quantization group 5 does not divide head_size 8");
    CHECK_THROWS_WITH(QuantizedCache(c, {4, A::per_channel, 3}), "quantization group 3 does not divide head_size 8");
    CHECK_THROWS_WITH(QuantizedCache(cache_config(1, 1, 8, 4), {8, A::per_channel, 8}),
                      "quantization group 8 of per-channel keys exceeds max_seq 4");
    CHECK_NOTHROW(QuantizedCache(cache_config(1, 1, 8, 4), {8, A::per_token, 8}));
    // The decoder writes positions in order; per-channel keys rely on it and say so.
    QuantizedCache q(c, {8, A::per_channel, 4});
    const int tokens[] = {1, 2};
    q.append(tokens);
    const std::vector<float> row(c.kv_dim(), 1.0f);
    CHECK_THROWS_WITH(q.write(0, 1, row.data(), row.data()),
                      "quantized cache: per-channel keys go in order; layer 0 got 1 before 0");
}

TEST_CASE("quantized: rewriting a row of a quantized key group requantizes the group", "[quant]") {
    // Cache::write allows rewriting rows of the latest append; the decoder does not, but a
    // rewrite must still leave every key within half a step of what the group now holds.
    const Config c = cache_config(1, 1, 2, 8);
    QuantizedCache cache(c, {8, QuantSpec::Axis::per_channel, 2});
    const int tokens[] = {1, 2};
    cache.append(tokens);
    // Every range below is 255 wide: scale 1, so all values are representable exactly.
    const float k0[] = {0.0f, 255.0f}, k1[] = {255.0f, 510.0f}, k1_new[] = {-255.0f, 0.0f};
    cache.write(0, 0, k0, k0);
    CHECK(same_bits(cache.key(0, 0, 0), k0, 2));  // residual
    cache.write(0, 1, k1, k1);
    CHECK(same_bits(cache.key(0, 0, 0), k0, 2));  // quantized now
    CHECK(same_bits(cache.key(0, 0, 1), k1, 2));
    cache.write(0, 1, k1_new, k1_new);
    CHECK(same_bits(cache.key(0, 0, 0), k0, 2));
    CHECK(same_bits(cache.key(0, 0, 1), k1_new, 2));
    CHECK(same_bits(cache.value(0, 0, 1), k1_new, 2));
}

TEST_CASE("quantized: rollback inside a quantized group turns its kept rows back into the residual", "[quant]") {
    const Config c = cache_config(2, 2, 4, 16);
    QuantizedCache cache(c, {4, QuantSpec::Axis::per_channel, 4});
    Written w(c);
    std::mt19937 rng(11);
    append_rows(cache, w, 10, rng);  // groups [0, 4) and [4, 8) quantized, 8 and 9 in the residual
    const std::vector<float> before = snapshot(cache);
    const MemoryStats m = cache.memory();
    auto key_copy = [&](int l, int h, int t) { return std::vector<float>(cache.key(l, h, t), cache.key(l, h, t) + 4); };

    cache.truncate(9);  // inside the residual: position 8 is still the fp32 row
    CHECK(same_bits(cache.key(1, 1, 8), w.k_head(1, 1, 8), 4));
    CHECK(std::isnan(cache.key(1, 1, 9)[0]));
    cache.truncate(6);  // inside a quantized group: 4 and 5 keep their dequantized values
    std::vector<float> after = snapshot(cache), kept;
    for (int lh = 0; lh < 4; lh++) kept.insert(kept.end(), before.begin() + lh * 80, before.begin() + lh * 80 + 48);
    CHECK(same_snapshot(after, kept));  // [n_layers * n_kv_heads, 6 positions, 2, head_size] of [.., 10, 2, 4]
    for (int t = 6; t < 10; t++) CHECK(std::isnan(cache.key(0, 0, t)[0]));
    CHECK(cache.memory().reserved_bytes == m.reserved_bytes);

    // Completing the group again quantizes the kept rows (dequantized values) with the new ones.
    std::vector<std::vector<float>> kept_keys;  // [n_layers * n_kv_heads * 2][head_size]: positions 4, 5
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++)
            for (int t = 4; t < 6; t++) kept_keys.push_back(key_copy(l, h, t));
    append_rows(cache, w, 1, rng);
    CHECK(same_bits(cache.key(1, 0, 6), w.k_head(1, 0, 6), 4));  // residual: exact
    CHECK(same_bits(cache.key(1, 0, 5), kept_keys[(1 * 2 + 0) * 2 + 1].data(), 4));
    append_rows(cache, w, 1, rng);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++)
            for (int d = 0; d < 4; d++) {
                const float x[4] = {kept_keys[(l * 2 + h) * 2][d], kept_keys[(l * 2 + h) * 2 + 1][d],
                                    w.k_head(l, h, 6)[d], w.k_head(l, h, 7)[d]};
                const float lo = *std::min_element(x, x + 4), hi = *std::max_element(x, x + 4);
                for (int t = 4; t < 8; t++) {
                    INFO("layer " << l << ", head " << h << ", position " << t << ", channel " << d);
                    CHECK(std::fabs(double(x[t - 4]) - cache.key(l, h, t)[d]) <= bound(lo, hi, 4, 0.5));
                }
            }
    // Group [0, 4) was never touched.
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++)
            for (int t = 0; t < 4; t++)
                CHECK(same_bits(cache.key(l, h, t), before.data() + ((l * 2 + h) * 10 + t) * 8, 4));
    cache.truncate(4);  // at a group boundary: nothing goes back to the residual
    CHECK(std::isnan(cache.key(0, 0, 4)[0]));
    CHECK(same_bits(cache.key(0, 0, 3), before.data() + 3 * 8, 4));
    cache.clear();
    CHECK(std::isnan(cache.key(0, 0, 0)[0]));
    CHECK(std::isnan(cache.value(1, 1, 0)[3]));
}

// ----------------------------------------------------------------------------------------------

TEST_CASE("window: attended() is the sinks and the window, in order, through appends and rollbacks", "[window]") {
    rc::prop("random sinks, window, chunk, max_seq and operations", [] { window_property(0); });
}

TEST_CASE("window counter-test: an off-by-one in the window's start fails the property", "[window][counter]") {
    test::expect_failure([] { window_property(-1); }, "positions, expected");
    test::expect_failure([] { window_property(+1); }, "positions, expected");
}

TEST_CASE("window: eviction, rollback errors and memory on a small example", "[window]") {
    const Config c = cache_config(1, 1, 2, 20);
    WindowCache cache(c, 2, 3, 1);  // R = 3 + 1 - 1 = 3: ring_size 5
    CHECK(cache.name() == "window(sinks=2,window=3)");
    CHECK(cache.ring_size() == 5);
    CHECK(cache.max_append() == 1);
    std::vector<CacheEvent> events;
    cache.trace = &events;
    Written w(c);
    std::mt19937 rng(5);
    for (int i = 0; i < 10; i++) append_rows(cache, w, 1, rng);
    std::vector<int> evicted;
    for (const CacheEvent& e : events)
        if (e.kind == EventKind::evicted) evicted.push_back(e.pos);
    CHECK(evicted == std::vector<int>{2, 3, 4, 5, 6});
    for (int t = 0; t < 10; t++) CHECK(cache.resident(t) == (t < 2 || t >= 7));
    CHECK(std::isnan(cache.key(0, 0, 4)[0]));
    CHECK(cache.memory().used_bytes == kv_bytes(c, 5));
    CHECK(cache.memory().reserved_bytes == kv_bytes(c, 5));
    CHECK_THROWS_AS(cache.append(std::vector<int>{1, 2}), Error);  // more than max_append

    const std::vector<float> rows = snapshot(cache);
    CHECK_THROWS_WITH(cache.truncate(8), "window cache: cannot roll back to 8: position 6 was already evicted");
    CHECK(cache.length() == 10);
    CHECK(same_snapshot(rows, snapshot(cache)));
    cache.truncate(9);  // needs 7 and 8
    CHECK(cache.length() == 9);
    CHECK(cache.memory().used_bytes == kv_bytes(c, 4));  // 0, 1, 7, 8
    CHECK_THROWS_WITH(cache.truncate(5), "window cache: cannot roll back to 5: position 3 was already evicted");
    cache.truncate(2);  // only the sinks: always possible
    CHECK(cache.length() == 2);
    CHECK(same_bits(cache.key(0, 0, 1), w.k_head(0, 0, 1), 2));
    cache.clear();
    CHECK(cache.memory().used_bytes == 0);
}

TEST_CASE("window: nonsense parameters are one-line errors, and a window larger than max_seq is exact", "[window]") {
    const Config c = cache_config(1, 1, 2, 8);
    CHECK_THROWS_WITH(WindowCache(c, -1, 4), "window cache: sinks must be >= 0, not -1");
    CHECK_THROWS_WITH(WindowCache(c, 0, 0), "window cache: window must be >= 1, not 0");
    CHECK_THROWS_WITH(WindowCache(c, 0, 4, -2), "window cache: chunk must be >= 0 (0 = window), not -2");
    WindowCache big(c, 4, 100);
    CHECK(big.ring_size() == 8);
    Written w(c);
    std::mt19937 rng(3);
    append_rows(big, w, 8, rng);
    std::vector<const float*> keys(8), values(8);
    CHECK(kvlab::test::attended_rows(big, 0, 0, 7, keys, values) == 8);
    for (int t = 0; t < 8; t++) CHECK(same_bits(keys[t], w.k_head(0, 0, t), 2));
}

// ----------------------------------------------------------------------------------------------

TEST_CASE("compare_logits: max |difference|, KL of the softmaxes, top-1 agreement", "[metrics]") {
    const std::vector<float> a{1.0f, 2.0f, 3.0f}, b{1.0f, 2.0f, 3.0f};
    const LogitError same = compare_logits(a, b);
    CHECK(same.max_abs == 0);
    CHECK(same.kl == 0);
    CHECK(same.top1_agree);
    // Two tokens: p = (1/2, 1/2), q = softmax(0, log 3) = (1/4, 3/4): KL = 1/2 log 2 + 1/2 log(2/3).
    const std::vector<float> p{0.0f, 0.0f}, q{0.0f, float(std::log(3.0))};
    const LogitError e = compare_logits(p, q);
    CHECK(e.kl == Approx(0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0)).epsilon(1e-6));
    CHECK(e.max_abs == Approx(std::log(3.0)).epsilon(1e-6));
    CHECK(!e.top1_agree);  // a tie in p goes to index 0
    CHECK(std::isnan(compare_logits(p, std::vector<float>{0.0f, kNaN}).kl));
    CHECK(std::isnan(compare_logits(p, std::vector<float>{0.0f, kNaN}).max_abs));
    CHECK_THROWS_AS(compare_logits(p, a), Error);
    // Large logits: the maximum is subtracted, nothing overflows.
    CHECK(compare_logits(std::vector<float>{1e30f, 0.0f}, std::vector<float>{1e30f, 1.0f}).kl == 0);

    ErrorSummary s;
    s.add(same);
    s.add(e);
    CHECK(s.steps == 2);
    CHECK(s.max_abs == e.max_abs);
    CHECK(s.max_kl == e.kl);
    CHECK(s.mean_kl() == Approx(e.kl / 2));
    CHECK(s.top1_rate() == 0.5);
}
