// kvlab core: caches whose bookkeeping is a plugin's (include/kvlab/cache_plugin.h), loaded from
// a shared library, so that kvlab's exactness checks run on a cache kvlab did not write.
//
// A PluginPool keeps the rows (head-major, n_slots per layer and KV head, as ContiguousCache
// keeps max_seq) for a family of PluginCache sequences; the plugin says which slot each position
// of each sequence lives in. kvlab keeps its own books beside the plugin's and checks every
// answer before using it: a slot out of range, a new position's slot that some sequence still
// holds, a held position whose slot moved without a copy, a copy onto a held slot, a fork whose
// child does not share its parent's slots, a prefix hit or an attended slot whose rows were
// written for another prefix, or a refusal, is an Error naming the call, its arguments and the
// bad value. A crash in the plugin is not caught here: `kvlab verify --plugin` runs the checks in
// a child process for that.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cache.h"
#include "kvlab/cache_plugin.h"

namespace kvlab {

// A loaded plugin library, seen through the version 3 table (a version 2 table is its first part;
// a version 1 plugin is adapted: one sequence per pool, no fork, no prefix reuse, no copies).
// Throws Error, in one line, for a file that does not load, no entry symbol, a table of a version
// kvlab does not read, with a null required function or a declared block size out of range.
class CachePlugin {
public:
    // What makes a pool of a plugin that is not a library, or null with a message in err.
    using PoolMaker = std::function<kvlab_cache_pool*(const kvlab_cache_config&, char* err, std::size_t err_len)>;
    explicit CachePlugin(const std::string& path);
    // A plugin that is not a library (the Python module's adapter): its table (create_pool unused;
    // release may be null whatever its version) and what makes its pools. Throws Error as above.
    CachePlugin(const std::string& name, const kvlab_cache_plugin_abi3& table, PoolMaker make_pool);
    ~CachePlugin();
    CachePlugin(const CachePlugin&) = delete;
    CachePlugin& operator=(const CachePlugin&) = delete;
    const kvlab_cache_plugin_abi3& table() const { return table_; }
    // A pool for `config` (the plugin's create_pool, or the version 1 adapter's), or null with a message.
    kvlab_cache_pool* create_pool(const kvlab_cache_config& config, char* err, std::size_t err_len) const;
    int abi_version() const { return abi_version_; }
    // What the plugin declares (cache_plugin.h): the calls it makes, the pools it accepts.
    bool can_fork() const { return table_.fork != nullptr; }
    bool reuses_prefixes() const { return table_.attach_prefix != nullptr; }
    bool releases_part() const { return table_.release != nullptr; }  // else sequences are freed only whole
    bool has_step_done() const { return table_.step_done != nullptr; }
    bool one_sequence() const { return abi_version_ == 1; }  // a version 1 pool holds one sequence
    // The block sizes a pool accepts (empty: any of 1..64), and the most sequences (0: any).
    const std::vector<int>& block_sizes() const { return block_sizes_; }
    int max_sequences() const { return one_sequence() ? 1 : table_.max_sequences; }
    bool accepts_block_size(int block_size) const;
    std::string block_sizes_text() const;              // "16, 32", or "1..64" when it lists none
    const std::string& name() const { return name_; }  // the table's, or the file's when it has none
    const std::string& path() const { return path_; }

private:
    // The version 3 fields' checks, and the declared block sizes read (throws Error).
    void check_declared();

