// kvlab serve-sim: a request workload through the continuous-batching scheduler (core/scheduler.h)
// with an engine's knobs, reporting throughput, latency, pool occupancy, preemptions and prefix
// hits, and checking that every request's logits equal decoding it alone, bit for bit.
#include "serve_sim.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.h"
#include "common.h"
#include "device.h"
#include "json_text.h"
#include "npy.h"
#include "scheduler.h"
#include "speculative.h"

namespace kvlab::cli {

namespace {

using nlohmann::json;

// "8-48" or "32": a range of lengths.
std::pair<int, int> length_range(const std::string& option, const std::string& text) {
    const std::size_t dash = text.find('-');
    const std::vector<int> v = dash == std::string::npos
                                   ? parse_int_list(option, text)
                                   : parse_int_list(option, text.substr(0, dash) + "," + text.substr(dash + 1));
    if (v.empty() || v.size() > 2 || v.front() < 1 || v.back() < v.front())
        throw Error(fmt::format("{} '{}': give N or MIN-MAX with 1 <= MIN <= MAX", option, one_line(text)));
    return {v.front(), v.back()};
}

// The generated workload: arrivals at --arrival-rate per step (Poisson), prompts of --prompt-len
// tokens, a share of them starting with one system prompt, outputs of --output-len.
std::vector<ServeRequest> generated(const ServeSimOptions& o, const Config& c, int max_len) {
    std::mt19937_64 rng(o.workload_seed);
    const auto [p_lo, p_hi] = length_range("--prompt-len", o.prompt_len);
    const auto [o_lo, o_hi] = length_range("--output-len", o.output_len);
    std::uniform_int_distribution<int> token(0, c.vocab_size - 1);
    std::vector<int> system(std::size_t(o.system_prompt_len));
    for (int& t : system) t = token(rng);
    std::exponential_distribution<double> gap(o.arrival_rate > 0 ? o.arrival_rate : 1.0);
    std::vector<ServeRequest> out;
    double at = 0;
    for (int i = 0; i < o.requests; i++) {
        ServeRequest r;
        if (std::bernoulli_distribution(o.system_prompt_share)(rng)) r.prompt = system;
        const int P = std::uniform_int_distribution<int>(p_lo, p_hi)(rng);
        while (int(r.prompt.size()) < P) r.prompt.push_back(token(rng));
        r.max_new_tokens = std::uniform_int_distribution<int>(o_lo, o_hi)(rng);
        if (int(r.prompt.size()) + r.max_new_tokens > max_len)
            throw Error(
                fmt::format("serve-sim: request {} needs {} positions (prompt {} + output {}), past max model "
                            "len {}: shorten --prompt-len, --system-prompt-len or --output-len",
                            i, r.prompt.size() + r.max_new_tokens, r.prompt.size(), r.max_new_tokens, max_len));
        if (o.arrival_rate > 0) at += gap(rng);
        r.arrival = int(at);
        out.push_back(std::move(r));
    }
    return out;
}

std::vector<ServeRequest> from_trace(const std::string& path, const LoadedModel& lm) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(fmt::format("--trace '{}': cannot open for reading", one_line(path)));
    const std::string text{std::istreambuf_iterator<char>(in), {}};
    return parse_serve_trace(text, lm.tokenizer ? &*lm.tokenizer : nullptr,
                             fmt::format("--trace '{}'", one_line(path)));
}

// The pool's block count: --num-blocks, or what --memory-utilization of --device-memory leaves
// after the weights, in blocks of block_size positions in the KV format.
int pool_blocks(const ServeSimOptions& o, const Config& c, KVFormat format, std::string& how) {
    if (o.num_blocks > 0) {
        how = "--num-blocks";
        return o.num_blocks;
    }
    const std::int64_t memory = parse_bytes("--device-memory", o.device_memory);
    const std::int64_t weights = c.n_params(true) * std::int64_t(sizeof(float));
    const std::int64_t block = kv_bytes(c, o.block_size, format);
    const std::int64_t left = std::int64_t(double(memory) * o.memory_utilization) - weights;
    if (o.memory_utilization <= 0 || o.memory_utilization > 1)
        throw Error(fmt::format("--memory-utilization {} is not in (0, 1]", o.memory_utilization));
    if (left < block)
        throw Error(
            fmt::format("--memory-utilization {} of {} bytes leaves {} after {} bytes of weights: not one block "
                        "of {} bytes",
                        o.memory_utilization, memory, std::max<std::int64_t>(left, 0), weights, block));
    how = fmt::format("{:.2f} of {} bytes, less {} bytes of weights, in blocks of {} bytes", o.memory_utilization,
                      memory, weights, block);
    return int(std::min<std::int64_t>(left / block, 1 << 24));
}

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, std::size_t(p * double(v.size() - 1) + 0.5))];
}

