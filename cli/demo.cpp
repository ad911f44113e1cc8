// kvlab demo: the main job. Naive and cached decode run side by side from one prompt; every
// step prints both paths' time and counted FLOPs and whether their full logit vectors are
// bitwise equal.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "approx_metrics.h"
#include "cache.h"
#include "commands.h"
#include "common.h"
#include "compare.h"
#include "decode.h"
#include "device.h"
#include "json_text.h"
#include "kv_format.h"
#include "sampler.h"

namespace kvlab::cli {

namespace {

struct StepRow {
    std::string kind;  // "prefill" or "decode"
    int pos_first, pos_last, token;
    std::string text;
    double naive_s, cached_s;
    std::uint64_t naive_flops, cached_flops;
    double other_naive_s = 0, other_cached_s = 0;  // the second device's, when there is one
    BitComparison cmp;    // the first of the run's logit vectors that differs from the first device's naive
    std::string differs;  // which one ("" when all equal)
    // With a KV format other than fp32: how far the format-aware naive logits are from fp32 naive
    // decode's, and whether their greedy tokens agree.
    double drift = 0, kl = 0;  // max |dlogit|, KL(fp32 || format) of the next-token distributions
    bool same_top1 = true;
};

// Naive and cached decode on the first device, and on the second when there is one, with one
// StepRow per step.
struct SideBySide {
    SideBySide(const LoadedModel& lm, const DemoOptions& o);
    // One step: naive recomputes all of `tokens`; cached runs only `fresh` (the prompt, then one token).
    const std::vector<float>& step(const std::string& kind, const std::vector<int>& tokens, std::span<const int> fresh);
    // The log-probabilities of tokens[from..] from one prefill on a fresh cache of the first device.
    std::vector<float> rescore(const std::vector<int>& tokens, int from);

