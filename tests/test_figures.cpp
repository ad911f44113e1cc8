// Figures a cache shows its users (a growing cache's capacity, moves and bytes copied; blocks held;
// reserved against used bytes; the event trace) checked against the test's own model of them,
// kept from the operations the test performs, never read from the cache. Every path that appends
// or removes rows is driven: decode, prefill (chunked by max_append), prefill_rows, batch steps
// (refused ones included), truncate, speculative decoding, fork and free. The window's policy is
// checked as a policy: which positions it evicts, when, and which rollbacks it refuses.
//
// Each property has counter-tests: the same body against a deliberately wrong model, or a cache
// wrapper that plants one wrong figure, must fail naming the figure.
#include <fmt/format.h>
#include <rapidcheck.h>
#include <rapidcheck/catch.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache.h"
#include "cpu_backend.h"
#include "decode.h"
#include "model.h"
#include "paged.h"
#include "property.h"
#include "quantized_cache.h"
#include "speculative.h"
#include "test_util.h"
#include "window_cache.h"

using namespace kvlab;

namespace {

// ---- Shared checks

std::string show(const CacheEvent& e) {
    return fmt::format("{} [pos {} count {} block {} from {}]", describe(e, fmt::format("seq {}", e.seq)), e.pos,
                       e.count, e.block, e.from);
}

bool same(const CacheEvent& a, const CacheEvent& b) {
    return a.kind == b.kind && a.seq == b.seq && a.pos == b.pos && a.count == b.count && a.block == b.block &&
           a.from == b.from;
}

// The trace, event by event, against the model's; `what` says after which operation.
void expect_events(const std::vector<CacheEvent>& got, const std::vector<CacheEvent>& want, const std::string& what) {
    for (std::size_t i = 0; i < std::min(got.size(), want.size()); i++)
        if (!same(got[i], want[i]))
            fail(fmt::format("{}: event {} is '{}', the model expects '{}'", what, i, show(got[i]), show(want[i])));
    if (got.size() != want.size())
        fail(fmt::format("{}: {} events, the model expects {} (first extra: '{}')", what, got.size(), want.size(),
                         show(got.size() > want.size() ? got[want.size()] : want[got.size()])));
}

void expect_figure(const char* figure, std::int64_t got, std::int64_t want, const std::string& what) {
    if (got != want) fail(fmt::format("{}: {} is {}, the model says {}", what, figure, got, want));
}

// "a b c" (fmt::join trips GCC 12's -Wstringop-overflow false positive in fmt's spec parser).
template <class Range>
std::string join(const Range& items, const char* separator) {
    std::string out;
    for (const auto& item : items) {
        if (!out.empty()) out += separator;
        out += fmt::format("{}", item);
    }
    return out;
}

// The operations so far, for failure messages (the last one is where it failed).
struct History {
    std::vector<std::string> ops;
    std::string operator()(std::string op) {
        ops.push_back(std::move(op));
        return fmt::format("after [{}]", join(ops, "; "));
    }
};

// ---- 1. The growing cache, on every path that appends or removes rows

enum class GrowBug {
    none,
    model_copies_capacity,  // wrong model: a move copies the whole old capacity, not the rows held
    model_counts_first,     // wrong model: the first allocation counts as a move (off by one move)
    planted_used,           // planted figure: used_bytes reports the capacity
    planted_drops_grown,    // planted figure: a move records no grown event (one fewer event)
};

// A growing cache that logs the lengths the decoders take it through (reserve: length -> new
// length; release: length -> n): the model's input on the one path the test does not drive
// itself, speculative decoding. The figures stay the cache's own unless a bug is planted.
class LoggedGrowing : public GrowingCache {
public:
    struct Op {
        bool append;
        int from, to;
    };
    LoggedGrowing(const Config& c, int initial, GrowBug bug) : GrowingCache(c, initial), bug_(bug) {}
    std::vector<Op> ops;
    MemoryStats memory() const override {
        MemoryStats m = GrowingCache::memory();
        if (bug_ == GrowBug::planted_used) m.used_bytes = m.reserved_bytes;
        return m;
    }

protected:
    void reserve(int new_length) override {
        ops.push_back({true, length(), new_length});
        const int before = capacity();
        GrowingCache::reserve(new_length);
        if (bug_ == GrowBug::planted_drops_grown && before > 0 && capacity() != before && trace) trace->pop_back();
    }
    void release(int n) override {
        ops.push_back({false, length(), n});
        GrowingCache::release(n);
    }

private:
    GrowBug bug_;
};

// The model: capacity is the smallest rung of the ladder initial, 2 initial, 4 initial, ...
// (max_seq at the top) that holds the longest length so far; it never shrinks. Each move after
// the first allocation copies the rows held at that moment.
struct GrowModel {
    Config c;
    int initial = 1, seq = 0;
    GrowBug bug = GrowBug::none;
    int length = 0, capacity = 0;
    std::int64_t moves = 0, copied = 0;
    std::vector<CacheEvent> events{};

