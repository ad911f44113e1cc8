# expect: exactly half
# One K row per KV head per layer, as if V were not cached beside it.
s|^std::int64_t bits_per_token(const PublishedShape& s, int bits) { return kvlab::kv_bits_per_token(s, bits); }|std::int64_t bits_per_token(const PublishedShape\& s, int bits) {\
    if (s.mla_latent > 0) return kvlab::kv_bits_per_token(s, bits);\
    return std::int64_t{s.n_layers} * s.n_kv_heads * s.head_size * bits;  // the mistake: K only, no factor 2\
}|
