// kvlab bench: throughput of cached decode, naive decode, prefill, and a llama2.c-style
// sequential-dot decoder, all on one random model, in one run, with their logits compared.
// Figures are medians of --reps runs; compare them as ratios within a run (the machine is shared).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "approx_metrics.h"
#include "baseline.h"
#include "cache_factory.h"
#include "commands.h"
#include "common.h"
#include "compare.h"
#include "cost_model.h"
#include "decode.h"
#include "device.h"
#include "json_text.h"
#include "plot.h"

namespace kvlab::cli {

namespace {

template <class F>
double median_seconds(int reps, F&& run) {
    std::vector<double> t;
    for (int r = 0; r < reps; r++) {
        const auto t0 = std::chrono::steady_clock::now();
        run();
        t.push_back(seconds_since(t0));
    }
    std::sort(t.begin(), t.end());
    return t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) { return compare_bits(a, b).equal; }

// One cache variant at context length T: decode step time relative to the contiguous cache.
struct VariantRow {
    std::string name;   // the registry's: the variant, or "<variant>-<preset>"
    std::string cache;  // the cache's own description, with its parameters
    bool exact;
    double decode_s = 0;
    MemoryStats memory;
    bool equal = false;  // logits bitwise equal to the contiguous cache's
    double max_abs = 0;  // otherwise: the largest logit error
};

// The table's rows: every setting in the registry (core/cache_factory.h), at its defaults or
// preset, with --block-size and --group where the variant has that parameter. The yardstick,
// contiguous-head, is the registry's first.
std::vector<std::pair<VariantSetting, CacheSpec>> bench_specs(const Config& c, const BenchOptions& o) {
    std::vector<std::pair<VariantSetting, CacheSpec>> out;
    for (const VariantSetting& s : variant_settings()) {
        CacheSpec spec = default_spec(s.variant, c);
        const VariantInfo& info = variant_info(s.variant);
        if (const VariantParam* p = find_param(info, "block_size")) p->set(spec, o.block_size);
        if (const VariantParam* p = find_param(info, "group")) p->set(spec, o.group);
        if (s.preset) apply_settings(spec, s.preset->settings);
        out.emplace_back(s, spec);
    }
    return out;
}

// Decode one token at context length T on each variant, interleaved round by round so a noisy
// neighbour slows them alike, each round starting at another variant; each sample is the mean
// of `inner` steps (truncate, decode).
std::vector<VariantRow> bench_variants(const Model& model, std::span<const int> tokens, const BenchOptions& o) {
    const Config& c = model.config();
    const int T = int(tokens.size()), reps = o.reps, threads = o.threads;
    const auto specs = bench_specs(c, o);
    std::vector<CacheAndPool> variants;
    for (const auto& [setting, spec] : specs) variants.push_back(make_cache(c, spec));
    std::vector<std::unique_ptr<CachedDecoder>> decoders;
    for (auto& v : variants) {
        decoders.push_back(std::make_unique<CachedDecoder>(model, *v.cache, threads));
        if (T > 1) decoders.back()->prefill(tokens.first(T - 1));
    }
    std::vector<std::vector<double>> samples(variants.size());
    std::vector<std::vector<float>> logits(variants.size());
    const int inner = 8;
    for (int r = 0; r < reps; r++)
        for (std::size_t j = 0; j < variants.size(); j++) {
            const std::size_t i = (j + std::size_t(r)) % variants.size();  // no variant always goes first
            const auto t0 = std::chrono::steady_clock::now();
            for (int k = 0; k < inner; k++) {
                variants[i].cache->truncate(T - 1);
                logits[i] = decoders[i]->decode(tokens[T - 1]);
            }
            samples[i].push_back(seconds_since(t0) / inner);
        }
    std::vector<VariantRow> rows;
    for (std::size_t i = 0; i < variants.size(); i++) {
        std::sort(samples[i].begin(), samples[i].end());
        VariantRow row{specs[i].first.name,
                       variants[i].cache->name(),
                       is_exact(specs[i].first.variant),
                       samples[i][samples[i].size() / 2],
                       variants[i].cache->memory(),
                       bitwise_equal(logits[i], logits[0]),
                       0};
        row.max_abs = compare_logits(logits[0], logits[i]).max_abs;
        rows.push_back(row);
    }
    return rows;
}

// What the prefix cache saves: request B shares all but its last `suffix` tokens with A, which
// ran before it. B's prefill with the cache against B's prefill in a pool without one.
struct PrefixRow {
    int prompt = 0, hit = 0;
    double with_s = 0, without_s = 0;
    bool equal = false;
};

PrefixRow bench_prefix(const Model& model, std::span<const int> a, int suffix, int reps, int threads) {
    const Config& c = model.config();
    const int block_size = std::min(16, c.max_seq), blocks = 2 * ((c.max_seq + block_size - 1) / block_size);
    std::vector<int> b(a.begin(), a.end() - suffix);
    for (int i = 0; i < suffix; i++) b.push_back((a[a.size() - suffix + i] + 1) % c.vocab_size);
    PrefixRow row;
    row.prompt = int(b.size());
    std::vector<float> with, without;
    std::vector<double> tw, tn;
    for (int r = 0; r < reps; r++) {
        BlockPool cached_pool(c, block_size, blocks, true), plain_pool(c, block_size, blocks, false);
        PagedCache seq_a(cached_pool, model.w.fingerprint(), 0);
        CachedDecoder(model, seq_a, threads).extend(a);
        PagedCache seq_b(cached_pool, model.w.fingerprint(), 1), seq_plain(plain_pool, 0, 2);
        CachedDecoder dec_b(model, seq_b, threads), dec_plain(model, seq_plain, threads);
        auto t0 = std::chrono::steady_clock::now();
        with = dec_b.extend(b);
        tw.push_back(seconds_since(t0));
        t0 = std::chrono::steady_clock::now();
        without = dec_plain.extend(b);
        tn.push_back(seconds_since(t0));
        row.hit = dec_b.prefix_hit();
    }
    std::sort(tw.begin(), tw.end());
    std::sort(tn.begin(), tn.end());
    row.with_s = tw[tw.size() / 2];
    row.without_s = tn[tn.size() / 2];
    row.equal = bitwise_equal(with, without);
    return row;
}

struct Row {
    int T;
    double prefill_s, cached_s, seqdot_s, naive_s;  // naive_s: 0 when T > --naive-max (not timed)
    bool cached_eq_naive, seqdot_eq_naive;
    StepCost cached_cost, naive_cost;        // the cost model's count of one step at T
    double cached_pred = 0, naive_pred = 0;  // and its time for them, from the probe's rates
};

}  // namespace

// The device table: one backend's cached decode step (graph replay and not), naive decode and
// prefill at each T, on a random model of the shape with max_seq raised to fit the longest T.
int run_bench_device(const BenchOptions& o) {
    std::vector<int> lengths = parse_int_list("--lengths", o.lengths_given ? o.lengths : "64,256,1024");
    std::sort(lengths.begin(), lengths.end());
    Config c = shape_from_string(o.shape);
    c.max_seq = std::max(c.max_seq, lengths.back());
    for (int T : lengths)
        if (T < 2) throw Error(fmt::format("--lengths: T = {} is too short: a decode step needs T >= 2", T));
    const std::vector<std::string> devices = parse_devices(o.device);
    if (devices.size() != 1) throw Error("bench: --device takes one device (cpu, gpu or gpu-host)");
    const Model model = random_model(c, o.seed);
    BackendOptions with_graph, no_graph;
    no_graph.graphs = false;
    const std::unique_ptr<Backend> graphed = make_backend(devices[0], model, with_graph);
    const std::unique_ptr<Backend> plain = make_backend(devices[0], model, no_graph);
    std::vector<int> tokens(std::size_t(lengths.back()));
    SplitMix64 rng(o.seed + 1);
    for (int& t : tokens) t = int(rng.next() % std::uint64_t(c.vocab_size));
    const std::int64_t weight_bytes = 4 * c.n_params(model.w.shared_classifier);

    if (!o.json)
        fmt::print(
            "kvlab bench --device {}: {} ({}), medians of {} reps\n{:>6} {:>16} {:>16} {:>14} {:>14} {:>14} {:>9}  "
            "{}\n",
            devices[0], o.shape, c.describe(), o.reps, "T", "cached us graph", "cached us plain", "naive us",
            "prefill tok/s", "bytes/step", "GB/s", "logits");
    nlohmann::json rows = nlohmann::json::array();
    for (int T : lengths) {
        const std::span<const int> seq(tokens.data(), std::size_t(T));
        // A decode step at position T - 1: roll back one position, decode it again.
        auto decode_us = [&](Backend& b, std::vector<float>& logits) {
            CachedDecoder dec(b);
            dec.prefill(seq.first(std::size_t(T) - 1));
            logits = dec.decode(seq.back());  // the first replay of a graph also captures it
            return 1e6 * median_seconds(o.reps, [&] {
                       dec.cache().truncate(T - 1);
                       dec.decode(seq.back());
                   });
        };
        std::vector<float> lg, lp;
        const double graph_us = decode_us(*graphed, lg), plain_us = decode_us(*plain, lp);
        NaiveDecoder naive(*plain);
        std::vector<float> ln;
        const double naive_us = 1e6 * median_seconds(o.reps, [&] { ln = naive.forward(seq); });
        CachedDecoder pre(*plain);
        const double prefill_s = median_seconds(o.reps, [&] {
            pre.reset();
            pre.prefill(seq);
        });
        // A step reads every weight once and the K and V rows of T positions.
        const std::int64_t bytes = weight_bytes + kv_bytes(c, T);
        const bool equal = compare_bits(ln, lg).equal && compare_bits(ln, lp).equal;
        if (o.json)
            rows.push_back({{"T", T},
                            {"cached_us_graph", graph_us},
                            {"cached_us_no_graph", plain_us},
                            {"naive_us", naive_us},
                            {"prefill_tok_per_s", T / prefill_s},
                            {"bytes_per_step", bytes},
                            {"achieved_gb_per_s", bytes / graph_us / 1e3},
                            {"bitwise_equal", equal}});
        else
            fmt::print("{:>6} {:>16.1f} {:>16.1f} {:>14.1f} {:>14.0f} {:>14} {:>9.2f}  {}\n", T, graph_us, plain_us,
                       naive_us, T / prefill_s, bytes, bytes / graph_us / 1e3,
                       equal ? "naive, graph and plain bitwise equal" : "DIFFER");
        if (!equal) {
            fmt::print(stderr, "kvlab: error: logits differ at T = {} on {}\n", T, devices[0]);
            return 1;
        }
    }
    if (o.json)
        fmt::print("{}\n",
                   json_document(nlohmann::json{{"device", devices[0]}, {"config", c.describe()}, {"rows", rows}}));
    return 0;
}

// The format table: one decode step at each T with the cache in each KV format, on a random
// model of the shape with max_seq raised to the longest T. A step's time depends on T and the
// format, not on the rows' values, so each cache is filled once with random rows (no prefill),
// and the lengths are measured longest first (a rollback to T - 1 each time).
struct FormatRow {
    int T = 0;
    KVFormat format = KVFormat::fp32;
    AttentionSpec attention;
    double decode_s = 0;
    std::int64_t bytes_per_token = 0, kv_bytes = 0;
};

std::vector<KVFormat> bench_formats(const std::string& names) {
    if (names == "all") return {std::begin(kKVFormats), std::end(kKVFormats)};
    std::vector<KVFormat> out;
    std::size_t at = 0;
    while (at <= names.size()) {
        const std::size_t end = std::min(names.find(',', at), names.size());
        const KVFormat f = parse_kv_format(std::string_view(names).substr(at, end - at));
        if (std::find(out.begin(), out.end(), f) != out.end())
            throw Error(fmt::format("--kv-format: {} named twice", kv_format_name(f)));
        out.push_back(f);
        at = end + 1;
    }
    return out;
}

// The format table, as text or JSON; with_attention: the rows compare attentions too.
void print_format_table(const Config& c, const BenchOptions& o, const std::vector<FormatRow>& rows,
                        bool with_attention) {
    if (o.json) {
        nlohmann::json j;
        j["shape"] = c.describe();
        j["threads"] = o.threads;
        j["threads_choice"] = threads_json();
        j["reps"] = o.reps;
        for (const FormatRow& r : rows)
            j["formats"].push_back({{"T", r.T},
                                    {"kv_format", kv_format_name(r.format)},
                                    {"attention", r.attention.tiled() ? "tiled" : "simple"},
                                    {"tile", r.attention.tile},
                                    {"bytes_per_token", r.bytes_per_token},
                                    {"kv_bytes", r.kv_bytes},
                                    {"decode_tokens_per_second", 1.0 / r.decode_s}});
        fmt::print("{}\n", json_document(j));
        return;
    }
    fmt::print(
        "kvlab bench --kv-format / --attention: random model, {}\n{}, median of {} decode steps per figure "
        "(configurations interleaved); the cache holds T - 1 random rows, the step adds one\n\n",
        c.describe(), threads_text(o.threads), o.reps);
    const std::string vs = fmt::format("vs {}", with_attention ? "fp32 simple" : "fp32");
    fmt::print("{:>6} {:<10} {:<16} {:>15} {:>12} {:>14} {:>14}\n", "T", "format", "attention", "bytes/token", "KV MB",
               "decode tok/s", vs);
    for (const FormatRow& r : rows) {
        const auto base = std::find_if(rows.begin(), rows.end(), [&](const FormatRow& x) {
            return x.T == r.T && x.format == KVFormat::fp32 && !x.attention.tiled();
        });
        fmt::print("{:>6} {:<10} {:<16} {:>15} {:>12.2f} {:>14.1f} {:>14}\n", r.T, kv_format_name(r.format),
                   attention_name(r.attention), r.bytes_per_token, r.kv_bytes / 1e6, 1.0 / r.decode_s,
                   base == rows.end() ? "-" : fmt::format("{:.2f}x", base->decode_s / r.decode_s));
    }
}

// --attention simple,tiled: the attentions the format table compares (tiled with --tile).
std::vector<AttentionSpec> bench_attentions(const BenchOptions& o) {
    std::vector<AttentionSpec> out;
    for (std::size_t at = 0; at <= o.attentions.size();) {
        const std::size_t end = std::min(o.attentions.find(',', at), o.attentions.size());
        const AttentionSpec a = parse_attention(std::string_view(o.attentions).substr(at, end - at), o.tile);
        if (std::find(out.begin(), out.end(), a) != out.end())
            throw Error(fmt::format("--attention: {} named twice", attention_name(a)));
        out.push_back(a);
        at = end + 1;
    }
    return out;
}

// The format table: decode tok/s at each length, for each KV format and each attention.
int run_bench_formats(const BenchOptions& o) {
    const std::vector<KVFormat> formats = bench_formats(o.kv_formats.empty() ? "fp32" : o.kv_formats);
    const std::vector<AttentionSpec> attentions = bench_attentions(o);
    std::vector<int> lengths = parse_int_list("--lengths", o.lengths_given ? o.lengths : "1024,2048,4096,8192");
    std::sort(lengths.begin(), lengths.end(), std::greater<>());
    for (int T : lengths)
        if (T < 2) throw Error(fmt::format("--lengths: T = {} is too short: a decode step needs T >= 2", T));
    Config c = shape_from_string(o.shape);
    c.max_seq = std::max(c.max_seq, lengths.front());
    for (KVFormat f : formats)
        check_size(fmt::format("a {} KV cache", kv_format_name(f)), kv_bytes(c, c.max_seq, f), 1);
    const Model model = random_model(c, o.seed);
    SplitMix64 rng(o.seed + 1);
    std::vector<std::unique_ptr<ContiguousCache>> caches;
    std::vector<std::unique_ptr<CachedDecoder>> decoders;
    std::vector<float> k_row(std::size_t(c.kv_dim())), v_row(k_row.size());  // [kv_dim]
    const int filled = lengths.front() - 1;
    std::vector<int> tokens(std::size_t(lengths.front()));
    for (int& t : tokens) t = int(rng.next() % std::uint64_t(c.vocab_size));
    std::vector<std::pair<KVFormat, AttentionSpec>> configs;  // [formats x attentions]: a cache and decoder each
    for (KVFormat f : formats)
        for (const AttentionSpec& a : attentions) configs.push_back({f, a});
    for (const auto& [f, a] : configs) {
        caches.push_back(std::make_unique<ContiguousCache>(c));
        caches.back()->set_kv_format(f);
        caches.back()->append(std::span(tokens).first(std::size_t(filled)));
        for (int pos = 0; pos < filled; pos++)
            for (int l = 0; l < c.n_layers; l++) {
                for (float& x : k_row) x = float(rng.gaussian());
                for (float& x : v_row) x = float(rng.gaussian());
                caches.back()->write(l, pos, k_row.data(), v_row.data());
            }
        decoders.push_back(std::make_unique<CachedDecoder>(model, *caches.back(), o.threads));
        decoders.back()->exec.attention = a;
    }
    std::vector<FormatRow> rows;
    for (int T : lengths) {
        // Interleaved round by round, each round starting at another configuration, as the variant table.
        std::vector<std::vector<double>> samples(configs.size());
        for (int r = 0; r < o.reps; r++)
            for (std::size_t j = 0; j < configs.size(); j++) {
                const std::size_t i = (j + std::size_t(r)) % configs.size();
                caches[i]->truncate(T - 1);
                const auto t0 = std::chrono::steady_clock::now();
                decoders[i]->decode(tokens[std::size_t(T) - 1]);
                samples[i].push_back(seconds_since(t0));
            }
        for (std::size_t i = 0; i < configs.size(); i++) {
            const KVFormat f = configs[i].first;
            std::sort(samples[i].begin(), samples[i].end());
            rows.push_back(
                {T, f, configs[i].second, samples[i][samples[i].size() / 2], kv_bytes(c, 1, f), kv_bytes(c, T, f)});
        }
    }
    print_format_table(c, o, rows, configs.size() != formats.size());
    return 0;
}

std::vector<int> bench_lengths(const Config& c, const BenchOptions& o) {
    std::vector<int> lengths = parse_int_list("--lengths", o.lengths);
    std::sort(lengths.begin(), lengths.end());
    for (int T : lengths)
        if (T < 1 || T > c.max_seq)
            throw Error(fmt::format("--lengths: T = {} is outside [1, max_seq = {}] (a longer context: --shape {}", T,
                                    c.max_seq, "stories15M,max_seq=8192)"));
    return lengths;
}

// Per context length T: prefill of T tokens, one decode step at T (cached, llama2.c-style and
// naive), and whether their logits agree bit for bit.
std::vector<Row> bench_lengths_rows(const Model& model, std::span<const int> tokens, std::span<const int> lengths,
                                    const BenchOptions& o, const MachineRates& rates, const Progress& progress) {
    CachedDecoder cached(model, o.threads);
    NaiveDecoder naive(model, o.threads);
    SequentialDotDecoder seqdot(model);  // one thread, as llama2.c's run.c
    std::vector<Row> rows;
    std::vector<float> lc, ls, ln;
    for (int T : lengths) {
        const std::span<const int> prefix = tokens.first(std::size_t(T));
        Row r{T, 0, 0, 0, 0, false, false, {}, {}, 0, 0};
        r.cached_cost = cached_step_cost(model.config(), T, 4 * std::int64_t(model.config().head_size()), {});
        r.naive_cost = naive_step_cost(model.config(), T, {});
        r.cached_pred = predicted_seconds(r.cached_cost, rates);
        r.naive_pred = predicted_seconds(r.naive_cost, rates);
        const std::string at = fmt::format("bench: T = {} ({} of {})", T, rows.size() + 1, lengths.size());
        progress(at + ": prefill");
        r.prefill_s = median_seconds(o.reps, [&] {
            cached.reset();
            cached.prefill(prefix);
        });
        // One decode step at context length T: the cache holds T - 1 positions, the step adds one.
        cached.reset();
        if (T > 1) cached.prefill(prefix.first(T - 1));
        progress(at + ": cached and llama2.c-style decode steps");
        r.cached_s = median_seconds(o.reps, [&] {
            cached.cache().truncate(T - 1);
            lc = cached.decode(tokens[T - 1]);
        });
        while (seqdot.pos() < T - 1) seqdot.decode(tokens[seqdot.pos()]);
        r.seqdot_s = median_seconds(o.reps, [&] {
            seqdot.truncate(T - 1);
            ls = seqdot.decode(tokens[T - 1]);
        });
        // Past --naive-max one untimed naive step still checks the bits: it costs one prefill of T.
        progress(at +
                 (T <= o.naive_max ? ": naive decode (timed)" : ": naive decode (one untimed step, for the bits)"));
        if (T <= o.naive_max)
            r.naive_s = median_seconds(o.reps, [&] { ln = naive.forward(prefix); });
        else
            ln = naive.forward(prefix);
        r.cached_eq_naive = bitwise_equal(lc, ln);
        r.seqdot_eq_naive = bitwise_equal(ls, ln);
        rows.push_back(r);
    }
    return rows;
}

// Everything one bench run measured.
struct BenchResult {
    MachineRates rates;  // the probe's
    std::vector<Row> rows;
    std::vector<VariantRow> variants;  // at T_var, the longest length
    PrefixRow prefix;
    int T_var = 0, suffix = 0;
    bool all_equal() const {
        bool eq = prefix.equal;
        for (const auto& r : rows) eq = eq && r.cached_eq_naive && r.seqdot_eq_naive;
        for (const auto& v : variants) eq = eq && (v.equal || !v.exact);
        return eq;
    }
};

// One step's counts, the cost model's time and the measured one (0: not timed, null in the JSON).
nlohmann::json cost_json(const StepCost& s, double predicted, double measured) {
    return {{"flops", s.flops()},
            {"weight_bytes", s.weight_bytes},
            {"kv_read_bytes", s.kv_read_bytes},
            {"kv_write_bytes", s.kv_write_bytes},
            {"predicted_seconds", predicted},
            {"measured_seconds", measured > 0 ? nlohmann::json(measured) : nullptr},
            {"predicted_over_measured", measured > 0 ? nlohmann::json(predicted / measured) : nullptr}};
}

void print_cost_text(const Config& c, const BenchResult& b) {
    const MachineRates& m = b.rates;
    fmt::print(
        "\ncost model: a {:.2f} s probe on {} thread(s) measured weights streaming at {:.1f} GB/s, products at {:.1f} "
        "GFLOP/s,\nK and V streaming at {:.1f} GB/s, naive attention at {:.1f} GFLOP/s, the small kernels at {:.2f} "
        "GFLOP/s. A step's predicted\ntime is, for the products and for attention, the longer of bytes / bandwidth "
        "and FLOPs / rate, plus the small kernels.\n",
        m.seconds, m.n_threads, m.stream_bytes_per_s / 1e9, m.product_flops_per_s / 1e9, m.kv_bytes_per_s / 1e9,
        m.attention_flops_per_s / 1e9, m.other_flops_per_s / 1e9);
    fmt::print("{:>5} {:>12} {:>10} {:>10} {:>12} {:>12} {:>9}   {:>11} {:>12} {:>12} {:>9}\n", "T", "cached MFLOP",
               "weights MB", "KV read MB", "predicted us", "measured us", "pred/meas", "naive GFLOP", "predicted ms",
               "measured ms", "pred/meas");
    for (const auto& r : b.rows)
        fmt::print(
            "{:>5} {:>12.2f} {:>10.2f} {:>10.2f} {:>12.1f} {:>12.1f} {:>9.2f}   {:>11.3f} {:>12.3f} {:>12} {:>9}\n",
            r.T, r.cached_cost.flops() / 1e6, r.cached_cost.weight_bytes / 1e6, r.cached_cost.kv_read_bytes / 1e6,
            r.cached_pred * 1e6, r.cached_s * 1e6, r.cached_pred / r.cached_s, r.naive_cost.flops() / 1e9,
            r.naive_pred * 1e3, r.naive_s > 0 ? fmt::format("{:.3f}", r.naive_s * 1e3) : "not timed",
            r.naive_s > 0 ? fmt::format("{:.2f}", r.naive_pred / r.naive_s) : "-");
    const std::int64_t row_bytes = 4 * std::int64_t(c.head_size());
    const int cross = kv_passes_weights_T(c, row_bytes);
    fmt::print(
        "K and V read per cached step pass the weights' bytes at T = {} ({:.1f} MB of panels; {:.1f} KB of K "
        "and V per position)\n",
        cross, panel_bytes(c) / 1e6, 2.0 * c.n_layers * c.n_kv_heads * double(row_bytes) / 1e3);
}

void print_bench_json(const Config& c, const BenchOptions& o, const BenchResult& b) {
    nlohmann::json j;
    j["shape"] = c.describe();
    j["threads"] = o.threads;
    j["reps"] = o.reps;
    j["naive_max"] = o.naive_max;
    const MachineRates& m = b.rates;
    j["machine"] = {{"threads", m.n_threads},
                    {"probe_seconds", m.seconds},
                    {"weights_stream_bytes_per_second", m.stream_bytes_per_s},
                    {"product_flops_per_second", m.product_flops_per_s},
                    {"kv_stream_bytes_per_second", m.kv_bytes_per_s},
                    {"naive_attention_flops_per_second", m.attention_flops_per_s},
                    {"small_kernel_flops_per_second", m.other_flops_per_s}};
    j["kv_passes_weights_T"] = kv_passes_weights_T(c, 4 * std::int64_t(c.head_size()));
    for (const auto& r : b.rows)
        j["rows"].push_back(
            {{"T", r.T},
             {"prefill_tokens_per_second", r.T / r.prefill_s},
             {"cached_decode_tokens_per_second", 1.0 / r.cached_s},
             {"seqdot_decode_tokens_per_second", 1.0 / r.seqdot_s},
             {"naive_decode_tokens_per_second", r.naive_s > 0 ? nlohmann::json(1.0 / r.naive_s) : nullptr},
             {"cached_vs_seqdot", r.seqdot_s / r.cached_s},
             {"cached_vs_naive", r.naive_s > 0 ? nlohmann::json(r.naive_s / r.cached_s) : nullptr},
             {"cached_bitwise_equal_naive", r.cached_eq_naive},
             {"seqdot_bitwise_equal_naive", r.seqdot_eq_naive},
             {"cost",
              {{"cached", cost_json(r.cached_cost, r.cached_pred, r.cached_s)},
               {"naive", cost_json(r.naive_cost, r.naive_pred, r.naive_s)}}}});
    for (const auto& v : b.variants)
        j["variants"].push_back({{"variant", v.name},
                                 {"cache", v.cache},
                                 {"T", b.T_var},
                                 {"decode_tokens_per_second", 1.0 / v.decode_s},
                                 {"relative_to_contiguous", b.variants[0].decode_s / v.decode_s},
                                 {"exact", v.exact},
                                 {"bitwise_equal_contiguous", v.equal},
                                 {"max_abs_logit_error", v.max_abs},
                                 {"reserved_bytes", v.memory.reserved_bytes},
                                 {"used_bytes", v.memory.used_bytes}});
    j["prefix_cache"] = {{"prompt", b.prefix.prompt},
                         {"positions_not_recomputed", b.prefix.hit},
                         {"prefill_seconds_with", b.prefix.with_s},
                         {"prefill_seconds_without", b.prefix.without_s},
                         {"bitwise_equal", b.prefix.equal}};
    j["all_bitwise_equal"] = b.all_equal();
    fmt::print("{}\n", json_document(j));
}

void print_bench_text(const Config& c, const BenchOptions& o, const BenchResult& b) {
    fmt::print("kvlab bench: random model, {}\n", c.describe());
    fmt::print(
        "{} for cached, naive and prefill; the llama2.c-style decoder runs on one; "
        "median of {} runs each\n\n",
        threads_text(o.threads), o.reps);
    fmt::print("{:>5} {:>14} {:>14} {:>14} {:>10} {:>14} {:>10}  {}\n", "T", "prefill tok/s", "cached tok/s",
               "seqdot tok/s", "vs seqdot", "naive tok/s", "vs naive", "logits at T");
    for (const auto& r : b.rows)
        fmt::print("{:>5} {:>14.1f} {:>14.1f} {:>14.1f} {:>9.1f}x {:>14} {:>10}  {}\n", r.T, r.T / r.prefill_s,
                   1.0 / r.cached_s, 1.0 / r.seqdot_s, r.seqdot_s / r.cached_s,
                   r.naive_s > 0 ? fmt::format("{:.2f}", 1.0 / r.naive_s) : "not timed",
                   r.naive_s > 0 ? fmt::format("{:.1f}x", r.naive_s / r.cached_s) : "-",
                   r.cached_eq_naive && r.seqdot_eq_naive ? "cached = seqdot = naive, bitwise" : "DIFFER");
    fmt::print(
        "\ncached tok/s: one decode step at context length T (T-1 positions cached).\n"
        "seqdot: llama2.c-style decode (weights [out][in], one sequential dot per output).\n"
        "naive tok/s: one full forward over T tokens, what naive decode pays per token; timed up to --naive-max {}\n"
        "(above it, one untimed naive step checks the bits).\n",
        o.naive_max);
    print_cost_text(c, b);
    fmt::print("\ncache variants, one decode step at T = {} (interleaved, median of {} x 8 steps):\n", b.T_var, o.reps);
    fmt::print("{:<20} {:>12} {:>14} {:>12} {:>12}  {:<34}  {}\n", "variant", "decode tok/s", "vs contiguous",
               "reserved", "used", "logits vs contiguous", "cache");
    for (const auto& v : b.variants)
        fmt::print("{:<20} {:>12.1f} {:>13.2f}x {:>10.2f}MB {:>10.2f}MB  {:<34}  {}\n", v.name, 1.0 / v.decode_s,
                   b.variants[0].decode_s / v.decode_s, v.memory.reserved_bytes / 1e6, v.memory.used_bytes / 1e6,
                   v.equal   ? "bitwise equal"
                   : v.exact ? "DIFFER"
                             : fmt::format("approximate, max |dlogit| {:.3g}", v.max_abs),
                   v.cache);
    const PrefixRow& p = b.prefix;
    fmt::print(
        "\nprefix cache: a {}-token prompt sharing all but its last {} tokens with an earlier request\n"
        "  {} positions served from cached blocks, {} recomputed; prefill {:.2f} ms with the cache, {:.2f} ms "
        "without ({:.1f}x, {:.0f}% saved); logits {}\n",
        p.prompt, b.suffix, p.hit, p.prompt - p.hit, p.with_s * 1e3, p.without_s * 1e3, p.without_s / p.with_s,
        100.0 * (1.0 - p.with_s / p.without_s), p.equal ? "bitwise equal" : "DIFFER");
}

// --plot: decode speed against T (measured, and the cost model's), and what a cached step reads.
void write_bench_plot(const Config& c, const BenchOptions& o, const BenchResult& b) {
    PlotSeries cached{"cached decode, measured", {214, 96, 24}, {}},
        cached_p{"cached, cost model", {214, 96, 24}, {}, true};
    PlotSeries naive{"naive decode, measured", {40, 96, 180}, {}},
        naive_p{"naive, cost model", {40, 96, 180}, {}, true};
    PlotSeries weights{"weights (panels)", {90, 90, 90}, {}}, kv{"K and V", {214, 96, 24}, {}},
        total{"total", {40, 150, 80}, {}, true};
    for (const Row& r : b.rows) {
        const double T = r.T;
        cached.points.push_back({T, 1.0 / r.cached_s}), cached_p.points.push_back({T, 1.0 / r.cached_pred});
        if (r.naive_s > 0) naive.points.push_back({T, 1.0 / r.naive_s});
        naive_p.points.push_back({T, 1.0 / r.naive_pred});
        weights.points.push_back({T, r.cached_cost.weight_bytes + r.cached_cost.classifier_bytes});
        kv.points.push_back({T, r.cached_cost.kv_read_bytes});
        total.points.push_back({T, r.cached_cost.bytes()});
    }
    const int cross = kv_passes_weights_T(c, 4 * std::int64_t(c.head_size()));
    write_charts_png(o.plot, {Chart{fmt::format("decode tok/s against T, {} thread(s)", o.threads),
                                    "context length T",
                                    "tokens per second",
                                    {cached, cached_p, naive, naive_p},
                                    0,
                                    ""},
                              Chart{"bytes a cached decode step reads",
                                    "context length T",
                                    "bytes",
                                    {weights, kv, total},
                                    double(cross),
                                    fmt::format("K and V pass the weights at T = {}", cross)}});
    fmt::print("\nwrote {}\n", o.plot);
}

int run_bench(const BenchOptions& options) {
    if (options.background_load >= 0) {
        if (!options.startup.empty() || !options.plot.empty() || !options.kv_formats.empty() ||
            options.attentions != "simple" || options.device != "cpu")
            throw Error(
                "bench --background-load measures decode on the cpu per thread count: no --startup, --plot, "
                "--kv-format, --attention or --device");
        return run_bench_threads(options);
    }
    if (!options.startup.empty()) {
        if (!options.plot.empty() || !options.kv_formats.empty() || options.attentions != "simple" ||
            options.device != "cpu")
            throw Error(
                "bench --startup measures one checkpoint on the cpu: no --plot, --kv-format, --attention or "
                "--device");
        return run_bench_startup(options);
    }
    if (!options.plot.empty() &&
        (!options.kv_formats.empty() || options.attentions != "simple" || options.device != "cpu"))
        throw Error("bench: --plot draws the main table (the cpu, simple attention, no --kv-format)");
    if (!options.kv_formats.empty() || options.attentions != "simple") {
        if (options.device != "cpu")
            throw Error("bench: --kv-format and --attention run on the cpu (their table has no --device)");
        return run_bench_formats(options);
    }
    if (options.device != "cpu") return run_bench_device(options);
    if (!options.plot.empty()) check_plot_path("--plot", options.plot);  // refused before the run, not after it
    const Config c = shape_from_string(options.shape);
    BenchOptions o = options;
    const std::vector<int> lengths = bench_lengths(c, o);
    if (o.block_size == 0) o.block_size = std::min(16, c.max_seq);
    if (o.group == 0) o.group = default_quant_group(c);
    // Bad variant parameters are refused before anything runs (the constructors say why).
    for (const auto& [setting, spec] : bench_specs(c, o)) (void)make_cache(c, spec);
    const Model model = random_model(c, o.seed);
    std::vector<int> tokens(lengths.back());
    SplitMix64 rng(o.seed + 1);
    for (int& t : tokens) t = int(rng.next() % std::uint64_t(c.vocab_size));

    BenchResult b;
    {
        const Progress progress;
        progress("bench: probing the machine's rates for the cost model");
        b.rates = probe_machine(model, o.threads, {});
        b.rows = bench_lengths_rows(model, tokens, lengths, o, b.rates, progress);
    }
    // The variants and the prefix cache run at the longest length up to --naive-max: each of them
    // prefills its own cache, and past that the table would cost minutes.
    b.T_var = lengths.front();
    for (int T : lengths)
        if (T <= o.naive_max) b.T_var = T;
    const std::span<const int> longest = std::span<const int>(tokens).first(std::size_t(b.T_var));
    b.variants = bench_variants(model, longest, o);
    b.suffix = std::min(32, std::max(1, b.T_var / 4));
    b.prefix = bench_prefix(model, longest, b.suffix, o.reps, o.threads);
    if (o.json)
        print_bench_json(c, o, b);
    else
        print_bench_text(c, o, b);
    if (!o.plot.empty()) write_bench_plot(c, o, b);
    if (!b.all_equal()) {
        fmt::print(stderr, "kvlab: error: the decoders' logits are not bitwise equal\n");
        return 1;
    }
    return 0;
}

}  // namespace kvlab::cli
