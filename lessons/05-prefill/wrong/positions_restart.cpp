// expect: differs
// A plausible mistake: each step numbers its rows 0..n-1 for RoPE, as if every chunk began the
// sequence. The first chunk is right; every later one rotates its q and k to the wrong angles.
// Here kvlab's decoder runs on a backend whose rope() sees chunk-relative positions.
#include <algorithm>

#include "decode.h"
#include "lab.h"

namespace kvlab::lab05 {

namespace {

class ChunkRelativeRope final : public Backend {
public:
    explicit ChunkRelativeRope(Backend& b) : b_(b) {}
    void rope(Exec& ex, float* vec, int rows, int n_heads, const int* positions) override {
        std::vector<int> relative(positions, positions + rows);  // [rows] (host memory: the CPU backend)
        for (int& p : relative) p -= positions[0];
        b_.rope(ex, vec, rows, n_heads, relative.data());
    }
    // Everything else as it is.
    std::string_view name() const override { return b_.name(); }
    Memory& memory() override { return b_.memory(); }
    const Config& config() const override { return b_.config(); }
    void embed(Exec& ex, float* x, const int* tokens, int rows) override { b_.embed(ex, x, tokens, rows); }
    void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) override {
        b_.matmul(ex, y, ldy, x, ldx, m, l, rows);
    }
    void rmsnorm(Exec& ex, float* out, const float* x, Norm n, int l, int rows) override {
        b_.rmsnorm(ex, out, x, n, l, rows);
    }
    void silu_mul(Exec& ex, float* h1, const float* h3, std::int64_t n) override { b_.silu_mul(ex, h1, h3, n); }
    void add(Exec& ex, float* x, const float* y, std::int64_t n) override { b_.add(ex, x, y, n); }
    void causal_attention(Exec& ex, float* att, const float* q, const float* k, const float* v, int T,
                          const int* kv_head, int future) override {
        b_.causal_attention(ex, att, q, k, v, T, kv_head, future);
    }
    void store_kv(Exec& ex, const RowKV* rows, int n_rows, int l, const float* k, const float* v) override {
        b_.store_kv(ex, rows, n_rows, l, k, v);
    }
    void attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                   const std::int64_t* slots, int max_n, const int* kv_head, int probe_row, float* probe) override {
        b_.attention(ex, att, q, rows, n_rows, l, slots, max_n, kv_head, probe_row, probe);
    }

private:
    Backend& b_;
};

}  // namespace

std::vector<float> prefill(Backend& backend, Cache& cache, std::span<const int> prompt, int chunk, Exec& exec) {
    ChunkRelativeRope relative(backend);
    CachedDecoder decoder(relative, cache);
    decoder.exec = exec;
    std::vector<float> logits;
    for (std::size_t i = 0; i < prompt.size(); i += std::size_t(chunk))
        logits = decoder.prefill(prompt.subspan(i, std::min(std::size_t(chunk), prompt.size() - i)));
    exec = decoder.exec;
    return logits;
}

}  // namespace kvlab::lab05
