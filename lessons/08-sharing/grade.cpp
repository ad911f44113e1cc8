// Lab 8's grader: your sharing steps under a paged cache and kvlab's real decoders. The hash
// chain (what a block's key covers), a state machine (generated requests, appends, forks and
// frees against a model of who maps what), P1 through your bookkeeping (prefix hits, forks and
// copies on write, two models in one pool), and the prefix hit of a second identical request.
// GCC 12 misreads fmt's format-spec parser as an overflow when it inlines it here (a known false
// positive; tests/CMakeLists.txt silences it for test_pool_state.cpp too).
#pragma GCC diagnostic ignored "-Wstringop-overflow"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "decode.h"
#include "grader.h"
#include "lab.h"
#include "synthetic_rows.h"

using namespace kvlab;
using lab08::Pool;
using lab08::Sequence;

// ----------------------------------------------------------------------------------------------
// The given pool (lab.h)

namespace kvlab::lab08 {

Pool::Pool(const Config& config, int block_size, int n_blocks) : config_(config), block_size_(block_size) {
    config_.validate();
    if (block_size < 1 || block_size > config_.max_seq || n_blocks < 1)
        throw Error(
            fmt::format("lab 8 pool: {} blocks of {} positions (max_seq {})", n_blocks, block_size, config_.max_seq));
    const std::int64_t per_layer = std::int64_t(config_.n_kv_heads) * block_size;  // rows of one block's layer
    storage_ = KVStorage(host_memory(), std::int64_t(n_blocks) * config_.n_layers * per_layer, config_.head_size(),
                         per_layer, block_size);
    assert(storage_.k.size() == std::int64_t(n_blocks) * config_.n_layers * per_layer * config_.head_size());
    refcount.assign(std::size_t(n_blocks), 0);
    published_.assign(std::size_t(n_blocks), 0);
    hash_of_.assign(std::size_t(n_blocks), 0);
    for (int b = n_blocks - 1; b >= 0; b--) free_list.push_back(b);  // block 0 is handed out first
}

int Pool::allocate() {
    int block = -1;
    if (!free_list.empty()) {
        block = free_list.back();
        free_list.pop_back();
    } else {  // evict a cached block: published, mapped by nobody (the lowest; kvlab's pool takes the LRU)
        for (int b = 0; b < n_blocks() && block < 0; b++)
            if (refcount[std::size_t(b)] == 0 && published(b)) block = b;
        if (block < 0) throw Error("lab 8 pool: no block to allocate (none free, none cached)");
    }
    if (block < 0 || block >= n_blocks())
        throw Error(
            fmt::format("lab 8 pool: the free list holds block {}; the pool has blocks 0..{}", block, n_blocks() - 1));
    if (refcount[std::size_t(block)] != 0)
        throw Error(
            fmt::format("lab 8 pool: block {} came off the free list with refcount {}: a block still mapped "
                        "was put on the free list, and is handed out again",
                        block, refcount[std::size_t(block)]));
    if (published(block)) {  // evicted: no later request may find it under its old hash
        by_hash_.erase(hash_of_[std::size_t(block)]);
        published_[std::size_t(block)] = 0;
    }
    refcount[std::size_t(block)] = 1;
    storage_.poison(config_, slot(block, 0), block_size_);
    return block;
}

int Pool::available() const {
    int n = int(free_list.size());
    for (int b = 0; b < n_blocks(); b++) n += refcount[std::size_t(b)] == 0 && published(b);
    return n;
}

int Pool::lookup(std::uint64_t hash) const {
    const auto it = by_hash_.find(hash);
    return it == by_hash_.end() ? -1 : it->second;
}

void Pool::publish(int block, std::uint64_t hash) {
    if (published(block) || by_hash_.count(hash)) return;  // another sequence computed the same block first
    by_hash_.emplace(hash, block);
    hash_of_[std::size_t(block)] = hash;
    published_[std::size_t(block)] = 1;
}

void Pool::copy_rows(int to, int from, int n) {
    if (to < 0 || to >= n_blocks() || from < 0 || from >= n_blocks() || to == from || n < 0 || n > block_size_)
        throw Error(fmt::format("lab 8 pool: copy_rows(to {}, from {}, n {}) with {} blocks of {} positions", to, from,
                                n, n_blocks(), block_size_));
    const int hs = config_.head_size();
    for (int l = 0; l < config_.n_layers; l++)
        for (int h = 0; h < config_.n_kv_heads; h++)
            for (const Buffer<float>* x : {&storage_.k, &storage_.v})
                std::memcpy(x->data() + storage_.row(l, h, slot(to, 0)) * hs,
                            x->data() + storage_.row(l, h, slot(from, 0)) * hs, sizeof(float) * std::size_t(n * hs));
}

}  // namespace kvlab::lab08

