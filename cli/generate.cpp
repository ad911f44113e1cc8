// kvlab generate: text from the cached decoder, sampled as llama2.c samples it.
#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

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

// --logprobs: each generated token's log-probability, and whether one prefill rescored them all
// bit for bit.
void print_logprobs(const LoadedModel& lm, const std::vector<int>& tokens, int P, const std::vector<float>& logprobs,
                    bool rescore_equal) {
    double total = 0.0;
    fmt::print("\n{:>5} {:>6}  {:<14} {:>12}\n", "pos", "token", "text", "logprob");
    for (std::size_t g = 0; g < logprobs.size(); g++) {
        const int pos = P + int(g), token = tokens[std::size_t(pos)];
        const std::string text = lm.tokenizer ? token_text(lm, tokens[std::size_t(pos - 1)], token) : "";
        fmt::print("{:>5} {:>6}  {:<14} {:>12.6f}\n", pos, token, one_line(text), logprobs[g]);
        total += logprobs[g];
    }
    fmt::print("logprobs  {} generated tokens, sum {:.4f}; one prefill of the text rescored {}\n", logprobs.size(),
               total, rescore_equal ? "every one bit for bit" : "them DIFFERENTLY");
}

}  // namespace

int run_generate(const GenerateOptions& o) {
    const LoadedModel lm = load_model(o.m.model, o.m.tokenizer, stories260k_shape(), o.m.seed, o.m.panel_cache);
    const Config& c = lm.model.config();
    // The last sampled token is printed but never fed back, so it needs no position.
    std::vector<int> tokens = checked_prompt(lm, o.prompt, o.tokens, "", o.steps, -1);
    const int P = int(tokens.size());
    Sampler sampler(c.vocab_size, o.temperature, o.top_p, o.sample_seed);
    const std::vector<std::string> devices = parse_devices(o.device);
    if (devices.size() != 1) throw Error("generate: --device takes one device (cpu, gpu or gpu-host)");
    BackendOptions bo;
    bo.graphs = o.graphs;
    const std::unique_ptr<Backend> backend = make_backend(devices[0], lm.model, bo);
    ContiguousCache cache(c, ContiguousCache::Layout::head_major, backend->memory());
    const KVFormat format = parse_kv_format(o.kv_format);
    cache.set_kv_format(format, kv_calibration(lm, format, o.kv_calibrate));
    CachedDecoder dec(*backend, cache);
    dec.exec.n_threads = o.threads;
    dec.exec.attention = attention_spec(o.attention);

    // Like llama2.c, the prompt is echoed (BOS itself prints nothing) and generation stops early
    // if the model emits BOS, which delimits stories in its training data.
    std::string text;
    auto emit = [&](int prev, int token) {
        const std::string piece = lm.tokenizer ? token_text(lm, prev, token) : fmt::format("{} ", token);
        text += piece;
        if (!o.json) {
            fmt::print("{}", piece);
            flush_stdout();  // a closed pipe stops the decoding here
        }
    };
    for (int i = tokens[0] == Tokenizer::kBos ? 1 : 0; i < P; i++) emit(i ? tokens[i - 1] : Tokenizer::kBos, tokens[i]);

    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> logits = dec.prefill(tokens);
    int generated = 0;
    std::vector<float> logprobs;  // [generated] --logprobs: each generated token's, under the model's softmax
    for (int s = 0; s < o.steps; s++) {
        const std::vector<float> raw = o.logprobs ? logits : std::vector<float>{};  // sample() rescales logits
        const int next = sampler.sample(logits);
        if (next == Tokenizer::kBos) break;
        if (o.logprobs) logprobs.push_back(token_logprob(raw.data(), c.vocab_size, next));
        emit(tokens.back(), next);
        tokens.push_back(next);
        generated++;
        if (s + 1 < o.steps) logits = dec.decode(next);
    }
    const double secs = seconds_since(t0);
    // Rescoring: one prefill of the whole text on a fresh cache gives every log-probability again.
    std::vector<float> rescored;
    if (o.logprobs && generated > 0) {
        ContiguousCache fresh(c, ContiguousCache::Layout::head_major, backend->memory());
        fresh.set_kv_format(cache.kv_format(), cache.kv_scales());
        CachedDecoder scorer(*backend, fresh);
        scorer.exec = dec.exec;
        rescored = rescore(scorer, tokens, P);
    }
    const bool rescore_equal = !first_difference(logprobs, rescored);
    if (o.json) {
        nlohmann::json j = {{"model", lm.source},
                            {"prompt_tokens", std::vector<int>(tokens.begin(), tokens.begin() + P)},
                            {"generated_tokens", std::vector<int>(tokens.begin() + P, tokens.end())},
                            {"text", text},
                            {"temperature", o.temperature},
                            {"top_p", o.top_p},
                            {"seed", o.sample_seed},
                            {"kv_format", kv_format_name(cache.kv_format())},
                            {"seconds", secs},
                            {"tokens_per_second", generated / secs},
                            {"threads", o.threads},
                            {"threads_choice", threads_json()}};
        if (o.logprobs) j["logprobs"] = logprobs, j["rescored_logprobs_bitwise_equal"] = rescore_equal;
        fmt::print("{}\n", json_document(j));
    } else {
        fmt::print("\n");
        if (o.logprobs) print_logprobs(lm, tokens, P, logprobs, rescore_equal);
        fmt::print(stderr, "achieved tok/s: {:.1f} ({} tokens in {:.3f} s, {})\n", generated / secs, generated, secs,
                   threads_text(o.threads));
    }
    if (!rescore_equal) fmt::print(stderr, "kvlab: error: rescoring by one prefill changed a log-probability\n");
    return rescore_equal ? 0 : 1;
}

}  // namespace kvlab::cli
