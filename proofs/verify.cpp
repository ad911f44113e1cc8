#include "verify.h"

#include <fmt/format.h>
#include <rapidcheck.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>

#include "approx_metrics.h"
#include "beam.h"
#include "cache_factory.h"
#include "compare.h"
#include "decode.h"
#include "device.h"
#include "generators.h"
#include "hostile_store.h"
#include "mla_property.h"
#include "model.h"
#include "planted.h"
#include "plugin_cache.h"
#include "plugin_replay.h"
#include "property.h"
#include "sampler.h"
#include "scheduler.h"
#include "speculative.h"

namespace kvlab {

namespace {

// ----------------------------------------------------------------------------------------------
// Where a property runs (its inputs come from property.h: draw, draw_config, draw_tokens)

// What a row's cases reached over a run, shrinking included: how many held each threshold
// position, the largest T, pool fill and sequence count; and the sizes of the last case that
// failed, which is the counterexample RapidCheck reports (it keeps the last failing shrink).
// One record for every row, kvlab's own and a plugin's.
struct Reach {
    static constexpr int kMarks[] = {97, 257, 1025, 4097, 8191};  // positions held: T > mark
    struct Sizes {
        int T = 0;             // the longest sequence
        int fill_percent = 0;  // the most of a pool's blocks held at once
        int sequences = 0;     // the most sequences holding a pool's blocks at once
        bool pool = false;     // whether the case had a pool
    };
    std::string row;                                 // names the progress line
    std::function<void(std::string_view)> progress;  // the long profile's progress line, else null
    int cases = 0, marks[5] = {0, 0, 0, 0, 0};
    Sizes largest, current, failed;
    // A plugin's: the most slots held at once, cases that filled a pool to 95% or more and to a
    // refusal, whole-only plugins' preemptions and step_done's moved positions.
    int held_slots = 0, fill95_cases = 0, full_cases = 0;
    std::int64_t preemptions = 0, moved = 0;
    std::string replay_log;  // a plugin's latest failing case (plugin_replay.h)

    // T: the case's longest sequence so far; its first note shows on the progress line.
    void size(int T) {
        if (progress && current.T == 0) progress(fmt::format("{}: case {}, T = {}", row, cases + 1, T));
        current.T = std::max(current.T, T);
    }
    void pool(int fill_percent, int sequences) {
        current.pool = true;
        current.fill_percent = std::max(current.fill_percent, fill_percent);
        current.sequences = std::max(current.sequences, sequences);
    }
    // The case is over (failed: it threw).
    void end(bool case_failed) {
        cases++;
        for (int i = 0; i < 5; i++) marks[i] += current.T > kMarks[i];
        largest.T = std::max(largest.T, current.T);
        largest.fill_percent = std::max(largest.fill_percent, current.fill_percent);
        largest.sequences = std::max(largest.sequences, current.sequences);
        largest.pool = largest.pool || current.pool;
        fill95_cases += current.pool && current.fill_percent >= 95;
        if (case_failed) failed = current;
        current = {};
    }
    // A property body whose cases this record counts.
    std::function<void()> around(std::function<void()> body) {
        return [this, body = std::move(body)] {
            current = {};
            try {
                body();
            } catch (...) {
                end(true);
                throw;
            }
            end(false);
        };
    }
    // The report's line: the marks when any case reached one (or the run is long), the largest
    // sizes, and a plugin's counts.
    std::string text(bool long_profile, bool plugin) const {
        if (cases == 0) return "";
        std::string t = fmt::format("cases run (shrinking included) {}: largest T {}", cases, largest.T);
        if (largest.pool)
            t += fmt::format(", pool fill {}%, most sequences at once {}", largest.fill_percent, largest.sequences);
        if (long_profile || plugin || marks[0] > 0)
            t += fmt::format("; position >= 97 held in {}, >= 257 in {}, >= 1025 in {}, >= 4097 in {}, 8191 in {}",
                             marks[0], marks[1], marks[2], marks[3], marks[4]);
        if (plugin)
            t += fmt::format(
                "; {} slots held at once; {} cases filled a pool to 95% or more, {} to a refusal; {} preemptions, {} "
                "positions moved by step_done",
                held_slots, fill95_cases, full_cases, preemptions, moved);
        return t;
    }
};

// The devices of a run (VerifyOptions::device): naive decode on `reference` is what every
// result is checked against; the decoders under test and their caches run on `tested`.
struct Devices {
    std::string reference = "cpu", tested = "cpu";
    std::function<std::unique_ptr<Backend>(std::string_view, const Model&)> make;
    std::optional<KVFormat> format;  // VerifyOptions::kv_format, when given
    // VerifyOptions::attention: what naive and cached decode both run (simple unless given); the
    // tiled-attention scenario draws a tile when none is given.
    std::optional<AttentionSpec> attention;
    // The scenarios that can (chunked-prefill, tiled-attention, prefix-hit-extend, rescoring,
    // rollback, fork, speculate, serve, store, beam, stale) draw thin models (draw_shape): half
    // the time to positions 97 and 257 in the fast profile, always with contexts up to 8192 in
    // --profile long; the exact variant and format rows keep the fast profile's sizes in both
    // (draw_row_shape). A thin case biases its sizes to the thresholds (draw_size) and checks
    // naive decode at each chunk and a few decode steps. The long profile's batch draws up to 300
    // sequences, fork 8-64 of them and serve and store 8-64 requests, half the time.
    bool long_profile = false;
    Reach* reach = nullptr;  // the row's record of its cases' sizes; null: none kept
};

// A property's shape: with long_ok, the plugin checks' sizes (draw_reaching_config: half the
// time a thin model to position 97 or 257 in the fast profile, contexts to 8192 in the long one),
// else a tiny model.
Config draw_shape(const Devices& d, int min_seq, bool long_ok) {
    return long_ok ? draw_reaching_config(d.long_profile, min_seq) : draw_config(min_seq);
}
// A thin model past the tiny ones' lengths: its case takes prompts in chunks and checks naive
// decode at each chunk and a few steps, as naive decode of every prefix would cost T^2 decodes.
bool thin(const Config& c) { return c.max_seq > kFastMaxSeq; }
// The shape of a row whose scenario the long profile's rows already run at every size (the
// variant rows, the formats, prefix-shared, format-switch: rollback, chunked-prefill, rescoring
// and tiled-attention draw every exact variant and KV format to 8192, prefix-hit-extend maps
// prefixes there): the fast profile's reach, half the time a thin model to position 257, in both
// profiles, which keeps --profile long within its minutes.
Config draw_row_shape(int min_seq) { return draw_reaching_config(false, min_seq); }
// A case's tokens and how many of them are the prompt (the rest decode one at a time): any
// lengths; a thin model's biased to the thresholds, its prompt all but at most 3 of them.
struct Prompted {
    std::vector<int> tokens;
    int prompt = 0;
};
// A sequence length for a thin model: max_seq a quarter of the time, else biased to the
// thresholds (draw_size); a tiny model's, any of 1..max_seq.
int draw_length(const Config& c) {
    if (!thin(c)) return draw(1, c.max_seq);
    return draw(0, 3) == 3 ? c.max_seq : draw_size(1, c.max_seq);
}
Prompted draw_prompted(const Config& c) {
    Prompted p;
    p.tokens = draw_tokens(c, draw_length(c));
    p.prompt = thin(c) ? std::max(1, int(p.tokens.size()) - draw(0, 3)) : draw(1, int(p.tokens.size()));
    return p;
}
// The case holds a sequence of T positions (its longest so far).
void note_reached(const Devices& d, int T) {
    if (d.reach) d.reach->size(T);
}
// The case drove a pool to fill_percent of its blocks held at once, by `sequences` at once.
void note_pool(const Devices& d, int fill_percent, int sequences) {
    if (d.reach) d.reach->pool(fill_percent, sequences);
}
// The case's pool, while it lives: its peak fill and sequence count go to the row's record as
// it dies, so that a case that fails part-way still names how full it drove the pool.
class PoolWatch {
public:
    PoolWatch(const Devices& d, const BlockPool* pool) : reach_(d.reach), pool_(pool) {}
    PoolWatch(const PoolWatch&) = delete;
    PoolWatch& operator=(const PoolWatch&) = delete;
    ~PoolWatch() {
        if (!reach_ || !pool_) return;
        const BlockPool::Peak p = pool_->peak();
        reach_->pool(int(100 * std::int64_t(p.blocks) / std::max(1, pool_->n_blocks())), p.sequences);
    }

private:
    Reach* reach_;
    const BlockPool* pool_;
};

// The oracle for one generated model on the devices of a run: naive decode on the reference
// device. With two devices, naive decode on the tested one must equal the reference's too, so
// `verify --device both` checks the GPU's naive and cached decode against the CPU's. With a
// planted bug (planted.h), naive decode and the decoders under test run through its decorators.
class Oracle {
public:
    Oracle(const Model& m, const Devices& d, Mutant mutant)
        : attention_(d.attention.value_or(AttentionSpec{})),
          mutant_(mutant),
          reference_(d.make(d.reference, m)),
          tested_(d.tested == d.reference ? nullptr : d.make(d.tested, m)),
          planted_naive_(planted_naive_backend(mutant, *reference_)),
          planted_cached_(planted_cached_backend(mutant, backend(), m)),
          naive_(planted_naive_ ? *planted_naive_ : *reference_) {
        if (tested_) {
            planted_tested_naive_ = planted_naive_backend(mutant, *tested_);
            tested_naive_ = std::make_unique<NaiveDecoder>(planted_tested_naive_ ? *planted_tested_naive_ : *tested_);
        }
        set_attention(attention_);
    }
    Backend& backend() { return tested_ ? *tested_ : *reference_; }  // where the decoders under test run
    // Naive decode stores K and V in this format with these scales (the format-aware naive decode).
    void set_kv_format(KVFormat format, const std::vector<float>& scales) {
        for (NaiveDecoder* n : {&naive_, tested_naive_.get()})
            if (n) n->kv_format = format, n->kv_scales = scales;
    }
    // Naive decode rounds K and V as a quantized cache of this spec does (NaiveDecoder::quant).
    void set_quant(const QuantSpec& spec) {
        for (NaiveDecoder* n : {&naive_, tested_naive_.get()})
            if (n) n->quant = spec;
    }
    // Which attention naive decode and the cached decoders made after this call run.
    void set_attention(const AttentionSpec& a) {
        attention_ = a;
        for (NaiveDecoder* n : {&naive_, tested_naive_.get()})
            if (n) n->exec.attention = a;
    }
    const AttentionSpec& attention() const { return attention_; }
    Memory& memory() { return backend().memory(); }  // where their caches live
    Mutant mutant() const { return mutant_; }

    // A cached decoder under test on `cache`, with the planted bug's backend and plan transform.
    std::unique_ptr<CachedDecoder> cached(Cache& cache) {
        auto d = std::make_unique<CachedDecoder>(planted_cached_ ? *planted_cached_ : backend(), cache);
        d->transform = planted_transform(mutant_);
        d->exec.attention = attention_;
        return d;
    }

    // Naive decode's logits after `sequence` on the reference device (and, with two devices,
    // the tested device's naive decode checked against them).
    const std::vector<float>& naive(std::span<const int> sequence, const std::string& what) {
        const std::vector<float>& ref = naive_.forward(sequence);
        if (tested_naive_) {
            if (auto diff = first_difference(ref, tested_naive_->forward(sequence)))
                fail(fmt::format("{}: naive decode on {} differs from {} at T = {}, {}", what, tested_->name(),
                                 reference_->name(), sequence.size(), *diff));
        }
        return ref;
    }

