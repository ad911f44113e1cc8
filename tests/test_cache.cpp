// Cache variants directly: what they report, the events they record, and bad input that must
// leave every sequence and the pool as they were.
#include <catch2/catch.hpp>
#include <cstring>

#include "cache.h"
#include "decode.h"
#include "paged.h"
#include "quantized_cache.h"
#include "test_util.h"
#include "window_cache.h"

using namespace kvlab;

namespace {

const Config kConfig{16, 8, 2, 4, 2, 32, 12};  // dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab, max_seq

int count(const std::vector<CacheEvent>& events, EventKind kind) {
    return int(std::count_if(events.begin(), events.end(), [&](const CacheEvent& e) { return e.kind == kind; }));
}

}  // namespace

TEST_CASE("a growing cache doubles, counting every move and the bytes it copied", "[cache]") {
    const Model m = random_model(kConfig, 5);
    GrowingCache cache(kConfig, 1);
    CachedDecoder dec(m, cache);
    const int tokens[] = {1, 2, 3, 4, 5};
    for (int t : tokens) dec.decode(t);
    const MemoryStats s = cache.memory();
    // Capacity 1 -> 2 -> 4 -> 8: three moves, copying 1 + 2 + 4 positions.
    CHECK(cache.capacity() == 8);
    CHECK(s.reallocations == 3);
    CHECK(s.bytes_copied == kv_bytes(kConfig, 7));
    CHECK(s.reserved_bytes == kv_bytes(kConfig, 8));
    CHECK(s.reserved_bytes == s.allocated_bytes);
}

TEST_CASE("fork, copy-on-write and rollback are recorded as events", "[cache][paged]") {
    const Model m = random_model(kConfig, 6);
    BlockPool pool(kConfig, 4, 6);
    std::vector<CacheEvent> events;
    pool.trace = &events;
    PagedCache parent(pool, 0, 0);
    parent.trace = &events;
    CachedDecoder(m, parent).prefill(std::vector<int>{1, 2, 3, 4, 5, 6});  // blocks 0 and 1, the second half full
    auto child = parent.fork(1);
    CHECK(count(events, EventKind::block_shared) == 2);
    CHECK(pool.refcount(parent.block_table()[1]) == 2);
    CachedDecoder(m, *child).decode(7);  // writes into the shared partial block: copied first
    CHECK(count(events, EventKind::copy_on_write) == 1);
    CHECK(child->block_table()[0] == parent.block_table()[0]);
    CHECK(child->block_table()[1] != parent.block_table()[1]);
    CHECK(pool.refcount(parent.block_table()[1]) == 1);
    CHECK(pool.shared_writes() == 0);
    child->truncate(3);
    CHECK(count(events, EventKind::rolled_back) == 1);
    CHECK(count(events, EventKind::freed) == 1);  // the child's private copy went back
    CHECK(pool.n_used() == 2);
}

TEST_CASE("a batch that does not fit the pool changes nothing", "[cache][paged][errors]") {
    const Model m = random_model(kConfig, 7);
    BlockPool pool(kConfig, 2, 4);
    PagedCache a(pool, 0, 0), b(pool, 0, 1);
    CachedDecoder dec(m, a);
    dec.prefill(std::vector<int>{1, 2, 3});  // 2 blocks
    const std::vector<int> table = a.block_table();
    const std::vector<float> row(a.key(1, 1, 2), a.key(1, 1, 2) + kConfig.head_size());
    std::vector<Cache*> caches{&a, &b};
    const std::vector<std::vector<int>> rows{{4}, {5, 6, 7, 8, 9}};  // b needs 3 blocks, 2 are free
    CHECK_THROWS_WITH(dec.step(caches, rows), Catch::Contains("needs 3 more blocks"));
    CHECK(a.length() == 3);
    CHECK(a.block_table() == table);
    CHECK(b.length() == 0);
    CHECK(pool.n_free() == 2);
    CHECK(std::memcmp(row.data(), a.key(1, 1, 2), row.size() * sizeof(float)) == 0);
    // And the sequence still decodes exactly afterwards.
    NaiveDecoder naive(m);
    CHECK(!first_difference(dec.decode(4), naive.forward(std::vector<int>{1, 2, 3, 4})));
}