    std::string path_, name_;
    void* handle_ = nullptr;
    int abi_version_ = 0;
    kvlab_cache_plugin_abi3 table_{};                    // the plugin's, or the version 1 adapter's
    const kvlab_cache_plugin_abi1* v1_table_ = nullptr;  // a version 1 plugin's own table
    PoolMaker make_pool_;                                // a plugin that is not a library
    std::vector<int> block_sizes_;                       // [n_block_sizes] as declared
};

class PluginCache;

// Where kvlab writes the plugin call under way ("reserve(length=4, n=2) of sequence 1"),
// NUL-terminated, before each call into a plugin, and "" after it returns: `kvlab verify --plugin`
// points it at memory its parent reads when the child dies inside a call. Null or size 0: none.
void set_plugin_call_note(char* buffer, std::size_t size);
// Called before each call into a plugin (null: none): verify's plugin check sends the case's call
// log on from there, so that a call that never returns still leaves the log up to it.
void set_plugin_call_hook(std::function<void()> hook);

// A reserve the plugin refused when the pool had no room for it: fewer wholly free blocks (no
// slot held, in kvlab's books) than the reserve could need. A refusal with room is an Error
// naming the call instead. The checks catch this, note the full pool, and go on.
struct PoolFull : Error {
    using Error::Error;
};

// The prefix a slot's rows were computed for: position pos holding `token`, after `parent`'s.
// Interned by the pool, so two rows were computed for the same prefix iff their nodes are equal.
struct PrefixNode {
    const PrefixNode* parent = nullptr;
    int token = 0, pos = 0;
    std::map<int, std::unique_ptr<PrefixNode>> children;
};

// One thing kvlab did to a pool, in order: a line of a replayable log (proofs/plugin_replay.h).
// A plugin call with its arguments and answer, or rows written or read (kvlab's books follow
// them). Consecutive writes or reads of one sequence's positions share an entry.
struct PluginLogEntry {
    enum Call { create, attach_prefix, reserve, write, read, step_done, release, fork, destroy } call;
    int seq = 0;
    int a = 0, b = 0;                     // reserve: length; attach_prefix: hit; write, read: first and
                                          // last position; release: n; fork: the child's id
    std::vector<int> tokens;              // reserve, attach_prefix
    std::vector<std::int64_t> slots;      // reserve: the new positions' slots
    std::vector<kvlab_slot_copy> copies;  // reserve
    std::vector<kvlab_slot_move> moves;   // step_done
    std::string refused;                  // reserve: a refusal's message ("" when it answered)
};

// One pool of the plugin, its rows and kvlab's books on them.
class PluginPool {
public:
    // n_slots: rows per layer and KV head (0: max_sequences * (max_seq + 2 * block_size), room
    // for every sequence); block_size: the plugin's hint, one it accepts, dividing n_slots;
    // max_sequences: at most the plugin's (Error otherwise).
    PluginPool(const Config& config, const CachePlugin& plugin, Memory& memory = host_memory(), int n_slots = 0,
               int max_sequences = 1, int block_size = 1);
    ~PluginPool();  // after its sequences (asserted)
    PluginPool(const PluginPool&) = delete;
    PluginPool& operator=(const PluginPool&) = delete;

    const Config& config() const { return config_; }
    const CachePlugin& plugin() const { return plugin_; }
    const KVStorage& storage() const { return storage_; }
    int n_slots() const { return n_slots_; }
    int max_sequences() const { return max_sequences_; }
    int block_size() const { return block_size_; }
    // The KV format of every slot; changes only while no sequence holds a position.
    void set_kv_format(KVFormat format, std::span<const float> scales = {});
    std::int64_t bookkeeping_bytes() const;  // the plugin's memory() answer
    // Fill, from kvlab's books: blocks (block_size slots from a multiple of it) with a slot some
    // sequence holds, and the most of those blocks and of such slots so far.
    int blocks_in_use() const { return blocks_in_use_; }
    int n_blocks() const { return n_slots_ / block_size_; }
    int peak_held_slots() const { return peak_held_slots_; }
    int peak_blocks_in_use() const { return peak_blocks_in_use_; }
    // Every call and row access from now on is appended to *log (null: none), for a replay.
    void set_log(std::vector<PluginLogEntry>* log) { log_ = log; }
    // Positions step_done moved onto identical rows (deduplication), over the pool's life.
    std::int64_t moved_positions() const { return moved_positions_; }
    // Blocks a reserve of n positions may need: n / block_size rounded up, and one for a copy of
    // a shared last block. A refusal while more blocks than that are wholly free is an Error.
    int blocks_needed(int n) const { return (n + block_size_ - 1) / block_size_ + 1; }

private:
    friend class PluginCache;
    struct Hold {  // a sequence holding a position in a slot
        const PluginCache* seq;
        int pos;
    };
    const PrefixNode* child(const PrefixNode* parent, int token, int pos);
    // A new log entry (null without a log); `pos` for a write or read, which extends the last
    // entry when it is the same access of the same sequence at the next position.
    PluginLogEntry* logged(PluginLogEntry::Call call, int seq, int pos = -1);
    void hold(std::int64_t slot, const PluginCache* seq, int pos);
    void unhold(std::int64_t slot, const PluginCache* seq);
    // Applies a reserve's copies after checking them (ranges, overlap, a held destination).
    void copy(std::span<const kvlab_slot_copy> copies, const std::string& call);
    std::string holder_text(std::int64_t slot) const;  // "position 3 of sequence 1"
    std::string content_text(std::int64_t slot) const;

