// expect: RoPE key
// A plausible mistake: MLA caches the compressed latent only, forgetting the small decoupled
// RoPE key that is cached beside it (RoPE cannot be folded into the latent's up-projection).
#include "backend.h"
#include "lab.h"

namespace kvlab::lab06 {

std::string attention_kind(const PublishedShape& s) {
    if (s.mla_latent > 0) return "MLA";
    if (s.n_kv_heads == s.n_heads) return "MHA";
    return s.n_kv_heads == 1 ? "MQA" : "GQA";
}

std::int64_t bits_per_token(const PublishedShape& s, int bits) {
    if (s.mla_latent > 0) return std::int64_t{s.n_layers} * s.mla_latent * bits;  // the RoPE key is missing
    return kvlab::kv_bits_per_token(s, bits);
}

std::int64_t cache_bytes(const PublishedShape& s, int bits, std::int64_t context, std::int64_t batch) {
    const std::int64_t total = bits_per_token(s, bits) * context * batch;
    return (total + 7) / 8;
}

std::vector<int> kv_head_map(int n_heads, int n_kv_heads) {
    Config c;
    c.n_heads = n_heads;
    c.n_kv_heads = n_kv_heads;
    return kvlab::kv_head_map(c);
}

}  // namespace kvlab::lab06
