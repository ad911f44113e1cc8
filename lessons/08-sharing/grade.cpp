// Lab 8's grader: your block manager under kvlab's own pool, paged caches, sequence engine and
// decoders. The hash chain (what a block's key covers); the engine's property (generated
// requests, appends, forks, rollbacks, frees and batched steps, with your books checked against
// the block tables after every call); two models and a fork in one pool; the prefix hit of a
// second identical request; and which cached block an allocation evicts.
// GCC 12 misreads fmt's format-spec parser as an overflow when it inlines it here (a known false
// positive; tests/CMakeLists.txt silences it for test_pool_state.cpp too).
#pragma GCC diagnostic ignored "-Wstringop-overflow"

#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <string>

#include "cpu_backend.h"
#include "decode.h"
#include "engine_property.h"
#include "grader.h"
#include "lab.h"
#include "sequence_engine.h"

using namespace kvlab;
using lab08::LabManager;

namespace {

// This lab is bookkeeping: a head's width changes nothing it checks, so its models keep narrow
// heads (and its cases the budget they had).
constexpr bool kWideHeads = false;

// Your manager, every answer the pool would use as an index or a count checked first: a block
// outside 0..n_blocks-1 (or a refcount or count out of range) fails the check in words, instead of
// the pool writing rows into memory that is not a block's.
class CheckedManager final : public BlockManager {
public:
    explicit CheckedManager(int n_blocks) : lab_(n_blocks), n_(n_blocks) {}
    int n_blocks() const override { return in_range("n_blocks()", lab_.n_blocks(), n_, n_); }
    int available() const override { return in_range("available()", lab_.available(), 0, n_); }
    int allocate(bool& evicted) override {
        std::vector<char> was_published(std::size_t(n_), 0);  // [n_blocks] before the call
        for (int b = 0; b < n_; b++) was_published[std::size_t(b)] = lab_.published(b);
        const int b = block("allocate()", lab_.allocate(evicted));
        if (lab_.refcount(b) != 1)
            fail(fmt::format("allocate() returned block {} with refcount {}; an allocated block has refcount 1", b,
                             lab_.refcount(b)));
        if (evicted != bool(was_published[std::size_t(b)]))
            fail(
                fmt::format("allocate() returned block {} with evicted = {}, but that block was {} before the call: "
                            "evicted says whether a cached (published) block was taken",
                            b, evicted, was_published[std::size_t(b)] ? "published" : "not published"));
        if (lab_.published(b))
            fail(
                fmt::format("allocate() returned block {}, which is still published: an evicted block leaves the "
                            "prefix cache",
                            b));
        return b;
    }
    void retain(int b) override { lab_.retain(b); }
    bool release(int b) override { return lab_.release(b); }
    int refcount(int b) const override {
        return in_range(fmt::format("refcount({})", b).c_str(), lab_.refcount(b), 0, 1 << 30);
    }
    bool published(int b) const override { return lab_.published(b); }
    std::uint64_t hash(const BlockKey& key) const override { return lab_.hash(key); }
    int lookup(const BlockKey& key) const override {
        const int b = lab_.lookup(key);
        if (b == -1) return b;
        block("lookup()", b);
        if (!lab_.published(b))
            fail(
                fmt::format("lookup() returned block {}, which is not published: only the prefix cache's "
                            "blocks may be found",
                            b));
        return b;
    }
    // A hash already published keeps its first block: publishing another under it changes nothing.
    void publish(int b, const BlockKey& key) override {
        const int before = lab_.lookup(key);
        lab_.publish(b, key);
        if (before >= 0 && before != b && (lab_.lookup(key) != before || lab_.published(b)))
            fail(
                fmt::format("publish(block {}) under a key block {} already holds: the lookup now finds block {}, "
                            "and block {} is {}; the first block keeps its hash and nothing changes",
                            b, before, lab_.lookup(key), b, lab_.published(b) ? "published" : "not published"));
    }
    bool needs_copy(int b) const override { return lab_.needs_copy(b); }

private:
    int block(const char* call, int b) const {
        if (b < 0 || b >= n_)
            fail(fmt::format("{} returned block {}, but the pool has {} blocks (0..{})", call, b, n_, n_ - 1));
        return b;
    }
    static int in_range(const char* call, int v, int lo, int hi) {
        if (v < lo || v > hi) fail(fmt::format("{} returned {}, outside {}..{}", call, v, lo, hi));
        return v;
    }
    LabManager lab_;
    int n_;
};

// kvlab's pool, keeping its books with your manager (checked); prefix caching on.
std::unique_ptr<BlockPool> lab_pool(const Config& c, int block_size, int n_blocks) {
    lessons::log_case(fmt::format("{}, a pool of {} blocks of block_size {}", c.describe(), n_blocks, block_size));
    return std::make_unique<BlockPool>(c, block_size, n_blocks, /*prefix_caching=*/true, host_memory(),
                                       std::make_unique<CheckedManager>(n_blocks));
}

// One model: its backend, its naive decoder (the oracle), and an engine over the shared pool.
struct Served {
    Served(const Config& c, std::uint64_t seed, BlockPool& pool)
        : model(random_model(c, seed)), backend(model), naive(model), engine(backend, pool, model.w.fingerprint()) {}
    Model model;
    CpuBackend backend;
    NaiveDecoder naive;
    SequenceEngine engine;

