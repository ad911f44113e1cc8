// Lab 5: prefill versus decode. You write the prefill: the step that runs n prompt rows through
// every layer at once against kvlab's Backend interface (core/backend.h), storing their K and V
// in a cache, and the loop that cuts a prompt into such steps. The grader checks P2 (prefill then
// decode == one token at a time, logits and cache contents bit for bit) on several cache variants
// and measures what a wide step buys.
#pragma once

#include <span>
#include <vector>

#include "backend.h"
#include "cache.h"

namespace kvlab::lab05 {

// Runs `prompt` (P >= 1 tokens) at positions cache.length() .. cache.length() + P - 1 on
// `backend`, at most `chunk` rows per step (chunk >= 1; never more than cache.max_append() at
// once), appending each row's K and V to `cache` (which lives in backend.memory()). Afterwards
// the cache holds exactly what P single-row decode steps would have left in it, bit for bit, and
// the result is the logits [vocab_size] of the prompt's last position. The kernels use exec's
// threads and count their FLOPs in it.
std::vector<float> prefill(Backend& backend, Cache& cache, std::span<const int> prompt, int chunk, Exec& exec);

}  // namespace kvlab::lab05
