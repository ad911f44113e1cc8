// kvlab core: the backend interface. The layer code of both decoders (decode.cpp) is written
// once against it; a backend runs the kernels on its own memory.
//
//   Memory    where buffers live: allocate, upload, download, a copy inside the memory (a
//             copy-on-write block), a NaN fill (rows that hold nothing read as NaN)
//   Backend   the model's weights in the backend's own layout, and exactly the kernels of
//             kernels.h: embed, matmul, rmsnorm, rope, softmax (inside attention), silu_mul,
//             add, the masked T x T attention of naive decode and the attention of cached decode
//             over the rows a cache hands out as slot indices, and the K/V store into those slots
//
// Backends: CpuBackend (core/cpu_backend.h, xsimd and OpenMP), and in gpu/ the CUDA backend and
// its host launcher (the same per-thread source run over the whole grid on the CPU). Every
// pointer passed to a Backend or a Memory lives in that backend's memory: host memory for the
// CPU, device memory for CUDA. All of them produce the same bits (NUMERICS.md).
#pragma once

#include <cassert>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config.h"
#include "kernels.h"
#include "kv_format.h"

namespace kvlab {

class Memory {
public:
    virtual ~Memory() = default;
    virtual std::string_view name() const = 0;  // "host", "cuda"
    // Host-visible memory can be read through plain pointers (tests, quantized caches).
    virtual bool host_visible() const = 0;
    // Throws Error (one line) when the memory cannot hold `bytes` more.
    virtual void* allocate(std::int64_t bytes) = 0;
    virtual void deallocate(void* p) = 0;
    virtual void upload(void* dst, const void* src, std::int64_t bytes) = 0;    // host -> this
    virtual void download(void* dst, const void* src, std::int64_t bytes) = 0;  // this -> host
    virtual void copy(void* dst, const void* src, std::int64_t bytes) = 0;      // this -> this
    // n elements of a float `format` (KVFormat's value), each set to the format's quiet NaN. (An
    // integer format's row is filled as fp32 words: its scales and minimums are then NaN.)
    virtual void fill_nan(void* x, std::int64_t n, int format = 0) = 0;
    // Waits for queued work (a device's stream); the host's is synchronous.
    virtual void synchronize() {}
};

// Plain host memory, shared by the CPU backend and the GPU kernels' host launcher.
Memory& host_memory();

// n elements of T in a Memory, freed with it. Move-only.
template <class T>
class Buffer {
public:
    Buffer() = default;
    Buffer(Memory& memory, std::int64_t n)
        : memory_(&memory), data_(n > 0 ? static_cast<T*>(memory.allocate(n * std::int64_t(sizeof(T)))) : nullptr),
          size_(n) {}
    Buffer(Buffer&& o) noexcept { swap(o); }
    Buffer& operator=(Buffer&& o) noexcept {
        Buffer(std::move(o)).swap(*this);
        return *this;
    }
    ~Buffer() {
        if (data_) memory_->deallocate(data_);
    }
    void swap(Buffer& o) noexcept {
        std::swap(memory_, o.memory_);
        std::swap(data_, o.data_);
        std::swap(size_, o.size_);
    }
    T* data() const { return data_; }
    std::int64_t size() const { return size_; }
    std::int64_t bytes() const { return size_ * std::int64_t(sizeof(T)); }
    Memory* memory() const { return memory_; }
    void upload(std::span<const T> host, std::int64_t at = 0) {
        memory_->upload(data_ + at, host.data(), std::int64_t(host.size_bytes()));
    }
    // A copy in the same memory (a cache's snapshot), and the contents of one of this size back.
    Buffer clone() const {
        if (!memory_) return Buffer();
        Buffer c(*memory_, size_);
        if (size_ > 0) memory_->copy(c.data_, data_, bytes());
        return c;
    }
    void copy_from(const Buffer& o) {
        assert(o.size_ == size_);
        if (size_ > 0) memory_->copy(data_, o.data_, bytes());
    }

private:
    Memory* memory_ = nullptr;
    T* data_ = nullptr;
    std::int64_t size_ = 0;
};

// Where one query row finds its cache's K and V. The storage holds rows of head_size elements
// in `format` (kv_format.h: codes of the format, no fp32 copy; row_bytes each, an integer
// format's group scales included); the row of (layer l, KV head h, slot s) is row
// l*layer_rows + h*head_rows + s of k (and of v). Slots are the cache's physical row indices
// (Cache::attended); a slot of -1 is a position whose rows are not held: it reads as NaN.
struct RowKV {
    void* k = nullptr;  // [n_rows, row_bytes] bytes: rows of head_size elements of `format`
    void* v = nullptr;
    const float* scales = nullptr;  // [n_layers, 2] layer l's K scale, then V scale (fp8); null: all 1
    std::int64_t layer_rows = 0;
    std::int64_t head_rows = 0;
    std::int64_t write_slot = -1;  // where this row's own K and V go
    std::int64_t row_bytes = 0;    // kv_row_bytes(format, head_size)
    int n = 0;                     // rows attended: slots[0..n)
    int format = 0;                // KVFormat of the storage
    int group = 0;                 // kv_row_group(format, head_size): an integer format's channels per scale
    // Keys quantized per channel (KIVI, QuantizedCache: head-major, slot = position, and as many
    // positions per channel group as channels per row group: key_group == group). A complete
    // group's key rows hold codes, and its head_size channels' scales and minimums in the rows'
    // own scale slots, channel d's in row g0 + d / (head_size / group), slot d % (head_size /
    // group); the open group's keys are fp32, in the residual.
    float* k_residual =
        nullptr;          // [pairs, key_group, head_size] by position % key_group; pair = row(l, h, 0) / head_rows
    int key_group = 0;    // positions per channel group; 0: keys are rows like values
    int k_quantized = 0;  // positions below this are in complete groups
    KVLAB_HD std::int64_t row(int l, int h, std::int64_t slot) const { return l * layer_rows + h * head_rows + slot; }
    // KIVI: where position t's raw key is while its group is open, and element d of its key.
    KVLAB_HD float* kivi_residual(int l, int h, int t, int head_size) const {
        return k_residual + (row(l, h, 0) / head_rows * key_group + t % key_group) * head_size;
    }
    KVLAB_HD float kivi_key(int l, int h, int t, int head_size, int d) const {
        if (t >= k_quantized) return kivi_residual(l, h, t, head_size)[d];
        const int per_row = head_size / group;  // channel scales one row holds
        const float* meta = kv_int_meta(k_row(row(l, h, t - t % key_group + d / per_row)), d % per_row);
        return quant_decode(kv_int_code(format, k_row(row(l, h, t)), d, group, head_size),
                            QuantRange{meta[0], meta[1]});
    }
    // The first byte of a stored row.
    KVLAB_HD void* k_row(std::int64_t row) const { return static_cast<char*>(k) + row * row_bytes; }
    KVLAB_HD void* v_row(std::int64_t row) const { return static_cast<char*>(v) + row * row_bytes; }
    KVLAB_HD float k_scale(int l) const { return scales ? scales[2 * l] : 1.0f; }
    KVLAB_HD float v_scale(int l) const { return scales ? scales[2 * l + 1] : 1.0f; }
};

// What a step's kernel calls depend on besides buffer contents: buffer addresses, row counts,
// strides. The decoder lists them; a backend that captures steps keys its graphs by them.
struct StepSignature {
    std::vector<std::uint64_t> words;
    void add(std::uint64_t w) { words.push_back(w); }
    void add(const void* p) { words.push_back(std::uint64_t(reinterpret_cast<std::uintptr_t>(p))); }
};

// The weights a product reads, by name; the backend keeps them in its own layout.
enum class Matrix { wq, wk, wv, wo, w1, w2, w3, wcls };
enum class Norm { att, ffn, final };

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string_view name() const = 0;  // "cpu", "gpu", "gpu-host"
    virtual Memory& memory() = 0;
    virtual const Config& config() const = 0;

