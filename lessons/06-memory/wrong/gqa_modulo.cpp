// expect: must read KV head
// A plausible mistake: query heads dealt round-robin over the KV heads (h % n_kv_heads) instead
// of in groups of n_heads / n_kv_heads consecutive heads, the layout the weights were trained in
// (core/mutants.h plants the same bug as gqa_modulo).
#include "lab.h"

namespace kvlab::lab06 {

std::string attention_kind(const PublishedShape& s) {
    if (s.mla_latent > 0) return "MLA";
    if (s.n_kv_heads == s.n_heads) return "MHA";
    return s.n_kv_heads == 1 ? "MQA" : "GQA";
}

std::int64_t bits_per_token(const PublishedShape& s, int bits) { return kvlab::kv_bits_per_token(s, bits); }

std::int64_t cache_bytes(const PublishedShape& s, int bits, std::int64_t context, std::int64_t batch) {
    return kvlab::kv_bytes(s, bits, context, batch);
}

std::vector<int> kv_head_map(int n_heads, int n_kv_heads) {
    std::vector<int> map(static_cast<std::size_t>(n_heads));  // [n_heads]
    for (int h = 0; h < n_heads; h++) map[std::size_t(h)] = h % n_kv_heads;
    return map;
}

}  // namespace kvlab::lab06
