kvlab_lab(10 10-gpu-kernel WRONG split_pv std_exp reads_next_slot)