    // Logits of a run under test against naive decode of the same sequence.
    void expect_naive(std::span<const int> sequence, std::span<const float> logits, const std::string& what) {
        const std::vector<float>& ref = naive(sequence, what);
        if (auto diff = first_difference(ref, logits))
            fail(fmt::format("{}: logits differ from naive at T = {}, {}", what, sequence.size(), *diff));
    }

private:
    AttentionSpec attention_;
    Mutant mutant_;
    std::unique_ptr<Backend> reference_, tested_;
    std::unique_ptr<Backend> planted_naive_, planted_cached_, planted_tested_naive_;  // decorators, or null
    NaiveDecoder naive_;
    std::unique_ptr<NaiveDecoder> tested_naive_;
};

void expect_memory_consistent(const Cache& cache, const std::string& what) {
    const MemoryStats m = cache.memory();
    if (m.reserved_bytes != m.allocated_bytes)
        fail(fmt::format("{}: reports {} bytes, allocated {}", what, m.reserved_bytes, m.allocated_bytes));
    if (m.used_bytes != kv_bytes(cache.config(), cache.length(), cache.kv_format()))
        fail(fmt::format("{}: used bytes {} at length {} in {}", what, m.used_bytes, cache.length(),
                         kv_format_name(cache.kv_format())));
}

// A value of parameter p drawn from the registry's property values (given those drawn before).
int draw_value(const VariantParam& p, const Config& c, const CacheSpec& spec) {
    const std::vector<int> values = p.property(c, spec);
    return values[draw(std::size_t{0}, values.size() - 1)];
}

// Whether a preset's settings ("bits=8,key_axis=1") fix parameter `name`.
bool preset_sets(const VariantPreset* preset, std::string_view name) {
    if (!preset) return false;
    for (std::string_view rest = preset->settings; !rest.empty();) {
        const std::size_t comma = std::min(rest.find(','), rest.size());
        if (rest.substr(0, rest.substr(0, comma).find('=')) == name) return true;
        rest.remove_prefix(std::min(comma + 1, rest.size()));
    }
    return false;
}

// A setting's spec with every parameter its preset leaves free drawn from the registry.
CacheSpec draw_spec(const VariantSetting& s, const Config& c) {
    CacheSpec spec = setting_spec(s, c);
    for (const VariantParam& p : variant_info(s.variant).params)
        if (!preset_sets(s.preset, p.name)) p.set(spec, draw_value(p, c, spec));
    return spec;
}

// What a setting's property draws, from the registry: "block_size 1..max_seq, n_blocks ...".
std::string drawn_text(const VariantSetting& s) {
    std::string text;
    for (const VariantParam& p : variant_info(s.variant).params)
        if (!preset_sets(s.preset, p.name))
            text += fmt::format("{}{} {}", text.empty() ? "" : ", ", p.name, p.property_text);
    return text;
}

// A cache of a variant, its parameters drawn, with the planted bug in its pool or wrapped around it.
struct CacheUnderTest {
    CacheSpec spec;
    std::unique_ptr<BlockPool> pool;  // paged: declared first, so that it outlives the cache
    std::unique_ptr<Cache> cache;
    std::unique_ptr<Cache> wrapper;  // a planted cache wrapper around `cache`, or null
    Cache& operator*() { return wrapper ? *wrapper : *cache; }
    Cache* operator->() { return &**this; }
};
// format, scales: what a variant that takes a KV format stores in (CacheSpec::kv_format).
CacheUnderTest cache_under_test(const VariantSetting& s, const Config& c, Mutant mutant, Memory& memory,
                                KVFormat format = KVFormat::fp32, const std::vector<float>& scales = {}) {
    CacheUnderTest u;
    u.spec = draw_spec(s, c);
    u.spec.kv_format = format;
    u.spec.kv_scales = scales;
    const PoolMaker planted = [mutant](const Config& pc, int bs, int n, bool prefix_caching, Memory& m) {
        return planted_pool(mutant, pc, bs, n, prefix_caching, m);
    };
    CacheAndPool cp = make_cache(c, u.spec, memory, planted);
    u.pool = std::move(cp.pool);
    u.cache = std::move(cp.cache);
    u.wrapper = planted_cache(mutant, *u.cache);
    return u;
}
CacheUnderTest cache_under_test(Variant v, const Config& c, Mutant mutant, Memory& memory,
                                KVFormat format = KVFormat::fp32) {
    return cache_under_test(variant_settings(v).front(), c, mutant, memory, format);
}

// The scenarios' KV format: the one --kv-format names, else any, fp32 included (their naive
// decode stores the same way).
KVFormat draw_kv_format(const Devices& d) {
    if (d.format) return *d.format;
    return kKVFormats[std::size_t(draw(0, int(std::size(kKVFormats)) - 1))];
}
// A variant row's: the one --kv-format names, where the variant takes a format; else fp32.
KVFormat row_kv_format(const Devices& d, Variant v) {
    return d.format && variant_info(v).kv_formats ? *d.format : KVFormat::fp32;
}

// ----------------------------------------------------------------------------------------------
// Any variant, from the registry

// Prefill a prompt, decode the rest one token at a time; naive decode agrees at every step where
// the variant is exact (all of them for an exact one; with everywhere, beyond its regime too,
// which an approximate variant must fail).
void decode_property(const VariantSetting& s, const Devices& devices, Mutant mutant, bool everywhere = false) {
    const VariantInfo& info = variant_info(s.variant);
    // An exact variant meets thin models too; a thin case prefills all but at most 3 tokens.
    const Config c = info.exact ? draw_row_shape(1) : draw_config();
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const Prompted drawn = draw_prompted(c);  // no structured binding: clang 14 cannot capture one
    const std::vector<int>& tokens = drawn.tokens;
    const int prompt = drawn.prompt;
    const KVFormat format = row_kv_format(devices, s.variant);
    Oracle oracle(m, devices, mutant);
    oracle.set_kv_format(format, {});
    CacheUnderTest u = cache_under_test(s, c, mutant, oracle.memory(), format);
    const PoolWatch watch(devices, u.pool.get());
    note_reached(devices, int(tokens.size()));
    const auto cached = oracle.cached(*u);
    const std::int64_t limit = info.exact ? c.max_seq : info.exact_up_to(u.spec);
    const std::string what = fmt::format("{}{}, {}, prompt {} of {}", describe(u.spec),
                                         format == KVFormat::fp32 ? "" : fmt::format(" in {}", kv_format_name(format)),
                                         c.describe(), prompt, tokens.size());
    auto check = [&](int T, const std::vector<float>& logits) {
        if (T > limit && !everywhere) return;
        const std::vector<float>& ref = oracle.naive(std::span(tokens).first(T), what);
        if (auto diff = first_difference(ref, logits); diff && info.exact)
            fail(fmt::format("{}: logits differ from naive at T = {}, {}", what, T, *diff));
        else if (diff)
            fail(fmt::format("{}: first differs at T = {} = {} + {}, {}", what, T, info.exact_limit, T - limit, *diff));
    };
    const std::span<const int> all(tokens);
    check(prompt, cached->prefill(all.first(prompt)));
    for (int T = prompt + 1; T <= int(tokens.size()); T++) check(T, cached->decode(tokens[T - 1]));
    if (info.exact) expect_memory_consistent(*u, what);
}

// ----------------------------------------------------------------------------------------------
// Properties of their own: prefix-shared's later request, and the scenarios

// Request A runs; request B shares a prefix with it (none, part, all of A, or a block multiple)
// and maps A's cached blocks; a third request from another model never hits. A thin model: A
// extends in at most 4 requests, B prefills all but at most 3 tokens.
void prefix_property(const Devices& devices, Mutant mutant) {
    const Config c = draw_row_shape(2);
    const bool long_run = thin(c);
    const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
    const Model ma = random_model(c, seed), mb = random_model(c, seed + 1);
    const std::uint64_t ida = ma.w.fingerprint(), idb = mb.w.fingerprint();
    const VariantParam& block_size = *find_param(variant_info(Variant::prefix_shared), "block_size");
    const int bs = draw_value(block_size, c, {}), per_seq = (c.max_seq + bs - 1) / bs;
    Oracle oracle_a(ma, devices, mutant), oracle_b(mb, devices, mutant);
    const KVFormat format = row_kv_format(devices, Variant::prefix_shared);
    oracle_a.set_kv_format(format, {}), oracle_b.set_kv_format(format, {});
    // Room for all three: nothing is evicted here.
    const std::unique_ptr<BlockPool> pool = planted_pool(mutant, c, bs, 3 * per_seq, true, oracle_a.memory());
    pool->set_kv_format(format);
    const PoolWatch watch(devices, pool.get());
    const auto length = [&](int lo, int hi) { return long_run ? draw_size(lo, hi) : draw(lo, hi); };
    const std::vector<int> a = draw_tokens(c, length(1, c.max_seq));
    const int la = int(a.size());
    const int share_kind = draw(0, 3);  // none, part, all of A, a multiple of block_size
    const int k = share_kind == 0 ? 0 : share_kind == 1 ? length(0, la) : share_kind == 2 ? la : bs * draw(0, la / bs);
    std::vector<int> b(a.begin(), a.begin() + k);
    const std::vector<int> suffix = draw_tokens(c, length(k == 0 ? 1 : 0, c.max_seq - k));
    b.insert(b.end(), suffix.begin(), suffix.end());
    const int prompt_b = long_run ? std::max(1, int(b.size()) - draw(0, 3)) : draw(1, int(b.size()));
    note_reached(devices, std::max(la, int(b.size())));
    const bool free_a = *rc::gen::arbitrary<bool>();
    const std::string what = fmt::format("prefix-shared(block_size={}), {}, A {} tokens, B shares {} of {} (prompt {})",
                                         bs, c.describe(), la, k, b.size(), prompt_b);

    auto seq_a = std::make_unique<PagedCache>(*pool, ida, 0);
    {
        const auto da = oracle_a.cached(*seq_a);
        const int step = long_run ? std::max(1, la / draw(1, 4)) : 1;  // the prefix each request extends to
        for (int T = std::min(step, la);; T = std::min(T + step, la)) {
            oracle_a.expect_naive(std::span(a).first(T), da->extend(std::span(a).first(T)), "A: " + what);
            if (T == la) break;
        }
    }
    if (free_a) seq_a.reset();  // its full blocks stay cached, unreferenced

    PagedCache seq_b(*pool, ida, 1);
    const auto d = oracle_a.cached(seq_b);
    const std::span<const int> bspan(b);
    oracle_a.expect_naive(bspan.first(prompt_b), d->extend(bspan.first(prompt_b)), "B: " + what);
    int common = 0;
    while (common < la && common < prompt_b && a[common] == b[common]) common++;
    const int expected = bs * std::min({common / bs, la / bs, (prompt_b - 1) / bs});
    if (d->prefix_hit() != expected)
        fail(fmt::format("{}: B's prefix hit {} positions, expected {}", what, d->prefix_hit(), expected));
    for (int T = prompt_b + 1; T <= int(b.size()); T++)
        oracle_a.expect_naive(bspan.first(T), d->decode(b[T - 1]), "B: " + what);

    // Another model's request with A's tokens: the same token ids, other rows.
    PagedCache seq_c(*pool, idb, 2);
    const auto dc = oracle_b.cached(seq_c);
    oracle_b.expect_naive(std::span(a), dc->extend(std::span(a)), "another model, A's tokens: " + what);
    if (dc->prefix_hit() != 0)
        fail(fmt::format("{}: another model's request hit {} cached positions", what, dc->prefix_hit()));
}

// A sequence forks into children at any position; all of them decode, interleaved, each its own
// tokens; every one equals naive decode of its own sequence.
// A thin model (to 8192 positions in the long profile): the fork point and block size biased to the
// thresholds, each child's continuation a chunk (one request) and then a few single steps. The
// long profile, half the time: 8-64 sequences (parallel sampling), each of at most 578 positions.
void fork_property(const Devices& devices, Mutant mutant) {
    const Config c = draw_shape(devices, 2, true);
    const bool long_run = thin(c);
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const int bs = long_run ? draw_size(1, std::min(c.max_seq, 512)) : draw(1, c.max_seq);
    const bool many = devices.long_profile && *rc::gen::arbitrary<bool>();
    const int n_children = many ? draw_size(7, 63) : draw(1, 3);
    // The most positions a sequence holds: with many, a fork point below 512 and a chunk of at
    // most 64, then 2 steps.
    const int longest_seq = many ? std::min(c.max_seq, 512 + 64 + 2) : c.max_seq;
    const int per_seq = (longest_seq + bs - 1) / bs;
    const KVFormat format = draw_kv_format(devices);
    Oracle oracle(m, devices, mutant);
    oracle.set_kv_format(format, {});
    const std::unique_ptr<BlockPool> pool =
        planted_pool(mutant, c, bs, (n_children + 1) * per_seq, false, oracle.memory());
    pool->set_kv_format(format);
    const PoolWatch watch(devices, pool.get());
    const int f = long_run ? draw_size(1, std::min(c.max_seq, many ? 512 : c.max_seq) - 1)
                           : draw(1, c.max_seq - 1);  // fork after f positions
    const std::string what = fmt::format("paged(block_size={}) in {}, {}, fork at {} into {} children", bs,
                                         kv_format_name(format), c.describe(), f, n_children);
    std::vector<std::unique_ptr<PagedCache>> seqs;
    seqs.push_back(std::make_unique<PagedCache>(*pool, 0, 0));
    note_reached(devices, f);
    std::vector<std::vector<int>> tokens(1, draw_tokens(c, f));
    oracle.expect_naive(tokens[0], oracle.cached(*seqs[0])->prefill(tokens[0]), what);
    for (int i = 1; i <= n_children; i++) {
        seqs.push_back(seqs[0]->fork(i));
        tokens.push_back(tokens[0]);
    }
    // Each sequence's continuation (a thin model: a chunk in one request first), then a
    // random interleaving of single decode steps.
    std::vector<std::vector<int>> rest;
    int total = 0, longest = f;
    for (int i = 0; i <= n_children; i++) {
        if (long_run) {
            const std::vector<int> chunk =
                draw_tokens(c, draw_size(1, std::max(1, std::min(many ? 64 : c.max_seq, c.max_seq - f - 1))));
            tokens[std::size_t(i)].insert(tokens[std::size_t(i)].end(), chunk.begin(), chunk.end());
            oracle.expect_naive(tokens[std::size_t(i)],
                                oracle.cached(*seqs[std::size_t(i)])->extend(tokens[std::size_t(i)]),
                                fmt::format("sequence {} +{} in one request: {}", i, chunk.size(), what));
        }
        const int room = c.max_seq - int(tokens[std::size_t(i)].size());
        rest.push_back(draw_tokens(c, long_run ? std::min(room, draw(0, 2)) : draw(1, room)));
        total += int(rest.back().size());
        longest = std::max(longest, int(tokens[std::size_t(i)].size() + rest.back().size()));
    }
    note_reached(devices, longest);
    std::vector<std::size_t> done(n_children + 1, 0);
    for (int step = 0; step < total; step++) {
        int s = draw(0, n_children);
        while (done[s] == rest[s].size()) s = (s + 1) % (n_children + 1);
        tokens[s].push_back(rest[s][done[s]++]);
        oracle.expect_naive(tokens[s], oracle.cached(*seqs[s])->decode(tokens[s].back()),
                            fmt::format("sequence {}: {}", s, what));
    }
    if (pool->shared_writes() != 0) fail(fmt::format("{}: {} writes into shared blocks", what, pool->shared_writes()));
}

// Decode, roll back any number of positions, decode other tokens, repeat; every step equals
// naive decode of the tokens that were kept.
// Any exact variant, its parameters drawn, storing K and V in a drawn KV format (naive decode the
// same way), with a cached decoder under test on it: the scenarios' common start.
struct AnyExactVariant {
    // long_ok: a thin long model in the long profile (the scenario checks few positions).
    AnyExactVariant(const Devices& devices, Mutant mutant, int min_seq = 1, bool long_ok = false)
        : c(draw_shape(devices, min_seq, long_ok)),
          m(random_model(c, *rc::gen::arbitrary<std::uint64_t>())),
          format(draw_kv_format(devices)),
          oracle(m, devices, mutant) {
        const std::vector<Variant> exact = exact_variants();
        oracle.set_kv_format(format, {});
        u = cache_under_test(exact[draw(std::size_t{0}, exact.size() - 1)], c, mutant, oracle.memory(), format);
        watch = std::make_unique<PoolWatch>(devices, u.pool.get());
        cached = oracle.cached(*u);
        if (oracle.attention().tiled()) {  // the split-KV path on threads too (bits never change)
            cached->exec.n_threads = draw(1, 2);
            cached->exec.parallel_min_work = 0;
        }
    }
    // "paged(block_size=3,n_blocks=4) in bf16, <config>" (and the tile, when tiled).
    std::string describe() const {
        const AttentionSpec& a = oracle.attention();
        return fmt::format(
            "{} in {}, {}{}", kvlab::describe(u.spec), kv_format_name(format), c.describe(),
            a.tiled() ? fmt::format(", {} attention on {} thread(s)", attention_name(a), cached->exec.n_threads) : "");
    }
    const Config c;
    const Model m;
    const KVFormat format;
    Oracle oracle;
    CacheUnderTest u;
    std::unique_ptr<PoolWatch> watch;  // u's pool, if it has one
    std::unique_ptr<CachedDecoder> cached;
};

// A thin model (to 8192 positions in the long profile): each round appends a chunk (one request of
// draw_size positions, checked at its end) and up to two decode steps, and rollbacks land on the
// size thresholds (96-98, 255-258, 4095-4097, ...) half the time.
void rollback_property(const Devices& devices, Mutant mutant) {
    AnyExactVariant run(devices, mutant, 1, true);
    const Config& c = run.c;
    Oracle& oracle = run.oracle;
    CacheUnderTest& u = run.u;
    CachedDecoder* cached = run.cached.get();
    const bool long_run = thin(c);
    std::vector<int> kept;
    const int rounds = draw(1, 3);
    std::string what = run.describe();
    for (int r = 0; r <= rounds; r++) {
        if (r > 0) {
            const int n = long_run ? draw_size(0, int(kept.size())) : draw(0, int(kept.size()));
            what += fmt::format(", roll back to {}", n);
            cached->cache().truncate(n);
            kept.resize(n);
        }
        const int room = c.max_seq - int(kept.size());
        if (room == 0) continue;
        if (long_run) {  // one request of a chunk, then a few single steps
            const std::vector<int> chunk = draw_tokens(c, draw(0, 3) == 3 ? room : draw_size(1, room));
            what += fmt::format(", +{} in one request", chunk.size());
            kept.insert(kept.end(), chunk.begin(), chunk.end());
            note_reached(devices, int(kept.size()));
            oracle.expect_naive(kept, cached->extend(kept), what);
        }
        const int steps = long_run ? std::min(c.max_seq - int(kept.size()), draw(0, 2)) : draw(1, room);
        const std::vector<int> more = draw_tokens(c, steps);
        if (!more.empty()) what += fmt::format(", +{}", more.size());
        note_reached(devices, int(kept.size() + more.size()));
        for (int t : more) {
            kept.push_back(t);
            oracle.expect_naive(kept, cached->decode(t), what);
        }
    }
    expect_memory_consistent(*u, what);
}

// Chunked prefill: any exact variant (any KV format) takes a prompt in chunks of any sizes (1 up
// to the rest, so chunks cross block boundaries and a window's ring), then decodes; every
// chunk's last logits and every step's equal naive decode of the prefix so far.
void chunked_prefill_property(const Devices& devices, Mutant mutant) {
    AnyExactVariant run(devices, mutant, 2, true);
    const Config& c = run.c;
    Oracle& oracle = run.oracle;
    CachedDecoder* cached = run.cached.get();
    const bool long_run = thin(c);  // then at most 4 chunks and 3 decode steps
    const int prompt = long_run ? (draw(0, 3) == 3 ? c.max_seq : draw_size(2, c.max_seq)) : draw(2, c.max_seq);
    const std::vector<int> tokens =
        draw_tokens(c, long_run ? std::min(c.max_seq, prompt + draw(0, 3)) : draw(prompt, c.max_seq));
    note_reached(devices, int(tokens.size()));
    std::string what = fmt::format("{}, prompt {} of {} in chunks", run.describe(), prompt, tokens.size());
    const std::span<const int> all(tokens);
    for (int at = 0, chunks = 0; at < prompt; chunks++) {
        const int n = long_run && chunks == 3 ? prompt - at
                      : long_run              ? draw_size(1, prompt - at)
                                              : draw(1, prompt - at);
        what += fmt::format(" {}", n);
        at += n;
        oracle.expect_naive(all.first(at), cached->prefill(all.subspan(std::size_t(at - n), std::size_t(n))), what);
    }
    for (int T = prompt + 1; T <= int(tokens.size()); T++)
        oracle.expect_naive(all.first(T), cached->decode(tokens[T - 1]), what);
    expect_memory_consistent(*run.u, what);
}

// Prefix-hit extend, as engines serve a repeated prompt: request A fills a prefix-caching pool;
// request B, sharing any prefix of A, maps A's full blocks (the hit) and prefills only the rest,
// then decodes. Every logit equals a cold prefill of B's prompt on a cache with no prefix cache,
// and naive decode; the hit is as long as the shared full blocks allow.
void prefix_extend_property(const Devices& devices, Mutant mutant) {
    const Config c = draw_shape(devices, 2, true);
    const bool long_run = thin(c);  // then at most 3 decode steps
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    Oracle oracle(m, devices, mutant);
    const KVFormat format = draw_kv_format(devices);
    oracle.set_kv_format(format, {});
    const VariantParam& block_size = *find_param(variant_info(Variant::prefix_shared), "block_size");
    // A thin model: block sizes biased to the thresholds too (16, 32, 256, ...).
    const int bs = long_run ? draw_size(1, std::min(c.max_seq, 512)) : draw_value(block_size, c, {});
    const int per_seq = (c.max_seq + bs - 1) / bs;
    const std::unique_ptr<BlockPool> pool = planted_pool(mutant, c, bs, 2 * per_seq, true, oracle.memory());
    pool->set_kv_format(format);
    const PoolWatch watch(devices, pool.get());
    const std::vector<int> a = draw_tokens(c, draw_length(c));
    const int k = long_run ? draw_size(0, int(a.size())) : draw(0, int(a.size()));  // B's tokens shared with A
    std::vector<int> b(a.begin(), a.begin() + k);
    const std::vector<int> suffix = draw_tokens(c, draw(k == 0 ? 1 : 0, c.max_seq - k));
    b.insert(b.end(), suffix.begin(), suffix.end());
    const int prompt = long_run ? std::max(1, int(b.size()) - draw(0, 3)) : draw(1, int(b.size()));
    note_reached(devices, int(std::max(a.size(), b.size())));
    const std::span<const int> bspan(b);
    const std::string what = fmt::format("block_size {} in {}, {}, A {} tokens, B shares {} of {} (prompt {}){}", bs,
                                         kv_format_name(format), c.describe(), a.size(), k, b.size(), prompt,
                                         oracle.attention().tiled() ? ", " + attention_name(oracle.attention()) : "");
    PagedCache seq_a(*pool, m.w.fingerprint(), 0);
    oracle.cached(seq_a)->prefill(a);
    PagedCache seq_b(*pool, m.w.fingerprint(), 1);
    ContiguousCache cold_cache(c, ContiguousCache::Layout::head_major, oracle.memory());
    cold_cache.set_kv_format(format);
    const auto hit = oracle.cached(seq_b), cold = oracle.cached(cold_cache);
    const std::vector<float> extended = hit->extend(bspan.first(prompt));
    int common = 0;  // at least k: the suffix may start with A's next tokens too
    while (common < int(a.size()) && common < prompt && a[std::size_t(common)] == b[std::size_t(common)]) common++;
    const int expected = bs * std::min({common / bs, int(a.size()) / bs, (prompt - 1) / bs});
    if (hit->prefix_hit() != expected)
        fail(fmt::format("{}: B's prefix hit {} positions, expected {}", what, hit->prefix_hit(), expected));
    const std::string at = fmt::format("{}: hit {}, extend", what, hit->prefix_hit());
    if (auto diff = first_difference(cold->prefill(bspan.first(prompt)), extended))
        fail(fmt::format("{}: logits differ from a cold prefill at T = {}, {}", at, prompt, *diff));
    oracle.expect_naive(bspan.first(prompt), extended, at);
    for (int T = prompt + 1; T <= int(b.size()); T++) {
        const std::vector<float> l = hit->decode(b[std::size_t(T - 1)]);
        if (auto diff = first_difference(cold->decode(b[std::size_t(T - 1)]), l))
            fail(fmt::format("{}: decode differs from the cold cache's at T = {}, {}", at, T, *diff));
        oracle.expect_naive(bspan.first(T), l, at);
    }
}

// Rescoring: greedy decode of any exact variant (any KV format and the run's attention) records
// each chosen token's log-probability (token_logprob of its logits); one prefill of the whole text
// on a fresh cache of the same format (prefill_rows) must give every one back bit for bit.
void rescoring_property(const Devices& devices, Mutant mutant) {
    AnyExactVariant run(devices, mutant, 1, true);
    const Config& c = run.c;
    std::vector<int> tokens = draw_tokens(c, draw_length(c));
    const int P = int(tokens.size());
    const int steps = draw(1, c.max_seq - P + 1);  // the last token is not fed
    note_reached(devices, P + steps - 1);
    const std::size_t V = std::size_t(c.vocab_size);
    std::vector<float> logits = run.cached->prefill(tokens), decoded;  // decoded: [steps]
    for (int s = 0; s < steps; s++) {
        const int next = argmax(logits);
        decoded.push_back(token_logprob(logits.data(), c.vocab_size, next));
        tokens.push_back(next);
        if (s + 1 < steps) logits = run.cached->decode(next);
    }
    ContiguousCache fresh(c, ContiguousCache::Layout::head_major, run.oracle.memory());
    fresh.set_kv_format(run.format);
    const auto scorer = run.oracle.cached(fresh);
    const std::vector<float>& rows = scorer->prefill_rows(std::span(tokens).first(tokens.size() - 1));
    const LogprobFn logprob = planted_logprob(run.oracle.mutant());
    for (int g = 0; g < steps; g++) {
        const float got = logprob(rows.data() + std::size_t(P - 1 + g) * V, c.vocab_size, tokens[std::size_t(P + g)]);
        if (float_bits(got) != float_bits(decoded[std::size_t(g)]))
            fail(
                fmt::format("{}, prompt {} + {} greedy steps: token {} at position {}: log-probability {} ({:08x}) "
                            "when decoded, {} ({:08x}) rescored",
                            run.describe(), P, steps, g, P + g, decoded[std::size_t(g)],
                            float_bits(decoded[std::size_t(g)]), got, float_bits(got)));
    }
}

// A key tile: small ones most often (so that tiny sequences span several tiles), any up to 24.
int draw_tile() { return *rc::gen::arbitrary<bool>() ? draw(1, 8) : draw(1, 24); }

// Tiled attention: naive decode and the cached decoder both run it with one tile (the run's, or
// drawn), over a chunked prefill and decode as above; one-row steps take the split-KV path, and
// the cached decoder runs on 1 or 2 threads.
void tiled_attention_property(const Devices& devices, Mutant mutant) {
    Devices d = devices;
    if (!d.attention || !d.attention->tiled())  // the long profile: engines' tiles too (64, 128, 256)
        d.attention = AttentionSpec{AttentionSpec::Kind::tiled,
                                    devices.long_profile ? draw_size(1, AttentionSpec::kMaxTile) : draw_tile()};
    chunked_prefill_property(d, mutant);
}

// Sequences of different lengths, some joining later, step together over one pool: a
// sequence's first step is its whole prompt, later ones one token. Each sequence's logits equal
// its solo naive run at every step.
void batch_property(const Devices& devices, Mutant mutant) {
    const Config c = draw_config();
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const int bs = draw(1, c.max_seq), per_seq = (c.max_seq + bs - 1) / bs;
    // The long profile: batch sizes up to 300, biased to the thresholds (short sequences keep it fast).
    const int n_seqs = devices.long_profile ? draw_size(2, 300) : draw(2, 4);
    const KVFormat format = draw_kv_format(devices);
    Oracle oracle(m, devices, mutant);
    oracle.set_kv_format(format, {});
    const std::unique_ptr<BlockPool> pool = planted_pool(mutant, c, bs, n_seqs * per_seq, false, oracle.memory());
    pool->set_kv_format(format);
    const PoolWatch watch(devices, pool.get());
    std::vector<std::unique_ptr<PagedCache>> seqs;
    std::vector<std::vector<int>> tokens;
    std::vector<int> prompt, joins, next;
    for (int s = 0; s < n_seqs; s++) {
        seqs.push_back(std::make_unique<PagedCache>(*pool, 0, s));
        tokens.push_back(draw_tokens(c, draw(1, c.max_seq)));
        prompt.push_back(draw(1, int(tokens.back().size())));
        joins.push_back(draw(0, 2));
        next.push_back(0);
        note_reached(devices, int(tokens.back().size()));
    }
    const std::string what = fmt::format("batch of {} over paged(block_size={}) in {}, {}", n_seqs, bs,
                                         kv_format_name(format), c.describe());
    const auto dec = oracle.cached(*seqs[0]);
    for (int step = 0;; step++) {
        std::vector<Cache*> caches;
        std::vector<std::vector<int>> rows;
        std::vector<int> who;
        for (int s = 0; s < n_seqs; s++) {
            if (joins[s] > step || next[s] == int(tokens[s].size())) continue;
            const int n = next[s] == 0 ? prompt[s] : 1;
            caches.push_back(seqs[s].get());
            rows.emplace_back(tokens[s].begin() + next[s], tokens[s].begin() + next[s] + n);
            who.push_back(s);
            next[s] += n;
        }
        if (caches.empty()) {
            if (step > 2) break;
            continue;
        }
        const std::vector<float>& logits = dec->step(caches, rows);
        for (std::size_t i = 0; i < who.size(); i++) {
            const int s = who[i];
            oracle.expect_naive(std::span(tokens[s]).first(next[s]),
                                std::span(logits).subspan(i * c.vocab_size, c.vocab_size),
                                fmt::format("sequence {} in a {}-sequence step: {}", s, who.size(), what));
        }
    }
}

// A drawn model and KV format, and the oracle whose naive decode stores K and V in it: the start
// of the serving scenarios.
// long_ok: a thin long model in the long profile.
struct DrawnModel {
    DrawnModel(const Devices& devices, Mutant mutant, bool long_ok = false)
        : c(draw_shape(devices, 2, long_ok)),
          m(random_model(c, *rc::gen::arbitrary<std::uint64_t>())),
          format(draw_kv_format(devices)),
          oracle(m, devices, mutant) {
        oracle.set_kv_format(format, {});
    }
    const Config c;
    const Model m;
    const KVFormat format;
    Oracle oracle;
};

// 1..n_requests requests arriving over a few steps, each prompt fresh or an earlier one's prefix
// followed by fresh tokens, prompt and output within `limit` positions (0: max_seq). The long
// profile: lengths biased to the size thresholds (draw_size), and at most 32 new tokens each (so
// decode crosses blocks).
std::vector<ServeRequest> draw_requests(const Config& c, int n_requests, bool long_run = false, int limit = 0) {
    const int max_len = limit > 0 ? std::min(limit, c.max_seq) : c.max_seq;
    const auto length = [&](int lo, int hi) { return long_run ? draw_size(lo, hi) : draw(lo, hi); };
    std::vector<ServeRequest> requests;
    for (int i = 0, arrival = 0; i < n_requests; i++) {
        ServeRequest r;
        if (i > 0 && *rc::gen::arbitrary<bool>()) {  // a prefix of an earlier prompt, then fresh tokens
            const std::vector<int>& p = requests[std::size_t(draw(0, i - 1))].prompt;
            r.prompt.assign(p.begin(), p.begin() + length(1, int(p.size())));
        }
        const int more = length(r.prompt.empty() ? 1 : 0, max_len - 1 - int(r.prompt.size()));
        const std::vector<int> fresh = draw_tokens(c, more);
        r.prompt.insert(r.prompt.end(), fresh.begin(), fresh.end());
        r.max_new_tokens =
            draw(1, long_run ? std::min(32, max_len - int(r.prompt.size())) : max_len - int(r.prompt.size()));
        r.arrival = arrival += draw(0, 2);
        requests.push_back(r);
    }
    return requests;
}

// The most positions a request holds: its prompt and its new tokens.
int longest_request(const std::vector<ServeRequest>& requests) {
    int longest = 0;
    for (const ServeRequest& r : requests) longest = std::max(longest, int(r.prompt.size()) + r.max_new_tokens);
    return longest;
}

std::string describe_requests(const std::vector<ServeRequest>& requests) {
    std::string what = fmt::format("serve {} requests (prompts", requests.size());
    for (const ServeRequest& r : requests)
        what += fmt::format(" {}+{}@{}", r.prompt.size(), r.max_new_tokens, r.arrival);
    return what + ")";
}

// Runs every request to its end; a step that refuses, or no end, fails the check.
void serve_all(Scheduler& s, const std::vector<ServeRequest>& requests, const Config& c, const std::string& what) {
    for (const ServeRequest& r : requests) s.add(r);
    try {
        while (s.step())
            if (s.steps() > 100 * c.max_seq * int(requests.size()))
                fail(fmt::format("{}: no end after {} steps", what, s.steps()));
    } catch (const Error& e) {
        fail(fmt::format("{}: step {} refused: {}", what, s.steps(), e.what()));
    }
}

// Each request's tokens and the logits each was chosen from equal greedy decode of it alone on a
// contiguous cache of the same format, bit for bit; its first and last logits equal naive decode.
void expect_served_alone(const Scheduler& s, const std::vector<ServeRequest>& requests, Oracle& oracle,
                         const std::string& what) {
    const std::size_t V = std::size_t(s.pool().config().vocab_size);
    CachedDecoder alone(oracle.backend());
    alone.cache().set_kv_format(s.config().kv_format);
    alone.exec.attention = s.config().attention;
    for (std::size_t i = 0; i < requests.size(); i++) {
        const ServeRequest& r = requests[i];
        const ServeResult& got = s.result(int(i));
        const DecodeRun want = greedy_decode(alone, r.prompt, r.max_new_tokens);
        for (int k = 0; k < r.max_new_tokens; k++) {
            const auto a = std::span(want.logits).subspan(std::size_t(k) * V, V);
            if (auto diff = first_difference(a, std::span(got.logits).subspan(std::size_t(k) * V, V)))
                fail(
                    fmt::format("{}: request {} ({} preemptions, prefix hit {}, {} from the store), token {}: logits "
                                "differ from the request alone, {}",
                                what, i, got.preemptions, got.prefix_hit, got.store_hit, k, *diff));
        }
        std::vector<int> seq = r.prompt;
        oracle.expect_naive(seq, std::span(got.logits).first(V), fmt::format("{}: request {}", what, i));
        seq.insert(seq.end(), got.output.begin(), got.output.end() - 1);
        oracle.expect_naive(seq, std::span(got.logits).last(V), fmt::format("{}: request {}", what, i));
    }
}

// Continuous batching (scheduler.h): 1-6 requests arriving over a few steps, prompts fresh or
// sharing another's prefix, any block size, a pool from one request's blocks to all of theirs
// (so requests wait and are preempted), a step budget of 1 to 2 max_seq rows, prefix caching on
// or off, preemption by recompute or by swap, any KV format. Every request's tokens and the
// logits each was chosen from equal decoding it alone on a contiguous cache, bit for bit, and
// its first and last logits equal naive decode.
// A thin model (to 8192 positions in the long profile): prompts and block sizes biased to the
// thresholds, 1-4 requests of at most 32 new tokens each, or half the time 8-64 requests of at
// most 512 positions (many sequences on one pool, as engines run), a pool sized from the longest.
void serve_property(const Devices& devices, Mutant mutant) {
    DrawnModel drawn(devices, mutant, true);
    auto& [c, m, format, oracle] = drawn;  // all but the oracle const
    const bool long_run = thin(c);
    SchedulerConfig sc;
    // A thin model: blocks of up to 64 positions, so that decoding 32 tokens crosses blocks
    // and a tight pool preempts.
    sc.block_size = long_run ? draw_size(1, std::min(c.max_seq, 64)) : draw(1, c.max_seq);
    const bool many = long_run && *rc::gen::arbitrary<bool>();
    const int n_requests = many ? draw_size(8, 64) : draw(1, long_run ? 4 : 6);
    // A thin model's requests come first: its pools are sized from the longest (max model
    // len), since few requests come near max_seq.
    std::vector<ServeRequest> requests;
    if (long_run)
        requests = draw_requests(c, n_requests, true, many ? 512 : 0), sc.max_model_len = longest_request(requests);
    const int len = sc.max_model_len > 0 ? sc.max_model_len : c.max_seq;
    const int per_request = (len + sc.block_size - 1) / sc.block_size;
    // Half the time a pool of about one request's blocks: requests wait, and are preempted.
    sc.n_blocks = *rc::gen::arbitrary<bool>() ? per_request + draw(0, 1) : draw(per_request, per_request * n_requests);
    sc.max_batch_tokens = draw(1, 2 * c.max_seq);
    sc.prefix_caching = *rc::gen::arbitrary<bool>();
    sc.preemption = *rc::gen::arbitrary<bool>() ? Preemption::swap : Preemption::recompute;
    sc.kv_format = format;
    sc.watermark = draw(0, 3) > 0 ? 0.0 : draw(0, 50) / 100.0;  // mostly none: more preemption
    sc.attention = oracle.attention();
    Scheduler s(oracle.backend(), m, sc);
    const PoolWatch watch(devices, &s.pool());
    s.swap_transform = planted_swap(mutant);
    if (!long_run) requests = draw_requests(c, n_requests);
    note_reached(devices, longest_request(requests));
    std::string what = describe_requests(requests);
    what += fmt::format(", block_size {}, {} blocks, {} batch tokens, prefix caching {}, preemption by {}, {}, {}",
                        sc.block_size, sc.n_blocks, sc.max_batch_tokens, sc.prefix_caching ? "on" : "off",
                        sc.preemption == Preemption::swap ? "swap" : "recompute", kv_format_name(format), c.describe());
    serve_all(s, requests, c, what);
    int preemptions = 0;
    for (int i = 0; i < n_requests; i++) preemptions += s.result(i).preemptions;
    expect_served_alone(s, requests, oracle, what + fmt::format(", {} steps, {} preemptions", s.steps(), preemptions));
}

// Prefix blocks below the pool (block_store.h): the requests served twice over one store, the
// second time by a fresh pool (as a later process would), a pool of about one request's blocks so
// that blocks are evicted into the store and fetched back; the store damages a drawn share of the
// records it hands out, one drawn way (none, flipped bits, truncated, another model's, format's or
// block's, another key's record, gone). Every request of both passes equals decoding it alone and
// naive decode: a damaged record is refused and recomputed, never used.
// A thin model (to 8192 positions in the long profile): prompts biased to the thresholds, blocks of
// 16 to 512 positions (thousands of one-position records would only cost time), 1-3 requests,
// or in the long profile, half the time, 8-64 of at most 512 positions.
void store_property(const Devices& devices, Mutant mutant) {
    DrawnModel drawn(devices, mutant, true);
    auto& [c, m, format, oracle] = drawn;  // all but the oracle const
    const bool long_run = thin(c);
    SchedulerConfig sc;
    sc.block_size = long_run
                        ? draw_size(std::min(16, std::max(1, c.max_seq / 2)), std::max(1, std::min(512, c.max_seq / 2)))
                        : draw(1, std::max(1, c.max_seq / 2));
    const int per_request = (c.max_seq + sc.block_size - 1) / sc.block_size;
    sc.n_blocks = per_request + draw(0, per_request);
    sc.max_batch_tokens = draw(1, 2 * c.max_seq);
    sc.preemption = *rc::gen::arbitrary<bool>() ? Preemption::swap : Preemption::recompute;
    sc.kv_format = format;
    sc.attention = oracle.attention();
    const StoreDamage damage = *rc::gen::element(
        StoreDamage::none, StoreDamage::flip, StoreDamage::flip_rows, StoreDamage::truncate, StoreDamage::other_model,
        StoreDamage::other_format, StoreDamage::other_block, StoreDamage::swapped, StoreDamage::gone);
    HostileStore store(damage, draw(1, 4) / 4.0, *rc::gen::arbitrary<std::uint64_t>());
    sc.store = &store;
    const bool many = devices.long_profile && *rc::gen::arbitrary<bool>();  // 8-64 requests of at most 512
    const std::vector<ServeRequest> requests =
        draw_requests(c, many ? draw_size(8, 64) : draw(1, long_run ? 3 : 6), long_run, many ? 512 : 0);
    note_reached(devices, longest_request(requests));
    const auto make_pool = [mutant](const Config& config, int bs, int n, bool caching, Memory& memory) {
        return planted_pool(mutant, config, bs, n, caching, memory);
    };
    for (int pass = 1; pass <= 2; pass++) {
        Scheduler s(oracle.backend(), m, sc, make_pool);
        const PoolWatch watch(devices, &s.pool());
        std::string what = fmt::format("{}, pass {} over a store that hands out records {}",
                                       describe_requests(requests), pass, store.describe());
        what += fmt::format(", block_size {}, {} blocks, {} batch tokens, {}, {}", sc.block_size, sc.n_blocks,
                            sc.max_batch_tokens, kv_format_name(format), c.describe());
        serve_all(s, requests, c, what);
        s.pool().flush_to_store();
        const BlockPool::StoreStats& st = s.pool().store_stats();
        expect_served_alone(s, requests, oracle,
                            what + fmt::format(": {} blocks fetched, {} refused", st.fetched, st.n_rejected()));
    }
}

// Beam search on forked caches (beam.h): width 1-4, a prompt, steps to max_seq, any block size and
// KV format. Every beam's logits after every step equal naive decode of its tokens.
// A thin model (to 8192 positions in the long profile): the prompt and block size biased to the
// thresholds, at most 4 steps.
void beam_property(const Devices& devices, Mutant mutant) {
    DrawnModel drawn(devices, mutant, true);
    auto& [c, m, format, oracle] = drawn;  // all but the oracle const
    const bool long_run = thin(c);
    BeamConfig bc;
    bc.width = draw(1, 4);
    bc.block_size = long_run ? draw_size(1, std::min(c.max_seq, 512)) : draw(1, c.max_seq);
    bc.kv_format = format;
    bc.attention = oracle.attention();
    const std::vector<int> prompt = draw_tokens(c, long_run ? draw_size(1, c.max_seq - 1) : draw(1, c.max_seq - 1));
    bc.steps = draw(1, long_run ? std::min(4, c.max_seq - int(prompt.size())) : c.max_seq - int(prompt.size()));
    note_reached(devices, int(prompt.size()) + bc.steps);
    BeamSearch search(oracle.backend(), m, bc);
    search.parent_transform = planted_beam_parent(mutant);
    const std::string what = fmt::format("beam width {} over {} steps, prompt {}, block_size {}, {}, {}", bc.width,
                                         bc.steps, prompt.size(), bc.block_size, kv_format_name(format), c.describe());
    const BeamRun run = search.run(prompt);
    std::size_t beams = 0;
    for (const auto& step : run.steps) beams = std::max(beams, step.size());
    note_pool(devices, int(100 * std::int64_t(run.peak_blocks) / std::max(1, run.n_blocks)), int(beams));
    for (std::size_t s = 0; s < run.steps.size(); s++)
        for (std::size_t b = 0; b < run.steps[s].size(); b++)
            oracle.expect_naive(run.steps[s][b].tokens, run.steps[s][b].logits,
                                fmt::format("{}: step {}, beam {}", what, s, b));
}

// A cache continued with an edited prompt refuses; rolled back to the edit, it continues exactly.
void stale_property(const Devices& devices, Mutant mutant) {
    const Config c = [&] {
        Config drawn = draw_shape(devices, 2, true);
        drawn.vocab_size = std::max(drawn.vocab_size, 2);  // an edit needs another token
        return drawn;
    }();
    const bool long_run = thin(c);
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const KVFormat format = devices.format.value_or(KVFormat::fp32);
    Oracle oracle(m, devices, mutant);
    oracle.set_kv_format(format, {});
    CacheUnderTest u = cache_under_test(*rc::gen::arbitrary<bool>() ? Variant::contiguous_head : Variant::paged, c,
                                        mutant, oracle.memory(), format);
    const PoolWatch watch(devices, u.pool.get());
    const auto cached = oracle.cached(*u);
    const std::vector<int> prompt = draw_tokens(c, long_run ? draw_size(1, c.max_seq - 1) : draw(1, c.max_seq - 1));
    const int i = long_run ? draw_size(0, int(prompt.size()) - 1) : draw(0, int(prompt.size()) - 1);
    std::vector<int> edited = prompt;
    edited[i] = (prompt[i] + draw(1, c.vocab_size - 1)) % c.vocab_size;
    const std::vector<int> more = draw_tokens(c, draw(1, c.max_seq - int(prompt.size())));
    edited.insert(edited.end(), more.begin(), more.end());
    note_reached(devices, int(edited.size()));
    const std::string what =
        fmt::format("{}, {}, prompt of {} edited at {}", u->name(), c.describe(), prompt.size(), i);
    cached->extend(prompt);
    bool refused = false;
    try {
        oracle.expect_naive(edited, cached->extend(edited), "stale cache reused: " + what);
    } catch (const Error& e) {
        refused = std::string_view(e.what()).starts_with("stale cache");
        if (!refused) fail(fmt::format("{}: unexpected error: {}", what, e.what()));
    }
    if (!refused) return;
    cached->cache().truncate(i);
    oracle.expect_naive(edited, cached->extend(edited), "after rolling back to the edit: " + what);
}

// Greedy speculative decoding (speculative.h): a draft (another random model, one of another
// shape and max_seq, or the target itself) proposes k tokens and the target verifies them in one
// step; the tokens, and the logits each was chosen from, equal plain greedy cached decode's bit for
// bit, which in turn equal naive decode's.
// A thin target (to 8192 positions in the long profile): its prompt biased to the thresholds, at most
// 16 steps speculated.
void speculate_property(const Devices& devices, Mutant mutant) {
    const Config c = draw_shape(devices, 1, true);
    const bool long_run = thin(c);
    const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
    const Model target = random_model(c, seed);
    const int draft_kind = draw(0, 2);  // another model of the target's shape, another shape, the target
    Config dc = draft_kind == 1 ? draw_shape(devices, 1, true) : c;
    dc.vocab_size = c.vocab_size;
    if (draft_kind == 1) dc.max_seq = draw(1, c.max_seq);
    std::optional<Model> draft_model;
    if (draft_kind != 2) draft_model.emplace(random_model(dc, seed + 1));
    const int k = draw(1, 4);
    const std::vector<int> prompt = draw_tokens(c, long_run ? draw_size(1, c.max_seq) : draw(1, c.max_seq));
    const int P = int(prompt.size());
    const int steps = draw(1, long_run ? std::min(c.max_seq - P + 1, 16) : c.max_seq - P + 1);  // the last token needs
                                                                                                // no position
    note_reached(devices, P + steps - 1);
    const KVFormat format = draw_kv_format(devices);  // every cache's, and naive decode's
    Oracle oracle(target, devices, mutant);
    oracle.set_kv_format(format, {});
    CacheUnderTest u = cache_under_test(*rc::gen::arbitrary<bool>() ? Variant::contiguous_head : Variant::paged, c,
                                        mutant, oracle.memory(), format);
    const PoolWatch watch(devices, u.pool.get());
    const auto cached = oracle.cached(*u);
    // The draft runs on the tested device too: on the target's backend when it is the target.
    const std::unique_ptr<Backend> draft_backend = draft_model ? devices.make(devices.tested, *draft_model) : nullptr;
    CachedDecoder draft(draft_backend ? *draft_backend : oracle.backend());
    draft.cache().set_kv_format(format);
    draft.exec.attention = oracle.attention();
    SpeculativeDecoder spec(*cached, draft, k);
    const std::string what = fmt::format("speculate k = {}, draft {}, target {} in {}, {}, prompt {} + {} steps", k,
                                         draft_kind == 0   ? "another random model"
                                         : draft_kind == 1 ? "(" + dc.describe() + ")"
                                                           : "= target",
                                         u->name(), kv_format_name(format), c.describe(), P, steps);

    // The reference: plain greedy cached decode with the target, itself checked against naive.
    CachedDecoder plain(oracle.backend());
    plain.cache().set_kv_format(format);
    plain.exec.attention = oracle.attention();
    const DecodeRun want = greedy_decode(plain, prompt, steps);
    std::vector<int> sequence = prompt;
    const std::size_t V = std::size_t(c.vocab_size);
    for (int i = 0; i < steps; i++) {
        oracle.expect_naive(sequence, std::span(want.logits).subspan(i * V, V), "plain greedy: " + what);
        sequence.push_back(want.tokens[std::size_t(i)]);
    }
    DecodeRun got;
    try {
        got = spec.generate(prompt, steps);
    } catch (const Error& e) {
        fail(fmt::format("{}: refused: {}", what, e.what()));
    }
    // Token i is chosen from the logits at position P - 1 + i and written at P + i.
    for (int i = 0; i < steps; i++) {
        const std::size_t at = std::size_t(i);
        const int step = got.step_of[at];
        if (auto diff =
                first_difference(std::span(want.logits).subspan(at * V, V), std::span(got.logits).subspan(at * V, V)))
            fail(fmt::format("{}: target step {}, logits at position {} (token {}) differ from plain greedy, {}", what,
                             step, P - 1 + i, i, *diff));
        if (got.tokens[at] != want.tokens[at])
            fail(fmt::format("{}: target step {}, token {} at position {} is {}, plain greedy's {}", what, step, i,
                             P + i, got.tokens[at], want.tokens[at]));
    }
    const SpeculativeStats& st = got.stats;
    if (st.accepted > st.proposed || st.accepted + st.target_steps != steps)
        fail(fmt::format("{}: {} accepted of {} proposed in {} target steps for {} tokens", what, st.accepted,
                         st.proposed, st.target_steps, steps));
    expect_memory_consistent(*u, what);
}

// ----------------------------------------------------------------------------------------------
// A cache kvlab did not write (plugin_cache.h): the plugin keeps the books, kvlab the rows

// The block sizes a plugin's pools are drawn from: the plugin's and the options' (o.block_sizes)
// both, or either's alone; empty when neither lists any (kvlab draws 1..16 or 1..64). Throws
// Error, in one line, when no size is both.
std::vector<int> plugin_block_sizes(const CachePlugin& plugin, const VerifyOptions& o) {
    std::vector<int> out;
    for (int bs : o.block_sizes)
        if (plugin.accepts_block_size(bs)) out.push_back(bs);
    if (o.block_sizes.empty()) out = plugin.block_sizes();
    if (!o.block_sizes.empty() && out.empty()) {
        std::string asked;
        for (int bs : o.block_sizes) asked += fmt::format("{}{}", asked.empty() ? "" : ",", bs);
        throw Error(fmt::format("verify: --block-sizes {}: plugin {} accepts none of them (it takes {})", asked,
                                plugin.name(), plugin.block_sizes_text()));
    }
    return out;
}

// A pool of a plugin and the sequences it holds, each with the tokens it holds, driven by drawn
// operations as an engine drives its block manager: new requests (a fresh prompt, one sharing
// another's prefix, or one edited part-way so that later blocks repeat after another prefix,
// which a prefix hash must tell apart), forks, batched steps mixing prompt chunks and decode
// rows, rollbacks, speculative decoding with a draft of another model, finished requests, and
// fills: requests and chunks until the pool refuses, then a release and a request that reuses
// the room. Sizes come from draw_reaching_config (positions 97 and 257 in the fast profile, 4097
// and 8191 in the long one); pools are roomy a third of the time, else tighter than their
// sequences could fill, so a plugin meets a full pool, high slot ids and block ids past 256.
// Every read is checked by plugin_cache.h against kvlab's books first, so a bad answer fails
// with its call; every logit is checked against naive decode of its sequence's tokens up to
// kNaiveAlways positions, and past that (the long profile) the first kBigChecks of a case.
class PluginFamily {
public:
    static constexpr int kNaiveAlways = 1024, kBigChecks = 4;
    static constexpr int kLongPoolSlots = 24576;         // the long profile's pools: filled in seconds
    static constexpr std::int64_t kStepSlots = 1 << 22;  // a batched step's rows x max_seq at most

