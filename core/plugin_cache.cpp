#include "plugin_cache.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstring>
#include <limits>

namespace kvlab {

namespace {

constexpr std::size_t kErrLen = 512;  // the message buffer a plugin writes into (>= 256, as the header promises)

// The plugin call under way (set_plugin_call_note), written before each call and cleared after it.
char* call_note = nullptr;
std::size_t call_note_size = 0;
std::function<void()> call_hook;  // set_plugin_call_hook
struct CallNote {
    template <class... Args>
    explicit CallNote(fmt::format_string<Args...> format, Args&&... args) {
        if (call_hook) call_hook();
        if (!call_note) return;
        const auto end = fmt::format_to_n(call_note, call_note_size - 1, format, std::forward<Args>(args)...);
        *end.out = '\0';
    }
    ~CallNote() {
        if (call_note) call_note[0] = '\0';
    }
    CallNote(const CallNote&) = delete;
    CallNote& operator=(const CallNote&) = delete;
};

// A plugin's message: its text up to the first NUL or line break, or a note that it wrote none.
std::string plugin_message(const char* err) {
    std::string s(err, strnlen(err, kErrLen));
    s = s.substr(0, s.find_first_of("\r\n"));
    return s.empty() ? "(no message)" : s;
}

// ---- Version 1 seen as version 2: a pool is the config, and holds one sequence (a version 1
// cache has slots 0..n_slots-1 to itself). The handles kvlab passes are the adapter's.

struct V1Sequence;
struct V1Pool {
    const kvlab_cache_plugin_abi1* table;
    kvlab_cache_config config;
    V1Sequence* seq = nullptr;  // the one sequence, or null
};
struct V1Sequence {
    V1Pool* pool;
    kvlab_cache* cache;  // the plugin's
};
V1Pool* v1(kvlab_cache_pool* p) { return reinterpret_cast<V1Pool*>(p); }
const V1Pool* v1(const kvlab_cache_pool* p) { return reinterpret_cast<const V1Pool*>(p); }
V1Sequence* v1(kvlab_cache* c) { return reinterpret_cast<V1Sequence*>(c); }
const V1Sequence* v1(const kvlab_cache* c) { return reinterpret_cast<const V1Sequence*>(c); }

void v1_destroy_pool(kvlab_cache_pool* p) { delete v1(p); }
kvlab_cache* v1_create(kvlab_cache_pool* p, char* err, std::size_t err_len) {
    V1Pool* pool = v1(p);
    if (pool->seq) {
        std::snprintf(err, err_len, "a version 1 plugin holds one sequence per pool (no batch, no fork)");
        return nullptr;
    }
    kvlab_cache* c = pool->table->create(&pool->config, err, err_len);
    if (!c) return nullptr;
    pool->seq = new V1Sequence{pool, c};
    return reinterpret_cast<kvlab_cache*>(pool->seq);
}
int v1_reserve(kvlab_cache* c, std::int32_t length, std::int32_t n, const std::int32_t*, kvlab_slot_copy*, std::int32_t,
               std::int32_t*, char* err, std::size_t err_len) {
    return v1(c)->pool->table->reserve(v1(c)->cache, length, n, err, err_len);
}
std::int64_t v1_slot(const kvlab_cache* c, std::int32_t pos) { return v1(c)->pool->table->slot(v1(c)->cache, pos); }
void v1_release(kvlab_cache* c, std::int32_t n) { v1(c)->pool->table->release(v1(c)->cache, n); }
std::int64_t v1_memory(const kvlab_cache_pool* p) {
    const V1Sequence* s = v1(p)->seq;
    return s ? s->pool->table->memory(s->cache) : 0;
}
void v1_destroy(kvlab_cache* c) {
    V1Sequence* s = v1(c);
    s->pool->table->destroy(s->cache);
    s->pool->seq = nullptr;
    delete s;
}

}  // namespace

CachePlugin::CachePlugin(const std::string& path) : path_(path) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
        const char* e = dlerror();
        throw Error(fmt::format("cache plugin {}: does not load: {}", path, plugin_message(e ? e : "")));
    }
    // The newest entry the library exports; a version 2 table is read as version 3's first part.
    using Entry = const void* (*)();
    const char* const symbols[] = {KVLAB_CACHE_PLUGIN_SYMBOL_V3, KVLAB_CACHE_PLUGIN_SYMBOL_V2,
                                   KVLAB_CACHE_PLUGIN_SYMBOL_V1};
    unsigned want = 0;
    Entry get = nullptr;
    for (unsigned v = 3; v >= 1 && !get; v--)
        if ((get = reinterpret_cast<Entry>(dlsym(handle_, symbols[3 - v])))) want = v;
    const void* t = get ? get() : nullptr;
    const auto* t1 = want == 1 ? static_cast<const kvlab_cache_plugin_abi1*>(t) : nullptr;
    // A version 2 table ends at destroy: only fields up to there are read from it.
    const auto* t2 = want >= 2 ? static_cast<const kvlab_cache_plugin_abi3*>(t) : nullptr;
    const unsigned got = t2 ? t2->abi_version : t1 ? t1->abi_version : 0;
    std::string problem;
    if (!get)
        problem = fmt::format("exports none of {}(), {}() and {}()", symbols[0], symbols[1], symbols[2]);
    else if (!t)
        problem = fmt::format("{}() returned NULL", symbols[3 - want]);
    else if (got != want)
        problem = fmt::format("{}() returned a table of ABI version {}, not {}", symbols[3 - want], got, want);
    else if (t2 && (!t2->create_pool || !t2->destroy_pool || !t2->create || !t2->reserve || !t2->slot ||
                    (!t2->release && want == 2) || !t2->memory || !t2->destroy))
        problem = fmt::format(
            "a required function of its table is NULL (create_pool, destroy_pool, create, reserve, slot, "
            "{}memory and destroy are required)",
            want == 2 ? "release, " : "");
    else if (t1 && (!t1->create || !t1->reserve || !t1->slot || !t1->release || !t1->memory || !t1->destroy))
        problem = "a function of its table is NULL (create, reserve, slot, release, memory and destroy are required)";
    if (!problem.empty()) {
        dlclose(handle_);
        throw Error(fmt::format("cache plugin {}: {}", path, problem));
    }
    abi_version_ = int(want);
    const char* name = t2 ? t2->name : t1->name;
    name_ = name && name[0] ? std::string(name, strnlen(name, 64)) : path;
    if (want == 3) {
        table_ = *static_cast<const kvlab_cache_plugin_abi3*>(t);
    } else if (t2) {
        std::memcpy(&table_, t2, offsetof(kvlab_cache_plugin_abi3, block_sizes));  // version 2's part
    } else {
        // The adapter's pool holds the version 1 table (create_pool below); no fork, prefix reuse
        // or attended.
        table_ = {.abi_version = 1,
                  .name = name,
                  .create_pool = nullptr,
                  .destroy_pool = v1_destroy_pool,
                  .create = v1_create,
                  .attach_prefix = nullptr,
                  .fork = nullptr,
                  .reserve = v1_reserve,
                  .slot = v1_slot,
                  .attended = nullptr,
                  .release = v1_release,
                  .memory = v1_memory,
                  .destroy = v1_destroy,
                  .block_sizes = nullptr,
                  .n_block_sizes = 0,
                  .max_sequences = 1,
                  .step_done = nullptr};
        v1_table_ = t1;
    }
    try {
        check_declared();
    } catch (const Error&) {
        dlclose(handle_);
        throw;
    }
}