TEST_CASE("bad cache parameters and requests are one-line errors from the library", "[cache][errors]") {
    CHECK_THROWS_WITH(BlockPool(kConfig, 0, 4), Catch::Contains("block_size 0 is outside [1, max_seq = 12]"));
    CHECK_THROWS_WITH(BlockPool(kConfig, 13, 4), Catch::Contains("block_size 13"));
    CHECK_THROWS_WITH(BlockPool(kConfig, 4, 0), Catch::Contains("at least one block"));
    CHECK_THROWS_WITH(GrowingCache(kConfig, 0), Catch::Contains("initial capacity 0"));
    ContiguousCache cache(kConfig);
    CHECK_THROWS_WITH(cache.truncate(-1), Catch::Contains("cannot roll back to -1"));
    CHECK_THROWS_WITH(cache.truncate(1), Catch::Contains("cannot roll back to 1 (length is 0)"));
    // A cache of another shape is refused by the decoder.
    Config other = kConfig;
    other.n_layers = 3;
    ContiguousCache wrong(other);
    const Model m = random_model(kConfig, 8);
    CHECK_THROWS_WITH(CachedDecoder(m, wrong), Catch::Contains("does not fit the model"));
}

TEST_CASE("one size limit: a model, a pool or a cache past kMaxBytes is refused before it is allocated",
          "[cache][errors]") {
    // Every one of these would take more than 1 GiB (none is allocated: the test runs in kilobytes).
    const auto refused = Catch::Contains("over the limit of 1073741824 B (1 GiB)");
    Config big = stories260k_shape();
    big.dim = 4096, big.hidden_dim = 11008, big.n_heads = 32, big.n_kv_heads = 32, big.n_layers = 32;
    big.vocab_size = 32000, big.max_seq = 2048;
    CHECK_THROWS_WITH(random_model(big, 1), refused);                         // 26 GB of weights
    CHECK_THROWS_WITH(BlockPool(stories260k_shape(), 16, 1 << 20), refused);  // 21 GB of blocks
    Config long_cache = stories260k_shape();
    long_cache.dim = 512, long_cache.n_heads = 8, long_cache.n_kv_heads = 8, long_cache.max_seq = 131072;
    CHECK_THROWS_WITH(ContiguousCache(long_cache), refused);  // 2.5 GiB of K and V
    GrowingCache growing(long_cache, 131072);                 // allocates as it grows: the limit applies then
    const std::vector<int> one = {1};
    CHECK_THROWS_WITH(growing.append(one), refused);
    CHECK(growing.length() == 0);
    Config wider = long_cache;
    wider.dim = 1024, wider.n_heads = 16, wider.n_kv_heads = 16;
    CHECK_THROWS_WITH(QuantizedCache(wider), refused);  // 1.7 GB of int8 rows and scales
    CHECK_THROWS_WITH(WindowCache(long_cache, 4, 131068), refused);
    // Just under the limit is still allowed: the limit is the stated one, not a rounder figure.
    CHECK_NOTHROW(kvlab::check_size("x", kMaxBytes / 8, 8));
    CHECK_THROWS_WITH(kvlab::check_size("x", kMaxBytes / 8 + 1, 8), refused);
    CHECK_THROWS_WITH(kvlab::check_size("x", std::int64_t{1} << 62, 1 << 20), refused);  // past int64, no wrap
}

TEST_CASE("a stale cache is refused with the position of the edit", "[cache][errors]") {
    const Model m = random_model(kConfig, 9);
    CachedDecoder dec(m);
    dec.extend(std::vector<int>{1, 2, 3});
    CHECK_THROWS_WITH(dec.extend(std::vector<int>{1, 9, 3, 4}),
                      Catch::Contains("stale cache") && Catch::Contains("position 1"));
    CHECK(dec.pos() == 3);  // nothing ran
    CHECK_THROWS_WITH(dec.extend(std::vector<int>{1, 2, 3}), Catch::Contains("already holds all 3"));
}

TEST_CASE("a window cache refuses to roll back past rows it evicted, unchanged", "[cache][window][errors]") {
    const Model m = random_model(kConfig, 10);
    WindowCache cache(kConfig, 1, 2, 1);
    CachedDecoder dec(m, cache);
    dec.prefill(std::vector<int>{1, 2, 3, 4, 5, 6});
    CHECK_THROWS_WITH(cache.truncate(2), Catch::Contains("evicted"));
    CHECK(cache.length() == 6);
    CHECK(cache.memory().reserved_bytes == kv_bytes(kConfig, 1 + 2 + 1 - 1));
}
