#include "paged.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstring>
#include <limits>
#include <map>

#include "model.h"

namespace kvlab {

namespace {

// Chains x into hash h (boost's hash_combine step), then splitmix64's finalizer spreads it.
std::uint64_t mix(std::uint64_t h, std::uint64_t x) {
    return splitmix64_finalize(h ^ (x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)));
}
}  // namespace

std::uint64_t BlockKey::hash() const {
    std::uint64_t h = mix(parent, model);
    for (int t : tokens) h = mix(h, std::uint64_t(std::uint32_t(t)));
    return h;
}

// ----------------------------------------------------------------------------------------------
// Core's manager

RefCountManager::RefCountManager(int n_blocks) : blocks_(std::size_t(n_blocks)) {
    for (int b = n_blocks - 1; b >= 0; b--) free_.push_back(b);  // block 0 is handed out first
}

int RefCountManager::available() const {
    int cached = 0;
    for (const Block& b : blocks_) cached += !b.ref_cnt && b.published;
    return int(free_.size()) + cached;
}

int RefCountManager::allocate(bool& evicted) {
    int block = -1;
    evicted = free_.empty();
    if (!evicted) {
        block = free_.back();
        free_.pop_back();
    } else {
        // Evict the least recently used unreferenced published block (a linear scan: pools here
        // are small; an engine keeps an ordered list).
        for (int b = 0; b < n_blocks(); b++)
            if (!refcount(b) && published(b) && (block < 0 || at(b).last_used < at(block).last_used)) block = b;
        if (block < 0) throw Error("paged cache: no free block (callers check available() first)");
        unpublish(block);
    }
    assert(at(block).ref_cnt == 0);
    blocks_[std::size_t(block)].ref_cnt = 1;
    blocks_[std::size_t(block)].last_used = ++tick_;
    return block;
}

void RefCountManager::retain(int block) {
    Block& b = blocks_[std::size_t(block)];
    b.ref_cnt++;
    b.last_used = ++tick_;
}

bool RefCountManager::release(int block) {
    Block& b = blocks_[std::size_t(block)];
    assert(b.ref_cnt > 0);
    b.ref_cnt--;
    b.last_used = ++tick_;
    if (b.ref_cnt > 0 || b.published) return false;  // still mapped, or cached for later prefix hits
    free_.push_back(block);
    return true;
}

int RefCountManager::lookup(const BlockKey& key) const {
    const auto [first, last] = by_hash_.equal_range(key.hash());
    for (auto it = first; it != last; ++it)
        if (at(it->second).key == key) return it->second;  // the full key, so a hash collision never hits
    return -1;
}

void RefCountManager::publish(int block, const BlockKey& key) {
    if (published(block) || lookup(key) >= 0) return;  // already there (another sequence computed it too)
    by_hash_.emplace(key.hash(), block);
    blocks_[std::size_t(block)].key = key;
    blocks_[std::size_t(block)].published = true;
}

void RefCountManager::unpublish(int block) {
    const auto [first, last] = by_hash_.equal_range(at(block).key.hash());
    for (auto it = first; it != last; ++it)
        if (it->second == block) {
            by_hash_.erase(it);
            break;
        }
    blocks_[std::size_t(block)].key = BlockKey{};
    blocks_[std::size_t(block)].published = false;
}

// ----------------------------------------------------------------------------------------------
// The pool

BlockPool::BlockPool(const Config& config, int block_size, int n_blocks, bool prefix_caching, Memory& memory,
                     std::unique_ptr<BlockManager> manager)
    : config_(config),
      block_size_(block_size),
      n_blocks_(n_blocks),
      prefix_caching_(prefix_caching),
      manager_(std::move(manager)) {
    config_.validate();
    if (block_size < 1 || block_size > config_.max_seq)
        throw Error(
            fmt::format("paged cache: block_size {} is outside [1, max_seq = {}]", block_size, config_.max_seq));
    if (n_blocks < 1) throw Error(fmt::format("paged cache: a pool needs at least one block, not {}", n_blocks));
    check_size(fmt::format("a pool of {} blocks of {} positions", n_blocks, block_size), n_blocks,
               kv_bytes(config_, block_size));
    const std::size_t n =
        std::size_t(n_blocks) * config_.n_layers * config_.n_kv_heads * block_size * config_.head_size();
    if (n > std::size_t(kMaxElements))
        throw Error(fmt::format("paged cache: {} blocks of {} positions are too large", n_blocks, block_size));
    if (!manager_) manager_ = std::make_unique<RefCountManager>(n_blocks);
    if (manager_->n_blocks() != n_blocks)
        throw Error(fmt::format("paged cache: a pool of {} blocks needs a block manager of as many, not {}", n_blocks,
                                manager_->n_blocks()));
    const std::int64_t per_layer = std::int64_t(config_.n_kv_heads) * block_size;
    storage_ = KVStorage(memory, std::int64_t(n_blocks) * config_.n_layers * per_layer, config_.head_size(), per_layer,
                         block_size);
    assert(storage_.n_rows * config_.head_size() == std::int64_t(n));
    holders_.resize(std::size_t(n_blocks));
}

