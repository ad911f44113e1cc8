#include "host_backend.h"

#include <cassert>

#include "kernels.h"

namespace kvlab {

MatrixRef matrix_of(const Weights& w, Matrix m, int l) {
    const Config& c = w.config;
    const std::int64_t L = l, dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
    switch (m) {
        case Matrix::wq: return {w.wq.data() + L * dim * dim, c.dim, c.dim};
        case Matrix::wk: return {w.wk.data() + L * kv_dim * dim, c.dim, c.kv_dim()};
        case Matrix::wv: return {w.wv.data() + L * kv_dim * dim, c.dim, c.kv_dim()};
        case Matrix::wo: return {w.wo.data() + L * dim * dim, c.dim, c.dim};
        case Matrix::w1: return {w.w1.data() + L * hidden * dim, c.dim, c.hidden_dim};
        case Matrix::w2: return {w.w2.data() + L * dim * hidden, c.hidden_dim, c.dim};
        case Matrix::w3: return {w.w3.data() + L * hidden * dim, c.dim, c.hidden_dim};
        case Matrix::wcls: break;
    }
    return {w.wcls.data(), c.dim, c.vocab_size};
}

const float* norm_of(const Weights& w, Norm n, int l) {
    const std::int64_t at = std::int64_t(l) * w.config.dim;
    return n == Norm::att ? w.rms_att.data() + at : n == Norm::ffn ? w.rms_ffn.data() + at : w.rms_final.data();
}

// ---- The launches: one loop iteration per GPU thread, the grid in row-major index order (the
// order does not matter: every thread owns its outputs).
namespace gpu::host {

void matmul(float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in, int n_out) {
    assert(rows >= 0 && n_in >= 0 && n_out >= 0 && ldy >= n_out && ldx >= n_in && ldw >= n_in);
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < n_out; o++) y[std::int64_t(r) * ldy + o] = gpu::matmul_element(x, ldx, w, ldw, n_in, r, o);
}

void rmsnorm(float* out, const float* x, const float* w, int rows, int dim) {
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < dim; j++) gpu::rmsnorm_element(out, x, w, dim, r, j);
}

void rope(float* vec, int rows, int n_heads, int head_size, const int* positions, const RopeTable& table) {
    const int n_pairs = head_size / 2;
    assert(table.n_pairs == n_pairs);
    assert(table.cos.size() == std::size_t(table.max_seq) * n_pairs && table.sin.size() == table.cos.size());
    for (int r = 0; r < rows; r++) {
        assert(positions[r] >= 0 && positions[r] < table.max_seq);
        for (int h = 0; h < n_heads; h++)
            for (int j = 0; j < n_pairs; j++)
                gpu::rope_pair(vec, n_heads, head_size, positions, table.cos.data(), table.sin.data(), n_pairs, r, h,
                               j);
    }
}

void silu_mul(float* h1, const float* h3, std::int64_t n) {
    for (std::int64_t i = 0; i < n; i++) gpu::silu_mul_element(h1, h3, i);
}

void add(float* x, const float* y, std::int64_t n) {
    for (std::int64_t i = 0; i < n; i++) gpu::add_element(x, y, i);
}

void softmax(float* out, const float* x, int n) {
    for (int t = 0; t < n; t++) gpu::softmax_element(out, x, n, t);
}

}  // namespace gpu::host

// ---- The backend. FLOPs are counted with the CPU backend's formulas (cpu_backend.cpp,
// kernels.cpp), so every figure a decoder reports is the same on either.

void GpuHostBackend::embed(Exec&, float* x, const int* tokens, int rows) {
    const Config& c = config();
    for (int r = 0; r < rows; r++) {
        assert(tokens[r] >= 0 && tokens[r] < c.vocab_size);
        for (int j = 0; j < c.dim; j++) gpu::embed_element(x, model_.w.token_embedding.data(), tokens, c.dim, r, j);
    }
}

void GpuHostBackend::matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) {
    const MatrixRef w = matrix_of(model_.w, m, l);
    ex.flops += 2ull * std::uint64_t(rows) * std::uint64_t(w.n_in) * std::uint64_t(w.n_out);
    gpu::host::matmul(y, ldy, x, ldx, w.w, w.n_in, rows, w.n_in, w.n_out);
}

void GpuHostBackend::rmsnorm(Exec& ex, float* out, const float* x, Norm n, int l, int rows) {
    const int dim = config().dim;
    ex.flops += std::uint64_t(rows) * (5ull * dim + 4);
    gpu::host::rmsnorm(out, x, norm_of(model_.w, n, l), rows, dim);
}

void GpuHostBackend::rope(Exec& ex, float* vec, int rows, int n_heads, const int* positions) {
    const int head_size = config().head_size();
    ex.flops += 6ull * std::uint64_t(rows) * n_heads * (head_size / 2);
    gpu::host::rope(vec, rows, n_heads, head_size, positions, model_.rope);
}

