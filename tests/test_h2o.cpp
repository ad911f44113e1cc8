// H2O (core/h2o_cache.h) and FIFO (window_cache.h). H2O: what each layer and KV head keeps,
// step by step under any attention weights, equals a reference written with a map per head;
// rollbacks undo exactly; a failed request leaves it as it was; heavy = 0 is FIFO, which is a
// window without sinks, bitwise; every backend keeps the same positions and logits. Where H2O is
// exact (T <= recent + heavy) and where it stops being so is `kvlab verify h2o`'s row.
// GCC 12 misreads fmt's format-spec parser as an overflow when it inlines fmt::join here (a
// known false positive, as in test_policies.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif

#include <fmt/ranges.h>
#include <rapidcheck/catch.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <random>

#include "cache_factory.h"
#include "decode.h"
#include "device.h"
#include "h2o_cache.h"
#include "model.h"
#include "property.h"
#include "test_util.h"
#include "window_cache.h"

using namespace kvlab;

namespace {

// The same steps as H2OCache, over a sorted map per (layer, KV head): position -> score.
struct Reference {
    int recent, heavy, capacity;
    bool newest_on_tie = false;  // planted: a tie evicts the newest candidate
    bool first_head_only = false;  // planted: a KV head sums only its first query head
    std::vector<std::map<int, float>> heads;  // [n_layers * n_kv_heads]

