// Lab 1: why decoding is slow. You write, as exact integers, the floating-point operations
// kvlab's kernels count (Exec::flops: one per add, multiply, divide, compare, exp or sqrt) for
// one step of naive decode and one step of cached decode, from the model's shape and the context
// length T. The grader runs the real decoders and compares your numbers with their counters.
#pragma once

#include <cstdint>

#include "config.h"

namespace kvlab::lab01 {

// NaiveDecoder::forward over T tokens (1 <= T <= max_seq): every layer runs all T rows as
// matrices, attention is a T x T matrix per head, the classifier runs on the last row.
std::uint64_t naive_step_flops(const Config& c, int T);

// One CachedDecoder::decode at position T - 1 (1 <= T <= max_seq), the cache already holding
// positions 0..T-2: every layer runs one row, whose attention reads T cached positions.
std::uint64_t cached_step_flops(const Config& c, int T);

// CachedDecoder::prefill of a P-token prompt into an empty cache (1 <= P <= max_seq): every
// layer runs P rows; row i (position i) attends over positions 0..i.
std::uint64_t prefill_flops(const Config& c, int P);

}  // namespace kvlab::lab01
