// API misuse: every misuse of the cache and decoder API is refused with one line that
// names it, and leaves every cache as it was: lengths, tokens, block tables, every row bit for
// bit, and for a pool its counts, refcounts and published blocks.
//
// The properties build a random valid state by random operations (appends of synthetic rows,
// rollbacks, forks, freed forks) over caches of every variant sharing one config and one pool,
// commit one misuse, and compare snapshots taken before and after. Where the library refused
// correctly before these tests existed, the test says so; the counter-tests at the end show the
// comparison itself catches a misuse that changes state before it throws, a message of two
// lines or one that names the wrong culprit, and a wrong result.
//
// "Freed while stepped": a decoder reads its cache's length and rows at every call and keeps
// nothing of a batch's caches between calls, so a cache rolled back or reset by another owner,
// or a batch member destroyed, between steps leaves the next step exact (tested below). A cache
// destroyed while a CachedDecoder or a SpeculativeDecoder still holds a reference to it cannot
// be detected without owning it (decode.h: the cache must outlive its decoder). A pool destroyed
// before its sequences orphans them: every later use is refused, and destroying them is safe.
#include <fmt/format.h>
#include <rapidcheck.h>
#include <rapidcheck/catch.h>

#include <algorithm>
#include <cassert>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu_backend.h"
#include "decode.h"
#include "forwarding.h"
#include "paged.h"
#include "property.h"
#include "quantized_cache.h"
#include "speculative.h"
#include "synthetic_rows.h"
#include "test_util.h"
#include "window_cache.h"

using namespace kvlab;
using proofs::append_rows;

namespace {

std::vector<std::uint32_t> bits(const float* p, std::int64_t n) {
    std::vector<std::uint32_t> b(std::size_t(std::max<std::int64_t>(n, 0)));
    if (n > 0) std::memcpy(b.data(), p, std::size_t(n) * sizeof(float));
    return b;
}

// ----------------------------------------------------------------------------------------------
// Snapshots: everything a refused call must leave as it was.

struct HeldState {
    std::string name;
    int length = 0;
    std::vector<int> tokens, table;       // table: a paged cache's blocks
    std::vector<std::int64_t> slots;      // [n] the slots a query at length - 1 attends
    std::vector<std::uint32_t> attended;  // [n_layers, n_kv_heads, n, 2, head_size] those rows' K and V bits
    std::vector<std::uint8_t> k, v;       // the whole storage (a pool's: every sequence's), bytes
    int n_blocks = 0;                     // a paged cache's pool: k and v are n_blocks equal parts
};

HeldState held_state(const Cache& cache) {
    const Config& c = cache.config();
    HeldState s;
    s.name = cache.name();
    s.length = cache.length();
    s.tokens.assign(cache.tokens().begin(), cache.tokens().end());
    if (const auto* p = dynamic_cast<const PagedCache*>(&cache))
        s.table = p->block_table(), s.n_blocks = p->pool().n_blocks();
    if (s.length > 0) {
        s.slots.assign(std::size_t(s.length), -1);
        s.slots.resize(std::size_t(cache.attended(s.length - 1, s.slots.data())));
        // What a query at the last position reads, decoded as attention decodes it (key() and
        // value(), which also see a quantized cache's fp32 residual).
        std::vector<int> positions(std::size_t(s.length), -1);
        const int n =
            cache.attended(s.length - 1, std::vector<std::int64_t>(positions.size()).data(), positions.data());
        for (int l = 0; l < c.n_layers; l++)
            for (int h = 0; h < c.n_kv_heads; h++)
                for (int i = 0; i < n; i++)
                    for (int kv = 0; kv < 2; kv++) {
                        const int t = positions[std::size_t(i)];
                        const auto b = bits(kv ? cache.value(l, h, t) : cache.key(l, h, t), c.head_size());
                        s.attended.insert(s.attended.end(), b.begin(), b.end());
                    }
    }
    const KVStorage& st = cache.storage();
    s.k.assign(st.k.data(), st.k.data() + st.k.size());
    s.v.assign(st.v.data(), st.v.data() + st.v.size());
    return s;
}

struct PoolSnapshot {
    int n_free = 0, n_cached = 0, n_used = 0;
    std::vector<int> refcounts;
    std::vector<bool> published;
    std::int64_t shared_writes = 0, prefix_hits = 0;
};

PoolSnapshot held_state(const BlockPool& pool) {
    PoolSnapshot s;
    s.n_free = pool.n_free(), s.n_cached = pool.n_cached(), s.n_used = pool.n_used();
    for (int b = 0; b < pool.n_blocks(); b++) {
        s.refcounts.push_back(pool.refcount(b));
        s.published.push_back(pool.published(b));
    }
    s.shared_writes = pool.shared_writes(), s.prefix_hits = pool.prefix_hit_positions();
    return s;
}

// a's storage with the bytes of these pool blocks set to b's: blocks a failed request evicted.
HeldState with_blocks_of(HeldState a, const HeldState& b, const std::vector<int>& blocks) {
    if (a.n_blocks == 0 || a.k.size() != b.k.size() || a.v.size() != b.v.size()) return a;
    for (auto [x, y] : {std::pair{&a.k, &b.k}, std::pair{&a.v, &b.v}}) {
        assert(x->size() % std::size_t(a.n_blocks) == 0);  // [n_blocks, n_layers, n_kv_heads, block_size] rows
        const std::size_t per_block = x->size() / std::size_t(a.n_blocks);
        for (int blk : blocks)
            std::copy_n(y->begin() + std::ptrdiff_t(per_block * std::size_t(blk)), per_block,
                        x->begin() + std::ptrdiff_t(per_block * std::size_t(blk)));
    }
    return a;
}

// The first difference between two snapshots of cache `who`, or "".
std::string difference(const HeldState& a, const HeldState& b, const std::string& who) {
    auto first = [](const auto& x, const auto& y) {
        std::size_t i = 0;
        while (i < x.size() && i < y.size() && x[i] == y[i]) i++;
        return i;
    };
    if (a.length != b.length) return fmt::format("{}: length {} -> {}", who, a.length, b.length);
    if (a.tokens != b.tokens) return fmt::format("{}: tokens differ at position {}", who, first(a.tokens, b.tokens));
    if (a.table != b.table) return fmt::format("{}: block table differs at entry {}", who, first(a.table, b.table));
    if (a.slots != b.slots) return fmt::format("{}: attended slot {} changed", who, first(a.slots, b.slots));
    if (a.attended != b.attended)
        return fmt::format("{}: attended row bits differ at float {} ({:08x} -> {:08x})", who,
                           first(a.attended, b.attended), a.attended[first(a.attended, b.attended)],
                           b.attended[first(a.attended, b.attended)]);
    for (const auto& [name, x, y] : {std::tuple{"K", &a.k, &b.k}, std::tuple{"V", &a.v, &b.v}})
        if (*x != *y) {
            const std::size_t i = first(*x, *y);
            return fmt::format("{}: {} storage differs at byte {} of {} ({:02x} -> {:02x})", who, name, i, x->size(),
                               i < x->size() ? (*x)[i] : 0, i < y->size() ? (*y)[i] : 0);
        }
    return "";
}

std::string difference(const PoolSnapshot& a, const PoolSnapshot& b) {
    if (a.n_free != b.n_free || a.n_cached != b.n_cached || a.n_used != b.n_used)
        return fmt::format("pool: free/cached/used {}/{}/{} -> {}/{}/{}", a.n_free, a.n_cached, a.n_used, b.n_free,
                           b.n_cached, b.n_used);
    for (std::size_t i = 0; i < a.refcounts.size(); i++)
        if (a.refcounts[i] != b.refcounts[i] || a.published[i] != b.published[i])
            return fmt::format("pool: block {} refcount {} -> {}, published {} -> {}", i, a.refcounts[i],
                               b.refcounts[i], bool(a.published[i]), bool(b.published[i]));
    if (a.shared_writes != b.shared_writes)
        return fmt::format("pool: shared_writes {} -> {}", a.shared_writes, b.shared_writes);
    if (a.prefix_hits != b.prefix_hits) return fmt::format("pool: prefix hits {} -> {}", a.prefix_hits, b.prefix_hits);
    return "";
}

// How a misuse was answered: "" when it threw kvlab::Error with one line containing every one of
// `culprits`, else what went wrong.
template <class F>
std::string refusal_problem(F&& misuse, std::vector<std::string> culprits) {
    try {
        misuse();
    } catch (const Error& e) {
        const std::string m = e.what();
        if (m.find('\n') != std::string::npos) return fmt::format("the refusal is not one line: \"{}\"", m);
        for (const std::string& c : culprits)
            if (m.find(c) == std::string::npos) return fmt::format("the refusal \"{}\" does not name \"{}\"", m, c);
        return "";
    } catch (const std::exception& e) {
        return fmt::format("refused with a {} instead of kvlab::Error: {}", typeid(e).name(), e.what());
    }
    return fmt::format("not refused (expected a message naming \"{}\")", culprits.empty() ? "" : culprits[0]);
}

// ----------------------------------------------------------------------------------------------
// A world: caches of every variant over one config, the paged ones sharing one pool, brought to
// a random valid state by random operations.

struct World {
    Config config;
    std::unique_ptr<BlockPool> pool;
    std::vector<std::unique_ptr<Cache>> caches;
    std::vector<int> latest;  // [caches] the first position of each one's latest append: rows from it are writable

