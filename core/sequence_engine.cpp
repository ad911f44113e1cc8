#include "sequence_engine.h"

#include <fmt/format.h>

#include <cassert>

namespace kvlab {

SequenceEngine::SequenceEngine(Backend& backend, BlockPool& pool, std::uint64_t model_identity)
    : backend_(backend), pool_(&pool), model_identity_(model_identity) {
    pool.trace = &events_;
}

SequenceEngine::SequenceEngine(Backend& backend, MakeCache make) : backend_(backend), make_(std::move(make)) {}

SequenceEngine::~SequenceEngine() {
    seqs_.clear();  // paged: the blocks go back while the trace still listens
    if (pool_) pool_->trace = nullptr;
}

SequenceEngine::Seq& SequenceEngine::find(int id) { return const_cast<Seq&>(std::as_const(*this).find(id)); }

const SequenceEngine::Seq& SequenceEngine::find(int id) const {
    const auto it = seqs_.find(id);
    if (it == seqs_.end()) throw Error(fmt::format("no live sequence {}", id));
    return it->second;
}

CachedDecoder& SequenceEngine::decoder() {
    if (!decoder_) decoder_.emplace(backend_, nullptr);
    return *decoder_;
}

CachedDecoder& SequenceEngine::decoder_on(Cache& cache) {
    CachedDecoder& d = decoder();
    d.set_cache(cache);
    return d;
}

void SequenceEngine::keep_logits(Seq& s, std::span<const float> logits) {
    const std::size_t V = std::size_t(backend_.config().vocab_size);
    assert(logits.size() >= V);  // the last row's [vocab_size]
    s.logits.assign(logits.end() - std::ptrdiff_t(V), logits.end());
}

std::vector<int> SequenceEngine::live() const {
    std::vector<int> ids;
    for (const auto& [id, s] : seqs_) ids.push_back(id);
    return ids;
}

std::span<const int> SequenceEngine::block_table(int id) const {
    const auto* paged = dynamic_cast<const PagedCache*>(find(id).cache.get());
    return paged ? std::span<const int>(paged->block_table()) : std::span<const int>();
}

int SequenceEngine::add(std::span<const int> prompt) {
    const int id = next_id_;
    Seq s;
    s.cache = pool_ ? std::make_unique<PagedCache>(*pool_, model_identity_, id) : make_(id);
    s.cache->seq_id = id;
    s.cache->trace = &events_;
    // A refusal destroys the new cache, which gives back what its prefix hit mapped: the pool is
    // as it was.
    CachedDecoder& d = decoder_on(*s.cache);
    keep_logits(s, d.extend(prompt));
    s.prefix_hit = d.prefix_hit();
    seqs_.emplace(id, std::move(s));
    next_id_++;
    return id;
}

void SequenceEngine::append(int id, std::span<const int> tokens) {
    Seq& s = find(id);
    keep_logits(s, decoder_on(*s.cache).prefill(tokens));  // a refused prefill changes nothing
}

int SequenceEngine::fork(int id) {
    const auto* parent = dynamic_cast<const PagedCache*>(find(id).cache.get());
    if (!parent)
        throw Error(
            fmt::format("sequence {} cannot fork: its {} cache has no shared blocks", id, find(id).cache->name()));
    const int child_id = next_id_;
    Seq child;
    child.cache = parent->fork(child_id);
    child.logits = find(id).logits;
    seqs_.emplace(child_id, std::move(child));
    next_id_++;
    return child_id;
}

void SequenceEngine::rollback(int id, int n) { find(id).cache->truncate(n); }

void SequenceEngine::free(int id) {
    find(id);
    seqs_.erase(id);
}

void SequenceEngine::step(std::span<const int> ids, std::span<const std::vector<int>> tokens) {
    std::vector<Cache*> caches;
    for (int id : ids) caches.push_back(find(id).cache.get());
    const std::vector<float>& logits = decoder().step(caches, tokens);  // checks the batch first
    const std::size_t V = std::size_t(backend_.config().vocab_size);
    assert(logits.size() == ids.size() * V);  // [n_seqs, vocab_size]
    for (std::size_t i = 0; i < ids.size(); i++)
        keep_logits(find(ids[i]), std::span<const float>(logits).subspan(i * V, V));
}

}  // namespace kvlab
