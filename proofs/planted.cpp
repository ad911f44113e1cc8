#include "planted.h"

#include <algorithm>
#include <cmath>
#include <limits>
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
            r.row_bytes = std::int64_t(sizeof(float)) * c.head_size();  // fp32
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

// The attention bugs that choose another kernel by the step's shape: attention runs with the
// AttentionSpec `rule` gives for this step (its spec so far, the row count, and row 0's RowKV,
// downloaded: rows may live on a device).
class AttentionRule final : public ForwardingBackend {
public:
    using Rule = void (*)(AttentionSpec& a, int n_rows, const RowKV& first);
    AttentionRule(Backend& inner, Rule rule) : ForwardingBackend(inner), rule_(rule) {}
    void attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                   const std::int64_t* slots, int max_n, const int* kv_head, int probe_row, float* probe) override {
        Exec e = ex;
        RowKV first;
        if (n_rows > 0) memory().download(&first, rows, std::int64_t(sizeof(RowKV)));
        rule_(e.attention, n_rows, first);
        inner().attention(e, att, q, rows, n_rows, l, slots, max_n, kv_head, probe_row, probe);
        ex.flops = e.flops;
    }

private:
    Rule rule_;
};

// split-kv-from-length: flash-decoding whose split count is fixed, so that the splits' size (and
// the tile boundaries) follow the KV length: a one-row step's tile becomes ceil(n / 4). Modelled
// on split-KV decode kernels that choose the number of splits from the sequence length and the
// device (FlashAttention's num_splits heuristic): each choice gives other bits.
void split_from_length(AttentionSpec& a, int n_rows, const RowKV& first) {
    if (a.tiled() && n_rows == 1) a.tile = std::clamp((first.n + 3) / 4, 1, AttentionSpec::kMaxTile);
}

// key-tile-from-rows: the key tile follows the number of query rows: a step of several rows
// (prefill) runs twice the key tile of a one-row step (decode). Modelled on engines that run one
// attention kernel for prefill and another, with other tile sizes, for decode.
void tile_from_rows(AttentionSpec& a, int n_rows, const RowKV&) {
    if (a.tiled() && n_rows > 1) a.tile = std::min(2 * a.tile, AttentionSpec::kMaxTile);
}

// extend-splits-prefix: a step of several rows that follows cached rows (an extend after a prefix
// hit, or a later chunk) attends the cached prefix and its own rows in separate parts merged by
// their softmax statistics: tiles of the prefix's length. Modelled on engines' "extend" attention
// kernels, which treat a cached prefix and the new tokens as two inputs, unlike cold prefill.
void extend_splits_prefix(AttentionSpec& a, int n_rows, const RowKV& first) {
    const int prefix = first.n - 1;  // positions before the step's first row
    if (n_rows > 1 && prefix > 0) a = {AttentionSpec::Kind::tiled, std::min(prefix, AttentionSpec::kMaxTile)};
}

// norm-split-at-256: rmsnorm of a step of 256 rows or more sums each row's squares in two halves
// (j < dim / 2, then the rest), as a norm kernel that switches its block shape at 256 tokens does:
// a prompt prefilled in one step then differs from the same prompt decoded. Computed on the host
// from the model's weights (any memory: the rows are moved through it).
class NormSplitsAt256 final : public ForwardingBackend {
public:
    NormSplitsAt256(Backend& inner, const Model& model) : ForwardingBackend(inner), model_(model) {}
    void rmsnorm(Exec& ex, float* out, const float* x, Norm n, int l, int rows) override {
        if (rows < 256) return inner().rmsnorm(ex, out, x, n, l, rows);
        const int dim = config().dim;
        const Weights& w = model_.w;
        const float* weight = n == Norm::att   ? w.rms_att.data() + std::int64_t(l) * dim
                              : n == Norm::ffn ? w.rms_ffn.data() + std::int64_t(l) * dim
                                               : w.rms_final.data();
        std::vector<float> xs(std::size_t(rows) * dim), os(xs.size());  // [rows, dim]
        memory().download(xs.data(), x, std::int64_t(sizeof(float)) * rows * dim);
        for (int r = 0; r < rows; r++) {
            const float* xr = xs.data() + std::size_t(r) * dim;
            float a = 0.0f, b = 0.0f;
            for (int j = 0; j < dim / 2; j++) a = a + xr[j] * xr[j];
            for (int j = dim / 2; j < dim; j++) b = b + xr[j] * xr[j];
            const float s = 1.0f / std::sqrt((a + b) / float(dim) + 1e-5f);
            for (int j = 0; j < dim; j++) os[std::size_t(r) * dim + j] = weight[j] * (s * xr[j]);
        }
        memory().upload(out, os.data(), std::int64_t(sizeof(float)) * rows * dim);
        ex.flops += std::uint64_t(rows) * (5ull * dim + 4);
    }

private:
    const Model& model_;
};

