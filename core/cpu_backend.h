// kvlab core: the CPU backend. The kernels of kernels.h on host memory, with the weights
// repacked in register-width panels (PackedMatrix, panel_cache.h) for the products, vectors
// across output elements (xsimd) and threads across rows and heads (OpenMP).
#pragma once

#include <vector>

#include "backend.h"
#include "model.h"
#include "panel_cache.h"

namespace kvlab {

// Naive decode's masked attention (Backend::causal_attention) with both of its products, S = Q K^T
// and P V, on `mm`: the CPU backend passes kernels.h's matmul; a test that plants an
// order-changing product runs the same algorithm on its own (tests/test_util.h).
struct NaiveAttentionScratch {
    std::vector<float> kt;      // [head_size, T]  one KV head's keys, transposed
    std::vector<float> scores;  // [tile, T]       rows i0 .. i0 + tile - 1 of S, then of P
                                // (tiled: [n_threads, key tile + head_size] each thread's tile)
};
// With Exec::attention tiled, neither product is used: tiled_causal_attention runs instead.
void causal_attention(Exec& ex, MatmulFn mm, const Config& c, float* att, const float* q, const float* k,
                      const float* v, int T, const int* kv_head, NaiveAttentionScratch& scratch);
// Tiled attention (tiled_attention.h) over rows 0..T-1: row i reads keys 0..i.
void tiled_causal_attention(Exec& ex, const Config& c, float* att, const float* q, const float* k, const float* v,
                            int T, const int* kv_head, NaiveAttentionScratch& scratch);

class CpuBackend final : public Backend {
public:
    // The model must outlive the backend (it reads the embedding and norms in place). The first
    // backend of a model packs its panels or maps them from the panel cache; later ones share them.
    explicit CpuBackend(const Model& model);

    std::string_view name() const override { return "cpu"; }
    Memory& memory() override { return host_memory(); }
    const Config& config() const override { return model_.config(); }

    void embed(Exec& ex, float* x, const int* tokens, int rows) override;
    void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) override;
    void matmuls(Exec& ex, const float* x, int ldx, int l, int rows, std::span<const Product> products) override;
    void rmsnorm(Exec& ex, float* out, const float* x, Norm n, int l, int rows) override;
    void rope(Exec& ex, float* vec, int rows, int n_heads, const int* positions) override;
    void silu_mul(Exec& ex, float* h1, const float* h3, std::int64_t n) override;
    void add(Exec& ex, float* x, const float* y, std::int64_t n) override;
    void causal_attention(Exec& ex, float* att, const float* q, const float* k, const float* v, int T,
                          const int* kv_head) override;
    void store_kv(Exec& ex, const RowKV* rows, int n_rows, int l, const float* k, const float* v) override;
    void load_kv(Exec& ex, const RowKV* rows, int n_rows, int l, float* k, float* v) override;
    void attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                   const std::int64_t* slots, int max_n, const int* kv_head, int probe_row, float* probe) override;

private:
    // Tiled attention of a one-row step, each (head, key tile) an item (flash-decoding).
    void split_attention(Exec& ex, float* att, const float* q, const RowKV& r, int l, const std::int64_t* slots,
                         const int* kv_head, bool parallel);
    // v sized to [n_threads, per_thread] and 16 floats more; its first 64-byte-aligned float.
    static float* thread_scratch(std::vector<float>& v, std::size_t per_thread, int n_threads);
    const PackedMatrix& packed(Matrix m, int l) const;
    const Model& model_;
    std::shared_ptr<const PackedWeights> packed_;  // the model's panels (panel_cache.h), shared by its backends
    NaiveAttentionScratch naive_;  // naive attention's K^T and score tiles
    std::vector<float> scores_;    // [n_threads, max_n + tile + head_size] cached attention's scores, tiles
    std::vector<float> partials_;  // [n_heads, n_tiles, head_size + 2] split_attention's tile partials
    std::vector<float> nan_row_;   // [head_size] what a slot of -1 reads
    std::vector<float> decoded_;   // [n_threads, 34, head_size] cached attention: decoded rows (HeadRows)
};

}  // namespace kvlab
