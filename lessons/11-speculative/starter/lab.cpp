// Lab 11: the accept/rollback loop of speculative decoding. `lessons/grade 11` grades this file.
//
// An outline (the README explains each line):
//   seq = prompt; the target prefills all of seq but its last token
//   while fewer than `steps` tokens are emitted:
//     n = seq.size(); kk = how many drafts fit (k, fewer near `steps` or max_seq)
//     the draft catches up on the tokens of seq it lacks, then proposes d_1..d_kk (argmax each)
//     rows = target.prefill_rows({seq.back(), d_1, ..., d_kk})      // [kk + 1, vocab_size]
//     for j = 0..kk: emit argmax(row j) with row j as its logits;
//                    stop at j == kk or when the emitted token != d_{j+1}
//     roll both caches back to n + j positions (seq minus its new last token)
#include "grader.h"
#include "lab.h"

namespace kvlab::lab11 {

DecodeRun lab_speculate(CachedDecoder& target, CachedDecoder& draft, int k, std::span<const int> prompt, int steps) {
    (void)target, (void)draft, (void)k, (void)prompt, (void)steps;
    throw lessons::NotImplemented("lab_speculate");
}

}  // namespace kvlab::lab11
