// kvlab generate: text from the cached decoder, sampled as llama2.c samples it.
#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cache.h"
#include "commands.h"
#include "common.h"
#include "decode.h"
#include "device.h"
#include "kv_format.h"
#include "sampler.h"

namespace kvlab::cli {

int run_generate(const GenerateOptions& o) {
    const LoadedModel lm = load_model(o.m.model, o.m.tokenizer, stories260k_shape(), o.m.seed);
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
            std::fflush(stdout);
        }
    };
    for (int i = tokens[0] == Tokenizer::kBos ? 1 : 0; i < P; i++) emit(i ? tokens[i - 1] : Tokenizer::kBos, tokens[i]);

    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> logits = dec.prefill(tokens);
    int generated = 0;
    for (int s = 0; s < o.steps; s++) {
        const int next = sampler.sample(logits);
        if (next == Tokenizer::kBos) break;
        emit(tokens.back(), next);
        tokens.push_back(next);
        generated++;
        if (s + 1 < o.steps) logits = dec.decode(next);
    }
    const double secs = seconds_since(t0);
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
                            {"tokens_per_second", generated / secs}};
        fmt::print("{}\n", j.dump(2));
    } else {
        fmt::print("\n");
        fmt::print(stderr, "achieved tok/s: {:.1f} ({} tokens in {:.3f} s)\n", generated / secs, generated, secs);
    }
    return 0;
}

}  // namespace kvlab::cli
