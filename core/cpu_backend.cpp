#include "cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>

namespace kvlab {

CpuBackend::CpuBackend(const Model& model) : model_(model), nan_row_(std::size_t(model.config().head_size()), kNaN) {
    const Weights& w = model.w;
    const Config& c = w.config;
    const std::size_t dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
    for (std::size_t l = 0; l < std::size_t(c.n_layers); l++)
        layers_.push_back(PackedLayer{
            PackedMatrix(w.wq.data() + l * dim * dim, c.dim, c.dim),
            PackedMatrix(w.wk.data() + l * dim * kv_dim, c.dim, c.kv_dim()),
            PackedMatrix(w.wv.data() + l * dim * kv_dim, c.dim, c.kv_dim()),
            PackedMatrix(w.wo.data() + l * dim * dim, c.dim, c.dim),
            PackedMatrix(w.w1.data() + l * dim * hidden, c.dim, c.hidden_dim),
            PackedMatrix(w.w2.data() + l * hidden * dim, c.hidden_dim, c.dim),
            PackedMatrix(w.w3.data() + l * dim * hidden, c.dim, c.hidden_dim),
        });
    wcls_ = PackedMatrix(w.wcls.data(), c.dim, c.vocab_size);
    assert(layers_.size() == std::size_t(c.n_layers) && nan_row_.size() == std::size_t(c.head_size()));
}

const PackedMatrix& CpuBackend::packed(Matrix m, int l) const {
    if (m == Matrix::wcls) return wcls_;
    const PackedLayer& p = layers_[std::size_t(l)];
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
    return wcls_;
}

void CpuBackend::embed(Exec&, float* x, const int* tokens, int rows) {
    const int dim = config().dim;
    for (int i = 0; i < rows; i++)
        std::copy_n(model_.w.token_embedding.data() + std::int64_t(tokens[i]) * dim, dim, x + std::int64_t(i) * dim);
}

void CpuBackend::matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) {
    matmul_packed(ex, y, ldy, x, ldx, packed(m, l), rows);
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

}  // namespace

void CpuBackend::attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                           const std::int64_t* slots, int max_n, const int* kv_head, int probe_row, float* probe) {
    const Config& c = config();
    const int hs = c.head_size(), n_heads = c.n_heads;
    const std::int64_t n_items = std::int64_t(n_rows) * n_heads;
    std::int64_t work = 0;  // multiply-adds, to decide whether threads pay off
    for (int i = 0; i < n_rows; i++) {
        ex.flops += n_heads * attention_row_flops(hs, rows[i].n);
        work += std::int64_t(n_heads) * 2 * hs * rows[i].n;
    }
    // Each thread's scratch starts on a cache line of its own (16 floats), so that two threads
    // never write one line (false sharing halved the decode rate of a format cache at 2 threads).
    auto padded = [](std::size_t n) { return (n + 15) / 16 * 16; };
    const std::size_t per_thread = padded(std::size_t(std::max(1, max_n))), row_floats = padded(std::size_t(hs));
    scores_.resize(std::size_t(ex.n_threads) * per_thread + 16);  // [n_threads, per_thread], aligned below
    // [n_threads, 10, row_floats]: 8 decoded rows, then a KIVI group's channel scales and minimums
    decoded_.resize(std::size_t(ex.n_threads) * 10 * row_floats + 16);
    assert(scores_.size() == std::size_t(ex.n_threads) * per_thread + 16 &&
           decoded_.size() == std::size_t(ex.n_threads) * 10 * row_floats + 16);
    auto aligned = [](std::vector<float>& v) {
        const auto at = reinterpret_cast<std::uintptr_t>(v.data());
        return v.data() + ((64 - at % 64) % 64) / sizeof(float);
    };
    float* const scores_base = aligned(scores_);
    float* const decoded_base = aligned(decoded_);
    const bool parallel = ex.n_threads > 1 && n_items > 1 && work >= ex.parallel_min_work;
    // Each (row, head) is independent: one thread computes it whole, in the kernel's order.
#pragma omp parallel for num_threads(ex.n_threads) schedule(static) if (parallel)
    for (std::int64_t item = 0; item < n_items; item++) {
        const int i = int(item / n_heads), h = int(item % n_heads);
        const RowKV& r = rows[i];
        const std::int64_t* s = slots + std::int64_t(i) * max_n;
        const std::int64_t base = r.row(l, kv_head[h], 0);
        const int thread = omp_get_thread_num();
        // A stored row as floats: fp32 read in place, a narrower format decoded (decode_kv_row:
        // kv_load's values, exact) into one of this thread's 8 scratch rows, by t % 8, so the
        // eight keys attention_row scores together are all held.
        float* decoded = decoded_base + std::size_t(thread) * 10 * row_floats;
        const bool fp32 = r.format == int(KVFormat::fp32);
        auto row = [&](void* storage, float scale, int t) -> const float* {
            if (s[t] < 0) return nan_row_.data();
            const void* at = static_cast<const char*>(storage) + (base + s[t]) * r.row_bytes;
            if (fp32) return static_cast<const float*>(at);
            float* out = decoded + std::size_t(t % 8) * row_floats;
            decode_kv_row(r.format, at, hs, scale, out, r.group);
            return out;
        };
        const float ks = r.k_scale(l), vs = r.v_scale(l);
        float* scores = scores_base + std::size_t(thread) * per_thread;
        KiviKeys kivi_keys(r, l, kv_head[h], hs, decoded + 8 * row_floats, decoded + 9 * row_floats);
        auto kivi = [&](int t) -> const float* {
            if (s[t] < 0) return nan_row_.data();
            return kivi_keys.row(int(s[t]), decoded + std::size_t(t % 8) * row_floats);
        };
        attention_row(
            att + std::int64_t(i) * c.dim + h * hs, q + std::int64_t(i) * c.dim + h * hs, hs, r.n,
            [&](int t) { return r.key_group ? kivi(t) : row(r.k, ks, t); }, [&](int t) { return row(r.v, vs, t); },
            scores);
        if (i == probe_row) std::copy_n(scores, r.n, probe + std::int64_t(h) * max_n);
    }
}

}  // namespace kvlab
