// expect: exactly half
// A plausible mistake: one K row per KV head per layer, as if V were not cached beside it.
#include "backend.h"
#include "lab.h"

namespace kvlab::lab06 {

std::string attention_kind(const PublishedShape& s) {
    if (s.mla_latent > 0) return "MLA";
    if (s.n_kv_heads == s.n_heads) return "MHA";
    return s.n_kv_heads == 1 ? "MQA" : "GQA";
}

std::int64_t bits_per_token(const PublishedShape& s, int bits) {
    if (s.mla_latent > 0) return kvlab::kv_bits_per_token(s, bits);
    return std::int64_t{s.n_layers} * s.n_kv_heads * s.head_size * bits;  // K only: the factor 2 is missing
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