    Config config_;
    const CachePlugin& plugin_;
    int n_slots_, max_sequences_, block_size_;
    kvlab_cache_pool* handle_ = nullptr;
    KVStorage storage_;
    std::vector<std::vector<Hold>> holders_;            // [n_slots] the sequences holding each slot
    std::vector<const PrefixNode*> content_;            // [n_slots] the prefix each slot's rows are for (null: none)
    std::map<int, std::unique_ptr<PrefixNode>> roots_;  // the interned prefixes, by first token
    std::vector<int> block_held_;                       // [n_blocks] the held slots of each block
    int live_ = 0;
    int held_slots_ = 0, blocks_in_use_ = 0, peak_held_slots_ = 0, peak_blocks_in_use_ = 0;
    std::int64_t moved_positions_ = 0;
    std::vector<PluginLogEntry>* log_ = nullptr;
};

class PluginCache final : public Cache {
public:
    // An empty sequence of `pool`.
    explicit PluginCache(PluginPool& pool, int seq_id = 0);
    // An empty sequence with a pool of its own (one sequence; n_slots 0: max_seq + 2).
    PluginCache(const Config& config, const CachePlugin& plugin, Memory& memory = host_memory(), int n_slots = 0);
    ~PluginCache() override;
    void append(std::span<const int> tokens) override;
    // The plugin's slot for t (checked: in range, and the slot t holds in kvlab's books).
    std::int64_t slot(int t) const override;
    // Every slot checked: the plugin's positions are 0..pos, and each slot holds the rows
    // written for this sequence's prefix at that position.
    int attended(int pos, std::int64_t* slots, int* positions = nullptr) const override;
    const KVStorage& storage() const override { return pool_->storage(); }
    void set_kv_format(KVFormat format, std::span<const float> scales = {}) override;
    int attach_prefix(std::span<const int> tokens) override;
    MemoryStats memory() const override;
    std::string name() const override;
    // A new sequence sharing every position of this one (the plugin's fork; Error without one).
    std::unique_ptr<PluginCache> fork(int new_seq_id);
    // The rows of the latest reserve are written: the plugin's step_done, its moves checked
    // (each moved position's new slot holds the rows of the same prefix) and applied.
    void committed() override;
    // Rolled back past what the plugin could release (it frees sequences only whole): the
    // plugin still maps positions kvlab forgot, so only destruction may follow (a driver
    // preempts it). Any other use is an Error.
    bool stale() const { return stale_; }
    PluginPool& pool() const { return *pool_; }

protected:
    void reserve(int new_length) override;
    void on_write(int pos) override;
    void release(int n) override;

private:
    PluginCache(PluginPool& pool, int seq_id, kvlab_cache* handle);  // fork's child
    std::int64_t ask_slot(int pos) const;                            // the plugin's slot for pos, checked in range
    void check_fresh() const;                                        // Error when stale()
    // Applies a step_done's moves after checking them (`call` names it).
    void apply_moves(std::span<const kvlab_slot_move> moves, const std::string& call);
    // pos's slot `s`, new to this sequence: held by nobody (else Error naming `call`), then held by it.
    void take(int pos, std::int64_t s, const std::string& call);
    // After a reserve's copies: each held position is in its slot, or moved along one of them.
    void moved(std::span<const kvlab_slot_copy> copies, const std::string& call);
    std::string who() const;  // "plugin free_list, sequence 2"

    std::unique_ptr<PluginPool> own_pool_;  // a pool of its own, or null
    PluginPool* pool_;
    kvlab_cache* handle_ = nullptr;
    std::vector<std::int64_t> slots_;       // [length()] the slot each held position has in kvlab's books
    std::vector<const PrefixNode*> nodes_;  // [length()] the prefix ending at each held position
    std::vector<int> pending_;              // the tokens of the append being reserved
    // Positions 0..asked_-1 were asked of the plugin since the last reserve or release: within a
    // step, a read of them uses kvlab's books (one call per position a step, not one per query).
    mutable int asked_ = 0;
    bool stale_ = false;
};

}  // namespace kvlab
