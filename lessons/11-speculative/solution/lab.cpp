// Lab 11, reference solution: kvlab's own SpeculativeDecoder (core/speculative.cpp, generate()
// is the loop the starter outlines).
#include "lab.h"

namespace kvlab::lab11 {

DecodeRun lab_speculate(CachedDecoder& target, CachedDecoder& draft, int k, std::span<const int> prompt, int steps) {
    return SpeculativeDecoder(target, draft, k).generate(prompt, steps);
}

}  // namespace kvlab::lab11
