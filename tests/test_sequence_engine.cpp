// The sequence engine (core/sequence_engine.h): any interleaving of new requests (with prefix
// hits), appends, forks, rollbacks, frees and batched steps over one pool leaves every sequence's
// logits equal to naive decode of its own tokens, bit for bit; a refused call changes nothing.
#include <fmt/ranges.h>
#include <rapidcheck/catch.h>

#include <catch2/catch.hpp>

#include "cache_factory.h"
#include "cpu_backend.h"
#include "planted.h"
#include "property.h"
#include "sequence_engine.h"
#include "test_util.h"

using namespace kvlab;

namespace {

// Everything a refused call must leave as it was: each live sequence's tokens and block table,
// and the pool's counts and reference counts.
std::string state_of(const SequenceEngine& e) {
    std::string s;
    for (int id : e.live()) {
        const auto t = e.cache(id).tokens();
        const auto table = e.block_table(id);
        s += fmt::format("seq {} tokens [{}] table [{}]\n", id, fmt::join(t, ","), fmt::join(table, ","));
    }
    if (const BlockPool* p = e.pool()) {
        s += fmt::format("pool free {} cached {} used {} refcounts", p->n_free(), p->n_cached(), p->n_used());
        for (int b = 0; b < p->n_blocks(); b++) s += fmt::format(" {}", p->refcount(b));
    }
    return s;
}

// After a refused call: the engine is in the state `before` (state_of) it was in.
void expect_unchanged(const SequenceEngine& e, const std::string& before, const std::string& what) {
    if (state_of(e) != before)
        RC_FAIL(fmt::format("{}: the refused call changed\n{}\ninto\n{}", what, before, state_of(e)));
}

// A prompt for a new request: fresh tokens, or a live sequence's prefix (to hit the prefix cache)
// followed by fresh ones.
std::vector<int> draw_prompt(const Config& c, const SequenceEngine& e) {
    std::vector<int> prompt;
    const std::vector<int> live = e.live();
    if (!live.empty() && draw(0, 3) > 0) {
        const auto t = e.cache(live[std::size_t(draw(0, int(live.size()) - 1))]).tokens();
        prompt.assign(t.begin(), t.begin() + (*rc::gen::arbitrary<bool>() ? int(t.size()) : draw(0, int(t.size()))));
    }
    const int room = std::max(0, std::min(3, c.max_seq - int(prompt.size())));
    const std::vector<int> more = draw_tokens(c, draw(prompt.empty() ? 1 : 0, std::max(room, prompt.empty() ? 1 : 0)));
    prompt.insert(prompt.end(), more.begin(), more.end());
    return prompt;
}

// What passing runs reached: the generator must hit each path it claims to test.
struct Coverage {
    int prefix_hits = 0, forks = 0, steps = 0, rollbacks = 0, frees = 0, refusals = 0;
};

// The property, with a planted bug in the pool (planted.h) or none.
void engine_property(Mutant mutant, Coverage* coverage = nullptr) {
    Coverage seen;
    const Config c = draw_config(2);
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    // Small blocks half the time: full blocks are what prefix hits share.
    const int bs = draw(1, *rc::gen::arbitrary<bool>() ? std::min(3, c.max_seq) : c.max_seq);
    const int per_seq = (c.max_seq + bs - 1) / bs;
    const std::unique_ptr<BlockPool> pool =
        planted_pool(mutant, c, bs, draw(1, 3 * per_seq), /*prefix_caching=*/draw(0, 3) > 0);
    CpuBackend backend(m);
    NaiveDecoder naive(m);
    SequenceEngine engine(backend, *pool, m.w.fingerprint());
    std::string log = fmt::format("{}, block_size {}, {} blocks{}:", c.describe(), bs, pool->n_blocks(),
                                  pool->prefix_caching() ? ", prefix caching" : "");
    auto expect_naive = [&](int id) {
        if (auto diff = first_difference(naive.forward(engine.cache(id).tokens()), engine.logits(id)))
            RC_FAIL(fmt::format("{}: sequence {}'s logits differ from naive decode, {}", log, id, *diff));
    };
    const int n_calls = draw(2, 12);
    for (int call = 0; call < n_calls; call++) {
        const std::vector<int> live = engine.live();
        const int op = live.empty() ? 0 : draw(0, 5);
        const int id = live.empty() ? -1 : live[std::size_t(draw(0, int(live.size()) - 1))];
        const std::string before = state_of(engine);
        try {
            switch (op) {
                case 0: {
                    const std::vector<int> prompt = draw_prompt(c, engine);
                    log += fmt::format(" add [{}]", fmt::join(prompt, ","));
                    const int added = engine.add(prompt);
                    log += fmt::format(" = {} (hit {})", added, engine.prefix_hit(added));
                    seen.prefix_hits += engine.prefix_hit(added) > 0;
                    expect_naive(added);
                    break;
                }
                case 1: {
                    const std::vector<int> tokens = draw_tokens(c, draw(1, 3));
                    log += fmt::format(" append {} [{}]", id, fmt::join(tokens, ","));
                    engine.append(id, tokens);
                    expect_naive(id);
                    break;
                }
                case 2: {
                    log += fmt::format(" fork {}", id);
                    const int child = engine.fork(id);
                    log += fmt::format(" = {}", child);
                    seen.forks++;
                    RC_ASSERT(!first_difference(engine.logits(id), engine.logits(child)));
                    break;
                }
                case 3: {
                    const int n = draw(0, engine.cache(id).length());
                    log += fmt::format(" rollback {} {}", id, n);
                    engine.rollback(id, n);
                    RC_ASSERT(engine.cache(id).length() == n);
                    seen.rollbacks++;
                    break;
                }
                case 4:
                    log += fmt::format(" free {}", id);
                    engine.free(id);
                    RC_ASSERT(!engine.alive(id));
                    seen.frees++;
                    break;
                default: {
                    std::vector<int> ids;
                    std::vector<std::vector<int>> tokens;
                    for (int l : live)
                        if (engine.cache(l).length() > 0 && *rc::gen::arbitrary<bool>())
                            ids.push_back(l), tokens.push_back(draw_tokens(c, 1));
                    if (ids.empty()) break;
                    log += fmt::format(" step [{}]", fmt::join(ids, ","));
                    engine.step(ids, tokens);
                    for (int s : ids) expect_naive(s);
                    seen.steps++;
                }
            }
        } catch (const Error& e) {
            log += fmt::format(" (refused: {})", e.what());
            seen.refusals++;
            expect_unchanged(engine, before, log);
        }
    }
    if (coverage) {
        coverage->prefix_hits += seen.prefix_hits, coverage->forks += seen.forks, coverage->steps += seen.steps;
        coverage->rollbacks += seen.rollbacks, coverage->frees += seen.frees, coverage->refusals += seen.refusals;
    }
}

}  // namespace