// Every request alone (greedy decode on a contiguous cache in the pool's format): how many match
// the scheduler's logits bit for bit, and the first that does not.
std::pair<int, std::string> check_alone(const LoadedModel& lm, const Scheduler& s,
                                        const std::vector<ServeRequest>& requests) {
    CachedDecoder alone(lm.model, s.config().n_threads);
    alone.cache().set_kv_format(s.config().kv_format);
    alone.exec.attention = s.config().attention;
    int equal = 0;
    std::string first;
    for (std::size_t i = 0; i < requests.size(); i++) {
        const DecodeRun want = greedy_decode(alone, requests[i].prompt, requests[i].max_new_tokens);
        if (want.logits == s.result(int(i)).logits)
            equal++;
        else if (first.empty())
            first = fmt::format("request {} differs from decoding it alone", i);
    }
    return {equal, first};
}

// SHA-256 of every request's logits, in request order: two runs that agree on it agree bit for bit.
std::string logits_digest(const Scheduler& s, int n) {
    std::string bytes;
    for (int i = 0; i < n; i++) {
        const std::vector<float>& l = s.result(i).logits;
        bytes.append(reinterpret_cast<const char*>(l.data()), l.size() * sizeof(float));
    }
    return sha256_hex(bytes);
}

// The store's traffic (null without one): what went in, came back, was missing or refused.
json store_report(const Scheduler& s, const std::string& role, int flushed, double hit_rate) {
    const BlockStore* store = s.config().store;
    if (!store) return nullptr;
    const BlockPool::StoreStats& st = s.pool().store_stats();
    return {{"store", store->describe()},
            {"role", role},
            {"fetched_blocks", st.fetched},
            {"hit_rate", hit_rate},
            {"offloaded_blocks", st.offloaded - flushed},
            {"flushed_blocks", flushed},
            {"missed", st.missed},
            {"rejected", st.rejected},
            {"errors", store->errors()}};
}

void print_store(const json& j) {
    std::string rejected;
    for (const auto& [why, count] : j["rejected"].items())
        rejected += fmt::format("{}{} {}", rejected.empty() ? "" : ", ", count.get<std::int64_t>(), why);
    fmt::print(
        "store       {} ({}): {} blocks fetched ({:.1f}% of prompt positions), {} put on eviction, {} at the end; "
        "{} missing, {} refused{}{}\n",
        j["store"].get<std::string>(), j["role"].get<std::string>(), j["fetched_blocks"].get<std::int64_t>(),
        100 * j["hit_rate"].get<double>(), j["offloaded_blocks"].get<std::int64_t>(),
        j["flushed_blocks"].get<std::int64_t>(), j["missed"].get<std::int64_t>(), j["rejected"].size() ? "" : "0",
        rejected.empty() ? "" : " (" + rejected + ")",
        j["errors"].get<std::int64_t>() ? fmt::format("; {} store errors", j["errors"].get<std::int64_t>()) : "");
}

// The run's figures as JSON: throughput, latency, the pool, the store, and the exactness check.
json serve_report(const ServeSimOptions& o, const LoadedModel& lm, const Scheduler& s,
                  const std::vector<ServeRequest>& requests, double seconds, const std::string& blocks_from,
                  int flushed) {
    const int n = int(requests.size());
    std::vector<double> ttft, tpot;  // steps: arrival to first token; per token after the first
    std::int64_t tokens = 0, prompt_positions = 0, hit_positions = 0, store_positions = 0, preemptions = 0;
    for (int i = 0; i < n; i++) {
        const ServeResult& r = s.result(i);
        tokens += std::int64_t(r.output.size());
        prompt_positions += std::int64_t(requests[std::size_t(i)].prompt.size());
        hit_positions += r.prefix_hit;
        store_positions += r.store_hit;
        preemptions += r.preemptions;
        ttft.push_back(r.first_token_step - requests[std::size_t(i)].arrival + 1);
        if (r.output.size() > 1)
            tpot.push_back(double(r.finish_step - r.first_token_step) / double(r.output.size() - 1));
    }
    double occupancy = 0;
    int peak = 0;
    for (const ServeStep& st : s.history()) occupancy += st.blocks_used, peak = std::max(peak, st.blocks_used);
    const int steps = std::max(1, s.steps());
    occupancy /= steps * double(s.config().n_blocks);
    const auto [equal, first] = o.check ? check_alone(lm, s, requests) : std::pair<int, std::string>{0, ""};
    const auto rate = [&](std::int64_t positions) {
        return prompt_positions ? double(positions) / double(prompt_positions) : 0.0;
    };
    return {{"model", lm.source},
            {"requests", n},
            {"steps", s.steps()},
            {"seconds", seconds},
            {"generated_tokens", tokens},
            {"tokens_per_second", double(tokens) / std::max(seconds, 1e-9)},
            {"tokens_per_step", double(tokens) / steps},
            {"ttft_steps", {{"p50", percentile(ttft, 0.5)}, {"p99", percentile(ttft, 0.99)}}},
            {"tpot_steps", {{"p50", percentile(tpot, 0.5)}, {"p99", percentile(tpot, 0.99)}}},
            {"seconds_per_step", seconds / steps},
            {"pool",
             {{"blocks", s.config().n_blocks},
              {"block_size", s.config().block_size},
              {"from", blocks_from},
              {"mean_occupancy", occupancy},
              {"peak_blocks", peak}}},
            {"preemptions", preemptions},
            {"prefix_hit_rate", rate(hit_positions)},
            {"store", store_report(s, o.role, flushed, rate(store_positions))},
            {"logits_sha256", logits_digest(s, n)},
            {"threads", s.config().n_threads},
            {"threads_choice", threads_json()},
            {"check",
             o.check ? json{{"bitwise_equal_alone", equal}, {"of", n}, {"first_difference", first}} : json(nullptr)},
            {"ok", !o.check || equal == n}};
}

