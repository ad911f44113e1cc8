// kvlab core: the cache interface every decoder runs on, and the contiguous variants.
//
// A cache holds, for one sequence, the K and V rows of logical positions 0..length()-1: for
// each layer l, KV head h and position t, head_size floats. Variants differ only in where those
// rows live (one array per tensor, a growing array, blocks of a shared pool, a quantized copy, a
// window). Attention asks for the rows a query at pos attends to and walks them in increasing
// logical position, so every variant feeds the same kernel (kernels.h: attention_row).
//
// Bookkeeping apart from storage (as llama.cpp's kv-cells and nano-vllm's block manager): a
// cache's tokens, lengths, tables and counts are host-side and never touch a float; its K and V
// rows live in a KVStorage in some backend's Memory (backend.h). The decoder and the kernels
// see only slots: integer row indices into that storage, the same on the CPU and on a GPU.
//
// A step goes: append(tokens) makes room for the new positions and records their tokens;
// write_slot(pos) says where each new position's rows go; for every layer the backend stores
// them there (Backend::store_kv), stored() lets the variant react (quantize, publish a full
// block), and attention reads the slots attended() lists. Rows not yet written, and memory not
// holding a row, read as NaN: a read past a sequence's valid rows poisons the logits at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend.h"
#include "config.h"