    PluginFamily(const CachePlugin& plugin, const Devices& devices, const VerifyOptions& o)
        : plugin_(plugin),
          devices_(devices),
          progress_(o.progress),
          c_(draw_reaching_config(devices.long_profile)),
          m_(random_model(c_, *rc::gen::arbitrary<std::uint64_t>())),
          format_(draw_kv_format(devices)),
          oracle_(m_, devices, Mutant::none) {
        oracle_.set_kv_format(format_, {});
        const bool long_run = devices.long_profile;
        // Mostly several sequences (8-64 half the time in the long profile, 4-8 with a thin
        // model, so that pools pass slot 1024 and block 256), and small blocks half the time:
        // most cases then share blocks.
        max_sequences_ = plugin.one_sequence()         ? 1
                         : long_run && draw(0, 1) == 1 ? draw(8, 64)
                         : thin()                      ? draw(4, 8)
                         : draw(0, 4) == 0             ? 1
                                                       : draw(2, 8);
        if (plugin.max_sequences() > 0) max_sequences_ = std::min(max_sequences_, plugin.max_sequences());
        if (o.max_sequences > 0) max_sequences_ = std::min(max_sequences_, o.max_sequences);
        // A block size the plugin accepts (and the options allow): drawn from the list, else
        // small half the time.
        const std::vector<int> sizes = plugin_block_sizes(plugin, o);
        const int bs = !sizes.empty()                ? sizes[draw(std::size_t{0}, sizes.size() - 1)]
                       : *rc::gen::arbitrary<bool>() ? draw(1, 4)
                                                     : draw(1, long_run ? 64 : 16);
        // Room for every sequence's max_seq positions, a partly filled block and a copy each, a
        // third of the time; else fewer blocks, down to two (with a thin model, half of those at
        // least half the room: wide pools), so that fills meet a refusal.
        const int roomy = (max_sequences_ * (c_.max_seq + 2 * bs) + bs - 1) / bs,
                  cap = long_run ? std::max(2, kLongPoolSlots / bs) : 2 * roomy;
        const int least = thin() && *rc::gen::arbitrary<bool>() ? roomy / 2 : 2;
        const int n_blocks = draw(0, 2) == 0 ? draw(std::min(roomy, cap), std::min(2 * roomy, cap))
                                             : draw(std::min(least, cap), std::min(roomy, cap));
        n_slots_ = bs * n_blocks;
        what_ = fmt::format("pool of {} slots, block_size {}, {}; {} in {}", n_slots_, bs,
                            max_sequences_ == 1 ? "one sequence" : fmt::format("up to {} sequences", max_sequences_),
                            c_.describe(), kv_format_name(format_));
        pool_.emplace(c_, plugin, oracle_.memory(), n_slots_, max_sequences_, bs);
        pool_->set_kv_format(format_);
        pool_->set_log(&log_);
        if (o.call_log) {
            call_log_ = o.call_log;
            call_log_("h " + replay_log_header(header()));
            set_plugin_call_hook([this] { stream_log(); });
        }
    }
    ~PluginFamily() {
        if (call_log_) set_plugin_call_hook(nullptr);
        seqs_.clear();  // before the pool
    }

