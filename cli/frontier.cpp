// kvlab frontier: every cache strategy's quality against its KV bytes per token, and the Pareto
// front of the two.
//
// Each setting (the KV formats on contiguous-head, the quantized presets, window, fifo and h2o
// budgets, mean-pooled GQA conversions of the model) decodes the same texts, which the model
// wrote itself from a story opening, so they are in-distribution. Its cache (make_cache: the
// registry's own) prefills the first part, then decodes the rest a token a step, teacher-forced,
// and every step's logits are compared with exact decode's (contiguous-head fp32, bitwise equal
// to naive decode): KL(exact || approx) and top-1. Its KV bytes per token is the cache's
// MemoryStats::used_bytes over the context length T of the step. A recall probe asks each
// setting for a name the text stated about a hundred tokens before.
#include "frontier.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "approx_metrics.h"
#include "cache_factory.h"
#include "commands.h"
#include "common.h"
#include "decode.h"
#include "json_text.h"
#include "kernels.h"
#include "mla.h"
#include "plot.h"
#include "sampler.h"

namespace kvlab::cli {

std::vector<bool> pareto_front(std::span<const ParetoPoint> points) {
    std::vector<std::size_t> order;  // the finite points, by bytes then KL
    for (std::size_t i = 0; i < points.size(); i++)
        if (std::isfinite(points[i].bytes) && std::isfinite(points[i].kl)) order.push_back(i);
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return std::pair(points[a].bytes, points[a].kl) < std::pair(points[b].bytes, points[b].kl);
    });
    std::vector<bool> front(points.size(), false);
    double best = std::numeric_limits<double>::infinity();  // the lowest KL of any point with fewer bytes
    for (std::size_t g = 0; g < order.size();) {
        // Points of equal bytes: only the lowest KL of them can be undominated, and only when
        // everything with fewer bytes has a higher KL.
        std::size_t end = g;
        while (end < order.size() && points[order[end]].bytes == points[order[g]].bytes) end++;
        const double lowest = points[order[g]].kl;
        for (std::size_t k = g; k < end; k++) front[order[k]] = points[order[k]].kl == lowest && lowest < best;
        best = std::min(best, lowest);
        g = end;
    }
    return front;
}

namespace {

// wk or wv [n_layers, kv_dim, dim] of `c` pooled into `to` [n_layers, kv_dim / g, dim]: new head j
// is the mean of heads j * g .. j * g + g - 1, summed in double (exact for g equal floats).
void pool_rows(const Config& c, int g, std::span<const float> from, std::span<float> to) {
    const std::size_t hs = std::size_t(c.head_size()), dim = std::size_t(c.dim), kv_dim = std::size_t(c.kv_dim());
    assert(from.size() == std::size_t(c.n_layers) * kv_dim * dim);
    assert(to.size() == std::size_t(c.n_layers) * (kv_dim / std::size_t(g)) * dim);
    const std::size_t pooled_heads = std::size_t(c.n_kv_heads / g);
    for (std::size_t l = 0; l < std::size_t(c.n_layers); l++)
        for (std::size_t j = 0; j < pooled_heads; j++)
            for (std::size_t r = 0; r < hs; r++)
                for (std::size_t i = 0; i < dim; i++) {
                    double sum = 0;
                    for (std::size_t k = 0; k < std::size_t(g); k++)
                        sum += from[((l * kv_dim) + (j * g + k) * hs + r) * dim + i];
                    to[((l * pooled_heads + j) * hs + r) * dim + i] = float(sum / g);
                }
}

}  // namespace