namespace {

// ----------------------------------------------------------------------------------------------
// The grader's paged cache: one sequence over the lab's pool, calling your functions.

class SharedCache final : public Cache {
public:
    SharedCache(Pool& pool, std::uint64_t model, int id) : Cache(pool.config()), pool_(pool) {
        seq_id = id;
        seq_.model = model;
    }
    // A fork's child.
    SharedCache(Pool& pool, Sequence seq, int id) : Cache(pool.config()), pool_(pool), seq_(std::move(seq)) {
        seq_id = id;
        adopt(seq_.tokens);
    }
    ~SharedCache() override {
        if (freed_) return;
        try {  // a destructor must not throw; the checks call free() themselves
            lab08::free_sequence(pool_, seq_);
        } catch (...) {
        }
    }

    const Sequence& sequence() const { return seq_; }

    void free() {
        sync();
        freed_ = true;
        lab08::free_sequence(pool_, seq_);
    }

    std::unique_ptr<SharedCache> fork(int id) {
        sync();
        Sequence child = lab08::fork(pool_, seq_);
        const auto differs = [&](const char* what) {
            fail(
                fmt::format("fork: the child's {} differ from its parent's (parent table [{}], child table [{}]): a "
                            "fork maps the same blocks, with the same tokens and hashes, for the same model",
                            what, fmt::join(seq_.table, " "), fmt::join(child.table, " ")));
        };
        if (child.table != seq_.table) differs("blocks");
        if (child.hashes != seq_.hashes) differs("hashes");
        if (child.tokens != seq_.tokens) differs("tokens");
        if (child.model != seq_.model) differs("model identity");
        return std::make_unique<SharedCache>(pool_, std::move(child), id);
    }

    std::int64_t slot(int t) const override {
        const int bs = pool_.block_size();
        const std::size_t b = std::size_t(t / bs);
        if (t < 0 || b >= seq_.table.size()) return -1;
        return pool_.slot(seq_.table[b], t % bs);
    }
    const KVStorage& storage() const override { return pool_.storage(); }

    int attach_prefix(std::span<const int> tokens) override {
        if (length() != 0) throw Error("lab 8: a prefix attaches only to an empty sequence");
        const int bs = pool_.block_size();
        const int hit = lab08::map_prefix(pool_, seq_, tokens);
        if (hit < 0 || hit >= int(tokens.size()))
            fail(
                fmt::format("map_prefix mapped {} positions of a {}-token prompt: at most {} (the last token always "
                            "runs, for its logits)",
                            hit, tokens.size(), int(tokens.size()) - 1));
        if (hit % bs != 0)
            fail(fmt::format("map_prefix mapped {} positions with block_size {}: whole blocks only", hit, bs));
        if (int(seq_.table.size()) != hit / bs || int(seq_.hashes.size()) != hit / bs)
            fail(
                fmt::format("map_prefix mapped {} positions, but seq.table has {} blocks and seq.hashes {} hashes: "
                            "one of each per mapped block (the next full block chains on the last hash)",
                            hit, seq_.table.size(), seq_.hashes.size()));
        check_table("map_prefix");
        adopt(tokens.first(std::size_t(hit)));
        sync();
        return hit;
    }

