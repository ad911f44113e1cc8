# expect: must read KV head
# Query heads dealt round-robin over the KV heads (h % n_kv_heads) instead of in groups of
# n_heads / n_kv_heads consecutive heads, the layout the weights were trained in (proofs/planted.h
# plants the same bug as gqa_modulo).
s|^    return kvlab::kv_head_map(c);|    std::vector<int> map(static_cast<std::size_t>(n_heads));  // [n_heads]\
    for (int h = 0; h < n_heads; h++) map[std::size_t(h)] = h % c.n_kv_heads;  // the mistake\
    return map;|
