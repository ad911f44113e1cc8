// kvlab core: beam search on forked caches. W beams share their common prefix's blocks in one
// paged pool: a beam that continues with k tokens forks into k children (fork maps every block,
// copy-on-write copies a shared partial block on its first write), beams that fall out of the
// top W are freed, and every beam's next row runs in one batched step. Each beam's logits are
// those of naive decode of its tokens, bit for bit (`kvlab verify beam`).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "decode.h"
#include "paged.h"

namespace kvlab {

struct BeamConfig {
    int width = 4;        // beams kept
    int steps = 16;       // tokens each beam adds after the prompt
    int block_size = 16;  // the pool's
    KVFormat kv_format = KVFormat::fp32;
    AttentionSpec attention;  // what every step runs (tiled_attention.h)
    int n_threads = 1;        // the kernels' threads (kernels.h Exec): any count gives the same bits
};

struct BeamState {
    std::vector<int> tokens;    // the prompt, then the beam's tokens
    double logprob = 0;         // the sum of its tokens' log-probabilities
    std::vector<float> logits;  // [vocab_size] the logits after its last token
    std::vector<int> table;     // [ceil(tokens / block_size)] its cache's block table (the viewer draws it)
};

struct BeamRun {
    std::vector<std::vector<BeamState>> steps;  // [steps + 1] the beams after the prompt, then after each step
    int peak_blocks = 0;                        // the pool's blocks in use, at most
    int peak_unshared_blocks = 0;               // what the same beams would hold in caches of their own, at most
    int n_blocks = 0;                           // the pool's
};

class BeamSearch {
public:
    // Runs on `backend` (the model's; both must outlive the search).
    BeamSearch(Backend& backend, const Model& model, const BeamConfig& config);
    // The search from `prompt` (prompt + steps <= max_seq; Error otherwise). Candidates are ranked
    // by log-probability, then by beam, then by token (deterministic ties).
    BeamRun run(const std::vector<int>& prompt);
    // Maps a chosen candidate's parent beam to the beam whose cache it forks; empty in kvlab
    // itself. The verification suite plants a bug this way (proofs/planted.h), from outside.
    std::function<int(int parent, int n_beams)> parent_transform;

private:
    Backend& backend_;
    const Model& model_;
    BeamConfig config_;
};

}  // namespace kvlab