    MemoryStats memory() const override {
        MemoryStats m;
        m.used_bytes = kv_bytes(config_, length());
        m.payload_bytes = m.reserved_bytes = m.allocated_bytes =
            std::int64_t(seq_.table.size()) * kv_bytes(config_, pool_.block_size());
        return m;
    }
    std::string name() const override { return fmt::format("lab08(block_size={})", pool_.block_size()); }

protected:
    void reserve(int new_length) override {
        sync();  // the tokens before this append: before_append sees the length it writes at
        const int bs = pool_.block_size(), len = length(), have = int(seq_.table.size());
        const int n_new = std::max(0, (new_length + bs - 1) / bs - have);
        const bool copy = len % bs != 0 && pool_.refcount[std::size_t(seq_.table.back())] > 1;
        // Nothing changes when it does not fit (Cache::reserve's contract).
        if (n_new + int(copy) > pool_.available())
            throw Error(fmt::format("lab 8 pool: seq {} needs {} more blocks, {} are available", seq_id,
                                    n_new + int(copy), pool_.available()));
        lab08::before_append(pool_, seq_);
        if (int(seq_.table.size()) != have)
            fail(
                fmt::format("before_append changed seq {}'s table from {} blocks to {}: a copy replaces the shared "
                            "block, it adds none",
                            seq_id, have, seq_.table.size()));
        check_table("before_append");
        for (int i = 0; i < n_new; i++) seq_.table.push_back(pool_.allocate());
    }

    void on_write(int pos) override {
        sync();
        const int block = seq_.table[std::size_t(pos / pool_.block_size())];
        const int owners = pool_.refcount[std::size_t(block)];
        if (owners > 1)
            fail(
                fmt::format("seq {} writes position {} into block {}, a shared block {} block tables map: "
                            "before_append must give it a private copy first, or the others read this row",
                            seq_id, pos, block, owners));
        if (pool_.published(block))
            fail(fmt::format("seq {} writes position {} into block {}, a published block: prefix hits read it", seq_id,
                             pos, block));
    }

    // The last layer's row that fills a block completes it: hash it, and publish it.
    void on_stored(int l, int pos) override {
        const int bs = pool_.block_size();
        if (l != config_.n_layers - 1 || pos % bs != bs - 1 || pos / bs != int(seq_.hashes.size())) return;
        sync();
        const std::size_t b = std::size_t(pos / bs);
        const std::uint64_t h = lab08::block_hash(
            b ? seq_.hashes.back() : 0, std::span<const int>(seq_.tokens).subspan(b * std::size_t(bs), std::size_t(bs)),
            seq_.model);
        seq_.hashes.push_back(h);
        pool_.publish(seq_.table[b], h);
    }

    // The lab's sequences never roll back; a decoder truncates only when a step fails (and this
    // case has failed then). The blocks stay mapped until the sequence is freed.
    void release(int) override {}

private:
    void sync() { seq_.tokens.assign(tokens().begin(), tokens().end()); }
    // Your functions hand back block numbers the cache will read through: check them first.
    void check_table(const char* after) const {
        for (int b : seq_.table)
            if (b < 0 || b >= pool_.n_blocks())
                fail(fmt::format("after {}: seq {}'s table [{}] names block {}; the pool has blocks 0..{}", after,
                                 seq_id, fmt::join(seq_.table, " "), b, pool_.n_blocks() - 1));
    }

