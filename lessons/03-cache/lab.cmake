kvlab_lab(03 03-cache WRONG reads_before_write forgets_to_poison seq_major_slot slot_one_past)
