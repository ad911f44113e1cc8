// kvlab demo: the main job. Naive and cached decode run side by side from one prompt; every
// step prints both paths' time and counted FLOPs and whether their full logit vectors are
// bitwise equal.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "compare.h"
#include "decode.h"
#include "device.h"
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
    BitComparison cmp;  // the first of the run's logit vectors that differs from the first device's naive
    std::string differs;  // which one ("" when all equal)
};

}  // namespace

int run_demo(const DemoOptions& o) {
    const LoadedModel lm = load_model(o.m.model, o.m.tokenizer, stories260k_shape(), o.m.seed);
    const Config& c = lm.model.config();
    // Every decoded token is fed back: the run needs P + steps positions.
    std::vector<int> tokens = checked_prompt(lm, o.prompt, o.tokens, "Once upon a time", o.steps, 0);
    const int P = int(tokens.size());

    const std::vector<std::string> devices = parse_devices(o.device);
    BackendOptions bo;
    bo.graphs = o.graphs;
    const std::unique_ptr<Backend> backend = make_backend(devices[0], lm.model, bo);
    NaiveDecoder naive(*backend);
    CachedDecoder cached(*backend);
    naive.exec.n_threads = cached.exec.n_threads = o.threads;
    // A second device runs the same two decoders; all four logit vectors must agree.
    const std::unique_ptr<Backend> backend2 = devices.size() > 1 ? make_backend(devices[1], lm.model, bo) : nullptr;
    std::unique_ptr<NaiveDecoder> naive2 = backend2 ? std::make_unique<NaiveDecoder>(*backend2) : nullptr;
    std::unique_ptr<CachedDecoder> cached2 = backend2 ? std::make_unique<CachedDecoder>(*backend2) : nullptr;
    const std::string d0 = devices[0], d1 = devices.size() > 1 ? devices[1] : "";
    std::vector<StepRow> rows;

    // One step: naive recomputes all of `tokens`; cached runs only `fresh` (the prompt, then one token).
    auto step = [&](const std::string& kind, std::span<const int> fresh) -> const std::vector<float>& {
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
        rows.push_back(r);
        return lc;
    };

    const std::vector<float>* logits = &step("prefill", tokens);
    std::string generated;
    for (int s = 0; s < o.steps; s++) {
        const int next = argmax(*logits);
        generated += token_text(lm, tokens.back(), next);
        tokens.push_back(next);
        logits = &step("decode", std::span<const int>(&tokens.back(), 1));
    }

    double naive_total = 0, cached_total = 0;
    std::uint64_t naive_flops = 0, cached_flops = 0;
    int n_equal = 0;
    for (const auto& r : rows) {
        naive_total += r.naive_s, cached_total += r.cached_s;
        naive_flops += r.naive_flops, cached_flops += r.cached_flops;
        n_equal += r.cmp.equal;
    }
    const int T = cached.pos();
    const std::int64_t kv_used = cached.cache().memory().used_bytes;
    std::string prompt_text;
    for (int i = tokens[0] == 1 ? 1 : 0; i < P; i++) prompt_text += token_text(lm, i ? tokens[i - 1] : 1, tokens[i]);

    if (o.json) {
        nlohmann::json j;
        j["model"] = lm.source;
        j["config"] = {{"dim", c.dim},         {"hidden_dim", c.hidden_dim}, {"n_layers", c.n_layers},
                       {"n_heads", c.n_heads}, {"n_kv_heads", c.n_kv_heads}, {"vocab_size", c.vocab_size},
                       {"max_seq", c.max_seq}};
        j["threads"] = o.threads;
        j["devices"] = devices;
        j["prompt_tokens"] = std::vector<int>(tokens.begin(), tokens.begin() + P);
        j["generated_tokens"] = std::vector<int>(tokens.begin() + P, tokens.end());
        j["generated_text"] = generated;
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
        if (naive2)
            for (std::size_t i = 0; i < rows.size(); i++) {
                j["steps"][i]["second_device_naive_seconds"] = rows[i].other_naive_s;
                j["steps"][i]["second_device_cached_seconds"] = rows[i].other_cached_s;
                if (!rows[i].cmp.equal) j["steps"][i]["differs"] = rows[i].differs;
            }
        j["summary"] = {{"steps", o.steps},
                        {"bitwise_equal_steps", n_equal},
                        {"all_bitwise_equal", n_equal == int(rows.size())},
                        {"naive_seconds", naive_total},
                        {"cached_seconds", cached_total},
                        {"speedup", naive_total / cached_total},
                        {"naive_flops", naive_flops},
                        {"cached_flops", cached_flops},
                        {"flop_ratio", double(naive_flops) / double(cached_flops)},
                        {"kv_positions", T},
                        {"kv_bytes", kv_used},
                        {"kv_bytes_formula", kv_bytes(c, T)}};
        fmt::print("{}\n", j.dump(2));
    } else {
        fmt::print("kvlab demo: naive vs KV-cached decode, bit for bit{}\n",
                   naive2 ? fmt::format(", on {} and {}", d0, d1) : d0 == "cpu" ? "" : fmt::format(", on {}", d0));
        fmt::print("model      {}  ({})\n", lm.source, c.describe());
        fmt::print("prompt     {} tokens{}; greedy decode of {} more; {} thread{}\n\n", P,
                   lm.tokenizer ? fmt::format(" \"{}\"", one_line(prompt_text)) : "", o.steps, o.threads,
                   o.threads == 1 ? "" : "s");
        const std::string other_header =
            naive2 ? fmt::format(" {:>14} {:>14}", d1 + " naive ms", d1 + " cached ms") : std::string();
        fmt::print("{:>7} {:>9} {:>6}  {:<12} {:>9} {:>11} {:>9} {:>11} {:>8}{}  {}\n", "step", "pos", "token", "text",
                   "naive ms", "naive MFLOP", "cached ms", "cached MFLOP", "speedup", other_header, "logits");
        for (std::size_t i = 0; i < rows.size(); i++) {
            const auto& r = rows[i];
            const std::string pos = r.pos_first == r.pos_last ? fmt::format("{}", r.pos_first)
                                                              : fmt::format("{}-{}", r.pos_first, r.pos_last);
            const std::string verdict =
                r.cmp.equal ? (naive2 ? "all 4 bitwise equal" : "bitwise equal")
                            : fmt::format("DIFFER ({} vs {} naive: first at index {}, max {} ulp)", r.differs, d0,
                                          r.cmp.first, r.cmp.max_ulp);
            const std::string other =
                naive2 ? fmt::format(" {:>14.3f} {:>14.3f}", r.other_naive_s * 1e3, r.other_cached_s * 1e3)
                       : std::string();
            fmt::print("{:>7} {:>9} {:>6}  {:<12} {:>9.3f} {:>11.3f} {:>9.3f} {:>11.3f} {:>7.1f}x{}  {}\n",
                       i == 0 ? std::string("prefill") : fmt::format("{}", i), pos, r.token,
                       fmt::format("\"{}\"", one_line(r.text)), r.naive_s * 1e3, r.naive_flops / 1e6, r.cached_s * 1e3,
                       r.cached_flops / 1e6, r.naive_s / r.cached_s, other, verdict);
        }
        fmt::print("\ngenerated  \"{}\"\n", one_line(generated));
        fmt::print("equality   {} of {} steps bitwise equal ({}full logit vectors of {} floats)\n", n_equal,
                   rows.size(), naive2 ? fmt::format("naive and cached on {} and {}: four ", d0, d1) : "",
                   c.vocab_size);
        fmt::print("time       naive {:.1f} ms, cached {:.1f} ms: cached is {:.1f}x faster over the run\n",
                   naive_total * 1e3, cached_total * 1e3, naive_total / cached_total);
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
                   naive_flops / 1e6, cached_flops / 1e6, double(naive_flops) / double(cached_flops));
        fmt::print("KV cache   {} positions = {} bytes = 2 (K,V) x 4 B x {} layers x {} x {} KV heads x {} head_size\n",
                   T, kv_used, c.n_layers, T, c.n_kv_heads, c.head_size());
    }
    if (n_equal != int(rows.size())) {
        fmt::print(stderr, "kvlab: error: logits differ at {} of {} steps\n", int(rows.size()) - n_equal,
                   rows.size());
        return 1;
    }
    return 0;
}

}  // namespace kvlab::cli
