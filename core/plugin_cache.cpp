#include "plugin_cache.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cstring>

namespace kvlab {

namespace {

constexpr std::size_t kErrLen = 512;  // the message buffer a plugin writes into (>= 256, as the header promises)

// A plugin's message: its text up to the first NUL or line break, or a note that it wrote none.
std::string plugin_message(const char* err) {
    std::string s(err, strnlen(err, kErrLen));
    s = s.substr(0, s.find_first_of("\r\n"));
    return s.empty() ? "(no message)" : s;
}

}  // namespace

CachePlugin::CachePlugin(const std::string& path) : path_(path) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
        const char* e = dlerror();
        throw Error(fmt::format("cache plugin {}: does not load: {}", path, plugin_message(e ? e : "")));
    }
    void* entry = dlsym(handle_, KVLAB_CACHE_PLUGIN_SYMBOL);
    const auto get = reinterpret_cast<kvlab_cache_plugin_entry>(entry);
    table_ = get ? get() : nullptr;
    std::string problem;
    if (!get)
        problem = fmt::format("exports no {}()", KVLAB_CACHE_PLUGIN_SYMBOL);
    else if (!table_)
        problem = fmt::format("{}() returned NULL", KVLAB_CACHE_PLUGIN_SYMBOL);
    else if (table_->abi_version != KVLAB_CACHE_PLUGIN_ABI_VERSION)
        problem = fmt::format("ABI version {}, this kvlab reads version {}", table_->abi_version,
                              KVLAB_CACHE_PLUGIN_ABI_VERSION);
    else if (!table_->create || !table_->reserve || !table_->slot || !table_->release || !table_->memory ||
             !table_->destroy)
        problem = "a function of its table is NULL (create, reserve, slot, release, memory and destroy are required)";
    if (!problem.empty()) {
        dlclose(handle_);
        throw Error(fmt::format("cache plugin {}: {}", path, problem));
    }
    name_ = table_->name && table_->name[0] ? std::string(table_->name, strnlen(table_->name, 64)) : path;
}

CachePlugin::~CachePlugin() { dlclose(handle_); }

PluginCache::PluginCache(const Config& config, const CachePlugin& plugin, Memory& memory, int n_slots)
    : Cache(config),
      plugin_(plugin),
      n_slots_(n_slots > 0 ? n_slots : config.max_seq),
      // [n_layers, n_kv_heads, n_slots, head_size], as a head-major contiguous cache of n_slots
      storage_(memory, std::int64_t(config.n_layers) * config.n_kv_heads * n_slots_, config.head_size(),
               std::int64_t(config.n_kv_heads) * n_slots_, n_slots_),
      holder_(std::size_t(n_slots_), -1) {
    assert(holder_.size() == std::size_t(n_slots_));
    const kvlab_cache_config cc{config.max_seq, n_slots_, config.n_layers, config.n_kv_heads, config.head_size()};
    char err[kErrLen] = {};
    handle_ = plugin_.table().create(&cc, err, sizeof err);
    if (!handle_)
        throw Error(fmt::format("{}: create(max_seq={}, n_slots={}) refused: {}", name(), cc.max_seq, cc.n_slots,
                                plugin_message(err)));
}

PluginCache::~PluginCache() { plugin_.table().destroy(handle_); }

std::string PluginCache::name() const { return fmt::format("plugin {}", plugin_.name()); }

std::int64_t PluginCache::ask_slot(int pos) const {
    const std::int64_t s = plugin_.table().slot(handle_, pos);
    if (s < 0 || s >= n_slots_)
        throw Error(fmt::format("{}: slot(pos={}) returned {}, but there are {} slots (0..{})", name(), pos, s,
                                n_slots_, n_slots_ - 1));
    return s;
}

std::int64_t PluginCache::slot(int t) const {
    if (t < 0 || t >= length()) return -1;
    const std::int64_t s = ask_slot(t);
    if (s != slots_[std::size_t(t)])
        throw Error(fmt::format("{}: slot(pos={}) returned {}, but position {} was given slot {} and is still held",
                                name(), t, s, t, slots_[std::size_t(t)]));
    return s;
}

void PluginCache::reserve(int new_length) {
    const int length = int(slots_.size()), n = new_length - length;
    if (n <= 0) return;
    char err[kErrLen] = {};
    if (plugin_.table().reserve(handle_, length, n, err, sizeof err) != 0)
        throw Error(fmt::format("{}: reserve(length={}, n={}) refused: {}", name(), length, n, plugin_message(err)));
    // The new positions' slots: each in range and held by no other position.
    std::vector<std::int64_t> given;
    for (int pos = length; pos < new_length; pos++) {
        const std::int64_t s = ask_slot(pos);
        int other = holder_[std::size_t(s)];
        if (const auto it = std::find(given.begin(), given.end(), s); it != given.end())
            other = length + int(it - given.begin());
        if (other >= 0)  // (the plugin's books are wrong: it is not asked to undo anything)
            throw Error(
                fmt::format("{}: after reserve(length={}, n={}), slot(pos={}) returned {}, the slot of "
                            "position {}, which is still held",
                            name(), length, n, pos, s, other));
        given.push_back(s);
    }
    for (int i = 0; i < n; i++) holder_[std::size_t(given[std::size_t(i)])] = length + i;
    slots_.insert(slots_.end(), given.begin(), given.end());
}

void PluginCache::release(int n) {
    plugin_.table().release(handle_, n);
    // The forgotten positions' rows read NaN again: a later read of one shows at once.
    for (int t = n; t < int(slots_.size()); t++) {
        holder_[std::size_t(slots_[std::size_t(t)])] = -1;
        storage_.poison(config_, slots_[std::size_t(t)], 1);
    }
    slots_.resize(std::size_t(n));
}

void PluginCache::set_kv_format(KVFormat format, std::span<const float> scales) {
    if (length() != 0) throw Error(fmt::format("{}: the KV format changes only while the cache is empty", name()));
    const std::vector<float> checked =
        scales.empty() ? std::vector<float>{} : checked_kv_scales(config_.n_layers, scales);
    const Config& c = config_;
    storage_ = KVStorage(storage_.memory(), std::int64_t(c.n_layers) * c.n_kv_heads * n_slots_, c.head_size(),
                         std::int64_t(c.n_kv_heads) * n_slots_, n_slots_, format, checked);
}

MemoryStats PluginCache::memory() const { return position_rows_memory(config_, storage_, n_slots_, length()); }

}  // namespace kvlab