BlockKey BlockPool::key(std::uint64_t parent, std::uint64_t model, std::span<const int> tokens) const {
    assert(int(tokens.size()) == block_size_);
    return BlockKey{parent, model, std::vector<int>(tokens.begin(), tokens.end())};
}

int BlockPool::n_free() const {
    int n = 0;
    for (int b = 0; b < n_blocks_; b++) n += !refcount(b) && !published(b);
    return n;
}

int BlockPool::n_cached() const {
    int n = 0;
    for (int b = 0; b < n_blocks_; b++) n += !refcount(b) && published(b);
    return n;
}

int BlockPool::n_used() const {
    int n = 0;
    for (int b = 0; b < n_blocks_; b++) n += refcount(b) > 0;
    return n;
}

int BlockPool::max_rows(int block) const {
    int m = 0;
    for (const Holder& h : holders_[std::size_t(block)]) m = std::max(m, h.rows);
    return m;
}

BlockPool::Holder& BlockPool::holder(int block, int owner) {
    auto& hs = holders_[std::size_t(block)];
    const auto it = std::find_if(hs.begin(), hs.end(), [&](const Holder& h) { return h.owner == owner; });
    assert(it != hs.end());
    return *it;
}

int BlockPool::allocate(int owner, int seq) {
    bool evicted = false;
    const int block = manager_->allocate(evicted);
    // A manager is not always core's (lab 8): the pool checks what it hands out.
    if (block < 0 || block >= n_blocks_)
        throw Error(
            fmt::format("block manager: allocate() gave block {}; the pool has blocks 0..{}", block, n_blocks_ - 1));
    if (!holders_[std::size_t(block)].empty())
        throw Error(fmt::format("block manager: allocate() gave block {}, which {} sequence(s) still map", block,
                                holders_[std::size_t(block)].size()));
    if (evicted) {
        offload(block);  // its rows are intact until the poison below
        keys_.erase(block);
        poison(block, 0);
        event(EventKind::evicted, seq, block);
    }
    holders_[std::size_t(block)] = {{owner, 0}};
    count_hold(true, owner);
    event(EventKind::block_allocated, seq, block);
    return block;
}

void BlockPool::count_hold(bool block_was_free, int owner) {
    held_blocks_ += block_was_free;
    owner_blocks_[owner]++;
    peak_.blocks = std::max(peak_.blocks, held_blocks_);
    peak_.sequences = std::max(peak_.sequences, int(owner_blocks_.size()));
}

void BlockPool::retain(int block, int owner, int seq, int rows) {
    manager_->retain(block);
    count_hold(holders_[std::size_t(block)].empty(), owner);
    holders_[std::size_t(block)].push_back({owner, rows});
    event(EventKind::block_shared, seq, block);
}

void BlockPool::poison_unheld(int block, int old_max) {
    const int rows = max_rows(block);
    if (rows < old_max && !published(block)) poison(block, rows);
}

void BlockPool::hold(int block, int owner, int rows) {
    assert(rows >= 0 && rows <= block_size_);
    const int old_max = max_rows(block);
    holder(block, owner).rows = rows;
    poison_unheld(block, old_max);
}

void BlockPool::release(int block, int owner, int seq) {
    auto& hs = holders_[std::size_t(block)];
    const int old_max = max_rows(block);
    hs.erase(hs.begin() + (&holder(block, owner) - hs.data()));
    held_blocks_ -= hs.empty();
    if (const auto it = owner_blocks_.find(owner); it != owner_blocks_.end() && --it->second == 0)
        owner_blocks_.erase(it);
    if (manager_->release(block)) {
        poison(block, 0);
        event(EventKind::freed, seq, block);
    } else if (!hs.empty()) {
        poison_unheld(block, old_max);
    }
}

