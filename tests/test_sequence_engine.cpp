// The sequence engine (core/sequence_engine.h): any interleaving of new requests (with prefix
// hits), appends, forks, rollbacks, frees and batched steps over one pool leaves every sequence's
// logits equal to naive decode of its own tokens, bit for bit; a refused call changes nothing.
#include <fmt/ranges.h>
#include <rapidcheck/catch.h>

#include <catch2/catch.hpp>

#include "cache_factory.h"
#include "cpu_backend.h"
#include "engine_property.h"
#include "planted.h"
#include "property.h"
#include "sequence_engine.h"
#include "test_util.h"

using namespace kvlab;

namespace {

using proofs::engine_state;
using proofs::expect_unchanged;

// Pools with a planted bug (planted.h), or none.
proofs::EnginePoolMaker planted(Mutant m) {
    return [m](const Config& c, int block_size, int n_blocks, bool prefix_caching) {
        return planted_pool(m, c, block_size, n_blocks, prefix_caching);
    };
}

// Core's manager, but a fork or a prefix hit does not count its new owner: a block then goes back
// while a table still maps it.
class ForgetsRetain final : public BlockManager {
public:
    explicit ForgetsRetain(int n_blocks) : books_(n_blocks) {}
    int n_blocks() const override { return books_.n_blocks(); }
    int available() const override { return books_.available(); }
    int allocate(bool& evicted) override { return books_.allocate(evicted); }
    void retain(int) override {}  // the mistake
    bool release(int block) override { return books_.refcount(block) > 0 && books_.release(block); }
    int refcount(int block) const override { return books_.refcount(block); }
    bool published(int block) const override { return books_.published(block); }
    std::uint64_t hash(const BlockKey& key) const override { return books_.hash(key); }
    int lookup(const BlockKey& key) const override { return books_.lookup(key); }
    void publish(int block, const BlockKey& key) override { books_.publish(block, key); }
    bool needs_copy(int block) const override { return books_.needs_copy(block); }

private:
    RefCountManager books_;
};

}  // namespace

TEST_CASE("sequence engine: any interleaving of requests, appends, forks, rollbacks, frees and steps stays exact",
          "[engine]") {
    static proofs::EngineCoverage c;  // static: Catch runs the body again after a failure
    rc::prop("every sequence's logits equal naive decode of its tokens; the books agree with the tables; a refused "
             "call changes nothing",
             [] { proofs::engine_property(planted(Mutant::none), &c); });
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
    test::expect_failure([] { proofs::engine_property(planted(Mutant::cow_no_copy)); },
                         "went into a block another sequence or a prefix hit could read");
}

TEST_CASE("sequence engine counter-test: a pool that computes slots with block_size - 1 is caught",
          "[engine][counter]") {
    test::expect_failure([] { proofs::engine_property(planted(Mutant::slot_wrong_block)); }, "logits differ from naive decode");
}

TEST_CASE("sequence engine counter-test: a block manager that forgets the owners forks and prefix hits add is caught",
          "[engine][counter]") {
    test::expect_failure(
        [] {
            proofs::engine_property([](const Config& c, int block_size, int n_blocks, bool prefix_caching) {
                return std::make_unique<BlockPool>(c, block_size, n_blocks, prefix_caching, host_memory(),
                                                   std::make_unique<ForgetsRetain>(n_blocks));
            });
        },
        "refcount");  // a refcount that disagrees with the tables, or that a refused call changed
}

TEST_CASE("a pool refuses, in one line, a block its manager hands out while a sequence still holds it",
          "[engine][counter]") {
    const Config c =
        Config::parse("dim=8,hidden_dim=8,n_layers=1,n_heads=2,n_kv_heads=1,vocab_size=16,max_seq=8", Config{});
    const Model m = random_model(c, 5);
    CpuBackend backend(m);
    BlockPool pool(c, 2, 4, false, host_memory(), std::make_unique<ForgetsRetain>(4));
    SequenceEngine engine(backend, pool, 0);
    engine.add(std::vector<int>{1, 2, 3});  // blocks 0 and 1
    engine.fork(0);                         // not counted
    engine.free(0);                         // blocks 0 and 1 go back while sequence 1 maps them
    CHECK_THROWS_WITH(engine.add(std::vector<int>{4}),
                      "block manager: allocate() gave block 1, which 1 sequence(s) still map");
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
            const std::string before = engine_state(engine);
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
