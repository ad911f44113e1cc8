#include "cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

namespace kvlab {

std::string_view to_string(EventKind kind) {
    switch (kind) {
        case EventKind::append: return "append";
        case EventKind::block_allocated: return "block_allocated";
        case EventKind::block_shared: return "block_shared";
        case EventKind::copy_on_write: return "copy_on_write";
        case EventKind::evicted: return "evicted";
        case EventKind::rolled_back: return "rolled_back";
        case EventKind::freed: return "freed";
        case EventKind::prefix_hit: return "prefix_hit";
        case EventKind::grown: return "grown";
        case EventKind::stored: return "stored";
        case EventKind::fetched: return "fetched";
    }
    return "?";
}

std::string describe(const CacheEvent& e, std::string_view who) {
    switch (e.kind) {
        case EventKind::append: return fmt::format("{} append: positions {}..{}", who, e.pos, e.pos + e.count - 1);
        case EventKind::block_allocated: return fmt::format("{} block_allocated: block {}", who, e.block);
        case EventKind::block_shared: return fmt::format("{} block_shared: maps block {} too", who, e.block);
        case EventKind::copy_on_write:
            return fmt::format("{} copy_on_write: block {} -> {} (first row written: pos {})", who, e.from, e.block,
                               e.pos);
        case EventKind::evicted:
            return e.block >= 0 ? fmt::format("{} evicted: cached block {} reclaimed", who, e.block)
                                : fmt::format("{} evicted: pos {} left the window", who, e.pos);
        case EventKind::rolled_back:
            return fmt::format("{} rolled_back: length {}, {} positions forgotten", who, e.pos, e.count);
        case EventKind::freed: return fmt::format("{} freed: block {} back on the free list", who, e.block);
        case EventKind::prefix_hit:
            return fmt::format("{} prefix_hit: {} positions served from the prefix cache", who, e.count);
        case EventKind::grown: return fmt::format("{} grown: capacity {} positions", who, e.count);
        case EventKind::stored: return fmt::format("{} stored: block {} put into the store", who, e.block);
        case EventKind::fetched: return fmt::format("{} fetched: block {} restored from the store", who, e.block);
    }
    return fmt::format("{} event", who);
}

std::int64_t kv_bytes(const Config& c, std::int64_t T, KVFormat format) {
    return 2ll * kv_row_bytes(int(format), c.head_size()) * c.n_layers * T * c.n_kv_heads;
}

// ----------------------------------------------------------------------------------------------
// Storage

namespace {

// Bytes in each of K and V for n_rows rows, once the size limit has allowed them: every cache's
// rows (contiguous, growing, paged, window, quantized) are allocated here.
std::int64_t storage_bytes(std::int64_t n_rows, int head_size, KVFormat format, int group) {
    if (group != 0 && (group < 1 || head_size % group != 0))
        throw Error(fmt::format("a KV cache's group of {} channels does not divide head_size {}", group, head_size));
    const std::int64_t rb = kv_row_bytes(int(format), head_size, group);
    check_size(
        fmt::format("a KV cache ({} rows of head_size {}, K and V in {})", n_rows, head_size, kv_format_name(format)),
        n_rows, 2 * rb);
    return n_rows * rb;
}

}  // namespace

std::vector<float> checked_kv_scales(int n_layers, std::span<const float> scales) {
    if (scales.empty()) return std::vector<float>(std::size_t(n_layers) * 2, 1.0f);
    if (scales.size() != std::size_t(n_layers) * 2)
        throw Error(fmt::format("KV scales: {} given, a cache of {} layers takes {} (K and V per layer)", scales.size(),
                                n_layers, 2 * n_layers));
    for (std::size_t i = 0; i < scales.size(); i++)
        if (!(std::isfinite(scales[i]) && scales[i] > 0.0f))
            throw Error(fmt::format("KV scales: layer {}'s {} scale is {}; a scale is finite and > 0", i / 2,
                                    i % 2 ? "V" : "K", scales[i]));
    return {scales.begin(), scales.end()};
}

KVStorage::KVStorage(Memory& memory, std::int64_t n_rows_, int head_size_, std::int64_t layer_rows_,
                     std::int64_t head_rows_, KVFormat format_, std::span<const float> scales_, int group_)
    : charge(fmt::format("a KV cache ({} rows of head_size {}, K and V in {})", n_rows_, head_size_,
                         kv_format_name(format_)),
             2 * storage_bytes(n_rows_, head_size_, format_, group_)),
      k(memory, charge.bytes() / 2),
      v(memory, k.size()),
      scales(memory, std::int64_t(scales_.size())),
      host_scales(scales_.begin(), scales_.end()),
      n_rows(n_rows_),
      layer_rows(layer_rows_),
      head_rows(head_rows_),
      head_size(head_size_),
      format(format_),
      int_group(group_) {
    fill_nan_rows(k.data(), n_rows);
    fill_nan_rows(v.data(), n_rows);
    if (!host_scales.empty()) scales.upload(host_scales);
    assert(k.size() == n_rows * row_bytes() && v.size() == n_rows * row_bytes());
    assert(host_scales.size() == std::size_t(scales.size()));
}

KVStorage KVStorage::reformatted(int n_layers, KVFormat f, std::span<const float> new_scales) const {
    const std::vector<float> checked =
        new_scales.empty() ? std::vector<float>{} : checked_kv_scales(n_layers, new_scales);
    return KVStorage(memory(), n_rows, head_size, layer_rows, head_rows, f, checked);
}

float* KVStorage::k_f32() const {
    if (format != KVFormat::fp32)
        throw Error(fmt::format("kv storage: read as fp32, but it holds {}", kv_format_name(format)));
    return reinterpret_cast<float*>(k.data());
}

float* KVStorage::v_f32() const {
    if (format != KVFormat::fp32)
        throw Error(fmt::format("kv storage: read as fp32, but it holds {}", kv_format_name(format)));
    return reinterpret_cast<float*>(v.data());
}

void KVStorage::poison(const Config& c, std::int64_t slot, std::int64_t count) {
    for (int l = 0; l < c.n_layers; l++)
        for (int h = 0; h < c.n_kv_heads; h++) {
            fill_nan_rows(k_row(row(l, h, slot)), count);
            fill_nan_rows(v_row(row(l, h, slot)), count);
        }
}

void KVStorage::fill_nan_rows(std::uint8_t* row, std::int64_t n) const {
    if (kv_format_int(int(format))) {
        assert(row_bytes() % 4 == 0);  // kv_int_row_bytes pads every row to 4 bytes
        memory().fill_nan(row, n * row_bytes() / 4, int(KVFormat::fp32));
    } else {
        memory().fill_nan(row, n * head_size, int(format));
    }
}

std::int64_t KVStorage::group_scale_bytes() const {
    if (!kv_format_int(int(format))) return 0;
    return 2 * n_rows * (head_size / group()) * 2 * std::int64_t(sizeof(float));  // K and V, a scale and a min
}

// ----------------------------------------------------------------------------------------------
// The interface's bookkeeping: token record, append window, bounds.

Cache::Cache(const Config& config) : config_(config) {
    config_.validate();
    nan_row_.assign(std::size_t(config_.head_size()), kNaN);
}

void Cache::check_append(std::int64_t n) const {
    const std::int64_t end = length() + n;
    if (n == 0) throw Error("kv cache: nothing to append");
    if (end > config_.max_seq)
        throw Error(fmt::format("kv cache: {} positions do not fit max_seq = {}", end, config_.max_seq));
    if (n > max_append())
        throw Error(
            fmt::format("kv cache: {} appends at most {} positions at a time, not {}", name(), max_append(), n));
}

void Cache::append(std::span<const int> tokens) {
    const std::int64_t n = std::int64_t(tokens.size()), end = length() + n;
    check_append(n);
    reserve(int(end));  // may throw: nothing has changed yet
    append_start_ = length();
    record(EventKind::append, length(), int(n));
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
}

std::int64_t Cache::write_slot(int pos) {
    // Rows of earlier steps are final; rewriting one goes through truncate().
    if (pos < append_start_ || pos >= length())
        throw Error(fmt::format("kv cache: position {} is not one of the latest append's [{}, {})", pos, append_start_,
                                length()));
    on_write(pos);
    return slot(pos);
}

void Cache::stored(int l, std::span<const int> positions) {
    for (int pos : positions) on_stored(l, pos);
}

void Cache::write(int l, int pos, const float* k_row, const float* v_row) {
    check_head(l, 0);
    const std::int64_t s = write_slot(pos);
    const KVStorage& st = storage();
    const RowKV r = row_kv();
    const int hs = config_.head_size(), f = int(st.format), n_kv_heads = config_.n_kv_heads;
    const std::int64_t rb = st.row_bytes();
    // The rows replaced [n_kv_heads, row_bytes], put back when the variant refuses the new ones in
    // stored() (a quantized cache's per-channel keys out of order): a refused write changes nothing.
    // Keys quantized per channel go to the host residual as they are, as store_kv puts them.
    std::vector<std::uint8_t> old_k(std::size_t(n_kv_heads * rb)), old_v(old_k.size());
    std::vector<std::uint8_t> new_k(old_k.size()), new_v(old_k.size());  // the same, encoded as store_kv does
    std::vector<float> old_residual(r.key_group ? std::size_t(n_kv_heads) * hs : 0);  // [n_kv_heads, head_size]
    assert(old_k.size() == std::size_t(n_kv_heads) * std::size_t(rb));
    for (int h = 0; h < n_kv_heads; h++)
        for (int d = 0; d < hs; d++) {
            kv_store_element(f, new_k.data() + h * rb, d, k_row + h * hs, st.scale(l, 0), st.group(), hs);
            kv_store_element(f, new_v.data() + h * rb, d, v_row + h * hs, st.scale(l, 1), st.group(), hs);
        }
    for (int h = 0; h < n_kv_heads; h++) {
        st.memory().download(old_k.data() + h * rb, st.k_row(st.row(l, h, s)), rb);
        st.memory().download(old_v.data() + h * rb, st.v_row(st.row(l, h, s)), rb);
        if (r.key_group) {
            float* residual = r.kivi_residual(l, h, pos, hs);
            std::copy_n(residual, hs, old_residual.data() + std::size_t(h) * hs);
            std::copy_n(k_row + std::size_t(h) * hs, hs, residual);
        } else {
            st.memory().upload(st.k_row(st.row(l, h, s)), new_k.data() + h * rb, rb);
        }
        st.memory().upload(st.v_row(st.row(l, h, s)), new_v.data() + h * rb, rb);
    }
    const int positions[] = {pos};
    try {
        stored(l, positions);
        committed();  // a host write is its own request
    } catch (...) {
        for (int h = 0; h < n_kv_heads; h++) {
            st.memory().upload(st.k_row(st.row(l, h, s)), old_k.data() + h * rb, rb);
            st.memory().upload(st.v_row(st.row(l, h, s)), old_v.data() + h * rb, rb);
            if (r.key_group) std::copy_n(old_residual.data() + std::size_t(h) * hs, hs, r.kivi_residual(l, h, pos, hs));
        }
        throw;
    }
}

int Cache::attended(int pos, std::int64_t* slots, int* positions) const {
    for (int t = 0; t <= pos; t++) {
        slots[t] = slot(t);
        if (positions) positions[t] = t;
    }
    return pos + 1;
}

RowKV Cache::row_kv() const {
    const KVStorage& st = storage();
    RowKV r;
    r.k = st.k.data();
    r.v = st.v.data();
    r.scales = st.scales.data();  // null when there are none: all 1
    r.layer_rows = st.layer_rows;
    r.head_rows = st.head_rows;
    r.format = int(st.format);
    r.row_bytes = st.row_bytes();
    r.group = st.group();
    return r;
}

void Cache::set_kv_format(KVFormat format, std::span<const float>) {
    if (format != kv_format())
        throw Error(fmt::format("{} stores K and V in fp32 only, not {}", name(), kv_format_name(format)));
}

// A layer or KV head out of range would address rows outside the storage (a position out of range
// reads NaN, as documented).
void Cache::check_head(int l, int h) const {
    if (l < 0 || l >= config_.n_layers)
        throw Error(fmt::format("kv cache: no layer {} (n_layers = {})", l, config_.n_layers));
    if (h < 0 || h >= config_.n_kv_heads)
        throw Error(fmt::format("kv cache: no KV head {} (n_kv_heads = {})", h, config_.n_kv_heads));
}

namespace {

// A row of storage where the host can read it: in place, or downloaded into `bytes` from a device.
const std::uint8_t* host_row(const KVStorage& st, const std::uint8_t* row, std::vector<std::uint8_t>& bytes) {
    if (st.memory().host_visible()) return row;
    bytes.resize(std::size_t(st.row_bytes()));  // [row_bytes]
    st.memory().download(bytes.data(), row, st.row_bytes());
    return bytes.data();
}

// Row (l, h, slot) of one tensor of host-visible storage, decoded into `out` [head_size] as
// attention decodes it; fp32 is returned in place.
const float* decoded_row(const KVStorage& st, const std::uint8_t* row, float scale, std::vector<float>& out) {
    if (st.format == KVFormat::fp32) return reinterpret_cast<const float*>(row);
    out.resize(std::size_t(st.head_size));
    assert(out.size() == std::size_t(st.head_size));
    for (int d = 0; d < st.head_size; d++)
        out[std::size_t(d)] = kv_load(int(st.format), row, d, scale, st.group(), st.head_size);
    return out.data();
}

}  // namespace

const float* Cache::key(int l, int h, int t) const {
    check_head(l, h);
    const KVStorage& st = storage();
    const std::int64_t s = t >= 0 && t < length() ? head_slot(l, h, t) : -1;
    if (s < 0) return nan_row_.data();
    return decoded_row(st, host_row(st, st.k_row(st.row(l, h, s)), row_bytes_), st.scale(l, 0), key_row_);
}

const float* Cache::value(int l, int h, int t) const {
    check_head(l, h);
    const KVStorage& st = storage();
    const std::int64_t s = t >= 0 && t < length() ? head_slot(l, h, t) : -1;
    if (s < 0) return nan_row_.data();
    return decoded_row(st, host_row(st, st.v_row(st.row(l, h, s)), row_bytes_), st.scale(l, 1), value_row_);
}

void Cache::truncate(int n) {
    if (n < 0 || n > length()) throw Error(fmt::format("kv cache: cannot roll back to {} (length is {})", n, length()));
    const int forgotten = length() - n;
    release(n);
    record(EventKind::rolled_back, n, forgotten);
    tokens_.resize(n);
    append_start_ = std::min(append_start_, length());
}

// Refused for a cache holding rows in every variant, with a prefix cache or not: a hit would
// replace them.
int Cache::attach_prefix(std::span<const int>) {
    if (length() != 0)
        throw Error(
            fmt::format("kv cache: a prefix attaches only to an empty sequence, not to one of length {}", length()));
    return 0;
}

std::unique_ptr<CacheSnapshot> Cache::snapshot(int) const {
    auto s = std::make_unique<CacheSnapshot>();
    s->length = length();
    return s;
}

void Cache::restore(const CacheSnapshot& s) {
    if (length() > s.length) truncate(s.length);
}

void Cache::set_tokens(std::span<const int> tokens) {
    tokens_.assign(tokens.begin(), tokens.end());
    append_start_ = length();
}

void Cache::adopt(std::span<const int> tokens) {
    assert(length() == 0);
    tokens_.assign(tokens.begin(), tokens.end());
    append_start_ = length();
}

void Cache::record(EventKind kind, int pos, int count, int block, int from) const {
    if (trace) trace->push_back(CacheEvent{kind, seq_id, pos, count, block, from});
}

// ----------------------------------------------------------------------------------------------
// Contiguous

ContiguousCache::ContiguousCache(const Config& config, Layout layout, int capacity, Memory& memory)
    : Cache(config), layout_(layout), capacity_(capacity), storage_(make_storage(memory, capacity)) {}

KVStorage ContiguousCache::make_storage(Memory& memory, int capacity, KVFormat format,
                                        std::span<const float> scales) const {
    const Config& c = config_;
    const std::int64_t rows = std::int64_t(c.n_layers) * c.n_kv_heads * capacity;
    if (layout_ == Layout::head_major)  // [n_layers, n_kv_heads, capacity, head_size]
        return KVStorage(memory, rows, c.head_size(), std::int64_t(c.n_kv_heads) * capacity, capacity, format, scales);
    // [n_layers, capacity, n_kv_heads, head_size]
    return KVStorage(memory, rows, c.head_size(), std::int64_t(capacity) * c.n_kv_heads, 1, format, scales);
}

// The storage is made again: its size follows the format.
void ContiguousCache::set_kv_format(KVFormat format, std::span<const float> scales) {
    if (length() != 0)
        throw Error(fmt::format("{}: the KV format changes only while the cache is empty", name()));
    const std::vector<float> checked =
        scales.empty() ? std::vector<float>{} : checked_kv_scales(config_.n_layers, scales);
    storage_ = make_storage(storage_.memory(), capacity_, format, checked);
}

std::int64_t ContiguousCache::slot(int t) const {
    return layout_ == Layout::head_major ? std::int64_t(t) : std::int64_t(t) * config_.n_kv_heads;
}

void ContiguousCache::reserve(int new_length) { assert(new_length <= capacity_); }

void ContiguousCache::release(int n) {
    if (layout_ == Layout::head_major) {
        storage_.poison(config_, n, length() - n);
        return;
    }
    for (int t = n; t < length(); t++) storage_.poison(config_, slot(t), 1);
}

// Slots are a fixed stride apart: no call per row.
int ContiguousCache::attended(int pos, std::int64_t* slots, int* positions) const {
    const std::int64_t stride = slot(1);
    for (int t = 0; t <= pos; t++) {
        slots[t] = t * stride;
        if (positions) positions[t] = t;
    }
    return pos + 1;
}

MemoryStats position_rows_memory(const Config& config, const KVStorage& storage, std::int64_t capacity,
                                 std::int64_t held) {
    MemoryStats m;
    m.used_bytes = kv_bytes(config, held, storage.format);
    // An integer format's group scales live inside its rows: metadata, not payload.
    m.payload_bytes = kv_bytes(config, capacity, storage.format) - storage.group_scale_bytes();
    m.metadata_bytes =
        std::int64_t(sizeof(float)) * std::int64_t(storage.host_scales.size()) + storage.group_scale_bytes();
    m.reserved_bytes = m.payload_bytes + m.metadata_bytes;
    m.allocated_bytes = storage.bytes();
    return m;
}

MemoryStats ContiguousCache::memory() const { return position_rows_memory(config_, storage_, capacity_, length()); }

std::string ContiguousCache::name() const {
    return layout_ == Layout::head_major ? "contiguous-head" : "contiguous-seq";
}

// ----------------------------------------------------------------------------------------------
// Growing

GrowingCache::GrowingCache(const Config& config, int initial_capacity, Memory& memory)
    : ContiguousCache(config, Layout::head_major, 0, memory), initial_capacity_(initial_capacity) {
    if (initial_capacity < 1 || initial_capacity > config_.max_seq)
        throw Error(fmt::format("growing cache: initial capacity {} is outside [1, max_seq = {}]", initial_capacity,
                                config_.max_seq));
}

void GrowingCache::reserve(int new_length) {
    if (new_length <= capacity_) return;
    int cap = capacity_ == 0 ? initial_capacity_ : capacity_;
    while (cap < new_length) cap = int(std::min<std::int64_t>(2ll * cap, config_.max_seq));
    KVStorage grown = make_storage(storage_.memory(), cap, storage_.format, storage_.host_scales);
    const std::int64_t bytes = storage_.row_bytes() * length();  // a (layer, head)'s rows are adjacent
    for (int l = 0; l < config_.n_layers; l++)
        for (int h = 0; h < config_.n_kv_heads; h++) {
            storage_.memory().copy(grown.k_row(grown.row(l, h, 0)), storage_.k_row(storage_.row(l, h, 0)), bytes);
            storage_.memory().copy(grown.v_row(grown.row(l, h, 0)), storage_.v_row(storage_.row(l, h, 0)), bytes);
        }
    if (capacity_ > 0) {
        reallocations_++;
        bytes_copied_ += kv_bytes(config_, length(), storage_.format);
    }
    storage_ = std::move(grown);
    capacity_ = cap;
    assert(storage_.n_rows == std::int64_t(config_.n_layers) * config_.n_kv_heads * cap);
    record(EventKind::grown, -1, cap);
}

MemoryStats GrowingCache::memory() const {
    MemoryStats m = ContiguousCache::memory();
    m.reallocations = reallocations_;
    m.bytes_copied = bytes_copied_;
    return m;
}

std::string GrowingCache::name() const { return fmt::format("growing(initial={})", initial_capacity_); }

}  // namespace kvlab
