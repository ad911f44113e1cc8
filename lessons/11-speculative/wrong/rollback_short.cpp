// expect: differ from plain greedy decode
// A plausible mistake: after a rejection the caches are rolled back one position short, so one
// rejected draft's K and V rows stay in the cache and every later step attends to them.
#include "lab.h"

namespace kvlab::lab11 {

DecodeRun lab_speculate(CachedDecoder& target, CachedDecoder& draft, int k, std::span<const int> prompt, int steps) {
    SpeculativeDecoder d(target, draft, k);
    d.mutant = Mutant::spec_rollback_short;
    return d.generate(prompt, steps);
}

}  // namespace kvlab::lab11
