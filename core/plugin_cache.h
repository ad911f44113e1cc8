// kvlab core: a cache whose bookkeeping is a plugin's (include/kvlab/cache_plugin.h), loaded from
// a shared library, so that kvlab's exactness checks run on a cache kvlab did not write.
//
// kvlab keeps the rows (head-major, n_slots per layer and KV head, as ContiguousCache keeps
// max_seq); the plugin says which slot each position lives in. Every answer is checked before it
// is used: a slot out of range, a slot another held position already has, a slot that moved
// while its position was held, or a refusal, is an Error naming the call, its arguments and the
// bad value. A crash in the plugin is not caught here: `kvlab verify --plugin` runs the checks
// in a child process for that.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache.h"
#include "kvlab/cache_plugin.h"

namespace kvlab {

// A loaded plugin library. Throws Error, in one line, for a file that does not load, a missing
// entry symbol, a table of another ABI version or with a null function.
class CachePlugin {
public:
    explicit CachePlugin(const std::string& path);
    ~CachePlugin();
    CachePlugin(const CachePlugin&) = delete;
    CachePlugin& operator=(const CachePlugin&) = delete;
    const kvlab_cache_plugin& table() const { return *table_; }
    const std::string& name() const { return name_; }  // the table's, or the file's when it has none
    const std::string& path() const { return path_; }

private:
    std::string path_, name_;
    void* handle_ = nullptr;
    const kvlab_cache_plugin* table_ = nullptr;
};

class PluginCache final : public Cache {
public:
    // n_slots: rows per layer and KV head the plugin maps positions onto (0: max_seq).
    PluginCache(const Config& config, const CachePlugin& plugin, Memory& memory = host_memory(), int n_slots = 0);
    ~PluginCache() override;
    // The plugin's slot for t (checked: in range, and the slot t was given when it was reserved).
    std::int64_t slot(int t) const override;
    const KVStorage& storage() const override { return storage_; }
    void set_kv_format(KVFormat format, std::span<const float> scales = {}) override;
    MemoryStats memory() const override;
    std::string name() const override;
    int n_slots() const { return n_slots_; }

protected:
    void reserve(int new_length) override;
    void release(int n) override;

private:
    // Asks the plugin for pos's slot and checks it is in range ("slot(pos=3) returned 9, ...").
    std::int64_t ask_slot(int pos) const;

    const CachePlugin& plugin_;
    kvlab_cache* handle_ = nullptr;
    int n_slots_;
    KVStorage storage_;
    std::vector<std::int64_t> slots_;  // [length()] the slot each held position was given
    std::vector<int> holder_;          // [n_slots] the position holding each slot, or -1
};

}  // namespace kvlab
