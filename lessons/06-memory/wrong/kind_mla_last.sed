# expect: it is MLA
# The head counts are tested first and MLA last, so an MLA model whose shape also lists one KV
# head per query head (DeepSeek's n_heads = n_kv_heads) is called MHA, though it caches no per-head
# K or V at all.
/^    if (s.mla_latent > 0) return "MLA";$/d
s|^    return s.n_kv_heads == 1 ? "MQA" : "GQA";|    if (s.n_kv_heads == 1) return "MQA";\
    if (s.mla_latent > 0) return "MLA";  // the mistake: tested after the head counts\
    return "GQA";|