CachePlugin::CachePlugin(const std::string& name, const kvlab_cache_plugin_abi3& table, PoolMaker make_pool)
    : path_(name), name_(name), abi_version_(3), table_(table), make_pool_(std::move(make_pool)) {
    if (!make_pool_ || !table_.destroy_pool || !table_.create || !table_.reserve || !table_.slot || !table_.memory ||
        !table_.destroy)
        throw Error(fmt::format("cache plugin {}: a required function of its table is NULL", name));
    check_declared();
}

void CachePlugin::check_declared() {
    const int n = table_.n_block_sizes;
    std::string problem;
    if (n < 0 || n > 1024 || (n > 0 && !table_.block_sizes))
        problem = fmt::format("n_block_sizes is {} with block_sizes {} (0..1024 of them)", n,
                              table_.block_sizes ? "set" : "NULL");
    for (int i = 0; problem.empty() && i < n; i++) {
        const int bs = table_.block_sizes[i];
        if (bs < 1 || bs > 1024) problem = fmt::format("block_sizes[{}] is {}, not in 1..1024", i, bs);
        block_sizes_.push_back(bs);
    }
    if (problem.empty() && table_.max_sequences < 0)
        problem = fmt::format("max_sequences is {} (0: any)", table_.max_sequences);
    if (!problem.empty()) throw Error(fmt::format("cache plugin {}: {}", path_, problem));
}

