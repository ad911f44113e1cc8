// Lab 6, reference solution: kvlab's own memory model (core/memory_model.cpp: kv_bits_per_token,
// kv_bytes) and head map (core/backend.cpp: kv_head_map), called as they are.
#include "backend.h"
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
    Config c;
    c.n_heads = n_heads;
    c.n_kv_heads = n_kv_heads;
    return kvlab::kv_head_map(c);
}

}  // namespace kvlab::lab06