    int rung(int n) const {
        std::int64_t cap = initial;
        while (cap < n) cap *= 2;
        return int(std::min<std::int64_t>(cap, c.max_seq));
    }
    void append(int n) {
        const int end = length + n;
        if (end > capacity) {
            if (capacity > 0 || bug == GrowBug::model_counts_first) {
                moves++;
                copied += kv_bytes(c, bug == GrowBug::model_copies_capacity ? capacity : length);
            }
            capacity = rung(end);
            events.push_back({EventKind::grown, seq, -1, capacity});
        }
        events.push_back({EventKind::append, seq, length, n});
        length = end;
    }
    // prefill and prefill_rows append at most max_append() positions at a time (max_seq here).
    void prefill(int n) {
        for (int done = 0; done < n; done += c.max_seq) append(std::min(c.max_seq, n - done));
    }
    void truncate(int n) {
        events.push_back({EventKind::rolled_back, seq, n, length - n});
        length = n;
    }
    // The lengths the log says a run went through.
    void replay(std::span<const LoggedGrowing::Op> ops, const std::string& what) {
        for (const auto& op : ops) {
            if (op.from != length)
                fail(fmt::format("{}: seq {} logged an operation from length {}, the model is at {}", what, seq,
                                 op.from, length));
            if (op.append)
                append(op.to - op.from);
            else
                truncate(op.to);
        }
    }
};

void check_growing(const LoggedGrowing& cache, const GrowModel& m, const std::vector<CacheEvent>& events,
                   const std::string& what) {
    const std::string who = fmt::format("{} seq {}", what, m.seq);
    expect_events(events, m.events, who);
    expect_figure("length", cache.length(), m.length, who);
    expect_figure("capacity", cache.capacity(), m.capacity, who);
    const MemoryStats s = cache.memory();
    expect_figure("reallocations", s.reallocations, m.moves, who);
    expect_figure("bytes_copied", s.bytes_copied, m.copied, who);
    expect_figure("used_bytes", s.used_bytes, kv_bytes(m.c, m.length), who);
    expect_figure("reserved_bytes", s.reserved_bytes, kv_bytes(m.c, m.capacity), who);
    expect_figure("allocated_bytes", s.allocated_bytes, kv_bytes(m.c, m.capacity), who);
}

void growing_property(GrowBug bug) {
    const Config c = draw_config();
    const Model model = random_model(c, draw<std::uint64_t>(0, 1000));
    const Model other = random_model(c, draw<std::uint64_t>(1001, 2000));  // a draft that mostly disagrees
    CpuBackend backend(model), other_backend(other);
    const int initial_a = draw(1, c.max_seq), initial_b = draw(1, c.max_seq);
    LoggedGrowing a(c, initial_a, bug), b(c, initial_b, bug);
    std::vector<CacheEvent> events_a, events_b;
    a.trace = &events_a, b.trace = &events_b;
    a.seq_id = 0, b.seq_id = 1;
    GrowModel model_a{c, initial_a, 0, bug}, model_b{c, initial_b, 1, bug};
    ContiguousCache fixed(c);         // a batch member that does not grow
    WindowCache refuser(c, 0, 1, 1);  // appends one position at a time: given two, it refuses the batch
    CachedDecoder dec_a(backend, a), dec_b(backend, b);
    LoggedGrowing* caches[] = {&a, &b};
    GrowModel* models[] = {&model_a, &model_b};
    CachedDecoder* decs[] = {&dec_a, &dec_b};
    History history;

    const int n_ops = draw(1, 12);
    for (int op = 0; op < n_ops; op++) {
        const int x = draw(0, 1);
        LoggedGrowing& cache = *caches[x];
        GrowModel& m = *models[x];
        const int room = c.max_seq - cache.length();
        int kind = draw(0, 5);
        if (kind <= 2 && room == 0) kind = 4;
        std::string what;
        if (kind == 0) {
            what = history(fmt::format("seq {} decode", x));
            decs[x]->decode(draw(0, c.vocab_size - 1));
            m.append(1);
        } else if (kind == 1 || kind == 2) {
            const int n = draw(1, room);
            what = history(fmt::format("seq {} {} {}", x, kind == 1 ? "prefill" : "prefill_rows", n));
            const std::vector<int> tokens = draw_tokens(c, n);
            kind == 1 ? decs[x]->prefill(tokens) : decs[x]->prefill_rows(tokens);
            m.prefill(n);
        } else if (kind == 3) {
            // A batch of a, b and the fixed cache in a random order, each with room; sometimes with
            // the refuser among them, and then the batch leaves every cache as it was (decode.h).
            std::vector<Cache*> members;
            for (Cache* k : {static_cast<Cache*>(&a), static_cast<Cache*>(&b), static_cast<Cache*>(&fixed)})
                if (k->length() < c.max_seq && draw(0, 1)) members.push_back(k);
            for (int i = int(members.size()) - 1; i > 0; i--) std::swap(members[i], members[draw(0, i)]);
            const bool refuse = c.max_seq >= 2 && draw(0, 2) == 0;
            if (refuse) members.insert(members.begin() + draw(0, int(members.size())), &refuser);
            if (members.empty()) continue;
            std::vector<std::vector<int>> rows;
            std::vector<std::string> shown;
            for (Cache* k : members) {
                const int n = k == &refuser ? 2 : draw(1, std::min(3, c.max_seq - k->length()));
                rows.push_back(draw_tokens(c, n));
                shown.push_back(fmt::format("{} x{}",
                                            k == &a       ? "a"
                                            : k == &b     ? "b"
                                            : k == &fixed ? "fixed"
                                                          : "refuser",
                                            n));
            }
            what = history(fmt::format("step [{}]", join(shown, ", ")));
            bool threw = false;
            try {
                dec_a.step(members, rows);
            } catch (const Error&) {
                threw = true;
            }
            if (threw != refuse) fail(fmt::format("{}: the batch {}", what, threw ? "was refused" : "was not refused"));
            if (!refuse)
                for (std::size_t i = 0; i < members.size(); i++)
                    for (int s = 0; s < 2; s++)
                        if (members[i] == caches[s]) models[s]->append(int(rows[i].size()));
        } else if (kind == 4) {
            const int n = draw(0, cache.length());
            what = history(fmt::format("seq {} truncate {}", x, n));
            cache.truncate(n);
            m.truncate(n);
        } else {
            // Speculative decoding: x is the target, the other growing cache the draft's. The
            // decoder chooses the appends and rollbacks; the log records them for the model, and
            // is itself checked against the run's counts.
            const int P = draw(1, c.max_seq), steps = draw(1, c.max_seq - P + 1), k = draw(1, 4);
            const bool self = draw(0, 1);
            what = history(fmt::format("speculate target {} prompt {} steps {} k {} draft {}", x, P, steps, k,
                                       self ? "self" : "other"));
            LoggedGrowing& draft_cache = *caches[1 - x];
            CachedDecoder draft(self ? backend : other_backend, draft_cache);
            SpeculativeDecoder spec(*decs[x], draft, k);
            const std::size_t from_t = cache.ops.size(), from_d = draft_cache.ops.size();
            const DecodeRun run = spec.generate(draw_tokens(c, P), steps);
            const auto target_ops = std::span(cache.ops).subspan(from_t);
            int appended = 0, rollbacks = 0;
            for (const auto& o : target_ops) {
                if (o.append)
                    appended += o.to - o.from;
                else
                    rollbacks++;
            }
            // Prompt but its last token, then each target step runs the last token and its drafts.
            expect_figure("positions the target appended", appended,
                          P - 1 + run.stats.proposed + run.stats.target_steps, what);
            expect_figure("target rollbacks", rollbacks, 1 + run.stats.target_steps, what);
            m.replay(target_ops, what);
            models[1 - x]->replay(std::span(draft_cache.ops).subspan(from_d), what);
            expect_figure("target length", m.length, P + steps - 1, what);
        }
        check_growing(a, model_a, events_a, what);
        check_growing(b, model_b, events_b, what);
    }
}

// ---- 2. Blocks, pool counts and events of the paged cache

enum class PagedBug {
    none,
    model_no_cow,     // wrong model: a write into a shared partial block goes in place
    planted_reserved  // planted figure: reserved_bytes counts only the blocks a sequence holds alone
};

class PlantedPaged : public PagedCache {
public:
    using PagedCache::PagedCache;
    MemoryStats memory() const override {
        MemoryStats m = PagedCache::memory();
        int own = 0;
        for (int block : block_table()) own += pool().refcount(block) == 1;
        m.reserved_bytes = own * pool().block_bytes();
        return m;
    }
};

// The model (no prefix caching, so it is exact): each sequence's length and the abstract blocks
// its table maps, shared by forks; a block is held while some table maps it. Events name
// abstract blocks; PagedChecker binds each to the physical block the pool announced for it.
struct PagedModel {
    int bs = 1, n_blocks = 1;
    PagedBug bug = PagedBug::none;
    struct Seq {
        int length = 0;
        std::vector<int> blocks;
    };
    std::map<int, Seq> seqs{};
    std::map<int, int> refs{};  // abstract block -> tables mapping it (erased at 0)
    int next_block = 0;
    std::vector<CacheEvent> events{};