void BlockPool::publish(int block, const BlockKey& key) {
    manager_->publish(block, key);
    if (manager_->published(block) && manager_->lookup(key) == block) keys_[block] = key;
}

// ----------------------------------------------------------------------------------------------
// The tier below

BlockShape BlockPool::block_shape() const {
    BlockShape s;
    s.block_size = block_size_, s.n_layers = config_.n_layers, s.n_kv_heads = config_.n_kv_heads;
    s.head_size = config_.head_size(), s.row_bytes = storage_.row_bytes();
    // The format's identity: its code, its integer group, and the bits of its scales.
    BlockKey id{std::uint64_t(storage_.format), std::uint64_t(storage_.group()), {}};
    for (float x : storage_.host_scales) id.tokens.push_back(int(std::bit_cast<std::uint32_t>(x)));
    s.format_id = id.hash();
    return s;
}

std::int64_t BlockPool::StoreStats::n_rejected() const {
    std::int64_t n = 0;
    for (const auto& [why, count] : rejected) n += count;
    return n;
}

std::string BlockPool::check_record(std::span<const std::uint8_t> record, const BlockKey& key) const {
    return check_block_record(record, key, block_shape());
}

void BlockPool::offload(int block) {
    const auto it = keys_.find(block);
    if (!store_ || it == keys_.end()) return;
    const BlockShape shape = block_shape();
    const std::string name = store_key(it->second, shape);
    if (store_->contains(name)) return;
    const std::int64_t half = shape.half_bytes();  // [n_layers, n_kv_heads, block_size, row_bytes]
    assert(2 * half == block_bytes());
    std::vector<std::uint8_t> k(std::size_t(half), 0), v(std::size_t(half), 0);
    storage_.memory().download(k.data(), storage_.k_row(first_slot(block)), half);
    storage_.memory().download(v.data(), storage_.v_row(first_slot(block)), half);
    if (store_->put(name, encode_block_record(it->second, shape, k, v))) {
        store_stats_.offloaded++;
        event(EventKind::stored, -1, block);
    }
}

int BlockPool::flush_to_store() {
    const std::int64_t before = store_stats_.offloaded;
    for (int b = 0; b < n_blocks_; b++)
        if (published(b)) offload(b);
    return int(store_stats_.offloaded - before);
}

int BlockPool::fetch(const BlockKey& key, int owner, int seq) {
    if (!store_ || available() == 0) return -1;
    const BlockShape shape = block_shape();
    const std::string name = store_key(key, shape);
    const std::optional<std::vector<std::uint8_t>> record = store_->get(name);
    if (!record) {
        store_stats_.missed++;
        return -1;
    }
    if (const std::string why = check_record(*record, key); !why.empty()) {
        store_stats_.rejected[why]++;
        store_->erase(name);
        return -1;
    }
    const std::span<const std::uint8_t> rows = record_rows(*record, shape);  // K then V, each half_bytes
    const int block = allocate(owner, seq);
    storage_.memory().upload(storage_.k_row(first_slot(block)), rows.data(), shape.half_bytes());
    storage_.memory().upload(storage_.v_row(first_slot(block)), rows.data() + shape.half_bytes(), shape.half_bytes());
    hold(block, owner, block_size_);
    publish(block, key);
    store_stats_.fetched++;
    event(EventKind::fetched, seq, block);
    return block;
}

void BlockPool::set_kv_format(KVFormat format, std::span<const float> scales) {
    if (n_used() != 0) throw Error("paged cache: a pool's KV format changes only while no block is used");
    drop_cached();
    keys_.clear();  // no block is used or cached now
    remake_storage(format, scales);
}

void BlockPool::drop_cached() {
    // Through the manager's own calls: allocating every available block evicts the cached ones
    // (free ones come first), and releasing them, unpublished now, frees them all.
    std::vector<int> taken;  // [available()]
    const int n = manager_->available();
    for (int i = 0; i < n && n_cached() > 0; i++) {
        bool evicted = false;
        taken.push_back(manager_->allocate(evicted));
        if (evicted) event(EventKind::evicted, -1, taken.back());
    }
    for (int b : taken) manager_->release(b);
    assert(n_cached() == 0 || taken.size() == std::size_t(n));
}