    Pool& pool_;
    Sequence seq_;
    bool freed_ = false;
};

// ----------------------------------------------------------------------------------------------
// 1. The hash chain

void check_hash() {
    const std::uint64_t parent = *rc::gen::arbitrary<std::uint64_t>(), model = *rc::gen::arbitrary<std::uint64_t>();
    std::vector<int> tokens(std::size_t(draw(1, 8)));
    for (int& t : tokens) t = draw(0, 31);
    const std::uint64_t h = lab08::block_hash(parent, tokens, model);
    const std::string key =
        fmt::format("parent 0x{:016x}, tokens [{}], model 0x{:016x}", parent, fmt::join(tokens, " "), model);
    if (lab08::block_hash(parent, tokens, model) != h)
        fail(fmt::format("block_hash({}) gave two different hashes: equal keys must hash equal", key));
    const std::uint64_t bit = std::uint64_t(1) << draw(0, 63);
    if (lab08::block_hash(parent, tokens, model ^ bit) == h)
        fail(
            fmt::format("block_hash ignores the model identity: {} and model 0x{:016x} both hash to 0x{:016x}, so "
                        "a request of one model would read rows the other computed",
                        key, model ^ bit, h));
    if (lab08::block_hash(parent ^ bit, tokens, model) == h)
        fail(
            fmt::format("block_hash ignores the parent: {} and parent 0x{:016x} both hash to 0x{:016x}, so the same "
                        "tokens after two different prefixes would share rows (K and V depend on every earlier token)",
                        key, parent ^ bit, h));
    std::vector<int> other = tokens;
    const std::size_t i = std::size_t(draw(0, int(tokens.size()) - 1));
    other[i] = (other[i] + draw(1, 31)) % 32;
    if (lab08::block_hash(parent, other, model) == h)
        fail(fmt::format("block_hash ignores token {}: {} and tokens [{}] both hash to 0x{:016x}", i, key,
                         fmt::join(other, " "), h));
    std::vector<int> reversed(tokens.rbegin(), tokens.rend());
    if (reversed != tokens && lab08::block_hash(parent, reversed, model) == h)
        fail(fmt::format("block_hash ignores the order of the tokens: {} and tokens [{}] both hash to 0x{:016x}", key,
                         fmt::join(reversed, " "), h));
}

// ----------------------------------------------------------------------------------------------
// 2. The state machine

constexpr int kMaxSeq = 12, kMaxLive = 5;
constexpr int kVocab = 3;  // a small alphabet, so that unrelated prompts share prefixes too
using proofs::append_rows;
using proofs::kIdentity;
using proofs::kIdentityName;
using proofs::synthetic_row;



// One operation's draws. Every operation draws all of them, whatever its kind, so that when
// shrinking turns one operation into nothing (kind 0) the ones after it keep their draws: the
// smallest failing case is then the few operations that matter.
struct Draws {
    int kind = 0;             // 0 nothing, 1-3 new request, 4-6 append, 7-8 fork, 9-10 free
    int which = 0;            // the live sequence it names (modulo how many there are)
    int ident = 0;            // a new random request's model
    int from_live = 0;        // a new request: 1-2 start from a live sequence's tokens, 0 random
    int other_model = 0;      // ... under the other model when 0 (one time in four)
    int shared = 0;           // ... its first `shared` tokens
    int length = 1;           // the prompt's length
    int count = 1;            // an append's positions
    std::vector<int> tokens;  // [kMaxSeq] the new tokens
};

Draws draw_operation() {
    Draws d;
    d.kind = draw(0, 10);
    d.which = draw(0, kMaxLive - 1);
    d.ident = draw(0, 1);
    d.from_live = draw(0, 2);
    d.other_model = draw(0, 3);
    d.shared = draw(0, kMaxSeq);
    d.length = draw(1, kMaxSeq);
    d.count = draw(1, 3);
    d.tokens.resize(std::size_t(kMaxSeq));
    for (int& t : d.tokens) t = draw(0, kVocab - 1);
    return d;
}

struct Live {
    std::unique_ptr<SharedCache> cache;
    int ident = 0;
};

class Machine {
public:
    Machine(const Config& c, int block_size, int n_blocks) : pool(c, block_size, n_blocks) {
        setup = fmt::format("block_size {}, {} blocks, n_kv_heads {}", block_size, n_blocks, c.n_kv_heads);
    }
    Pool pool;
    std::map<int, Live> live;  // by seq id; destroyed before the pool
    int next_id = 0;
    std::string setup;
    std::vector<std::string> ops;  // what happened so far, for the messages

    [[noreturn]] void failing(const std::string& what) const {
        std::string history = setup;
        for (const std::string& op : ops) history += "; " + op;
        fail(history + ": " + what);
    }

