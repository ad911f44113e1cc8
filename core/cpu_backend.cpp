#include "cpu_backend.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>
#include <limits>
#include <mutex>

#include "thread_pool.h"

namespace kvlab {

namespace {
std::mutex panels_mutex;  // guards Model::cpu_panels: backends of one model may start on several threads
}  // namespace

CpuBackend::CpuBackend(const Model& model) : model_(model), nan_row_(std::size_t(model.config().head_size()), kNaN) {
    {
        const std::lock_guard<std::mutex> lock(panels_mutex);
        if (!model.cpu_panels || model.cpu_panels->built_from != model.w.wq.data())
            model.cpu_panels = packed_weights(model);
        packed_ = model.cpu_panels;
    }
    assert(packed_->layers.size() == std::size_t(model.config().n_layers));
    assert(nan_row_.size() == std::size_t(model.config().head_size()));
}

const PackedMatrix& CpuBackend::packed(Matrix m, int l) const {
    if (m == Matrix::wcls) return packed_->wcls;
    const PackedWeights::Layer& p = packed_->layers[std::size_t(l)];
    switch (m) {
        case Matrix::wq: return p.wq;
        case Matrix::wk: return p.wk;
        case Matrix::wv: return p.wv;
        case Matrix::wo: return p.wo;
        case Matrix::w1: return p.w1;
        case Matrix::w2: return p.w2;
        case Matrix::w3: return p.w3;
        case Matrix::wcls: break;
    }
    return packed_->wcls;
}

// A shared classifier's panels hold the whole embedding (column t of panel t / kPanel is row t), so
// the rows are gathered from there: the pages a decode step reads anyway, not a second copy.
void CpuBackend::embed(Exec&, float* x, const int* tokens, int rows) {
    const int dim = config().dim, panel = PackedMatrix::kPanel;
    const PackedMatrix& cls = packed_->wcls;
    for (int i = 0; i < rows; i++) {
        float* xi = x + std::int64_t(i) * dim;  // [dim]
        if (!model_.w.shared_classifier) {
            std::copy_n(model_.w.token_embedding.data() + std::int64_t(tokens[i]) * dim, dim, xi);
            continue;
        }
        assert(cls.n_in == dim && tokens[i] >= 0 && tokens[i] < cls.n_out);
        const float* column = cls.panels + std::int64_t(tokens[i] / panel) * dim * panel + tokens[i] % panel;
        for (int k = 0; k < dim; k++) xi[k] = column[std::int64_t(k) * panel];
    }
}

void CpuBackend::matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) {
    matmul_packed(ex, y, ldy, x, ldx, packed(m, l), rows);
}

void CpuBackend::matmuls(Exec& ex, const float* x, int ldx, int l, int rows, std::span<const Product> products) {
    std::array<PackedProduct, 4> group;
    assert(products.size() <= group.size());
    for (std::size_t i = 0; i < products.size(); i++)
        group[i] = {products[i].y, products[i].ldy, &packed(products[i].m, l)};
    matmul_packed_group(ex, x, ldx, rows, std::span<const PackedProduct>(group.data(), products.size()));
}

void CpuBackend::rmsnorm(Exec& ex, float* out, const float* x, Norm n, int l, int rows) {
    const Weights& w = model_.w;
    const int dim = config().dim;
    const float* weight = n == Norm::att   ? w.rms_att.data() + std::int64_t(l) * dim
                          : n == Norm::ffn ? w.rms_ffn.data() + std::int64_t(l) * dim
                                           : w.rms_final.data();
    kvlab::rmsnorm(ex, out, x, weight, rows, dim);
}

void CpuBackend::rope(Exec& ex, float* vec, int rows, int n_heads, const int* positions) {
    kvlab::rope(ex, vec, rows, n_heads, config().head_size(), std::span<const int>(positions, std::size_t(rows)),
                model_.rope);
}

void CpuBackend::silu_mul(Exec& ex, float* h1, const float* h3, std::int64_t n) { kvlab::silu_mul(ex, h1, h3, n); }

void CpuBackend::add(Exec& ex, float* x, const float* y, std::int64_t n) { kvlab::add(ex, x, y, n); }