    struct Snapshot {
        std::vector<HeldState> caches;
        PoolSnapshot pool;
    };
    Snapshot snap() const {
        Snapshot s;
        for (const auto& c : caches) s.caches.push_back(held_state(*c));
        s.pool = held_state(*pool);
        return s;
    }
    std::string difference(const Snapshot& before) const { return difference(caches, before, snap()); }
    // With may_evict, blocks that were in the prefix cache (published, held by nobody) may have
    // left it, free now and their rows gone: a failed request keeps what its allocations evicted,
    // as a finished one does. Nothing else may change.
    static std::string difference(const std::vector<std::unique_ptr<Cache>>& caches, Snapshot before,
                                  const Snapshot& now, bool may_evict = false) {
        std::vector<int> evicted;
        for (std::size_t b = 0; may_evict && b < before.pool.published.size() && b < now.pool.published.size(); b++)
            if (before.pool.published[b] && !now.pool.published[b] && before.pool.refcounts[b] == 0 &&
                now.pool.refcounts[b] == 0)
                evicted.push_back(int(b));
        for (int b : evicted) before.pool.published[std::size_t(b)] = false;
        before.pool.n_cached -= int(evicted.size()), before.pool.n_free += int(evicted.size());
        for (std::size_t i = 0; i < caches.size(); i++)
            if (auto d = ::difference(with_blocks_of(before.caches[i], now.caches[i], evicted), now.caches[i],
                                      fmt::format("cache {} ({})", i, now.caches[i].name));
                !d.empty())
                return d;
        return ::difference(before.pool, now.pool);
    }
    std::string show() const {
        std::string s = config.describe();
        for (std::size_t i = 0; i < caches.size(); i++)
            s += fmt::format("; {}: {} length {}", i, caches[i]->name(), caches[i]->length());
        return s;
    }
    // Positions cache i can still take in one append.
    int room(std::size_t i) const { return std::min(config.max_seq - caches[i]->length(), caches[i]->max_append()); }
    std::vector<std::size_t> paged() const {
        std::vector<std::size_t> p;
        for (std::size_t i = 0; i < caches.size(); i++)
            if (dynamic_cast<const PagedCache*>(caches[i].get())) p.push_back(i);
        return p;
    }
    void add(std::unique_ptr<Cache> cache) {
        caches.push_back(std::move(cache));
        latest.push_back(caches.back()->length());
    }
};

int draw_divisor(int n, int at_most) {
    std::vector<int> d;
    for (int i = 1; i <= n && i <= at_most; i++)
        if (n % i == 0) d.push_back(i);
    return d[std::size_t(draw(0, int(d.size()) - 1))];
}

World draw_world(const Config& c) {
    World w;
    w.config = c;
    const int bs = draw(1, std::min(4, c.max_seq));
    w.pool = std::make_unique<BlockPool>(c, bs, draw(1, 2 * ((c.max_seq + bs - 1) / bs) + 1), draw(0, 1) == 1);
    w.add(std::make_unique<ContiguousCache>(c, ContiguousCache::Layout::head_major));
    w.add(std::make_unique<ContiguousCache>(c, ContiguousCache::Layout::seq_major));
    w.add(std::make_unique<GrowingCache>(c, draw(1, c.max_seq)));
    w.add(std::make_unique<WindowCache>(c, draw(0, 2), draw(1, 3), draw(0, 2)));
    const int hs = c.head_size();
    w.add(std::make_unique<QuantizedCache>(c, QuantSpec{8, QuantSpec::Axis::per_token, draw_divisor(hs, hs)}));
    w.add(std::make_unique<QuantizedCache>(c, QuantSpec{4, QuantSpec::Axis::per_channel, draw_divisor(hs, c.max_seq)}));
    w.add(std::make_unique<PagedCache>(*w.pool, proofs::kIdentity[0], 0));
    w.add(std::make_unique<PagedCache>(*w.pool, proofs::kIdentity[0], 1));
    int next_id = 2;
    const int n_ops = draw(0, 16);
    for (int op = 0; op < n_ops; op++) {
        const std::size_t i = std::size_t(draw(0, int(w.caches.size()) - 1));
        Cache& cache = *w.caches[i];
        switch (draw(0, 4)) {
            case 0:
            case 1: {  // append 1..3 positions (a pool that runs dry refuses, changing nothing)
                if (w.room(i) < 1) break;
                const int from = cache.length();
                try {
                    append_rows(cache, 0, draw_tokens(c, draw(1, std::min(3, w.room(i)))));
                    w.latest[i] = from;
                } catch (const Error&) {
                    if (cache.length() != from) throw;
                }
                break;
            }
            case 2: {  // roll back (a window refuses past rows it evicted)
                try {
                    cache.truncate(draw(0, cache.length()));
                } catch (const Error&) {
                }
                w.latest[i] = std::min(w.latest[i], cache.length());
                break;
            }
            case 3: {  // fork a paged sequence
                const auto p = w.paged();
                if (p.empty()) break;
                w.add(static_cast<const PagedCache&>(*w.caches[p[std::size_t(draw(0, int(p.size()) - 1))]])
                          .fork(next_id++));
                break;
            }
            case 4: {  // free a paged sequence (its forks keep their blocks)
                const auto p = w.paged();
                if (p.size() < 2) break;
                const std::size_t j = p[std::size_t(draw(0, int(p.size()) - 1))];
                w.caches.erase(w.caches.begin() + std::ptrdiff_t(j));
                w.latest.erase(w.latest.begin() + std::ptrdiff_t(j));
                break;
            }
        }
    }
    return w;
}

#define MISUSE_REFUSED(world, before, call, ...)                                                         \
    do {                                                                                                 \
        RC_LOG() << (world).show() << "\n";                                                              \
        if (const std::string p = refusal_problem([&] { call; }, {__VA_ARGS__}); !p.empty()) RC_FAIL(p); \
        if (const std::string d = (world).difference(before); !d.empty())                                \
            RC_FAIL("changed by the refused call: " + d);                                                \
    } while (0)

}  // namespace

