# expect: to ex.flops
# The product is right, but each multiply-add is counted as one FLOP: rows * n_in * n_out, half
# of what kvlab's kernels count (a multiply and an add are two), so `kvlab demo`'s MFLOP column
# would halve wherever the product runs. Here kvlab's own kernel, its count replaced.
s|^    matmul(ex, y, ldy, x, ldx, w, ldw, rows, n_in, n_out);|    Exec uncounted = ex;  // kvlab's product, its own count set aside\
    matmul(uncounted, y, ldy, x, ldx, w, ldw, rows, n_in, n_out);\
    ex.flops += std::uint64_t(rows) * std::uint64_t(n_in) * std::uint64_t(n_out);  // the mistake: no factor 2|
