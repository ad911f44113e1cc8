// kvlab lessons: a Backend that forwards every call to another one. A grader (or a wrong
// solution) derives from it and overrides the one kernel it swaps, so that the decoder runs
// kvlab's own code everywhere else: the student's attention, head map or RoPE positions inside
// an otherwise unchanged decode.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "backend.h"

namespace kvlab::lessons {

class ForwardingBackend : public Backend {
public:
    explicit ForwardingBackend(Backend& inner) : inner_(inner) {}

    std::string_view name() const override { return inner_.name(); }
    Memory& memory() override { return inner_.memory(); }
    const Config& config() const override { return inner_.config(); }
    void run(std::uint64_t key, const std::function<void()>& body) override { inner_.run(key, body); }
    bool capturing() const override { return inner_.capturing(); }

    void embed(Exec& ex, float* x, const int* tokens, int rows) override { inner_.embed(ex, x, tokens, rows); }
    void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) override {
        inner_.matmul(ex, y, ldy, x, ldx, m, l, rows);
    }
    void rmsnorm(Exec& ex, float* out, const float* x, Norm n, int l, int rows) override {
        inner_.rmsnorm(ex, out, x, n, l, rows);
    }
    void rope(Exec& ex, float* vec, int rows, int n_heads, const int* positions) override {
        inner_.rope(ex, vec, rows, n_heads, positions);
    }
    void silu_mul(Exec& ex, float* h1, const float* h3, std::int64_t n) override { inner_.silu_mul(ex, h1, h3, n); }
    void add(Exec& ex, float* x, const float* y, std::int64_t n) override { inner_.add(ex, x, y, n); }
    void causal_attention(Exec& ex, float* att, const float* q, const float* k, const float* v, int T,
                          const int* kv_head, int future) override {
        inner_.causal_attention(ex, att, q, k, v, T, kv_head, future);
    }
    void store_kv(Exec& ex, const RowKV* rows, int n_rows, int l, const float* k, const float* v) override {
        inner_.store_kv(ex, rows, n_rows, l, k, v);
    }
    void attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                   const std::int64_t* slots, int max_n, const int* kv_head, int probe_row, float* probe) override {
        inner_.attention(ex, att, q, rows, n_rows, l, slots, max_n, kv_head, probe_row, probe);
    }

protected:
    Backend& inner() { return inner_; }

private:
    Backend& inner_;
};

}  // namespace kvlab::lessons