TEST_CASE("sequence engine: any interleaving of requests, appends, forks, rollbacks, frees and steps stays exact",
          "[engine]") {
    static Coverage c;  // static: Catch runs the body again after a failure
    rc::prop("every sequence's logits equal naive decode of its tokens; a refused call changes nothing",
             [] { engine_property(Mutant::none, &c); });
    std::printf("sequence engine: %d prefix hits, %d forks, %d steps, %d rollbacks, %d frees, %d refusals\n",
                c.prefix_hits, c.forks, c.steps, c.rollbacks, c.frees, c.refusals);
    CHECK(c.prefix_hits > 0);
    CHECK(c.forks > 0);
    CHECK(c.steps > 0);
    CHECK(c.rollbacks > 0);
    CHECK(c.frees > 0);
    CHECK(c.refusals > 0);
}

TEST_CASE("sequence engine counter-test: a pool that skips copy-on-write is caught", "[engine][counter]") {
    test::expect_failure([] { engine_property(Mutant::cow_no_copy); }, "logits differ from naive decode");
}

TEST_CASE("sequence engine counter-test: a pool that computes slots with block_size - 1 is caught",
          "[engine][counter]") {
    test::expect_failure([] { engine_property(Mutant::slot_wrong_block); }, "logits differ from naive decode");
}

TEST_CASE("sequence engine counter-test: a refused call that changed a sequence is caught", "[engine][counter]") {
    const Config c =
        Config::parse("dim=8,hidden_dim=8,n_layers=1,n_heads=2,n_kv_heads=1,vocab_size=16,max_seq=8", Config{});
    const Model m = random_model(c, 5);
    test::expect_failure(
        [&] {
            CpuBackend backend(m);
            BlockPool pool(c, 2, 8);
            SequenceEngine engine(backend, pool, 0);
            engine.add(std::vector<int>{1, 2, 3});
            const std::string before = state_of(engine);
            engine.append(0, std::vector<int>{4});  // a call that changes the sequence, then refuses
            expect_unchanged(engine, before, "planted: append, then refuse");
        },
        "the refused call changed");
}

TEST_CASE("sequence engine over another variant: ids count up, fork is refused in one line", "[engine]") {
    const Config c =
        Config::parse("dim=8,hidden_dim=8,n_layers=2,n_heads=2,n_kv_heads=1,vocab_size=16,max_seq=8", Config{});
    const Model m = random_model(c, 5);
    CpuBackend backend(m);
    SequenceEngine engine(backend, [&](int) {
        CacheSpec spec;
        spec.variant = Variant::contiguous_seq;
        return make_cache(c, spec).cache;
    });
    NaiveDecoder naive(m);
    const std::vector<int> a{1, 2, 3}, b{4, 5};
    CHECK(engine.add(a) == 0);
    CHECK(engine.add(b) == 1);
    engine.step(std::vector<int>{0, 1}, std::vector<std::vector<int>>{{6}, {7}});
    CHECK(!first_difference(naive.forward(std::vector<int>{1, 2, 3, 6}), engine.logits(0)));
    CHECK(!first_difference(naive.forward(std::vector<int>{4, 5, 7}), engine.logits(1)));
    CHECK(engine.block_table(0).empty());
    CHECK_THROWS_WITH(engine.fork(0), "sequence 0 cannot fork: its contiguous-seq cache has no shared blocks");
    engine.free(0);
    CHECK_THROWS_WITH(engine.append(0, a), "no live sequence 0");
    CHECK(engine.add(a) == 2);  // ids are never reused
    CHECK(engine.live() == std::vector<int>{1, 2});
}
