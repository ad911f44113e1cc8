#include "baseline.h"

#include <algorithm>
#include <cassert>

#include "decode.h"

namespace kvlab {

namespace {

// llama2.c's matmul: out[i] = sum_j w[i][j] * x[j], one output at a time.
void sequential_matvec(Exec& ex, float* out, const float* x, const float* w, int n_in, int n_out) {
    ex.flops += 2ull * std::uint64_t(n_in) * std::uint64_t(n_out);
    for (int i = 0; i < n_out; i++) {
        const float* row = w + std::int64_t(i) * n_in;
        float s = 0.0f;
        for (int j = 0; j < n_in; j++) s = s + row[j] * x[j];
        out[i] = s;
    }
}

}  // namespace

SequentialDotDecoder::SequentialDotDecoder(const Model& model) : model_(model) {
    const Config& c = model.config();
    const int L = c.n_layers, dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
    // The weights are read where they are: llama2.c's [out][in] layout is Weights' own.
    wq_ = model.w.wq, wk_ = model.w.wk, wv_ = model.w.wv, wo_ = model.w.wo;
    w1_ = model.w.w1, w2_ = model.w.w2, w3_ = model.w.w3, wcls_ = model.w.wcls;
    assert(wk_.size() == std::size_t(L) * kv_dim * dim && w2_.size() == std::size_t(L) * dim * hidden);
    key_cache_.assign(std::size_t(L) * c.max_seq * kv_dim, 0.0f);
    value_cache_.assign(std::size_t(L) * c.max_seq * kv_dim, 0.0f);
    for (auto* t : {&x_, &xb_, &q_, &att_, &out_}) t->resize(dim);
    for (auto* t : {&h1_, &h3_}) t->resize(hidden);
    scores_.resize(c.max_seq);
    logits_.resize(c.vocab_size);
}

void SequentialDotDecoder::truncate(int n) {
    assert(n >= 0 && n <= pos_);
    pos_ = n;
}

const std::vector<float>& SequentialDotDecoder::decode(int token) {
    const Config& c = model_.config();
    check_tokens(c, std::span<const int>(&token, 1), pos_);
    const int dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim, hs = c.head_size(), pos = pos_;
    std::copy_n(model_.w.token_embedding.data() + std::int64_t(token) * dim, dim, x_.data());
    for (int l = 0; l < c.n_layers; l++) {
        rmsnorm(exec, xb_.data(), x_.data(), model_.w.rms_att.data() + std::int64_t(l) * dim, 1, dim);
        // K and V go straight into row pos of this layer's cache, as run.c does.
        float* k = key_cache_.data() + (std::size_t(l) * c.max_seq + pos) * kv_dim;
        float* v = value_cache_.data() + (std::size_t(l) * c.max_seq + pos) * kv_dim;
        sequential_matvec(exec, q_.data(), xb_.data(), wq_.data() + std::size_t(l) * dim * dim, dim, dim);
        sequential_matvec(exec, k, xb_.data(), wk_.data() + std::size_t(l) * dim * kv_dim, dim, kv_dim);
        sequential_matvec(exec, v, xb_.data(), wv_.data() + std::size_t(l) * dim * kv_dim, dim, kv_dim);
        rope(exec, q_.data(), 1, c.n_heads, hs, std::span<const int>(&pos, 1), model_.rope);
        rope(exec, k, 1, c.n_kv_heads, hs, std::span<const int>(&pos, 1), model_.rope);
        const float* layer_k = key_cache_.data() + std::size_t(l) * c.max_seq * kv_dim;
        const float* layer_v = value_cache_.data() + std::size_t(l) * c.max_seq * kv_dim;
        for (int h = 0; h < c.n_heads; h++) {
            const int off = (h / c.group()) * hs;
            attention_row(
                att_.data() + h * hs, q_.data() + h * hs, hs, pos + 1,
                [&](int t) { return layer_k + std::size_t(t) * kv_dim + off; },
                [&](int t) { return layer_v + std::size_t(t) * kv_dim + off; }, scores_.data());
            exec.flops += attention_row_flops(hs, pos + 1);
        }
        sequential_matvec(exec, out_.data(), att_.data(), wo_.data() + std::size_t(l) * dim * dim, dim, dim);
        add(exec, x_.data(), out_.data(), dim);
        rmsnorm(exec, xb_.data(), x_.data(), model_.w.rms_ffn.data() + std::int64_t(l) * dim, 1, dim);
        sequential_matvec(exec, h1_.data(), xb_.data(), w1_.data() + std::size_t(l) * dim * hidden, dim, hidden);
        sequential_matvec(exec, h3_.data(), xb_.data(), w3_.data() + std::size_t(l) * dim * hidden, dim, hidden);
        silu_mul(exec, h1_.data(), h3_.data(), hidden);
        sequential_matvec(exec, out_.data(), h1_.data(), w2_.data() + std::size_t(l) * hidden * dim, hidden, dim);
        add(exec, x_.data(), out_.data(), dim);
    }
    rmsnorm(exec, xb_.data(), x_.data(), model_.w.rms_final.data(), 1, dim);
    sequential_matvec(exec, logits_.data(), xb_.data(), wcls_.data(), dim, c.vocab_size);
    pos_++;
    return logits_;
}

}  // namespace kvlab