// For each head: S = Q_h K_h^T / sqrt(head_size) with S[i][j] = -inf for j > i, P = softmax by
// row, att_h = P V_h. Masked entries become exact zeros in P and add exact zeros to P V_h, so row
// i computes bit for bit what a cached decode computes at position i (NUMERICS.md). Q·K^T runs
// as a product with K transposed: each score is still summed over d in increasing order.
// S and P are formed a tile of rows at a time, so memory stays [tile, T] rather than [T, T] (1.6 GB
// per head at T = 20,000); a product's element depends only on its indices, so each row's dots,
// mask, softmax and P·V sum are the ones the whole matrix would compute.
void causal_attention(Exec& ex, MatmulFn mm, const Config& c, float* att, const float* q, const float* k,
                      const float* v, int T, const int* kv_head, NaiveAttentionScratch& scratch) {
    if (ex.attention.tiled()) return tiled_causal_attention(ex, c, att, q, k, v, T, kv_head, scratch);
    const int hs = c.head_size(), dim = c.dim, kv_dim = c.kv_dim();
    constexpr std::int64_t kScoreFloats = std::int64_t{1} << 20;  // 4 MB of scores; all of S up to T = 1024
    const int tile = int(std::clamp<std::int64_t>(kScoreFloats / std::max(T, 1), 1, std::max(T, 1)));
    std::vector<float>& kt = scratch.kt;
    std::vector<float>& scores = scratch.scores;
    kt.resize(std::size_t(hs) * T);        // [head_size, T]
    scores.resize(std::size_t(tile) * T);  // [tile, T]
    assert(kt.size() == std::size_t(hs) * T && scores.size() == std::size_t(tile) * T);
    const float scale = attention_scale(hs);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (int h = 0; h < c.n_heads; h++) {
        const int kvh = kv_head[h];
        for (int j = 0; j < T; j++)
            for (int d = 0; d < hs; d++) kt[std::size_t(d) * T + j] = k[std::size_t(j) * kv_dim + kvh * hs + d];
        for (int i0 = 0; i0 < T; i0 += tile) {
            const int rows = std::min(tile, T - i0);
            // S[rows, T] = Q_h[i0 .. i0 + rows - 1, hs] · Kt[hs, T]
            mm(ex, scores.data(), T, q + std::size_t(i0) * dim + h * hs, dim, kt.data(), T, rows, hs, T);
            for (int r = 0; r < rows; r++) {
                float* s = scores.data() + std::size_t(r) * T;
                const int last = i0 + r;  // row i sees positions 0..i
                for (int j = 0; j <= last; j++) s[j] = s[j] / scale;
                for (int j = last + 1; j < T; j++) s[j] = neg_inf;
                softmax(s, T);
            }
            // att_h[i0 .. i0 + rows - 1, hs] = P[rows, T] · V_h[T, hs]
            mm(ex, att + std::size_t(i0) * dim + h * hs, dim, scores.data(), T, v + kvh * hs, kv_dim, rows, T, hs);
        }
        ex.flops += std::uint64_t(T) * (T + 1) / 2 + std::uint64_t(T) * softmax_flops(T);
    }
}

// Row i of head h is tiled_attention_row over keys 0..i: the call a cached decode makes at
// position i, so naive decode needs no mask (later keys are never visited).
void tiled_causal_attention(Exec& ex, const Config& c, float* att, const float* q, const float* k, const float* v,
                            int T, const int* kv_head, NaiveAttentionScratch& scratch) {
    const int hs = c.head_size(), dim = c.dim, kv_dim = c.kv_dim(), tile = ex.attention.tile;
    const std::size_t per_thread = std::size_t(tile + hs + 15) / 16 * 16;
    scratch.scores.resize(std::size_t(ex.n_threads) * per_thread);  // [n_threads, tile + head_size]
    assert(scratch.scores.size() == std::size_t(ex.n_threads) * per_thread);
    const std::int64_t n_items = std::int64_t(T) * c.n_heads;
    const bool parallel = ex.n_threads > 1 && std::int64_t(T) * T * hs * c.n_heads >= ex.parallel_min_work;
    // Rows differ in length; threads claim chunks of items as they go, and which thread runs one
    // changes nothing.
    parallel_for(parallel ? ex.n_threads : 1, n_items, [&](std::int64_t item, int thread) {
        const int i = int(item / c.n_heads), h = int(item % c.n_heads);
        const float* kh = k + kv_head[h] * hs;
        const float* vh = v + kv_head[h] * hs;
        tiled_attention_row(
            att + std::int64_t(i) * dim + h * hs, q + std::int64_t(i) * dim + h * hs, hs, i + 1, tile,
            [&](int t) { return kh + std::int64_t(t) * kv_dim; }, [&](int t) { return vh + std::int64_t(t) * kv_dim; },
            scratch.scores.data() + std::size_t(thread) * per_thread);
    });
    ex.flops += causal_attention_flops(c.n_heads, hs, T, ex.attention);
}

