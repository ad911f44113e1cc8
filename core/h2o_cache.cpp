#include "h2o_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>

namespace kvlab {

H2OCache::H2OCache(const Config& config, int recent, int heavy, Memory& memory)
    : Cache(config), recent_(recent), heavy_(heavy) {
    if (recent < 1)
        throw Error(fmt::format("h2o cache: recent must be >= 1 (the query's own position), not {}", recent));
    if (heavy < 0) throw Error(fmt::format("h2o cache: heavy must be >= 0, not {}", heavy));
    // In int64: recent + heavy may not fit an int, and then the budget is simply max_seq.
    const std::int64_t budget = std::int64_t(recent) + heavy;
    direct_ = budget >= config_.max_seq;
    capacity_ = int(std::min<std::int64_t>(budget, config_.max_seq));
    storage_ = KVStorage(memory, std::int64_t(pairs()) * capacity_, config_.head_size(),
                         std::int64_t(config_.n_kv_heads) * capacity_, capacity_);
    kept_.assign(std::size_t(pairs()) * std::size_t(capacity_), -1);
    score_.assign(kept_.size(), 0.0f);
    assert(storage_.n_rows == std::int64_t(kept_.size()) && score_.size() == kept_.size());
}

void H2OCache::set_kv_format(KVFormat format, std::span<const float> scales) {
    if (length() != 0) throw Error(fmt::format("{}: the KV format changes only while the cache is empty", name()));
    storage_ = storage_.reformatted(config_.n_layers, format, scales);
}

std::span<const int> H2OCache::kept(int l, int h) const {
    check_head(l, h);
    return {kept_.data() + std::size_t(l * config_.n_kv_heads + h) * std::size_t(capacity_), std::size_t(held_)};
}

std::span<const float> H2OCache::scores(int l, int h) const {
    check_head(l, h);
    return {score_.data() + std::size_t(l * config_.n_kv_heads + h) * std::size_t(capacity_), std::size_t(held_)};
}

std::int64_t H2OCache::head_slot(int l, int h, int t) const {
    const std::span<const int> k = kept(l, h);
    const auto it = std::lower_bound(k.begin(), k.end(), t);
    return it != k.end() && *it == t ? std::int64_t(it - k.begin()) : -1;
}

std::int64_t H2OCache::slot(int t) const { return head_slot(0, 0, t); }

int H2OCache::attended(int pos, std::int64_t* slots, int* positions) const {
    // Which positions a query reads is decided when it arrives, from the weights before it.
    if (pos != length() - 1)
        throw Error(
            fmt::format("{}: only the latest query's positions are known (pos {}, length {})", name(), pos, length()));
    const std::span<const int> k = kept(0, 0);
    for (int j = 0; j < held_; j++) {
        slots[j] = j;
        if (positions) positions[j] = k[std::size_t(j)];
    }
    return held_;
}

int H2OCache::victim(int lh, int pos) const {
    const int* k = kept_.data() + std::size_t(lh) * std::size_t(capacity_);
    const float* s = score_.data() + std::size_t(lh) * std::size_t(capacity_);
    // The candidates are older than the recent window pos - recent + 1..pos: a prefix of the slots.
    int best = -1;
    for (int j = 0; j < held_ && k[j] <= pos - recent_; j++)
        if (best < 0 || s[j] < s[best]) best = j;  // strictly lower: the oldest wins a tie
    assert(best >= 0);                             // held = recent + heavy, so heavy + 1 >= 1 of them are older
    return best;
}

void H2OCache::shift_rows(int lh, int from, int to, int by) {
    const std::int64_t rb = storage_.row_bytes(), base = std::int64_t(lh) * capacity_;
    Memory& m = storage_.memory();
    auto move = [&](int j) {
        m.copy(storage_.k_row(base + j + by), storage_.k_row(base + j), rb);
        m.copy(storage_.v_row(base + j + by), storage_.v_row(base + j), rb);
    };
    if (by < 0)
        for (int j = from; j < to; j++) move(j);
    else
        for (int j = to - 1; j >= from; j--) move(j);
}

void H2OCache::reserve(int new_length) {
    assert(new_length == length() + 1);
    const int pos = length();
    Step step{kept_, score_, std::vector<int>(std::size_t(pairs()), -1), {}, {}};
    if (held_ == capacity_) {  // full (never when direct_: capacity is then max_seq)
        // Every victim first: a refused one changes nothing.
        for (int lh = 0; lh < pairs(); lh++) {
            const int e = victim(lh, pos);
            if (e < 0 || e >= held_ || kept_of(lh)[e] > pos - recent_)
                throw Error(fmt::format("{}: slot {} is no position older than the recent window to evict", name(), e));
            step.evicted[std::size_t(lh)] = e;
        }
        const std::int64_t rb = storage_.row_bytes();
        step.k.resize(std::size_t(pairs() * rb)), step.v.resize(step.k.size());  // [pairs, row_bytes]
        assert(step.k.size() == std::size_t(pairs()) * std::size_t(rb));
        for (int lh = 0; lh < pairs(); lh++) {
            const int e = step.evicted[std::size_t(lh)];
            const std::int64_t row = std::int64_t(lh) * capacity_ + e;
            storage_.memory().download(step.k.data() + lh * rb, storage_.k_row(row), rb);
            storage_.memory().download(step.v.data() + lh * rb, storage_.v_row(row), rb);
            if (lh == 0) record(EventKind::evicted, kept_of(lh)[e]);
            shift_rows(lh, e + 1, held_, -1);
            std::copy(kept_of(lh) + e + 1, kept_of(lh) + held_, kept_of(lh) + e);
            std::copy(score_of(lh) + e + 1, score_of(lh) + held_, score_of(lh) + e);
        }
        held_--;
    }
    for (int lh = 0; lh < pairs(); lh++) kept_of(lh)[held_] = pos, score_of(lh)[held_] = 0.0f;
    storage_.poison(config_, held_, 1);  // the new row reads NaN until written
    held_++;
    log_.push_back(std::move(step));
    if (int(log_.size()) > kRollbackSteps) log_.erase(log_.begin());
}

void H2OCache::attention_weights(int l, std::span<const float> w) {
    const int n_heads = int(w.size()) / std::max(1, held_), group = config_.group();
    if (l < 0 || l >= config_.n_layers || held_ == 0 || w.size() != std::size_t(config_.n_heads) * std::size_t(held_))
        throw Error(fmt::format("{}: attention weights of layer {} over {} values, expected n_heads x {}", name(), l,
                                w.size(), held_));
    assert(n_heads == config_.n_heads);  // w: [n_heads, held]
    // Each score sums its KV head's query heads in increasing order, in fp32.
    for (int g = 0; g < n_heads; g++) {
        float* s = score_of(l * config_.n_kv_heads + g / group);
        for (int j = 0; j < held_; j++) s[j] += w[std::size_t(g) * std::size_t(held_) + std::size_t(j)];
    }
}

void H2OCache::undo(const Step& step) {
    const std::int64_t rb = storage_.row_bytes();
    const bool evicted = step.evicted[0] >= 0;  // every (l, h) evicts, or none
    for (int lh = 0; lh < pairs(); lh++) {
        const std::int64_t base = std::int64_t(lh) * capacity_;
        if (!evicted) {
            storage_.fill_nan_rows(storage_.k_row(base + held_ - 1), 1);
            storage_.fill_nan_rows(storage_.v_row(base + held_ - 1), 1);
            continue;
        }
        const int e = step.evicted[std::size_t(lh)];
        shift_rows(lh, e, held_ - 1, +1);  // over the step's own row, in the last slot
        storage_.memory().upload(storage_.k_row(base + e), step.k.data() + lh * rb, rb);
        storage_.memory().upload(storage_.v_row(base + e), step.v.data() + lh * rb, rb);
    }
    if (!evicted) held_--;
    kept_ = step.kept, score_ = step.score;
}

void H2OCache::release(int n) {
    const int steps = length() - n;
    if (steps == 0) return;
    if (n == 0 || (direct_ && steps > int(log_.size()))) {
        // Slot = the position's order; the scores choose nothing when nothing is ever evicted.
        for (int lh = 0; lh < pairs(); lh++) std::fill(kept_of(lh) + n, kept_of(lh) + held_, -1);
        if (n == 0) std::fill(score_.begin(), score_.end(), 0.0f);
        storage_.poison(config_, n, held_ - n);
        held_ = n, log_.clear();
        return;
    }
    if (steps > int(log_.size()))
        throw Error(fmt::format("{}: cannot roll back {} positions to {}: it can undo its last {} steps only", name(),
                                steps, n, log_.size()));
    for (int i = 0; i < steps; i++) {
        undo(log_.back());
        log_.pop_back();
    }
}

namespace {
// Everything a request longer than the rollback log can change.
struct H2OSnapshot final : CacheSnapshot {
    std::vector<int> kept;
    std::vector<float> score;
    int held = 0;
    Buffer<std::uint8_t> k, v;  // the storage's rows, as they were
};
}  // namespace

std::unique_ptr<CacheSnapshot> H2OCache::snapshot(int added) const {
    if (added <= kRollbackSteps || direct_) return Cache::snapshot(added);
    auto s = std::make_unique<H2OSnapshot>();
    s->length = length(), s->kept = kept_, s->score = score_, s->held = held_;
    s->k = storage_.k.clone(), s->v = storage_.v.clone();
    return s;
}

void H2OCache::restore(const CacheSnapshot& snapshot) {
    const auto* copy = dynamic_cast<const H2OSnapshot*>(&snapshot);
    if (!copy) return Cache::restore(snapshot);
    kept_ = copy->kept, score_ = copy->score, held_ = copy->held;
    storage_.k.copy_from(copy->k), storage_.v.copy_from(copy->v);
    log_.clear();  // the steps it undid are gone; older ones were never logged against this state
    const int forgotten = length() - copy->length;
    const std::vector<int> kept_tokens(tokens().begin(), tokens().begin() + copy->length);
    set_tokens(kept_tokens);
    record(EventKind::rolled_back, copy->length, forgotten);
}

MemoryStats H2OCache::memory() const {
    MemoryStats m = position_rows_memory(config_, storage_, capacity_, held_);
    // The positions and scores are the policy's own metadata; the rollback log is scratch.
    const std::int64_t state = std::int64_t(kept_.size() * sizeof(int) + score_.size() * sizeof(float));
    m.metadata_bytes += state, m.reserved_bytes += state, m.allocated_bytes += state;
    for (const Step& s : log_)
        m.scratch_bytes += std::int64_t(s.kept.size() * sizeof(int) + s.score.size() * sizeof(float) +
                                        s.evicted.size() * sizeof(int) + s.k.size() + s.v.size());
    return m;
}

std::string H2OCache::name() const { return fmt::format("h2o(recent={},heavy={})", recent_, heavy_); }

}  // namespace kvlab