// ----------------------------------------------------------------------------------------------
// 1. Batches

// Fixed: a null cache was dereferenced (a segfault); a refusal about one sequence of a batch
// (empty, out of the vocabulary, too long, another model's shape) did not say which one. The
// same cache twice and the count mismatch were refused before, unchanged.
TEST_CASE(
    "misuse: a batch with the same cache twice, a null cache, mismatched, empty or bad token lists or "
    "another model's cache is refused, every cache unchanged",
    "[misuse][batch]") {
    rc::prop("random caches, a random batch, one misuse", [] {
        const Config c = draw_config(2, 2);
        World w = draw_world(c);
        const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
        CachedDecoder dec(m);
        std::vector<Cache*> batch;
        std::vector<std::vector<int>> tokens;
        for (std::size_t i = 0; i < w.caches.size(); i++)
            if (w.room(i) > 0 && draw(0, 2) == 0) {
                batch.push_back(w.caches[i].get());
                tokens.push_back(draw_tokens(c, draw(1, std::min(2, w.room(i)))));
            }
        RC_PRE(batch.size() >= 2);
        Config other = c;
        other.n_layers++;
        ContiguousCache foreign(other);
        const auto before = w.snap();
        const std::size_t n = batch.size();
        const std::size_t j = std::size_t(draw(0, int(n) - 1));
        const std::string seq = fmt::format("sequence {}", j);
        switch (draw(0, 7)) {
            case 0: {
                batch[j] = batch[(j + 1) % n];
                tokens[j] = tokens[(j + 1) % n];  // tokens that fit it: the repetition is the only misuse
                MISUSE_REFUSED(w, before, dec.step(batch, tokens), "share one cache");
                break;
            }
            case 1:
                batch[j] = nullptr;
                MISUSE_REFUSED(w, before, dec.step(batch, tokens), seq, "null");
                break;
            case 2:
                tokens.pop_back();
                MISUSE_REFUSED(w, before, dec.step(batch, tokens),
                               fmt::format("{} caches and {} token lists", n, n - 1));
                break;
            case 3:
                tokens[j].clear();
                MISUSE_REFUSED(w, before, dec.step(batch, tokens), seq, "no tokens");
                break;
            case 4:
                tokens[j].back() = draw(0, 1) ? c.vocab_size : -1;
                MISUSE_REFUSED(w, before, dec.step(batch, tokens), seq, "outside the vocabulary");
                break;
            case 5:
                tokens[j] = draw_tokens(c, c.max_seq - batch[j]->length() + 1);
                MISUSE_REFUSED(w, before, dec.step(batch, tokens), seq, "does not fit max_seq");
                break;
            case 6:
                batch[j] = &foreign;
                MISUSE_REFUSED(w, before, dec.step(batch, tokens), seq, "does not fit the model");
                break;
            case 7:
                batch.clear(), tokens.clear();
                MISUSE_REFUSED(w, before, dec.step(batch, tokens), "0 caches");
                break;
        }
    });
}