    int n_used() const { return int(refs.size()); }
    int n_free() const { return n_blocks - n_used(); }
    int blocks_for(int n) const { return (n + bs - 1) / bs; }
    int take(int seq) {
        const int block = next_block++;
        refs[block] = 1;
        events.push_back({EventKind::block_allocated, seq, -1, 0, block});
        return block;
    }
    void drop(int seq, int block) {
        if (--refs.at(block) > 0) return;
        refs.erase(block);
        events.push_back({EventKind::freed, seq, -1, 0, block});
    }
    // False, changing nothing, when the pool cannot hold it.
    bool append(int id, int n) {
        Seq& s = seqs.at(id);
        const int L = s.length, b = L / bs;
        const bool cow = bug != PagedBug::model_no_cow && L % bs != 0 && refs.at(s.blocks[b]) > 1;
        const int n_new = blocks_for(L + n) - int(s.blocks.size());
        if (n_new + int(cow) > n_free()) return false;
        if (cow) {
            const int shared = s.blocks[b], copy = take(id);
            drop(id, shared);
            s.blocks[b] = copy;
            events.push_back({EventKind::copy_on_write, id, L, 0, copy, shared});
        }
        for (int i = 0; i < n_new; i++) s.blocks.push_back(take(id));
        events.push_back({EventKind::append, id, L, n});
        s.length = L + n;
        return true;
    }
    void truncate(int id, int n) {
        Seq& s = seqs.at(id);
        while (int(s.blocks.size()) > blocks_for(n)) {
            drop(id, s.blocks.back());
            s.blocks.pop_back();
        }
        events.push_back({EventKind::rolled_back, id, n, s.length - n});
        s.length = n;
    }
    void fork(int id, int child) {
        seqs[child] = seqs.at(id);
        for (int block : seqs[child].blocks) {
            refs.at(block)++;
            events.push_back({EventKind::block_shared, child, -1, 0, block});
        }
    }
    void free(int id) {
        for (int block : seqs.at(id).blocks) drop(id, block);
        seqs.erase(id);
    }
};

struct PagedChecker {
    std::size_t checked = 0;
    std::map<int, int> physical;  // live abstract block -> its physical block
    std::map<int, int> abstract;  // physical block -> the live abstract block in it

