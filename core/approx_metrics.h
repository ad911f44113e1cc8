// kvlab core: how far an approximate cache's logits are from the exact ones.
//
// Exact caches are checked bit for bit; approximate ones (quantized, windowed) cannot be, so we
// measure the damage where it matters, in the next-token distribution.
#pragma once

#include <span>

namespace kvlab {

struct LogitError {
    double max_abs = 0;      // max_i |exact_i - approx_i|
    double kl = 0;           // KL(p_exact || p_approx) of the softmaxes, in nats
    bool top1_agree = true;  // same argmax (the first index on ties)
};

// Throws Error when the two have different sizes. Computed in double; a NaN anywhere shows up
// as a NaN max_abs and kl (an evicted row read by mistake must not look like a small error).
LogitError compare_logits(std::span<const float> exact, std::span<const float> approx);

// The errors of every step of a decode, summarized.
struct ErrorSummary {
    int steps = 0;
    double max_abs = 0;  // the largest max_abs of any step
    double max_kl = 0;   // the largest KL of any step
    double sum_kl = 0;   // for the mean
    int top1_agree = 0;  // steps whose argmax agreed

    void add(const LogitError& e);
    double mean_kl() const { return steps == 0 ? 0.0 : sum_kl / steps; }
    double top1_rate() const { return steps == 0 ? 1.0 : double(top1_agree) / steps; }
};

}  // namespace kvlab
