// Lab 1: why decoding is slow. Fill in the three TODOs; `lessons/grade 1` grades this file.
//
// Every kernel adds its own count to Exec::flops as it runs (core/kernels.cpp, the lines
// `ex.flops += ...`; CpuBackend::causal_attention in core/cpu_backend.cpp adds the rest of naive
// attention). A step is the layer code of core/decode.cpp: per layer, on every row of the step,
//   rmsnorm; q, k, v products; RoPE on q and k; attention; wo product; residual add;
//   rmsnorm; w1 and w3 products; silu_mul; w2 product; residual add
// then, on the last row only, the final rmsnorm and the classifier. Only attention differs
// between the decoders. The embedding is a copy: no FLOPs.
//
// Glossary (core/config.h): c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
// c.head_size() = dim / n_heads, c.kv_dim() = n_kv_heads * head_size, c.vocab_size.
// Count in std::uint64_t: the grader compares exact integers.
#include "grader.h"
#include "lab.h"

namespace kvlab::lab01 {

// TODO 1: naive decode over T tokens. Every layer runs T rows; attention per head builds the
// T x T scores S = Q K^T as a full product, divides the entries j <= i by sqrt(head_size),
// softmaxes every row of T entries (masked ones included), and multiplies P V as a full product.
std::uint64_t naive_step_flops(const Config& c, int T) {
    (void)c, (void)T;
    throw lessons::NotImplemented("naive_step_flops");
}

// TODO 2: one cached decode step at position T - 1. Every layer runs one row; its attention,
// per head, is attention_row over T cached positions (core/kernels.h, attention_row_flops).
std::uint64_t cached_step_flops(const Config& c, int T) {
    (void)c, (void)T;
    throw lessons::NotImplemented("cached_step_flops");
}

// TODO 3: prefill of P tokens into an empty cache. Every layer runs P rows; row i's attention
// reads positions 0..i, per head. The classifier still runs on the last row only.
std::uint64_t prefill_flops(const Config& c, int P) {
    (void)c, (void)P;
    throw lessons::NotImplemented("prefill_flops");
}

}  // namespace kvlab::lab01