std::string CachePlugin::block_sizes_text() const {
    std::string text;
    for (int bs : block_sizes_) text += fmt::format("{}{}", text.empty() ? "" : ", ", bs);
    return text.empty() ? "1..64" : text;
}

bool CachePlugin::accepts_block_size(int block_size) const {
    if (block_sizes_.empty()) return block_size >= 1 && block_size <= 64;
    return std::find(block_sizes_.begin(), block_sizes_.end(), block_size) != block_sizes_.end();
}

CachePlugin::~CachePlugin() {
    if (handle_) dlclose(handle_);
}

void set_plugin_call_note(char* buffer, std::size_t size) {
    call_note = size > 0 ? buffer : nullptr;
    call_note_size = size;
    if (call_note) call_note[0] = '\0';
}

void set_plugin_call_hook(std::function<void()> hook) { call_hook = std::move(hook); }

kvlab_cache_pool* CachePlugin::create_pool(const kvlab_cache_config& config, char* err, std::size_t err_len) const {
    const CallNote note("create_pool(max_seq={}, n_slots={}, block_size={})", config.max_seq, config.n_slots,
                        config.block_size);
    if (v1_table_) return reinterpret_cast<kvlab_cache_pool*>(new V1Pool{v1_table_, config});
    if (make_pool_) return make_pool_(config, err, err_len);
    return table_.create_pool(&config, err, err_len);
}

// ----------------------------------------------------------------------------------------------
// The pool: rows, and kvlab's books on them

PluginPool::PluginPool(const Config& config, const CachePlugin& plugin, Memory& memory, int n_slots, int max_sequences,
                       int block_size)
    : config_(config),
      plugin_(plugin),
      n_slots_(n_slots > 0 ? n_slots : max_sequences * (config.max_seq + 2 * block_size)),
      max_sequences_(max_sequences),
      block_size_(block_size) {
    const int most = plugin.max_sequences() > 0 ? plugin.max_sequences() : std::numeric_limits<int>::max();
    if (max_sequences < 1 || max_sequences > most || !plugin.accepts_block_size(block_size) ||
        n_slots_ % block_size != 0)
        throw Error(
            fmt::format("plugin pool: {} sequences, block size {} and {} slots (at least 1 sequence and at most "
                        "the plugin's {}, a block size it accepts ({}) that divides the slots)",
                        max_sequences, block_size, n_slots_, plugin.max_sequences(), plugin.block_sizes_text()));
    // [n_layers, n_kv_heads, n_slots, head_size], as a head-major contiguous cache of n_slots
    storage_ = KVStorage(memory, std::int64_t(config.n_layers) * config.n_kv_heads * n_slots_, config.head_size(),
                         std::int64_t(config.n_kv_heads) * n_slots_, n_slots_);
    holders_.resize(std::size_t(n_slots_));
    content_.assign(std::size_t(n_slots_), nullptr);
    block_held_.assign(std::size_t(n_blocks()), 0);
    assert(holders_.size() == std::size_t(n_slots_) && content_.size() == std::size_t(n_slots_));
    assert(block_held_.size() * std::size_t(block_size_) == std::size_t(n_slots_));
    const kvlab_cache_config cc{config.max_seq,     n_slots_,       config.n_layers, config.n_kv_heads,
                                config.head_size(), max_sequences_, block_size_};
    char err[kErrLen] = {};
    handle_ = plugin_.create_pool(cc, err, sizeof err);
    if (!handle_)
        throw Error(
            fmt::format("plugin {}: create_pool(max_seq={}, n_slots={}, max_sequences={}, block_size={}) "
                        "refused: {}",
                        plugin_.name(), cc.max_seq, cc.n_slots, max_sequences_, block_size_, plugin_message(err)));
}

PluginPool::~PluginPool() {
    assert(live_ == 0);
    const CallNote note("destroy_pool()");
    plugin_.table().destroy_pool(handle_);
}

void PluginPool::set_kv_format(KVFormat format, std::span<const float> scales) {
    for (const auto& h : holders_)
        if (!h.empty())
            throw Error(fmt::format("plugin {}: the KV format changes only while no sequence holds a position",
                                    plugin_.name()));
    const std::vector<float> checked =
        scales.empty() ? std::vector<float>{} : checked_kv_scales(config_.n_layers, scales);
    const Config& c = config_;
    storage_ = KVStorage(storage_.memory(), std::int64_t(c.n_layers) * c.n_kv_heads * n_slots_, c.head_size(),
                         std::int64_t(c.n_kv_heads) * n_slots_, n_slots_, format, checked);
    std::fill(content_.begin(), content_.end(), nullptr);  // every row reads NaN again
}

