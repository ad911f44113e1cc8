# expect: ran a step of
# The whole prompt in one step, whatever the chunk: every logit and every K and V row is still
# right (a wide step gives the same bits), so only the contract's "at most chunk rows" can see it,
# through the rows each step hands the backend.
s|for (std::size_t i = 0; i < prompt.size(); i += std::size_t(chunk))|for (std::size_t i = 0; i < prompt.size(); i += prompt.size())  // the mistake|
s|prompt.subspan(i, std::min(std::size_t(chunk), prompt.size() - i))|prompt.subspan(i)|
