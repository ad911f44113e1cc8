# expect: max |logit error|
# dequantize computes code * scale and forgets to add the group's minimum back (the zero point),
# so every value comes back shifted by its group's min; quantize is right.
s|{q.scales\[std::size_t(gi)\], q.mins\[std::size_t(gi)\]}|{q.scales[std::size_t(gi)], 0.0f /* the mistake: the min left out */}|