std::int64_t PluginPool::bookkeeping_bytes() const {
    const CallNote note("memory()");
    return plugin_.table().memory(handle_);
}

const PrefixNode* PluginPool::child(const PrefixNode* parent, int token, int pos) {
    auto& children = parent ? const_cast<PrefixNode*>(parent)->children : roots_;
    std::unique_ptr<PrefixNode>& node = children[token];
    if (!node) node = std::make_unique<PrefixNode>(PrefixNode{parent, token, pos, {}});
    return node.get();
}

PluginLogEntry* PluginPool::logged(PluginLogEntry::Call call, int seq, int pos) {
    if (!log_) return nullptr;
    if (pos >= 0 && !log_->empty()) {
        PluginLogEntry& last = log_->back();
        if (last.call == call && last.seq == seq && pos >= last.a && pos <= last.b + 1) {
            last.b = std::max(last.b, pos);
            return &last;
        }
    }
    PluginLogEntry& entry = log_->emplace_back();
    entry.call = call, entry.seq = seq, entry.a = entry.b = std::max(pos, 0);
    return &entry;
}

void PluginPool::hold(std::int64_t slot, const PluginCache* seq, int pos) {
    auto& h = holders_[std::size_t(slot)];
    if (h.empty()) {
        held_slots_++;
        if (block_held_[std::size_t(slot / block_size_)]++ == 0) blocks_in_use_++;
        peak_held_slots_ = std::max(peak_held_slots_, held_slots_);
        peak_blocks_in_use_ = std::max(peak_blocks_in_use_, blocks_in_use_);
    }
    h.push_back({seq, pos});
}

void PluginPool::unhold(std::int64_t slot, const PluginCache* seq) {
    auto& h = holders_[std::size_t(slot)];
    const bool was_held = !h.empty();
    h.erase(std::remove_if(h.begin(), h.end(), [&](const Hold& x) { return x.seq == seq; }), h.end());
    if (was_held && h.empty()) {
        held_slots_--;
        if (--block_held_[std::size_t(slot / block_size_)] == 0) blocks_in_use_--;
    }
}

std::string PluginPool::holder_text(std::int64_t slot) const {
    const Hold& h = holders_[std::size_t(slot)].front();
    return fmt::format("position {} of sequence {}", h.pos, h.seq->seq_id);
}

std::string PluginPool::content_text(std::int64_t slot) const {
    const PrefixNode* node = content_[std::size_t(slot)];
    return node ? fmt::format("the rows of position {} after another prefix", node->pos) : "no rows";
}

void PluginPool::copy(std::span<const kvlab_slot_copy> copies, const std::string& call) {
    for (const kvlab_slot_copy& c : copies) {
        if (c.count < 1 || c.from < 0 || c.to < 0 || c.from > n_slots_ - c.count || c.to > n_slots_ - c.count)
            throw Error(
                fmt::format("{} asked for a copy of {} slots from slot {} to slot {}, but there are {} slots "
                            "(0..{})",
                            call, c.count, c.from, c.to, n_slots_, n_slots_ - 1));
        // In range from here: the runs' ends do not overflow.
        const std::string what = fmt::format("{} asked for a copy of slots {}..{} to {}..{}", call, c.from,
                                             c.from + c.count - 1, c.to, c.to + c.count - 1);
        if (c.from < c.to + c.count && c.to < c.from + c.count) throw Error(what + ", which overlap");
        for (std::int64_t s = c.to; s < c.to + c.count; s++)
            if (!holders_[std::size_t(s)].empty())
                throw Error(fmt::format("{}, onto slot {}, which {} still holds", what, s, holder_text(s)));
        const std::int64_t bytes = storage_.row_bytes() * c.count;  // a (layer, head)'s slots are adjacent rows
        for (int l = 0; l < config_.n_layers; l++)
            for (int h = 0; h < config_.n_kv_heads; h++) {
                storage_.memory().copy(storage_.k_row(storage_.row(l, h, c.to)),
                                       storage_.k_row(storage_.row(l, h, c.from)), bytes);
                storage_.memory().copy(storage_.v_row(storage_.row(l, h, c.to)),
                                       storage_.v_row(storage_.row(l, h, c.from)), bytes);
            }
        std::copy_n(content_.begin() + c.from, c.count, content_.begin() + c.to);
    }
}

