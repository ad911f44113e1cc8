kvlab_lab(07 07-paging WRONG slot_wrong_block hands_out_twice)
