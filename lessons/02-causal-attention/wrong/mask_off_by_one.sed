# expect: the causal mask
# The mask hides j > i + 1 instead of j > i, so row i also sees the next position.
s|if (j > i) {|if (j > i + 1) {  // the mistake|