// Fixed: step appended sequence by sequence and rolled back with truncate when one did not fit;
// truncate cannot undo a copy-on-write, so an earlier fork kept a private copy of the block it
// had shared (one more block used, the parent's refcount one less), and a window given more
// rows than it takes at once was found only after the earlier appends. Now a batch is checked
// whole, pools included, before anything is appended.
TEST_CASE("misuse: a batch that does not fit its pool is refused before a fork copies its shared block",
          "[misuse][batch][paged]") {
    const Config c{16, 8, 2, 4, 2, 32, 12};
    const Model m = random_model(c, 3);
    BlockPool pool(c, 4, 3);
    PagedCache parent(pool, 0, 0), b(pool, 0, 2);
    CachedDecoder dec(m, parent);
    dec.prefill(std::vector<int>{1, 2, 3, 4, 5, 6});  // blocks 0 and 1, the second half full
    auto child = parent.fork(1);                      // shares both
    const std::vector<Cache*> batch{child.get(), &b};
    const std::vector<std::vector<int>> tokens{{7}, {1, 2, 3, 4, 5}};  // the child's copy-on-write takes the last free
                                                                       // block; b needs 2
    const std::vector<HeldState> before{held_state(parent), held_state(*child), held_state(b)};
    const PoolSnapshot pool_before = held_state(pool);
    CHECK(refusal_problem([&] { dec.step(batch, tokens); },
                          {"batch: sequence 1: paged cache: sequence 2 needs 2 more blocks"}) == "");
    CHECK(difference(before[0], held_state(parent), "parent") == "");
    CHECK(difference(before[1], held_state(*child), "child") == "");
    CHECK(difference(before[2], held_state(b), "b") == "");
    CHECK(difference(pool_before, held_state(pool)) == "");
}

TEST_CASE("misuse: a batch that does not fit (a pool, max_seq, a window's chunk) changes no cache", "[misuse][batch]") {
    rc::prop("random caches, a random batch of any length", [] {
        const Config c = draw_config(2, 2);
        World w = draw_world(c);
        const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
        CachedDecoder dec(m);
        std::vector<Cache*> batch;
        std::vector<std::vector<int>> tokens;
        for (std::size_t i = 0; i < w.caches.size(); i++)
            if (c.max_seq > w.caches[i]->length() && draw(0, 1) == 0) {
                batch.push_back(w.caches[i].get());
                tokens.push_back(draw_tokens(c, draw(1, c.max_seq - w.caches[i]->length())));
            }
        RC_PRE(!batch.empty());
        const auto before = w.snap();
        RC_LOG() << w.show() << "\n";
        try {
            dec.step(batch, tokens);
        } catch (const Error& e) {
            const std::string msg = e.what();
            RC_TAG(msg.substr(0, msg.find(':')));
            if (msg.find('\n') != std::string::npos) RC_FAIL("not one line: " + msg);
            if (const std::string d = w.difference(before); !d.empty()) RC_FAIL("changed by \"" + msg + "\": " + d);
        }
    });
}

// A CPU backend whose fail_at-th product or attention call (counting from 0) throws, as a device
// error would; -1: none.
class FailsAt final : public ForwardingBackend {
public:
    FailsAt(Backend& inner, int fail_at) : ForwardingBackend(inner), fail_at_(fail_at) {}
    void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) override {
        tick(), inner().matmul(ex, y, ldy, x, ldx, m, l, rows);
    }
    void attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                   const std::int64_t* slots, int max_n, const int* kv_head, int probe_row, float* probe) override {
        tick(), inner().attention(ex, att, q, rows, n_rows, l, slots, max_n, kv_head, probe_row, probe);
    }
    int calls = 0;

private:
    void tick() {
        if (calls++ == fail_at_) throw Error("planted device error");
    }
    int fail_at_;
};

