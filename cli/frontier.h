// kvlab frontier's parts that stand alone (tests/test_frontier.cpp calls them): the Pareto front
// of (bytes, KL) points, and the mean-pooled GQA conversion of a model.
#pragma once

#include <span>
#include <vector>

#include "model.h"

namespace kvlab::cli {

struct ParetoPoint {
    double bytes = 0;  // KV bytes per token: fewer is better
    double kl = 0;     // mean KL(exact || approx): lower is better
};

// front[i]: whether point i is on the Pareto front, i.e. no other point dominates it (has bytes
// and kl both at most its own, one of them strictly less). Equal points are both on it or both
// off; a point with a NaN or infinite coordinate is never on it and dominates nothing.
// O(n log n): a sweep in increasing bytes.
std::vector<bool> pareto_front(std::span<const ParetoPoint> points);

// An un-uptrained GQA conversion: a copy of `model` with n_kv_heads KV heads, each the mean of
// the wk and wv rows of the group of n_kv_heads(model) / n_kv_heads consecutive heads it
// replaces (query head q reads KV head q / group() before and after). The mean is summed in
// double and rounded once, so heads that are equal pool to themselves bit for bit. Throws Error
// unless n_kv_heads >= 1 divides the model's.
Model pool_kv_heads(const Model& model, int n_kv_heads);

}  // namespace kvlab::cli
