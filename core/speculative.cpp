#include "speculative.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>

#include "sampler.h"

namespace kvlab {

namespace {

// The emitted token needs no position of its own, so a run of `steps` needs P + steps - 1.
void check_fits(const Config& c, std::span<const int> prompt, int steps) {
    check_tokens(c, prompt, 0);
    if (steps < 0) throw Error(fmt::format("cannot decode {} steps", steps));
    const std::int64_t needed = std::int64_t(prompt.size()) + steps - 1;
    if (steps > 0 && needed > c.max_seq)
        throw Error(fmt::format("prompt ({} tokens) plus {} steps needs {} positions, more than max_seq = {}",
                                prompt.size(), steps, needed, c.max_seq));
}

// Appends one emitted token and the logits it was chosen from.
void emit(DecodeRun& run, std::span<const float> row, int step) {
    const std::vector<float> logits(row.begin(), row.end());  // [vocab_size]
    run.tokens.push_back(argmax(logits));
    run.logits.insert(run.logits.end(), logits.begin(), logits.end());
    run.step_of.push_back(step);
}

}  // namespace

DecodeRun greedy_decode(CachedDecoder& target, std::span<const int> prompt, int steps) {
    const Config& c = target.backend().config();
    check_fits(c, prompt, steps);
    target.reset();
    DecodeRun run;
    if (steps == 0) return run;
    std::vector<float> logits = target.prefill(prompt);  // [vocab_size]
    for (int s = 0; s < steps; s++) {
        emit(run, logits, s);
        if (s + 1 < steps) logits = target.decode(run.tokens.back());
    }
    run.stats.target_steps = steps;
    assert(run.logits.size() == std::size_t(steps) * c.vocab_size);  // [steps, vocab_size]
    return run;
}

SpeculativeDecoder::SpeculativeDecoder(CachedDecoder& target, CachedDecoder& draft, int k)
    : target_(target), draft_(draft), k_(k) {
    if (k < 1) throw Error(fmt::format("speculative decoding needs k >= 1 draft tokens per step, not {}", k));
    const int tv = target.backend().config().vocab_size, dv = draft.backend().config().vocab_size;
    if (tv != dv)
        throw Error(fmt::format("the draft's vocab_size ({}) differs from the target's ({}): its tokens would mean "
                                "other things",
                                dv, tv));
    // Each rolls back its own cache on its own schedule.
    if (&target == &draft || &target.cache() == &draft.cache())
        throw Error("the draft and the target need a decoder and a cache each");
}

DecodeRun SpeculativeDecoder::generate(std::span<const int> prompt, int steps) {
    const Config& c = target_.backend().config();
    const int V = c.vocab_size;
    const int draft_max_seq = draft_.backend().config().max_seq;
    check_fits(c, prompt, steps);
    target_.reset();
    draft_.reset();
    DecodeRun run;
    if (steps == 0) return run;
    SpeculativeStats& st = run.stats;

    // seq: the prompt and every emitted token. Between steps the target holds all of seq but its
    // last token, which the next step runs first; the draft holds a prefix of seq.
    std::vector<int> seq(prompt.begin(), prompt.end());  // [n]
    if (seq.size() > 1) target_.prefill(std::span<const int>(seq).first(seq.size() - 1));
    std::vector<int> verify;  // [kk + 1] the last token, then the drafts d_1..d_kk
    while (int(run.tokens.size()) < steps) {
        const int n = int(seq.size());
        const int remaining = steps - int(run.tokens.size());
        // The draft runs the tokens of seq it lacks (the last at least: its logits give d_1).
        // It holds at most n - 1 of them (n when a faulty cache kept a rejected row).
        const int from = std::min(draft_.pos(), n - 1);
        const int draft_pos = draft_.pos() + (n - from);  // where the draft stands after catching up
        // Drafts this step: k, fewer where the step would emit past `steps` (it emits up to kk + 1)
        // or a cache has no room: the target writes kk + 1 rows, the draft kk - 1 after catching up.
        const int kk = std::max(0, std::min({k_, remaining - 1, c.max_seq - target_.pos() - 1,
                                             draft_max_seq - draft_pos + 1}));
        verify.assign(1, seq.back());
        if (kk > 0) {
            verify.push_back(argmax(draft_.prefill(std::span<const int>(seq).subspan(std::size_t(from)))));
            st.draft_steps++;
            while (int(verify.size()) < kk + 1) {
                verify.push_back(argmax(draft_.decode(verify.back())));
                st.draft_steps++;
            }
        }
        assert(int(verify.size()) == kk + 1);

        // One target step over the last token and the drafts: row i holds the target's logits
        // after seq + d_1..d_i, the ones plain greedy decode would have at that position.
        const std::vector<float>& rows = target_.prefill_rows(verify);  // [kk + 1, vocab_size]
        assert(rows.size() == std::size_t(kk + 1) * V);
        const int step = st.target_steps++;
        st.proposed += kk;
        // Accept d_{j+1} while it is the target's argmax of row j; the target's own token of the
        // first row that disagrees (or of row kk, the bonus) ends the step.
        int j = 0;
        for (;; j++) {
            emit(run, std::span<const float>(rows).subspan(std::size_t(j) * V, std::size_t(V)), step);
            seq.push_back(run.tokens.back());
            if (j == kk || run.tokens.back() != verify[std::size_t(j) + 1]) break;
            st.accepted++;
        }
        // Roll back to seq but its new last token: the target forgets the rows of rejected drafts,
        // the draft whatever it ran past that (it lacks d_kk when all were accepted).
        const int keep = n + j;
        assert(keep <= target_.pos());
        target_.cache().truncate(keep);
        if (draft_.pos() > keep) draft_.cache().truncate(keep);
    }
    assert(int(run.tokens.size()) == steps);
    assert(run.logits.size() == std::size_t(steps) * V);  // [steps, vocab_size]
    assert(st.accepted + st.target_steps == steps);       // each step: its accepted drafts and one token
    return run;
}

}  // namespace kvlab
