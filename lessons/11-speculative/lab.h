// Lab 11: speculative decoding. You write the accept/rollback loop; the grader checks that it
// emits exactly plain greedy decode's tokens, and the logits each was chosen from, bit for bit.
#pragma once

#include <span>

#include "speculative.h"

namespace kvlab::lab11 {

// Greedy speculative decoding of `steps` tokens after `prompt`: the draft proposes up to k tokens
// per round, the target verifies them in one multi-row step (CachedDecoder::prefill_rows), the
// longest agreeing prefix is kept plus the target's own next token, and both caches are rolled
// back (Cache::truncate) to what was kept. Clears both caches first. The result must equal
// greedy_decode(target, prompt, steps): tokens, and logits [steps, vocab_size] row for row;
// stats.proposed / accepted / target_steps count what happened (step_of may stay empty).
DecodeRun lab_speculate(CachedDecoder& target, CachedDecoder& draft, int k, std::span<const int> prompt, int steps);

}  // namespace kvlab::lab11
