// Lab 5, reference solution: kvlab's own cached decoder (core/decode.cpp). CachedDecoder::prefill
// runs its rows as one step (plan_step: the bookkeeping; CachedDecoder::execute: the layers, the
// last row's logits), splitting only where the cache's max_append() requires.
#include <algorithm>

#include "decode.h"
#include "lab.h"

namespace kvlab::lab05 {

std::vector<float> prefill(Backend& backend, Cache& cache, std::span<const int> prompt, int chunk, Exec& exec) {
    CachedDecoder decoder(backend, cache);  // continues at cache.length()
    decoder.exec = exec;
    std::vector<float> logits;
    for (std::size_t i = 0; i < prompt.size(); i += std::size_t(chunk))
        logits = decoder.prefill(prompt.subspan(i, std::min(std::size_t(chunk), prompt.size() - i)));
    exec = decoder.exec;  // the FLOPs counted
    return logits;
}

}  // namespace kvlab::lab05