void GpuHostBackend::silu_mul(Exec& ex, float* h1, const float* h3, std::int64_t n) {
    ex.flops += 5ull * std::uint64_t(n);
    gpu::host::silu_mul(h1, h3, n);
}

void GpuHostBackend::add(Exec& ex, float* x, const float* y, std::int64_t n) {
    ex.flops += std::uint64_t(n);
    gpu::host::add(x, y, n);
}

void GpuHostBackend::causal_attention(Exec& ex, float* att, const float* q, const float* k, const float* v, int T,
                                      const int* kv_head) {
    const Config& c = config();
    const int hs = c.head_size();
    const int tile = ex.attention.tiled() ? ex.attention.tile : 0;
    ex.flops += causal_attention_flops(c.n_heads, hs, T, ex.attention);  // as the CPU counts them
    for (int i = 0; i < T; i++)
        for (int h = 0; h < c.n_heads; h++)
            gpu::causal_attention_head(att, q, k, v, T, c.dim, c.kv_dim(), hs, kv_head[h], i, h, tile);
}

void GpuHostBackend::store_kv(Exec&, const RowKV* rows, int n_rows, int l, const float* k, const float* v) {
    const Config& c = config();
    const int hs = c.head_size();
    for (int i = 0; i < n_rows; i++)
        for (int h = 0; h < c.n_kv_heads; h++)
            for (int d = 0; d < hs; d++) gpu::store_kv_element(rows, l, k, v, c.kv_dim(), hs, i, h, d);
}

void GpuHostBackend::load_kv(Exec&, const RowKV* rows, int n_rows, int l, float* k, float* v) {
    const Config& c = config();
    const int hs = c.head_size();
    for (int i = 0; i < n_rows; i++)
        for (int h = 0; h < c.n_kv_heads; h++)
            for (int d = 0; d < hs; d++) gpu::load_kv_element(rows, l, k, v, c.kv_dim(), hs, i, h, d);
}

void GpuHostBackend::attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                               const std::int64_t* slots, int max_n, const int* kv_head, int probe_row,
                               float* probe) {
    const Config& c = config();
    const int hs = c.head_size();
    const int tile = ex.attention.tiled() ? ex.attention.tile : 0;
    for (int i = 0; i < n_rows; i++) {
        assert(rows[i].n <= max_n);
        ex.flops +=
            c.n_heads * (tile > 0 ? tiled_attention_flops(hs, rows[i].n, tile) : attention_row_flops(hs, rows[i].n));
    }
    if (tile > 0 && n_rows == 1 && !(probe && probe_row == 0)) {  // flash-decoding, as the CUDA backend runs it
        const int n_tiles = tile_count(max_n, tile);
        partials_.resize(std::size_t(c.n_heads) * n_tiles * (hs + 2));  // [n_heads, n_tiles, head_size + 2]
        assert(partials_.size() == std::size_t(c.n_heads) * n_tiles * (hs + 2));
        for (int h = 0; h < c.n_heads; h++)
            for (int j = 0; j < n_tiles; j++)
                gpu::attention_tile_partial(partials_.data(), q, rows, l, slots, max_n, kv_head, c.dim, hs, tile, h, j);
        for (int h = 0; h < c.n_heads; h++) gpu::fold_tile_partials(att, partials_.data(), rows, max_n, hs, tile, h);
        return;
    }
    if (tile == 0 && n_rows <= gpu::kSplitAttentionRows) {        // split, as the CUDA backend runs it
        scores_.resize(std::size_t(n_rows) * c.n_heads * max_n);  // [n_rows, n_heads, max_n]
        assert(scores_.size() == std::size_t(n_rows) * c.n_heads * max_n);
        for (int i = 0; i < n_rows; i++)
            for (int h = 0; h < c.n_heads; h++)
                for (int t = 0; t < max_n; t++)
                    gpu::attention_score_element(scores_.data(), q, rows, l, slots, max_n, kv_head, c.dim, c.n_heads,
                                                 hs, i, h, t);
        for (int i = 0; i < n_rows; i++)
            for (int h = 0; h < c.n_heads; h++)
                gpu::attention_softmax_row(scores_.data(), rows, max_n, c.n_heads, probe_row, probe, i, h);
        for (int i = 0; i < n_rows; i++)
            for (int h = 0; h < c.n_heads; h++)
                for (int d = 0; d < hs; d++)
                    gpu::attention_value_element(att, scores_.data(), q, rows, l, slots, max_n, kv_head, c.dim,
                                                 c.n_heads, hs, i, h, d);
        return;
    }
    for (int i = 0; i < n_rows; i++)
        for (int h = 0; h < c.n_heads; h++)
            gpu::attention_head(att, q, rows, l, slots, max_n, kv_head, c.dim, hs, probe_row, probe, i, h, tile);
}

}  // namespace kvlab
