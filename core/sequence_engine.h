// kvlab core: the sequence engine. Requests come in, continue, fork, roll back and leave; the
// engine keeps each one's cache and runs every prefill and decode step on one CachedDecoder.
// `kvlab pool` drives it from a script, the viewer from its timeline, and the pool-script fuzz
// target through `kvlab pool`; a scheduler would drive it from a queue.
//
// Sequences are PagedCaches over one BlockPool (prefix hits, forks with copy-on-write), or caches
// of any variant made by a function (no fork, no prefix hit). Ids count up from 0 and are never
// reused. Every call checks before it changes anything: a refused call leaves every sequence and
// the pool as they were.
//
// vLLM's words: a sequence is a request, add() is a new request (its prefix hit is
// get_computed_blocks, its prefill the first allocate_slots and model step), free() is
// free(request), step() is one scheduled batch of decode (or chunked prefill) rows.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "cache.h"
#include "decode.h"
#include "paged.h"

namespace kvlab {

class SequenceEngine {
public:
    using MakeCache = std::function<std::unique_ptr<Cache>(int seq_id)>;
    // Sequences are PagedCaches over `pool` (which must outlive the engine), their prefix-cache
    // keys naming the model by model_identity (Weights::fingerprint()).
    SequenceEngine(Backend& backend, BlockPool& pool, std::uint64_t model_identity);
    // Sequences are whatever `make` builds, in the backend's memory.
    SequenceEngine(Backend& backend, MakeCache make);
    ~SequenceEngine();  // frees every sequence (paged: its blocks go back, and the trace says so)
    SequenceEngine(const SequenceEngine&) = delete;
    SequenceEngine& operator=(const SequenceEngine&) = delete;

    // A new sequence for `prompt`: the longest prefix the pool has cached is mapped (prefix_hit),
    // the rest prefilled. Returns its id.
    int add(std::span<const int> prompt);
    // Sequence id continues with `tokens`, as one prefill.
    void append(int id, std::span<const int> tokens);
    // A new sequence mapping every block of `id` (paged only). Returns its id.
    int fork(int id);
    // Sequence id forgets its positions >= n.
    void rollback(int id, int n);
    // Sequence id leaves; paged, its blocks go back to the pool (published ones stay cached).
    void free(int id);
    // One step of several sequences: ids[s] appends tokens[s], every row in one batch. Each
    // sequence's logits() are then its last row's.
    void step(std::span<const int> ids, std::span<const std::vector<int>> tokens);

    bool alive(int id) const { return seqs_.count(id) != 0; }
    std::vector<int> live() const;  // the live ids, ascending
    const Cache& cache(int id) const { return *find(id).cache; }
    // [vocab_size]: the logits of id's last row after its latest add, append or step.
    std::span<const float> logits(int id) const { return find(id).logits; }
    int prefix_hit(int id) const { return find(id).prefix_hit; }  // positions add() mapped
    // Paged: id's block table (logical block -> physical block); empty for other variants.
    std::span<const int> block_table(int id) const;
    BlockPool* pool() const { return pool_; }
    // Every event of the pool and the sequences, in order; consumers slice it per call.
    const std::vector<CacheEvent>& events() const { return events_; }
    void clear_events() { events_.clear(); }
    // The decoder every call runs on: its Exec counts FLOPs, its observer watches attention.
    CachedDecoder& decoder();

private:
    struct Seq {
        std::unique_ptr<Cache> cache;
        std::vector<float> logits;  // [vocab_size]
        int prefix_hit = 0;
    };
    Seq& find(int id);
    const Seq& find(int id) const;
    CachedDecoder& decoder_on(Cache& cache);  // the decoder, its default cache set to `cache`
    void keep_logits(Seq& s, std::span<const float> logits);

    Backend& backend_;
    BlockPool* pool_ = nullptr;
    std::uint64_t model_identity_ = 0;
    MakeCache make_;
    std::vector<CacheEvent> events_;  // declared before the sequences: their destructors record
    std::map<int, Seq> seqs_;
    std::optional<CachedDecoder> decoder_;  // made on the first sequence's cache
    int next_id_ = 0;
};

}  // namespace kvlab