    int phys(int block) const { return block < 0 ? -1 : physical.count(block) ? physical.at(block) : -2; }
    void events(const std::vector<CacheEvent>& got, const std::vector<CacheEvent>& want, const std::string& what) {
        for (; checked < std::min(got.size(), want.size()); checked++) {
            const CacheEvent &g = got[checked], &w = want[checked];
            if (w.kind == EventKind::block_allocated && g.kind == w.kind && g.block >= 0) {
                if (abstract.count(g.block))
                    fail(fmt::format("{}: event {} '{}' hands out a block still in use", what, checked, show(g)));
                physical[w.block] = g.block, abstract[g.block] = w.block;
            }
            CacheEvent expected = w;
            expected.block = phys(w.block), expected.from = phys(w.from);
            if (!same(g, expected))
                fail(fmt::format("{}: event {} is '{}', the model expects '{}'", what, checked, show(g),
                                 show(expected)));
            if (w.kind == EventKind::freed) abstract.erase(physical.at(w.block)), physical.erase(w.block);
        }
        if (got.size() != want.size())
            fail(fmt::format("{}: {} events, the model expects {}", what, got.size(), want.size()));
    }
};

void paged_property(PagedBug bug) {
    const Config c = draw_config();
    const Model model = random_model(c, draw<std::uint64_t>(0, 1000));
    CpuBackend backend(model);
    const int bs = draw(1, std::min(4, c.max_seq)), n_blocks = draw(1, 12);
    std::vector<CacheEvent> events;  // before the pool and the sequences: their destructors record
    BlockPool pool(c, bs, n_blocks);
    pool.trace = &events;
    std::map<int, std::unique_ptr<PagedCache>> seqs;
    PagedModel m{bs, n_blocks, bug};
    PagedChecker checker;
    History history;
    int next_id = 0;
    auto pick = [&] { return std::next(seqs.begin(), draw(0, int(seqs.size()) - 1))->first; };

    const int n_ops = draw(1, 30);
    for (int op = 0; op < n_ops; op++) {
        int kind = seqs.empty() ? 0 : draw(0, 8);
        if (kind == 8) kind = 5;  // forks twice as often: copy-on-write needs one
        if ((kind == 0 || kind == 5) && seqs.size() >= 4) kind = 1;
        std::string what;
        if (kind == 0) {
            const int id = next_id++;
            what = history(fmt::format("new {}", id));
            if (bug == PagedBug::planted_reserved)
                seqs[id] = std::make_unique<PlantedPaged>(pool, 0, id);
            else
                seqs[id] = std::make_unique<PagedCache>(pool, 0, id);
            seqs[id]->trace = &events;
            m.seqs[id] = {};
        } else if (kind <= 3) {
            const int id = pick();
            PagedCache& cache = *seqs.at(id);
            const int room = c.max_seq - cache.length();
            if (room == 0) continue;
            // At most 2 blocks and a row, so that small pools do not fill at once.
            const int n = kind == 1 ? 1 : draw(1, std::min(room, 2 * bs + 1));
            const char* path = kind == 1 ? "decode" : kind == 2 ? "prefill" : "prefill_rows";
            what = history(fmt::format("{} {} x{}", path, id, n));
            const std::vector<int> tokens = draw_tokens(c, n);
            const bool fits = m.append(id, n);
            bool threw = false;
            try {
                CachedDecoder dec(backend, cache);
                kind == 3 ? dec.prefill_rows(tokens) : dec.prefill(tokens);
            } catch (const Error&) {
                threw = true;
            }
            if (threw == fits)
                fail(fmt::format("{}: the pool {} it; the model says it {}", what, threw ? "refused" : "took",
                                 fits ? "fits" : "does not fit"));
        } else if (kind == 4) {
            std::vector<int> ids;
            for (const auto& [id, cache] : seqs)
                if (cache->length() < c.max_seq && draw(0, 1)) ids.push_back(id);
            if (ids.empty()) continue;
            for (int i = int(ids.size()) - 1; i > 0; i--) std::swap(ids[i], ids[draw(0, i)]);
            std::vector<Cache*> members;
            std::vector<std::vector<int>> rows;
            std::vector<std::string> shown;
            for (int id : ids) {
                members.push_back(seqs.at(id).get());
                rows.push_back(draw_tokens(c, draw(1, std::min(3, c.max_seq - seqs.at(id)->length()))));
                shown.push_back(fmt::format("{} x{}", id, rows.back().size()));
            }
            what = history(fmt::format("step [{}]", join(shown, ", ")));
            // Each in order, on what the ones before it took; if one does not fit, the batch leaves
            // every cache as it was (decode.h).
            PagedModel trial = m;
            bool fits = true;
            for (std::size_t i = 0; i < ids.size() && fits; i++) fits = trial.append(ids[i], int(rows[i].size()));
            if (fits) m = trial;
            bool threw = false;
            try {
                CachedDecoder dec(backend, *members[0]);
                dec.step(members, rows);
            } catch (const Error&) {
                threw = true;
            }
            if (threw == fits)
                fail(fmt::format("{}: the pool {} it; the model says it {}", what, threw ? "refused" : "took",
                                 fits ? "fits" : "does not fit"));
        } else if (kind == 5) {
            const int id = pick(), child = next_id++;
            what = history(fmt::format("fork {} -> {}", id, child));
            seqs[child] = seqs.at(id)->fork(child);
            m.fork(id, child);
        } else if (kind == 6) {
            const int id = pick(), n = draw(0, seqs.at(id)->length());
            what = history(fmt::format("truncate {} to {}", id, n));
            seqs.at(id)->truncate(n);
            m.truncate(id, n);
        } else {
            const int id = pick();
            what = history(fmt::format("free {}", id));
            seqs.erase(id);
            m.free(id);
        }

        checker.events(events, m.events, what);
        for (const auto& [id, s] : m.seqs) {
            const PagedCache& cache = *seqs.at(id);
            const std::string who = fmt::format("{} seq {}", what, id);
            expect_figure("length", cache.length(), s.length, who);
            std::vector<int> want;
            for (int block : s.blocks) want.push_back(checker.phys(block));
            if (cache.block_table() != want)
                fail(fmt::format("{}: block table [{}], the model's blocks are [{}]", who,
                                 join(cache.block_table(), " "), join(want, " ")));
            const MemoryStats ms = cache.memory();
            const std::int64_t held = std::int64_t(s.blocks.size()) * pool.block_bytes();
            expect_figure("reserved_bytes", ms.reserved_bytes, held, who);
            expect_figure("allocated_bytes", ms.allocated_bytes, held, who);
            expect_figure("used_bytes", ms.used_bytes, kv_bytes(c, s.length), who);
            expect_figure("blocks_used", ms.blocks_used, m.n_used(), who);
            expect_figure("blocks_free", ms.blocks_free, m.n_free(), who);
        }
        expect_figure("n_used", pool.n_used(), m.n_used(), what);
        expect_figure("n_free", pool.n_free(), m.n_free(), what);
        expect_figure("n_cached", pool.n_cached(), 0, what);
        const MemoryStats pm = pool.memory();
        expect_figure("pool blocks_used", pm.blocks_used, m.n_used(), what);
        expect_figure("pool blocks_free", pm.blocks_free, m.n_free(), what);
        expect_figure("pool blocks_cached", pm.blocks_cached, 0, what);
        expect_figure("pool reserved_bytes", pm.reserved_bytes, n_blocks * pool.block_bytes(), what);
        expect_figure("pool allocated_bytes", pm.allocated_bytes, n_blocks * pool.block_bytes(), what);
        expect_figure("shared_writes", pool.shared_writes(), 0, what);
    }
}

// ---- 3. The window's policy: what it evicts, what it attends, which rollbacks it refuses

enum class WindowBug {
    none,
    model_last_w,     // wrong model: only the last W positions stay (the ring keeps W + chunk - 1)
    model_no_refuse,  // wrong model: every rollback is allowed
    planted_used,     // planted figure: used_bytes counts min(length, S + W) positions
};

class PlantedWindow : public WindowCache {
public:
    using WindowCache::WindowCache;
    MemoryStats memory() const override {
        MemoryStats m = WindowCache::memory();
        m.used_bytes = kv_bytes(config(), std::min(length(), sinks() + window()));
        return m;
    }
};

// The model: sinks 0..S-1 stay; any other position stays while it is among the last R = W +
// chunk - 1 positions appended (a step writes up to chunk rows before its first query reads the
// W before it), and leaves, with an `evicted` event, when a later append pushes it out. When S +
// R >= max_seq nothing ever leaves. A rollback to n forgets positions >= n, and is refused when a
// query at n would need a position already gone.
struct WindowModel {
    Config c;
    int S = 0, W = 1, chunk = 1;
    WindowBug bug = WindowBug::none;
    int length = 0, latest = 0;    // latest: the first position of the latest append
    std::vector<bool> resident{};  // [max_seq]
    std::vector<CacheEvent> events{};