void CpuBackend::causal_attention(Exec& ex, float* att, const float* q, const float* k, const float* v, int T,
                                  const int* kv_head) {
    kvlab::causal_attention(ex, kvlab::matmul, config(), att, q, k, v, T, kv_head, naive_);
}

void CpuBackend::store_kv(Exec&, const RowKV* rows, int n_rows, int l, const float* k, const float* v) {
    const Config& c = config();
    const int hs = c.head_size(), kv_dim = c.kv_dim();
    for (int i = 0; i < n_rows; i++) {
        const RowKV& r = rows[i];
        const float ks = r.k_scale(l), vs = r.v_scale(l);
        for (int h = 0; h < c.n_kv_heads; h++) {
            const std::int64_t at = r.row(l, h, r.write_slot), from = std::int64_t(i) * kv_dim + h * hs;
            void *kr = r.k_row(at), *vr = r.v_row(at);
            if (r.key_group) {  // KIVI: the raw key goes to the residual until its group completes
                std::memcpy(r.kivi_residual(l, h, int(r.write_slot), hs), k + from, sizeof(float) * hs);
                for (int d = 0; d < hs; d++) kv_store_element(r.format, vr, d, v + from, vs, r.group, hs);
                continue;
            }
            if (r.format == int(KVFormat::fp32)) {
                std::memcpy(kr, k + from, sizeof(float) * hs);
                std::memcpy(vr, v + from, sizeof(float) * hs);
                continue;
            }
            for (int d = 0; d < hs; d++) {  // as gpu/kernels.h's store_kv_element
                kv_store_element(r.format, kr, d, k + from, ks, r.group, hs);
                kv_store_element(r.format, vr, d, v + from, vs, r.group, hs);
            }
        }
    }
}

void CpuBackend::load_kv(Exec&, const RowKV* rows, int n_rows, int l, float* k, float* v) {
    const Config& c = config();
    const int hs = c.head_size(), kv_dim = c.kv_dim();
    for (int i = 0; i < n_rows; i++) {
        const RowKV& r = rows[i];
        const float ks = r.k_scale(l), vs = r.v_scale(l);
        for (int h = 0; h < c.n_kv_heads; h++) {
            const std::int64_t at = r.row(l, h, r.write_slot), to = std::int64_t(i) * kv_dim + h * hs;
            const void *kr = r.k_row(at), *vr = r.v_row(at);
            for (int d = 0; d < hs; d++) {  // as gpu/kernels.h's load_kv_element
                k[to + d] = r.key_group ? r.kivi_key(l, h, int(r.write_slot), hs, d)
                                        : kv_load(r.format, kr, d, ks, r.group, hs);
                v[to + d] = kv_load(r.format, vr, d, vs, r.group, hs);
            }
        }
    }
}