// Fixed: a prefill taken in chunks (a window's chunk, per-channel keys' one position a step) that
// failed in a later chunk kept its earlier chunks, and a window's ring had overwritten rows it
// could not give back. Now the request is one: refused or failed anywhere, every cache and the
// pool are as they were (Cache::snapshot), bit for bit, but for one allowance: a block the
// request took from the prefix cache stays evicted (free, its rows gone), as after a request that
// finished. The rows it held may already be overwritten when the failure comes; a later request
// recomputes them, and no sequence ever reads them (the sequences' rows are compared in full).
TEST_CASE("misuse: a prefill that fails in any chunk leaves every cache and the pool as before", "[misuse][chunks]") {
    rc::prop("random caches, a prefill of any length, a failure at any call", [] {
        const Config c = draw_config(2, 2);
        World w = draw_world(c);
        const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
        const std::size_t i = std::size_t(draw(0, int(w.caches.size()) - 1));
        Cache& cache = *w.caches[i];
        RC_PRE(cache.length() < c.max_seq);
        // Not covered: a paged sequence whose first write copies a shared block (copy-on-write)
        // keeps its private copy when a kernel fails after it (the same rows; the pool holds one
        // block more). Refusals come before the copy and change nothing (the batch tests above).
        if (const auto* p = dynamic_cast<const PagedCache*>(&cache)) {
            const int bs = p->pool().block_size(), b = cache.length() / bs;
            const std::vector<int>& table = p->block_table();
            const bool copies =
                cache.length() % bs != 0 && b < int(table.size()) && p->pool().needs_copy(table[std::size_t(b)]);
            RC_PRE(!copies);  // (RC_PRE's captured || would not short-circuit)
        }
        const std::vector<int> tokens = draw_tokens(c, draw(1, c.max_seq - cache.length()));
        CpuBackend cpu(m);
        FailsAt failing(cpu, draw(0, 12 * c.n_layers * int(tokens.size())));
        CachedDecoder dec(failing, cache);
        // A growing cache keeps the capacity a failed step doubled it to, as a rollback does: its
        // raw storage is left out, its held rows (HeldState::attended) are compared.
        auto snap = [&] {
            World::Snapshot s = w.snap();
            for (std::size_t j = 0; j < w.caches.size(); j++)
                if (dynamic_cast<const GrowingCache*>(w.caches[j].get())) s.caches[j].k.clear(), s.caches[j].v.clear();
            return s;
        };
        const World::Snapshot before = snap();
        RC_LOG() << w.show() << "; prefill of " << tokens.size() << " into cache " << i << "\n";
        bool failed = false;
        try {
            dec.prefill(tokens);
        } catch (const Error& e) {
            failed = true;
            const std::string msg = e.what();
            RC_TAG(msg.substr(0, msg.find(':')));
            if (const std::string d = World::difference(w.caches, before, snap(), true); !d.empty())
                RC_FAIL(fmt::format("changed by \"{}\" after {} calls: {}", msg, failing.calls, d));
        }
        RC_TAG(failed ? "failed" : "ran");
        RC_TAG(tokens.size() > std::size_t(cache.max_step()) ? "chunked" : "one step");
    });
}

// ----------------------------------------------------------------------------------------------
// 2. Writes, reads, rollbacks, appends

// Refused before, unchanged: a write at a position outside the latest append or to a layer out
// of range. Fixed: key() and value() of a layer or KV head out of range read outside the storage.
TEST_CASE(
    "misuse: a write outside the latest append or the layers, or a read outside the heads, is refused, "
    "unchanged",
    "[misuse][write]") {
    rc::prop("every variant, random state", [] {
        const Config c = draw_config(2, 2);
        World w = draw_world(c);
        const std::size_t i = std::size_t(draw(0, int(w.caches.size()) - 1));
        Cache& cache = *w.caches[i];
        const std::vector<float> row(std::size_t(c.kv_dim()), 1.0f);
        const auto before = w.snap();
        const int len = cache.length(), start = w.latest[i];
        const int ok_pos = start < len ? draw(start, len - 1) : 0;
        switch (draw(0, 4)) {
            case 0: {  // before the latest append: a final row
                RC_PRE(start > 0);
                const int pos = draw(0, start - 1);
                MISUSE_REFUSED(w, before, cache.write(draw(0, c.n_layers - 1), pos, row.data(), row.data()),
                               fmt::format("position {} is not one of the latest append's", pos));
                break;
            }
            case 1: {  // at or past the length, or negative
                const int pos = draw(0, 1) ? len + draw(0, 3) : -1 - draw(0, 3);
                MISUSE_REFUSED(w, before, cache.write(draw(0, c.n_layers - 1), pos, row.data(), row.data()),
                               fmt::format("position {} is not one of the latest append's", pos));
                break;
            }
            case 2: {  // a layer out of range
                const int l = draw(0, 1) ? c.n_layers + draw(0, 2) : -1 - draw(0, 2);
                MISUSE_REFUSED(w, before, cache.write(l, ok_pos, row.data(), row.data()),
                               fmt::format("no layer {}", l));
                break;
            }
            case 3: {
                const int l = draw(0, 1) ? c.n_layers + draw(0, 2) : -1 - draw(0, 2);
                MISUSE_REFUSED(w, before, (void)(draw(0, 1) ? cache.key(l, 0, 0) : cache.value(l, 0, 0)),
                               fmt::format("no layer {}", l));
                break;
            }
            case 4: {
                const int h = draw(0, 1) ? c.n_kv_heads + draw(0, 2) : -1 - draw(0, 2);
                MISUSE_REFUSED(w, before, (void)(draw(0, 1) ? cache.key(0, h, 0) : cache.value(0, h, 0)),
                               fmt::format("no KV head {}", h));
                break;
            }
        }
    });
}