    int R() const { return bug == WindowBug::model_last_w ? W : W + chunk - 1; }
    bool evicts() const { return S + W + chunk - 1 < c.max_seq; }
    int n_resident() const { return int(std::count(resident.begin(), resident.end(), true)); }
    void append(int n) {
        for (int p = length; p < length + n; p++) {
            if (evicts())
                for (int q = S; q <= p - R(); q++)
                    if (resident[q]) {
                        resident[q] = false;
                        events.push_back({EventKind::evicted, 0, q});
                    }
            resident[p] = true;
        }
        events.push_back({EventKind::append, 0, length, n});
        latest = length;
        length += n;
    }
    void prefill(int n) {
        for (int done = 0; done < n; done += chunk) append(std::min(chunk, n - done));
    }
    bool truncate(int n) {
        if (bug != WindowBug::model_no_refuse)
            for (int t = std::max(S, n - W + 1); t < n; t++)
                if (!resident[t]) return false;
        for (int t = n; t < c.max_seq; t++) resident[t] = false;
        events.push_back({EventKind::rolled_back, 0, n, length - n});
        length = n;
        latest = std::min(latest, n);
        return true;
    }
};

void check_window(const WindowCache& cache, const WindowModel& m, const std::vector<CacheEvent>& events,
                  const std::string& what) {
    expect_events(events, m.events, what);
    expect_figure("length", cache.length(), m.length, what);
    for (int t = 0; t < m.length; t++)
        if (cache.resident(t) != m.resident[t] || (cache.slot(t) >= 0) != m.resident[t])
            fail(fmt::format("{}: position {} is {}, the model says {}", what, t,
                             cache.resident(t) ? "resident" : "gone", m.resident[t] ? "resident" : "gone"));
    std::vector<std::int64_t> slots(std::size_t(m.c.max_seq));
    std::vector<int> positions(std::size_t(m.c.max_seq));
    for (int pos = 0; pos < m.length; pos++) {
        std::vector<int> want;
        for (int t = 0; t < std::min(m.S, pos + 1); t++) want.push_back(t);
        for (int t = std::max(m.S, pos - m.W + 1); t <= pos; t++) want.push_back(t);
        const int n = cache.attended(pos, slots.data(), positions.data());
        const std::vector<int> got(positions.begin(), positions.begin() + n);
        if (got != want)
            fail(fmt::format("{}: a query at {} attends [{}], the model says [{}]", what, pos, join(got, " "),
                             join(want, " ")));
        for (int i = 0; i < n; i++) {
            if ((slots[i] >= 0) != m.resident[got[i]])
                fail(fmt::format("{}: a query at {} reads slot {} for position {}, which the model says is {}", what,
                                 pos, slots[i], got[i], m.resident[got[i]] ? "resident" : "gone"));
            // The latest step's queries ran after its writes: everything they attend must be there.
            if (pos >= m.latest && !m.resident[got[i]])
                fail(fmt::format("{}: the latest step's query at {} attends position {}, already evicted", what, pos,
                                 got[i]));
        }
    }
    const MemoryStats s = cache.memory();
    const std::int64_t ring = kv_bytes(m.c, std::min(m.S + m.W + m.chunk - 1, m.c.max_seq));
    expect_figure("used_bytes", s.used_bytes, kv_bytes(m.c, m.n_resident()), what);
    expect_figure("reserved_bytes", s.reserved_bytes, ring, what);
    expect_figure("allocated_bytes", s.allocated_bytes, ring, what);
}

void window_property(WindowBug bug) {
    const Config c = draw_config();
    const Model model = random_model(c, draw<std::uint64_t>(0, 1000));
    CpuBackend backend(model);
    const int S = draw(0, 4), W = draw(1, 6), chunk = draw(0, 4);
    std::unique_ptr<WindowCache> owned = bug == WindowBug::planted_used
                                             ? std::make_unique<PlantedWindow>(c, S, W, chunk)
                                             : std::make_unique<WindowCache>(c, S, W, chunk);
    WindowCache& cache = *owned;
    std::vector<CacheEvent> events;
    cache.trace = &events;
    WindowModel m{c, S, W, chunk == 0 ? W : chunk, bug};
    m.resident.assign(std::size_t(c.max_seq), false);
    CachedDecoder dec(backend, cache);
    History history;
    std::string what = history(fmt::format("window sinks {} window {} chunk {}", S, W, chunk));

    const int n_ops = draw(1, 12);
    for (int op = 0; op < n_ops; op++) {
        const int room = c.max_seq - cache.length();
        int kind = draw(0, 3);
        if (kind <= 2 && room == 0) kind = 3;
        if (kind == 0) {
            what = history("decode");
            dec.decode(draw(0, c.vocab_size - 1));
            m.append(1);
        } else if (kind <= 2) {
            const int n = draw(1, room);
            what = history(fmt::format("{} {}", kind == 1 ? "prefill" : "prefill_rows", n));
            const std::vector<int> tokens = draw_tokens(c, n);
            kind == 1 ? dec.prefill(tokens) : dec.prefill_rows(tokens);
            m.prefill(n);
        } else {
            const int n = draw(0, cache.length());
            what = history(fmt::format("truncate {}", n));
            bool refused = false;
            try {
                cache.truncate(n);
            } catch (const Error&) {
                refused = true;
            }
            if (refused == m.truncate(n))
                fail(fmt::format("{}: the cache {} it; the model {}", what, refused ? "refused" : "allowed",
                                 refused ? "allows it" : "refuses it"));
        }
        check_window(cache, m, events, what);
    }
}

// ---- 4. The quantized cache's payload, metadata and scratch bytes

enum class QuantBug { none, model_no_padding };  // wrong model: a row's codes not padded to 4 bytes

// From the documented layout: K and V rows for max_seq positions per (layer, KV head), each the
// scale and min (fp32) of its head_size / group groups, then its codes (head_size * bits / 8
// bytes, rounded up and padded to 4); per-channel keys keep their channel scales in those same
// row slots, and group fp32 rows per (layer, KV head) while their group is open. No fp32 copy.
// None of it depends on the length; used_bytes does.
void quant_property(QuantBug bug) {
    const Config c = draw_config();
    const int hs = c.head_size();
    const int bits = draw(0, 1) ? 8 : 4;
    const bool per_channel = draw(0, 1);
    std::vector<int> groups;
    for (int g = 1; g <= hs; g++)
        if (hs % g == 0 && (!per_channel || g <= c.max_seq)) groups.push_back(g);
    const int group = groups[std::size_t(draw(0, int(groups.size()) - 1))];
    const QuantSpec spec{bits, per_channel ? QuantSpec::Axis::per_channel : QuantSpec::Axis::per_token, group};
    const Model model = random_model(c, draw<std::uint64_t>(0, 1000));
    CpuBackend backend(model);
    QuantizedCache cache(c, spec);
    CachedDecoder dec(backend, cache);

    const std::int64_t heads = std::int64_t(c.n_layers) * c.n_kv_heads, rows = heads * c.max_seq;
    const std::int64_t code_bytes = (std::int64_t(hs) * bits + 7) / 8;
    const std::int64_t codes = bug == QuantBug::model_no_padding ? code_bytes : (code_bytes + 3) / 4 * 4;
    const std::int64_t scales = std::int64_t(hs / group) * 8, row_bytes = scales + codes;
    const std::int64_t residual = per_channel ? 4 * heads * group * hs : 0;
    const std::int64_t payload = 2 * rows * codes + residual;
    const std::int64_t metadata = 2 * rows * scales;
    History history;
    std::string what = history(cache.name());
    const int n_ops = draw(1, 6);
    for (int op = 0; op < n_ops; op++) {
        const int room = c.max_seq - cache.length();
        if (room > 0 && draw(0, 2) != 0) {
            const int n = draw(1, room);
            what = history(fmt::format("prefill {}", n));
            dec.prefill(draw_tokens(c, n));
        } else {
            const int n = draw(0, cache.length());
            what = history(fmt::format("truncate {}", n));
            cache.truncate(n);
        }
        const MemoryStats s = cache.memory();
        expect_figure("used_bytes", s.used_bytes, 2 * heads * cache.length() * row_bytes, what);
        expect_figure("payload_bytes", s.payload_bytes, payload, what);
        expect_figure("metadata_bytes", s.metadata_bytes, metadata, what);
        expect_figure("reserved_bytes", s.reserved_bytes, payload + metadata, what);
        expect_figure("allocated_bytes", s.allocated_bytes, payload + metadata, what);
        expect_figure("scratch_bytes", s.scratch_bytes, 0, what);
        // bytes_per_token, the table's steady-state figure, is the same layout per position: all
        // of it but the residual.
        if (cache.bytes_per_token() * c.max_seq != double(payload + metadata - residual))
            fail(fmt::format("{}: bytes_per_token {} x max_seq {} != {} bytes of codes and scales", what,
                             cache.bytes_per_token(), c.max_seq, payload + metadata - residual));
    }
}

}  // namespace