namespace kvlab {

// What a cache did, for the viewer and the tests. Positions are logical, blocks physical.
enum class EventKind {
    append,           // pos, count: positions made room for
    block_allocated,  // block (taken from the free list, or from the prefix cache by eviction)
    block_shared,     // block: one more sequence maps it (prefix hit or fork)
    copy_on_write,    // block: the private copy; from: the shared original; pos: first row written
    evicted,          // block: an unreferenced cached block reclaimed, or pos: a row out of a window
    rolled_back,      // pos: the new length; count: positions forgotten
    freed,            // block: back on the free list
    prefix_hit,       // pos 0, count: tokens served from the prefix cache
    grown,            // count: the new capacity in positions
    stored,           // block: its record put into the pool's store (block_store.h)
    fetched,          // block: restored from the store's record
};
std::string_view to_string(EventKind kind);

struct CacheEvent {
    EventKind kind;
    int seq = -1;    // the sequence's id
    int pos = -1;    // a logical position
    int count = 0;   // positions
    int block = -1;  // a physical block
    int from = -1;   // the block copied from (copy_on_write)
};
// The event as one line, `who` naming its sequence: "A copy_on_write: block 3 -> 7 (first row
// written: pos 6)". `kvlab pool --events` and the viewer's paged panel print these.
std::string describe(const CacheEvent& e, std::string_view who);

// Memory a cache holds. reserved_bytes counts what the variant says it allocated for K and V
// (payload plus metadata); allocated_bytes is measured from its buffers; they must agree.
struct MemoryStats {
    std::int64_t used_bytes = 0;       // K and V of the valid positions, in the cache's format
    std::int64_t reserved_bytes = 0;   // payload + metadata the variant accounts for
    std::int64_t allocated_bytes = 0;  // summed from the buffers themselves
    std::int64_t payload_bytes = 0;    // K and V values as stored (fp32, bf16, ..., int8, packed int4)
    std::int64_t metadata_bytes = 0;   // scales and zero points (fp8's per layer, integer groups')
    std::int64_t scratch_bytes = 0;    // working memory outside the cache proper (dequantized rows)
    std::int64_t reallocations = 0;    // growing cache: times the arrays moved
    std::int64_t bytes_copied = 0;     // growing cache: bytes those moves copied
    int blocks_total = 0, blocks_used = 0, blocks_free = 0, blocks_cached = 0;  // paged pools
};

// A cache's K and V rows: two buffers of rows of head_size elements in `format` (kv_format.h),
// codes only (and an integer format's group scales, inside each row), and the fp8 scales. The row of (layer l, KV head
// h, slot s) is row l * layer_rows + h * head_rows + s of each (backend.h: RowKV).
struct KVStorage {
    MemoryCharge charge;             // k and v on the memory budget, charged before they are allocated
    Buffer<std::uint8_t> k, v;       // [n_rows, row_bytes()] bytes: rows of head_size elements of `format`
    Buffer<float> scales;            // [n_layers, 2] layer l's K scale, then V scale (read by fp8); none: all 1
    std::vector<float> host_scales;  // the same, on the host
    std::int64_t n_rows = 0, layer_rows = 0, head_rows = 0;
    int head_size = 0;
    KVFormat format = KVFormat::fp32;
    int int_group = 0;  // an integer format's channels per scale; 0: kv_int_group(head_size)
    KVStorage() = default;
    // n_rows rows of head_size elements each, every one NaN. scales: [n_layers, 2] as
    // checked_kv_scales checks them, or empty for all 1. group: an integer format's channels per
    // scale (a divisor of head_size), 0 for kv_int_group's.
    KVStorage(Memory& memory, std::int64_t n_rows, int head_size, std::int64_t layer_rows, std::int64_t head_rows,
              KVFormat format = KVFormat::fp32, std::span<const float> scales = {}, int group = 0);
    float scale(int l, int kv) const { return host_scales.empty() ? 1.0f : host_scales[std::size_t(2 * l + kv)]; }
    Memory& memory() const { return *k.memory(); }
    std::int64_t row(int l, int h, std::int64_t slot) const { return l * layer_rows + h * head_rows + slot; }
    std::int64_t row_bytes() const { return kv_row_bytes(int(format), head_size, int_group); }
    // An integer format's channels per scale; 0 for the float formats.
    int group() const {
        return int_group && kv_format_int(int(format)) ? int_group : kv_row_group(int(format), head_size);
    }
    std::uint8_t* k_row(std::int64_t r) const { return k.data() + r * row_bytes(); }
    std::uint8_t* v_row(std::int64_t r) const { return v.data() + r * row_bytes(); }
    // fp32 storage read as floats [n_rows, head_size] (host code over an fp32 cache).
    float* k_f32() const;
    float* v_f32() const;
    // Storage of the same rows and geometry, all NaN, in another format with `scales` (checked as
    // checked_kv_scales checks them; empty: all 1): a cache's set_kv_format while it is empty.
    KVStorage reformatted(int n_layers, KVFormat format, std::span<const float> scales) const;
    // NaN in `count` consecutive slots from `slot`, for every layer and KV head.
    void poison(const Config& c, std::int64_t slot, std::int64_t count);
    // NaN in n_rows rows of one tensor from `row` (its first byte).
    void fill_nan_rows(std::uint8_t* row, std::int64_t n_rows) const;
    // Bytes of the integer formats' scales and minimums in both tensors (inside the rows), 0 for
    // the float formats: the metadata that memory() reports apart from the codes.
    std::int64_t group_scale_bytes() const;
    std::int64_t payload_bytes() const { return k.bytes() + v.bytes(); }
    std::int64_t bytes() const { return k.bytes() + v.bytes() + scales.bytes(); }
};

// A cache's scales [n_layers, 2] (K, then V, per layer): `scales` itself, or all 1 when it is
// empty; throws Error for another size or a scale that is not finite and > 0.
std::vector<float> checked_kv_scales(int n_layers, std::span<const float> scales);

// What a cache held before a request of several steps, to put back if a later step fails
// (Cache::snapshot). The base keeps the length; a variant adds what truncating cannot restore.
struct CacheSnapshot {
    virtual ~CacheSnapshot() = default;
    int length = 0;
};

class Cache {
public:
    explicit Cache(const Config& config);
    virtual ~Cache() = default;
    Cache(const Cache&) = delete;
    Cache& operator=(const Cache&) = delete;

    // The public operations are virtual so that a decorator (forwarding.h: ForwardingCache) can
    // wrap any variant; variants themselves override only the protected hooks below.

    // Makes room for tokens at positions length()..length()+n-1 and records them; their rows are
    // then written with write(). Throws Error and changes nothing when they do not fit.
    virtual void append(std::span<const int> tokens);
    // Throws Error, as append() of n positions would, when they do not fit max_seq or max_append()
    // (a pool's free blocks are its own check: paged.h, check_pool_room).
    virtual void check_append(std::int64_t n) const;
    // The slot where position pos's rows go; pos must be one of the latest append()'s.
    virtual std::int64_t write_slot(int pos);
    // Layer l's rows of `positions` are now in storage (written by the backend at their
    // write_slot): the variant's chance to react (a quantized cache quantizes them, a paged one
    // publishes a block the last layer completed).
    virtual void stored(int l, std::span<const int> positions);
    // Host convenience (tests): writes the host rows [kv_dim] of layer l at position pos, one of
    // the latest append()'s, and calls stored().
    void write(int l, int pos, const float* k_row, const float* v_row);

