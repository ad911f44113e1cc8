// kvlab core: decorators. A ForwardingBackend passes every kernel to another backend and a
// ForwardingCache every cache operation to another cache; a subclass overrides the one call it
// changes. That is how code outside core swaps a piece of a decode without a branch inside it:
// a lab grader runs a student's kernel inside kvlab's decoders, and the verification suite
// plants its bugs (proofs/planted.h) from the outside.
#pragma once

#include <cassert>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "backend.h"
#include "cache.h"

namespace kvlab {

class ForwardingBackend : public Backend {
public:
    explicit ForwardingBackend(Backend& inner) : inner_(inner) {}

    std::string_view name() const override { return inner_.name(); }
    Memory& memory() override { return inner_.memory(); }
    const Config& config() const override { return inner_.config(); }
    // A decorator never captures: a graph recorded under the inner backend's keys would replay the
    // undecorated calls (or these in a plain decoder sharing the inner backend). Its steps run as
    // they are.
    void run(const StepSignature&, const std::function<void()>& body) override { body(); }
    bool capturing() const override { return false; }

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
                          const int* kv_head) override {
        inner_.causal_attention(ex, att, q, k, v, T, kv_head);
    }
    void store_kv(Exec& ex, const RowKV* rows, int n_rows, int l, const float* k, const float* v) override {
        inner_.store_kv(ex, rows, n_rows, l, k, v);
    }
    void load_kv(Exec& ex, const RowKV* rows, int n_rows, int l, float* k, float* v) override {
        inner_.load_kv(ex, rows, n_rows, l, k, v);
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

// Every operation goes to `inner`, which holds the tokens, the rows and the bookkeeping; this
// object's own Cache state stays empty. Its events are the inner cache's (set inner's trace).
class ForwardingCache : public Cache {
public:
    explicit ForwardingCache(Cache& inner) : Cache(inner.config()), inner_(inner) { seq_id = inner.seq_id; }

    int length() const override { return inner_.length(); }
    std::span<const int> tokens() const override { return inner_.tokens(); }
    void append(std::span<const int> tokens) override { inner_.append(tokens); }
    void check_append(std::int64_t n) const override { inner_.check_append(n); }
    std::int64_t write_slot(int pos) override { return inner_.write_slot(pos); }
    void stored(int l, std::span<const int> positions) override { inner_.stored(l, positions); }
    void truncate(int n) override { inner_.truncate(n); }
    std::unique_ptr<CacheSnapshot> snapshot(int added) const override { return inner_.snapshot(added); }
    void restore(const CacheSnapshot& s) override { inner_.restore(s); }
    void committed() override { inner_.committed(); }
    std::int64_t slot(int t) const override { return inner_.slot(t); }
    int attended(int pos, std::int64_t* slots, int* positions = nullptr) const override {
        return inner_.attended(pos, slots, positions);
    }
    const KVStorage& storage() const override { return inner_.storage(); }
    RowKV row_kv() const override { return inner_.row_kv(); }
    const float* key(int l, int h, int t) const override { return inner_.key(l, h, t); }
    const float* value(int l, int h, int t) const override { return inner_.value(l, h, t); }
    bool reads_attention() const override { return inner_.reads_attention(); }
    void attention_weights(int l, std::span<const float> w) override { inner_.attention_weights(l, w); }
    void set_kv_format(KVFormat format, std::span<const float> scales = {}) override {
        inner_.set_kv_format(format, scales);
    }
    int max_append() const override { return inner_.max_append(); }
    int max_step() const override { return inner_.max_step(); }
    int attach_prefix(std::span<const int> tokens) override { return inner_.attach_prefix(tokens); }
    MemoryStats memory() const override { return inner_.memory(); }
    std::string name() const override { return inner_.name(); }

protected:
    Cache& inner() { return inner_; }
    const Cache& inner() const { return inner_; }
    // Unreachable: append() and truncate() above never reach this object's own bookkeeping.
    void reserve(int) override { assert(false); }
    void release(int) override { assert(false); }

private:
    Cache& inner_;
};

}  // namespace kvlab