// split-from-batch: every product of a step of two or more sequences sums k in two halves (a
// reduction split chosen from the batch size, as GEMM heuristics pick split-K by problem shape):
// a sequence batched then differs from the same sequence alone. The batch size comes from the
// plan (planted_transform); the product is computed on the host from the model's weights.
thread_local int t_batch_sequences = 1;

class SplitFromBatch final : public ForwardingBackend {
public:
    SplitFromBatch(Backend& inner, const Model& model) : ForwardingBackend(inner), model_(model) {}
    void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) override {
        if (t_batch_sequences < 2) return inner().matmul(ex, y, ldy, x, ldx, m, l, rows);
        const MatrixRef w = matrix_of(model_.w, m, l);
        std::vector<float> xs(std::size_t(rows) * ldx), ys(std::size_t(rows) * ldy);  // [rows, ldx], [rows, ldy]
        memory().download(xs.data(), x, std::int64_t(sizeof(float)) * rows * ldx);
        memory().download(ys.data(), y, std::int64_t(sizeof(float)) * rows * ldy);
        for (int r = 0; r < rows; r++)
            for (int o = 0; o < w.n_out; o++) {
                float a = 0.0f, b = 0.0f;
                const float* wo = w.w + std::int64_t(o) * w.n_in;  // W[o][0 .. n_in - 1]
                for (int k = 0; k < w.n_in / 2; k++) a = a + xs[std::size_t(r) * ldx + k] * wo[k];
                for (int k = w.n_in / 2; k < w.n_in; k++) b = b + xs[std::size_t(r) * ldx + k] * wo[k];
                ys[std::size_t(r) * ldy + o] = a + b;
            }
        memory().upload(y, ys.data(), std::int64_t(sizeof(float)) * rows * ldy);
        ex.flops += 2ull * std::uint64_t(rows) * w.n_in * w.n_out;
    }

private:
    const Model& model_;
};

// The KV format bugs: each changes what the cached path stores, as a conversion or a scale
// written twice would. Host or device memory alike: the decorator moves rows and inputs through
// the backend's Memory.
class StoreRewrite : public ForwardingBackend {
public:
    using ForwardingBackend::ForwardingBackend;
    void store_kv(Exec& ex, const RowKV* rows, int n_rows, int l, const float* k, const float* v) override {
        if (n_rows == 0) return inner().store_kv(ex, rows, n_rows, l, k, v);
        Memory& mem = memory();
        std::vector<RowKV> host(static_cast<std::size_t>(n_rows));  // [n_rows]
        mem.download(host.data(), rows, std::int64_t(sizeof(RowKV)) * n_rows);
        const std::int64_t n = std::int64_t(n_rows) * config().kv_dim();
        std::vector<float> hk(static_cast<std::size_t>(n)), hv(hk.size());  // [n_rows, kv_dim]
        mem.download(hk.data(), k, n * std::int64_t(sizeof(float)));
        mem.download(hv.data(), v, n * std::int64_t(sizeof(float)));
        if (!rewrite(host, hk, hv)) return inner().store_kv(ex, rows, n_rows, l, k, v);
        rows_ = Buffer<RowKV>(mem, n_rows);
        k_ = Buffer<float>(mem, n);
        v_ = Buffer<float>(mem, n);
        rows_.upload(host), k_.upload(hk), v_.upload(hv);
        inner().store_kv(ex, rows_.data(), n_rows, l, k_.data(), v_.data());
    }

protected:
    // Edits the rows and their K, V [n_rows, kv_dim] before the store; false: nothing changed.
    virtual bool rewrite(std::vector<RowKV>& rows, std::vector<float>& k, std::vector<float>& v) = 0;
    Buffer<float> scales_;  // a rewrite's own scales, when it makes some

private:
    Buffer<RowKV> rows_;
    Buffer<float> k_, v_;
};

// fp8-scale-twice: the store divides by the scale twice (it stores with the scales squared);
// the read multiplies once.
class ScaleTwice final : public StoreRewrite {
public:
    using StoreRewrite::StoreRewrite;

private:
    bool rewrite(std::vector<RowKV>& rows, std::vector<float>&, std::vector<float>&) override {
        if (!kv_format_scaled(rows[0].format) || !rows[0].scales) return false;
        const std::int64_t n = 2 * std::int64_t(config().n_layers);
        std::vector<float> sq(static_cast<std::size_t>(n));  // [n_layers, 2]
        memory().download(sq.data(), rows[0].scales, n * std::int64_t(sizeof(float)));
        for (float& x : sq) x = x * x;
        scales_ = Buffer<float>(memory(), n);
        scales_.upload(sq);
        for (RowKV& r : rows) r.scales = scales_.data();
        return true;
    }
};