    // The slot holding position t's rows, or -1 when the cache holds none for t.
    virtual std::int64_t slot(int t) const = 0;
    // The slots a query at position pos attends to, in increasing logical position (and those
    // positions, if asked); returns how many: pos + 1 for every exact variant (all of 0..pos).
    virtual int attended(int pos, std::int64_t* slots, int* positions = nullptr) const;
    // Where the rows live.
    virtual const KVStorage& storage() const = 0;
    // What a query row of this cache passes to the kernels (write_slot and n left unset).
    virtual RowKV row_kv() const;
    // The format its K and V are stored in, and the scales (kv_format.h: [n_layers, 2], read by
    // fp8). set_kv_format changes them while the cache holds nothing (scales empty: all 1);
    // variants that keep fp32 only (so far: all but contiguous, growing and paged, whose pool
    // has the format) refuse with an Error.
    KVFormat kv_format() const { return storage().format; }
    const std::vector<float>& kv_scales() const { return storage().host_scales; }  // empty: all 1
    virtual void set_kv_format(KVFormat format, std::span<const float> scales = {});
    // The head_size floats of layer l, KV head h, position t (NaN when not held), read from
    // storage (downloaded from a device) and decoded as attention decodes them (the pointer is
    // valid until the next call); throws Error for a layer or head out of range.
    virtual const float* key(int l, int h, int t) const;
    virtual const float* value(int l, int h, int t) const;
    // The most positions one append() may add (a window's ring needs its rows read before they
    // are overwritten); the decoder splits a longer prefill into chunks of this size.
    virtual int max_append() const { return config_.max_seq; }
    // The most positions a decoder's step adds: max_append(), or fewer where what a query reads
    // depends on which positions one step holds (a quantized cache's per-channel keys: 1).
    virtual int max_step() const { return max_append(); }
    // A cache that chooses what to keep by attention (H2O, h2o_cache.h) reads its query's softmax
    // weights: the decoder runs its steps one row at a time, alone, and after layer l's attention
    // hands it the weights w [n_heads, n] of that row, over the n slots attended() listed.
    virtual bool reads_attention() const { return false; }
    virtual void attention_weights(int l, std::span<const float> w) { (void)l, (void)w; }

    virtual int length() const { return int(tokens_.size()); }
    virtual std::span<const int> tokens() const { return tokens_; }
    // Rollback: forgets positions >= n, as speculative decoding does with rejected drafts.
    virtual void truncate(int n);
    // A request that fails part-way (a step's kernel, a later chunk of a prefill) leaves the cache
    // as it was: snapshot(added) before it appends `added` positions, restore() after the
    // failure. The base keeps the length and truncates back, exact wherever a rollback gives back
    // what the cache held; a window whose ring the request wraps over evicted rows, and a
    // quantized cache whose request completes a key group (the open group's raw keys are
    // replaced), keep copies of what it can overwrite.
    virtual std::unique_ptr<CacheSnapshot> snapshot(int added) const;
    virtual void restore(const CacheSnapshot& s);
    // The request that wrote the latest rows succeeded: they may now be shared (a paged cache
    // publishes the blocks they completed to its pool's prefix cache). A failed request never
    // gets here, so nothing it wrote is ever published.
    virtual void committed() {}
    void clear() { truncate(0); }
    // Prefix caching: maps already computed rows for the longest usable prefix of tokens into
    // this empty cache and returns how many positions it now holds (0 for variants without).
    // Throws Error for a cache that is not empty.
    virtual int attach_prefix(std::span<const int> tokens);

    virtual MemoryStats memory() const = 0;
    virtual std::string name() const = 0;  // the variant and its parameters
    const Config& config() const { return config_; }

