# expect: a kvlab cache of max_seq
# The bytes from the textbook formula 2 * n_layers * n_heads * head_size per token, one K and V
# row per query head: right for MHA, but GQA and MQA cache n_kv_heads rows, and MLA none per
# head. bits_per_token is right; cache_bytes does not use it.
s|^    return kvlab::kv_bytes(s, bits, context, batch);|    // the mistake: n_heads where the cache holds n_kv_heads rows (and no MLA case)\
    return (2 * std::int64_t{s.n_layers} * s.n_heads * s.head_size * bits * context * batch + 7) / 8;|