namespace {

// KIVI keys of one (layer, KV head), slot = position: the open group's from the fp32 residual; a
// complete group's codes times their channel's scale plus its minimum (RowKV::kivi_key's
// arithmetic), the group's channel scales gathered once from its rows' scale slots.
class KiviKeys {
public:
    // ch_scale, ch_min: [head_size] scratch.
    KiviKeys(const RowKV& r, int l, int kvh, int head_size, float* ch_scale, float* ch_min)
        : r_(r), l_(l), kvh_(kvh), hs_(head_size), ch_scale_(ch_scale), ch_min_(ch_min) {}
    // Position pos's key: in the residual, or decoded into out [head_size].
    const float* row(int pos, float* out) {
        const int g = r_.key_group;
        if (pos >= r_.k_quantized) return r_.kivi_residual(l_, kvh_, pos, hs_);
        if (pos / g != group_) {
            group_ = pos / g;
            const int per_row = hs_ / r_.group;  // channel scales one row holds
            for (int i = 0; i < g; i++) {
                const float* meta = kv_int_meta(r_.k_row(r_.row(l_, kvh_, group_ * g + i)), 0);
                for (int j = 0; j < per_row; j++)
                    ch_scale_[i * per_row + j] = meta[2 * j], ch_min_[i * per_row + j] = meta[2 * j + 1];
            }
        }
        const std::uint8_t* codes = kv_int_codes(r_.k_row(r_.row(l_, kvh_, pos)), hs_, r_.group);
        if (kv_int_bits(r_.format) == 8)
            for (int d = 0; d < hs_; d++) out[d] = float(codes[d]) * ch_scale_[d] + ch_min_[d];
        else
            for (int d = 0; d < hs_; d++)
                out[d] = float(d % 2 == 0 ? codes[d / 2] & 0x0fu : codes[d / 2] >> 4u) * ch_scale_[d] + ch_min_[d];
        return out;
    }

private:
    const RowKV& r_;
    int l_, kvh_, hs_;
    float *ch_scale_, *ch_min_;
    int group_ = -1;  // the group whose channel scales ch_scale_ and ch_min_ hold
};

// Asks for the cache line at p. GCC 12 deletes __builtin_prefetch from loops of fixed count in a
// function that has no other effect (the row prefetches below vanished and the fp32 decode rate
// fell a third), so the instruction is written out where the target has it.
inline void prefetch_line(const void* p) {
#if defined(__x86_64__)
    asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
    __builtin_prefetch(p);
#endif
}

// A thread's HeadRows scratch, in rows of row_floats: 16 decoded rows, KiviKeys' two, and two
// blocks of 8 rows of head_size.
constexpr std::size_t kScratchRows = 16 + 2 + 2 * 8;

// Position t's K and V rows of one (row, KV head) of a cached step, as floats: fp32 read in
// place, a narrower format decoded (decode_kv_row: kv_load's values, exact) into one of 16
// scratch rows by t % 16, so the sixteen rows attention reads together are all held; KIVI keys
// through KiviKeys; a slot of -1 reads NaN. Eight positions whose slots are adjacent are handed
// over at once (rows8): read in place or decoded in one call, prefetched as one run.
class HeadRows {
public:
    // decoded: [kScratchRows, row_floats] this thread's scratch: 16 rows, KiviKeys' scales and
    // minimums, then two blocks of 8 rows of head_size (rows8's, alternating by t0 / 8, so that
    // attention can hold sixteen rows at once)
    // prefetch: ask for the rows kPrefetch positions ahead as each row is read (a decode step
    // reads every key once, from memory; a prefill's rows share theirs, which stay in cache).
    HeadRows(const RowKV& r, int l, int kvh, const std::int64_t* slots, int head_size, std::size_t row_floats,
             float* decoded, const float* nan_row, bool prefetch)
        : r_(r),
          slots_(slots),
          base_(r.row(l, kvh, 0)),
          hs_(head_size),
          row_floats_(row_floats),
          decoded_(decoded),
          nan_row_(nan_row),
          ks_(r.k_scale(l)),
          vs_(r.v_scale(l)),
          kivi_(r, l, kvh, head_size, decoded + 16 * row_floats, decoded + 17 * row_floats),
          prefetch_n_(prefetch ? r.n : 0),
          blocks_(decoded + 18 * row_floats) {}
    const float* key(int t) {
        if (slots_[t] < 0) return nan_row_;
        if (r_.key_group) return kivi_.row(int(slots_[t]), scratch(t));
        return row(r_.k, ks_, t);
    }
    const float* value(int t) { return slots_[t] < 0 ? nan_row_ : row(r_.v, vs_, t); }
    void keys8(int t0, const float** rows) {
        if (r_.key_group) {
            for (int j = 0; j < 8; j++) rows[j] = key(t0 + j);
            return;
        }
        rows8(r_.k, ks_, t0, rows);
    }
    void values8(int t0, const float** rows) { rows8(r_.v, vs_, t0, rows); }

private:
    float* scratch(int t) { return decoded_ + std::size_t(t % 16) * row_floats_; }
    const char* at(const void* storage, std::int64_t slot) const {
        return static_cast<const char*>(storage) + (base_ + slot) * r_.row_bytes;
    }
    // Where a row is does not change what is computed: prefetching only starts the loads early.
    void prefetch_rows(const void* storage, int t, int n_rows) const {
        if (t + n_rows > prefetch_n_) return;
        if (slots_[t] >= 0 && slots_[t + n_rows - 1] == slots_[t] + n_rows - 1) {  // one run (a hint either way)
            const char* p = at(storage, slots_[t]);
            for (std::int64_t b = 0; b < n_rows * r_.row_bytes; b += 64) prefetch_line(p + b);
            return;
        }
        for (int j = 0; j < n_rows; j++)
            if (slots_[t + j] >= 0)
                for (std::int64_t b = 0; b < r_.row_bytes; b += 64) prefetch_line(at(storage, slots_[t + j]) + b);
    }
    const float* row(const void* storage, float scale, int t) {
        prefetch_rows(storage, t + kPrefetch, 1);
        if (r_.format == int(KVFormat::fp32)) return reinterpret_cast<const float*>(at(storage, slots_[t]));
        decode_kv_row(r_.format, at(storage, slots_[t]), hs_, scale, scratch(t), r_.group);
        return scratch(t);
    }
    // Positions t0..t0+7: in place (fp32) or decoded into the block in one call when their slots
    // are adjacent (the call's fixed cost paid once for eight rows), else row by row.
    void rows8(const void* storage, float scale, int t0, const float** rows) {
        if (!adjacent(t0)) {
            for (int j = 0; j < 8; j++) rows[j] = slots_[t0 + j] < 0 ? nan_row_ : row(storage, scale, t0 + j);
            return;
        }
        prefetch_rows(storage, t0 + kPrefetch, 8);
        const char* first = at(storage, slots_[t0]);
        if (r_.format == int(KVFormat::fp32)) {
            for (int j = 0; j < 8; j++) rows[j] = reinterpret_cast<const float*>(first + j * r_.row_bytes);
            return;
        }
        float* block = blocks_ + std::size_t(t0 / 8 % 2) * 8 * hs_;
        decode_kv_rows(r_.format, first, r_.row_bytes, 8, hs_, scale, block, r_.group);
        for (int j = 0; j < 8; j++) rows[j] = block + std::size_t(j) * hs_;
    }
    bool adjacent(int t0) const {
        for (int j = 1; j < 8; j++)
            if (slots_[t0 + j] != slots_[t0] + j) return false;
        return slots_[t0] >= 0;
    }
    const RowKV& r_;
    const std::int64_t* slots_;
    std::int64_t base_;
    int hs_;
    std::size_t row_floats_;
    float* decoded_;
    const float* nan_row_;
    float ks_, vs_;
    KiviKeys kivi_;
    int prefetch_n_;  // rows below it are prefetched ahead (0: none)
    static constexpr int kPrefetch = 64;
    float* blocks_;  // [2, 8, head_size]
};

// kernels.h's key and value accessors over a HeadRows, with its eight-row batches.
struct KeysOf {
    HeadRows& kv;
    const float* operator()(int t) const { return kv.key(t); }
    void rows8(int t0, const float** rows) const { kv.keys8(t0, rows); }
};
struct ValuesOf {
    HeadRows& kv;
    const float* operator()(int t) const { return kv.value(t); }
    void rows8(int t0, const float** rows) const { kv.values8(t0, rows); }
};

}  // namespace

