# expect: outside the layers
# Every layer counted right, but the step ends at the last layer: the final rmsnorm is there, the
# classifier's product (dim x vocab_size, on the last row) is not.
s|u64 outside_layers(const Config& c) { return rmsnorm(1, c.dim) + matmul(1, c.dim, c.vocab_size); }|u64 outside_layers(const Config\& c) { return rmsnorm(1, c.dim); }  // the mistake: no classifier|