    void run() {
        if (thin() && *rc::gen::arbitrary<bool>()) fill();  // a wide pool filled first, half the time
        for (int op = 0, n_ops = draw(1, devices_.long_profile ? 16 : 12); op < n_ops; op++) {
            const int n = int(seqs_.size());
            // 0 new, 1 step, 2 rollback (or preempt, for a plugin that frees sequences only
            // whole), 3 fork, 4 finish, 5 speculate (which rolls back), 6 fill
            std::vector<int> kinds{1, 6};
            if (n < max_sequences_) kinds.push_back(0);
            if (n < max_sequences_ && plugin_.releases_part()) kinds.push_back(5);
            if (n < max_sequences_ && n > 0 && plugin_.can_fork()) kinds.push_back(3);
            if (n > 0) kinds.push_back(2);
            if (n > 1) kinds.push_back(4);
            const int kind = n == 0 ? 0 : kinds[draw(std::size_t{0}, kinds.size() - 1)];
            if (kind == 0) start(false, c_.max_seq);
            if (kind == 5) start(true, c_.max_seq);
            if (kind == 1) step();
            if (kind == 2) plugin_.releases_part() ? rollback(draw(0, n - 1)) : preempt(draw(0, n - 1));
            if (kind == 3) fork(draw(0, n - 1));
            if (kind == 4) finish(draw(0, n - 1));
            if (kind == 6) fill();
        }
    }
    const std::string& what() const { return what_; }
    // The case so far as a replayable log ending in `verdict` (books: raised by kvlab's books,
    // not a logit that differs).
    std::string replay_log(const std::string& verdict, bool books) const {
        return replay_log_text(header(), log_, verdict, books);
    }
    // The case's sizes, first in its counterexample: "T = 258, pool 97% full, 5 sequences".
    std::string sizes() const {
        return fmt::format("T = {}, pool {}% full, {} sequences", longest_, fill_percent(), most_sequences_);
    }
    // The case's sizes and counts into the row's record (Reach::end counts the case).
    void count(Reach& r) const {
        r.size(longest_);
        r.pool(fill_percent(), most_sequences_);
        r.held_slots = std::max(r.held_slots, pool_->peak_held_slots());
        r.full_cases += refusals_ > 0;
        r.preemptions += preemptions_;
        r.moved += pool_->moved_positions();
    }

private:
    ReplayHeader header() const {
        return {plugin_.name(), c_, n_slots_, max_sequences_, pool_->block_size(), kv_format_name(format_)};
    }
    // Before each plugin call: the log so far to VerifyOptions::call_log, each entry no longer the
    // last as a final line ("f"), and the last as the pending one ("p": the call under way may
    // still fill in its answer, or never return).
    void stream_log() {
        if (log_.empty() || log_.size() == pending_at_) return;
        for (; streamed_ + 1 < log_.size(); streamed_++) call_log_("f " + replay_log_line(log_[streamed_]));
        call_log_("p " + replay_log_line(log_.back()));
        pending_at_ = log_.size();
    }
    // A thin model of draw_reaching_config (past the small models' kFastMaxSeq positions).
    bool thin() const { return c_.max_seq > kFastMaxSeq; }
    // The most of the pool in use at once: blocks with a held slot, as a block allocator sees it.
    int fill_percent() const { return int(100 * std::int64_t(pool_->peak_blocks_in_use()) / pool_->n_blocks()); }
    // An operation about to run: a sequence of T positions, `extra` sequences beyond the live
    // ones (a failure inside it then names the sizes it reached).
    void reaching(int T, int extra = 0) {
        longest_ = std::max(longest_, T);
        most_sequences_ = std::max(most_sequences_, int(seqs_.size()) + extra);
    }
    void note(const std::string& about) {
        what_ += about;
        if (progress_) progress_(fmt::format("plugin {}: {}", plugin_.name(), what_));
    }
    // A refusal the pool's room allows: noted, and the operation is dropped (the decoders put
    // every cache back as it was).
    void refused(const PoolFull&) {
        refusals_++;
        note(fmt::format(" (refused: the pool is full, {} of {} blocks in use)", pool_->blocks_in_use(),
                         pool_->n_blocks()));
    }
    // Logits of a sequence's tokens against naive decode (see the class comment for which).
    void expect_naive(const std::vector<int>& t, std::span<const float> logits) {
        if (int(t.size()) > kNaiveAlways && big_checks_++ >= kBigChecks) return;
        oracle_.expect_naive(t, logits, what_);
    }
    // A length in 1..room: the whole room half the time, else biased to the size thresholds.
    int draw_chunk(int room) { return draw(0, 1) == 0 ? draw_size(1, room) : room; }
    // A prompt: fresh, or another sequence's tokens (all, up to a drawn point, or from a drawn
    // point on, so the same tokens sit at other positions; edited at one position half the
    // time), then fresh tokens. A prefix cache must map only rows computed for the same tokens at
    // the same positions after the same prefix.
    std::vector<int> prompt(std::string& how, int max_length) {
        std::vector<int> p;
        if (!seqs_.empty() && draw(0, 2) > 0) {
            const int i = draw(0, int(seqs_.size()) - 1);
            const std::vector<int>& t = tokens_[std::size_t(i)];
            // A suffix starts on a block boundary half the time: a block of it then repeats
            // another's at another position, which a prefix cache's key must tell apart.
            const int how_much = draw(0, 2), bs = pool_->block_size(), size = int(t.size());
            const int at = *rc::gen::arbitrary<bool>() ? draw(0, size) : bs * draw(0, size / bs);
            const int from = how_much == 2 ? at : 0, to = how_much == 1 ? at : size;
            p.assign(t.begin() + from, t.begin() + to);
            how = fmt::format(" of sequence {}'s tokens {}..{}", seqs_[std::size_t(i)]->seq_id, from, to - 1);
            if (!p.empty() && c_.vocab_size > 1 && *rc::gen::arbitrary<bool>()) {
                const int e = draw(0, int(p.size()) - 1);
                p[std::size_t(e)] = (p[std::size_t(e)] + draw(1, c_.vocab_size - 1)) % c_.vocab_size;
                how += fmt::format(" edited at {}", e);
            }
        }
        if (int(p.size()) > max_length) p.resize(std::size_t(max_length));
        const int room = max_length - int(p.size());
        const std::vector<int> more = draw_tokens(c_, room == 0 ? 0 : p.empty() ? draw_chunk(room) : draw(0, room));
        p.insert(p.end(), more.begin(), more.end());
        return p;
    }
    // A new request of at most max_length prompt tokens; false when the pool refused it.
    bool start(bool speculative, int max_length) {
        std::string how;
        const std::vector<int> p = prompt(how, std::min(max_length, c_.max_seq));
        return admit(p, how, speculative);
    }
    // A new sequence running prompt p (`how`: where its tokens came from); false when refused.
    bool admit(const std::vector<int>& p, const std::string& how, bool speculative = false) {
        const int id = next_id_++;
        reaching(int(p.size()), 1);
        auto cache = std::make_unique<PluginCache>(*pool_, id);
        const auto cached = oracle_.cached(*cache);
        if (speculative) return speculate(std::move(cache), *cached, p);
        note(fmt::format(", sequence {} starts: a prompt of {}{}", id, p.size(), how));
        try {
            expect_naive(p, cached->extend(p));
        } catch (const PoolFull& e) {
            refused(e);
            return false;
        }
        if (cached->prefix_hit() > 0) note(fmt::format(" ({} reused)", cached->prefix_hit()));
        seqs_.push_back(std::move(cache));
        tokens_.push_back(p);
        return true;
    }
    // Greedy speculative decoding on the new sequence: the target rolls back every rejected draft.
    bool speculate(std::unique_ptr<PluginCache> cache, CachedDecoder& target, const std::vector<int>& p) {
        const int k = draw(1, 4), steps = draw(1, std::min(c_.max_seq - int(p.size()) + 1, 32));
        note(fmt::format(", sequence {} starts: a prompt of {} and {} tokens speculated {} at a time", cache->seq_id,
                         p.size(), steps, k));
        if (!draft_model_) {
            draft_model_.emplace(random_model(c_, *rc::gen::arbitrary<std::uint64_t>()));
            draft_backend_ = devices_.make(devices_.tested, *draft_model_);
        }
        CachedDecoder draft(*draft_backend_);
        draft.cache().set_kv_format(format_);
        SpeculativeDecoder spec(target, draft, k);
        DecodeRun run;
        reaching(int(p.size()) + steps - 1, 1);
        try {
            run = spec.generate(p, steps);
        } catch (const PoolFull& e) {
            refused(e);  // the sequence is dropped, as an engine drops a request it cannot place
            return false;
        }
        std::vector<int> sequence = p;
        const std::size_t V = std::size_t(c_.vocab_size);
        for (int i = 0; i < steps; i++) {
            expect_naive(sequence, std::span(run.logits).subspan(std::size_t(i) * V, V));
            sequence.push_back(run.tokens[std::size_t(i)]);
        }
        sequence.pop_back();  // the last token needs no position
        if (!std::ranges::equal(cache->tokens(), sequence))
            fail(fmt::format("{}: after speculation the cache holds {} tokens, not the {} emitted", what_,
                             cache->length(), sequence.size()));
        seqs_.push_back(std::move(cache));
        tokens_.push_back(sequence);
        return true;
    }
    // One batched step over the sequences that take part: a chunk of new tokens each (at most
    // kStepSlots / max_seq rows in all, the step's plan of slots).
    void step() {
        std::vector<Cache*> caches;
        std::vector<std::vector<int>> rows;
        std::vector<std::size_t> who;
        std::string about = ", step";
        int budget = int(std::max<std::int64_t>(1, kStepSlots / c_.max_seq));
        for (std::size_t i = 0; i < seqs_.size() && budget > 0; i++) {
            const int room = std::min(c_.max_seq - int(tokens_[i].size()), budget);
            if (room == 0 || (!who.empty() && *rc::gen::arbitrary<bool>())) continue;
            rows.push_back(draw_tokens(c_, draw(1, std::min(room, draw(0, 2) == 0 ? room : 2))));
            budget -= int(rows.back().size());
            caches.push_back(seqs_[i].get());
            who.push_back(i);
            about += fmt::format(" [sequence {} +{}]", seqs_[i]->seq_id, rows.back().size());
        }
        if (who.empty()) return;
        note(about);
        for (std::size_t r = 0; r < who.size(); r++) reaching(int(tokens_[who[r]].size() + rows[r].size()));
        const auto decoder = oracle_.cached(*caches[0]);
        const std::vector<float>* logits = nullptr;
        try {
            logits = &decoder->step(caches, rows);
        } catch (const PoolFull& e) {
            refused(e);
            return preempt_stale();
        }
        for (std::size_t r = 0; r < who.size(); r++) {
            std::vector<int>& t = tokens_[who[r]];
            t.insert(t.end(), rows[r].begin(), rows[r].end());
            expect_naive(t, std::span(*logits).subspan(r * std::size_t(c_.vocab_size), c_.vocab_size));
        }
    }
    // Sequence i grows by n drawn tokens in one request (its chunks commit together); false when
    // the pool refused.
    bool grow(std::size_t i, int n) {
        std::vector<int> t = tokens_[i];
        const std::vector<int> more = draw_tokens(c_, n);
        t.insert(t.end(), more.begin(), more.end());
        note(fmt::format(", sequence {} +{}", seqs_[i]->seq_id, n));
        reaching(int(t.size()));
        const auto decoder = oracle_.cached(*seqs_[i]);
        try {
            expect_naive(t, decoder->extend(t));
        } catch (const PoolFull& e) {
            refused(e);
            preempt_stale();
            return false;
        }
        tokens_[i] = std::move(t);
        return true;
    }
    // New requests and chunks until the pool refuses one position or every sequence is full
    // (each refusal halves the chunks, so the pool ends 95-100% full); then a release (a
    // finished request or a rollback) and one more request or chunk in the room it left.
    void fill() {
        note(", fill");
        bool full = false;
        for (int round = 0, cap = c_.max_seq; round < 4 * max_sequences_ + 32 && !full; round++) {
            std::vector<std::size_t> growable;
            for (std::size_t i = 0; i < seqs_.size(); i++)
                if (int(tokens_[i].size()) < c_.max_seq) growable.push_back(i);
            const bool can_start = int(seqs_.size()) < max_sequences_;
            if (growable.empty() && !can_start) break;
            bool placed;
            int n = 1;
            if (can_start && (growable.empty() || *rc::gen::arbitrary<bool>())) {
                placed = start(false, cap);
                n = seqs_.empty() || !placed ? cap : int(tokens_.back().size());
            } else {
                const std::size_t i = growable[draw(std::size_t{0}, growable.size() - 1)];
                n = std::min(cap, draw_chunk(c_.max_seq - int(tokens_[i].size())));
                placed = grow(i, n);
            }
            if (!placed) full = n <= 1, cap = std::max(1, std::min(cap, n) / 2);
        }
        if (!full || seqs_.empty()) return;
        const int i = draw(0, int(seqs_.size()) - 1);
        if (seqs_.size() > 1 && *rc::gen::arbitrary<bool>())
            finish(i);
        else if (plugin_.releases_part())
            rollback(i);
        else
            preempt(i);
        if (seqs_.empty() || (int(seqs_.size()) < max_sequences_ && *rc::gen::arbitrary<bool>())) {
            start(false, c_.max_seq);
        } else {
            const std::size_t j = std::size_t(draw(0, int(seqs_.size()) - 1));
            const int room = c_.max_seq - int(tokens_[j].size());
            if (room > 0) grow(j, draw_chunk(room));
        }
    }
    // A plugin that frees sequences only whole: sequence i is destroyed and its tokens run again
    // as a new request (an engine's preemption and recompute), which may reuse its prefix.
    void preempt(int i) {
        const std::vector<int> t = tokens_[std::size_t(i)];
        const int was = seqs_[std::size_t(i)]->seq_id;
        note(fmt::format(", sequence {} is preempted (freed whole)", was));
        preemptions_++;
        seqs_.erase(seqs_.begin() + i);
        tokens_.erase(tokens_.begin() + i);
        if (!t.empty()) admit(t, fmt::format(": sequence {}'s {} tokens again", was, t.size()));
    }
    // After a refused step or chunk: a sequence the refusal left stale (its rows rolled back,
    // which the plugin cannot release) is preempted.
    void preempt_stale() {
        for (std::size_t i = seqs_.size(); i-- > 0;)
            if (seqs_[i]->stale()) preempt(int(i));
    }
    void rollback(int i) {
        const int n = draw(0, int(tokens_[std::size_t(i)].size()));
        note(fmt::format(", sequence {} rolls back to {}", seqs_[std::size_t(i)]->seq_id, n));
        seqs_[std::size_t(i)]->truncate(n);
        tokens_[std::size_t(i)].resize(std::size_t(n));
    }
    void fork(int i) {
        const int id = next_id_++;
        reaching(0, 1);
        note(fmt::format(", sequence {} = fork of sequence {} at {}", id, seqs_[std::size_t(i)]->seq_id,
                         tokens_[std::size_t(i)].size()));
        seqs_.push_back(seqs_[std::size_t(i)]->fork(id));
        tokens_.push_back(tokens_[std::size_t(i)]);
    }
    void finish(int i) {
        note(fmt::format(", sequence {} finishes", seqs_[std::size_t(i)]->seq_id));
        seqs_.erase(seqs_.begin() + i);
        tokens_.erase(tokens_.begin() + i);
    }