    // Runs `body`, a step's kernel calls. Equal signatures promise the same calls on the same
    // buffers with the same arguments (only the contents of buffers differ), so a device backend
    // may capture the body once as a graph and replay it (a CUDA Graph, keyed by the signature's
    // hash); the CPU just runs it. While capturing() is true the decoder sizes every per-step
    // argument for the worst case (max_n = max_seq) and keeps host work (cache hooks) out of the
    // body.
    virtual void run(const StepSignature& signature, const std::function<void()>& body) {
        (void)signature;
        body();
    }
    virtual bool capturing() const { return false; }

    // x[rows, dim] = token_embedding[tokens[i]]
    virtual void embed(Exec& ex, float* x, const int* tokens, int rows) = 0;
    // y[rows, n_out] (row stride ldy) = x[rows, n_in] (row stride ldx) · W, W = the matrix `m`
    // of layer l: each element summed over k in increasing order from +0 (kernels.h: matmul).
    virtual void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) = 0;
    // Several products of layer l's matrices with the same x (wq, wk, wv; w1, w3), each exactly
    // as matmul computes it. A backend may run them together (the CPU's threads then meet once);
    // by default they are matmul calls in turn, so a backend that changes matmul changes them too.
    struct Product {
        float* y = nullptr;  // [rows, ldy]
        int ldy = 0;
        Matrix m = Matrix::wq;
    };
    virtual void matmuls(Exec& ex, const float* x, int ldx, int l, int rows, std::span<const Product> products) {
        for (const Product& p : products) matmul(ex, p.y, p.ldy, x, ldx, p.m, l, rows);
    }
    // out[rows, dim] = rmsnorm(x[rows, dim]) with the weights `n` of layer l
    virtual void rmsnorm(Exec& ex, float* out, const float* x, Norm n, int l, int rows) = 0;
    // vec[rows, n_heads * head_size] rotated; row i at logical position positions[i]
    virtual void rope(Exec& ex, float* vec, int rows, int n_heads, const int* positions) = 0;
    // h1[n] = silu(h1[n]) * h3[n]
    virtual void silu_mul(Exec& ex, float* h1, const float* h3, std::int64_t n) = 0;
    // x[n] += y[n]
    virtual void add(Exec& ex, float* x, const float* y, std::int64_t n) = 0;

    // Naive decode's attention over T rows, every head: S = Q_h K_h^T / sqrt(head_size), S[i][j]
    // = -inf for j > i, P = softmax(S) by row, att_h = P V_h (P·V summed over j in increasing
    // order). q, att: [T, dim]; k, v: [T, kv_dim]; kv_head: [n_heads] the KV head each query head
    // reads.
    virtual void causal_attention(Exec& ex, float* att, const float* q, const float* k, const float* v, int T,
                                  const int* kv_head) = 0;

    // Cached decode's write: row i's K and V (k, v: [rows, kv_dim]) into layer l of its cache
    // at rows[i].write_slot, each element stored in rows[i].format with layer l's scales
    // (kv_store, kv_format.h). rows: [rows] RowKV. The format-aware naive decode stores through
    // it too, then reads back with load_kv.
    virtual void store_kv(Exec& ex, const RowKV* rows, int n_rows, int l, const float* k, const float* v) = 0;
    // The inverse: row i's stored K and V at rows[i].write_slot of layer l, decoded as attention
    // decodes them (kv_load), into k, v: [rows, kv_dim].
    virtual void load_kv(Exec& ex, const RowKV* rows, int n_rows, int l, float* k, float* v) = 0;
    // Cached decode's attention at layer l: row i, head h reads rows[i].n slots,
    // slots[i * max_n + j] in increasing logical position, through KV head kv_head[h], with
    // kernels.h's attention_row. q, att: [rows, dim]; slots: [rows, max_n].
    // probe (optional, [n_heads, max_n]): the softmax output of row probe_row, every head.
    virtual void attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                           const std::int64_t* slots, int max_n, const int* kv_head, int probe_row,
                           float* probe) = 0;
};

// The KV head each of n_heads query heads reads: h / (n_heads / n_kv_heads).
std::vector<int> kv_head_map(const Config& c);

}  // namespace kvlab
