// kvlab core: Multi-head Latent Attention (DeepSeek-V2/V3), a model whose cache holds one latent
// per position and layer instead of every head's K and V.
//
// Per layer, for a normed row x at position pos:
//   q_C = x W_Q  [n_heads, head_size]       q_R = rope(x W_QR, pos)  [n_heads, rope_dim]
//   c   = x W_DKV  [rank]                   k_R = rope(x W_KR, pos)  [rope_dim], one for all heads
// and the cache keeps only (c, k_R): rank + rope_dim floats per position and layer. Head h's key
// and value of position t are rebuilt from the latent, k_C = c_t W_UK_h and v = c_t W_UV_h, and
//   score_h(t) = ([q_C,h ; q_R,h] · [k_C,h(t) ; k_R(t)]) / sqrt(head_size + rope_dim).
// Two ways to run it, as engines do:
//   rebuild   every step rebuilds k_C and v of every attended position (a product over the
//             latents), then attends per head over head_size + rope_dim
//   absorbed  W_UK folds into the query (q~_h = W_UK_h q_C,h: rank floats) and W_UV into the
//             output; attention runs over the cached rows themselves, [c ; k_R], and the weighted
//             sum of latents goes through W_UV_h at the end
// In real numbers they are equal; in floats they sum different products, so they differ by
// rounding. Each is bitwise equal to its own naive decode, which recomputes every position's
// latent every step and runs the same form (tests/test_mla.cpp, `kvlab verify mla-rebuild`,
// `mla-absorbed`); between the two forms only a bound holds.
//
// The model is a random-model shape option (random_mla_model): dim, hidden_dim, n_layers,
// n_heads, vocab_size and max_seq from a Config (head_size = dim / n_heads; n_kv_heads unused),
// plus rank and rope_dim. It runs on the CPU's kernels (kernels.h), one thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "config.h"
#include "kernels.h"
#include "model.h"

namespace kvlab {

struct MlaConfig {
    Config base;       // dim, hidden_dim, n_layers, n_heads, vocab_size, max_seq; head_size = dim / n_heads
    int rank = 0;      // the latent's width (DeepSeek's kv_lora_rank)
    int rope_dim = 0;  // the shared RoPE key's width (qk_rope_head_dim), even
    int head_size() const { return base.head_size(); }
    int row() const { return rank + rope_dim; }  // floats cached per position and layer
    // Throws Error naming the first field that makes no sense.
    void validate() const;
    std::string describe() const;  // the base's, then "rank=R rope_dim=D"
};

struct MlaModel {
    MlaConfig config;
    // Products are W[n_in, n_out] (matmul's layout), per layer.
    std::vector<float> token_embedding;   // [vocab_size, dim], also the classifier
    std::vector<float> rms_att, rms_ffn;  // [n_layers, dim]
    std::vector<float> wq;                // [n_layers, dim, n_heads * head_size]
    std::vector<float> wqr;               // [n_layers, dim, n_heads * rope_dim]
    std::vector<float> wdkv;              // [n_layers, dim, rank]
    std::vector<float> wkr;               // [n_layers, dim, rope_dim]
    std::vector<float> wuk;               // [n_layers, rank, n_heads * head_size]
    std::vector<float> wuv;               // [n_layers, rank, n_heads * head_size]
    std::vector<float> wuk_t;             // [n_layers, n_heads, head_size, rank]: W_UK_h transposed (absorbed)
    std::vector<float> wo;                // [n_layers, n_heads * head_size, dim]
    std::vector<float> w1, w3;            // [n_layers, dim, hidden_dim]
    std::vector<float> w2;                // [n_layers, hidden_dim, dim]
    std::vector<float> rms_final;         // [dim]
    std::vector<float> wcls;              // [dim, vocab_size]: token_embedding transposed (tied)
    RopeTable rope;                       // max_seq x rope_dim / 2
};

// Weights drawn as random_model draws them (splitmix64, standard deviation 1/sqrt(fan_in)).
MlaModel random_mla_model(const MlaConfig& config, std::uint64_t seed);

// The model with its latent cut to `rank` (< its own): per layer, the latent is projected on the
// top `rank` left singular vectors U_r of [W_UK | W_UV] (computed in double, Jacobi on the Gram
// matrix), so W_DKV becomes W_DKV U_r and W_UK, W_UV become U_r^T W_UK, U_r^T W_UV: the rank-r
// map from latent to keys and values closest to the model's, with no retraining. `kvlab
// frontier` measures what each rank costs. Throws Error for rank outside 1..model's rank.
MlaModel truncate_rank(const MlaModel& model, int rank);

enum class MlaForm { rebuild, absorbed };
std::string_view to_string(MlaForm form);

// The latent cache: for each layer and position, c then k_R. Exact: nothing is dropped.
class MlaCache {
public:
    explicit MlaCache(const MlaConfig& config);
    int length() const { return length_; }
    // Rows [n_layers][max_seq][rank + rope_dim]; layer l's rows start at layer(l).
    float* layer(int l) { return rows_.data() + std::size_t(l) * stride(); }
    const float* layer(int l) const { return rows_.data() + std::size_t(l) * stride(); }
    std::size_t stride() const { return std::size_t(config_.base.max_seq) * std::size_t(config_.row()); }
    // Forgets positions >= n (their rows read NaN again).
    void truncate(int n);
    // Positions now held: the decoder's, after it wrote their rows.
    void set_length(int n) { length_ = n; }
    std::int64_t used_bytes() const;       // the latents of the positions held
    std::int64_t allocated_bytes() const;  // the rows reserved for max_seq positions
    const MlaConfig& config() const { return config_; }

private:
    MlaConfig config_;
    std::vector<float> rows_;  // [n_layers, max_seq, rank + rope_dim], NaN where nothing is held
    int length_ = 0;
};

// Naive decode: every step recomputes every position's latent and runs `form` over all of them;
// returns the last row's logits [vocab_size].
std::vector<float> mla_naive(const MlaModel& model, std::span<const int> tokens, MlaForm form);

// Cached decode in `form`: prefill appends tokens at positions length()..; returns the last row's
// logits [vocab_size].
class MlaDecoder {
public:
    MlaDecoder(const MlaModel& model, MlaCache& cache, MlaForm form);
    const std::vector<float>& prefill(std::span<const int> tokens);
    const std::vector<float>& decode(int token) { return prefill(std::span<const int>(&token, 1)); }

private:
    const MlaModel& model_;
    MlaCache& cache_;
    MlaForm form_;
    std::vector<float> logits_;  // [vocab_size]
};

}  // namespace kvlab