TEST_CASE("figures: growing cache: capacity, moves, bytes copied, bytes and events equal the model on every path",
          "[figures][growing]") {
    rc::prop("decode, prefill, prefill_rows, batches (refused too), truncate, speculative decoding",
             [] { growing_property(GrowBug::none); });
}

TEST_CASE("figures: growing cache counter-test: a wrong model or a planted figure is caught",
          "[figures][growing][counter]") {
    test::expect_failure([] { growing_property(GrowBug::model_copies_capacity); }, "bytes_copied");
    test::expect_failure([] { growing_property(GrowBug::model_counts_first); }, "reallocations");
    test::expect_failure([] { growing_property(GrowBug::planted_used); }, "used_bytes");
    test::expect_failure([] { growing_property(GrowBug::planted_drops_grown); }, "grown");
}

TEST_CASE("figures: paged cache: blocks held, pool counts, bytes and events equal the model", "[figures][paged]") {
    rc::prop("decode, prefill, prefill_rows, batches (refused too), fork, truncate, free",
             [] { paged_property(PagedBug::none); });
}

TEST_CASE("figures: paged cache counter-test: a model without copy-on-write, a planted reserved figure",
          "[figures][paged][counter]") {
    // The copy the model forgot is a block the pool lacks when it is full.
    test::expect_failure([] { paged_property(PagedBug::model_no_cow); }, "the pool refused it; the model says it fits");
    test::expect_failure([] { paged_property(PagedBug::planted_reserved); }, "reserved_bytes");
}

TEST_CASE("figures: window: evicts exactly the positions that leave, attends sinks and window, refuses lost rollbacks",
          "[figures][window][policy]") {
    rc::prop("decode, chunked prefill, prefill_rows, truncate", [] { window_property(WindowBug::none); });
}

TEST_CASE("figures: window counter-test: a last-W model, a model that never refuses, a planted used figure",
          "[figures][window][counter]") {
    test::expect_failure([] { window_property(WindowBug::model_last_w); }, "evicted");
    test::expect_failure([] { window_property(WindowBug::model_no_refuse); }, "the cache refused it");
    test::expect_failure([] { window_property(WindowBug::planted_used); }, "used_bytes");
}

TEST_CASE("figures: quantized cache: payload, metadata, scratch and used bytes equal the documented layout",
          "[figures][quant]") {
    rc::prop("int8 and int4, per-token and per-channel keys, every group, any length",
             [] { quant_property(QuantBug::none); });
}

TEST_CASE("figures: quantized counter-test: a model without the rows' padding is caught", "[figures][quant][counter]") {
    test::expect_failure([] { quant_property(QuantBug::model_no_padding); }, "payload_bytes");
}
