# expect: to_bf16(
# bf16 by dropping the low 16 bits, as some fast paths do: every value rounds toward zero, so a
# stored K or V is biased, and by up to a whole step instead of half of one.
s|^    std::uint32_t r = (u + 0x7fffu + ((u >> 16) \& 1u)) >> 16;|    std::uint32_t r = u >> 16;  // the mistake: truncation|