    void append(int pos) {
        for (auto& kept : heads) {
            if (int(kept.size()) == capacity) {
                auto victim = kept.end();
                for (auto it = kept.begin(); it != kept.end() && it->first <= pos - recent; ++it)
                    if (victim == kept.end() || it->second < victim->second ||
                        (newest_on_tie && it->second == victim->second))
                        victim = it;
                kept.erase(victim);
            }
            kept[pos] = 0.0f;
        }
    }
    void weights(const Config& c, int l, const std::vector<float>& w) {  // w: [n_heads, held]
        for (int g = 0; g < c.n_heads; g++) {
            if (first_head_only && g % c.group() != 0) continue;
            auto& kept = heads[std::size_t(l * c.n_kv_heads + g / c.group())];
            int j = 0;
            for (auto& [pos, score] : kept) score += w[std::size_t(g) * kept.size() + std::size_t(j++)];
        }
    }
};

// The cache's shape: 1-3 layers, 1-3 KV heads of 1-2 query heads each, head_size 1-3.
Config draw_shape() {
    const int n_kv_heads = draw(1, 3), group = draw(1, 2), head_size = draw(1, 3);
    return Config{n_kv_heads * group * head_size, 1, draw(1, 3), n_kv_heads * group, n_kv_heads, 1, draw(1, 24)};
}

// Appends, weights (a few values, so ties happen) and rollbacks of 1..kRollbackSteps steps, in
// any order; after each, every layer and head keeps the reference's positions with its scores,
// their rows are the ones written, and the rest read NaN.
void kept_property(bool newest_on_tie, bool first_head_only) {
    const Config c = draw_shape();
    const int recent = draw(1, 4), heavy = draw(0, 4);
    H2OCache cache(c, recent, heavy);
    Reference ref{recent, heavy, cache.capacity(), newest_on_tie, first_head_only,
                  std::vector<std::map<int, float>>(std::size_t(c.n_layers * c.n_kv_heads))};
    std::vector<Reference> before;  // the reference before each step
    std::vector<float> rows;        // [max_seq, n_layers, kv_dim] the K rows written (V = -K)
    std::mt19937 rng(draw(0, 1 << 20));
    const int ops = draw(1, 3 * c.max_seq);
    for (int op = 0; op < ops; op++) {
        const int pos = cache.length();
        const int back = pos > 0 && draw(0, 4) == 0 ? draw(1, std::min<int>(pos, H2OCache::kRollbackSteps)) : 0;
        if (back > 0 && int(before.size()) >= back) {
            cache.truncate(pos - back);
            ref = before[before.size() - std::size_t(back)];
            before.resize(before.size() - std::size_t(back));
        } else if (pos < c.max_seq) {
            before.push_back(ref);
            if (int(before.size()) > H2OCache::kRollbackSteps) before.erase(before.begin());
            cache.append(std::vector<int>{0});
            ref.append(pos);
            rows.resize(std::size_t(pos + 1) * c.n_layers * c.kv_dim());
            for (int l = 0; l < c.n_layers; l++) {
                float* k = rows.data() + (std::size_t(pos) * c.n_layers + l) * c.kv_dim();
                std::vector<float> v(std::size_t(c.kv_dim()));  // [kv_dim]
                for (int i = 0; i < c.kv_dim(); i++) k[i] = float(rng() % 1000) / 8.0f, v[std::size_t(i)] = -k[i];
                cache.write(l, pos, k, v.data());
                std::vector<float> w(std::size_t(c.n_heads) * std::size_t(cache.held()));  // [n_heads, held]
                for (float& x : w) x = float(rng() % 3) / 4.0f;
                cache.attention_weights(l, w);
                ref.weights(c, l, w);
            }
        }
        for (int l = 0; l < c.n_layers; l++)
            for (int h = 0; h < c.n_kv_heads; h++) {
                const auto& want = ref.heads[std::size_t(l * c.n_kv_heads + h)];
                const std::span<const int> kept = cache.kept(l, h);
                const std::span<const float> scores = cache.scores(l, h);
                std::vector<int> got_pos(kept.begin(), kept.end()), want_pos;
                for (const auto& [t, s] : want) want_pos.push_back(t);
                if (got_pos != want_pos)
                    fail(fmt::format("after {} ops, layer {} head {} keeps positions {}, expected {}", op + 1, l, h,
                                     fmt::join(got_pos, " "), fmt::join(want_pos, " ")));
                int j = 0;
                for (const auto& [t, s] : want)
                    if (scores[std::size_t(j++)] != s)
                        fail(fmt::format("layer {} head {}: position {}'s score is {}, expected {}", l, h, t,
                                         scores[std::size_t(j - 1)], s));
                for (int t = 0; t < cache.length(); t++) {
                    const float* k = cache.key(l, h, t);
                    const float* v = cache.value(l, h, t);
                    const bool held = want.count(t) > 0;
                    const float* written = rows.data() + (std::size_t(t) * c.n_layers + l) * c.kv_dim() +
                                           std::size_t(h) * c.head_size();
                    for (int d = 0; d < c.head_size(); d++)
                        if (held ? !(k[d] == written[d] && v[d] == -written[d]) : !std::isnan(k[d]))
                            fail(fmt::format("layer {} head {} position {}: its row reads {} (held: {})", l, h, t,
                                             k[d], held));
                }
            }
        if (cache.memory().used_bytes != kv_bytes(c, cache.held()) ||
            cache.memory().reserved_bytes != cache.memory().allocated_bytes)
            fail("memory: used bytes are not the held rows', or reserved != allocated");
    }
}

// Prefill a drawn prompt, decode the rest; the logits of every cache equal the first's at every step.
std::vector<std::vector<float>> decode_all(const Model& m, Cache& cache, const std::vector<int>& tokens, int prompt,
                                           Backend* backend = nullptr) {
    std::unique_ptr<CachedDecoder> d =
        backend ? std::make_unique<CachedDecoder>(*backend, cache) : std::make_unique<CachedDecoder>(m, cache);
    std::vector<std::vector<float>> out{d->prefill(std::span(tokens).first(std::size_t(prompt)))};
    for (std::size_t t = std::size_t(prompt); t < tokens.size(); t++) out.push_back(d->decode(tokens[t]));
    return out;
}

// heavy = 0 keeps the latest `recent`: FIFO of that window; FIFO is a window without sinks.
// planted_heavy 1 (recent one less) must differ somewhere.
void fifo_property(int planted_heavy) {
    const Config c = draw_config(2);
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const std::vector<int> tokens = draw_tokens(c, draw(2, c.max_seq));
    const int prompt = draw(1, int(tokens.size())), w = draw(1 + planted_heavy, c.max_seq);
    H2OCache h2o(c, w - planted_heavy, planted_heavy);
    FifoCache fifo(c, w);
    WindowCache window(c, 0, w);
    const auto a = decode_all(m, h2o, tokens, prompt), b = decode_all(m, fifo, tokens, prompt),
               d = decode_all(m, window, tokens, prompt);
    for (std::size_t i = 0; i < a.size(); i++) {
        const std::string what = fmt::format("window {}, {}, T = {}", w, c.describe(), prompt + int(i));
        if (auto diff = first_difference(b[i], a[i])) fail(fmt::format("{}: {} differs from fifo: {}", what, h2o.name(), *diff));
        if (auto diff = first_difference(d[i], b[i])) fail(fmt::format("{}: fifo differs from window: {}", what, *diff));
    }
}

// Decode A, then `extra` tokens, roll them back, decode B: equal to decoding A then B, logits and
// kept positions. planted: the extra tokens are not rolled back (must differ).
void rollback_property(bool planted) {
    const Config c = draw_config(3);
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const int na = draw(1, c.max_seq - 1), extra = draw(1, std::min(H2OCache::kRollbackSteps, c.max_seq - na));
    const std::vector<int> a = draw_tokens(c, na), more = draw_tokens(c, extra),
                           b = draw_tokens(c, draw(1, c.max_seq - na - (planted ? extra : 0)));
    const int recent = draw(1, 3), heavy = draw(0, 3);
    H2OCache rolled(c, recent, heavy), plain(c, recent, heavy);
    CachedDecoder dr(m, rolled), dp(m, plain);
    dr.prefill(a), dp.prefill(a);
    dr.prefill(more);
    if (!planted) rolled.truncate(na);
    for (std::size_t i = 0; i < b.size(); i++) {
        const std::string what = fmt::format("{}, {}, A {} + {} rolled back, B step {}", rolled.name(), c.describe(),
                                             na, extra, i);
        if (auto diff = first_difference(dp.decode(b[i]), dr.decode(b[i])))
            fail(fmt::format("{}: logits differ: {}", what, *diff));
        for (int l = 0; l < c.n_layers; l++)
            for (int h = 0; h < c.n_kv_heads; h++)
                if (!std::ranges::equal(rolled.kept(l, h), plain.kept(l, h)) ||
                    !std::ranges::equal(rolled.scores(l, h), plain.scores(l, h)))
                    fail(fmt::format("{}: layer {} head {} keeps other positions or scores", what, l, h));
    }
}

}  // namespace