// ----------------------------------------------------------------------------------------------
// A sequence

PluginCache::PluginCache(PluginPool& pool, int seq_id) : Cache(pool.config()), pool_(&pool) {
    this->seq_id = seq_id;
    pool.logged(PluginLogEntry::create, seq_id);
    char err[kErrLen] = {};
    const CallNote note("create() of sequence {}", seq_id);
    handle_ = pool.plugin().table().create(pool.handle_, err, sizeof err);
    if (!handle_) throw Error(fmt::format("{}: create() refused: {}", who(), plugin_message(err)));
    pool.live_++;
}

PluginCache::PluginCache(const Config& config, const CachePlugin& plugin, Memory& memory, int n_slots)
    : Cache(config), own_pool_(std::make_unique<PluginPool>(config, plugin, memory, n_slots)), pool_(own_pool_.get()) {
    char err[kErrLen] = {};
    const CallNote note("create()");
    handle_ = plugin.table().create(pool_->handle_, err, sizeof err);
    if (!handle_) throw Error(fmt::format("{}: create() refused: {}", who(), plugin_message(err)));
    pool_->live_++;
}

PluginCache::PluginCache(PluginPool& pool, int seq_id, kvlab_cache* handle)
    : Cache(pool.config()), pool_(&pool), handle_(handle) {
    this->seq_id = seq_id;
    pool.live_++;
}

PluginCache::~PluginCache() {
    pool_->logged(PluginLogEntry::destroy, seq_id);
    for (std::int64_t s : slots_) pool_->unhold(s, this);
    const CallNote note("destroy() of sequence {}", seq_id);
    pool_->plugin().table().destroy(handle_);
    pool_->live_--;
}

std::string PluginCache::name() const { return fmt::format("plugin {}", pool_->plugin().name()); }

std::string PluginCache::who() const {
    return pool_->max_sequences() > 1 ? fmt::format("{}, sequence {}", name(), seq_id) : name();
}

std::int64_t PluginCache::ask_slot(int pos) const {
    const CallNote note("slot(pos={}) of sequence {}", pos, seq_id);
    const std::int64_t s = pool_->plugin().table().slot(handle_, pos);
    if (s < 0 || s >= pool_->n_slots())
        throw Error(fmt::format("{}: slot(pos={}) returned {}, but there are {} slots (0..{})", who(), pos, s,
                                pool_->n_slots(), pool_->n_slots() - 1));
    return s;
}

std::int64_t PluginCache::slot(int t) const {
    if (t < 0 || t >= length()) return -1;
    const std::int64_t s = ask_slot(t);
    if (s != slots_[std::size_t(t)])
        throw Error(fmt::format("{}: slot(pos={}) returned {}, but position {} was given slot {} and is still held",
                                who(), t, s, t, slots_[std::size_t(t)]));
    return s;
}

void PluginCache::append(std::span<const int> tokens) {
    pending_.assign(tokens.begin(), tokens.end());
    Cache::append(tokens);
}

void PluginCache::take(int pos, std::int64_t s, const std::string& call) {
    if (!pool_->holders_[std::size_t(s)].empty())
        throw Error(fmt::format("{}: after {}, slot(pos={}) returned {}, the slot of {}, which is still held", who(),
                                call, pos, s, pool_->holder_text(s)));
    pool_->hold(s, this, pos);
}

