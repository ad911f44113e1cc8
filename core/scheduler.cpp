#include "scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>

#include "sampler.h"

namespace kvlab {

// A request between its admission and its end: its cache while it has one, the sequence it must
// hold (prompt, then output), and its rows while swapped out.
struct Scheduler::Live {
    std::unique_ptr<PagedCache> cache;  // null while waiting (new, or preempted)
    std::vector<int> sequence;          // prompt + output: the rows still to run are cache length..end
    std::vector<std::uint8_t> k, v;     // swapped out: [n_layers, n_kv_heads, swapped, row_bytes]
    int swapped = 0;                    // positions held in k and v
    int pending() const { return int(sequence.size()) - (cache ? cache->length() : 0); }
};

Scheduler::Scheduler(Backend& backend, const Model& model, const SchedulerConfig& config, const PoolFactory& make_pool)
    : model_(model), config_(config) {
    const Config& c = model.config();
    if (config_.max_model_len == 0) config_.max_model_len = c.max_seq;
    const int bs = config_.block_size, per_request = (config_.max_model_len + bs - 1) / bs;
    if (config_.n_threads < 1) throw Error(fmt::format("scheduler: {} threads (at least 1)", config_.n_threads));
    if (!(config_.watermark >= 0 && config_.watermark < 1))
        throw Error(fmt::format("scheduler: watermark {} is not in [0, 1)", config_.watermark));
    if (bs < 1 || config_.max_batch_tokens < 1 || config_.max_model_len < 1 || config_.max_model_len > c.max_seq)
        throw Error(fmt::format("scheduler: block size {}, max batch tokens {} and max model len {} (1..max_seq = {})",
                                bs, config_.max_batch_tokens, config_.max_model_len, c.max_seq));
    if (config_.n_blocks < per_request)
        throw Error(
            fmt::format("scheduler: {} blocks of {} positions cannot hold one request of max model len {} "
                        "(it needs {})",
                        config_.n_blocks, bs, config_.max_model_len, per_request));
    pool_ = make_pool ? make_pool(c, bs, config_.n_blocks, config_.prefix_caching, backend.memory())
                      : std::make_unique<BlockPool>(c, bs, config_.n_blocks, config_.prefix_caching, backend.memory());
    pool_->set_kv_format(config_.kv_format);
    pool_->set_store(config_.store);
    decoder_ = std::make_unique<CachedDecoder>(backend, nullptr);
    decoder_->exec.attention = config_.attention;
    decoder_->exec.n_threads = config_.n_threads;
}

Scheduler::~Scheduler() = default;  // live_ is declared after pool_: the caches go first

int Scheduler::add(const ServeRequest& r) {
    const Config& c = model_.config();
    const int id = int(requests_.size());
    if (r.prompt.empty() || r.max_new_tokens < 1)
        throw Error(fmt::format("request {}: an empty prompt or max_new_tokens {} < 1", id, r.max_new_tokens));
    for (int t : r.prompt)
        if (t < 0 || t >= c.vocab_size)
            throw Error(fmt::format("request {}: token {} is outside the vocabulary [0, {})", id, t, c.vocab_size));
    if (int(r.prompt.size()) + r.max_new_tokens > config_.max_model_len)
        throw Error(fmt::format("request {}: a prompt of {} and {} new tokens pass max model len {}", id,
                                r.prompt.size(), r.max_new_tokens, config_.max_model_len));
    if (r.arrival < (requests_.empty() ? 0 : requests_.back().arrival))
        throw Error(fmt::format("request {}: arrives at step {}, before the request added before it", id, r.arrival));
    requests_.push_back(r);
    results_.emplace_back();
    return id;
}

bool Scheduler::done() const { return next_arrival_ == int(requests_.size()) && live_.empty(); }

const ServeResult& Scheduler::result(int id) const { return results_.at(std::size_t(id)); }

Scheduler::Live& Scheduler::live(int id) { return *live_.at(id); }

std::vector<std::pair<int, std::vector<int>>> Scheduler::block_tables() const {
    std::vector<std::pair<int, std::vector<int>>> out;
    for (const auto& [id, r] : live_)
        if (r->cache) out.emplace_back(id, r->cache->block_table());
    return out;
}

// Running requests with one row left (their next decode row), in admission order, at most a
// step's budget, preempting the last admitted until the pool has their blocks.
std::vector<int> Scheduler::decoding() {
    for (;;) {
        std::vector<int> ids;
        int need = 0;
        for (int id : running_)
            if (live(id).pending() == 1 && int(ids.size()) < config_.max_batch_tokens) {
                ids.push_back(id);
                need += live(id).cache->blocks_needed(1);
            }
        if (need <= pool_->available()) return ids;
        preempt(running_.back());
    }
}

// The most of r's next rows, up to `want`, whose blocks the pool has beside the step's planned
// ones and `headroom` more.
int Scheduler::room(const Live& r, int want, int headroom) const {
    int n = want;
    while (n > 0 && r.cache->blocks_needed(n) > pool_->available() - planned_ - headroom) n--;
    return n;
}

// Request id's next n rows into the step.
void Scheduler::take(int id, int n, Batch& batch) {
    Live& r = live(id);
    planned_ += r.cache->blocks_needed(n);
    batch.caches.push_back(r.cache.get());
    batch.rows.emplace_back(r.sequence.begin() + r.cache->length(), r.sequence.begin() + r.cache->length() + n);
    batch.who.push_back(id);
    batch.budget -= n;
}

void Scheduler::preempt(int id) {
    Live& r = live(id);
    if (config_.preemption == Preemption::swap) swap_out(r);
    r.cache.reset();  // its blocks go back; published ones stay cached
    running_.erase(std::find(running_.begin(), running_.end(), id));
    waiting_.insert(waiting_.begin(), id);
    results_[std::size_t(id)].preemptions++;
    history_.back().preempted++;
}

// The rows of every held position, copied to the host as stored (codes, in the pool's format).
void Scheduler::swap_out(Live& r) {
    const Config& c = model_.config();
    const KVStorage& st = pool_->storage();
    const int T = r.cache->length();
    const std::int64_t rb = st.row_bytes();
    r.k.assign(std::size_t(c.n_layers) * c.n_kv_heads * T * rb, 0);  // [n_layers, n_kv_heads, T, row_bytes]
    r.v.assign(r.k.size(), 0);
    for (int l = 0; l < c.n_layers; l++)
        for (int h = 0; h < c.n_kv_heads; h++)
            for (int t = 0; t < T; t++) {
                const std::int64_t at = ((std::int64_t(l) * c.n_kv_heads + h) * T + t) * rb;
                const std::int64_t row = st.row(l, h, r.cache->slot(t));
                st.memory().download(r.k.data() + at, st.k_row(row), rb);
                st.memory().download(r.v.data() + at, st.v_row(row), rb);
            }
    r.swapped = T;
}

// New blocks for the swapped positions, their rows copied back; the caller checked the room.
void Scheduler::swap_in(Live& r) {
    const Config& c = model_.config();
    if (swap_transform) swap_transform(r.k, r.v, r.swapped, pool_->storage().row_bytes());
    const int T = r.swapped;
    r.cache->append(std::span(r.sequence).first(std::size_t(T)));
    const KVStorage& st = pool_->storage();
    const std::int64_t rb = st.row_bytes();
    std::vector<int> positions(static_cast<std::size_t>(T));  // [T] 0..T-1
    for (int t = 0; t < T; t++) positions[std::size_t(t)] = t;
    for (int t = 0; t < T; t++) {
        const std::int64_t slot = r.cache->write_slot(t);
        for (int l = 0; l < c.n_layers; l++)
            for (int h = 0; h < c.n_kv_heads; h++) {
                const std::int64_t at = ((std::int64_t(l) * c.n_kv_heads + h) * T + t) * rb;
                st.memory().upload(st.k_row(st.row(l, h, slot)), r.k.data() + at, rb);
                st.memory().upload(st.v_row(st.row(l, h, slot)), r.v.data() + at, rb);
            }
    }
    for (int l = 0; l < c.n_layers; l++) r.cache->stored(l, positions);
    r.cache->committed();
    r.k.clear(), r.v.clear(), r.swapped = 0;
}

// Admits waiting request `id` if the pool and the budget allow a row of it: a cache, the prefix
// the pool has cached (or its swapped rows), and a first chunk. Removes it from waiting when it is.
void Scheduler::admit(int id, Batch& batch) {
    Live& r = live(id);
    // The watermark, as vLLM keeps one: with requests running, that share of the pool (rounded up)
    // stays free for their next decode rows, so that admitting this one does not preempt them at once.
    const int headroom = running_.empty() ? 0 : int(std::ceil(config_.watermark * double(config_.n_blocks)));
    r.cache = std::make_unique<PagedCache>(*pool_, model_.w.fingerprint(), id);
    if (r.swapped > 0) {
        if (r.cache->blocks_needed(r.swapped + 1) > pool_->available() - planned_ - headroom) return r.cache.reset();
        swap_in(r);
    } else if (config_.prefix_caching) {
        // Fetches from the store leave the step's planned blocks and the watermark available.
        const std::int64_t fetched = pool_->store_stats().fetched;
        results_[std::size_t(id)].prefix_hit = r.cache->attach_prefix(r.sequence, planned_ + headroom);
        results_[std::size_t(id)].store_hit = int(pool_->store_stats().fetched - fetched) * config_.block_size;
    }
    // A prefix hit maps cached blocks the pool counted as free: the room is what is left after it.
    const int n = room(r, std::min(r.pending(), batch.budget), headroom);
    if (n == 0) return r.cache.reset();  // no room for a row: it waits (a hit's blocks go back to the cache)
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
    running_.push_back(id);
    history_.back().admitted++;
    take(id, n, batch);
}

// After the step: each request whose rows reached the end of its sequence takes its next token.
void Scheduler::finish_rows(std::span<const int> who, const std::vector<float>& logits) {
    const std::size_t V = std::size_t(model_.config().vocab_size);
    for (std::size_t i = 0; i < who.size(); i++) {
        const int id = who[i];
        Live& r = live(id);
        if (r.pending() != 0) continue;  // a prefill chunk short of the prompt's end
        ServeResult& res = results_[std::size_t(id)];
        const std::span<const float> row = std::span(logits).subspan(i * V, V);
        res.logits.insert(res.logits.end(), row.begin(), row.end());
        res.output.push_back(argmax(std::vector<float>(row.begin(), row.end())));
        if (res.output.size() == 1) res.first_token_step = step_;
        if (int(res.output.size()) < requests_[std::size_t(id)].max_new_tokens) {
            r.sequence.push_back(res.output.back());
            continue;
        }
        res.finish_step = step_;
        running_.erase(std::find(running_.begin(), running_.end(), id));
        live_.erase(id);
        history_.back().finished++;
    }
}

bool Scheduler::step() {
    if (done()) return false;
    while (next_arrival_ < int(requests_.size()) && requests_[std::size_t(next_arrival_)].arrival <= step_) {
        auto r = std::make_unique<Live>();
        r->sequence = requests_[std::size_t(next_arrival_)].prompt;
        live_[next_arrival_] = std::move(r);
        waiting_.push_back(next_arrival_++);
    }
    history_.push_back({step_});
    Batch batch;
    batch.budget = config_.max_batch_tokens;
    planned_ = 0;
    for (int id : decoding()) take(id, 1, batch);
    history_.back().decode_rows = int(batch.who.size());
    // Requests still prefilling, in admission order: a chunk each.
    for (int id : running_)
        if (const Live& r = live(id); r.pending() > 1)
            if (const int n = room(r, std::min(r.pending(), batch.budget), 0); n > 0) take(id, n, batch);
    // Waiting requests, first come first served: the first that does not fit stops admission.
    while (batch.budget > 0 && !waiting_.empty()) {
        const std::size_t before = waiting_.size();
        admit(waiting_.front(), batch);
        if (waiting_.size() == before) break;
    }
    history_.back().prefill_rows = config_.max_batch_tokens - batch.budget - history_.back().decode_rows;
    if (!batch.caches.empty()) finish_rows(batch.who, decoder_->step(batch.caches, batch.rows));
    ServeStep& s = history_.back();
    s.running = int(running_.size()), s.waiting = int(waiting_.size());
    s.blocks_used = pool_->n_used();
    step_++;
    return true;
}

}  // namespace kvlab
