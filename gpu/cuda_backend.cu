#include "cuda_backend.h"

#include <cuda_runtime.h>

#include <cassert>
#include <span>
#include <string>

#include "host_backend.h"  // matrix_of, norm_of
#include "kernels.h"

namespace kvlab {

namespace {

// Every CUDA error becomes one line naming the call. (Plain strings: fmt's compile-time format
// checks are not constant expressions for nvcc.)
void check(cudaError_t e, const char* call) {
    if (e == cudaSuccess) return;
    (void)cudaGetLastError();  // clear a non-sticky error, so the next call starts clean
    throw Error(std::string("CUDA: ") + call + " failed: " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")");
}
void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

constexpr int kBlock = 128;  // threads per block
unsigned blocks_for(std::int64_t n) { return unsigned((n + kBlock - 1) / kBlock); }

// The global thread index; each kernel maps it to the indices of the element it owns.
__device__ std::int64_t thread_id() { return std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }

__global__ void embed_kernel(float* x, const float* emb, const int* tokens, int rows, int dim) {
    const std::int64_t id = thread_id();
    if (id < std::int64_t(rows) * dim) gpu::embed_element(x, emb, tokens, dim, int(id / dim), int(id % dim));
}

__global__ void matmul_kernel(float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in,
                              int n_out) {
    const std::int64_t id = thread_id();
    if (id >= std::int64_t(rows) * n_out) return;
    const int r = int(id / n_out), o = int(id % n_out);
    y[std::int64_t(r) * ldy + o] = gpu::matmul_element(x, ldx, w, ldw, n_in, r, o);
}

__global__ void rmsnorm_kernel(float* out, const float* x, const float* w, int rows, int dim) {
    const std::int64_t id = thread_id();
    if (id < std::int64_t(rows) * dim) gpu::rmsnorm_element(out, x, w, dim, int(id / dim), int(id % dim));
}

__global__ void rope_kernel(float* vec, int rows, int n_heads, int head_size, const int* positions, const float* cos,
                            const float* sin, int n_pairs) {
    const std::int64_t id = thread_id();
    if (id >= std::int64_t(rows) * n_heads * n_pairs) return;
    const int j = int(id % n_pairs), h = int(id / n_pairs % n_heads), r = int(id / n_pairs / n_heads);
    gpu::rope_pair(vec, n_heads, head_size, positions, cos, sin, n_pairs, r, h, j);
}

__global__ void silu_mul_kernel(float* h1, const float* h3, std::int64_t n) {
    const std::int64_t id = thread_id();
    if (id < n) gpu::silu_mul_element(h1, h3, id);
}

__global__ void add_kernel(float* x, const float* y, std::int64_t n) {
    const std::int64_t id = thread_id();
    if (id < n) gpu::add_element(x, y, id);
}

__global__ void causal_attention_kernel(float* att, const float* q, const float* k, const float* v, int T, int dim,
                                        int kv_dim, int n_heads, int head_size, const int* kv_head, int tile) {
    const std::int64_t id = thread_id();
    if (id >= std::int64_t(T) * n_heads) return;
    const int i = int(id / n_heads), h = int(id % n_heads);
    gpu::causal_attention_head(att, q, k, v, T, dim, kv_dim, head_size, kv_head[h], i, h, tile);
}

__global__ void store_kv_kernel(const RowKV* rows, int n_rows, int l, const float* k, const float* v, int n_kv_heads,
                                int head_size) {
    const std::int64_t id = thread_id();
    if (id >= std::int64_t(n_rows) * n_kv_heads * head_size) return;
    const int d = int(id % head_size), h = int(id / head_size % n_kv_heads), i = int(id / head_size / n_kv_heads);
    gpu::store_kv_element(rows, l, k, v, n_kv_heads * head_size, head_size, i, h, d);
}

__global__ void load_kv_kernel(const RowKV* rows, int n_rows, int l, float* k, float* v, int n_kv_heads,
                               int head_size) {
    const std::int64_t id = thread_id();
    if (id >= std::int64_t(n_rows) * n_kv_heads * head_size) return;
    const int d = int(id % head_size), h = int(id / head_size % n_kv_heads), i = int(id / head_size / n_kv_heads);
    gpu::load_kv_element(rows, l, k, v, n_kv_heads * head_size, head_size, i, h, d);
}

__global__ void attention_kernel(float* att, const float* q, const RowKV* rows, int n_rows, int l,
                                 const std::int64_t* slots, int max_n, const int* kv_head, int dim, int n_heads,
                                 int head_size, int probe_row, float* probe, int tile) {
    const std::int64_t id = thread_id();
    if (id >= std::int64_t(n_rows) * n_heads) return;
    const int i = int(id / n_heads), h = int(id % n_heads);
    gpu::attention_head(att, q, rows, l, slots, max_n, kv_head, dim, head_size, probe_row, probe, i, h, tile);
}

// Split attention (gpu/kernels.h): a thread per (row, head, key), then per (row, head), then per
// (row, head, channel).
__global__ void attention_score_kernel(float* scores, const float* q, const RowKV* rows, int n_rows, int l,
                                       const std::int64_t* slots, int max_n, const int* kv_head, int dim, int n_heads,
                                       int head_size) {
    const std::int64_t id = thread_id();
    if (id >= std::int64_t(n_rows) * n_heads * max_n) return;
    const int t = int(id % max_n), h = int(id / max_n % n_heads), i = int(id / max_n / n_heads);
    gpu::attention_score_element(scores, q, rows, l, slots, max_n, kv_head, dim, n_heads, head_size, i, h, t);
}

__global__ void attention_softmax_kernel(float* scores, const RowKV* rows, int n_rows, int max_n, int n_heads,
                                         int probe_row, float* probe) {
    const std::int64_t id = thread_id();
    if (id >= std::int64_t(n_rows) * n_heads) return;
    gpu::attention_softmax_row(scores, rows, max_n, n_heads, probe_row, probe, int(id / n_heads), int(id % n_heads));
}

__global__ void attention_value_kernel(float* att, const float* scores, const float* q, const RowKV* rows, int n_rows,
                                       int l, const std::int64_t* slots, int max_n, const int* kv_head, int dim,
                                       int n_heads, int head_size) {
    const std::int64_t id = thread_id();
    if (id >= std::int64_t(n_rows) * n_heads * head_size) return;
    const int d = int(id % head_size), h = int(id / head_size % n_heads), i = int(id / head_size / n_heads);
    gpu::attention_value_element(att, scores, q, rows, l, slots, max_n, kv_head, dim, n_heads, head_size, i, h, d);
}

// Flash-decoding of a one-row step: thread (h, j) computes head h's partial of key tile j, then a
// thread per head folds them (gpu/kernels.h).
__global__ void attention_partial_kernel(float* partials, const float* q, const RowKV* rows, int l,
                                         const std::int64_t* slots, int max_n, const int* kv_head, int dim, int n_heads,
                                         int head_size, int tile) {
    const std::int64_t id = thread_id(), n_tiles = tile_count(max_n, tile);
    if (id >= n_heads * n_tiles) return;
    gpu::attention_tile_partial(partials, q, rows, l, slots, max_n, kv_head, dim, head_size, tile, int(id / n_tiles),
                                int(id % n_tiles));
}

__global__ void fold_partials_kernel(float* att, const float* partials, const RowKV* rows, int max_n, int n_heads,
                                     int head_size, int tile) {
    const std::int64_t id = thread_id();
    if (id >= n_heads) return;
    gpu::fold_tile_partials(att, partials, rows, max_n, head_size, tile, int(id));
}

// Element i of n in `format`: its quiet NaN (kv_store of a NaN, as the host fill writes).
__global__ void fill_nan_kernel(void* x, std::int64_t n, int format) {
    const std::int64_t id = thread_id();
    if (id < n) kv_store(format, x, id, gpu::nan_f32(), 1.0f);
}

__global__ void exp_kernel(float* out, const float* x, std::int64_t n) {
    const std::int64_t id = thread_id();
    if (id < n) out[id] = exp_f32(x[id]);
}

}  // namespace

std::string cuda_unavailable() {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return std::string("no CUDA device can be used here: cudaGetDeviceCount failed: ") + cudaGetErrorString(e);
    }
    if (n == 0) return "no CUDA device can be used here: the CUDA runtime sees no GPU";
    return "";
}

