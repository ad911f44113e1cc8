// kvlab gpu: the CUDA backend (built only when CMake finds nvcc). Plain C++ header: the CUDA
// types stay in cuda_backend.cu, so g++-compiled code (device.cpp, tests) can include it.
//
//   CudaMemory   device memory on one stream (cudaMallocAsync); uploads and downloads wait for
//                the stream, copies and NaN fills are queued on it (and so can be captured)
//   CudaBackend  the weights and RoPE tables uploaded once; each Backend call launches the
//                gpu/kernels.h functions, one thread per output element (per (row, head) for
//                attention). run(signature, body) captures a step as a CUDA Graph the first time a
//                signature is seen and replays it afterwards.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "model.h"

struct CUstream_st;
struct CUgraphExec_st;

namespace kvlab {

// Why no CUDA device can run here, in one line ("" when one can).
std::string cuda_unavailable();

class CudaMemory final : public Memory {
public:
    CudaMemory();  // a new stream on the current device; throws Error when there is none
    ~CudaMemory() override;
    CudaMemory(const CudaMemory&) = delete;
    CudaMemory& operator=(const CudaMemory&) = delete;

    std::string_view name() const override { return "cuda"; }
    bool host_visible() const override { return false; }
    void* allocate(std::int64_t bytes) override;
    void deallocate(void* p) override;
    void upload(void* dst, const void* src, std::int64_t bytes) override;
    void download(void* dst, const void* src, std::int64_t bytes) override;
    void copy(void* dst, const void* src, std::int64_t bytes) override;
    void fill_nan(void* x, std::int64_t n, int format = 0) override;
    void synchronize() override;

    CUstream_st* stream() const { return stream_; }
    // While set, copy() queues nothing: the backend re-runs a replayed step's body only to count
    // its FLOPs (the graph does the copies).
    bool paused = false;
    // Counts deallocations: a captured graph holds raw pointers, so any free may leave one
    // pointing at memory that is no longer its own (the backend then drops its graphs).
    std::uint64_t frees() const { return frees_; }

private:
    CUstream_st* stream_ = nullptr;
    std::uint64_t frees_ = 0;
};

// The process's one CUDA memory, made at the first call (a later call tries again after an Error)
// and never destroyed. Every CudaBackend allocates and launches on it: a pool or cache made for one
// model's backend then serves another's (a prefix pool keys its blocks by model), and one stream
// orders the work of all of them, so no backend reads rows another is still writing.
CudaMemory& cuda_memory();

class CudaBackend final : public Backend {
public:
    // Uploads the model's weights and RoPE tables (the model may go away afterwards).
    // graphs: capture cached decode steps as CUDA Graphs (Backend::run).
    explicit CudaBackend(const Model& model, bool graphs = true);
    ~CudaBackend() override;

    std::string_view name() const override { return "gpu"; }
    Memory& memory() override { return memory_; }
    const Config& config() const override { return config_; }

    void run(const StepSignature& signature, const std::function<void()>& body) override;
    bool capturing() const override { return graphs_; }

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

    // What run() did so far: graphs captured, and launches of a cached graph.
    int graphs_captured() const { return captured_; }
    int graph_replays() const { return replays_; }

    // Tests: e^x by numerics.h exp_f32 evaluated on the device for every x[n] (host arrays).
    void exp_f32_on_device(float* out, const float* x, std::int64_t n);

private:
    // Attention's FLOPs depend on each row's count, which lives in device memory: counted when
    // the step's work has been queued (a download; not allowed while capturing).
    struct PendingCount {
        Exec* ex;
        const RowKV* rows;
        int n_rows;
        int tile;  // tiled attention's tile, or 0
    };
    void count_attention(const PendingCount& p);

    Config config_;
    bool shared_classifier_;  // the classifier is emb_ (wcls_ stays empty)
    bool graphs_;
    CudaMemory& memory_;  // cuda_memory()
    // Device copies: [n_layers, out, in] per matrix kind (as Weights), norms, the RoPE table.
    Buffer<float> emb_, wq_, wk_, wv_, wo_, w1_, w2_, w3_, wcls_, rms_att_, rms_ffn_, rms_final_, rope_cos_, rope_sin_;
    // [n_heads, max_seq, head_size + 2] flash-decoding's tile partials, room for tiles of 1 key;
    // allocated with the weights, since a captured step must not allocate.
    Buffer<float> partials_;
    // [kSplitAttentionRows, n_heads, max_seq] split attention's scores (gpu/kernels.h), likewise.
    Buffer<float> scores_;
    const float* weights(Matrix m, int l, int& n_in, int& n_out) const;

    std::map<std::vector<std::uint64_t>, CUgraphExec_st*> graphs_by_key_;  // by StepSignature::words
    std::uint64_t graphs_frees_ = 0;  // memory_.frees() when the graphs above were captured
    bool in_run_ = false;             // inside run(): attention counts are deferred
    bool count_only_ = false;         // replaying: the body only counts FLOPs, launches nothing
    std::vector<PendingCount> pending_;
    int captured_ = 0, replays_ = 0;
};

}  // namespace kvlab