void PluginCache::reserve(int new_length) {
    check_fresh();
    const int length = int(slots_.size()), n = new_length - length;
    if (n <= 0) return;
    assert(pending_.size() == std::size_t(n));
    const kvlab_cache_plugin_abi3& t = pool_->plugin().table();
    const std::string call = fmt::format("reserve(length={}, n={})", length, n);
    const std::vector<std::int32_t> tokens(pending_.begin(), pending_.end());  // [n] the new positions' tokens
    std::vector<kvlab_slot_copy> copies(std::size_t(config_.max_seq));         // [max_seq] room for the copies
    std::int32_t n_copies = 0;
    char err[kErrLen] = {};
    asked_ = 0;
    int status = 0;
    PluginLogEntry* entry = pool_->logged(PluginLogEntry::reserve, seq_id);
    if (entry) entry->a = length, entry->tokens = pending_;
    {
        const CallNote note("{} of sequence {}", call, seq_id);
        status = t.reserve(handle_, length, n, tokens.data(), copies.data(), std::int32_t(copies.size()), &n_copies,
                           err, sizeof err);
    }
    if (status != 0) {
        // A refusal is the pool's answer when it is full, a bug when kvlab's books show room.
        const int free_blocks = pool_->n_blocks() - pool_->blocks_in_use(), need = pool_->blocks_needed(n);
        const std::string refused = fmt::format("{}: {} refused: {}", who(), call, plugin_message(err));
        if (entry) entry->refused = plugin_message(err);
        if (free_blocks < need)
            throw PoolFull(fmt::format("{} ({} of {} blocks wholly free; it may need {})", refused, free_blocks,
                                       pool_->n_blocks(), need));
        throw Error(
            fmt::format("{}, but {} of the pool's {} blocks of {} slots are wholly free (no slot held), and "
                        "a reserve of {} positions needs at most {}",
                        refused, free_blocks, pool_->n_blocks(), pool_->block_size(), n, need));
    }
    if (n_copies < 0 || n_copies > std::int32_t(copies.size()))
        throw Error(
            fmt::format("{}: {} said it asked for {} copies, of at most {}", who(), call, n_copies, copies.size()));
    copies.resize(std::size_t(n_copies));
    if (entry) entry->copies = copies;
    pool_->copy(copies, fmt::format("{}: {}", who(), call));
    if (!copies.empty()) moved(copies, call);
    std::vector<std::int64_t> given;  // the new positions' slots, held as each is checked
    try {
        for (int pos = length; pos < new_length; pos++) {
            const std::int64_t s = ask_slot(pos);
            if (entry) entry->slots.push_back(s);  // nothing is logged between: the entry stays put
            take(pos, s, call);
            given.push_back(s);
        }
    } catch (...) {
        for (std::int64_t s : given) pool_->unhold(s, this);
        throw;
    }
    slots_.insert(slots_.end(), given.begin(), given.end());
    for (int i = 0; i < n; i++)
        nodes_.push_back(pool_->child(nodes_.empty() ? nullptr : nodes_.back(), pending_[std::size_t(i)], length + i));
}

void PluginCache::moved(std::span<const kvlab_slot_copy> copies, const std::string& call) {
    for (int pos = 0; pos < int(slots_.size()); pos++) {
        const std::int64_t was = slots_[std::size_t(pos)], s = ask_slot(pos);
        if (s == was) continue;
        const auto via = std::find_if(copies.begin(), copies.end(), [&](const kvlab_slot_copy& c) {
            return was >= c.from && was < c.from + c.count && s == c.to + (was - c.from);
        });
        if (via == copies.end())
            throw Error(
                fmt::format("{}: after {}, slot(pos={}) returned {}, but position {} was given slot {} and is "
                            "still held (a held position moves only through one of reserve's copies)",
                            who(), call, pos, s, pos, was));
        pool_->unhold(was, this);
        pool_->hold(s, this, pos);
        slots_[std::size_t(pos)] = s;
    }
}

void PluginCache::on_write(int pos) {
    pool_->logged(PluginLogEntry::write, seq_id, pos);
    pool_->content_[std::size_t(slots_[std::size_t(pos)])] = nodes_[std::size_t(pos)];
}

int PluginCache::attended(int pos, std::int64_t* slots, int* positions) const {
    check_fresh();
    pool_->logged(PluginLogEntry::read, seq_id, pos);
    const kvlab_cache_plugin_abi3& t = pool_->plugin().table();
    if (t.attended) {
        std::vector<std::int32_t> got(std::size_t(pos) + 1);  // [pos + 1] an exact cache's answer fills it
        std::int32_t k = 0;
        {
            const CallNote note("attended(pos={}) of sequence {}", pos, seq_id);
            k = t.attended(handle_, pos, got.data(), std::int32_t(got.size()));
        }
        int kept = 0;  // positions 0..kept-1 answered in order
        while (kept <= pos && kept < k && got[std::size_t(kept)] == kept) kept++;
        if (k != pos + 1 || kept <= pos)
            throw Error(
                fmt::format("{}: attended(pos={}) returned {} positions, without position {}: an exact cache "
                            "attends all of 0..{}",
                            who(), pos, k, std::min(kept, pos), pos));
    }
    for (int p = 0; p <= pos; p++) {
        const std::int64_t s = p < asked_ ? slots_[std::size_t(p)] : slot(p);
        if (pool_->content_[std::size_t(s)] != nodes_[std::size_t(p)])
            throw Error(fmt::format("{}: a query at {} reads position {} from slot {}, which holds {}", who(), pos, p,
                                    s, pool_->content_text(s)));
        slots[p] = s;
        if (positions) positions[p] = p;
    }
    asked_ = std::max(asked_, pos + 1);
    return pos + 1;
}

