# expect: float64
# The fold adds each tile's o_j and l_j at their own maximum, without rescaling to the common one:
# every path agrees (the same wrong sum), but it is not attention once a row spans two tiles.
s|        l = l \* a + l_j \* b;|        l = l + l_j;  // the mistake: no rescaling|
s|        for (int d = 0; d < head_size; d++) out\[d\] = out\[d\] \* a + o\[std::size_t(d)\] \* b;|        for (int d = 0; d < head_size; d++) out[d] = out[d] + o[std::size_t(d)];|