// ---- CudaMemory

CudaMemory::CudaMemory() {
    if (const std::string why = cuda_unavailable(); !why.empty()) throw Error(why);
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    stream_ = s;
}

CudaMemory& cuda_memory() {
    static CudaMemory* const memory = new CudaMemory;  // never destroyed: buffers may outlive any static
    return *memory;
}

CudaMemory::~CudaMemory() {
    // Destructors do not throw: a failure here has already been reported by the call that caused it.
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
}

void* CudaMemory::allocate(std::int64_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaMallocAsync(&p, std::size_t(bytes), stream_);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        std::size_t free = 0, total = 0;
        (void)cudaMemGetInfo(&free, &total);
        throw Error("out of GPU memory: cannot allocate " + std::to_string(bytes) + " bytes (" +
                    std::to_string(free >> 20) + " MiB free of " + std::to_string(total >> 20) + " MiB)");
    }
    check(e, "cudaMallocAsync");
    return p;
}

void CudaMemory::deallocate(void* p) {
    frees_++;
    (void)cudaFreeAsync(p, stream_);  // called from destructors: never throws
}

void CudaMemory::upload(void* dst, const void* src, std::int64_t bytes) {
    // Synchronous: the source is often a vector that dies when the caller returns.
    check(cudaMemcpyAsync(dst, src, std::size_t(bytes), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (upload)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (upload)");
}

void CudaMemory::download(void* dst, const void* src, std::int64_t bytes) {
    check(cudaMemcpyAsync(dst, src, std::size_t(bytes), cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync (download)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (download)");
}

void CudaMemory::copy(void* dst, const void* src, std::int64_t bytes) {
    if (paused || bytes == 0) return;
    check(cudaMemcpyAsync(dst, src, std::size_t(bytes), cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync (copy)");
}

void CudaMemory::fill_nan(void* x, std::int64_t n, int format) {
    if (n == 0) return;
    fill_nan_kernel<<<blocks_for(n), kBlock, 0, stream_>>>(x, n, format);
    check_launch("fill_nan_kernel");
}

void CudaMemory::synchronize() { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

// ---- CudaBackend

namespace {

template <class T>
Buffer<T> device_copy(Memory& memory, std::span<const T> host) {
    Buffer<T> b(memory, std::int64_t(host.size()));
    if (!host.empty()) b.upload(host);
    return b;
}

}  // namespace

CudaBackend::CudaBackend(const Model& model, bool graphs)
    : config_(model.config()), shared_classifier_(model.w.shared_classifier), graphs_(graphs), memory_(cuda_memory()) {
    const Weights& w = model.w;
    w.check_shapes();
    Memory& m = memory_;
    auto up = [&m](std::span<const float> v) { return device_copy(m, v); };
    emb_ = up(w.token_embedding);  // [vocab_size, dim]
    wq_ = up(w.wq), wk_ = up(w.wk), wv_ = up(w.wv), wo_ = up(w.wo);  // [n_layers, out, in]
    w1_ = up(w.w1), w2_ = up(w.w2), w3_ = up(w.w3);
    // [vocab_size, dim]; a shared classifier is the embedding's copy, not a second one
    wcls_ = w.shared_classifier ? Buffer<float>() : up(w.wcls);
    rms_att_ = up(w.rms_att), rms_ffn_ = up(w.rms_ffn), rms_final_ = up(w.rms_final);
    rope_cos_ = up(model.rope.cos), rope_sin_ = up(model.rope.sin);  // [max_seq, head_size / 2]
    assert(rope_cos_.size() == std::int64_t(config_.max_seq) * (config_.head_size() / 2));
    partials_ = Buffer<float>(m, std::int64_t(config_.n_heads) * config_.max_seq * (config_.head_size() + 2));
    scores_ = Buffer<float>(m, std::int64_t(gpu::kSplitAttentionRows) * config_.n_heads * config_.max_seq);
    memory_.synchronize();
}

CudaBackend::~CudaBackend() {
    for (auto& [key, exec] : graphs_by_key_) (void)cudaGraphExecDestroy(exec);
}

const float* CudaBackend::weights(Matrix m, int l, int& n_in, int& n_out) const {
    // The same offsets as the host copy (matrix_of), into the device copy.
    const Config& c = config_;
    const std::int64_t L = l, dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
    switch (m) {
        case Matrix::wq: n_in = c.dim, n_out = c.dim; return wq_.data() + L * dim * dim;
        case Matrix::wk: n_in = c.dim, n_out = c.kv_dim(); return wk_.data() + L * kv_dim * dim;
        case Matrix::wv: n_in = c.dim, n_out = c.kv_dim(); return wv_.data() + L * kv_dim * dim;
        case Matrix::wo: n_in = c.dim, n_out = c.dim; return wo_.data() + L * dim * dim;
        case Matrix::w1: n_in = c.dim, n_out = c.hidden_dim; return w1_.data() + L * hidden * dim;
        case Matrix::w2: n_in = c.hidden_dim, n_out = c.dim; return w2_.data() + L * dim * hidden;
        case Matrix::w3: n_in = c.dim, n_out = c.hidden_dim; return w3_.data() + L * hidden * dim;
        case Matrix::wcls: break;
    }
    n_in = c.dim, n_out = c.vocab_size;
    return shared_classifier_ ? emb_.data() : wcls_.data();
}

void CudaBackend::run(const StepSignature& signature, const std::function<void()>& body) {
    if (!graphs_) return body();
    cudaStream_t stream = memory_.stream();
    // A free since the graphs were captured may have invalidated a pointer one of them holds.
    if (memory_.frees() != graphs_frees_) {
        for (auto& [k, exec] : graphs_by_key_) (void)cudaGraphExecDestroy(exec);
        graphs_by_key_.clear();
        graphs_frees_ = memory_.frees();
    }
    struct Reset {  // leaves the backend out of run() however the body ends
        CudaBackend& b;
        ~Reset() { b.in_run_ = b.count_only_ = b.memory_.paused = false, b.pending_.clear(); }
    } reset{*this};
    in_run_ = true;
    pending_.clear();
    auto it = graphs_by_key_.find(signature.words);
    if (it == graphs_by_key_.end()) {
        cudaGraph_t graph = nullptr;
        check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
        try {
            body();
        } catch (...) {
            if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) (void)cudaGraphDestroy(graph);
            (void)cudaGetLastError();
            throw;
        }
        check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
        cudaGraphExec_t exec = nullptr;
        const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
        (void)cudaGraphDestroy(graph);
        check(e, "cudaGraphInstantiate");
        it = graphs_by_key_.emplace(signature.words, exec).first;
        captured_++;
    } else {
        // The graph does the work; the body runs on the host only to count FLOPs as the CPU does.
        count_only_ = memory_.paused = true;
        body();
        count_only_ = memory_.paused = false;
        replays_++;
    }
    check(cudaGraphLaunch(it->second, stream), "cudaGraphLaunch");
    for (const PendingCount& p : pending_) count_attention(p);  // downloads: after the graph's work
}

void CudaBackend::count_attention(const PendingCount& p) {
    std::vector<RowKV> rows(std::size_t(p.n_rows));  // [n_rows] host copy, for the counts
    memory_.download(rows.data(), p.rows, std::int64_t(sizeof(RowKV)) * p.n_rows);
    const int hs = config_.head_size();
    for (const RowKV& r : rows)
        p.ex->flops +=
            config_.n_heads * (p.tile > 0 ? tiled_attention_flops(hs, r.n, p.tile) : attention_row_flops(hs, r.n));
}

// Each call: count FLOPs with the CPU's formulas, then (unless replaying) one launch.

void CudaBackend::embed(Exec&, float* x, const int* tokens, int rows) {
    if (count_only_ || rows == 0) return;
    const int dim = config_.dim;
    embed_kernel<<<blocks_for(std::int64_t(rows) * dim), kBlock, 0, memory_.stream()>>>(x, emb_.data(), tokens, rows,
                                                                                         dim);
    check_launch("embed_kernel");
}

void CudaBackend::matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) {
    int n_in = 0, n_out = 0;
    const float* w = weights(m, l, n_in, n_out);
    ex.flops += 2ull * std::uint64_t(rows) * std::uint64_t(n_in) * std::uint64_t(n_out);
    if (count_only_ || rows == 0 || n_out == 0) return;
    matmul_kernel<<<blocks_for(std::int64_t(rows) * n_out), kBlock, 0, memory_.stream()>>>(y, ldy, x, ldx, w, n_in,
                                                                                           rows, n_in, n_out);
    check_launch("matmul_kernel");
}

void CudaBackend::rmsnorm(Exec& ex, float* out, const float* x, Norm n, int l, int rows) {
    const int dim = config_.dim;
    ex.flops += std::uint64_t(rows) * (5ull * dim + 4);
    if (count_only_ || rows == 0) return;
    const float* w = n == Norm::att   ? rms_att_.data() + std::int64_t(l) * dim
                     : n == Norm::ffn ? rms_ffn_.data() + std::int64_t(l) * dim
                                      : rms_final_.data();
    rmsnorm_kernel<<<blocks_for(std::int64_t(rows) * dim), kBlock, 0, memory_.stream()>>>(out, x, w, rows, dim);
    check_launch("rmsnorm_kernel");
}

void CudaBackend::rope(Exec& ex, float* vec, int rows, int n_heads, const int* positions) {
    const int head_size = config_.head_size(), n_pairs = head_size / 2;
    ex.flops += 6ull * std::uint64_t(rows) * n_heads * n_pairs;
    const std::int64_t n = std::int64_t(rows) * n_heads * n_pairs;
    if (count_only_ || n == 0) return;
    rope_kernel<<<blocks_for(n), kBlock, 0, memory_.stream()>>>(vec, rows, n_heads, head_size, positions,
                                                                rope_cos_.data(), rope_sin_.data(), n_pairs);
    check_launch("rope_kernel");
}

void CudaBackend::silu_mul(Exec& ex, float* h1, const float* h3, std::int64_t n) {
    ex.flops += 5ull * std::uint64_t(n);
    if (count_only_ || n == 0) return;
    silu_mul_kernel<<<blocks_for(n), kBlock, 0, memory_.stream()>>>(h1, h3, n);
    check_launch("silu_mul_kernel");
}

void CudaBackend::add(Exec& ex, float* x, const float* y, std::int64_t n) {
    ex.flops += std::uint64_t(n);
    if (count_only_ || n == 0) return;
    add_kernel<<<blocks_for(n), kBlock, 0, memory_.stream()>>>(x, y, n);
    check_launch("add_kernel");
}

void CudaBackend::causal_attention(Exec& ex, float* att, const float* q, const float* k, const float* v, int T,
                                   const int* kv_head) {
    const Config& c = config_;
    const int hs = c.head_size();
    const int tile = ex.attention.tiled() ? ex.attention.tile : 0;
    ex.flops += causal_attention_flops(c.n_heads, hs, T, ex.attention);
    if (count_only_ || T == 0) return;
    causal_attention_kernel<<<blocks_for(std::int64_t(T) * c.n_heads), kBlock, 0, memory_.stream()>>>(
        att, q, k, v, T, c.dim, c.kv_dim(), c.n_heads, hs, kv_head, tile);
    check_launch("causal_attention_kernel");
}

void CudaBackend::store_kv(Exec&, const RowKV* rows, int n_rows, int l, const float* k, const float* v) {
    const Config& c = config_;
    const std::int64_t n = std::int64_t(n_rows) * c.n_kv_heads * c.head_size();
    if (count_only_ || n == 0) return;
    store_kv_kernel<<<blocks_for(n), kBlock, 0, memory_.stream()>>>(rows, n_rows, l, k, v, c.n_kv_heads,
                                                                    c.head_size());
    check_launch("store_kv_kernel");
}

void CudaBackend::load_kv(Exec&, const RowKV* rows, int n_rows, int l, float* k, float* v) {
    const Config& c = config_;
    const std::int64_t n = std::int64_t(n_rows) * c.n_kv_heads * c.head_size();
    if (count_only_ || n == 0) return;
    load_kv_kernel<<<blocks_for(n), kBlock, 0, memory_.stream()>>>(rows, n_rows, l, k, v, c.n_kv_heads, c.head_size());
    check_launch("load_kv_kernel");
}

void CudaBackend::attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                            const std::int64_t* slots, int max_n, const int* kv_head, int probe_row, float* probe) {
    const Config& c = config_;
    if (n_rows == 0) return;
    // The counts rows[i].n are in device memory: inside run() they are read once the step is queued.
    const int tile = ex.attention.tiled() ? ex.attention.tile : 0;
    const PendingCount count{&ex, rows, n_rows, tile};
    if (in_run_)
        pending_.push_back(count);
    else
        count_attention(count);
    if (count_only_) return;
    if (tile > 0 && n_rows == 1 && !(probe && probe_row == 0) && max_n <= c.max_seq) {
        const std::int64_t items = std::int64_t(c.n_heads) * tile_count(max_n, tile);
        attention_partial_kernel<<<blocks_for(items), kBlock, 0, memory_.stream()>>>(
            partials_.data(), q, rows, l, slots, max_n, kv_head, c.dim, c.n_heads, c.head_size(), tile);
        check_launch("attention_partial_kernel");
        fold_partials_kernel<<<blocks_for(c.n_heads), kBlock, 0, memory_.stream()>>>(att, partials_.data(), rows, max_n,
                                                                                     c.n_heads, c.head_size(), tile);
        check_launch("fold_partials_kernel");
        return;
    }
    if (tile == 0 && n_rows <= gpu::kSplitAttentionRows && max_n <= c.max_seq) {
        const int hs = c.head_size();
        attention_score_kernel<<<blocks_for(std::int64_t(n_rows) * c.n_heads * max_n), kBlock, 0, memory_.stream()>>>(
            scores_.data(), q, rows, n_rows, l, slots, max_n, kv_head, c.dim, c.n_heads, hs);
        check_launch("attention_score_kernel");
        attention_softmax_kernel<<<blocks_for(std::int64_t(n_rows) * c.n_heads), kBlock, 0, memory_.stream()>>>(
            scores_.data(), rows, n_rows, max_n, c.n_heads, probe_row, probe);
        check_launch("attention_softmax_kernel");
        attention_value_kernel<<<blocks_for(std::int64_t(n_rows) * c.n_heads * hs), kBlock, 0, memory_.stream()>>>(
            att, scores_.data(), q, rows, n_rows, l, slots, max_n, kv_head, c.dim, c.n_heads, hs);
        check_launch("attention_value_kernel");
        return;
    }
    attention_kernel<<<blocks_for(std::int64_t(n_rows) * c.n_heads), kBlock, 0, memory_.stream()>>>(
        att, q, rows, n_rows, l, slots, max_n, kv_head, c.dim, c.n_heads, c.head_size(), probe_row, probe, tile);
    check_launch("attention_kernel");
}

void CudaBackend::exp_f32_on_device(float* out, const float* x, std::int64_t n) {
    Buffer<float> in(memory_, n), res(memory_, n);  // [n]
    in.upload(std::span<const float>(x, std::size_t(n)));
    exp_kernel<<<blocks_for(n), kBlock, 0, memory_.stream()>>>(res.data(), in.data(), n);
    check_launch("exp_kernel");
    memory_.download(out, res.data(), std::int64_t(sizeof(float)) * n);
}

}  // namespace kvlab