void PluginCache::release(int n) {
    asked_ = 0;
    if (n == int(slots_.size())) return;
    if (PluginLogEntry* entry = pool_->logged(PluginLogEntry::release, seq_id)) entry->a = n;
    if (!pool_->plugin().releases_part()) {
        // Only a failed request rolls back here (the checks draw no rollback for such a plugin):
        // kvlab forgets the positions, the plugin cannot, and the sequence may only be destroyed.
        stale_ = true;
    } else {
        const CallNote note("release(n={}) of sequence {}", n, seq_id);
        pool_->plugin().table().release(handle_, n);
    }
    for (int p = n; p < int(slots_.size()); p++) pool_->unhold(slots_[std::size_t(p)], this);
    slots_.resize(std::size_t(n));
    nodes_.resize(std::size_t(n));
}

void PluginCache::check_fresh() const {
    if (stale_)
        throw Error(
            fmt::format("{}: the plugin frees sequences only whole (release is NULL), and a failed request left it "
                        "holding positions kvlab rolled back: this sequence may only be destroyed",
                        who()));
}

void PluginCache::committed() {
    const kvlab_cache_plugin_abi3& t = pool_->plugin().table();
    if (!t.step_done || stale_) return;
    std::vector<kvlab_slot_move> moves(slots_.size() + 1);  // [length + 1] room for a move a position
    std::int32_t n_moves = 0;
    char err[kErrLen] = {};
    int status = 0;
    asked_ = 0;
    PluginLogEntry* entry = pool_->logged(PluginLogEntry::step_done, seq_id);
    {
        const CallNote note("step_done() of sequence {}", seq_id);
        status = t.step_done(handle_, moves.data(), std::int32_t(moves.size()), &n_moves, err, sizeof err);
    }
    if (status != 0)
        throw Error(
            fmt::format("{}: step_done() refused after a forward pass that succeeded: {}", who(), plugin_message(err)));
    if (n_moves < 0 || n_moves > std::int32_t(moves.size()))
        throw Error(fmt::format("{}: step_done() said it moved {} runs, of at most {}", who(), n_moves, moves.size()));
    moves.resize(std::size_t(n_moves));
    if (entry) entry->moves = moves;
    apply_moves(moves, "step_done()");
}

void PluginCache::apply_moves(std::span<const kvlab_slot_move> moves, const std::string& call) {
    const int length = int(slots_.size());
    for (const kvlab_slot_move& m : moves) {
        const std::string asked =
            fmt::format("{}: {} moved {} positions from position {} to slot {}", who(), call, m.count, m.pos, m.slot);
        if (m.count < 1 || m.pos < 0 || m.pos > length - m.count)
            throw Error(fmt::format("{}, but the sequence holds positions 0..{}", asked, length - 1));
        if (m.slot < 0 || m.slot > pool_->n_slots() - m.count)
            throw Error(
                fmt::format("{}, but there are {} slots (0..{})", asked, pool_->n_slots(), pool_->n_slots() - 1));
        // In range from here: the runs' ends do not overflow.
        const std::string what = fmt::format("{}: {} moved positions {}..{} to slots {}..{}", who(), call, m.pos,
                                             m.pos + m.count - 1, m.slot, m.slot + m.count - 1);
        for (int i = 0; i < m.count; i++) {
            const int pos = m.pos + i;
            const std::int64_t s = m.slot + i;
            // Identical rows by kvlab's books: written for the same tokens at the same positions.
            if (pool_->content_[std::size_t(s)] != nodes_[std::size_t(pos)])
                throw Error(fmt::format("{}, but slot {} holds {}, not this sequence's position {}", what, s,
                                        pool_->content_text(s), pos));
        }
        for (int i = 0; i < m.count; i++) {
            const int pos = m.pos + i;
            pool_->unhold(slots_[std::size_t(pos)], this);
            pool_->hold(m.slot + i, this, pos);
            slots_[std::size_t(pos)] = m.slot + i;
        }
        pool_->moved_positions_ += m.count;
    }
    // Every position's slot, as the plugin now answers it, is the one kvlab's books moved it to.
    if (moves.empty()) return;
    for (int pos = 0; pos < length; pos++)
        if (const std::int64_t s = ask_slot(pos); s != slots_[std::size_t(pos)])
            throw Error(fmt::format("{}: after {}, slot(pos={}) returned {}, but its moves put position {} in slot {}",
                                    who(), call, pos, s, pos, slots_[std::size_t(pos)]));
}