// A step of at most this many rows is taken to read each key once (decode steps of a few
// sequences); a longer one is a prefill, whose rows read the same keys again from cache.
constexpr int kStreamingRows = 8;

float* CpuBackend::thread_scratch(std::vector<float>& v, std::size_t per_thread, int n_threads) {
    assert(n_threads >= 1);
    v.resize(std::size_t(n_threads) * per_thread + 16);  // [n_threads, per_thread], 64-byte aligned below
    assert(v.size() == std::size_t(n_threads) * per_thread + 16);
    const auto at = reinterpret_cast<std::uintptr_t>(v.data());
    return v.data() + ((64 - at % 64) % 64) / sizeof(float);
}

void CpuBackend::attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                           const std::int64_t* slots, int max_n, const int* kv_head, int probe_row, float* probe) {
    const Config& c = config();
    const int hs = c.head_size(), n_heads = c.n_heads;
    const AttentionSpec& a = ex.attention;
    std::int64_t work = 0;  // multiply-adds, to decide whether threads pay off
    for (int i = 0; i < n_rows; i++) {
        ex.flops +=
            n_heads * (a.tiled() ? tiled_attention_flops(hs, rows[i].n, a.tile) : attention_row_flops(hs, rows[i].n));
        work += std::int64_t(n_heads) * 2 * hs * rows[i].n;
    }
    const bool parallel = ex.n_threads > 1 && work >= ex.parallel_min_work;
    if (a.tiled() && n_rows == 1 && probe_row != 0)
        return split_attention(ex, att, q, rows[0], l, slots, kv_head, parallel);
    // Each thread's scratch starts on a cache line of its own (16 floats), so that two threads
    // never write one line (false sharing halved the decode rate of a format cache at 2 threads).
    auto padded = [](std::size_t n) { return (n + 15) / 16 * 16; };
    const std::size_t row_floats = padded(std::size_t(hs));
    // [n_threads, per_thread]: a row's scores, then (tiled) a tile's weights and o_j
    const std::size_t per_thread = padded(std::size_t(std::max(1, max_n))) + padded(std::size_t(a.tile + hs));
    float* const scores_base = thread_scratch(scores_, per_thread, ex.n_threads);
    float* const decoded_base = thread_scratch(decoded_, kScratchRows * row_floats, ex.n_threads);  // HeadRows' scratch
    const std::int64_t n_items = std::int64_t(n_rows) * n_heads;
    // Each (row, head) is independent: one thread computes it whole, in the kernel's order.
    parallel_for(parallel ? ex.n_threads : 1, n_items, [&](std::int64_t item, int thread) {
        const int i = int(item / n_heads), h = int(item % n_heads);
        const RowKV& r = rows[i];
        HeadRows kv(r, l, kv_head[h], slots + std::int64_t(i) * max_n, hs, row_floats,
                    decoded_base + std::size_t(thread) * kScratchRows * row_floats, nan_row_.data(),
                    n_rows <= kStreamingRows);
        const KeysOf key{kv};
        const ValuesOf value{kv};
        float* scores = scores_base + std::size_t(thread) * per_thread;
        float* out = att + std::int64_t(i) * c.dim + h * hs;
        const float* qi = q + std::int64_t(i) * c.dim + h * hs;
        float* tile = scores + padded(std::size_t(std::max(1, max_n)));  // [tile + head_size]
        if (a.tiled())
            tiled_attention_row(out, qi, hs, r.n, a.tile, key, value, tile);
        else
            attention_row(out, qi, hs, r.n, key, value, scores);
        if (i != probe_row) return;
        // The viewer's weights: the row's softmax (tiled attention never forms it), into scratch.
        if (a.tiled()) attention_row(tile, qi, hs, r.n, key, value, scores);
        std::copy_n(scores, r.n, probe + std::int64_t(h) * max_n);
    });
}