Model pool_kv_heads(const Model& model, int n_kv_heads) {
    const Config& c = model.config();
    if (n_kv_heads < 1 || c.n_kv_heads % n_kv_heads != 0)
        throw Error(fmt::format("GQA pooling: {} KV heads do not divide the model's n_kv_heads = {}", n_kv_heads,
                                c.n_kv_heads));
    Config pooled = c;
    pooled.n_kv_heads = n_kv_heads;
    Weights w(pooled, model.w.shared_classifier);
    const auto copy = [](std::span<const float> from, std::span<float> to) {
        assert(from.size() == to.size());
        std::copy(from.begin(), from.end(), to.begin());
    };
    const Weights& m = model.w;
    copy(m.token_embedding, w.token_embedding), copy(m.rms_att, w.rms_att), copy(m.wq, w.wq), copy(m.wo, w.wo);
    copy(m.rms_ffn, w.rms_ffn), copy(m.w1, w.w1), copy(m.w2, w.w2), copy(m.w3, w.w3), copy(m.rms_final, w.rms_final);
    if (!m.shared_classifier) copy(m.wcls, w.wcls);
    pool_rows(c, c.n_kv_heads / n_kv_heads, m.wk, w.wk);
    pool_rows(c, c.n_kv_heads / n_kv_heads, m.wv, w.wv);
    Model out(std::move(w));
    out.panel_cache = model.panel_cache;
    return out;
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr const char* kOpening = "Once upon a time";
constexpr int kBudgets[] = {16, 32, 64, 128, 256};  // window, fifo and h2o: positions kept
constexpr int kWindowSinks[] = {4, 0};

// A strategy family: one colour and marker in the plot.
struct Family {
    const char* name;
    Rgb colour;
    Marker marker;
};
constexpr Family kFamilies[] = {
    {"exact", {40, 40, 40}, Marker::square},
    {"kv format", {40, 96, 180}, Marker::diamond},
    {"quantized", {140, 80, 200}, Marker::triangle},
    {"window, 4 sinks", {214, 96, 24}, Marker::circle},
    {"window, 0 sinks", {235, 175, 30}, Marker::circle},
    {"fifo", {200, 40, 40}, Marker::cross},
    {"h2o", {40, 150, 80}, Marker::square},
    {"gqa, mean-pooled", {20, 160, 170}, Marker::diamond},
    {"mla, random model", {120, 120, 120}, Marker::triangle},
};

// One point of the frontier: a cache spec on the model, or on its GQA conversion, or an MLA rank.
struct Setting {
    std::string family, name;
    CacheSpec spec;
    int n_kv_heads = 0;  // > 0: decoded on pool_kv_heads(model, n_kv_heads)
    int mla_rank = 0;    // > 0: the random MLA model cut to this rank (truncate_rank), against its full rank
};

// The random MLA model of the frontier: the checkpoint's shape, a latent as wide as its heads'
// keys (n_heads * head_size) and a RoPE key of one head's width; its ranks are cut from it.
MlaConfig frontier_mla_config(const Config& c) {
    MlaConfig m;
    m.base = c;
    m.base.n_kv_heads = c.n_heads;
    m.rank = c.n_heads * c.head_size();
    m.rope_dim = c.head_size() - c.head_size() % 2;
    return m;
}
constexpr int kMlaDivisors[] = {16, 8, 4, 2, 1};  // ranks measured: the full rank over these

// The settings measured.
std::vector<Setting> frontier_settings(const Config& c) {
    std::vector<Setting> out;
    const CacheSpec exact = default_spec(Variant::contiguous_head, c);
    out.push_back({"exact", "fp32 (exact)", exact});
    for (KVFormat f : kKVFormats) {
        if (f == KVFormat::fp32) continue;
        CacheSpec s = exact;
        s.kv_format = f;
        out.push_back({"kv format", kv_format_name(f), s});
    }
    for (const VariantSetting& v : variant_settings(Variant::quantized))
        out.push_back({"quantized", v.name, setting_spec(v, c)});
    const auto add = [&](const std::string& family, Variant v, const std::string& shown, const std::string& settings) {
        CacheSpec spec = default_spec(v, c);
        apply_settings(spec, shown + settings);
        out.push_back({family, fmt::format("{} {}", to_string(v), shown), spec});
    };
    // chunk 1: the ring holds sinks + window rows (window + chunk - 1 after the sinks), as a
    // decode of one token a step needs (the prefill then runs a row at a time).
    for (int sinks : kWindowSinks)
        for (int w : kBudgets)
            add(fmt::format("window, {} sinks", sinks), Variant::window, fmt::format("sinks={},window={}", sinks, w),
                ",chunk=1");
    for (int w : kBudgets) add("fifo", Variant::fifo, fmt::format("window={}", w), ",chunk=1");
    for (int b : kBudgets) add("h2o", Variant::h2o, fmt::format("recent={},heavy={}", b / 2, b - b / 2), "");
    for (int n = c.n_kv_heads - 1; n >= 1; n--)
        if (c.n_kv_heads % n == 0) out.push_back({"gqa, mean-pooled", fmt::format("gqa n_kv_heads={}", n), exact, n});
    const MlaConfig mla = frontier_mla_config(c);
    for (int d : kMlaDivisors)
        if (mla.rank % d == 0 && mla.rank / d >= 1)
            out.push_back({"mla, random model", fmt::format("mla rank={}", mla.rank / d), exact, 0, mla.rank / d});
    return out;
}

// A text every setting decodes: a prefill of its first `prefill` tokens, then one token a step.
struct Sequence {
    std::vector<int> tokens;
    int prefill = 1;
    int answer_at = -1, answer_len = 0;  // a probe: tokens[answer_at .. answer_at + answer_len) are scored
    std::vector<float> exact;            // [tokens - prefill, vocab_size] exact decode's logits per decoded position
};

// `tokens` continued on exact decode to `length` tokens, sampled as llama2.c samples by default
// (temperature 1, top-p 0.9) from `seed`; `banned` (>= 0) is never drawn.
std::vector<int> continue_text(const Model& model, std::vector<int> tokens, int length, std::uint64_t seed, int banned,
                               int threads) {
    if (int(tokens.size()) >= length) {
        tokens.resize(std::size_t(length));
        return tokens;
    }
    CachedDecoder dec(model, threads);
    Sampler sampler(model.config().vocab_size, 1.0f, 0.9f, splitmix64_finalize(seed) | 1);  // xorshift: not 0
    std::vector<float> logits = dec.prefill(tokens);
    while (int(tokens.size()) < length) {
        if (banned >= 0 && model.config().vocab_size > 1) logits[std::size_t(banned)] = -INFINITY;
        tokens.push_back(sampler.sample(logits));
        if (int(tokens.size()) < length) logits = dec.decode(tokens.back());
    }
    return tokens;
}

// The recall probe's pieces as tokens: the text below through the tokenizer, or for a model
// without one (a random model) fixed ids in the same roles.
constexpr const char* kProbeIntro = "Once upon a time, there was a boy named";
constexpr const char* kProbeCue = "One day, the boy named";
constexpr const char* kProbeNames[] = {"Ben", "Bob", "Jack", "Sam"};
struct ProbeParts {
    std::vector<int> intro, period, cue;
    std::vector<std::vector<int>> names;
    std::vector<int> sentence(std::size_t k) const {  // "<intro> <name k>."
        std::vector<int> s = intro;
        s.insert(s.end(), names[k].begin(), names[k].end());
        s.insert(s.end(), period.begin(), period.end());
        return s;
    }
};

ProbeParts probe_parts(const LoadedModel& lm) {
    ProbeParts p;
    const int V = lm.model.config().vocab_size;
    if (lm.tokenizer) {
        p.intro = lm.tokenizer->encode(kProbeIntro, true, false);
        p.cue = lm.tokenizer->encode(kProbeCue, false, false);  // its dummy prefix: " One day"
        if (const int dot = lm.tokenizer->lookup("."); dot >= 0) p.period = {dot};
        for (const char* name : kProbeNames) p.names.push_back(lm.tokenizer->encode(name, false, false));
        return p;
    }
    SplitMix64 rng(2024);
    const auto id = [&] { return int(rng.next() % std::uint64_t(V)); };
    p.intro = {Tokenizer::kBos % V, id(), id(), id()};
    p.cue = {p.intro[2], p.intro[3]};
    for (std::size_t i = 0; i < std::size(kProbeNames); i++) p.names.push_back({id()});
    return p;
}

// The filler between fact and cue: `gap` tokens at most, fewer when the longest probe would not
// fit in `length` (-1: not even without filler).
int probe_gap(const ProbeParts& p, int length, int gap) {
    std::size_t longest = 0;
    for (std::size_t k = 0; k < p.names.size(); k++)
        longest = std::max(longest, p.sentence(k).size() + p.cue.size() + p.names[k].size());
    return std::min(gap, length - int(longest));
}

// One probe per name: "<intro> <name>." (the prefill), the model's own continuation of it for
// `gap` tokens (never the name's first token, so only the fact holds the name), then the cue; the
// name's tokens are scored. The first sentence states name k + shift: shift 0 is the probe, 1 what
// exact decode makes of it with another name in the fact.
std::vector<Sequence> recall_probes(const LoadedModel& lm, const ProbeParts& p, int gap, int shift, std::uint64_t seed,
                                    int threads) {
    std::vector<Sequence> out;
    for (std::size_t k = 0; k < p.names.size() && gap >= 0; k++) {
        const std::vector<int> fact = p.sentence(k), told = p.sentence((k + std::size_t(shift)) % p.names.size());
        const std::vector<int> text =
            continue_text(lm.model, fact, int(fact.size()) + gap, seed + 1000 + k, p.names[k][0], threads);
        Sequence s;
        s.tokens = told;
        s.tokens.insert(s.tokens.end(), text.begin() + std::ptrdiff_t(fact.size()), text.end());
        s.tokens.insert(s.tokens.end(), p.cue.begin(), p.cue.end());
        s.answer_at = int(s.tokens.size()), s.answer_len = int(p.names[k].size());
        s.tokens.insert(s.tokens.end(), p.names[k].begin(), p.names[k].end());
        s.prefill = int(told.size());
        out.push_back(std::move(s));
    }
    return out;
}

using StepFn = std::function<void(int pos, const std::vector<float>& logits, const Cache& cache)>;

// s.tokens on a fresh cache of `spec`: a prefill of the first s.prefill, then one token a step;
// `step` sees each decoded position's logits and the cache after it.
void decode_along(const Model& model, const CacheSpec& spec, const Sequence& s, int threads, const StepFn& step) {
    CacheAndPool cp = make_cache(model.config(), spec);
    CachedDecoder dec(model, *cp.cache, threads);
    dec.prefill(std::span<const int>(s.tokens).first(std::size_t(s.prefill)));
    for (std::size_t pos = std::size_t(s.prefill); pos < s.tokens.size(); pos++)
        step(int(pos), dec.decode(s.tokens[pos]), *cp.cache);
}

// The reference every setting is measured against: exact decode's logits at each decoded position.
void decode_exact(const Model& model, Sequence& s, int threads) {
    const std::size_t V = std::size_t(model.config().vocab_size);
    s.exact.clear();
    decode_along(model, default_spec(Variant::contiguous_head, model.config()), s, threads,
                 [&](int, const std::vector<float>& logits, const Cache&) {
                     s.exact.insert(s.exact.end(), logits.begin(), logits.end());
                 });
    assert(s.exact.size() == (s.tokens.size() - std::size_t(s.prefill)) * V);
}

// The probes' mean log-probability of their answers (each the sum over its tokens, each under the
// logits of the position before it); NaN without probes.
double probe_logprob(const Model& model, const CacheSpec& spec, const std::vector<Sequence>& probes, int threads) {
    if (probes.empty()) return kNaN;
    double sum = 0;
    for (const Sequence& s : probes)
        decode_along(model, spec, s, threads, [&](int pos, const std::vector<float>& logits, const Cache&) {
            const int next = pos + 1;  // the token these logits predict
            if (next >= s.answer_at && next < s.answer_at + s.answer_len)
                sum += token_logprob(logits.data(), int(logits.size()), s.tokens[std::size_t(next)]);
        });
    return sum / double(probes.size());
}

struct Result {
    Setting setting;
    ErrorSummary err = {};
    double bytes_per_token = 0, bytes_per_position = 0;  // means over the steps measured
    double probe = kNaN;                                 // the probes' mean log-probability
    double seconds = 0;
    bool pareto = false;
};

// Positions whose rows the cache holds (layer 0, KV head 0's, for a cache that keeps other
// positions per head; h2o keeps as many in every one).
int held_positions(const Cache& cache) {
    int n = 0;
    for (int t = 0; t < cache.length(); t++) n += cache.slot(t) >= 0;
    return n;
}

Result measure(const Model& model, const Setting& st, const std::vector<Sequence>& texts,
               const std::vector<Sequence>& probes, int threads) {
    const auto t0 = std::chrono::steady_clock::now();
    Result r{st};
    const std::size_t V = std::size_t(model.config().vocab_size);
    double bytes = 0, per_position = 0;
    for (const Sequence& s : texts)
        decode_along(model, st.spec, s, threads, [&](int pos, const std::vector<float>& logits, const Cache& cache) {
            const std::size_t i = std::size_t(pos - s.prefill);
            r.err.add(compare_logits(std::span<const float>(s.exact).subspan(i * V, V), logits));
            const double used = double(cache.memory().used_bytes);
            bytes += used / (pos + 1), per_position += used / std::max(1, held_positions(cache));
        });
    r.bytes_per_token = bytes / std::max(1, r.err.steps);
    r.bytes_per_position = per_position / std::max(1, r.err.steps);
    r.probe = probe_logprob(model, st.spec, probes, threads);
    r.seconds = seconds_since(t0);
    return r;
}

// Everything one run measured, for the table, the JSON and the plot.
struct FrontierRun {
    std::string source;
    Config config;
    int length = 0, prefill = 0, gap = -1;
    bool probe_words = true;  // the probe is text through the tokenizer (false: fixed ids)
    std::vector<Sequence> texts, probes;
    double probe_other_fact = kNaN;  // exact decode's probe with another name in the fact
    std::vector<Result> results;     // by bytes per token
    double seconds = 0;
};

// The texts, the probes and exact decode's logits of each.
void prepare(const LoadedModel& lm, const FrontierOptions& o, FrontierRun& run, const Progress& progress) {
    const std::vector<int> opening = prompt_tokens(lm, "", "", kOpening);
    for (int i = 0; i < o.prompts; i++) {
        progress(fmt::format("frontier: writing text {} of {}", i + 1, o.prompts));
        Sequence s;
        s.tokens = continue_text(lm.model, opening, run.length, o.seed + std::uint64_t(i), -1, o.threads);
        s.prefill = run.prefill;
        decode_exact(lm.model, s, o.threads);
        run.texts.push_back(std::move(s));
    }
    const ProbeParts parts = probe_parts(lm);
    run.probe_words = lm.tokenizer.has_value();
    run.gap = probe_gap(parts, run.length, o.probe_gap);
    run.probes = recall_probes(lm, parts, run.gap, 0, o.seed, o.threads);
    run.probe_other_fact = probe_logprob(lm.model, default_spec(Variant::contiguous_head, run.config),
                                         recall_probes(lm, parts, run.gap, 1, o.seed, o.threads), o.threads);
}

// The texts' tokens through an MLA model in the absorbed form (the engines' form): a prefill, then
// a token a step; `step` sees each decoded position's logits and the cache after it.
void mla_along(const MlaModel& m, const Sequence& s,
               const std::function<void(int pos, const std::vector<float>&, const MlaCache&)>& step) {
    MlaCache cache(m.config);
    MlaDecoder dec(m, cache, MlaForm::absorbed);
    dec.prefill(std::span<const int>(s.tokens).first(std::size_t(s.prefill)));
    for (std::size_t pos = std::size_t(s.prefill); pos < s.tokens.size(); pos++)
        step(int(pos), dec.decode(s.tokens[pos]), cache);
}

// An MLA rank against the random MLA model's full rank, over the checkpoint's texts (the same
// vocabulary); `exact`: the full rank's logits, per text [decoded steps, vocab_size].
Result measure_mla(const MlaModel& full, const std::vector<std::vector<float>>& exact, const Setting& st,
                   const std::vector<Sequence>& texts) {
    const auto t0 = std::chrono::steady_clock::now();
    Result r{st};
    const MlaModel cut = st.mla_rank == full.config.rank ? full : truncate_rank(full, st.mla_rank);
    const std::size_t V = std::size_t(full.config.base.vocab_size);
    double bytes = 0;
    for (std::size_t k = 0; k < texts.size(); k++)
        mla_along(cut, texts[k], [&](int pos, const std::vector<float>& logits, const MlaCache& cache) {
            const std::size_t i = std::size_t(pos - texts[k].prefill);
            r.err.add(compare_logits(std::span<const float>(exact[k]).subspan(i * V, V), logits));
            bytes += double(cache.used_bytes()) / (pos + 1);
        });
    r.bytes_per_token = r.bytes_per_position = bytes / std::max(1, r.err.steps);
    r.seconds = seconds_since(t0);
    return r;
}

// The random MLA model (seeded by --seed) and its full rank's logits on every text.
std::pair<MlaModel, std::vector<std::vector<float>>> mla_reference(const FrontierRun& run, std::uint64_t seed) {
    MlaModel full = random_mla_model(frontier_mla_config(run.config), seed);
    std::vector<std::vector<float>> exact;
    for (const Sequence& s : run.texts) {
        exact.emplace_back();
        mla_along(full, s, [&](int, const std::vector<float>& logits, const MlaCache&) {
            exact.back().insert(exact.back().end(), logits.begin(), logits.end());
        });
    }
    return {std::move(full), std::move(exact)};
}

void measure_all(const LoadedModel& lm, const FrontierOptions& o, const std::vector<Setting>& settings,
                 FrontierRun& run, const Progress& progress) {
    std::map<int, Model> pooled;                                              // n_kv_heads -> the GQA conversion
    std::optional<std::pair<MlaModel, std::vector<std::vector<float>>>> mla;  // built at the first MLA rank
    for (std::size_t i = 0; i < settings.size(); i++) {
        const Setting& st = settings[i];
        progress(fmt::format("frontier: setting {} of {}: {}", i + 1, settings.size(), st.name));
        if (st.mla_rank > 0) {
            if (!mla) mla = mla_reference(run, o.seed);
            run.results.push_back(measure_mla(mla->first, mla->second, st, run.texts));
            continue;
        }
        if (st.n_kv_heads > 0 && !pooled.contains(st.n_kv_heads))
            pooled.emplace(st.n_kv_heads, pool_kv_heads(lm.model, st.n_kv_heads));
        run.results.push_back(
            measure(st.n_kv_heads > 0 ? pooled.at(st.n_kv_heads) : lm.model, st, run.texts, run.probes, o.threads));
    }
    // The front is the checkpoint's: the MLA ranks measure another model.
    std::vector<ParetoPoint> points;
    for (const Result& r : run.results)
        points.push_back({r.bytes_per_token, r.setting.mla_rank > 0 ? kNaN : r.err.mean_kl()});
    const std::vector<bool> front = pareto_front(points);
    for (std::size_t i = 0; i < run.results.size(); i++) run.results[i].pareto = front[i];
    std::stable_sort(run.results.begin(), run.results.end(),
                     [](const Result& a, const Result& b) { return a.bytes_per_token < b.bytes_per_token; });
}

const Result& exact_result(const FrontierRun& run) {
    for (const Result& r : run.results)
        if (r.setting.family == "exact") return r;
    throw Error("frontier: no exact setting was measured");
}

int steps_per_text(const FrontierRun& run) { return run.length - run.prefill; }

std::string probe_text(const FrontierRun& run) {
    if (run.probes.empty()) return fmt::format("none: it does not fit in --length {}", run.length);
    if (!run.probe_words)
        return fmt::format(
            "no tokenizer: fixed ids as intro + name, {} tokens, the intro's last two ids -> name ({} names)", run.gap,
            run.probes.size());
    std::string names;
    for (const char* n : kProbeNames) names += (names.empty() ? "" : ", ") + std::string(n);
    return fmt::format("\"{} NAME.\" + {} tokens + \"{}\" -> NAME ({})", kProbeIntro, run.gap, kProbeCue, names);
}

// A table cell of `width`: the number in `spec` ("{:>8.3f}"), or "-" for none (NaN: no probe).
std::string cell(double x, int width, const char* spec) {
    return std::isfinite(x) ? fmt::format(fmt::runtime(spec), x) : fmt::format("{:>{}}", "-", width);
}

void print_text(const FrontierRun& run, int threads) {
    const Result& exact = exact_result(run);
    fmt::print("kvlab frontier: {} ({})\n", run.source, run.config.describe());
    fmt::print(
        "texts      {} of {} tokens the model wrote from \"{}\"; each cache prefills {}, then decodes {} "
        "teacher-forced: {} steps against exact decode (contiguous-head fp32)\n",
        run.texts.size(), run.length, kOpening, run.prefill, steps_per_text(run), exact.err.steps);
    if (run.probes.empty())
        fmt::print("probe      {}\n", probe_text(run));
    else
        fmt::print("probe      {}: exact log p {:.3f} ({:.3f} with another name in the fact)\n", probe_text(run),
                   exact.probe, run.probe_other_fact);
    fmt::print("\n{:<28} {:<17} {:>8} {:>7} {:>10} {:>10} {:>7} {:>8} {:>8}  {}\n", "setting", "family", "B/token",
               "B/pos", "mean KL", "max KL", "top-1", "probe", "d probe", "pareto");
    for (const Result& r : run.results)
        fmt::print("{:<28} {:<17} {:>8.1f} {:>7.1f} {:>10.3g} {:>10.3g} {:>6.1f}% {} {}  {}\n", r.setting.name,
                   r.setting.family, r.bytes_per_token, r.bytes_per_position, r.err.mean_kl(), r.err.max_kl,
                   100.0 * r.err.top1_rate(), cell(r.probe, 8, "{:>8.3f}"), cell(r.probe - exact.probe, 8, "{:>+8.3f}"),
                   r.pareto ? "*" : "");
    const auto on_front =
        std::count_if(run.results.begin(), run.results.end(), [](const Result& r) { return r.pareto; });
    fmt::print("\npareto     *: no other setting has bytes per token and mean KL both at most its own ({} of {})\n",
               on_front, run.results.size());
    fmt::print(
        "B/token    the cache's used_bytes / T after each step, mean over the steps; B/pos: per position held\n");
    fmt::print("probe      mean log p of the name; d probe: minus exact decode's\n");
    if (std::any_of(run.results.begin(), run.results.end(), [](const Result& r) { return r.setting.mla_rank > 0; }))
        fmt::print(
            "mla        a random MLA model of this shape (not the checkpoint), each rank cut from its full rank "
            "(truncate_rank) and measured against it, absorbed form; no probe, and off the front: another model\n");
    fmt::print("time       {:.1f} s ({})\n", run.seconds, threads_text(threads));
}

nlohmann::json result_json(const Result& r, double exact_probe) {
    const VariantInfo& v = variant_info(r.setting.spec.variant);
    nlohmann::json params = nlohmann::json::object();
    for (const VariantParam& p : v.params) params[std::string(p.name)] = p.get(r.setting.spec);
    const auto number = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); };
    const int gqa = r.setting.n_kv_heads;
    return {{"name", r.setting.name},
            {"family", r.setting.family},
            {"variant", std::string(v.name)},
            {"params", params},
            {"kv_format", kv_format_name(r.setting.spec.kv_format)},
            {"gqa_n_kv_heads", gqa > 0 ? nlohmann::json(gqa) : nlohmann::json(nullptr)},
            {"mla_rank", r.setting.mla_rank > 0 ? nlohmann::json(r.setting.mla_rank) : nlohmann::json(nullptr)},
            {"bytes_per_token", r.bytes_per_token},
            {"bytes_per_position", r.bytes_per_position},
            {"mean_kl", number(r.err.mean_kl())},
            {"max_kl", number(r.err.max_kl)},
            {"max_abs", number(r.err.max_abs)},
            {"top1_rate", r.err.top1_rate()},
            {"steps", r.err.steps},
            {"probe_logprob", number(r.probe)},
            {"probe_delta", number(r.probe - exact_probe)},
            {"pareto", r.pareto},
            {"seconds", r.seconds}};
}