int PluginCache::attach_prefix(std::span<const int> tokens) {
    if (length() != 0 || !pool_->plugin().reuses_prefixes() || tokens.empty()) return Cache::attach_prefix(tokens);
    const std::vector<std::int32_t> tk(tokens.begin(), tokens.end());  // [n] the request's tokens
    const int n = int(tk.size());
    const std::string call = fmt::format("attach_prefix(n={})", n);
    int hit = 0;
    PluginLogEntry* entry = pool_->logged(PluginLogEntry::attach_prefix, seq_id);
    if (entry) entry->tokens.assign(tokens.begin(), tokens.end());
    {
        const CallNote note("{} of sequence {}", call, seq_id);
        hit = pool_->plugin().table().attach_prefix(handle_, tk.data(), n);
    }
    if (entry) entry->a = hit;
    if (hit < 0 || hit > n - 1)
        throw Error(
            fmt::format("{}: {} returned {}, not one of 0..{} (the last token always runs)", who(), call, hit, n - 1));
    std::vector<std::int64_t> slots;       // [hit] the prefix's slots, each checked
    std::vector<const PrefixNode*> nodes;  // [hit]
    for (int p = 0; p < hit; p++) {
        nodes.push_back(pool_->child(p > 0 ? nodes.back() : nullptr, tokens[std::size_t(p)], p));
        const std::int64_t s = ask_slot(p);
        std::string bad;
        if (const auto it = std::find(slots.begin(), slots.end(), s); it != slots.end())
            bad = fmt::format("position {} of this sequence too", int(it - slots.begin()));
        else if (pool_->content_[std::size_t(s)] != nodes.back())
            bad = pool_->content_text(s);
        if (!bad.empty())
            throw Error(fmt::format("{}: {} returned {}, but position {} is in slot {}, which holds {}", who(), call,
                                    hit, p, s, bad));
        slots.push_back(s);
    }
    if (hit == 0) return 0;
    for (int p = 0; p < hit; p++) pool_->hold(slots[std::size_t(p)], this, p);
    slots_ = std::move(slots);
    nodes_ = std::move(nodes);
    adopt(tokens.first(std::size_t(hit)));
    record(EventKind::prefix_hit, 0, hit);
    return hit;
}

std::unique_ptr<PluginCache> PluginCache::fork(int new_seq_id) {
    check_fresh();
    const kvlab_cache_plugin_abi3& t = pool_->plugin().table();
    if (!t.fork) throw Error(fmt::format("{}: the plugin has no fork", who()));
    char err[kErrLen] = {};
    kvlab_cache* h = nullptr;
    if (PluginLogEntry* entry = pool_->logged(PluginLogEntry::fork, seq_id)) entry->a = new_seq_id;
    {
        const CallNote note("fork() of sequence {}", seq_id);
        h = t.fork(handle_, err, sizeof err);
    }
    if (!h) throw Error(fmt::format("{}: fork() refused: {}", who(), plugin_message(err)));
    std::unique_ptr<PluginCache> child(new PluginCache(*pool_, new_seq_id, h));
    child->trace = trace;
    for (int p = 0; p < length(); p++)
        if (const std::int64_t s = child->ask_slot(p); s != slots_[std::size_t(p)])
            throw Error(
                fmt::format("{}: fork(): the child's slot(pos={}) is {}, the parent's {} (a child shares its "
                            "parent's slots until a copy)",
                            who(), p, s, slots_[std::size_t(p)]));
    for (int p = 0; p < length(); p++) pool_->hold(slots_[std::size_t(p)], child.get(), p);
    child->slots_ = slots_;
    child->nodes_ = nodes_;
    child->adopt(tokens());
    return child;
}

void PluginCache::set_kv_format(KVFormat format, std::span<const float> scales) {
    pool_->set_kv_format(format, scales);
}

MemoryStats PluginCache::memory() const { return position_rows_memory(config_, storage(), pool_->n_slots(), length()); }

}  // namespace kvlab