    void check() const {
        const int bs = pool.block_size(), n = pool.n_blocks();
        std::vector<std::vector<int>> mapped_by(static_cast<std::size_t>(n));  // [n_blocks] the seqs mapping each block
        for (const auto& [id, s] : live) {
            const Sequence& q = s.cache->sequence();
            const int len = s.cache->length();
            if (int(q.table.size()) != (len + bs - 1) / bs)
                failing(fmt::format("seq {} holds {} positions in {} blocks of {}", id, len, q.table.size(), bs));
            for (int b : q.table) {
                if (std::count(q.table.begin(), q.table.end(), b) > 1)
                    failing(fmt::format("seq {} maps block {} twice: [{}]", id, b, fmt::join(q.table, " ")));
                mapped_by[std::size_t(b)].push_back(id);
            }
        }
        std::vector<int> on_free_list(std::size_t(n), 0);
        for (int b : pool.free_list) {
            if (b < 0 || b >= n) failing(fmt::format("the free list holds block {}; the pool has 0..{}", b, n - 1));
            if (on_free_list[std::size_t(b)]++) failing(fmt::format("block {} is on the free list twice", b));
        }
        for (int b = 0; b < n; b++) {
            const auto& by = mapped_by[std::size_t(b)];
            const int rc = pool.refcount[std::size_t(b)];
            if (rc != int(by.size()))
                failing(fmt::format("block {} has refcount {}, but {} block tables map it{}", b, rc, by.size(),
                                    by.empty() ? "" : fmt::format(" (seq {})", fmt::join(by, ", seq "))));
            if (on_free_list[std::size_t(b)] && !by.empty())
                failing(
                    fmt::format("block {} is on the free list while seq {} maps it: the next allocate() would "
                                "hand it out again",
                                b, fmt::join(by, ", seq ")));
            if (on_free_list[std::size_t(b)] && pool.published(b))
                failing(
                    fmt::format("block {} is on the free list and published: a cached block stays off the free "
                                "list, so prefix hits can still find it",
                                b));
            if (!on_free_list[std::size_t(b)] && by.empty() && !pool.published(b))
                failing(
                    fmt::format("block {} leaked: nobody maps it, it is not cached (published), and it is not on "
                                "the free list",
                                b));
        }
        // Every sequence reads the rows its own model computed for its own tokens.
        const Config& c = pool.config();
        const int hs = c.head_size();
        for (const auto& [id, s] : live) {
            const Cache& cache = *s.cache;
            for (int t = 0; t < cache.length(); t++)
                for (int l = 0; l < c.n_layers; l++)
                    for (int kv = 0; kv < 2; kv++) {
                        const std::vector<float> want =
                            synthetic_row(c, s.ident, cache.tokens().first(std::size_t(t) + 1), l, kv);
                        for (int h = 0; h < c.n_kv_heads; h++) {
                            const float* got = kv ? cache.value(l, h, t) : cache.key(l, h, t);
                            if (std::memcmp(got, want.data() + h * hs, sizeof(float) * std::size_t(hs)) != 0)
                                failing(fmt::format(
                                    "seq {} (model {}) reads at position {} (layer {}, KV head {}, block {}) a {} row "
                                    "its model did not compute for its tokens [{}] (a prefix hit on the wrong block, "
                                    "or another sequence's write)",
                                    id, kIdentityName[s.ident], t, l, h,
                                    s.cache->sequence().table[std::size_t(t / pool.block_size())], kv ? "V" : "K",
                                    fmt::join(cache.tokens(), " ")));
                        }
                    }
        }
    }

    // Blocks an append of k positions to a sequence of length len needs: new ones, and a copy.
    int blocks_needed(const SharedCache& s, int k) const {
        const int bs = pool.block_size(), len = s.length(), have = int(s.sequence().table.size());
        const bool copy = len % bs != 0 && pool.refcount[std::size_t(s.sequence().table.back())] > 1;
        return std::max(0, (len + k + bs - 1) / bs - have) + int(copy);
    }

    // The live sequence an operation names: the (which % live.size())-th by id.
    int pick(int which) const {
        auto it = live.begin();
        std::advance(it, which % int(live.size()));
        return it->first;
    }

    void new_request(const Draws& d) {
        int ident = d.ident;
        std::vector<int> prompt;
        std::string origin = "random";
        if (!live.empty() && d.from_live > 0) {  // from a live sequence's tokens: a prefix hit, or a near miss
            const int src = pick(d.which);
            const Live& s = live.at(src);
            ident = d.other_model == 0 ? 1 - s.ident : s.ident;
            const auto held = s.cache->tokens();
            const int p = std::min(d.shared, int(held.size()));
            prompt.assign(held.begin(), held.begin() + p);
            origin = fmt::format("{} tokens of seq {}", p, src);
        }
        for (std::size_t t = 0; int(prompt.size()) < std::max(d.length, 1); t++) prompt.push_back(d.tokens[t]);
        // Fits even without a prefix hit.
        prompt.resize(std::size_t(std::min(int(prompt.size()), pool.available() * pool.block_size())));
        if (prompt.empty()) return;
        const int id = next_id++;
        auto cache = std::make_unique<SharedCache>(pool, kIdentity[std::size_t(ident)], id);
        ops.push_back(
            fmt::format("new seq {} (model {}, [{}], {})", id, kIdentityName[ident], fmt::join(prompt, " "), origin));
        const int hit = cache->attach_prefix(prompt);
        ops.back() += fmt::format(" mapped {} from the prefix cache", hit);
        append_rows(*cache, ident, std::span<const int>(prompt).subspan(std::size_t(hit)));
        live.emplace(id, Live{std::move(cache), ident});
    }