void print_serve_report(const json& j, const LoadedModel& lm, const SchedulerConfig& c) {
    const double step_ms = 1e3 * j["seconds_per_step"].get<double>();
    const json &ttft = j["ttft_steps"], &tpot = j["tpot_steps"], &pool = j["pool"];
    fmt::print("kvlab serve-sim: {} requests on {} ({}), {} steps in {:.2f} s ({})\n", j["requests"].get<int>(),
               lm.source, lm.model.config().describe(), j["steps"].get<int>(), j["seconds"].get<double>(),
               threads_text(c.n_threads));
    fmt::print("pool        {} blocks of {} positions ({}); occupancy mean {:.0f}%, peak {} blocks\n", c.n_blocks,
               c.block_size, pool["from"].get<std::string>(), 100 * pool["mean_occupancy"].get<double>(),
               pool["peak_blocks"].get<int>());
    fmt::print(
        "knobs       max model len {}, max batch tokens {}, prefix caching {}, preemption by {}, watermark {}, "
        "KV {}\n",
        c.max_model_len, c.max_batch_tokens, c.prefix_caching ? "on" : "off",
        c.preemption == Preemption::swap ? "swap" : "recompute", c.watermark, kv_format_name(c.kv_format));
    fmt::print("throughput  {} tokens: {:.0f} tokens/s, {:.2f} tokens/step\n",
               j["generated_tokens"].get<std::int64_t>(), j["tokens_per_second"].get<double>(),
               j["tokens_per_step"].get<double>());
    fmt::print(
        "latency     time to first token p50 {:.0f} steps ({:.2f} ms), p99 {:.0f} steps; per output token p50 "
        "{:.2f} steps ({:.2f} ms), p99 {:.2f}\n",
        ttft["p50"].get<double>(), step_ms * ttft["p50"].get<double>(), ttft["p99"].get<double>(),
        tpot["p50"].get<double>(), step_ms * tpot["p50"].get<double>(), tpot["p99"].get<double>());
    fmt::print("cache       {} preemptions; prefix hits {:.1f}% of prompt positions\n",
               j["preemptions"].get<std::int64_t>(), 100 * j["prefix_hit_rate"].get<double>());
    if (!j["store"].is_null()) print_store(j["store"]);
    if (const json& check = j["check"]; !check.is_null()) {
        const std::string first = check["first_difference"].get<std::string>();
        fmt::print("exactness   {} of {} requests bitwise equal to decoding them alone{}; logits sha256 {}\n",
                   check["bitwise_equal_alone"].get<int>(), check["of"].get<int>(),
                   first.empty() ? "" : " (" + first + ")", j["logits_sha256"].get<std::string>().substr(0, 16));
    }
}

// The scheduler's knobs from the options (one-line Errors for bad ones).
SchedulerConfig scheduler_config(const ServeSimOptions& o, const Config& c, std::string& blocks_from) {
    SchedulerConfig sc;
    sc.block_size = o.block_size;
    sc.max_batch_tokens = o.max_batch_tokens;
    sc.max_model_len = o.max_model_len;
    sc.watermark = o.watermark;
    sc.kv_format = parse_kv_format(o.kv_format);
    sc.attention = attention_spec(o.attention);
    sc.n_threads = o.threads;
    if (o.prefix_caching != "on" && o.prefix_caching != "off")
        throw Error(fmt::format("--prefix-caching '{}': on or off", one_line(o.prefix_caching)));
    sc.prefix_caching = o.prefix_caching == "on";
    if (o.preemption != "recompute" && o.preemption != "swap")
        throw Error(fmt::format("--preemption '{}': recompute or swap", one_line(o.preemption)));
    sc.preemption = o.preemption == "swap" ? Preemption::swap : Preemption::recompute;
    if (o.role != "both" && o.role != "prefill" && o.role != "decode")
        throw Error(fmt::format("--role '{}': both, prefill or decode", one_line(o.role)));
    if (o.role != "both" && o.store.empty())
        throw Error(fmt::format("--role {} needs --store: the blocks travel through it", o.role));
    if (!o.store.empty() && !sc.prefix_caching)
        throw Error("--store needs --prefix-caching on: blocks are stored and found by their prefix");
    sc.n_blocks = pool_blocks(o, c, sc.kv_format, blocks_from);
    return sc;
}

}  // namespace