    const CachePlugin& plugin_;
    const Devices& devices_;
    const std::function<void(std::string_view)>& progress_;
    const Config c_;
    const Model m_;
    const KVFormat format_;
    Oracle oracle_;
    int max_sequences_ = 1, n_slots_ = 0, next_id_ = 0;
    int longest_ = 0, most_sequences_ = 0, refusals_ = 0, big_checks_ = 0, preemptions_ = 0;
    std::string what_;
    std::optional<PluginPool> pool_;
    std::vector<std::unique_ptr<PluginCache>> seqs_;  // the live sequences
    std::vector<std::vector<int>> tokens_;            // [seqs_] the tokens each holds
    std::vector<PluginLogEntry> log_;                 // every call into the pool, for a replay
    std::function<void(std::string_view)> call_log_;  // VerifyOptions::call_log
    std::size_t streamed_ = 0, pending_at_ = 0;       // log_ entries sent as final; log_'s size at the last pending
    std::optional<Model> draft_model_;
    std::unique_ptr<Backend> draft_backend_;
};

// One case of the plugin property: a drawn family run; a failure names the case's sizes first
// ("T = 258, pool 97% full, 5 sequences"), then every operation that led there.
void plugin_property(const CachePlugin& plugin, const Devices& devices, const VerifyOptions& o, Reach& reach) {
    std::optional<PluginFamily> family;
    const auto counted = [&] {
        if (family) family->count(reach);
    };
    const auto framed = [&](const std::string& message) {
        return family ? fmt::format("plugin {} ({}): {}", plugin.name(), family->sizes(), message) : message;
    };
    try {
        family.emplace(plugin, devices, o);
        family->run();
    } catch (const Error& e) {
        counted();
        if (family) reach.replay_log = family->replay_log(e.what(), true);
        fail(framed(family ? fmt::format("{}: {}", family->what(), e.what()) : std::string(e.what())));
    } catch (const rc::detail::CaseResult& r) {  // a logit that differs from naive decode
        counted();
        if (family) reach.replay_log = family->replay_log(r.description, false);
        fail(framed(r.description));
    }
    counted();
}

// ----------------------------------------------------------------------------------------------
// The quantized variant: within a stated error bound

// The bounds we state and test, by bits: the largest |logit error|, and the largest
// KL(exact || quantized) of the next-token distribution.
struct QuantBound {
    int bits;
    double max_abs, kl;
};
constexpr QuantBound kQuantBounds[] = {{8, 0.2, 1e-3}, {4, 2.5, 0.15}};

const QuantBound& quant_bound(const CacheSpec& spec) {
    for (const QuantBound& b : kQuantBounds)
        if (b.bits == spec.quant.bits) return b;
    throw Error(fmt::format("verify: no error bound stated for {}-bit codes", spec.quant.bits));
}

// The quantized cache quantizes on the host (quantized_cache.h): its rows run on the tested
// device when that one's memory is the host's, else on the CPU.
std::string quant_device(const Devices& devices) { return devices.tested == "gpu" ? "cpu" : devices.tested; }

// Error bounds only mean something for one family of models: random models of stories260K's
// shape (head_size 8), context up to 32. Tiny models of every shape are for exactness.
Config quant_config() {
    Config c = stories260k_shape();
    c.max_seq = 32;
    return c;
}

// An approximate cache against exact cached decode (which equals naive), both on `backend`, over
// a drawn sequence: with bound, every step's error stays within max_abs and kl; without, the
// logits are required bitwise equal (and are not). `name` says which cache in a failure.
void within_bound(const Config& c, Backend& backend, Cache& approx, const std::string& name, double max_abs, double kl,
                  bool bound, ErrorSummary* summary) {
    CachedDecoder exact(backend), other(backend, approx);
    const std::vector<int> tokens = draw_tokens(c, draw(1, c.max_seq));
    const int prompt = draw(1, int(tokens.size()));
    const std::span<const int> all(tokens);
    auto check = [&](int T, const std::vector<float>& ref, const std::vector<float>& got) {
        const LogitError e = compare_logits(ref, got);
        if (summary) summary->add(e);
        const std::string what = fmt::format("{}, {} tokens, prompt {}", name, tokens.size(), prompt);
        if (!bound) {
            if (auto diff = first_difference(ref, got))
                fail(fmt::format("{}: first differs at T = {}, {}", what, T, *diff));
        } else if (!(e.max_abs <= max_abs && e.kl <= kl)) {
            fail(fmt::format("{}: at T = {} max |logit error| {:.3g} (bound {}), KL {:.3g} (bound {})", what, T,
                             e.max_abs, max_abs, e.kl, kl));
        }
    };
    check(prompt, exact.prefill(all.first(prompt)), other.prefill(all.first(prompt)));
    for (int T = prompt + 1; T <= int(tokens.size()); T++)
        check(T, exact.decode(tokens[T - 1]), other.decode(tokens[T - 1]));
}

// Quantized decode within its bits' bound (within_bound).
void quant_property(const VariantSetting& s, const Devices& devices, bool bound, ErrorSummary* summary) {
    const Config c = quant_config();
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const CacheSpec spec = draw_spec(s, c);
    const QuantBound& b = quant_bound(spec);
    const CacheAndPool cp = make_cache(c, spec);
    const std::unique_ptr<Backend> backend = devices.make(quant_device(devices), m);
    within_bound(c, *backend, *cp.cache, cp.cache->name(), b.max_abs, b.kl, bound, summary);
}

// The quantized cache, a preset's parameters drawn, against naive decode that rounds K and V
// as it does (same groups; KIVI's keys quantized once their group is complete, read quantized by
// the queries at or past its end): bitwise equal at every step.
void quant_exact_property(const Devices& devices, Mutant mutant) {
    // The fast profile's sizes in both profiles: the naive decode that rounds like the cache builds
    // each query row's mix of rounded and raw keys afresh (T^2 row copies a layer), so a case of
    // thousands of positions takes minutes.
    const Config c = draw_row_shape(1);
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const std::vector<VariantSetting> settings = variant_settings(Variant::quantized);
    const VariantSetting& s = settings[std::size_t(draw(0, int(settings.size()) - 1))];
    Devices host = devices;  // the cache quantizes on the host: the GPU's rows run on the CPU
    host.tested = quant_device(devices);
    host.reference = devices.reference == "gpu" ? "cpu" : devices.reference;
    Oracle oracle(m, host, mutant);
    CacheUnderTest u = cache_under_test(s, c, mutant, oracle.memory());
    oracle.set_quant(u.spec.quant);
    const auto cached = oracle.cached(*u);
    const Prompted drawn = draw_prompted(c);
    const std::vector<int>& tokens = drawn.tokens;
    const int prompt = drawn.prompt;
    note_reached(devices, int(tokens.size()));
    const std::string what = fmt::format("{}, {}, prompt {} of {}", u->name(), c.describe(), prompt, tokens.size());
    const std::span<const int> all(tokens);
    oracle.expect_naive(all.first(prompt), cached->prefill(all.first(prompt)), what);
    for (int T = prompt + 1; T <= int(tokens.size()); T++)
        oracle.expect_naive(all.first(T), cached->decode(tokens[T - 1]), what);
}

// ----------------------------------------------------------------------------------------------
// KV formats: exact against the format-aware naive decode, and their drift from fp32

// A model whose K and V sometimes pass a format's largest finite value: wk and wv scaled by 2^e,
// so that saturation (and a planted overflow to infinity) is within the generator's reach.
Model format_model(const Config& c) {
    const int e = *rc::gen::element(0, 0, 0, 4, 8, 12, 16);
    Weights w = random_model(c, *rc::gen::arbitrary<std::uint64_t>()).w;
    const float f = std::ldexp(1.0f, e);
    for (std::span<float>* t : {&w.wk, &w.wv})
        for (float& x : *t) x = x * f;
    return Model(std::move(w));
}

// fp8 scales [n_layers, 2] in [2^-5, 2^4): powers of two and values between.
std::vector<float> draw_kv_scales(const Config& c) {
    std::vector<float> s(std::size_t(2 * c.n_layers));
    for (float& x : s) x = std::ldexp(1.0f + float(draw(0, 63)) / 64.0f, draw(-5, 3));
    return s;
}

// The exact settings whose variant takes a KV format.
std::vector<VariantSetting> format_settings() {
    std::vector<VariantSetting> out;
    for (const VariantSetting& s : variant_settings())
        if (is_exact(s.variant) && variant_info(s.variant).kv_formats) out.push_back(s);
    return out;
}

// An exact variant that takes a format, its parameters drawn, storing K and V in `format` (fp8
// with scales half the time): every step equals naive decode storing them the same way.
void format_property(KVFormat format, const Devices& devices, Mutant mutant) {
    const Config c = draw_row_shape(1);
    const Model m = format_model(c);
    const Prompted drawn = draw_prompted(c);
    const std::vector<int>& tokens = drawn.tokens;
    const int prompt = drawn.prompt;
    const std::vector<VariantSetting> settings = format_settings();
    const VariantSetting& s = settings[std::size_t(draw(0, int(settings.size()) - 1))];
    const std::vector<float> scales =
        kv_format_scaled(int(format)) && draw(0, 1) ? draw_kv_scales(c) : std::vector<float>{};
    Oracle oracle(m, devices, mutant);
    oracle.set_kv_format(format, scales);
    CacheUnderTest u = cache_under_test(s, c, mutant, oracle.memory(), format, scales);
    const PoolWatch watch(devices, u.pool.get());
    note_reached(devices, int(tokens.size()));
    const auto cached = oracle.cached(*u);
    const std::string what = fmt::format("{} in {}{}, {}, prompt {} of {}", describe(u.spec), kv_format_name(format),
                                         scales.empty() ? "" : " with scales", c.describe(), prompt, tokens.size());
    const std::span<const int> all(tokens);
    oracle.expect_naive(all.first(prompt), cached->prefill(all.first(prompt)), what);
    for (int T = prompt + 1; T <= int(tokens.size()); T++)
        oracle.expect_naive(all.first(T), cached->decode(tokens[T - 1]), what);
    expect_memory_consistent(*u, what);
}

// One prefix-caching pool, two requests, two formats: A runs in the first and ends (its full
// blocks stay cached); the pool switches to the second; B shares a prefix with A. B must equal
// naive decode in the second format, so it must not map A's blocks.
void format_switch_property(const Devices& devices, Mutant mutant) {
    const Config c = draw_row_shape(2);
    const auto length = [&](int lo, int hi) { return thin(c) ? draw_size(lo, hi) : draw(lo, hi); };
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const std::uint64_t id = m.w.fingerprint();
    const int bs = thin(c) ? draw_size(1, std::min(c.max_seq, 512)) : draw(1, c.max_seq);
    const int per_seq = (c.max_seq + bs - 1) / bs;
    const int n_formats = int(std::size(kKVFormats));
    const KVFormat fa = kKVFormats[std::size_t(draw(0, n_formats - 1))];
    KVFormat fb = kKVFormats[std::size_t(draw(0, n_formats - 2))];
    if (fb == fa) fb = kKVFormats[std::size_t(n_formats - 1)];
    Oracle oracle(m, devices, mutant);
    const std::unique_ptr<BlockPool> pool = planted_pool(mutant, c, bs, 2 * per_seq, true, oracle.memory());
    const PoolWatch watch(devices, pool.get());
    const std::vector<int> a = draw_tokens(c, length(bs, c.max_seq));
    const int k = length(0, int(a.size()));
    std::vector<int> b(a.begin(), a.begin() + k);
    const std::vector<int> suffix = draw_tokens(c, length(k == 0 ? 1 : 0, c.max_seq - k));
    b.insert(b.end(), suffix.begin(), suffix.end());
    note_reached(devices, int(std::max(a.size(), b.size())));
    const std::string what =
        fmt::format("prefix-shared(block_size={}), {}, A {} tokens in {}, then B in {} shares {} of {}", bs,
                    c.describe(), a.size(), kv_format_name(fa), kv_format_name(fb), k, b.size());
    pool->set_kv_format(fa);
    oracle.set_kv_format(fa, {});
    {
        PagedCache seq_a(*pool, id, 0);
        oracle.expect_naive(a, oracle.cached(seq_a)->extend(a), "A: " + what);
    }
    pool->set_kv_format(fb);
    oracle.set_kv_format(fb, {});
    PagedCache seq_b(*pool, id, 1);
    const auto d = oracle.cached(seq_b);
    const std::span<const int> bspan(b);
    oracle.expect_naive(bspan, d->extend(bspan), "B: " + what);
    if (d->prefix_hit() != 0)
        fail(fmt::format("{}: B mapped {} positions of A's blocks, written in {}", what, d->prefix_hit(),
                         kv_format_name(fa)));
}

// The bounds we state and test for each format's distance from fp32, on quant_config's models
// (stories260K's shape, random weights, T <= 32), scale 1: the largest |logit error| and the
// largest KL(fp32 || format) of the next-token distribution.
struct FormatBound {
    KVFormat format;
    double max_abs, kl;
};
// Each about twice the largest seen over 2 x 1000 cases (seeds 1 and 2).
constexpr FormatBound kFormatBounds[] = {{KVFormat::bf16, 0.1, 3e-4},    {KVFormat::fp16, 0.02, 1e-5},
                                         {KVFormat::fp8_e5m2, 3.0, 0.2}, {KVFormat::fp8_e4m3, 2.0, 0.1},
                                         {KVFormat::int8, 0.2, 6e-4},    {KVFormat::int4, 2.6, 0.15}};
const FormatBound& format_bound(KVFormat f) {
    for (const FormatBound& b : kFormatBounds)
        if (b.format == f) return b;
    throw Error(fmt::format("verify: no drift bound stated for {}", kv_format_name(f)));
}

// A contiguous cache in `format` within the format's bound of fp32 (within_bound).
void drift_property(KVFormat format, const Devices& devices, bool bound, ErrorSummary* summary) {
    const Config c = quant_config();
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const FormatBound& b = format_bound(format);
    const std::unique_ptr<Backend> backend = devices.make(devices.tested, m);
    CacheSpec spec = default_spec(Variant::contiguous_head, c);
    spec.kv_format = format;
    const CacheAndPool cp = make_cache(c, spec, backend->memory());
    within_bound(c, *backend, *cp.cache, fmt::format("{} in {}", cp.cache->name(), kv_format_name(format)), b.max_abs,
                 b.kl, bound, summary);
}

// ----------------------------------------------------------------------------------------------
// The checks

struct Check {
    std::string name, kind, parameters, about;
    std::optional<VariantSetting> setting;             // a registry variant's row; none: a scenario
    std::function<void(const Devices&, Mutant)> body;  // exact checks: the property, with a mutant or none
    std::optional<KVFormat> drift = std::nullopt;      // a format's distance from fp32 (run_drift)
};

// The registry's variants, a row per setting (variant_settings): decode_property over the
// parameters the registry says to draw. Two have properties of their own: prefix-shared, whose
// point is a later request mapping the first's blocks, and quantized, never exact but within a
// stated bound (run_quant).
Check variant_check(const VariantSetting& s) {
    const VariantInfo& info = variant_info(s.variant);
    Check check{s.name, info.exact ? "exact" : "approximate", drawn_text(s), std::string(info.summary), s, {}};
    if (check.parameters.empty()) check.parameters = "prompt 1..T, then decode to T <= max_seq";
    if (s.variant == Variant::prefix_shared) {
        check.parameters += "; shared prefix none/part/all/k*block_size, other model";
        check.body = prefix_property;
    } else if (s.variant == Variant::quantized) {
        check.parameters = fmt::format("stories260K shape, max_seq 32; {}", check.parameters);
    } else {
        check.body = [s](const Devices& d, Mutant m) { decode_property(s, d, m); };
    }
    if (s.preset) check.about = fmt::format("{}: {}", info.name, s.preset->about);
    return check;
}

const std::vector<Check>& checks() {
    static const std::vector<Check> all = [] {
        std::vector<Check> v;
        for (const VariantSetting& s : variant_settings())
            if (is_exact(s.variant)) v.push_back(variant_check(s));
        v.push_back({"fork", "exact",
                     "paged: fork anywhere into 1-3 children (long profile: or 7-63), interleaved; any KV format",
                     "children share the parent's blocks; a shared partial block is copied on first write",
                     std::nullopt, fork_property});
        v.push_back({"rollback", "exact", "any exact variant, 1-3 rollbacks of any length; any KV format",
                     "decode, roll back any number of positions, decode other tokens", std::nullopt,
                     rollback_property});
        v.push_back({"chunked-prefill", "exact", "any exact variant, a prompt in chunks of 1..rest; any KV format",
                     "a prompt prefilled chunk by chunk, then decoded, equals naive decode at every chunk and step",
                     std::nullopt, chunked_prefill_property});
        v.push_back({"prefix-hit-extend", "exact",
                     "prefix-caching pool, block_size drawn, B shares 0..all of A's tokens, prompt 1..T; any KV "
                     "format",
                     "a prefix hit then the rest prefilled then decode equals a cold prefill and naive decode",
                     std::nullopt, prefix_extend_property});
        v.push_back({"rescoring", "exact", "any exact variant and KV format, prompt 1..T, greedy steps to max_seq",
                     "the log-probabilities greedy decode computed equal one prefill's of the whole text", std::nullopt,
                     rescoring_property});
        v.push_back({"tiled-attention", "exact",
                     "any exact variant and KV format, key tile 1..24 (long profile: 1..256; or --tile), chunked "
                     "prefill, 1-2 threads",
                     "naive, prefill, chunked prefill and split-KV decode all run tiled attention with one fixed "
                     "key tile: bitwise equal",
                     std::nullopt, tiled_attention_property});
        v.push_back({"batch", "exact", "2-4 sequences (long profile: 2-300), mixed lengths, late joins; any KV format",
                     "sequences of different lengths stepped together over one pool", std::nullopt, batch_property});
        v.push_back({"serve", "exact",
                     "1-6 requests arriving over time (long profile: 1-4 to 8192 positions, or 8-64 to 512), shared "
                     "prefixes, a pool of 1..all their blocks, 1..2 max_seq batch tokens, prefix caching on/off, "
                     "preemption by recompute or swap; any KV format",
                     "continuous batching (scheduler.h): every request's logits equal decoding it alone", std::nullopt,
                     serve_property});
        v.push_back({"store", "exact",
                     "1-6 requests (long profile: or 8-64) served twice by fresh pools over one store, a pool of 1..2 "
                     "requests' blocks; "
                     "records damaged (bits, truncation, another model's, format's, block's or key's, gone) at "
                     "0..100%; any KV format",
                     "prefix blocks evicted into a store and fetched back: every request equals decoding it alone, "
                     "a damaged record never used",
                     std::nullopt, store_property});
        v.push_back({"beam", "exact", "width 1-4, steps to max_seq, block_size 1..max_seq; any KV format",
                     "beam search on forked caches: every beam's logits equal naive decode of its tokens", std::nullopt,
                     beam_property});
        v.push_back({"stale", "exact", "prompt edited anywhere, then rolled back",
                     "a cache continued with an edited prompt refuses; rolled back, it continues exactly", std::nullopt,
                     stale_property});
        v.push_back({"speculate", "exact",
                     "draft another model/shape/the target, k 1..4, contiguous-head or paged; any KV format",
                     "greedy speculative decoding emits plain greedy decode's tokens and logits", std::nullopt,
                     speculate_property});
        std::string format_variants_text;
        for (const VariantSetting& s : format_settings())
            format_variants_text += (format_variants_text.empty() ? "" : ", ") + s.name;
        for (KVFormat f : kKVFormats)
            if (f != KVFormat::fp32)
                v.push_back({fmt::format("format-{}", kv_format_name(f)), "exact",
                             fmt::format("{}; wk, wv x 2^0..2^16{}", format_variants_text,
                                         kv_format_scaled(int(f)) ? "; scales per layer or none" : ""),
                             fmt::format("K and V stored as {} codes; naive decode stores them the same way",
                                         kv_format_name(f)),
                             std::nullopt, [f](const Devices& d, Mutant m) { format_property(f, d, m); }});
        v.push_back({"format-switch", "exact", "prefix-shared pool, A in one format, then B in another sharing 0..all",
                     "a pool switched to another KV format evicts its cached blocks: no hit maps old-format rows",
                     std::nullopt, format_switch_property});
        v.push_back({"quantized-exact", "exact", "any quantized preset, group drawn; naive rounds K and V the same way",
                     "the quantized cache equals naive decode that quantizes its K and V with the same groups "
                     "and KIVI's residual rule",
                     std::nullopt, quant_exact_property});
        for (MlaForm form : {MlaForm::rebuild, MlaForm::absorbed})
            v.push_back({fmt::format("mla-{}", to_string(form)), "exact",
                         "MLA models: 1-3 layers, 1-4 heads, rank 1-8, rope_dim 0/2/4; prompts in chunks of any size; "
                         "the CPU's kernels",
                         form == MlaForm::rebuild
                             ? "the latent cache, K and V rebuilt from it every step, equals MLA naive decode in the "
                               "same form"
                             : "the latent cache, W_UK and W_UV absorbed into the query and output, equals MLA naive "
                               "decode in the same form",
                         std::nullopt, [form](const Devices& d, Mutant) {
                             mla_property(form, form, [&d](int T) { note_reached(d, T); });
                         }});
        for (const VariantSetting& s : variant_settings())
            if (!is_exact(s.variant)) v.push_back(variant_check(s));
        for (KVFormat f : kKVFormats)
            if (f != KVFormat::fp32) {
                Check d{fmt::format("format-{}-drift", kv_format_name(f)),
                        "approximate",
                        "stories260K shape, max_seq 32; contiguous-head, scale 1",
                        fmt::format("{} against fp32 decode: within its stated bound, never equal", kv_format_name(f)),
                        std::nullopt,
                        {}};
                d.drift = f;
                v.push_back(std::move(d));
            }
        return v;
    }();
    return all;
}

// The length "T = N" a counterexample names (the first), or 0.
int counterexample_T(const std::string& text) {
    const std::size_t at = text.find("T = ");
    return at == std::string::npos ? 0 : std::atoi(text.c_str() + at + 4);
}

// A row's counterexample sizes: the T it names ("T = N", else the failing case's longest
// sequence), and its pool fill and sequence count ("pool N% full, M sequences" when it names them,
// else the failing case's pool's, 0 without a pool).
void set_counterexample_sizes(VerifyRow& row, const Reach& reach) {
    const std::string& text = row.counterexample;
    if (text.empty()) return;
    row.counterexample_T = counterexample_T(text);
    if (row.counterexample_T == 0) row.counterexample_T = reach.failed.T;
    if (const std::size_t full = text.find("% full, "); full != std::string::npos) {
        const std::size_t pool = text.rfind("pool ", full);
        if (pool != std::string::npos) row.counterexample_fill = std::atoi(text.c_str() + pool + 5);
        row.counterexample_sequences = std::atoi(text.c_str() + full + 8);
    } else if (reach.failed.pool) {
        row.counterexample_fill = reach.failed.fill_percent;
        row.counterexample_sequences = reach.failed.sequences;
    }
}

// A row's record of its cases, its progress line when the run is long.
Reach reach_for(const std::string& row, const Devices& d, const VerifyOptions& o) {
    Reach r;
    r.row = row;
    if (d.long_profile) r.progress = o.progress;
    return r;
}

// check_property over body(d), each case counted in `reach` (told its sizes through the devices).
PropertyOutcome check_reaching(Reach& reach, const Devices& d, const VerifyOptions& o,
                               const std::function<void(const Devices&)>& body) {
    Devices watched = d;
    watched.reach = &reach;
    return check_property(reach.around([&] { body(watched); }), o.cases, o.seed);
}

VerifyRow run_exact(const Check& check, const Devices& d, const VerifyOptions& o) {
    Reach reach = reach_for(check.name, d, o);
    const PropertyOutcome r = check_reaching(reach, d, o, [&](const Devices& w) { check.body(w, Mutant::none); });
    VerifyRow row{check.name,
                  check.kind,
                  check.parameters,
                  r.cases,
                  r.passed ? "bitwise equal" : "FAILED",
                  r.passed,
                  r.counterexample,
                  reach.text(d.long_profile, false)};
    set_counterexample_sizes(row, reach);
    return row;
}

// Why a planted bug cannot show in this run ("" when it can): its threshold lies past the fast
// profile's sizes, or the run fixes a key tile that holds every fast-profile sequence whole, so
// a tile twice as wide changes nothing.
std::string why_not_run(const MutantInfo& info, const Devices& d) {
    if (d.long_profile) return "";
    if (info.long_only) return "--profile long catches it";
    if (info.mutant == Mutant::key_tile_from_rows && d.attention && d.attention->tiled() &&
        d.attention->tile >= kFastMaxSeq)
        return fmt::format(
            "the run's tile of {} keys holds every sequence of the fast profile (up to {}); a "
            "--tile below {} or --profile long catches it",
            d.attention->tile, kFastMaxSeq, kFastMaxSeq);
    return "";
}

VerifyRow run_mutant(const MutantInfo& info, const Devices& d, const VerifyOptions& o) {
    const std::string_view target = info.check;
    const auto& all = checks();
    const auto it = std::find_if(all.begin(), all.end(), [&](const Check& c) { return c.name == target; });
    if (it == all.end() || it->kind != "exact")
        throw Error(fmt::format("verify: {}'s check '{}' is not an exact check", info.name, target));
    const std::string parameters = fmt::format("{} (check: {})", info.bug, target);
    if (const std::string why = why_not_run(info, d); !why.empty())  // cases 0: not counted in the kill rate
        return {std::string(info.name), "mutant", parameters, 0, "not run: " + why, true, "", ""};
    Reach reach = reach_for(std::string(info.name), d, o);
    const PropertyOutcome r = check_reaching(reach, d, o, [&](const Devices& w) { it->body(w, info.mutant); });
    VerifyRow row{std::string(info.name),
                  "mutant",
                  parameters,
                  r.cases,
                  r.passed ? "NOT caught" : "caught",
                  !r.passed,
                  r.counterexample,
                  reach.text(d.long_profile, false)};
    set_counterexample_sizes(row, reach);
    return row;
}

// How far an approximate variant's logits drift from exact decode beyond its regime, on random
// models of stories260K's shape (quant_config), the parameters drawn as the row draws them.
void regime_drift(const VariantSetting& s, const Devices& devices, ErrorSummary& summary) {
    const Config c = quant_config();
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const CacheSpec spec = draw_spec(s, c);
    const std::unique_ptr<Backend> backend = devices.make(devices.tested, m);
    const CacheAndPool cp = make_cache(c, spec, backend->memory());
    CachedDecoder exact(*backend), approx(*backend, *cp.cache);
    const std::int64_t limit = variant_info(s.variant).exact_up_to(spec);
    const std::vector<int> tokens = draw_tokens(c, c.max_seq);
    for (int T = 1; T <= c.max_seq; T++) {
        const LogitError e =
            compare_logits(exact.decode(tokens[std::size_t(T - 1)]), approx.decode(tokens[std::size_t(T - 1)]));
        if (T > limit) summary.add(e);
    }
}

// Exact while T is inside the variant's regime, and shown to differ beyond it; the figures are
// its drift beyond (regime_drift).
VerifyRow run_regime(const Check& check, const Devices& d, const VerifyOptions& o) {
    const VariantSetting& s = *check.setting;
    const std::string_view limit = variant_info(s.variant).exact_limit;
    Reach in_reach = reach_for(check.name, d, o), all_reach = reach_for(check.name, d, o);
    const PropertyOutcome inside =
        check_reaching(in_reach, d, o, [&](const Devices& w) { decode_property(s, w, Mutant::none); });
    const PropertyOutcome everywhere =
        check_reaching(all_reach, d, o, [&](const Devices& w) { decode_property(s, w, Mutant::none, true); });
    VerifyRow row{check.name, check.kind, check.parameters, inside.cases, "", false, "", ""};
    row.ok = inside.passed && !everywhere.passed;
    row.result = !inside.passed      ? fmt::format("FAILED inside T <= {}", limit)
                 : everywhere.passed ? fmt::format("never differed (expected to beyond {})", limit)
                                     : fmt::format("bitwise equal while T <= {}; differs beyond", limit);
    row.counterexample = inside.passed ? everywhere.counterexample : inside.counterexample;
    set_counterexample_sizes(row, inside.passed ? all_reach : in_reach);
    // A measurement, not a search: a few dozen texts of 32 steps say it, at any --cases.
    ErrorSummary drift;
    check_property([&] { regime_drift(s, d, drift); }, std::min(o.cases, 25), o.seed);
    if (drift.steps > 0)
        row.figures = fmt::format(
            "beyond {} (stories260K shape, max_seq 32, {} steps): max |dlogit| {:.3g}, mean KL {:.3g}, top-1 "
            "agreement {:.1f}%",
            limit, drift.steps, drift.max_abs, drift.mean_kl(), 100.0 * drift.top1_rate());
    return row;
}

// An approximate row with an error bound: within it (property(true, summary)) and never bitwise
// equal (property(false, nullptr)); the figures are the errors measured.
VerifyRow run_bounded(const Check& check, const VerifyOptions& o,
                      const std::function<void(bool bound, ErrorSummary* summary)>& property, double max_abs, double kl,
                      const std::string& where) {
    ErrorSummary summary;
    const PropertyOutcome within = check_property([&] { property(true, &summary); }, o.cases, o.seed);
    const PropertyOutcome equal = check_property([&] { property(false, nullptr); }, o.cases, o.seed);
    VerifyRow row{
        check.name,   check.kind, fmt::format("{}; |dlogit| <= {}, KL <= {}{}", check.parameters, max_abs, kl, where),
        within.cases, "",         false,
        "",           ""};
    row.ok = within.passed && !equal.passed;
    row.result = !within.passed ? "FAILED its error bound" : equal.passed ? "never differed" : "within bound; differs";
    row.counterexample = within.passed ? equal.counterexample : within.counterexample;
    set_counterexample_sizes(row, Reach{});  // the T its verdict names
    row.figures = fmt::format("max |dlogit| {:.3g}, max KL {:.3g}, mean KL {:.3g}, top-1 agreement {:.1f}%",
                              summary.max_abs, summary.max_kl, summary.mean_kl(), 100.0 * summary.top1_rate());
    return row;
}

VerifyRow run_quant(const Check& check, const Devices& d, const VerifyOptions& o) {
    const VariantSetting& s = *check.setting;
    const QuantBound& b = quant_bound(setting_spec(s, quant_config()));
    const std::string where =
        quant_device(d) == d.tested ? "" : fmt::format(" (on {}: quantizing is host-side)", quant_device(d));
    return run_bounded(
        check, o, [&](bool bound, ErrorSummary* summary) { quant_property(s, d, bound, summary); }, b.max_abs, b.kl,
        where);
}

VerifyRow run_drift(const Check& check, const Devices& d, const VerifyOptions& o) {
    const KVFormat f = *check.drift;
    const FormatBound& b = format_bound(f);
    return run_bounded(
        check, o, [&](bool bound, ErrorSummary* summary) { drift_property(f, d, bound, summary); }, b.max_abs, b.kl,
        "");
}

VerifyRow run_check(const Check& check, const Devices& d, const VerifyOptions& o) {
    if (check.kind == "exact") return run_exact(check, d, o);
    if (check.drift) return run_drift(check, d, o);
    return check.setting->variant == Variant::quantized ? run_quant(check, d, o) : run_regime(check, d, o);
}

// Whether `which` (a name verify() accepts) selects the check.
bool selects(std::string_view which, const Check& c) {
    return which == "all" || which == c.name || which == c.kind ||
           (c.setting && which == to_string(c.setting->variant));
}

// The devices, format, attention and profile VerifyOptions name (throws Error for a bad one).
Devices devices_of(const VerifyOptions& o) {
    const std::vector<std::string> devices = parse_devices(o.device);
    Devices d{devices.front(), devices.back(), o.make_backend, std::nullopt, std::nullopt, false};
    if (!o.kv_format.empty()) d.format = parse_kv_format(o.kv_format);
    if (!o.attention.empty()) d.attention = parse_attention(o.attention, o.tile);
    if (o.profile != "fast" && o.profile != "long")
        throw Error(fmt::format("verify: unknown profile '{}' (fast, long)", o.profile));
    d.long_profile = o.profile == "long";
    if (!d.make) d.make = [](std::string_view device, const Model& m) { return make_backend(device, m); };
    if (const std::string why = d.tested == "gpu" ? gpu_unavailable() : ""; !why.empty()) throw Error(why);
    return d;
}

}  // namespace

void check_verify_options(const VerifyOptions& o) {
    if (o.cases < 1) throw Error(fmt::format("verify: --cases must be at least 1, not {}", o.cases));
    devices_of(o);
}

VerifyRow verify_plugin(const std::string& path, const VerifyOptions& o) {
    check_verify_options(o);  // a bad option is refused before the plugin loads
    const CachePlugin plugin(path);
    return verify_plugin(plugin, o);
}

// What a plugin's check draws, from what the plugin declares: its sizes, the operations, and
// those left out (with why), so that a report says what was not checked.
std::string plugin_parameters(const CachePlugin& plugin, const Devices& d, const VerifyOptions& o) {
    const std::string sizes = d.long_profile
                                  ? "thin models to position 8191 and any KV format, pools of up to 24576 slots"
                                  : "any model (half the time a thin one to position 257) and KV format, pools";
    std::vector<std::string> ops{"prompts", "batched chunks and decode", "finished requests", "fills to a refusal"},
        left;
    const auto either = [&](bool has, const std::string& op, const std::string& why) {
        if (has)
            ops.push_back(op);
        else
            left.push_back(fmt::format("{} ({})", op, why));
    };
    either(plugin.reuses_prefixes(), "prefix reuse", "no attach_prefix");
    if (!plugin.one_sequence()) either(plugin.can_fork(), "forks", "no fork");
    either(plugin.releases_part(), "rollbacks and speculative decoding",
           "release is NULL: sequences are freed only whole, so preemption and recompute stand in");
    if (!plugin.releases_part()) ops.push_back("preemption and recompute");
    if (plugin.has_step_done()) ops.push_back("step_done after every forward pass (its moves checked)");
    int most = d.long_profile ? 64 : 8;
    std::string whose;
    if (plugin.max_sequences() > 0 && plugin.max_sequences() <= most)
        most = plugin.max_sequences(), whose = "the plugin's";
    if (o.max_sequences > 0 && o.max_sequences <= most) most = o.max_sequences, whose = "--max-sequences";
    const std::vector<int> sizes_drawn = plugin_block_sizes(plugin, o);
    std::string block_sizes = fmt::format("block sizes 1-{}", d.long_profile ? 64 : 16);
    if (!sizes_drawn.empty()) {
        block_sizes = "block sizes ";
        for (std::size_t i = 0; i < sizes_drawn.size(); i++)
            block_sizes += fmt::format("{}{}", i ? ", " : "", sizes_drawn[i]);
        block_sizes += o.block_sizes.empty() ? " (the plugin's)" : " (--block-sizes)";
    }
    std::string text = plugin.one_sequence()
                           ? fmt::format("version 1: {}, one sequence", sizes)
                           : fmt::format("{} of 1-{} sequences{}, {}, a third roomy, else filled", sizes, most,
                                         whose.empty() ? "" : " (" + whose + ")", block_sizes);
    for (std::size_t i = 0; i < ops.size(); i++) text += (i == 0 ? ": " : ", ") + ops[i];
    for (std::size_t i = 0; i < left.size(); i++) text += (i == 0 ? "; left out: " : ", ") + left[i];
    return text;
}

VerifyRow verify_plugin(const CachePlugin& plugin, const VerifyOptions& o) {
    if (o.cases < 1) throw Error(fmt::format("verify: --cases must be at least 1, not {}", o.cases));
    const Devices d = devices_of(o);
    const std::string parameters = plugin_parameters(plugin, d, o);  // refuses block sizes the plugin takes none of
    Reach reach;  // no progress line: the plugin's family writes its own
    const auto property = reach.around([&] { plugin_property(plugin, d, o, reach); });
    PropertyOutcome r;
    if (o.time_limit <= 0) {
        r = check_property(property, o.cases, o.seed);
    } else {
        // Rounds of 10 cases (round k seeded seed + k) until the cases are done, one fails, or the
        // time is up; the row counts the cases run.
        const auto t0 = std::chrono::steady_clock::now();
        r.passed = true;
        for (std::uint64_t round = 0; r.passed && r.cases < o.cases; round++) {
            if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= o.time_limit) break;
            const int before = r.cases;
            r = check_property(property, std::min(10, o.cases - before), o.seed + round);
            r.cases += before;
        }
    }
    VerifyRow row{
        fmt::format("plugin {}", plugin.name()), "exact",  parameters,       r.cases,
        r.passed ? "bitwise equal" : "FAILED",   r.passed, r.counterexample, reach.text(d.long_profile, true)};
    set_counterexample_sizes(row, reach);
    if (!r.passed) row.replay_log = reach.replay_log;
    if (r.passed && r.cases < o.cases)
        row.figures += fmt::format("{}the time limit ({} s) ended the run after {} of {} cases",
                                   row.figures.empty() ? "" : "; ", o.time_limit, r.cases, o.cases);
    return row;
}

