#include "planted.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "host_backend.h"  // matrix_of

namespace kvlab {

namespace {

// ----------------------------------------------------------------------------------------------
// Backend decorators

// mask-off-by-one: naive attention in which row i also sees position i + 1. It runs on the inner
// backend's cached-attention kernel, reading the step's own K and V ([T, kv_dim]: the row of
// position j and KV head h is head-sized row j * n_kv_heads + h) through slots 0..min(i+1, T-1).
class SeesNextPosition final : public ForwardingBackend {
public:
    using ForwardingBackend::ForwardingBackend;
    void causal_attention(Exec& ex, float* att, const float* q, const float* k, const float* v, int T,
                          const int* kv_head) override {
        const Config& c = config();
        std::vector<RowKV> rows(static_cast<std::size_t>(T));     // [T]
        std::vector<std::int64_t> slots(std::size_t(T) * T, -1);  // [T, T]
        for (int i = 0; i < T; i++) {
            RowKV& r = rows[std::size_t(i)];
            r.k = const_cast<float*>(k);  // only read
            r.v = const_cast<float*>(v);
            r.head_rows = 1;
            r.n = std::min(i + 1, T - 1) + 1;
            for (int j = 0; j < r.n; j++) slots[std::size_t(i) * T + j] = std::int64_t(j) * c.n_kv_heads;
        }
        Buffer<RowKV> rows_dev(memory(), T);
        Buffer<std::int64_t> slots_dev(memory(), std::int64_t(T) * T);
        rows_dev.upload(rows);
        slots_dev.upload(slots);
        inner().attention(ex, att, q, rows_dev.data(), T, 0, slots_dev.data(), T, kv_head, -1, nullptr);
    }
};

// read-before-write: a layer's K and V are stored only after its attention has read the cache.
class ReadsBeforeWrite final : public ForwardingBackend {
public:
    using ForwardingBackend::ForwardingBackend;
    void store_kv(Exec& ex, const RowKV* rows, int n_rows, int l, const float* k, const float* v) override {
        pending_ = [=, this, &ex] { inner().store_kv(ex, rows, n_rows, l, k, v); };
    }
    void attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                   const std::int64_t* slots, int max_n, const int* kv_head, int probe_row, float* probe) override {
        inner().attention(ex, att, q, rows, n_rows, l, slots, max_n, kv_head, probe_row, probe);
        if (pending_) std::exchange(pending_, nullptr)();
    }

private:
    std::function<void()> pending_;
};

// kv-wrong-layer: layer l's K and V go into layer l + 1.
class WritesNextLayer final : public ForwardingBackend {
public:
    using ForwardingBackend::ForwardingBackend;
    void store_kv(Exec& ex, const RowKV* rows, int n_rows, int l, const float* k, const float* v) override {
        inner().store_kv(ex, rows, n_rows, (l + 1) % config().n_layers, k, v);
    }
};

// ----------------------------------------------------------------------------------------------
// Cache wrappers

// stale-prefix: the cache does not report the tokens it holds, so a decoder cannot tell that a
// request's prompt was edited.
class ForgetsTokens final : public ForwardingCache {
public:
    using ForwardingCache::ForwardingCache;
    std::span<const int> tokens() const override { return {}; }
};

// rollback-keeps-length: the rows past n are dropped, but the positions still count.
class RollbackKeepsLength final : public ForwardingCache {
public:
    using ForwardingCache::ForwardingCache;
    void truncate(int n) override {
        const std::span<const int> held = inner().tokens();
        const std::vector<int> dropped(held.begin() + std::min<std::ptrdiff_t>(std::max(n, 0), held.size()),
                                       held.end());
        inner().truncate(n);
        if (!dropped.empty()) inner().append(dropped);  // room again for them, no rows written
    }
};

// spec-rollback-short: a rollback that forgets rows keeps one of them (clearing the cache, a
// rollback to 0, still clears it).
class RollbackShort final : public ForwardingCache {
public:
    using ForwardingCache::ForwardingCache;
    void truncate(int n) override { inner().truncate(n > 0 && n < length() ? n + 1 : n); }
};

// ----------------------------------------------------------------------------------------------
// Pool overrides

class SlotWrongBlock final : public BlockPool {
public:
    using BlockPool::BlockPool;
    std::int64_t slot(int block, int s) const override {
        return BlockPool::slot(block, block_size() > 1 ? s % (block_size() - 1) : s);
    }
};

class CowNoCopy final : public BlockPool {
public:
    using BlockPool::BlockPool;
    bool needs_copy(int) const override { return false; }
};

class HashIgnoresModel final : public BlockPool {
public:
    using BlockPool::BlockPool;
    BlockKey key(std::uint64_t parent, std::uint64_t, std::span<const int> tokens) const override {
        return BlockPool::key(parent, 0, tokens);
    }
};

}  // namespace