    // The events of this cache are appended here when it is set (the viewer, tests).
    std::vector<CacheEvent>* trace = nullptr;
    int seq_id = 0;  // names this sequence in events

protected:
    // Room for positions up to new_length (exclusive); must throw before changing anything.
    virtual void reserve(int new_length) = 0;
    // Bookkeeping before position pos is written; may refuse (a paged cache's shared block).
    virtual void on_write(int pos) { (void)pos; }
    // May refuse (throw Error) before changing anything; write() then puts the old rows back.
    virtual void on_stored(int l, int pos) { (void)l, (void)pos; }
    // Forget positions >= n; the rows' memory reads NaN again.
    virtual void release(int n) = 0;
    void record(EventKind kind, int pos = -1, int count = 0, int block = -1, int from = -1) const;
    // For attach_prefix: positions 0..tokens.size()-1 now hold rows computed elsewhere.
    void adopt(std::span<const int> tokens);
    // For restore: the cache's tokens are these again (its rows put back by the variant).
    void set_tokens(std::span<const int> tokens);
    void check_head(int l, int h) const;  // throws Error for a layer or KV head out of range
    // The slot holding layer l's, KV head h's row of position t, or -1 (key(), value()): slot(t),
    // unless the variant keeps other positions per layer and head (H2O).
    virtual std::int64_t head_slot(int l, int h, int t) const {
        (void)l, (void)h;
        return slot(t);
    }

    Config config_;

private:
    std::vector<int> tokens_;
    int append_start_ = 0;  // first position of the latest append: rows before it are final
    std::vector<float> nan_row_;  // [head_size] what key()/value() return for a position not held
    mutable std::vector<float> key_row_, value_row_;  // [head_size] key()/value()'s decoded rows
    mutable std::vector<std::uint8_t> row_bytes_;     // [row_bytes] a row downloaded from a device
};

// One array per tensor, reserved for max_seq positions, in one of two layouts:
//   head_major  [n_layers][n_kv_heads][max_seq][head_size]  the rows a head reads are adjacent
//   seq_major   [n_layers][max_seq][n_kv_heads][head_size]  llama2.c's: a position's kv_dim
//                                                            floats are adjacent
class ContiguousCache : public Cache {
public:
    enum class Layout { head_major, seq_major };
    explicit ContiguousCache(const Config& config, Layout layout = Layout::head_major, Memory& memory = host_memory())
        : ContiguousCache(config, layout, config.max_seq, memory) {}

    // head_major: slot t of a [max_seq]-row run per (layer, head); seq_major: t * n_kv_heads.
    std::int64_t slot(int t) const override;
    int attended(int pos, std::int64_t* slots, int* positions = nullptr) const override;
    const KVStorage& storage() const override { return storage_; }
    void set_kv_format(KVFormat format, std::span<const float> scales = {}) override;
    MemoryStats memory() const override;
    std::string name() const override;
    Layout layout() const { return layout_; }
    int capacity() const { return capacity_; }

protected:
    // Room for `capacity` positions (a growing cache starts with none).
    ContiguousCache(const Config& config, Layout layout, int capacity, Memory& memory);
    void reserve(int new_length) override;
    void release(int n) override;
    // Storage for `capacity` positions in this layout, all NaN, in the format and scales given.
    KVStorage make_storage(Memory& memory, int capacity, KVFormat format = KVFormat::fp32,
                           std::span<const float> scales = {}) const;

    Layout layout_;
    int capacity_;
    // k, v: [n_layers, n_kv_heads, capacity, head_size] (head_major) or
    //       [n_layers, capacity, n_kv_heads, head_size] (seq_major)
    KVStorage storage_;
};

// Head-major like ContiguousCache, but with no max_seq reservation: capacity starts small and
// doubles when a position does not fit, moving every row (counted as reallocations and bytes
// copied, the price of not knowing the length in advance).
class GrowingCache : public ContiguousCache {
public:
    explicit GrowingCache(const Config& config, int initial_capacity = 1, Memory& memory = host_memory());
    MemoryStats memory() const override;
    std::string name() const override;

protected:
    void reserve(int new_length) override;

private:
    int initial_capacity_;
    std::int64_t reallocations_ = 0, bytes_copied_ = 0;
};

// Bytes of K and V for T positions: 2 * bytes * n_layers * T * n_kv_heads * head_size, bytes
// the format's per element (fp32: 4).
std::int64_t kv_bytes(const Config& config, std::int64_t T, KVFormat format = KVFormat::fp32);
// The memory of a cache whose storage holds `capacity` positions' rows (contiguous, window,
// plugin), `held` of them in use: payload, the scales as metadata, and the storage's own bytes.
MemoryStats position_rows_memory(const Config& config, const KVStorage& storage, std::int64_t capacity,
                                 std::int64_t held);

}  // namespace kvlab