TEST_CASE("h2o: each layer and KV head keeps the recent window and its heaviest as a map-based reference does",
          "[h2o]") {
    rc::prop("any shape, recent 1..4, heavy 0..4, weights with ties, rollbacks", [] { kept_property(false, false); });
}

TEST_CASE("h2o counter-tests: a newest-first tie-break and a one-head sum are caught", "[h2o][counter]") {
    test::expect_failure([] { kept_property(true, false); }, "keeps positions");
    test::expect_failure([] { kept_property(false, true); }, "score");
}

TEST_CASE("h2o with heavy 0 is fifo and fifo is a window without sinks: logits bitwise equal", "[h2o][fifo]") {
    rc::prop("random models, prompts and windows", [] { fifo_property(0); });
}

TEST_CASE("h2o counter-test: one heavy hitter instead of the oldest recent position changes the logits",
          "[h2o][counter]") {
    test::expect_failure([] { fifo_property(1); }, "differs from fifo");
}

TEST_CASE("h2o: rolling back up to its log then decoding equals never having decoded the rolled back tokens",
          "[h2o]") {
    rc::prop("random models, A, up to 8 extra tokens, B", [] { rollback_property(false); });
}

TEST_CASE("h2o counter-test: tokens left in place are caught by the rollback property", "[h2o][counter]") {
    test::expect_failure([] { rollback_property(true); }, "rolled back, B step");
}