std::unique_ptr<Backend> planted_naive_backend(Mutant m, Backend& inner) {
    if (m == Mutant::mask_off_by_one) return std::make_unique<SeesNextPosition>(inner);
    return nullptr;
}

std::unique_ptr<Backend> planted_cached_backend(Mutant m, Backend& inner) {
    switch (m) {
        case Mutant::read_before_write: return std::make_unique<ReadsBeforeWrite>(inner);
        case Mutant::kv_wrong_layer: return std::make_unique<WritesNextLayer>(inner);
        default: return nullptr;
    }
}

std::function<void(StepPlan&)> planted_transform(Mutant m) {
    switch (m) {
        case Mutant::rope_decode_off:  // a decode step's row (one token after a prefix) rotates at pos + 1
            return [](StepPlan& p) {
                for (const StepPlan::Sequence& s : p.seqs)
                    if (s.n_rows == 1 && s.start > 0) {
                        int& pos = p.positions[std::size_t(s.first_row)];
                        pos = (pos + 1) % s.cache->config().max_seq;
                    }
            };
        case Mutant::gqa_modulo:
            return [](StepPlan& p) {
                const int n_kv_heads = p.seqs.at(0).cache->config().n_kv_heads;
                for (std::size_t h = 0; h < p.kv_head.size(); h++) p.kv_head[h] = int(h) % n_kv_heads;
            };
        case Mutant::batch_mixes_blocks:  // the rows of sequence s read the slots of sequence s + 1
            return [](StepPlan& p) {
                for (std::size_t s = 0; s < p.seqs.size(); s++) {
                    const Cache& other = *p.seqs[(s + 1) % p.seqs.size()].cache;
                    for (int i = p.seqs[s].first_row; i < p.seqs[s].first_row + p.seqs[s].n_rows; i++)
                        p.kv[std::size_t(i)].n =
                            other.attended(p.positions[std::size_t(i)], p.slots.data() + std::int64_t(i) * p.max_n);
                }
            };
        default: return nullptr;
    }
}

std::unique_ptr<Cache> planted_cache(Mutant m, Cache& inner) {
    switch (m) {
        case Mutant::stale_prefix: return std::make_unique<ForgetsTokens>(inner);
        case Mutant::rollback_keeps_length: return std::make_unique<RollbackKeepsLength>(inner);
        case Mutant::spec_rollback_short: return std::make_unique<RollbackShort>(inner);
        default: return nullptr;
    }
}

std::unique_ptr<BlockPool> planted_pool(Mutant m, const Config& config, int block_size, int n_blocks,
                                        bool prefix_caching, Memory& memory) {
    switch (m) {
        case Mutant::slot_wrong_block:
            return std::make_unique<SlotWrongBlock>(config, block_size, n_blocks, prefix_caching, memory);
        case Mutant::cow_no_copy:
            return std::make_unique<CowNoCopy>(config, block_size, n_blocks, prefix_caching, memory);
        case Mutant::hash_ignores_model:
            return std::make_unique<HashIgnoresModel>(config, block_size, n_blocks, prefix_caching, memory);
        default: return std::make_unique<BlockPool>(config, block_size, n_blocks, prefix_caching, memory);
    }
}

// ----------------------------------------------------------------------------------------------
// Planted products

ProductBackend::ProductBackend(Backend& inner, const Model& model, MatmulFn mm, Products products)
    : ForwardingBackend(inner), model_(model), mm_(mm), products_(products) {}

ProductBackend::ProductBackend(std::unique_ptr<Backend> inner, const Model& model, MatmulFn mm, Products products)
    : ForwardingBackend(*inner), own_(std::move(inner)), model_(model), mm_(mm), products_(products) {}

void ProductBackend::matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) {
    const MatrixRef w = matrix_of(model_.w, m, l);
    mm_(ex, y, ldy, x, ldx, w.w, w.n_out, rows, w.n_in, w.n_out);
}

void ProductBackend::causal_attention(Exec& ex, float* att, const float* q, const float* k, const float* v, int T,
                                      const int* kv_head) {
    if (products_ == Products::weights) return inner().causal_attention(ex, att, q, k, v, T, kv_head);
    kvlab::causal_attention(ex, mm_, config(), att, q, k, v, T, kv_head, scratch_);
}

}  // namespace kvlab