// A wrong conversion to one format, written as what it does to each finite element before the
// store rounds it: bf16-truncates drops the low 16 bits instead of rounding; fp16-overflow-inf
// turns a value past fp16's range into infinity, as a plain cast does, where kvlab saturates.
class WrongConversion final : public StoreRewrite {
public:
    WrongConversion(Backend& inner, KVFormat format, float (*wrong)(float))
        : StoreRewrite(inner), format_(format), wrong_(wrong) {}

private:
    bool rewrite(std::vector<RowKV>& rows, std::vector<float>& k, std::vector<float>& v) override {
        if (rows[0].format != int(format_)) return false;
        for (std::vector<float>* t : {&k, &v})
            for (float& x : *t)
                if (std::isfinite(x)) x = wrong_(x);
        return true;
    }
    KVFormat format_;
    float (*wrong_)(float);
};

float truncated_to_bf16(float x) { return float_from_bits(float_bits(x) & 0xffff0000u); }
float overflowing_fp16(float x) {
    return std::fabs(x) >= 65520.0f ? std::copysign(std::numeric_limits<float>::infinity(), x) : x;
}

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

// int-scale-prev-block: in a paged cache of an integer format, a block's first row is stored
// with the group scales and minimums of the previous block's last row, as a kernel does that
// indexes a per-block scale array with the block before. Codes stay right; host or device
// memory alike (the bytes move through the storage's Memory).
class ScalesFromPreviousBlock final : public ForwardingCache {
public:
    using ForwardingCache::ForwardingCache;
    void stored(int l, std::span<const int> positions) override {
        inner().stored(l, positions);
        const auto* paged = dynamic_cast<const PagedCache*>(&inner());
        const KVStorage& st = storage();
        if (!paged || !kv_format_int(int(st.format))) return;
        const int bs = paged->pool().block_size();
        const std::int64_t scale_bytes = std::int64_t(st.head_size / st.group()) * 8;  // a row's first bytes
        std::vector<std::uint8_t> meta(static_cast<std::size_t>(scale_bytes));         // [scale_bytes]
        for (int pos : positions) {
            if (pos == 0 || pos % bs != 0) continue;
            for (int h = 0; h < config().n_kv_heads; h++)
                for (const Buffer<std::uint8_t>* tensor : {&st.k, &st.v}) {
                    std::uint8_t* to = tensor->data() + st.row(l, h, slot(pos)) * st.row_bytes();
                    const std::uint8_t* from = tensor->data() + st.row(l, h, slot(pos - 1)) * st.row_bytes();
                    st.memory().download(meta.data(), from, scale_bytes);
                    st.memory().upload(to, meta.data(), scale_bytes);
                }
        }
    }
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

// prefix-keeps-format: switched to another KV format, the pool keeps its prefix cache, so a
// later request maps blocks written in the old format (whose rows the new storage no longer holds).
class FormatKeepsPrefix final : public BlockPool {
public:
    using BlockPool::BlockPool;
    void set_kv_format(KVFormat format, std::span<const float> scales) override { remake_storage(format, scales); }
};

}  // namespace

std::unique_ptr<Backend> planted_naive_backend(Mutant m, Backend& inner) {
    if (m == Mutant::mask_off_by_one) return std::make_unique<SeesNextPosition>(inner);
    return nullptr;
}

// logprob-unfused: ln of softmax's rounded probability, as a framework that computes
// log(softmax(x)) in two ops does, against the fused log-softmax decode used (a small
// probability's digits are gone, or it underflows to -inf).
float unfused_logprob(const float* x, int n, int token) {
    float max = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum = sum + exp_f32(x[i] - max);
    return log_f32(exp_f32(x[token] - max) / sum);
}

LogprobFn planted_logprob(Mutant m) { return m == Mutant::logprob_unfused ? unfused_logprob : token_logprob; }