// Flash-decoding: one query row, so each (head, key tile) is an item of its own, its partial
// (attention_tile) kept in partials_; then each head folds its tiles in order. The partials are
// those tiled_attention_row computes and folds, so the bits are its bits.
void CpuBackend::split_attention(Exec& ex, float* att, const float* q, const RowKV& r, int l, const std::int64_t* slots,
                                 const int* kv_head, bool parallel) {
    const Config& c = config();
    const int hs = c.head_size(), n_heads = c.n_heads, tile = ex.attention.tile;
    const int n_tiles = tile_count(r.n, tile), stride = hs + 2;  // a partial: o_j[head_size], m_j, l_j
    partials_.resize(std::size_t(n_heads) * n_tiles * stride);   // [n_heads, n_tiles, head_size + 2]
    assert(partials_.size() == std::size_t(n_heads) * n_tiles * stride);
    auto padded = [](std::size_t n) { return (n + 15) / 16 * 16; };
    const std::size_t row_floats = padded(std::size_t(hs)), per_thread = padded(std::size_t(tile));
    float* const e_base = thread_scratch(scores_, per_thread, ex.n_threads);  // [n_threads, tile]
    float* const decoded_base = thread_scratch(decoded_, kScratchRows * row_floats, ex.n_threads);
    const std::int64_t n_items = std::int64_t(n_heads) * n_tiles;
    parallel_for(parallel ? ex.n_threads : 1, n_items, [&](std::int64_t item, int thread) {
        const int h = int(item / n_tiles), j = int(item % n_tiles);
        HeadRows kv(r, l, kv_head[h], slots, hs, row_floats,
                    decoded_base + std::size_t(thread) * kScratchRows * row_floats, nan_row_.data(), true);
        float* partial = partials_.data() + std::size_t(item) * stride;
        const TileStats st = attention_tile(partial, e_base + std::size_t(thread) * per_thread, q + h * hs, hs,
                                            j * tile, std::min((j + 1) * tile, r.n), KeysOf{kv}, ValuesOf{kv});
        partial[hs] = st.m, partial[hs + 1] = st.l;
    });
    for (int h = 0; h < n_heads; h++) {
        float* out = att + h * hs;
        for (int d = 0; d < hs; d++) out[d] = 0.0f;
        if (r.n <= 0) continue;
        TileStats acc = tile_fold_start();
        for (int j = 0; j < n_tiles; j++) {
            const float* partial = partials_.data() + (std::size_t(h) * n_tiles + j) * stride;
            fold_tile(out, acc, partial, TileStats{partial[hs], partial[hs + 1]}, hs);
        }
        for (int d = 0; d < hs; d++) out[d] = out[d] / acc.l;
    }
}

}  // namespace kvlab
