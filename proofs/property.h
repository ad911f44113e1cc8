// kvlab proofs: running one RapidCheck property quietly, for the verification suite and the
// course's graders (lessons/). A property is a function that draws its inputs and fails with a
// one-line message; a failure is shrunk, and the report is the smallest case RapidCheck found.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config.h"
#include "generators.h"

namespace kvlab {

struct PropertyOutcome {
    bool passed = false;
    int cases = 0;               // cases run (a failing property stops at its first failure)
    std::string counterexample;  // the shrunk failure, in one line ("" when it passed)
};

// Runs `body` on `cases` generated cases from `seed`, printing nothing.
PropertyOutcome check_property(const std::function<void()>& body, int cases, std::uint64_t seed);

// Inside a property: fails the current case with `message`.
[[noreturn]] void fail(std::string message);

// Inside a property: an integer in [lo, hi_inclusive], drawn at full size (generators.h).
template <class T>
T draw(T lo, T hi_inclusive) {
    return *proofs::full_range(lo, T(hi_inclusive + 1));
}

// Inside a property: a tiny model shape, 1-3 layers, 1-4 query heads over any divisor of KV
// heads, head_size 1-8 (with wide_heads, a fifth of the time 15, 16, 17, 48 or 64: the sizes
// where the CPU's attention runs sixteen keys per register), hidden_dim 1-16, vocab_size
// min_vocab-32, max_seq min_seq-kFastMaxSeq. Small enough that naive decode of every prefix
// takes microseconds.
inline constexpr int kFastMaxSeq = 20;
Config draw_config(int min_seq = 1, int min_vocab = 1, bool wide_heads = true);
// Inside a property, for `kvlab verify --profile long`: a thin model (1-2 layers, 1 or 2 query
// heads of head_size 1-4 over 1 or 2 KV heads, or 4 of 1-2 over 2; dim 2-8, hidden_dim 1-8,
// vocab_size 2-16) with a long context: max_seq 8192 an
// eighth of the time, else half the time from draw_size(max(min_seq, 2), 8192) and half in a drawn
// power-of-two octave, so that a naive decode of thousands of positions takes milliseconds, every
// size threshold up to 8192 is reached, and short contexts (cheap: naive decode costs T^2) are
// as common as long ones.
Config draw_long_config(int min_seq = 1);
// Inside a property: an integer in [lo, hi], half the time one of the sizes where kernels and
// caches switch (powers of two and their neighbours, 96-98, 255-258: a length that holds position
// 97 or 257 too), when one lies in the range.
int draw_size(int lo, int hi);
// The sizes every cache under test reaches, kvlab's own or not (a plugin, a server over a pipe, a
// Python class): the fast profile's thin models reach positions 97 and 257, the long profile's
// 4097 and 8191. Inside a property: half the time draw_config(min_seq), half the time a thin model
// (as draw_long_config) whose max_seq is 98, 99, 258 or 259 half the time, else
// draw_size(min_seq, kFastMaxPositions); with long_profile, draw_long_config(min_seq).
inline constexpr int kFastMaxPositions = 260;
Config draw_reaching_config(bool long_profile, int min_seq = 1);
// The sizes draw_size favours, ascending.
const std::vector<int>& size_thresholds();
// Inside a property: a vocabulary size in [lo, kMaxVocab], half the time one where a classifier or
// log-softmax kernel may switch (a block of 256, 1024 or 4096 logits, one short and one over) or
// llama's 32000 and one short of it; else any.
inline constexpr int kMaxVocab = 32000;
int draw_vocab_size(int lo = 1);

// Inside a property: n token ids of c's vocabulary, each drawn (and shrunk) on its own up to
// kPickedTokens of them, else from one drawn seed.
inline constexpr int kPickedTokens = 64;
std::vector<int> draw_tokens(const Config& c, int n);

}  // namespace kvlab
