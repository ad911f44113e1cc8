# expect: further than any order of summation rounds
# The chunks of k sized n_in / parts, rounded down, so when parts does not divide n_in the last
# n_in % parts terms are never added: a split-K that is no longer the same product.
s|for (int k = n_in \* p / parts; k < n_in \* (p + 1) / parts; k++)|for (int k = n_in / parts * p; k < n_in / parts * (p + 1); k++)  // the mistake|
