# expect: the cache holds
# The loop runs whole chunks only, so a prompt whose length is not a multiple of the chunk loses
# its last rows (and a prompt shorter than one chunk runs nothing).
s|for (std::size_t i = 0; i < prompt.size(); i += std::size_t(chunk))|for (std::size_t i = 0; i + std::size_t(chunk) <= prompt.size(); i += std::size_t(chunk))  // the mistake|
s|prompt.subspan(i, std::min(std::size_t(chunk), prompt.size() - i))|prompt.subspan(i, std::size_t(chunk))|
