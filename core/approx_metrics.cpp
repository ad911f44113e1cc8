#include "approx_metrics.h"

#include <fmt/format.h>

#include <cassert>
#include <cmath>
#include <cstddef>
#include <vector>

#include "config.h"

namespace kvlab {

namespace {

// log softmax(x), in double, with the maximum subtracted so no exp overflows.
std::vector<double> log_softmax(std::span<const float> x) {
    double hi = x[0];
    for (float v : x) hi = std::fmax(hi, double(v));
    double sum = 0;
    for (float v : x) sum += std::exp(double(v) - hi);
    const double log_sum = std::log(sum);
    std::vector<double> out(x.size());  // [vocab]
    for (std::size_t i = 0; i < x.size(); i++) out[i] = double(x[i]) - hi - log_sum;
    assert(out.size() == x.size());
    return out;
}

std::size_t argmax(std::span<const float> x) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < x.size(); i++)
        if (x[i] > x[best]) best = i;  // strict: the first index wins a tie
    return best;
}

}  // namespace

LogitError compare_logits(std::span<const float> exact, std::span<const float> approx) {
    if (exact.size() != approx.size())
        throw Error(fmt::format("compare_logits: {} exact logits but {} approximate", exact.size(), approx.size()));
    LogitError e;
    if (exact.empty()) return e;
    for (std::size_t i = 0; i < exact.size(); i++) {
        const double d = std::fabs(double(exact[i]) - double(approx[i]));
        if (!(d <= e.max_abs)) e.max_abs = d;  // so a NaN sticks
    }
    const std::vector<double> lp = log_softmax(exact), lq = log_softmax(approx);
    for (std::size_t i = 0; i < exact.size(); i++) {
        const double p = std::exp(lp[i]);
        if (p > 0 || std::isnan(p)) e.kl += p * (lp[i] - lq[i]);  // 0 log 0 = 0
    }
    if (e.kl < 0) e.kl = 0;  // rounding; KL is never negative
    e.top1_agree = argmax(exact) == argmax(approx);
    return e;
}

void ErrorSummary::add(const LogitError& e) {
    steps++;
    if (!(e.max_abs <= max_abs)) max_abs = e.max_abs;
    if (!(e.kl <= max_kl)) max_kl = e.kl;
    sum_kl += e.kl;
    top1_agree += e.top1_agree;
}

}  // namespace kvlab
