# expect: RoPE key
# MLA caches the compressed latent only, forgetting the small decoupled RoPE key that is cached
# beside it (RoPE cannot be folded into the latent's up-projection).
s|^std::int64_t bits_per_token(const PublishedShape& s, int bits) { return kvlab::kv_bits_per_token(s, bits); }|std::int64_t bits_per_token(const PublishedShape\& s, int bits) {\
    if (s.mla_latent > 0) return std::int64_t{s.n_layers} * s.mla_latent * bits;  // the mistake: no RoPE key\
    return kvlab::kv_bits_per_token(s, bits);\
}|
