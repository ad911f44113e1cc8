// fuzz_replay_log: `kvlab replay`'s reader (proofs/plugin_replay.h) on arbitrary bytes, replayed
// on an exact in-process plugin (a free list: one slot a position, freed slots reused).
//
// Input: a replay log (JSON lines). Seeds: a log with every call (fuzz/make_seeds.cpp).
// Checks: whatever the bytes, the replay ends in a kvlab::Error (not a log) or an outcome, with
// one-line verdicts; it never crashes, hangs or reads a slot its books did not check.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "plugin_replay.h"

using namespace kvlab;

namespace {

struct FreePool {
    std::vector<std::int64_t> free;  // the slots nobody holds
};
struct FreeSeq {
    FreePool* pool;
    std::vector<std::int64_t> slots;  // [length] each position's slot
};
FreePool* pool_of(kvlab_cache_pool* p) { return reinterpret_cast<FreePool*>(p); }
FreeSeq* seq_of(kvlab_cache* c) { return reinterpret_cast<FreeSeq*>(c); }
const FreeSeq* seq_of(const kvlab_cache* c) { return reinterpret_cast<const FreeSeq*>(c); }

kvlab_cache_pool* make_pool(const kvlab_cache_config& c, char*, std::size_t) {
    auto* p = new FreePool;
    for (std::int64_t s = c.n_slots - 1; s >= 0; s--) p->free.push_back(s);
    return reinterpret_cast<kvlab_cache_pool*>(p);
}
void destroy_pool(kvlab_cache_pool* p) { delete pool_of(p); }
kvlab_cache* create(kvlab_cache_pool* p, char*, std::size_t) {
    return reinterpret_cast<kvlab_cache*>(new FreeSeq{pool_of(p), {}});
}
int reserve(kvlab_cache* c, std::int32_t, std::int32_t n, const std::int32_t*, kvlab_slot_copy*, std::int32_t,
            std::int32_t*, char* err, std::size_t err_len) {
    FreeSeq* s = seq_of(c);
    if (std::size_t(n) > s->pool->free.size()) {
        std::snprintf(err, err_len, "full");
        return 1;
    }
    for (std::int32_t i = 0; i < n; i++) s->slots.push_back(s->pool->free.back()), s->pool->free.pop_back();
    return 0;
}
std::int64_t slot(const kvlab_cache* c, std::int32_t pos) {
    const std::vector<std::int64_t>& slots = seq_of(c)->slots;
    return pos >= 0 && std::size_t(pos) < slots.size() ? slots[std::size_t(pos)] : -1;  // -1: kvlab's Error
}
void release(kvlab_cache* c, std::int32_t n) {
    FreeSeq* s = seq_of(c);
    while (std::int32_t(s->slots.size()) > n) s->pool->free.push_back(s->slots.back()), s->slots.pop_back();
}
std::int64_t memory(const kvlab_cache_pool*) { return 0; }
void destroy(kvlab_cache* c) {
    release(c, 0);
    delete seq_of(c);
}
kvlab_cache* fork(kvlab_cache*, char* err, std::size_t err_len) {
    std::snprintf(err, err_len, "no fork");  // a refusal: the replay's verdict
    return nullptr;
}
int step_done(kvlab_cache*, kvlab_slot_move*, std::int32_t, std::int32_t*, char*, std::size_t) { return 0; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const CachePlugin plugin = [] {
        kvlab_cache_plugin_abi3 t{};
        t.abi_version = 3, t.name = "free_list", t.destroy_pool = destroy_pool, t.create = create, t.fork = fork;
        t.reserve = reserve, t.slot = slot, t.release = release, t.memory = memory, t.destroy = destroy;
        t.step_done = step_done;
        return CachePlugin("free_list", t, make_pool);
    }();
    try {
        const ReplayOutcome o = replay_plugin_log(plugin, std::string(reinterpret_cast<const char*>(data), size));
        FUZZ_CHECK(o.verdict.find('\n') == std::string::npos, "fuzz_replay_log: a verdict of two lines");
        FUZZ_CHECK(o.calls >= 0, "fuzz_replay_log: %d calls", o.calls);
    } catch (const Error&) {
    }
    return 0;
}
