kvlab_lab(04 04-bits WRONG split_k_tiles split_k_keeps_order)