    // Sequence id's logits equal naive decode of its tokens, bit for bit.
    void expect_naive(int id, const std::string& what) {
        const std::string diff =
            lessons::describe_difference(naive.forward(engine.cache(id).tokens()), engine.logits(id));
        if (!diff.empty())
            fail(fmt::format("{}: at T = {} the cached logits differ from naive decode: {}", what,
                             engine.cache(id).length(), diff));
    }
};

// ----------------------------------------------------------------------------------------------
// 1. The hash chain

void check_hash() {
    const LabManager manager(1);
    const std::uint64_t parent = *rc::gen::arbitrary<std::uint64_t>(), model = *rc::gen::arbitrary<std::uint64_t>();
    std::vector<int> tokens(std::size_t(draw(1, 8)));
    for (int& t : tokens) t = draw(0, 31);
    const auto hash = [&](std::uint64_t p, const std::vector<int>& t, std::uint64_t m) {
        return manager.hash(BlockKey{p, m, t});
    };
    const std::uint64_t h = hash(parent, tokens, model);
    const std::string key =
        fmt::format("parent 0x{:016x}, tokens [{}], model 0x{:016x}", parent, fmt::join(tokens, " "), model);
    if (hash(parent, tokens, model) != h)
        fail(fmt::format("hash({}) gave two different hashes: equal keys must hash equal", key));
    const std::uint64_t bit = std::uint64_t(1) << draw(0, 63);
    if (hash(parent, tokens, model ^ bit) == h)
        fail(
            fmt::format("hash ignores the model identity: {} and model 0x{:016x} both hash to 0x{:016x}, so a request "
                        "of one model would read rows the other computed",
                        key, model ^ bit, h));
    if (hash(parent ^ bit, tokens, model) == h)
        fail(
            fmt::format("hash ignores the parent: {} and parent 0x{:016x} both hash to 0x{:016x}, so the same tokens "
                        "after two different prefixes would share rows (K and V depend on every earlier token)",
                        key, parent ^ bit, h));
    std::vector<int> other = tokens;
    const std::size_t i = std::size_t(draw(0, int(tokens.size()) - 1));
    other[i] = (other[i] + draw(1, 31)) % 32;
    if (hash(parent, other, model) == h)
        fail(fmt::format("hash ignores token {}: {} and tokens [{}] both hash to 0x{:016x}", i, key,
                         fmt::join(other, " "), h));
    const std::vector<int> reversed(tokens.rbegin(), tokens.rend());
    if (reversed != tokens && hash(parent, reversed, model) == h)
        fail(fmt::format("hash ignores the order of the tokens: {} and tokens [{}] both hash to 0x{:016x}", key,
                         fmt::join(reversed, " "), h));
}

// ----------------------------------------------------------------------------------------------
// 2. The engine's property, on your books

void check_engine() {
    proofs::engine_property(
        [](const Config& c, int block_size, int n_blocks, bool) { return lab_pool(c, block_size, n_blocks); });
}

// ----------------------------------------------------------------------------------------------
// 3. Two models and a fork in one pool

void check_two_models() {
    const Config c = draw_config(2, 1, kWideHeads);
    const int bs = draw(1, std::min(8, c.max_seq));
    const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
    const std::unique_ptr<BlockPool> pool = lab_pool(c, bs, 5 * ((c.max_seq + bs - 1) / bs) + 1);
    Served a(c, seed, *pool), b(c, seed + 1, *pool);
    std::string log = fmt::format("{}, block_size {}:", c.describe(), bs);
    const auto append = [&](int id, int token) {
        log += fmt::format(" append {} [{}]", id, token);
        a.engine.append(id, std::vector<int>{token});
        a.expect_naive(id, log);
    };

    // Request 1 (model A): a prompt, then a few decode steps.
    const std::vector<int> prompt = draw_tokens(c, draw(1, c.max_seq));
    log += fmt::format(" A: add [{}]", fmt::join(prompt, " "));
    const int r1 = a.engine.add(prompt);
    a.expect_naive(r1, log);
    for (int t : draw_tokens(c, draw(0, c.max_seq - int(prompt.size())) / 2)) append(r1, t);
    // Request 2 (model A): part of request 1's tokens, then its own: a prefix hit.
    const auto span = a.engine.cache(r1).tokens();
    const std::vector<int> held(span.begin(), span.end());
    std::vector<int> p2(held.begin(), held.begin() + draw(1, int(held.size())));
    for (int t : draw_tokens(c, draw(0, c.max_seq - int(p2.size())))) p2.push_back(t);
    log += fmt::format(" A: add [{}]", fmt::join(p2, " "));
    const int r2 = a.engine.add(p2);
    log += fmt::format(" (hit {})", a.engine.prefix_hit(r2));
    a.expect_naive(r2, log);
    // Request 1 forks; both go on with their own tokens: the first write into a shared partial
    // block is a copy. Then the fork rolls back and writes again.
    log += fmt::format(" fork {}", r1);
    const int f = a.engine.fork(r1);
    for (int i = 0, n = draw(0, c.max_seq - int(held.size())); i < n; i++) {
        const std::vector<int> two = draw_tokens(c, 2);
        const bool fork_first = draw(0, 1);
        append(fork_first ? f : r1, two[0]);
        append(fork_first ? r1 : f, two[1]);
    }
    const int back = draw(0, a.engine.cache(f).length());
    log += fmt::format(" rollback {} {}", f, back);
    a.engine.rollback(f, back);
    for (int t : draw_tokens(c, draw(0, std::min(2, c.max_seq - back)))) append(f, t);
    // Model B, request 1's prompt: it must not map model A's rows.
    log += fmt::format(" B: add [{}]", fmt::join(prompt, " "));
    const int other = b.engine.add(prompt);
    if (b.engine.prefix_hit(other) != 0)
        fail(fmt::format("{}: model B's request mapped {} positions model A computed (a block's key names its model)",
                         log, b.engine.prefix_hit(other)));
    b.expect_naive(other, log);
    // Request 1 is freed; its prompt again maps the blocks it published.
    log += fmt::format(" free {} A: add [{}]", r1, fmt::join(prompt, " "));
    a.engine.free(r1);
    const int again = a.engine.add(prompt);
    a.expect_naive(again, log);
}

// ----------------------------------------------------------------------------------------------
// 4. The prefix hit of a second identical request

void check_prefix_hit() {
    const Config c = draw_config(2, 1, kWideHeads);
    const int bs = draw(1, std::min(8, c.max_seq));
    const std::vector<int> prompt = draw_tokens(c, draw(2, c.max_seq));
    const std::unique_ptr<BlockPool> pool = lab_pool(c, bs, 2 * ((c.max_seq + bs - 1) / bs) + 1);
    Served s(c, *rc::gen::arbitrary<std::uint64_t>(), *pool);
    const int first = s.engine.add(prompt), second = s.engine.add(prompt);
    const int want = (int(prompt.size()) - 1) / bs * bs, hit = s.engine.prefix_hit(second);
    const std::string setup =
        fmt::format("two requests with the same {}-token prompt, block_size {}", prompt.size(), bs);
    if (hit != want)
        fail(
            fmt::format("{}: the second was served {} positions from the prefix cache; it should map the first's {} "
                        "full blocks ({} positions: whole blocks, never the last token)",
                        setup, hit, want / bs, want));
    const auto t1 = s.engine.block_table(first), t2 = s.engine.block_table(second);
    for (int b = 0; b < want / bs; b++)
        if (pool->refcount(t1[std::size_t(b)]) != 2 || t2[std::size_t(b)] != t1[std::size_t(b)])
            fail(fmt::format("{}: block {}, mapped by both block tables ([{}] and [{}]), has refcount {}", setup,
                             t1[std::size_t(b)], fmt::join(t1, " "), fmt::join(t2, " "),
                             pool->refcount(t1[std::size_t(b)])));
    s.expect_naive(second, setup);
}

// ----------------------------------------------------------------------------------------------
// 5. Eviction: the least recently used cached block goes first

void check_eviction() {
    // m full blocks and one position more, in a block of its own that never fills (so never stays cached).
    const int bs = draw(2, 4), m = draw(1, 3), length = m * bs + 1;
    const Config c = draw_config(length, 3, kWideHeads);
    // 2m + 1 blocks: two prompts' full blocks stay cached, and one block is left over.
    const std::unique_ptr<BlockPool> pool = lab_pool(c, bs, 2 * m + 1);
    Served s(c, *rc::gen::arbitrary<std::uint64_t>(), *pool);
    // Three prompts whose first tokens differ: none maps another's blocks.
    std::vector<std::vector<int>> prompts;
    for (int first = 0; first < 3; first++) {
        prompts.push_back(draw_tokens(c, length));
        prompts.back()[0] = first;
    }
    const std::vector<int>&x = prompts[0], &y = prompts[1], &z = prompts[2];
    std::string log = fmt::format("{}, {} blocks of {}; prompts X [{}], Y [{}], Z [{}]:", c.describe(), 2 * m + 1, bs,
                                  fmt::join(x, " "), fmt::join(y, " "), fmt::join(z, " "));
    const auto add = [&](const std::vector<int>& prompt, const char* name) {
        log += fmt::format(" add {}", name);
        const int id = s.engine.add(prompt);
        log += fmt::format(" (hit {})", s.engine.prefix_hit(id));
        return id;
    };
    const auto run = [&](const std::vector<int>& prompt, const char* name) {
        const int id = add(prompt, name);
        s.expect_naive(id, log);
        return id;
    };
    const auto free = [&](int id, const char* name) {
        log += fmt::format(" free {}", name);
        s.engine.free(id);
    };
    free(run(x, "X"), "X");
    free(run(y, "Y"), "Y");
    free(run(x, "X"), "X");  // X's blocks are used again: Y's are now the least recently used
    free(run(z, "Z"), "Z");  // Z needs m + 1 blocks: the free one, and m evicted
    // Y's first block was evicted for Z: the prefix cache no longer knows its key.
    const BlockKey y0{0, s.model.w.fingerprint(), std::vector<int>(y.begin(), y.begin() + bs)};
    if (const int stale = pool->lookup(y0); stale >= 0)
        fail(
            fmt::format("{}: Y's first block was evicted for Z, yet lookup of its key still finds block {} (an "
                        "evicted block leaves the prefix cache: published, and the hash index)",
                        log, stale));
    const int again = add(x, "X");
    if (s.engine.prefix_hit(again) != m * bs)
        fail(fmt::format(
            "{}: X's {} cached blocks were used after Y's, so Z should have evicted Y's (the least recently used); "
            "X mapped only {} positions",
            log, m, s.engine.prefix_hit(again)));
    s.expect_naive(again, log);
    free(again, "X");
    const int yy = add(y, "Y");
    if (s.engine.prefix_hit(yy) != 0)
        fail(
            fmt::format("{}: Y's blocks were evicted for Z, yet Y mapped {} positions from the prefix cache (an "
                        "evicted block is no longer published)",
                        log, s.engine.prefix_hit(yy)));
    s.expect_naive(yy, log);
}

}  // namespace

int main(int argc, char** argv) {
    lessons::Lab lab{8, "sharing: the books of a block pool", LAB_SOURCE, {}};
    lab.checks = {
        {"hash chain: a block's key is parent, tokens and model", 2, check_hash},
        {"engine: requests, forks, rollbacks, frees and steps on your books stay exact", 3, check_engine},
        {"two models and a fork in one pool, every step == naive, bitwise", 2, check_two_models},
        {"prefix hit: a second identical request maps the full blocks", 1, check_prefix_hit},
        {"eviction: the least recently used cached block goes first", 2, check_eviction},
    };
    return lessons::grade(lab, argc, argv);
}