// Refused before, unchanged (the counter-tests show the check can fail).
TEST_CASE(
    "misuse: a rollback past the length or below 0, and an empty, too long or too wide append, are "
    "refused, unchanged",
    "[misuse][truncate][append]") {
    rc::prop("every variant, random state", [] {
        const Config c = draw_config(2, 2);
        World w = draw_world(c);
        const std::size_t i = std::size_t(draw(0, int(w.caches.size()) - 1));
        Cache& cache = *w.caches[i];
        const auto before = w.snap();
        switch (draw(0, 4)) {
            case 0: {
                const int n = draw(0, 1) ? cache.length() + 1 + draw(0, 3) : -1 - draw(0, 3);
                MISUSE_REFUSED(w, before, cache.truncate(n), fmt::format("cannot roll back to {}", n));
                break;
            }
            case 1: MISUSE_REFUSED(w, before, cache.append(std::vector<int>{}), "nothing to append"); break;
            case 2: {  // past max_seq (a window refuses the chunk first when the append is also too wide)
                const int n = c.max_seq - cache.length() + 1 + draw(0, 2);
                RC_PRE(n <= cache.max_append());
                MISUSE_REFUSED(w, before, cache.append(draw_tokens(c, n)), "do not fit max_seq");
                break;
            }
            case 3: {  // wider than the variant takes at once
                RC_PRE(cache.max_append() < c.max_seq - cache.length());
                MISUSE_REFUSED(w, before, cache.append(draw_tokens(c, cache.max_append() + 1)), "at a time");
                break;
            }
            case 4: {  // more blocks than the pool has
                auto* p = dynamic_cast<PagedCache*>(&cache);
                RC_PRE(bool(p));
                const int bs = w.pool->block_size();
                const int fits = (int(p->block_table().size()) + w.pool->available()) * bs - cache.length();
                RC_PRE(cache.length() + fits + 1 <= c.max_seq);
                MISUSE_REFUSED(w, before,
                               cache.append(draw_tokens(c, fits + 1 + draw(0, c.max_seq - cache.length() - fits - 1))),
                               fmt::format("sequence {} needs", cache.seq_id));
                break;
            }
        }
    });
}

// Fixed for every variant but the paged one (which refused before): the others returned 0 for a
// cache already holding rows, as if no prefix were cached.
TEST_CASE("misuse: attach_prefix to a cache that holds rows is refused by every variant, unchanged",
          "[misuse][prefix]") {
    rc::prop("every variant, random state", [] {
        const Config c = draw_config(2, 2);
        World w = draw_world(c);
        const std::size_t i = std::size_t(draw(0, int(w.caches.size()) - 1));
        RC_PRE(w.caches[i]->length() > 0);
        const std::vector<int> prompt = draw_tokens(c, draw(1, c.max_seq));
        const auto before = w.snap();
        MISUSE_REFUSED(w, before, w.caches[i]->attach_prefix(prompt), "only to an empty sequence");
    });
}

// Fixed: a sequence could rewrite a row of its latest append after forking (or after the block
// was published to the prefix cache): the write went into the shared block, changing the fork's
// rows (or the cached prefix's), and only shared_writes() counted it.
TEST_CASE("misuse: rewriting a row in a block shared by a fork or the prefix cache is refused, unchanged",
          "[misuse][write][paged]") {
    rc::prop("random block size, tokens, fork or publish", [] {
        const Config c = draw_config(2, 2);
        const int bs = draw(1, c.max_seq);
        const bool publish = draw(0, 1) == 1;
        BlockPool pool(c, bs, (c.max_seq + bs - 1) / bs * 2, publish);
        PagedCache parent(pool, proofs::kIdentity[0], 0);
        const int n = publish ? draw(1, c.max_seq / bs) * bs : draw(1, c.max_seq);  // published: whole blocks
        append_rows(parent, 0, draw_tokens(c, n));
        std::unique_ptr<PagedCache> child = publish ? nullptr : parent.fork(1);
        const int pos = draw(0, n - 1);
        const std::vector<float> row(std::size_t(c.kv_dim()), 2.0f);
        const HeldState p0 = held_state(parent);
        const std::optional<HeldState> c0 = child ? std::optional(held_state(*child)) : std::nullopt;
        const PoolSnapshot pool0 = held_state(pool);
        RC_LOG() << c.describe() << " block_size " << bs << " length " << n << " pos " << pos << "\n";
        const int block = parent.block_table()[std::size_t(pos / bs)];
        if (const auto p = refusal_problem([&] { parent.write(draw(0, c.n_layers - 1), pos, row.data(), row.data()); },
                                           {fmt::format("position {}", pos), fmt::format("block {}", block)});
            !p.empty())
            RC_FAIL(p);
        if (auto d = difference(p0, held_state(parent), "parent"); !d.empty()) RC_FAIL(d);
        if (child)
            if (auto d = difference(*c0, held_state(*child), "fork"); !d.empty()) RC_FAIL(d);
        if (auto d = difference(pool0, held_state(pool)); !d.empty()) RC_FAIL(d);
    });
}

// Fixed: the refusal came after the write had put the raw rows into the cache's mirror, so the
// unwritten position read them instead of NaN.
TEST_CASE("misuse: per-channel keys written out of order are refused, the rows unchanged", "[misuse][write][quant]") {
    rc::prop("random shape, group, length", [] {
        const Config c = draw_config(2, 2);
        QuantizedCache cache(
            c, QuantSpec{draw(0, 1) ? 8 : 4, QuantSpec::Axis::per_channel, draw_divisor(c.head_size(), c.max_seq)});
        const int kept = draw(0, c.max_seq - 2);
        if (kept > 0) append_rows(cache, 0, draw_tokens(c, kept));
        const int n = draw(2, c.max_seq - kept);
        cache.append(draw_tokens(c, n));
        const int l = draw(0, c.n_layers - 1), pos = draw(kept + 1, kept + n - 1);
        const std::vector<float> row(std::size_t(c.kv_dim()), 3.0f);
        const HeldState before = held_state(cache);
        RC_LOG() << c.describe() << " " << cache.name() << " layer " << l << " pos " << pos << "\n";
        if (const auto p = refusal_problem([&] { cache.write(l, pos, row.data(), row.data()); },
                                           {fmt::format("layer {} got {} before {}", l, pos, kept)});
            !p.empty())
            RC_FAIL(p);
        if (auto d = difference(before, held_state(cache), "quantized"); !d.empty()) RC_FAIL(d);
    });
}

