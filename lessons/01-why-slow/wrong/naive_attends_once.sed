# expect: inside each layer
# Naive decode's attention counted like the cached step's, one query row over T positions, when
# naive decode recomputes every row: T query rows, a T x T score matrix.
s|    return matmul(T, head_size, T) + T \* (T + 1) / 2 + T \* softmax_flops(int(T)) + matmul(T, T, head_size);|    return attention_row_flops(int(head_size), int(T));  // the mistake: one row, not T|