    void append(const Draws& d) {
        const int id = pick(d.which);
        Live& s = live.at(id);
        int k = std::min(d.count, kMaxSeq - s.cache->length());
        while (k > 0 && blocks_needed(*s.cache, k) > pool.available()) k--;
        if (k <= 0) return;
        const std::span<const int> tokens = std::span(d.tokens).first(std::size_t(k));
        ops.push_back(fmt::format("append seq {} [{}]", id, fmt::join(tokens, " ")));
        append_rows(*s.cache, s.ident, tokens);
    }

    void fork(const Draws& d) {
        const int id = pick(d.which), child = next_id++;
        ops.push_back(fmt::format("fork seq {} -> seq {}", id, child));
        const int ident = live.at(id).ident;
        live.emplace(child, Live{live.at(id).cache->fork(child), ident});
    }

    void free(const Draws& d) {
        const int id = pick(d.which);
        ops.push_back(fmt::format("free seq {}", id));
        live.at(id).cache->free();
        live.erase(id);
    }
};

void check_state_machine() {
    Config c;
    c.n_layers = 2;
    c.n_heads = 2;
    c.n_kv_heads = draw(1, 2);
    c.dim = 4;
    c.hidden_dim = 4;
    c.vocab_size = 8;
    c.max_seq = kMaxSeq;
    const int bs = draw(1, 4);
    Machine m(c, bs, draw(1, 3 * ((kMaxSeq + bs - 1) / bs)));
    const int n_ops = draw(1, 24);
    for (int i = 0; i < n_ops; i++) {
        const Draws d = draw_operation();
        int op = d.kind;  // Draws::kind
        if (op == 0) continue;
        if (m.live.empty()) op = 1;
        if (int(m.live.size()) >= kMaxLive && (op <= 3 || op == 7 || op == 8)) op = 4;
        try {
            if (op <= 3)
                m.new_request(d);
            else if (op <= 6)
                m.append(d);
            else if (op <= 8)
                m.fork(d);
            else
                m.free(d);
        } catch (const rc::detail::CaseResult& r) {  // a check inside the cache: say after which steps
            if (r.type == rc::detail::CaseResult::Type::Failure) m.failing(r.description);
            throw;
        } catch (const std::exception& e) {
            m.failing(e.what());
        }
        m.check();
    }
}

// ----------------------------------------------------------------------------------------------
// 3. P1: naive == cached through your bookkeeping

// One sequence: its cache over the shared pool, a decoder, and the tokens so far.
struct Request {
    std::string name;
    const Model* model = nullptr;
    NaiveDecoder* naive = nullptr;
    std::unique_ptr<SharedCache> cache;
    std::unique_ptr<CachedDecoder> decoder;
    std::vector<int> tokens;
};

void check_p1() {
    const Config c = draw_config(2);
    const int bs = draw(1, std::min(8, c.max_seq));
    const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
    const Model ma = random_model(c, seed), mb = random_model(c, seed + 1);
    NaiveDecoder naive_a(ma), naive_b(mb);
    const int per_seq = (c.max_seq + bs - 1) / bs;
    Pool pool(c, bs, 5 * per_seq + 1);
    int next_id = 0;
    const std::string where = fmt::format("{}, block_size {}", c.describe(), bs);

    auto expect = [&](const Request& r, const std::vector<float>& got, const std::string& what) {
        const std::string diff = lessons::describe_difference(r.naive->forward(r.tokens), got);
        if (!diff.empty())
            fail(fmt::format("{}: {}, {}: at T = {} the cached logits differ from naive decode: {}", where, r.name,
                             what, r.tokens.size(), diff));
    };
    auto request = [&](std::string name, const Model& m, NaiveDecoder& naive, std::vector<int> prompt) {
        Request r{
            std::move(name), &m, &naive, std::make_unique<SharedCache>(pool, m.w.fingerprint(), next_id++), {}, {}};
        r.decoder = std::make_unique<CachedDecoder>(m, *r.cache);
        r.tokens = std::move(prompt);
        const std::vector<float>& got = r.decoder->extend(r.tokens);
        expect(r, got,
               fmt::format("prompt of {} tokens, {} mapped from the prefix cache", r.tokens.size(),
                           r.decoder->prefix_hit()));
        return r;
    };
    auto decode = [&](Request& r, int token) {
        r.tokens.push_back(token);
        expect(r, r.decoder->decode(token), "a decode step");
    };

    // Request 1 (model A): a prompt, then a few decode steps.
    const std::vector<int> prompt = draw_tokens(c, draw(1, c.max_seq));
    Request a = request("request 1 (model A)", ma, naive_a, prompt);
    for (int t : draw_tokens(c, draw(0, c.max_seq - int(a.tokens.size())) / 2)) decode(a, t);
    // Request 2 (model A): part of request 1's tokens, then its own: a prefix hit.
    std::vector<int> p2(a.tokens.begin(), a.tokens.begin() + draw(1, int(a.tokens.size())));
    for (int t : draw_tokens(c, draw(0, c.max_seq - int(p2.size())))) p2.push_back(t);
    Request b = request("request 2 (model A)", ma, naive_a, p2);
    // Request 1 forks; both go on with their own tokens: the first write into a shared partial
    // block is a copy.
    Request f{"the fork of request 1", &ma, &naive_a, a.cache->fork(next_id++), {}, a.tokens};
    f.decoder = std::make_unique<CachedDecoder>(ma, *f.cache);
    const int room = c.max_seq - int(a.tokens.size());
    for (int i = 0, n = draw(0, room); i < n; i++) {
        const std::vector<int> two = draw_tokens(c, 2);
        if (draw(0, 1)) {
            decode(f, two[0]);
            decode(a, two[1]);
        } else {
            decode(a, two[0]);
            decode(f, two[1]);
        }
    }
    // Model B, request 1's prompt: it must not read model A's rows.
    Request other = request("request 3 (model B, request 1's prompt)", mb, naive_b, prompt);
    // Request 1 is freed; its prompt again maps the blocks it published.
    a.cache->free();
    Request again = request("request 4 (model A, request 1's prompt, after request 1 was freed)", ma, naive_a, prompt);
}

// ----------------------------------------------------------------------------------------------
// 4. The prefix hit of a second identical request

void check_prefix_hit() {
    const Config c = draw_config(2);
    const int bs = draw(1, std::min(8, c.max_seq));
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const std::vector<int> prompt = draw_tokens(c, draw(2, c.max_seq));
    Pool pool(c, bs, 2 * ((c.max_seq + bs - 1) / bs) + 1);
    SharedCache first(pool, m.w.fingerprint(), 0), second(pool, m.w.fingerprint(), 1);
    CachedDecoder d1(m, first), d2(m, second);
    d1.extend(prompt);
    d2.extend(prompt);
    const int want = (int(prompt.size()) - 1) / bs * bs, hit = d2.prefix_hit();
    const std::string setup =
        fmt::format("two requests with the same {}-token prompt, block_size {}", prompt.size(), bs);
    if (hit != want)
        fail(
            fmt::format("{}: the second was served {} positions from the prefix cache; it should map the first's {} "
                        "full blocks ({} positions: whole blocks, never the last token)",
                        setup, hit, want / bs, want));
    const std::vector<int>&t1 = first.sequence().table, &t2 = second.sequence().table;
    for (int b = 0; b < want / bs; b++) {
        if (t2[std::size_t(b)] != t1[std::size_t(b)])
            fail(
                fmt::format("{}: the second maps block {} as its logical block {}; the first holds that prefix in "
                            "block {}",
                            setup, t2[std::size_t(b)], b, t1[std::size_t(b)]));
        if (pool.refcount[std::size_t(t1[std::size_t(b)])] != 2)
            fail(fmt::format("{}: block {}, mapped by both, has refcount {}", setup, t1[std::size_t(b)],
                             pool.refcount[std::size_t(t1[std::size_t(b)])]));
    }
}

}  // namespace

int main(int argc, char** argv) {
    lessons::Lab lab{8, "sharing: prefix caching and copy-on-write", LAB_SOURCE, {}};
    lab.checks = {
        {"hash chain: a block's key is parent, tokens and model", 2, check_hash},
        {"state machine: refcounts, free list, no write seen by another", 4, check_state_machine},
        {"P1: cached decode through your sharing == naive, bitwise", 3, check_p1},
        {"prefix hit: a second identical request maps the full blocks", 1, check_prefix_hit},
    };
    return lessons::grade(lab, argc, argv);
}
