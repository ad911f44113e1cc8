kvlab_lab(08 08-sharing WRONG hash_ignores_model hash_ignores_parent retain_forgets_owner cow_no_copy cow_ignores_published release_frees_published evicts_lowest evict_keeps_hash lookup_out_of_range evicted_never_set publish_overwrites
          FAULT_EQUIVALENT "key.hash()")
