kvlab_lab(02 02-causal-attention WRONG mask_off_by_one std_exp)
