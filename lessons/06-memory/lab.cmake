kvlab_lab(06 06-memory WRONG forgets_v gqa_modulo mla_without_rope kind_mla_last bytes_per_query_head)