int run_serve_sim(const ServeSimOptions& options) {
    // Library callers (the fuzzers) pass the options' default, 0: auto, which main resolves for the CLI.
    ServeSimOptions o = options;
    resolve_threads(o.threads);
    const LoadedModel lm = load_model(o.m.model, o.m.tokenizer, stories260k_shape(), o.m.seed, o.m.panel_cache);
    const Config& c = lm.model.config();
    std::string blocks_from;
    SchedulerConfig sc = scheduler_config(o, c, blocks_from);
    const std::unique_ptr<BlockStore> store = o.store.empty() ? nullptr : open_block_store(o.store);
    sc.store = store.get();
    const std::unique_ptr<Backend> backend = make_backend("cpu", lm.model);
    Scheduler s(*backend, lm.model, sc);
    const int max_len = s.config().max_model_len;
    std::vector<ServeRequest> requests = o.trace.empty() ? generated(o, c, max_len) : from_trace(o.trace, lm);
    // Disaggregated prefill: this process runs each prompt and its first token, and leaves the blocks in the store.
    if (o.role == "prefill")
        for (ServeRequest& r : requests) r.max_new_tokens = 1;
    for (const ServeRequest& r : requests) s.add(r);
    const auto t0 = std::chrono::steady_clock::now();
    {
        const Progress progress;
        while (s.step())
            progress(fmt::format("serve-sim: step {}: {} running, {} waiting", s.steps(), s.history().back().running,
                                 s.history().back().waiting));
    }
    const double seconds = seconds_since(t0);
    // What the pool still holds goes to the store too, for the next process.
    const int flushed = store ? s.pool().flush_to_store() : 0;
    const json j = serve_report(o, lm, s, requests, seconds, blocks_from, flushed);
    if (o.json)
        fmt::print("{}\n", json_document(j));
    else
        print_serve_report(j, lm, s.config());
    return j["ok"].get<bool>() ? 0 : 1;
}

std::vector<ServeRequest> parse_serve_trace(const std::string& text, const Tokenizer* tokenizer,
                                            const std::string& what) {
    std::vector<ServeRequest> out;
    std::size_t at = 0;
    for (int n = 1; at < text.size(); n++) {
        const std::size_t end = std::min(text.find('\n', at), text.size());
        const std::string line = text.substr(at, end - at);
        at = end + 1;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const auto bad = [&](const std::string& why) { return Error(fmt::format("{} line {}: {}", what, n, why)); };
        const json j = json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
        ServeRequest r;
        if (j.contains("tokens") && j["tokens"].is_array()) {
            for (const json& t : j["tokens"]) {
                if (!t.is_number_integer()) throw bad("a token that is not an integer");
                r.prompt.push_back(int(std::clamp<std::int64_t>(t.get<std::int64_t>(), -1, INT32_MAX)));
            }
        } else if (j.contains("prompt") && j["prompt"].is_string()) {
            if (!tokenizer) throw bad("a text prompt needs a tokenizer (give --tokenizer, or \"tokens\")");
            r.prompt = tokenizer->encode(j["prompt"].get<std::string>(), true, false);
        } else {
            throw bad("no \"tokens\" list or \"prompt\" text");
        }
        if (!j.contains("max_new_tokens") || !j["max_new_tokens"].is_number_integer())
            throw bad("no integer \"max_new_tokens\"");
        r.max_new_tokens = int(std::clamp<std::int64_t>(j["max_new_tokens"].get<std::int64_t>(), -1, INT32_MAX));
        if (j.contains("arrival") && !j["arrival"].is_number_integer())
            throw bad("an \"arrival\" that is not an integer");
        r.arrival = int(std::clamp<std::int64_t>(j.value("arrival", std::int64_t{0}), 0, INT32_MAX));
        out.push_back(std::move(r));
    }
    std::stable_sort(out.begin(), out.end(),
                     [](const ServeRequest& a, const ServeRequest& b) { return a.arrival < b.arrival; });
    return out;
}

}  // namespace kvlab::cli
