// kvlab gpu: the host launcher. GpuHostBackend runs the GPU's per-thread code (gpu/kernels.h)
// on the CPU, one loop iteration per GPU thread over the whole grid, in host memory. It is how
// the GPU's arithmetic is checked bit for bit against the CPU backend on machines without a
// GPU: the CUDA backend launches these same functions, compiled by nvcc instead of g++.
#pragma once

#include <cstdint>
#include <vector>

#include "backend.h"
#include "model.h"

namespace kvlab {

// The launches on raw host pointers, shaped as the CPU kernels of core/kernels.h (so tests can
// run each against its CPU counterpart).
namespace gpu::host {
// Y[rows, n_out] (row stride ldy) = X[rows, n_in] (ldx) · W^T, W[n_out, n_in] (ldw): a thread per Y[r][o].
void matmul(float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in, int n_out);
// out[rows, dim] = rmsnorm(x[rows, dim]) with weights w[dim]: a thread per out[r][j].
void rmsnorm(float* out, const float* x, const float* w, int rows, int dim);
// vec[rows, n_heads * head_size] rotated with the table: a thread per (row, head, pair).
void rope(float* vec, int rows, int n_heads, int head_size, const int* positions, const RopeTable& table);
void silu_mul(float* h1, const float* h3, std::int64_t n);  // a thread per element
void add(float* x, const float* y, std::int64_t n);         // a thread per element
// out[n] = softmax(x[n]) (kernels.cpp softmax, out of place): a thread per element.
void softmax(float* out, const float* x, int n);
}  // namespace gpu::host

class GpuHostBackend final : public Backend {
public:
    // The model must outlive the backend (its weights are read in place: host memory).
    explicit GpuHostBackend(const Model& model) : model_(model) {}

    std::string_view name() const override { return "gpu-host"; }
    Memory& memory() override { return host_memory(); }
    const Config& config() const override { return model_.config(); }

    void embed(Exec& ex, float* x, const int* tokens, int rows) override;
    void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) override;
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
    const Model& model_;
    std::vector<float> partials_;  // [n_heads, tiles of max_n, head_size + 2] flash-decoding's tile partials
    std::vector<float> scores_;    // [n_rows, n_heads, max_n] split attention's scores, then weights
};

// The weights W[n_out, n_in] (out, in) of product m at layer l (host pointers into model.w), and
// the rms weights [dim] of norm n at layer l: shared by the host launcher and the CUDA upload.
struct MatrixRef {
    const float* w;  // [n_out, n_in]
    int n_in, n_out;
};
MatrixRef matrix_of(const Weights& w, Matrix m, int l);
const float* norm_of(const Weights& w, Norm n, int l);

}  // namespace kvlab
