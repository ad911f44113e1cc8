// Greedy speculative decoding (core/speculative.h): the tokens, and the target's logits each was
// chosen from, equal plain greedy cached decode bit for bit for any draft, k and cache variant;
// the rows of a multi-row step equal decoding them one at a time; a planted short rollback is
// caught and shrunk; the edges (k past max_seq, the target as its own draft, bad arguments).
#include <rapidcheck/catch.h>

#include <catch2/catch.hpp>
#include <optional>

#include "cache_factory.h"
#include "cpu_backend.h"
#include "decode.h"
#include "planted.h"
#include "speculative.h"
#include "test_util.h"
#include "window_cache.h"

using namespace kvlab;
using kvlab::test::full_range;
using kvlab::test::gen_tiny_config;
using kvlab::test::gen_tokens;

namespace {

// A cache of an exact variant for `c`, drawn: contiguous (either layout), growing, paged with
// any block size, or a window that never evicts (S + W >= max_seq) taking appends in chunks of
// 1-3, so that prefill_rows runs in several steps.
CacheAndPool gen_cache(const Config& c) {
    const int kind = *full_range(0, 5);
    if (kind == 4) {
        const int sinks = *full_range(0, c.max_seq + 1);
        CacheAndPool u;
        u.cache = std::make_unique<WindowCache>(c, sinks, std::max(1, c.max_seq - sinks), *full_range(1, 4));
        return u;
    }
    CacheSpec spec;
    spec.variant = kind == 0 ? Variant::contiguous_head
                   : kind == 1 ? Variant::contiguous_seq
                   : kind == 2 ? Variant::growing
                               : Variant::paged;
    spec.initial_capacity = *full_range(1, c.max_seq + 1);
    spec.block_size = *full_range(1, c.max_seq + 1);
    return make_cache(c, spec);
}

// Speculative against plain greedy decode, over a generated target, draft, k, caches, prompt and
// step count, with `mutant` planted around both caches (planted.h).
void check_speculative_equals_greedy(Mutant mutant) {
    const Config c = *gen_tiny_config(8, 24);
    const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
    const Model target_model = random_model(c, seed);
    // The draft: another model of the target's shape, one of another shape and max_seq, or the
    // target's own model (on a backend of its own, or sharing the target's).
    const int draft_kind = *full_range(0, 4);
    std::optional<Model> other;
    if (draft_kind == 0) other.emplace(random_model(c, seed + 1));
    if (draft_kind == 1) {
        Config dc = *gen_tiny_config(8, 24);
        dc.vocab_size = c.vocab_size;
        other.emplace(random_model(dc, seed + 1));
    }
    const int k = *full_range(1, 9);
    const std::vector<int> prompt = gen_tokens(c);
    const int P = int(prompt.size());
    const int steps = *full_range(1, c.max_seq - P + 2);

    CpuBackend target_backend(target_model);
    std::optional<CpuBackend> draft_backend;
    if (other) draft_backend.emplace(*other);
    else if (draft_kind == 2) draft_backend.emplace(target_model);
    CacheAndPool tc = gen_cache(c);
    CacheAndPool dcache = gen_cache(draft_backend ? draft_backend->config() : c);
    const std::unique_ptr<Cache> planted_t = planted_cache(mutant, *tc.cache),
                                 planted_d = planted_cache(mutant, *dcache.cache);
    CachedDecoder target(target_backend, planted_t ? *planted_t : *tc.cache);
    CachedDecoder draft(draft_backend ? *draft_backend : target_backend, planted_d ? *planted_d : *dcache.cache);
    SpeculativeDecoder spec(target, draft, k);
    static const char* const kDrafts[] = {"another model", "another shape", "the target's model",
                                          "the target's model and backend"};
    const std::string what =
        fmt::format("k = {}, draft {}, target cache {}, draft cache {}, {}, prompt {} + {} steps", k,
                    kDrafts[draft_kind], tc.cache->name(), dcache.cache->name(), c.describe(), P, steps);

    CachedDecoder plain(target_model);
    const DecodeRun want = greedy_decode(plain, prompt, steps);
    const std::size_t V = std::size_t(c.vocab_size);
    // Twice: a second run on the same decoders starts from cleared caches and repeats the first.
    for (int run = 0; run < 2; run++) {
        const DecodeRun got = spec.generate(prompt, steps);
        RC_ASSERT(got.tokens.size() == std::size_t(steps));
        RC_ASSERT(got.logits.size() == std::size_t(steps) * V);
        for (std::size_t i = 0; i < std::size_t(steps); i++) {
            if (auto diff = first_difference(std::span(want.logits).subspan(i * V, V),
                                             std::span(got.logits).subspan(i * V, V)))
                RC_FAIL(fmt::format("{}: target step {}, logits at position {} differ from plain greedy decode, {}",
                                    what, got.step_of[i], P - 1 + int(i), *diff));
            if (got.tokens[i] != want.tokens[i])
                RC_FAIL(fmt::format("{}: token {} is {}, plain greedy decode's {}", what, i, got.tokens[i],
                                    want.tokens[i]));
        }
        const SpeculativeStats& st = got.stats;
        RC_ASSERT(st.accepted <= st.proposed);
        RC_ASSERT(st.proposed <= k * st.target_steps);
        RC_ASSERT(st.accepted + st.target_steps == steps);  // each target step: its accepted drafts and one token
        RC_ASSERT(got.step_of.back() == st.target_steps - 1);
    }
}

}  // namespace