// ----------------------------------------------------------------------------------------------
// 3. Freed while stepped

// Correct before: a fork owns references to its blocks, not to its parent.
TEST_CASE("misuse: a fork whose parent is freed reads and decodes exactly as before", "[misuse][freed][paged]") {
    rc::prop("random model, block size, prompt, continuation", [] {
        const Config c = draw_config(2, 2);
        const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
        const int bs = draw(1, c.max_seq);
        BlockPool pool(c, bs, 2 * ((c.max_seq + bs - 1) / bs), draw(0, 1) == 1);
        auto parent = std::make_unique<PagedCache>(pool, m.w.fingerprint(), 0);
        std::vector<int> tokens = draw_tokens(c, draw(1, c.max_seq - 1));
        CachedDecoder(m, *parent).prefill(tokens);
        auto child = parent->fork(1);
        const HeldState before = held_state(*child);
        parent.reset();
        if (auto d = difference(before, held_state(*child), "fork"); !d.empty()) RC_FAIL("parent freed: " + d);
        CachedDecoder dec(m, *child);
        NaiveDecoder naive(m);
        for (int t : draw_tokens(c, draw(1, c.max_seq - int(tokens.size())))) {
            tokens.push_back(t);
            if (auto d = first_difference(dec.decode(t), naive.forward(tokens)); d)
                RC_FAIL(fmt::format("position {}: {}", tokens.size() - 1, *d));
        }
    });
}

// Fixed: a sequence outliving its pool released its blocks into freed memory when destroyed, and
// every use read freed memory. The pool now orphans its live sequences when it goes.
TEST_CASE("misuse: a sequence whose pool is destroyed refuses every use and is destroyed safely",
          "[misuse][freed][paged]") {
    const Config c{16, 8, 2, 4, 2, 32, 12};
    auto pool = std::make_unique<BlockPool>(c, 2, 6, true);
    auto a = std::make_unique<PagedCache>(*pool, 0, 0);
    append_rows(*a, 0, std::vector<int>{1, 2, 3});
    auto child = a->fork(1);
    pool.reset();
    CHECK(a->length() == 3);
    CHECK(std::vector<int>(a->tokens().begin(), a->tokens().end()) == std::vector<int>{1, 2, 3});
    const std::string gone = "sequence 0's block pool was destroyed";
    const std::vector<float> row(std::size_t(c.kv_dim()), 1.0f);
    CHECK(refusal_problem([&] { a->append(std::vector<int>{4}); }, {gone}) == "");
    CHECK(refusal_problem([&] { a->truncate(1); }, {gone}) == "");
    CHECK(refusal_problem([&] { a->write(0, 2, row.data(), row.data()); }, {gone}) == "");
    CHECK(refusal_problem([&] { (void)a->key(0, 0, 0); }, {gone}) == "");
    CHECK(refusal_problem([&] { (void)a->fork(2); }, {gone}) == "");
    CHECK(refusal_problem([&] { (void)a->memory(); }, {gone}) == "");
    const Model m = random_model(c, 4);
    CHECK(refusal_problem([&] { CachedDecoder(m, *child).decode(5); }, {"sequence 1's block pool was destroyed"}) ==
          "");
    CHECK(a->length() == 3);
    a.reset();  // under ASan: no use of the freed pool
    child.reset();
}

// Correct before: a decoder holds no position of its own (pos() is its cache's length), so a
// cache rolled back or cleared by another owner between steps is continued from where it is.
TEST_CASE("misuse: a cache rolled back or cleared by another owner between steps decodes exactly", "[misuse][freed]") {
    rc::prop("random model, variant, tokens, rollback", [] {
        const Config c = draw_config(2, 2);
        const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
        BlockPool pool(c, draw(1, c.max_seq), c.max_seq);
        std::unique_ptr<Cache> cache;
        if (draw(0, 1))
            cache = std::make_unique<PagedCache>(pool, m.w.fingerprint(), 0);
        else
            cache = std::make_unique<GrowingCache>(c, 1);
        CachedDecoder dec(m, *cache);
        std::vector<int> tokens = draw_tokens(c, draw(1, c.max_seq - 1));
        dec.prefill(tokens);
        const int keep = draw(0, int(tokens.size()));
        cache->truncate(keep);  // another owner: not through dec
        tokens.resize(std::size_t(keep));
        NaiveDecoder naive(m);
        for (int t : draw_tokens(c, draw(1, c.max_seq - keep))) {
            tokens.push_back(t);
            if (auto d = first_difference(dec.decode(t), naive.forward(tokens)); d)
                RC_FAIL(fmt::format("kept {}, position {}: {}", keep, tokens.size() - 1, *d));
        }
    });
}