void print_json(const FrontierRun& run, const FrontierOptions& o) {
    const Result& exact = exact_result(run);
    const auto number = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); };
    nlohmann::json j = {{"model", run.source},
                        {"config", run.config.describe()},
                        {"prompts", o.prompts},
                        {"length", run.length},
                        {"prefill", run.prefill},
                        {"steps_per_prompt", steps_per_text(run)},
                        {"seed", o.seed},
                        {"threads", o.threads},
                        {"threads_choice", threads_json()},
                        {"reference", "contiguous-head fp32 (exact decode)"},
                        {"seconds", run.seconds}};
    j["probe"] = {{"text", probe_text(run)},
                  {"gap", run.probes.empty() ? nlohmann::json(nullptr) : nlohmann::json(run.gap)},
                  {"exact_logprob", number(exact.probe)},
                  {"other_fact_logprob", number(run.probe_other_fact)}};
    j["settings"] = nlohmann::json::array();
    for (const Result& r : run.results) j["settings"].push_back(result_json(r, exact.probe));
    fmt::print("{}\n", json_document(j));
}

// --plot: mean KL (log) against bytes per token (log2), a colour per family, the front as a line.
void write_frontier_plot(const FrontierRun& run, const std::string& path) {
    double smallest = INFINITY;  // the smallest non-zero mean KL
    for (const Result& r : run.results)
        if (r.err.mean_kl() > 0) smallest = std::min(smallest, r.err.mean_kl());
    // Half a decade under the smallest non-zero mean KL's decade: inside the axis, apart from the rest.
    const double floor = std::isfinite(smallest) ? std::pow(10.0, std::floor(std::log10(smallest)) - 0.5) : 1e-6;
    std::vector<PlotSeries> series;
    for (const Family& f : kFamilies) {
        PlotSeries s{f.name, f.colour, {}, false, false, f.marker, {}};
        for (const Result& r : run.results)
            if (r.setting.family == f.name) s.points.push_back({r.bytes_per_token, r.err.mean_kl()});
        if (!s.points.empty()) series.push_back(std::move(s));
    }
    PlotSeries front{"Pareto front", {90, 90, 90}, {}, false, true, Marker::none, {}};
    for (const Result& r : run.results)  // by bytes per token already
        if (r.pareto)
            front.points.push_back({r.bytes_per_token, r.err.mean_kl()}), front.labels.push_back(r.setting.name);
    series.insert(series.begin(), std::move(front));
    Chart chart{fmt::format("mean KL(exact || cache) against KV bytes per token: {}, {} texts of {} tokens",
                            std::filesystem::path(run.source).filename().string(), run.texts.size(), run.length),
                "KV bytes per token (used bytes / T, mean over the decode steps)", "mean KL, nats", std::move(series)};
    chart.y_floor = floor;
    chart.y_floor_label = fmt::format("mean KL 0 (bitwise exact) drawn at {:.2g}", floor);
    chart.width = 1300, chart.height = 720;
    write_charts_png(path, {chart});
}

}  // namespace