TEST_CASE("speculative decoding emits plain greedy decode's tokens and bitwise logits", "[speculative]") {
    rc::prop("any draft, k and cache variant: tokens and logits bitwise equal to plain greedy",
             [] { check_speculative_equals_greedy(Mutant::none); });
}

TEST_CASE("prefill_rows: every row's logits equal decoding the tokens one at a time", "[speculative][rows]") {
    rc::prop("each row of a multi-row step is the row decoded alone, bit for bit", [] {
        const Config c = *gen_tiny_config(8, 24);
        const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
        const std::vector<int> tokens = gen_tokens(c);
        const int split = *full_range(0, int(tokens.size()));  // held before the multi-row step
        CacheAndPool u = gen_cache(c);
        CachedDecoder rows(m, *u.cache), one(m);
        const std::span<const int> all(tokens);
        if (split > 0) rows.prefill(all.first(split));
        const std::vector<float> got = rows.prefill_rows(all.subspan(split));
        const std::size_t V = std::size_t(c.vocab_size);
        RC_ASSERT(got.size() == (tokens.size() - split) * V);
        for (int t = 0; t < int(tokens.size()); t++) {
            const std::vector<float>& want = one.decode(tokens[t]);
            if (t < split) continue;
            if (auto diff = first_difference(want, std::span(got).subspan(std::size_t(t - split) * V, V)))
                RC_FAIL(fmt::format("{}, {}: row of position {} differs, {}", u.cache->name(), c.describe(), t, *diff));
        }
        // The last row is what prefill returns.
        CachedDecoder last(m);
        if (split > 0) last.prefill(all.first(split));
        RC_ASSERT(!first_difference(last.prefill(all.subspan(split)), std::span(got).last(V)));
    });
}

TEST_CASE("counter-test: a rollback one position short after a rejection is caught and shrunk",
          "[speculative][counter]") {
    const rc::detail::FailureResult failure = kvlab::test::expect_failure(
        [] { check_speculative_equals_greedy(Mutant::spec_rollback_short); }, "differ from plain greedy decode");
    CHECK(!failure.reproduce.shrinkPath.empty());
    std::printf("planted bug (spec-rollback-short) caught after %d passing cases, shrunk in %zu steps to:\n%s\n",
                failure.numSuccess, failure.reproduce.shrinkPath.size(),
                kvlab::test::counterexample_text(failure).c_str());
}