// Correct before: step() keeps nothing of a batch's caches between calls.
TEST_CASE("misuse: a batch member freed between steps leaves the next step exact, its blocks reused",
          "[misuse][freed][batch]") {
    rc::prop("random model, block size, tokens", [] {
        const Config c = draw_config(3, 2);
        const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
        const int bs = draw(1, c.max_seq);
        BlockPool pool(c, bs, 2 * ((c.max_seq + bs - 1) / bs));
        PagedCache a(pool, m.w.fingerprint(), 0);
        auto b = std::make_unique<PagedCache>(pool, m.w.fingerprint(), 1);
        CachedDecoder dec(m);
        std::vector<std::vector<int>> seqs{draw_tokens(c, draw(1, c.max_seq / 2)),
                                           draw_tokens(c, draw(1, c.max_seq / 2))};
        std::vector<Cache*> batch{&a, b.get()};
        dec.step(batch, seqs);
        b.reset();  // its blocks go back, and c maps them
        PagedCache cc(pool, m.w.fingerprint(), 2);
        std::vector<std::vector<int>> next{draw_tokens(c, 1), draw_tokens(c, draw(1, c.max_seq / 2))};
        batch = {&a, &cc};
        const std::vector<float> logits = dec.step(batch, next);
        NaiveDecoder naive(m);
        std::vector<int> a_tokens = seqs[0];
        a_tokens.push_back(next[0][0]);
        const std::size_t V = std::size_t(c.vocab_size);
        if (auto d = first_difference(std::span(logits).first(V), naive.forward(a_tokens)); d) RC_FAIL("a: " + *d);
        if (auto d = first_difference(std::span(logits).subspan(V, V), naive.forward(next[1])); d) RC_FAIL("c: " + *d);
    });
}

// Correct before: generate() clears both caches, whatever another owner left in them.
TEST_CASE("misuse: speculative decoding after another owner filled or rolled back its caches equals greedy decode",
          "[misuse][freed][speculative]") {
    rc::prop("random models, k, prompt, interference", [] {
        const Config c = draw_config(3, 2);
        const Model target_model = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
        const Model draft_model = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
        CachedDecoder target(target_model), draft(draft_model), reference(target_model);
        SpeculativeDecoder spec(target, draft, draw(1, 3));
        const std::vector<int> prompt = draw_tokens(c, draw(1, c.max_seq / 2));
        const int steps = draw(1, c.max_seq - int(prompt.size()) + 1);
        spec.generate(prompt, steps);
        // Another owner: rolls the target back, fills the draft.
        target.cache().truncate(draw(0, target.pos()));
        if (draft.pos() < c.max_seq) draft.prefill(draw_tokens(c, draw(1, c.max_seq - draft.pos())));
        const DecodeRun run = spec.generate(prompt, steps), expected = greedy_decode(reference, prompt, steps);
        RC_ASSERT(run.tokens == expected.tokens);
        if (auto d = first_difference(run.logits, expected.logits); d) RC_FAIL(*d);
    });
}

// ----------------------------------------------------------------------------------------------
// 4. Counter-tests: the checks above can fail.

namespace {

// A planted misuse handler: appends a position (or rewrites a row, or names another culprit)
// before it throws.
class Mutating : public ContiguousCache {
public:
    using ContiguousCache::ContiguousCache;
    enum class Bug { appends, writes, two_lines, wrong_name };
    void misuse(Bug bug) {
        const std::vector<float> row(std::size_t(config_.kv_dim()), 5.0f);
        switch (bug) {
            case Bug::appends: append(std::vector<int>{0}); break;
            case Bug::writes: write(0, length() - 1, row.data(), row.data()); break;
            case Bug::two_lines: throw Error("kv cache: cannot roll back to 99\n(length is 3)");
            case Bug::wrong_name: throw Error("kv cache: something went wrong");
        }
        throw Error("kv cache: cannot roll back to 99 (length is 3)");
    }
};

}  // namespace

TEST_CASE("misuse counter-test: a refusal that changed state first, or names nothing, is caught", "[misuse][counter]") {
    const Config c{16, 8, 2, 4, 2, 32, 12};
    for (const auto bug :
         {Mutating::Bug::appends, Mutating::Bug::writes, Mutating::Bug::two_lines, Mutating::Bug::wrong_name}) {
        Mutating cache(c);
        append_rows(cache, 0, std::vector<int>{1, 2, 3});
        const HeldState before = held_state(cache);
        const std::string problem = refusal_problem([&] { cache.misuse(bug); }, {"cannot roll back to 99"});
        const std::string changed = difference(before, held_state(cache), "planted");
        INFO("refusal: " << problem << "; change: " << changed);
        switch (bug) {
            case Mutating::Bug::appends: CHECK(changed == "planted: length 3 -> 4"); break;
            case Mutating::Bug::writes:
                CHECK_THAT(changed, Catch::StartsWith("planted: attended row bits differ"));
                break;
            case Mutating::Bug::two_lines: CHECK_THAT(problem, Catch::StartsWith("the refusal is not one line")); break;
            case Mutating::Bug::wrong_name: CHECK_THAT(problem, Catch::Contains("does not name")); break;
        }
    }
    // A pool change alone is caught too: a fork taken and dropped leaves nothing, a kept one does.
    BlockPool pool(c, 2, 4);
    PagedCache a(pool, 0, 0);
    append_rows(a, 0, std::vector<int>{1, 2, 3});
    const PoolSnapshot p0 = held_state(pool);
    auto fork = a.fork(1);
    CHECK_THAT(difference(p0, held_state(pool)), Catch::StartsWith("pool: block 0 refcount 1 -> 2"));
    fork.reset();
    CHECK(difference(p0, held_state(pool)) == "");
}

TEST_CASE("misuse counter-test: decoding a rolled-back cache is not decoding the whole sequence", "[misuse][counter]") {
    // The exactness checks of section 3 compare against the tokens the cache holds; against the
    // tokens before the rollback they fail.
    const Config c{16, 8, 2, 4, 2, 32, 12};
    const Model m = random_model(c, 11);
    CachedDecoder dec(m);
    std::vector<int> tokens{1, 2, 3, 4};
    dec.prefill(tokens);
    dec.cache().truncate(2);
    tokens.push_back(5);
    CHECK(first_difference(dec.decode(5), NaiveDecoder(m).forward(tokens)));
}
