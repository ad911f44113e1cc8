kvlab_lab(09 09-approximate WRONG per_tensor_scale drops_sinks)
