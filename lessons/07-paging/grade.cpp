// Lab 7's grader: your allocator under a generated state machine, your translation against
// kvlab's pool, and P1 on a paged cache built from both (one sequence, and several sharing a
// pool).
#include <algorithm>
#include <set>

#include "decode.h"
#include "grader.h"
#include "lab.h"
#include "paged.h"

using namespace kvlab;
using lab07::LabAllocator;

namespace {

std::string list(const std::vector<int>& v) {
    std::string s;
    for (int x : v) {
        if (!s.empty()) s += ',';
        s += std::to_string(x);
    }
    return s;
}

// A pool's storage, [n_blocks, n_layers, n_kv_heads, block_size] rows, and your allocator.
struct LabPool {
    LabPool(const Config& c, int block_size, int n_blocks)
        : config(c), block_size(block_size),
          storage(host_memory(), std::int64_t(n_blocks) * c.n_layers * c.n_kv_heads * block_size, c.head_size(),
                  std::int64_t(c.n_kv_heads) * block_size, block_size),
          allocator(n_blocks) {}
    std::int64_t block_stride() const { return std::int64_t(config.n_layers) * config.n_kv_heads * block_size; }
    Config config;
    int block_size;
    KVStorage storage;
    LabAllocator allocator;
};

// One sequence over a LabPool: a block table filled by your allocator, slots by your
// translation. The rest is what core's PagedCache does without sharing.
class LabPagedCache final : public Cache {
public:
    explicit LabPagedCache(LabPool& pool) : Cache(pool.config), pool_(pool) {}
    ~LabPagedCache() override {
        // A destructor must not throw: an allocator that refuses here has already been caught
        // handing one block out twice (the table then holds it twice).
        for (int b : table_) try {
                pool_.allocator.free(b);
            } catch (const Error&) {
            }
    }
    // Your translation, checked before the decoders use it as a row index: the slot must be a row
    // of some block (b * block_stride + 0..block_size-1, b in 0..n_blocks-1).
    std::int64_t slot(int t) const override {
        const std::int64_t stride = pool_.block_stride(), s = lab07::translate(table_, t, pool_.block_size, stride);
        const int n_blocks = pool_.allocator.n_blocks();
        if (s < 0 || s >= n_blocks * stride || s % stride >= pool_.block_size)
            fail(
                fmt::format("translate(table [{}], t {}, block_size {}, block_stride {}) returned slot {}, but the "
                            "pool's slots are b * {} + 0..{} for its blocks b = 0..{}",
                            list(table_), t, pool_.block_size, stride, s, stride, pool_.block_size - 1, n_blocks - 1));
        return s;
    }
    const KVStorage& storage() const override { return pool_.storage; }
    MemoryStats memory() const override {
        MemoryStats m;
        m.used_bytes = kv_bytes(config_, length());
        m.reserved_bytes = m.allocated_bytes = kv_bytes(config_, int(table_.size()) * pool_.block_size);
        return m;
    }
    std::string name() const override { return fmt::format("lab07 paged(block_size={})", pool_.block_size); }
    const std::vector<int>& table() const { return table_; }

protected:
    void reserve(int new_length) override {
        const std::size_t had = table_.size();
        while (int(table_.size()) * pool_.block_size < new_length) {
            const int b = pool_.allocator.allocate();
            if (b < -1 || b >= pool_.allocator.n_blocks())
                fail(
                    fmt::format("allocate() returned block {}, but the pool has {} blocks (0..{}, or -1 when all "
                                "are allocated)",
                                b, pool_.allocator.n_blocks(), pool_.allocator.n_blocks() - 1));
            if (b < 0) {  // give back what this call took: a failed append changes nothing
                while (table_.size() > had) pool_.allocator.free(table_.back()), table_.pop_back();
                throw Error(fmt::format("pool exhausted: {} positions do not fit", new_length));
            }
            table_.push_back(b);
        }
    }
    void release(int n) override {
        for (int t = n; t < length(); t++) pool_.storage.poison(config_, slot(t), 1);
        const std::size_t keep = std::size_t((n + pool_.block_size - 1) / pool_.block_size);
        while (table_.size() > keep) pool_.allocator.free(table_.back()), table_.pop_back();
    }

private:
    LabPool& pool_;
    std::vector<int> table_;  // [ceil(length / block_size)] physical block of each logical block
};

// Allocate and free in a generated order against a model of the pool.
void check_allocator() {
    const int n = draw(1, 12);
    lessons::log_case(fmt::format("LabAllocator({}), then generated allocate and free calls", n));
    LabAllocator a(n);
    std::set<int> held;
    const int steps = draw(1, 60);
    for (int i = 0; i < steps; i++) {
        if (a.n_free() != n - int(held.size()))
            fail(fmt::format("pool of {} with {} allocated: n_free() says {}, expected {}", n, held.size(), a.n_free(),
                             n - int(held.size())));
        const int op = draw(0, 2);
        if (op == 0 || held.empty()) {
            const int b = a.allocate();
            if (int(held.size()) == n) {
                if (b != -1) fail(fmt::format("pool of {}, all allocated: allocate() returned {}, expected -1", n, b));
            } else if (b < 0 || b >= n) {
                fail(fmt::format("pool of {} with {} allocated: allocate() returned {}, not a block 0..{}", n,
                                 held.size(), b, n - 1));
            } else if (!held.insert(b).second) {
                fail(fmt::format("pool of {}: allocate() returned block {}, which is already allocated", n, b));
            }
        } else if (op == 1) {
            const int b = *std::next(held.begin(), draw(0, int(held.size()) - 1));
            a.free(b);
            held.erase(b);
        } else {  // a double free, or a block out of range: refused, nothing changes
            int b = draw(-1, n);
            if (held.count(b)) b = -1;
            bool refused = false;
            try {
                a.free(b);
            } catch (const Error&) {
                refused = true;
            }
            if (!refused) fail(fmt::format("pool of {}: free({}) of a block that is not allocated was accepted", n, b));
        }
    }
}

// Your translation against kvlab's pool, for a generated table.
void check_translate() {
    const Config c = draw_config();
    const int bs = draw(1, c.max_seq), per_seq = (c.max_seq + bs - 1) / bs;
    const int n_blocks = per_seq + draw(0, 4);
    BlockPool pool(c, bs, n_blocks);
    std::vector<int> blocks(static_cast<std::size_t>(n_blocks));
    for (int b = 0; b < n_blocks; b++) blocks[std::size_t(b)] = b;
    std::vector<int> table;
    for (int i = 0; i < per_seq; i++) {  // distinct blocks, in a drawn order
        const int j = draw(i, n_blocks - 1);
        std::swap(blocks[std::size_t(i)], blocks[std::size_t(j)]);
        table.push_back(blocks[std::size_t(i)]);
    }
    const std::int64_t stride = pool.slot(1, 0);
    for (int t = 0; t < c.max_seq; t++) {
        lessons::log_case(
            fmt::format("translate(table [{}], t {}, block_size {}, block_stride {})", list(table), t, bs, stride));
        const std::int64_t want = pool.slot(table[std::size_t(t / bs)], t % bs);
        const std::int64_t got = lab07::translate(table, t, bs, stride);
        if (got != want)
            fail(fmt::format("block_size {}, block stride {}, table [{}]: position {} is in logical block {} = physical "
                             "block {}, row {}: slot {}, but translate() says {}",
                             bs, stride, list(table), t, t / bs, table[std::size_t(t / bs)], t % bs, want,
                             got));
    }
}

// Prefill, then decode: naive decode agrees at every step on your paged cache.
void check_p1() {
    const Config c = draw_config();
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const int bs = draw(1, c.max_seq);
    LabPool pool(c, bs, (c.max_seq + bs - 1) / bs + draw(0, 2));
    for (int i = draw(0, pool.allocator.n_blocks() - 1); i > 0; i--) pool.allocator.allocate();  // blocks already taken
    const std::vector<int> tokens = draw_tokens(c, draw(1, std::min(c.max_seq, pool.allocator.n_free() * bs)));
    const int prompt = draw(1, int(tokens.size()));
    lessons::log_case(fmt::format("{}, block_size {}, {} blocks ({} free), {} tokens, prompt {}", c.describe(), bs,
                                  pool.allocator.n_blocks(), pool.allocator.n_free(), tokens.size(), prompt));
    LabPagedCache cache(pool);
    NaiveDecoder naive(m);
    CachedDecoder cached(m, cache);
    const std::span<const int> all(tokens);
    for (int T = prompt; T <= int(tokens.size()); T++) {
        const std::vector<float>& got = T == prompt ? cached.prefill(all.first(T)) : cached.decode(tokens[T - 1]);
        const std::string diff = lessons::describe_difference(naive.forward(all.first(T)), got);
        if (!diff.empty())
            fail(fmt::format("{}, block_size {}, block table [{}]: at T = {} the cached logits differ from naive: {}",
                             c.describe(), bs, list(cache.table()), T, diff));
    }
}

// Several sequences over one pool, decoding in turns: each equals its own naive run; a full
// pool refuses an append and changes nothing.
void check_shared_pool() {
    const Config c = draw_config();
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const int bs = draw(1, c.max_seq), n_seqs = draw(2, 3);
    LabPool pool(c, bs, draw(1, n_seqs * ((c.max_seq + bs - 1) / bs)));
    lessons::log_case(fmt::format("{}, {} sequences over {} blocks of block_size {}", c.describe(), n_seqs,
                                  pool.allocator.n_blocks(), bs));
    std::vector<std::unique_ptr<LabPagedCache>> caches;
    std::vector<std::vector<int>> tokens(static_cast<std::size_t>(n_seqs));
    NaiveDecoder naive(m);
    for (int s = 0; s < n_seqs; s++) caches.push_back(std::make_unique<LabPagedCache>(pool));
    for (int step = 0; step < n_seqs * c.max_seq; step++) {
        const int s = draw(0, n_seqs - 1);
        LabPagedCache& cache = *caches[std::size_t(s)];
        if (cache.length() == c.max_seq) continue;
        const int token = draw(0, c.vocab_size - 1);
        CachedDecoder cached(m, cache);
        const int free_before = pool.allocator.n_free();
        const bool fits = cache.length() % bs != 0 || free_before > 0;
        std::vector<float> got;
        try {
            got = cached.decode(token);
        } catch (const Error& e) {
            if (fits) fail(fmt::format("sequence {} at length {}: decode refused with room left: {}", s, cache.length(), e.what()));
            if (pool.allocator.n_free() != free_before)
                fail(fmt::format("a refused append changed the pool: n_free {} -> {}", free_before,
                                 pool.allocator.n_free()));
            continue;
        }
        if (!fits) fail(fmt::format("sequence {} grew to {} positions with no free block left", s, cache.length()));
        tokens[std::size_t(s)].push_back(token);
        const std::string diff = lessons::describe_difference(naive.forward(tokens[std::size_t(s)]), got);
        if (!diff.empty())
            fail(fmt::format("{} sequences over {} blocks of block_size {}, {}: sequence {} at T = {} differs from its "
                             "naive run: {}",
                             n_seqs, pool.allocator.n_blocks(), bs, c.describe(), s, tokens[std::size_t(s)].size(), diff));
    }
}

}  // namespace

int main(int argc, char** argv) {
    lessons::Lab lab{7, "paging", LAB_SOURCE, {}};
    lab.checks = {
        {"allocator: generated allocate/free sequences, double frees", 3, check_allocator},
        {"translate: every position's slot equals kvlab's pool", 2, check_translate},
        {"P1: your paged cache == naive, bitwise, block_size 1..max_seq", 3, check_p1},
        {"shared pool: sequences in turns stay exact; full pool refuses", 2, check_shared_pool},
    };
    return lessons::grade(lab, argc, argv);
}