// The storage is made again: its size follows the format.
void BlockPool::remake_storage(KVFormat format, std::span<const float> scales) {
    const std::vector<float> checked =
        scales.empty() ? std::vector<float>{} : checked_kv_scales(config_.n_layers, scales);
    storage_ = KVStorage(storage_.memory(), storage_.n_rows, storage_.head_size, storage_.layer_rows,
                         storage_.head_rows, format, checked);
}

void BlockPool::poison(int block, int from_slot) {
    storage_.poison(config_, first_slot(block) + from_slot, block_size_ - from_slot);
}

void BlockPool::copy_block(int to, int from) {
    // A block's rows of every layer and head are one run: [n_layers, n_kv_heads, block_size, head_size].
    const std::int64_t bytes = block_bytes() / 2;
    storage_.memory().copy(storage_.k_row(first_slot(to)), storage_.k_row(first_slot(from)), bytes);
    storage_.memory().copy(storage_.v_row(first_slot(to)), storage_.v_row(first_slot(from)), bytes);
}

const float* BlockPool::key_row(int block, int l, int h, int s) const {
    assert(storage_.memory().host_visible());
    return storage_.k_f32() + storage_.row(l, h, first_slot(block) + s) * config_.head_size();
}

const float* BlockPool::value_row(int block, int l, int h, int s) const {
    assert(storage_.memory().host_visible());
    return storage_.v_f32() + storage_.row(l, h, first_slot(block) + s) * config_.head_size();
}

void BlockPool::event(EventKind kind, int seq, int block, int from, int pos, int count) const {
    if (trace) trace->push_back(CacheEvent{kind, seq, pos, count, block, from});
}

MemoryStats BlockPool::memory() const {
    MemoryStats m;
    // An integer format's group scales live inside its rows: metadata, not payload.
    m.payload_bytes = std::int64_t(n_blocks_) * block_bytes() - storage_.group_scale_bytes();
    m.metadata_bytes =
        std::int64_t(sizeof(float)) * std::int64_t(storage_.host_scales.size()) + storage_.group_scale_bytes();
    m.reserved_bytes = m.payload_bytes + m.metadata_bytes;
    m.allocated_bytes = storage_.bytes();
    m.blocks_total = n_blocks_;
    m.blocks_free = n_free();
    m.blocks_cached = n_cached();
    m.blocks_used = n_used();
    return m;
}

// ----------------------------------------------------------------------------------------------
// One sequence

PagedCache::PagedCache(BlockPool& pool, std::uint64_t model_identity, int id)
    : Cache(pool.config()), pool_(&pool), pool_alive_(pool.alive()), owner_(pool.join()), model_(model_identity) {
    seq_id = id;
}

PagedCache::~PagedCache() {
    if (!*pool_alive_) return;  // orphaned: its blocks went with the pool
    for (int block : table_) pool_->release(block, owner_, seq_id);
}

BlockPool& PagedCache::pool() const {
    if (!*pool_alive_)
        throw Error(fmt::format("paged cache: sequence {}'s block pool was destroyed before it", seq_id));
    return *pool_;
}

std::int64_t PagedCache::slot(int t) const {
    const int bs = pool().block_size();
    const std::size_t b = std::size_t(t / bs);
    if (t < 0 || b >= table_.size()) return -1;
    return pool().slot(table_[b], t % bs);
}

// Block by block through the table: one table lookup per block instead of one per row.
int PagedCache::attended(int pos, std::int64_t* slots, int* positions) const {
    const BlockPool& pool = this->pool();
    const int bs = pool.block_size();
    for (int t0 = 0, b = 0; t0 <= pos; t0 += bs, b++) {
        const int n = std::min(bs, pos + 1 - t0);
        const int block = b < int(table_.size()) ? table_[b] : -1;
        for (int s = 0; s < n; s++) {
            slots[t0 + s] = block < 0 ? -1 : pool.slot(block, s);
            if (positions) positions[t0 + s] = t0 + s;
        }
    }
    return pos + 1;
}

int PagedCache::rows_of(int b, int length) const {
    const int bs = pool().block_size();
    return std::clamp(length - b * bs, 0, bs);
}

BlockKey PagedCache::key_of(int b) const {
    const int bs = pool().block_size();
    return pool().key(b > 0 ? hashes_[b - 1] : 0, model_, tokens().subspan(std::size_t(b) * bs, std::size_t(bs)));
}

