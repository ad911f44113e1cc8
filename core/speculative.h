// kvlab core: greedy speculative decoding.
//
// A draft model proposes k tokens greedily, one cheap step each; the target then runs the last
// emitted token and all k drafts as ONE cached step (CachedDecoder::prefill_rows), which gives
// its own logits at every one of those positions. Drafts are accepted while each equals the
// target's argmax; at the first mismatch the target's own token is taken instead, and when all
// k are accepted the target's next token comes free (the bonus). Both caches are then rolled
// back (Cache::truncate) to the accepted sequence.
//
// Every emitted token is the target's argmax of logits computed at its position from exactly
// the accepted tokens before it, and a row of a multi-row step equals that row decoded alone
// (core/NUMERICS.md). So the tokens, and the logits each was chosen from, equal plain greedy
// cached decode with the target bit for bit, whatever the draft: a draft changes only how many
// target steps the same output takes.
#pragma once

#include <span>
#include <vector>

#include "decode.h"

namespace kvlab {

struct SpeculativeStats {
    int proposed = 0;      // draft tokens the target verified
    int accepted = 0;      // of them, equal to the target's argmax (and emitted)
    int target_steps = 0;  // target steps that emitted tokens (the prompt's prefill apart); plain greedy: one a token
    int draft_steps = 0;   // draft steps: a prefill catching up on emitted tokens, or one decode
    // accepted / proposed; 0 when nothing was proposed.
    double acceptance_rate() const { return proposed ? double(accepted) / proposed : 0.0; }
    // accepted / target_steps: each target step emits these plus one token of its own.
    double accepted_per_target_step() const { return target_steps ? double(accepted) / target_steps : 0.0; }
};

// What a greedy run emitted after its prompt.
struct DecodeRun {
    std::vector<int> tokens;     // [steps] the emitted tokens
    std::vector<float> logits;   // [steps, vocab_size] row i: the target's logits token i is the argmax of
    std::vector<int> step_of;    // [steps] the target step (0-based) that emitted token i
    SpeculativeStats stats;      // plain greedy: target_steps = steps, nothing proposed
};

// Plain greedy cached decode, the reference: prefill(prompt), then `steps` argmax tokens, each
// fed back but the last (which needs no position: prompt + steps - 1 <= max_seq). Clears the
// decoder's cache first. Throws Error for a prompt or step count that does not fit.
DecodeRun greedy_decode(CachedDecoder& target, std::span<const int> prompt, int steps);

class SpeculativeDecoder {
public:
    // Two decoders, each on its own cache (both must outlive this). The draft may run any model
    // of the target's vocab_size, the target's own included, on any backend (the target's too).
    // Throws Error for k < 1, another vocab_size, or one decoder or cache given as both.
    SpeculativeDecoder(CachedDecoder& target, CachedDecoder& draft, int k);

    // Clears both caches, then emits `steps` tokens after `prompt`, as greedy_decode would.
    // Throws Error when the prompt or the step count does not fit the target.
    DecodeRun generate(std::span<const int> prompt, int steps);

    int k() const { return k_; }

private:
    CachedDecoder& target_;
    CachedDecoder& draft_;
    int k_;
};

}  // namespace kvlab