TEST_CASE("k past the positions left near max_seq: fewer drafts, the same output", "[speculative][edges]") {
    const Config c{16, 24, 2, 4, 2, 20, 8};
    const Model target_model = random_model(c, 5), draft_model = random_model(c, 6);
    const std::vector<int> prompt{1, 2, 3, 4, 5};
    for (int k : {1, 3, 4, 7, 100}) {
        for (bool self : {false, true}) {
            CachedDecoder plain(target_model), target(target_model), draft(self ? target_model : draft_model);
            SpeculativeDecoder spec(target, draft, k);
            // 5 + 4 - 1 = 8 = max_seq positions: the last step has no room for k drafts.
            const DecodeRun want = greedy_decode(plain, prompt, 4), got = spec.generate(prompt, 4);
            INFO("k = " << k << (self ? ", the target as draft" : ", another model as draft"));
            CHECK(got.tokens == want.tokens);
            CHECK(!first_difference(want.logits, got.logits));
            CHECK(target.pos() <= c.max_seq);
            CHECK(got.stats.proposed <= 3 + 2 + 1);  // a step drafts at most the tokens left but one
            // The target as draft: every step emits its drafts and one token of its own.
            const int kk = std::min(k, 3);
            if (self) CHECK(got.stats.target_steps == (4 + kk) / (kk + 1));
        }
    }
    // A draft whose max_seq cannot hold the prompt never drafts; the target decodes alone.
    Config small = c;
    small.max_seq = 3;
    const Model tiny = random_model(small, 7);
    CachedDecoder plain(target_model), target(target_model), draft(tiny);
    SpeculativeDecoder spec(target, draft, 4);
    const DecodeRun got = spec.generate(prompt, 4);
    CHECK(got.tokens == greedy_decode(plain, prompt, 4).tokens);
    CHECK(got.stats.proposed == 0);
    CHECK(got.stats.target_steps == 4);
}

TEST_CASE("the target as its own draft: every draft accepted", "[speculative][edges]") {
    rc::prop("acceptance rate 1, k + 1 tokens per target step", [] {
        const Config c = *gen_tiny_config(8, 24);
        const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
        RC_PRE(c.max_seq >= 2);
        std::vector<int> prompt = gen_tokens(c);
        prompt.resize(std::min(prompt.size(), std::size_t(c.max_seq - 1)));  // room for 2 steps at least
        const int steps = *full_range(2, c.max_seq - int(prompt.size()) + 2);
        const int k = *full_range(1, 6);
        CachedDecoder target(m), draft(m);
        SpeculativeDecoder spec(target, draft, k);
        const DecodeRun got = spec.generate(prompt, steps);
        RC_ASSERT(got.stats.proposed > 0);
        RC_ASSERT(got.stats.accepted == got.stats.proposed);
        RC_ASSERT(got.stats.acceptance_rate() == 1.0);
        // Every step but the last emits k + 1 tokens.
        RC_ASSERT(got.stats.target_steps == (steps + k) / (k + 1));
    });
}

TEST_CASE("bad arguments are one-line errors from the library", "[speculative][errors]") {
    const Config c{16, 24, 2, 4, 2, 20, 8};
    Config other_vocab = c;
    other_vocab.vocab_size = 21;
    const Model m = random_model(c, 1), mv = random_model(other_vocab, 2);
    CachedDecoder target(m), draft(m), wrong_vocab(mv);
    CHECK_THROWS_WITH(SpeculativeDecoder(target, draft, 0), Catch::Contains("k >= 1"));
    CHECK_THROWS_WITH(SpeculativeDecoder(target, wrong_vocab, 2), Catch::Contains("vocab_size (21) differs"));
    CHECK_THROWS_WITH(SpeculativeDecoder(target, target, 2), Catch::Contains("a decoder and a cache each"));
    SpeculativeDecoder spec(target, draft, 2);
    CHECK_THROWS_WITH(spec.generate(std::vector<int>{1, 2, 3}, 7), Catch::Contains("more than max_seq = 8"));
    CHECK_THROWS_WITH(spec.generate(std::vector<int>{}, 1), Catch::Contains("at least one token"));
    CHECK_THROWS_WITH(spec.generate(std::vector<int>{1, 20}, 1), Catch::Contains("outside the vocabulary"));
    CHECK(spec.generate(std::vector<int>{1, 2, 3}, 6).tokens.size() == 6);  // 3 + 6 - 1 = 8 fits
    CHECK(spec.generate(std::vector<int>{1}, 0).tokens.empty());
}