int PagedCache::blocks_needed(int n) const {
    const int bs = pool().block_size();
    const int b = length() / bs;
    const bool cow = length() % bs != 0 && b < int(table_.size()) && pool().needs_copy(table_[b]);
    return std::max(0, (length() + n + bs - 1) / bs - int(table_.size())) + (cow ? 1 : 0);
}

void PagedCache::reserve(int new_length) {
    const int bs = pool().block_size();
    const int n_new = std::max(0, (new_length + bs - 1) / bs - int(table_.size()));
    // The block receiving the next row must be ours alone: shared (fork, prefix hit) or
    // published blocks get a private copy first (blocks_needed counts it).
    const int b = length() / bs;
    const bool cow = length() % bs != 0 && b < int(table_.size()) && pool().needs_copy(table_[b]);
    const int needed = blocks_needed(new_length - length());
    if (needed > pool().available())
        throw Error(fmt::format("paged cache: sequence {} needs {} more blocks of {} positions, the pool has {} free",
                                seq_id, needed, bs, pool().available()));
    // Nothing below throws.
    BlockPool& pool = this->pool();
    if (cow) {
        const int shared = table_[b], copy = pool.allocate(owner_, seq_id);
        pool.copy_block(copy, shared);
        pool.poison(copy, length() % bs);  // rows past our length are not ours
        pool.release(shared, owner_, seq_id);
        table_[b] = copy;
        pool.event(EventKind::copy_on_write, seq_id, copy, shared, length());
    }
    for (int i = 0; i < n_new; i++) table_.push_back(pool.allocate(owner_, seq_id));
    // The rows this sequence will hold in each block it writes (all of them ours alone now).
    for (int blk = b; blk < int(table_.size()); blk++) pool.hold(table_[blk], owner_, rows_of(blk, new_length));
}

// A row of the latest append in a block another owner can read (forked after the append, or
// published by it) stays as it is: rewriting it would change the other's rows without a copy.
void PagedCache::on_write(int pos) {
    BlockPool& pool = this->pool();
    const int block = table_[std::size_t(pos / pool.block_size())];
    if (!pool.needs_copy(block)) {
        // The records say whether another owner can read the block; a copy policy that let such a
        // write through shows in shared_writes(), which must stay 0.
        if (pool.refcount(block) > 1 || pool.published(block)) pool.count_shared_write();
        return;
    }
    throw Error(fmt::format(
        "paged cache: sequence {} cannot rewrite position {}: block {} is {}; roll back to rewrite it", seq_id, pos,
        block, pool.refcount(block) > 1 ? "shared with another sequence" : "in the prefix cache"));
}

void PagedCache::on_stored(int l, int pos) {
    const int bs = pool().block_size();
    // The last layer's row that fills a block completes it: hash it, and publish it.
    if (l == config_.n_layers - 1 && pos % bs == bs - 1 && pos / bs == int(hashes_.size())) {
        const BlockKey key = key_of(pos / bs);
        hashes_.push_back(pool().hash(key));
        if (pool().prefix_caching()) unpublished_.push_back({pos / bs, key});
    }
}

void PagedCache::committed() {
    for (const auto& [b, key] : unpublished_) pool().publish(table_[std::size_t(b)], key);
    unpublished_.clear();
}

void PagedCache::release(int n) {
    const int bs = pool().block_size();
    const int keep = (n + bs - 1) / bs;
    while (int(table_.size()) > keep) {
        pool().release(table_.back(), owner_, seq_id);
        table_.pop_back();
    }
    hashes_.resize(std::min<std::size_t>(hashes_.size(), std::size_t(n / bs)));
    std::erase_if(unpublished_, [&](const auto& p) { return p.first >= int(hashes_.size()); });
    // A block cut in the middle holds n % bs of our rows now: those past them read NaN unless
    // another holder still holds them (copy-on-write handles our next write then), or the block
    // is published.
    if (n % bs != 0 && keep <= int(table_.size())) pool().hold(table_[keep - 1], owner_, n % bs);
}

