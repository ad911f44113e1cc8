# expect: the oldest on a tie
# A tie goes to the newest candidate (<= where < belongs): among equally light positions the cache
# then throws away the one it saw last, which H2O's rule keeps.
s|if (best < 0 \|\| scores\[std::size_t(j)\] < scores\[std::size_t(best)\])|if (best < 0 \|\| scores[std::size_t(j)] <= scores[std::size_t(best)])|
