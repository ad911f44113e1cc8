// kvlab core: llama2.c's sampler (greedy, multinomial, top-p), bit for bit, so that a run with
// a given --seed draws the same tokens as run.c given the same logits.
#pragma once

#include <cstdint>
#include <vector>

namespace kvlab {

// run.c's xorshift* generator. It advances `state`; a state of 0 stays 0 forever (every draw is
// 0), so callers choose a non-zero seed (run.c substitutes time(NULL) for seed <= 0).
std::uint32_t random_u32(std::uint64_t& state);
// A float in [0, 1) from the top 24 bits of random_u32.
float random_f32(std::uint64_t& state);

// The first index of the largest logit: greedy decoding, as llama2.c picks at temperature 0.
int argmax(const std::vector<float>& logits);

class Sampler {
public:
    // temperature 0 is greedy (argmax); top_p in (0, 1) enables nucleus sampling, 0 or 1 disables
    // it. Throws kvlab::Error for vocab_size <= 0, a negative / NaN / infinite temperature, or
    // top_p outside [0, 1] or NaN.
    Sampler(int vocab_size, float temperature, float top_p, std::uint64_t seed);

    // Picks the next token from logits [vocab_size]. Like run.c it works in place: unless the
    // temperature is 0, logits hold the probabilities afterwards. Throws kvlab::Error when
    // logits.size() != vocab_size, a logit is NaN, or the scaled logits overflow (+inf).
    int sample(std::vector<float>& logits);

    int vocab_size() const { return vocab_size_; }
    float temperature() const { return temperature_; }
    float top_p() const { return top_p_; }

private:
    struct ProbIndex {
        float prob;
        int index;
    };
    int sample_top_p(const std::vector<float>& probs, float coin);

    int vocab_size_;
    float temperature_;
    float top_p_;
    std::uint64_t rng_state_;
    std::vector<ProbIndex> candidates_;  // [vocab_size] scratch for top-p, reused across calls
};

}  // namespace kvlab