std::unique_ptr<Backend> planted_cached_backend(Mutant m, Backend& inner, const Model& model) {
    switch (m) {
        case Mutant::read_before_write: return std::make_unique<ReadsBeforeWrite>(inner);
        case Mutant::kv_wrong_layer: return std::make_unique<WritesNextLayer>(inner);
        case Mutant::split_kv_from_length: return std::make_unique<AttentionRule>(inner, split_from_length);
        case Mutant::key_tile_from_rows: return std::make_unique<AttentionRule>(inner, tile_from_rows);
        case Mutant::extend_splits_prefix: return std::make_unique<AttentionRule>(inner, extend_splits_prefix);
        case Mutant::norm_split_at_256: return std::make_unique<NormSplitsAt256>(inner, model);
        case Mutant::split_from_batch: return std::make_unique<SplitFromBatch>(inner, model);
        case Mutant::fp8_scale_twice: return std::make_unique<ScaleTwice>(inner);
        case Mutant::bf16_truncates: return std::make_unique<WrongConversion>(inner, KVFormat::bf16, truncated_to_bf16);
        case Mutant::fp16_overflow_inf:
            return std::make_unique<WrongConversion>(inner, KVFormat::fp16, overflowing_fp16);
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
        case Mutant::chunk_boundary_rope:  // a multi-row step after position 0: its first row at pos - 1
            return [](StepPlan& p) {
                for (const StepPlan::Sequence& s : p.seqs)
                    if (s.n_rows > 1 && s.start > 0) p.positions[std::size_t(s.first_row)] -= 1;
            };
        case Mutant::split_from_batch: return [](StepPlan& p) { t_batch_sequences = int(p.seqs.size()); };
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
        case Mutant::int_scale_prev_block: return std::make_unique<ScalesFromPreviousBlock>(inner);
        default: return nullptr;
    }
}

// store-unchecked: a record is used when its length is right (so its rows can be read), whatever
// its checksum and header say.
class StoreUnchecked final : public BlockPool {
public:
    using BlockPool::BlockPool;
    std::string check_record(std::span<const std::uint8_t> record, const BlockKey& key) const override {
        return record.size() == block_record_bytes(block_shape()) ? "" : BlockPool::check_record(record, key);
    }
};

std::unique_ptr<BlockPool> planted_pool(Mutant m, const Config& config, int block_size, int n_blocks,
                                        bool prefix_caching, Memory& memory) {
    switch (m) {
        case Mutant::slot_wrong_block:
            return std::make_unique<SlotWrongBlock>(config, block_size, n_blocks, prefix_caching, memory);
        case Mutant::cow_no_copy:
            return std::make_unique<CowNoCopy>(config, block_size, n_blocks, prefix_caching, memory);
        case Mutant::hash_ignores_model:
            return std::make_unique<HashIgnoresModel>(config, block_size, n_blocks, prefix_caching, memory);
        case Mutant::prefix_keeps_format:
            return std::make_unique<FormatKeepsPrefix>(config, block_size, n_blocks, prefix_caching, memory);
        case Mutant::store_unchecked:
            return std::make_unique<StoreUnchecked>(config, block_size, n_blocks, prefix_caching, memory);
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
    // mm_ multiplies by W[n_in, n_out]; the model keeps W[n_out, n_in]. A planted bug may be slow.
    const std::vector<float> in_out = in_out_copy({w.w, std::size_t(w.n_in) * w.n_out}, 1, w.n_out, w.n_in);
    mm_(ex, y, ldy, x, ldx, in_out.data(), w.n_out, rows, w.n_in, w.n_out);
}

void ProductBackend::causal_attention(Exec& ex, float* att, const float* q, const float* k, const float* v, int T,
                                      const int* kv_head) {
    if (products_ == Products::weights) return inner().causal_attention(ex, att, q, k, v, T, kv_head);
    kvlab::causal_attention(ex, mm_, config(), att, q, k, v, T, kv_head, scratch_);
}

SwapTransform planted_swap(Mutant m) {
    if (m != Mutant::swap_in_shifted) return {};
    // [n_layers, n_kv_heads, T, row_bytes]: every run of T rows moves down one, the first kept.
    return [](std::vector<std::uint8_t>& k, std::vector<std::uint8_t>& v, int T, std::int64_t row_bytes) {
        if (T < 2) return;
        for (std::vector<std::uint8_t>* rows : {&k, &v}) {
            const std::size_t row = std::size_t(row_bytes), run = row * std::size_t(T);
            for (std::size_t at = 0; at + run <= rows->size(); at += run)
                std::copy_backward(rows->begin() + std::ptrdiff_t(at), rows->begin() + std::ptrdiff_t(at + run - row),
                                   rows->begin() + std::ptrdiff_t(at + run));
        }
    };
}

std::function<int(int, int)> planted_beam_parent(Mutant m) {
    if (m != Mutant::beam_wrong_parent) return {};
    return [](int parent, int n_beams) { return (parent + 1) % n_beams; };
}

}  // namespace kvlab
