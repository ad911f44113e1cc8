// expect: the cache holds
// A plausible mistake: the loop runs whole chunks only, so a prompt whose length is not a
// multiple of the chunk loses its last rows (and a prompt shorter than one chunk runs nothing).
#include "decode.h"
#include "lab.h"

namespace kvlab::lab05 {

std::vector<float> prefill(Backend& backend, Cache& cache, std::span<const int> prompt, int chunk, Exec& exec) {
    CachedDecoder decoder(backend, cache);
    decoder.exec = exec;
    std::vector<float> logits;
    for (std::size_t i = 0; i + std::size_t(chunk) <= prompt.size(); i += std::size_t(chunk))
        logits = decoder.prefill(prompt.subspan(i, std::size_t(chunk)));
    exec = decoder.exec;
    return logits;
}

}  // namespace kvlab::lab05
