#include "sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "config.h"
#include "numerics.h"

namespace kvlab {

std::uint32_t random_u32(std::uint64_t& state) {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return static_cast<std::uint32_t>((state * 0x2545F4914F6CDD1Dull) >> 32);
}

float random_f32(std::uint64_t& state) { return static_cast<float>(random_u32(state) >> 8) / 16777216.0f; }

Sampler::Sampler(int vocab_size, float temperature, float top_p, std::uint64_t seed)
    : vocab_size_(vocab_size), temperature_(temperature), top_p_(top_p), rng_state_(seed) {
    if (vocab_size <= 0) throw Error(fmt::format("sampler: vocab_size must be positive, got {}", vocab_size));
    if (!(temperature >= 0.0f) || std::isinf(temperature))
        throw Error(fmt::format("sampler: temperature must be finite and >= 0, got {}", temperature));
    if (!(top_p >= 0.0f && top_p <= 1.0f)) throw Error(fmt::format("sampler: top_p must be in [0, 1], got {}", top_p));
    candidates_.reserve(static_cast<std::size_t>(vocab_size));
}

int argmax(const std::vector<float>& logits) {
    int best = 0;
    for (int i = 1; i < int(logits.size()); i++)
        if (logits[std::size_t(i)] > logits[std::size_t(best)]) best = i;  // strict: the first maximum wins
    return best;
}

int Sampler::sample(std::vector<float>& logits) {
    const int n = vocab_size_;
    if (logits.size() != static_cast<std::size_t>(n))
        throw Error(fmt::format("sampler: got {} logits for vocab_size={}", logits.size(), n));
    // A NaN logit means the forward pass is broken; run.c would quietly pick some token.
    for (int i = 0; i < n; i++)
        if (std::isnan(logits[static_cast<std::size_t>(i)])) throw Error(fmt::format("sampler: logits[{}] is NaN", i));

    // Greedy: the first index of the largest logit (strict '>').
    if (temperature_ == 0.0f) return argmax(logits);

    // Softmax of logits / temperature, in place, with the max subtracted so exp cannot overflow.
    for (float& x : logits) x /= temperature_;
    const float max_val = *std::max_element(logits.begin(), logits.end());
    if (!std::isfinite(max_val))
        throw Error(
            fmt::format("sampler: the largest logit / temperature is {} (temperature={})", max_val, temperature_));
    float sum = 0.0f;
    for (float& x : logits) {
        x = exp_f32(x - max_val);
        sum += x;
    }
    for (float& x : logits) x /= sum;

    // One coin per sampled token, drawn even when the distribution is one-hot, as run.c does.
    const float coin = random_f32(rng_state_);
    if (top_p_ <= 0.0f || top_p_ >= 1.0f) {
        // Multinomial: walk the CDF; rounding can leave coin >= the total, hence the fallback.
        float cdf = 0.0f;
        for (int i = 0; i < n; i++) {
            cdf += logits[static_cast<std::size_t>(i)];
            if (coin < cdf) return i;
        }
        return n - 1;
    }
    return sample_top_p(logits, coin);
}

int Sampler::sample_top_p(const std::vector<float>& probs, float coin) {
    const int n = vocab_size_;
    // run.c's shortcut: a token below (1 - top_p) / (n - 1) is assumed outside the nucleus, so
    // only the rest is sorted. The assumption fails when every prob is below the cutoff (n = 1,
    // or a tiny top_p), where run.c reads out of bounds; we then keep every token instead.
    const float cutoff = (1.0f - top_p_) / static_cast<float>(n - 1);
    candidates_.clear();
    for (int i = 0; i < n; i++)
        if (probs[static_cast<std::size_t>(i)] >= cutoff)
            candidates_.push_back({probs[static_cast<std::size_t>(i)], i});
    if (candidates_.empty())
        for (int i = 0; i < n; i++) candidates_.push_back({probs[static_cast<std::size_t>(i)], i});

    // Descending by prob; stable, so equal probs stay in index order (run.c's qsort leaves ties
    // in an unspecified order).
    std::stable_sort(candidates_.begin(), candidates_.end(),
                     [](const ProbIndex& a, const ProbIndex& b) { return a.prob > b.prob; });

    // The nucleus: the shortest prefix whose mass exceeds top_p (or all candidates).
    float cumulative = 0.0f;
    std::size_t last = candidates_.size() - 1;
    for (std::size_t i = 0; i < candidates_.size(); i++) {
        cumulative += candidates_[i].prob;
        if (cumulative > top_p_) {
            last = i;
            break;
        }
    }

    // Sample within the nucleus, its mass rescaled to 1 by scaling the coin instead.
    const float r = coin * cumulative;
    float cdf = 0.0f;
    for (std::size_t i = 0; i <= last; i++) {
        cdf += candidates_[i].prob;
        if (r < cdf) return candidates_[i].index;
    }
    return candidates_[last].index;
}

}  // namespace kvlab