TEST_CASE("h2o: every backend keeps the same positions and gives the same logits", "[h2o][gpu]") {
    rc::prop("random models on cpu and gpu-host (and gpu where there is one)", [] {
        const Config c = draw_config(2);
        const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
        const std::vector<int> tokens = draw_tokens(c, draw(2, c.max_seq));
        const int prompt = draw(1, int(tokens.size())), recent = draw(1, 3), heavy = draw(0, 3);
        H2OCache cpu(c, recent, heavy);
        const auto want = decode_all(m, cpu, tokens, prompt);
        for (const char* device : {"gpu-host", "gpu"}) {
            if (std::string(device) == "gpu" && !gpu_unavailable().empty()) continue;
            const std::unique_ptr<Backend> b = make_backend(device, m);
            H2OCache other(c, recent, heavy, b->memory());
            const auto got = decode_all(m, other, tokens, prompt, b.get());
            for (std::size_t i = 0; i < got.size(); i++)
                if (auto diff = first_difference(want[i], got[i]))
                    fail(fmt::format("{} on {}, {}: step {} differs from cpu: {}", cpu.name(), device, c.describe(), i,
                                     *diff));
            for (int l = 0; l < c.n_layers; l++)
                for (int h = 0; h < c.n_kv_heads; h++)
                    if (!std::ranges::equal(cpu.kept(l, h), other.kept(l, h)))
                        fail(fmt::format("{} on {}: layer {} head {} keeps other positions", cpu.name(), device, l, h));
        }
    });
}

TEST_CASE("h2o: a request that fails part-way leaves every position score and row as it was", "[h2o]") {
    Config c = stories260k_shape();
    c.max_seq = 64;
    const Model m = random_model(c, 5);
    H2OCache cache(c, 4, 4);
    CachedDecoder d(m, cache);
    std::vector<int> tokens(40);
    for (int i = 0; i < 40; i++) tokens[std::size_t(i)] = (7 * i + 3) % c.vocab_size;
    d.prefill(std::span(tokens).first(20));
    const std::vector<int> kept(cache.kept(2, 1).begin(), cache.kept(2, 1).end());
    const std::vector<float> scores(cache.scores(2, 1).begin(), cache.scores(2, 1).end());
    std::vector<float> key(cache.key(2, 1, kept[0]), cache.key(2, 1, kept[0]) + c.head_size());
    int steps = 0;
    d.transform = [&](StepPlan&) {
        if (++steps == 15) throw Error("planted failure");
    };
    // 20 steps, more than the rollback log holds: the request keeps a copy.
    CHECK_THROWS_WITH(d.prefill(std::span(tokens).subspan(20)), "planted failure");
    CHECK(cache.length() == 20);
    CHECK(std::ranges::equal(cache.kept(2, 1), kept));
    CHECK(std::ranges::equal(cache.scores(2, 1), scores));
    CHECK(std::equal(key.begin(), key.end(), cache.key(2, 1, kept[0])));
    // And then it goes on as if nothing had happened.
    d.transform = {};
    H2OCache fresh(c, 4, 4);
    CachedDecoder f(m, fresh);
    f.prefill(std::span(tokens).first(20));
    CHECK(!first_difference(f.prefill(std::span(tokens).subspan(20)), d.prefill(std::span(tokens).subspan(20))));
}

TEST_CASE("h2o: one-line errors for nonsense parameters, deep rollbacks, batching and old queries", "[h2o][errors]") {
    const Config c{8, 4, 2, 2, 1, 8, 16};  // dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq
    CHECK_THROWS_WITH(H2OCache(c, 0, 4), "h2o cache: recent must be >= 1 (the query's own position), not 0");
    CHECK_THROWS_WITH(H2OCache(c, 2, -1), "h2o cache: heavy must be >= 0, not -1");
    const Model m = random_model(c, 3);
    H2OCache cache(c, 2, 2), other(c, 2, 2);
    CachedDecoder d(m, cache);
    std::vector<int> tokens(12, 1);
    d.prefill(tokens);
    CHECK_THROWS_WITH(cache.truncate(2),
                      "h2o(recent=2,heavy=2): cannot roll back 10 positions to 2: it can undo its last 8 steps only");
    CHECK(cache.length() == 12);
    std::vector<std::int64_t> slots(16);
    CHECK_THROWS_WITH(cache.attended(5, slots.data()), Catch::Contains("only the latest query's positions are known"));
    Cache* both[] = {&cache, &other};
    const std::vector<std::vector<int>> step{{1}, {1}};
    CHECK_THROWS_WITH(d.step(both, step), Catch::Contains("reads its query's attention weights: it steps one row alone"));
    CHECK(cache.length() == 12);
    cache.clear();
    CHECK(cache.held() == 0);
    CHECK(cache.memory().used_bytes == 0);
}
