// kvlab core: a continuous-batching scheduler, as serving engines run one (vLLM's scheduler,
// SGLang's, nano-vllm's), over one paged block pool and one CachedDecoder.
//
// Requests arrive over time with a prompt and a number of tokens to generate (greedily). Each
// step:
//   1. every running request that has finished its prompt gets one decode row; when the pool
//      cannot give them the blocks they need, the request admitted last is preempted (by
//      recompute: its blocks are freed and it waits to prefill its prompt and output again; or by
//      swap: its rows are copied to host memory, its blocks freed, and copied back into new
//      blocks when it resumes), until the rest fit;
//   2. the rest of the step's token budget (max_batch_tokens) goes, first come first served, to
//      requests still prefilling (a chunk each, as big as the budget and the pool allow), then to
//      waiting requests (resumed ones first), each first mapping the longest prefix the pool has
//      cached (prefix caching);
//   3. every row runs in one batched step (CachedDecoder::step), and each request whose last row
//      ended its prompt or decoded a token takes the argmax as its next token.
// Batching, chunking, preemption and prefix hits never change a bit of a request's logits: each
// equals decoding the request alone (core/NUMERICS.md; `kvlab verify serve` checks it).
//
// vLLM's words: waiting and running queues, max_num_batched_tokens (max_batch_tokens),
// num_gpu_blocks (n_blocks), enable_prefix_caching, preemption_mode recompute or swap.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "decode.h"
#include "paged.h"

namespace kvlab {

enum class Preemption { recompute, swap };

// Rows swapped out, K then V, each [n_layers, n_kv_heads, T, row_bytes], as they are restored.
using SwapTransform =
    std::function<void(std::vector<std::uint8_t>& k, std::vector<std::uint8_t>& v, int T, std::int64_t row_bytes)>;

struct SchedulerConfig {
    int block_size = 16;
    int n_blocks = 0;            // blocks in the pool (> 0)
    int max_batch_tokens = 256;  // rows per step, prefill chunks and decode rows together
    int max_model_len = 0;       // a request's prompt plus its output (0: the model's max_seq)
    bool prefix_caching = true;
    Preemption preemption = Preemption::recompute;
    KVFormat kv_format = KVFormat::fp32;  // the pool's
    // Admission leaves this share of the blocks (rounded up) free while requests run: fewer
    // preemptions, less concurrency (vLLM's watermark, 0.01).
    double watermark = 0.01;
    // The tier below the pool (block_store.h), not owned, outliving the scheduler; null: none.
    // Evicted published blocks go there, and admission fetches prefix blocks the pool lacks.
    BlockStore* store = nullptr;
    // The attention every step runs (tiled_attention.h); naive decode must run the same to match.
    AttentionSpec attention;
    // The kernels' threads (kernels.h Exec), >= 1; they split only independent outputs, so any
    // count gives the same bits.
    int n_threads = 1;
};

struct ServeRequest {
    std::vector<int> prompt;
    int max_new_tokens = 1;  // tokens to generate greedily (>= 1)
    int arrival = 0;         // the step it arrives at
};

// What became of a request.
struct ServeResult {
    std::vector<int> output;    // [max_new_tokens] the greedy tokens
    std::vector<float> logits;  // [max_new_tokens, vocab_size] row i: what output[i] was chosen from
    int first_token_step = -1;  // the step that produced output[0]
    int finish_step = -1;
    int preemptions = 0;
    int prefix_hit = 0;  // positions its (last) admission mapped from the prefix cache
    int store_hit = 0;   // of those, positions restored from the store
};

// What one step did.
struct ServeStep {
    int step = 0;
    int decode_rows = 0, prefill_rows = 0;
    int running = 0, waiting = 0;
    int admitted = 0, preempted = 0, finished = 0;
    int blocks_used = 0;
};

class Scheduler {
public:
    // Makes the pool (config, block_size, n_blocks, prefix_caching, memory): the verification suite
    // plants a bug in a pool this way, from outside (proofs/planted.h). Empty: a BlockPool.
    using PoolFactory = std::function<std::unique_ptr<BlockPool>(const Config&, int, int, bool, Memory&)>;
    // Runs on `backend` (the model's, which must outlive the scheduler). Throws Error for a
    // configuration that cannot serve one request of max_model_len.
    Scheduler(Backend& backend, const Model& model, const SchedulerConfig& config, const PoolFactory& make_pool = {});
    ~Scheduler();
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    // Queues a request; returns its id (0, 1, ...). Throws Error for one that can never run (an
    // empty prompt, a token outside the vocabulary, prompt + output past max_model_len).
    int add(const ServeRequest& request);
    // One step (the requests whose arrival has come are considered); false when nothing is left.
    bool step();
    bool done() const;
    int steps() const { return step_; }
    const ServeResult& result(int id) const;
    const std::vector<ServeStep>& history() const { return history_; }
    const SchedulerConfig& config() const { return config_; }
    // The block table of every request holding blocks now, by id (the viewer draws them).
    std::vector<std::pair<int, std::vector<int>>> block_tables() const;
    BlockPool& pool() { return *pool_; }
    const BlockPool& pool() const { return *pool_; }

    // Applied to a swapped-out request's saved rows before they are restored; empty in kvlab
    // itself. The verification suite plants a bug this way (proofs/planted.h), from outside.
    SwapTransform swap_transform;

private:
    struct Live;
    struct Batch {  // the rows planned for one step
        std::vector<Cache*> caches;
        std::vector<std::vector<int>> rows;
        std::vector<int> who;  // the request of each entry
        int budget = 0;        // rows the step may still take
    };
    Live& live(int id);
    std::vector<int> decoding();
    int room(const Live& r, int want, int headroom) const;
    void take(int id, int n, Batch& batch);
    void preempt(int id);
    void swap_out(Live& r);
    void swap_in(Live& r);
    void admit(int id, Batch& batch);
    void finish_rows(std::span<const int> who, const std::vector<float>& logits);

    const Model& model_;
    SchedulerConfig config_;
    std::unique_ptr<BlockPool> pool_;
    std::unique_ptr<CachedDecoder> decoder_;
    std::vector<ServeRequest> requests_;
    std::vector<ServeResult> results_;
    std::map<int, std::unique_ptr<Live>> live_;  // admitted (running, prefilling) or preempted, by id
    std::vector<int> running_;                   // admission order
    std::vector<int> waiting_;                   // arrived, not running: resumed ones first, then by id
    int next_arrival_ = 0;                       // requests_ below this have been queued
    int step_ = 0;
    int planned_ = 0;  // blocks the step being planned will take
    std::vector<ServeStep> history_;
};

}  // namespace kvlab
