# expect: the causal mask
# The mask hides j > i + 1 instead of j > i, so row i also sees the next position. Here kvlab's
# own kernel with its planted bug switched on (future = 1).
s|/\*future=\*/0);|/*future=*/1);  // the mistake|