int PagedCache::attach_prefix(std::span<const int> tokens, int keep_available) {
    if (length() != 0) throw Error("paged cache: a prefix attaches only to an empty sequence");
    if (!pool().prefix_caching() || tokens.empty()) return 0;
    BlockPool& pool = this->pool();
    const int bs = pool.block_size();
    // At most tokens.size() - 1 positions: the last token always runs, for its logits.
    const int max_blocks = int((tokens.size() - 1) / bs);
    for (int b = 0; b < max_blocks; b++) {
        const BlockKey key =
            pool.key(b > 0 ? hashes_.back() : 0, model_, tokens.subspan(std::size_t(b) * bs, std::size_t(bs)));
        // A block the pool has is mapped at once, so that a fetch for a later one cannot evict it.
        int block = pool.lookup(key);
        if (block >= 0)
            pool.retain(block, owner_, seq_id, bs);
        else if (pool.available() > keep_available)
            block = pool.fetch(key, owner_, seq_id);
        if (block < 0) break;
        table_.push_back(block);
        hashes_.push_back(pool.hash(key));
    }
    const int hit = int(table_.size()) * bs;
    if (hit == 0) return 0;
    adopt(tokens.first(hit));
    pool.count_prefix_hit(hit);
    record(EventKind::prefix_hit, 0, hit);
    return hit;
}

std::unique_ptr<PagedCache> PagedCache::fork(int new_seq_id) const {
    auto child = std::make_unique<PagedCache>(pool(), model_, new_seq_id);
    child->trace = trace;
    for (std::size_t b = 0; b < table_.size(); b++)
        pool().retain(table_[b], child->owner_, new_seq_id, rows_of(int(b), length()));
    child->table_ = table_;
    child->hashes_ = hashes_;
    child->adopt(tokens());
    return child;
}

void check_pool_room(std::span<Cache* const> caches, std::span<const int> added) {
    std::map<const BlockPool*, int> left;                     // blocks each pool still has
    std::map<std::pair<const BlockPool*, int>, int> dropped;  // references earlier copies-on-write gave up
    for (std::size_t s = 0; s < caches.size(); s++) {
        const auto* seq = dynamic_cast<const PagedCache*>(caches[s]);
        if (!seq) continue;
        const BlockPool& pool = seq->pool();
        const int bs = pool.block_size(), length = seq->length(), b = length / bs;
        const std::vector<int>& table = seq->block_table();
        const int n_new = std::max(0, (length + added[s] + bs - 1) / bs - int(table.size()));
        int& available = left.try_emplace(&pool, pool.available()).first->second;
        const int block = length % bs != 0 && b < int(table.size()) ? table[b] : -1;
        const int refs = block < 0 ? 0 : pool.refcount(block) - dropped[{&pool, block}];
        // As reserve() decides, less the references earlier sequences' copies gave up.
        const bool cow = block >= 0 && pool.needs_copy(block) && (refs > 1 || pool.published(block));
        const int needed = n_new + (cow ? 1 : 0);
        if (needed > available)
            throw Error(fmt::format(
                "{}paged cache: sequence {} needs {} more blocks of {} positions, the pool has {} free",
                caches.size() > 1 ? fmt::format("batch: sequence {}: ", s) : "", seq->seq_id, needed, bs, available));
        available -= needed;
        if (!cow) continue;
        dropped[{&pool, block}]++;
        if (refs == 1) available++;  // the copied block was published and ours alone: now cached, reclaimable
    }
}

void PagedCache::set_kv_format(KVFormat format, std::span<const float> scales) {
    if (format != pool().storage().format ||
        (!scales.empty() && !std::equal(scales.begin(), scales.end(), pool().storage().host_scales.begin(),
                                        pool().storage().host_scales.end())))
        throw Error(
            fmt::format("paged cache: its blocks are the pool's, stored in {}; BlockPool::set_kv_format "
                        "sets them (not {})",
                        kv_format_name(pool().storage().format), kv_format_name(format)));
}

MemoryStats PagedCache::memory() const {
    MemoryStats m;
    m.used_bytes = kv_bytes(config_, length(), kv_format());
    m.payload_bytes = m.reserved_bytes = std::int64_t(table_.size()) * pool().block_bytes();
    m.allocated_bytes = m.reserved_bytes;  // blocks live in the pool; BlockPool::memory() measures it
    const MemoryStats p = pool().memory();
    m.blocks_total = p.blocks_total;
    m.blocks_used = p.blocks_used;
    m.blocks_free = p.blocks_free;
    m.blocks_cached = p.blocks_cached;
    return m;
}

std::string PagedCache::name() const {
    if (!*pool_alive_) return "paged(pool destroyed)";  // names it in messages
    return fmt::format("paged(block_size={}{})", pool_->block_size(), pool_->prefix_caching() ? ",prefix" : "");
}

}  // namespace kvlab
