// kvlab viewer: the serving view's data. A small generated workload runs through the
// continuous-batching scheduler (core/scheduler.h) over a pool with a host-memory prefix store,
// and every step is kept as a snapshot of the pool (which request's table maps each block) and
// of what the step did (admissions, preemptions, prefix hits, store traffic). Every request is
// then checked against decoding it alone.
#pragma once

#include <cstdint>
#include <vector>

#include "model.h"
#include "state.h"

namespace kvlab::viz {

struct ServeSnapshot {
    int step = 0;
    std::vector<int> owner;    // [n_blocks] the lowest request id whose table maps it; -1 free, -2 cached
    std::vector<char> shared;  // [n_blocks] mapped by more than one table (a prefix hit)
    int running = 0, waiting = 0, admitted = 0, preempted = 0, finished = 0;
    int decode_rows = 0, prefill_rows = 0, blocks_used = 0;
    std::int64_t fetched = 0, stored = 0;  // store traffic so far (blocks)
    std::int64_t hit_positions = 0;        // prefix hits so far (positions)
};

struct ServeRun {
    int n_requests = 0, n_blocks = 0, block_size = 0, max_batch_tokens = 0;
    int shown_blocks = 0;  // blocks 0..shown_blocks-1 are drawn: all, or (beams) up to the last ever used
    std::vector<ServeSnapshot> steps;
    int exact = 0;  // requests whose logits equal decoding them alone, bit for bit
    // Beam search instead (settings.beam_width > 0): the owners are beams (0 the best), n_requests
    // the width; exact counts beam steps equal to naive decode of the beam's tokens, of checked.
    bool beams = false;
    int checked = 0;
    std::vector<int> unshared;  // [steps] blocks the beams would hold in caches of their own
};

// Serves settings.serve_requests generated requests (half of them opening with one shared system
// prompt) on `model` with the settings' block size (and --n-blocks, else a pool of about two
// requests' blocks, so that requests wait and are preempted). Throws kvlab::Error when the model's
// max_seq cannot hold the workload.
ServeRun run_serving(const Model& model, const Settings& settings);
// Beam search of settings.beam_width beams over settings.steps steps from `prompt` (core/beam.h),
// one snapshot per step; every beam's logits checked against naive decode of its tokens.
ServeRun run_beam_view(const Model& model, const Settings& settings, const std::vector<int>& prompt);

}  // namespace kvlab::viz