int run_frontier(const FrontierOptions& o) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!o.plot.empty()) check_plot_path("--plot", o.plot);  // before the run, not after it
    const LoadedModel lm = load_model(o.m.model, o.m.tokenizer, stories260k_shape(), o.m.seed, o.m.panel_cache);
    FrontierRun run;
    run.source = lm.source, run.config = lm.model.config();
    run.length = o.length > 0 ? o.length : run.config.max_seq;
    if (run.length < 2 || run.length > run.config.max_seq)
        throw Error(fmt::format("--length {} is outside 2..max_seq = {}", run.length, run.config.max_seq));
    run.prefill = o.prefill > 0 ? o.prefill : std::max(1, run.length / 4);
    if (run.prefill >= run.length)
        throw Error(fmt::format("--prefill {} leaves nothing to decode in --length {}", run.prefill, run.length));
    const std::vector<Setting> settings = frontier_settings(run.config);
    {
        const Progress progress;  // cleared before the table
        prepare(lm, o, run, progress);
        measure_all(lm, o, settings, run, progress);
    }
    run.seconds = seconds_since(t0);
    if (o.json)
        print_json(run, o);
    else
        print_text(run, o.threads);
    if (!o.plot.empty()) {
        write_frontier_plot(run, o.plot);
        if (!o.json) fmt::print("wrote {}\n", o.plot);
    }
    return 0;
}

}  // namespace kvlab::cli
