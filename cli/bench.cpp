// kvlab bench: throughput of cached decode, naive decode, prefill, and a llama2.c-style
// sequential-dot decoder, all on one random model, in one run, with their logits compared.
// Figures are medians of --reps runs; compare them as ratios within a run (the machine is shared).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "baseline.h"
#include "commands.h"
#include "common.h"
#include "decode.h"

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

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Row {
    int T;
    double prefill_s, cached_s, seqdot_s, naive_s;
    bool cached_eq_naive, seqdot_eq_naive;
};

}  // namespace

int run_bench(const BenchOptions& o) {
    const Config c = shape_from_string(o.shape);
    std::vector<int> lengths = parse_int_list("--lengths", o.lengths);
    std::sort(lengths.begin(), lengths.end());
    for (int T : lengths)
        if (T < 1 || T > c.max_seq)
            throw Error(fmt::format("--lengths: T = {} is outside [1, max_seq = {}]", T, c.max_seq));
    const Model model = random_model(c, o.seed);
    std::vector<int> tokens(lengths.back());
    SplitMix64 rng(o.seed + 1);
    for (int& t : tokens) t = int(rng.next() % std::uint64_t(c.vocab_size));

    CachedDecoder cached(model, o.threads);
    NaiveDecoder naive(model, o.threads);
    SequentialDotDecoder seqdot(model);  // one thread, as llama2.c's run.c
    std::vector<Row> rows;
    std::vector<float> lc, ls, ln;
    for (int T : lengths) {
        const std::span<const int> prefix(tokens.data(), T);
        Row r{T, 0, 0, 0, 0, false, false};
        r.prefill_s = median_seconds(o.reps, [&] {
            cached.reset();
            cached.prefill(prefix);
        });
        // One decode step at context length T: the cache holds T - 1 positions, the step adds one.
        cached.reset();
        if (T > 1) cached.prefill(prefix.first(T - 1));
        r.cached_s = median_seconds(o.reps, [&] {
            cached.cache().truncate(T - 1);
            lc = cached.decode(tokens[T - 1]);
        });
        while (seqdot.pos() < T - 1) seqdot.decode(tokens[seqdot.pos()]);
        r.seqdot_s = median_seconds(o.reps, [&] {
            seqdot.truncate(T - 1);
            ls = seqdot.decode(tokens[T - 1]);
        });
        r.naive_s = median_seconds(o.reps, [&] { ln = naive.forward(prefix); });
        r.cached_eq_naive = bitwise_equal(lc, ln);
        r.seqdot_eq_naive = bitwise_equal(ls, ln);
        rows.push_back(r);
    }

    bool all_equal = true;
    for (const auto& r : rows) all_equal = all_equal && r.cached_eq_naive && r.seqdot_eq_naive;
    if (o.json) {
        nlohmann::json j;
        j["shape"] = c.describe();
        j["threads"] = o.threads;
        j["reps"] = o.reps;
        for (const auto& r : rows)
            j["rows"].push_back({{"T", r.T},
                                 {"prefill_tokens_per_second", r.T / r.prefill_s},
                                 {"cached_decode_tokens_per_second", 1.0 / r.cached_s},
                                 {"seqdot_decode_tokens_per_second", 1.0 / r.seqdot_s},
                                 {"naive_decode_tokens_per_second", 1.0 / r.naive_s},
                                 {"cached_vs_seqdot", r.seqdot_s / r.cached_s},
                                 {"cached_vs_naive", r.naive_s / r.cached_s},
                                 {"cached_bitwise_equal_naive", r.cached_eq_naive},
                                 {"seqdot_bitwise_equal_naive", r.seqdot_eq_naive}});
        j["all_bitwise_equal"] = all_equal;
        fmt::print("{}\n", j.dump(2));
    } else {
        fmt::print("kvlab bench: random model, {}\n", c.describe());
        fmt::print(
            "{} thread(s) for cached, naive and prefill; the llama2.c-style decoder runs on one; "
            "median of {} runs each\n\n",
            o.threads, o.reps);
        fmt::print("{:>5} {:>14} {:>14} {:>14} {:>10} {:>14} {:>10}  {}\n", "T", "prefill tok/s", "cached tok/s",
                   "seqdot tok/s", "vs seqdot", "naive tok/s", "vs naive", "logits at T");
        for (const auto& r : rows)
            fmt::print("{:>5} {:>14.1f} {:>14.1f} {:>14.1f} {:>9.1f}x {:>14.2f} {:>9.1f}x  {}\n", r.T,
                       r.T / r.prefill_s, 1.0 / r.cached_s, 1.0 / r.seqdot_s, r.seqdot_s / r.cached_s, 1.0 / r.naive_s,
                       r.naive_s / r.cached_s,
                       r.cached_eq_naive && r.seqdot_eq_naive ? "cached = seqdot = naive, bitwise" : "DIFFER");
        fmt::print(
            "\ncached tok/s: one decode step at context length T (T-1 positions cached).\n"
            "seqdot: llama2.c-style decode (weights [out][in], one sequential dot per output).\n"
            "naive tok/s: one full forward over T tokens, what naive decode pays per token.\n");
    }
    if (!all_equal) {
        fmt::print(stderr, "kvlab: error: the decoders' logits are not bitwise equal\n");
        return 1;
    }
    return 0;
}

}  // namespace kvlab::cli