std::vector<VerifyEntry> verify_list() {
    std::vector<VerifyEntry> list{{"all", "group", "every row below"},
                                  {"exact", "group", "the exact rows"},
                                  {"approximate", "group", "the approximate rows"},
                                  {"mutants", "group", "every planted bug"}};
    for (const VariantInfo& v : variant_table()) {
        const std::string kind = v.exact ? "exact" : "approximate";
        list.push_back({std::string(v.name), kind, fmt::format("{}; {}", v.summary, v.regime), true});
        for (const VariantSetting& s : variant_settings(v.id))
            if (s.preset) list.push_back({s.name, kind, std::string(s.preset->about), true});
    }
    for (const Check& c : checks())
        if (!c.setting) list.push_back({c.name, c.kind, c.about});
    for (const MutantInfo& m : kMutants)
        list.push_back({std::string(m.name), "mutant", fmt::format("{} (caught by: {})", m.bug, m.check)});
    return list;
}

std::vector<std::string> verify_names() {
    std::vector<std::string> names;
    for (const VerifyEntry& e : verify_list()) names.push_back(e.name);
    return names;
}

std::vector<VerifyRow> verify(std::string_view which, const VerifyOptions& o) {
    if (o.cases < 1) throw Error(fmt::format("verify: --cases must be at least 1, not {}", o.cases));
    const std::vector<std::string> names = verify_names();
    if (std::find(names.begin(), names.end(), which) == names.end()) {
        std::string list;
        for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
        throw Error(fmt::format("verify: unknown variant '{}' (one of: {})", which, list));
    }
    const Devices d = devices_of(o);
    std::vector<const Check*> exact;
    std::vector<const MutantInfo*> mutants;
    for (const Check& c : checks())
        if (selects(which, c)) exact.push_back(&c);
    for (const MutantInfo& m : kMutants)
        if (which == "all" || which == "mutants" || which == m.name) mutants.push_back(&m);
    const std::size_t n = exact.size() + mutants.size();
    std::vector<VerifyRow> rows;
    const auto next = [&](std::string_view name) {
        if (o.progress) o.progress(fmt::format("verify: row {} of {}: {}", rows.size() + 1, n, name));
    };
    for (const Check* c : exact) next(c->name), rows.push_back(run_check(*c, d, o));
    for (const MutantInfo* m : mutants) next(m->name), rows.push_back(run_mutant(*m, d, o));
    return rows;
}

}  // namespace kvlab