    const LoadedModel& lm;
    const std::vector<std::string> devices;
    const std::string d0, d1;  // d1 is "" with one device
    const KVFormat format;
    const AttentionSpec attention;  // every decoder's, the fp32 yardstick's too
    const std::unique_ptr<Backend> backend;
    ContiguousCache cache;  // in `format`
    NaiveDecoder naive;     // format-aware: stores K and V in `format` too
    CachedDecoder cached;
    // A second device runs the same two decoders; all four logit vectors must agree.
    const std::unique_ptr<Backend> backend2;
    const std::unique_ptr<ContiguousCache> cache2;
    const std::unique_ptr<NaiveDecoder> naive2;
    const std::unique_ptr<CachedDecoder> cached2;
    // With a format other than fp32: fp32 naive decode, the yardstick of the format's drift.
    const std::unique_ptr<NaiveDecoder> fp32;
    std::vector<float> scales;  // fp8 with --kv-calibrate: [n_layers, 2]; empty: all 1
    std::vector<StepRow> rows;
};

BackendOptions backend_options(const DemoOptions& o) {
    BackendOptions bo;
    bo.graphs = o.graphs;
    return bo;
}

SideBySide::SideBySide(const LoadedModel& lm, const DemoOptions& o)
    : lm(lm),
      devices(parse_devices(o.device)),
      d0(devices[0]),
      d1(devices.size() > 1 ? devices[1] : ""),
      format(parse_kv_format(o.kv_format)),
      attention(attention_spec(o.attention)),
      backend(make_backend(devices[0], lm.model, backend_options(o))),
      cache(lm.model.config(), ContiguousCache::Layout::head_major, backend->memory()),
      naive(*backend),
      cached(*backend, cache),
      backend2(devices.size() > 1 ? make_backend(devices[1], lm.model, backend_options(o)) : nullptr),
      cache2(backend2 ? std::make_unique<ContiguousCache>(lm.model.config(), ContiguousCache::Layout::head_major,
                                                          backend2->memory())
                      : nullptr),
      naive2(backend2 ? std::make_unique<NaiveDecoder>(*backend2) : nullptr),
      cached2(backend2 ? std::make_unique<CachedDecoder>(*backend2, *cache2) : nullptr),
      fp32(format != KVFormat::fp32 ? std::make_unique<NaiveDecoder>(*backend) : nullptr) {
    naive.exec.n_threads = cached.exec.n_threads = o.threads;
    for (Exec* ex : {&naive.exec, &cached.exec, naive2 ? &naive2->exec : nullptr, cached2 ? &cached2->exec : nullptr,
                     fp32 ? &fp32->exec : nullptr})
        if (ex) ex->attention = attention;
    scales = kv_calibration(lm, format, o.kv_calibrate);
    cache.set_kv_format(format, scales);
    naive.kv_format = format, naive.kv_scales = scales;
    if (backend2) cache2->set_kv_format(format, scales), naive2->kv_format = format, naive2->kv_scales = scales;
    if (fp32) fp32->exec.n_threads = o.threads;
}

std::vector<float> SideBySide::rescore(const std::vector<int>& tokens, int from) {
    ContiguousCache fresh(lm.model.config(), ContiguousCache::Layout::head_major, backend->memory());
    fresh.set_kv_format(format, scales);
    CachedDecoder scorer(*backend, fresh);
    scorer.exec = cached.exec;
    return kvlab::rescore(scorer, tokens, from);
}

const std::vector<float>& SideBySide::step(const std::string& kind, const std::vector<int>& tokens,
                                           std::span<const int> fresh) {
    StepRow r{kind, cached.pos(), cached.pos() + int(fresh.size()) - 1, fresh.back(), "", 0, 0, 0, 0, 0, 0, {}, ""};
    const int prev = int(tokens.size()) >= 2 ? tokens[tokens.size() - 2] : 1;
    r.text = token_text(lm, prev, fresh.back());
    auto t0 = std::chrono::steady_clock::now();
    const std::uint64_t f0 = naive.exec.flops;
    const std::vector<float>& ln = naive.forward(tokens);
    r.naive_s = seconds_since(t0);
    r.naive_flops = naive.exec.flops - f0;
    t0 = std::chrono::steady_clock::now();
    const std::uint64_t g0 = cached.exec.flops;
    const std::vector<float>& lc = cached.prefill(fresh);
    r.cached_s = seconds_since(t0);
    r.cached_flops = cached.exec.flops - g0;
    r.cmp = compare_bits(ln, lc);
    if (!r.cmp.equal) r.differs = d0 + " cached";
    if (naive2) {
        t0 = std::chrono::steady_clock::now();
        const std::vector<float>& ln2 = naive2->forward(tokens);
        r.other_naive_s = seconds_since(t0);
        t0 = std::chrono::steady_clock::now();
        const std::vector<float>& lc2 = cached2->prefill(fresh);
        r.other_cached_s = seconds_since(t0);
        for (const auto& [what, l] : {std::pair{d1 + " naive", &ln2}, std::pair{d1 + " cached", &lc2}}) {
            const BitComparison b = compare_bits(ln, *l);
            if (r.cmp.equal && !b.equal) r.cmp = b, r.differs = what;
        }
    }
    if (fp32) {  // outside the timed parts
        const LogitError e = compare_logits(fp32->forward(tokens), ln);
        r.drift = e.max_abs, r.kl = e.kl, r.same_top1 = e.top1_agree;
    }
    rows.push_back(r);
    return lc;
}

// What the report says of the whole run.
struct Summary {
    int P = 0;              // prompt tokens
    std::string generated;  // the decoded tokens' text
    double naive_total = 0, cached_total = 0;
    std::uint64_t naive_flops = 0, cached_flops = 0;
    int n_equal = 0;  // steps whose logit vectors are all bitwise equal
    int T = 0;        // positions in the cache at the end
    std::int64_t kv_used = 0;
    double max_drift = 0;  // over the steps: max |logit - fp32 naive's logit|
    double max_kl = 0;     // over the steps: KL(fp32 naive || format-aware naive)
    int same_top1 = 0;     // steps whose greedy token is fp32 naive decode's
    // --logprobs: each decoded token's log-probability, and whether one prefill of the whole text
    // on a fresh cache gave every one back bit for bit.
    std::vector<float> logprobs;
    bool rescore_equal = true;
};

Summary summarize(const SideBySide& run, int P, const std::string& generated) {
    Summary s;
    s.P = P;
    s.generated = generated;
    for (const auto& r : run.rows) {
        s.naive_total += r.naive_s, s.cached_total += r.cached_s;
        s.naive_flops += r.naive_flops, s.cached_flops += r.cached_flops;
        s.n_equal += r.cmp.equal;
        s.max_drift = std::max(s.max_drift, r.drift);
        s.max_kl = std::max(s.max_kl, r.kl);
        s.same_top1 += r.same_top1;
    }
    s.T = run.cached.pos();
    s.kv_used = run.cached.cache().memory().used_bytes;
    return s;
}

void print_json(const DemoOptions& o, const SideBySide& run, const std::vector<int>& tokens, const Summary& s) {
    const Config& c = run.lm.model.config();
    const std::vector<StepRow>& rows = run.rows;
    nlohmann::json j;
    j["model"] = run.lm.source;
    j["config"] = {{"dim", c.dim},         {"hidden_dim", c.hidden_dim}, {"n_layers", c.n_layers},
                   {"n_heads", c.n_heads}, {"n_kv_heads", c.n_kv_heads}, {"vocab_size", c.vocab_size},
                   {"max_seq", c.max_seq}};
    j["threads"] = o.threads;
    j["threads_choice"] = threads_json();
    j["devices"] = run.devices;
    j["kv_format"] = kv_format_name(run.format);
    j["attention"] = {{"kind", run.attention.tiled() ? "tiled" : "simple"}, {"tile", run.attention.tile}};
    j["prompt_tokens"] = std::vector<int>(tokens.begin(), tokens.begin() + s.P);
    j["generated_tokens"] = std::vector<int>(tokens.begin() + s.P, tokens.end());
    j["generated_text"] = s.generated;
    for (const auto& r : rows)
        j["steps"].push_back({{"phase", r.kind},
                              {"pos_first", r.pos_first},
                              {"pos_last", r.pos_last},
                              {"token", r.token},
                              {"text", r.text},
                              {"naive_seconds", r.naive_s},
                              {"naive_flops", r.naive_flops},
                              {"cached_seconds", r.cached_s},
                              {"cached_flops", r.cached_flops},
                              {"bitwise_equal", r.cmp.equal},
                              {"max_ulp", r.cmp.max_ulp}});
    if (run.naive2)
        for (std::size_t i = 0; i < rows.size(); i++) {
            j["steps"][i]["second_device_naive_seconds"] = rows[i].other_naive_s;
            j["steps"][i]["second_device_cached_seconds"] = rows[i].other_cached_s;
            if (!rows[i].cmp.equal) j["steps"][i]["differs"] = rows[i].differs;
        }
    if (run.fp32)
        for (std::size_t i = 0; i < rows.size(); i++) {
            j["steps"][i]["drift_from_fp32"] = rows[i].drift;
            j["steps"][i]["kl_from_fp32"] = rows[i].kl;
            j["steps"][i]["same_top1_as_fp32"] = rows[i].same_top1;
        }
    j["summary"] = {{"steps", o.steps},
                    {"bitwise_equal_steps", s.n_equal},
                    {"all_bitwise_equal", s.n_equal == int(rows.size())},
                    {"naive_seconds", s.naive_total},
                    {"cached_seconds", s.cached_total},
                    {"speedup", s.naive_total / s.cached_total},
                    {"naive_flops", s.naive_flops},
                    {"cached_flops", s.cached_flops},
                    {"flop_ratio", double(s.naive_flops) / double(s.cached_flops)},
                    {"kv_positions", s.T},
                    {"kv_bytes", s.kv_used},
                    {"kv_bytes_formula", kv_bytes(c, s.T, run.format)}};
    if (o.logprobs) {
        j["logprobs"] = s.logprobs;
        j["summary"]["rescored_logprobs_bitwise_equal"] = s.rescore_equal;
    }
    if (run.fp32) {
        j["summary"]["max_drift_from_fp32"] = s.max_drift;
        j["summary"]["max_kl_from_fp32"] = s.max_kl;
        if (!run.scales.empty()) j["summary"]["kv_scales"] = run.scales;
        j["summary"]["same_top1_as_fp32_steps"] = s.same_top1;
    }
    fmt::print("{}\n", json_document(j));
}

// The title, the model, the prompt and the table's column names.
void print_header(const DemoOptions& o, const SideBySide& run, const std::vector<int>& tokens, int P) {
    const LoadedModel& lm = run.lm;
    std::string prompt_text;
    for (int i = tokens[0] == 1 ? 1 : 0; i < P; i++) prompt_text += token_text(lm, i ? tokens[i - 1] : 1, tokens[i]);
    fmt::print("kvlab demo: naive vs KV-cached decode, bit for bit{}{}\n",
               run.naive2        ? fmt::format(", on {} and {}", run.d0, run.d1)
               : run.d0 == "cpu" ? ""
                                 : fmt::format(", on {}", run.d0),
               run.fp32 ? fmt::format(", K and V stored in {} by both", kv_format_name(run.format)) : "");
    fmt::print("model      {}  ({})\n", lm.source, lm.model.config().describe());
    fmt::print(
        "prompt     {} tokens{}; greedy decode of {} more; {}{}\n\n", P,
        lm.tokenizer ? fmt::format(" \"{}\"", one_line(prompt_text)) : "", o.steps, threads_text(o.threads),
        run.attention.tiled() ? fmt::format("; {} attention, split-KV decode", attention_name(run.attention)) : "");
    const std::string other_header =
        run.naive2 ? fmt::format(" {:>14} {:>14}", run.d1 + " naive ms", run.d1 + " cached ms") : std::string();
    fmt::print("{:>7} {:>9} {:>6}  {:<12} {:>9} {:>11} {:>9} {:>11} {:>8}{}  {}\n", "step", "pos", "token", "text",
               "naive ms", "naive MFLOP", "cached ms", "cached MFLOP", "speedup", other_header, "logits");
}

// Row i of the table: step i (0 is the prefill).
void print_row(const SideBySide& run, std::size_t i) {
    const auto& r = run.rows[i];
    const std::string pos =
        r.pos_first == r.pos_last ? fmt::format("{}", r.pos_first) : fmt::format("{}-{}", r.pos_first, r.pos_last);
    const std::string verdict = r.cmp.equal ? (run.naive2 ? "all 4 bitwise equal" : "bitwise equal")
                                            : fmt::format("DIFFER ({} vs {} naive: first at index {}, max {} ulp)",
                                                          r.differs, run.d0, r.cmp.first, r.cmp.max_ulp);
    const std::string other =
        run.naive2 ? fmt::format(" {:>14.3f} {:>14.3f}", r.other_naive_s * 1e3, r.other_cached_s * 1e3) : std::string();
    fmt::print("{:>7} {:>9} {:>6}  {:<12} {:>9.3f} {:>11.3f} {:>9.3f} {:>11.3f} {:>7.1f}x{}  {}\n",
               i == 0 ? std::string("prefill") : fmt::format("{}", i), pos, r.token,
               fmt::format("\"{}\"", one_line(r.text)), r.naive_s * 1e3, r.naive_flops / 1e6, r.cached_s * 1e3,
               r.cached_flops / 1e6, r.naive_s / r.cached_s, other, verdict);
}

// The lines under the table: the text, equality, time, the speedup's trend, FLOPs, the cache's bytes.
void print_summary(const SideBySide& run, const Summary& s) {
    const Config& c = run.lm.model.config();
    const std::vector<StepRow>& rows = run.rows;
    fmt::print("\ngenerated  \"{}\"\n", one_line(s.generated));
    fmt::print("equality   {} of {} steps bitwise equal ({}full logit vectors of {} floats)\n", s.n_equal, rows.size(),
               run.naive2 ? fmt::format("naive and cached on {} and {}: four ", run.d0, run.d1) : "", c.vocab_size);
    if (run.fp32)
        fmt::print(
            "format     {}: both decoders store K and V in it; against fp32 naive decode the logits move by "
            "at most {:.3g} (KL at most {:.3g}), and {} of {} steps pick the same greedy token\n",
            kv_format_name(run.format), s.max_drift, s.max_kl, s.same_top1, rows.size());
    if (!run.scales.empty())
        fmt::print(
            "scales     calibrated from the --kv-calibrate text: K and V of layer 0 {:.3g} and {:.3g}, "
            "of every layer between {:.3g} and {:.3g}\n",
            run.scales[0], run.scales[1], *std::min_element(run.scales.begin(), run.scales.end()),
            *std::max_element(run.scales.begin(), run.scales.end()));
    if (!s.logprobs.empty())
        fmt::print("logprobs   {} decoded tokens, sum {:.4f}; one prefill of the text rescored {}\n", s.logprobs.size(),
                   std::accumulate(s.logprobs.begin(), s.logprobs.end(), 0.0),
                   s.rescore_equal ? "every one bit for bit" : "them DIFFERENTLY");
    fmt::print("time       naive {:.1f} ms, cached {:.1f} ms: cached is {:.1f}x faster over the run\n",
               s.naive_total * 1e3, s.cached_total * 1e3, s.naive_total / s.cached_total);
    if (rows.size() >= 11) {
        // Medians of the first and last five decode steps: one slow step (the machine is
        // shared) should not hide the trend.
        auto median_speedup = [&](std::size_t from) {
            std::vector<double> r;
            for (std::size_t i = from; i < from + 5; i++) r.push_back(rows[i].naive_s / rows[i].cached_s);
            std::sort(r.begin(), r.end());
            return r[2];
        };
        fmt::print(
            "trend      per-step speedup {:.1f}x around T = {}, {:.1f}x around T = {}: naive grows with T, "
            "cached does not\n",
            median_speedup(1), rows[3].pos_last + 1, median_speedup(rows.size() - 5),
            rows[rows.size() - 3].pos_last + 1);
    }
    fmt::print("FLOPs      naive {:.2f} M, cached {:.2f} M: ratio {:.1f}x (counted by the kernels)\n",
               s.naive_flops / 1e6, s.cached_flops / 1e6, double(s.naive_flops) / double(s.cached_flops));
    if (kv_format_int(int(run.format))) {
        // An integer row is its groups' codes plus a scale and a minimum per group, padded.
        const int f = int(run.format), group = kv_int_group(c.head_size());
        const int groups = c.head_size() / group;
        fmt::print(
            "KV cache   {} positions = {} bytes = 2 (K,V) x {} layers x {} x {} KV heads x {} B a row ({} "
            "group{} of {} {}-bit codes, each with an fp32 scale and minimum)\n",
            s.T, s.kv_used, c.n_layers, s.T, c.n_kv_heads, kv_row_bytes(f, c.head_size()), groups,
            groups == 1 ? "" : "s", group, kv_int_bits(f));
        return;
    }
    fmt::print("KV cache   {} positions = {} bytes = 2 (K,V) x {} B x {} layers x {} x {} KV heads x {} head_size{}\n",
               s.T, s.kv_used, kv_format_bytes(int(run.format)), c.n_layers, s.T, c.n_kv_heads, c.head_size(),
               run.fp32 ? fmt::format(" ({} codes)", kv_format_name(run.format)) : "");
}

}  // namespace

int run_demo(const DemoOptions& o) {
    const LoadedModel lm = load_model(o.m.model, o.m.tokenizer, stories260k_shape(), o.m.seed, o.m.panel_cache);
    // Every decoded token is fed back: the run needs P + steps positions.
    std::vector<int> tokens = checked_prompt(lm, o.prompt, o.tokens, "Once upon a time", o.steps, 0);
    const int P = int(tokens.size());
    SideBySide run(lm, o);

    const std::vector<float>* logits = &run.step("prefill", tokens, tokens);
    std::string generated;
    std::vector<float> logprobs;  // [steps] with --logprobs
    {
        const Progress progress;  // naive decode is O(T^2) a step: a long run shows where it is
        for (int s = 0; s < o.steps; s++) {
            progress(fmt::format("demo: step {} of {}, T = {}", s + 1, o.steps, tokens.size() + 1));
            const int next = argmax(*logits);
            if (o.logprobs) logprobs.push_back(token_logprob(logits->data(), int(logits->size()), next));
            generated += token_text(lm, tokens.back(), next);
            tokens.push_back(next);
            logits = &run.step("decode", tokens, std::span<const int>(&tokens.back(), 1));
        }
    }  // the line is cleared before the table

    Summary s = summarize(run, P, generated);
    if (o.logprobs) {
        s.logprobs = logprobs;
        s.rescore_equal = !first_difference(logprobs, run.rescore(tokens, P));
    }
    if (o.json) {
        print_json(o, run, tokens, s);
    } else {
        print_header(o, run, tokens, P);
        for (std::size_t i = 0; i < run.rows.size(); i++) print_row(run, i);
        print_summary(run, s);
    }
    if (s.n_equal != int(run.rows.size())) {
        fmt::print(stderr, "kvlab: error: logits differ at {} of {} steps\n", int(run.rows.size()) - s.n_equal,
                   run.rows.size());
        return 1;
    }
    if (!s.rescore_equal) {
        fmt::print(stderr, "kvlab: error: rescoring by one prefill changed a log-probability\n");
        return 1;
    }
    return 0;
}

}  // namespace kvlab::cli
