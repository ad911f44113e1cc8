// kvlab beam: beam search on forked caches (core/beam.h): the beams, the memory their shared
// blocks save against caches of their own, and every beam's logits against naive decode.
#include "beam.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "device.h"
#include "json_text.h"

namespace kvlab::cli {

int run_beam(const BeamOptions& options) {
    // Library callers (the fuzzers) pass the options' default, 0: auto, which main resolves for the CLI.
    BeamOptions o = options;
    resolve_threads(o.threads);
    const LoadedModel lm = load_model(o.m.model, o.m.tokenizer, stories260k_shape(), o.m.seed, o.m.panel_cache);
    const std::vector<int> prompt = checked_prompt(lm, o.prompt, o.tokens, "Once upon a time", o.steps, 0);
    BeamConfig bc;
    bc.width = o.width, bc.steps = o.steps, bc.block_size = o.block_size;
    bc.kv_format = parse_kv_format(o.kv_format);
    bc.attention = attention_spec(o.attention);
    bc.n_threads = o.threads;
    const std::unique_ptr<Backend> backend = make_backend("cpu", lm.model);
    BeamSearch search(*backend, lm.model, bc);
    const BeamRun run = search.run(prompt);
    // Every beam after every step against naive decode of its tokens, K and V stored in the same format.
    NaiveDecoder naive(lm.model, o.threads);
    naive.kv_format = bc.kv_format;
    naive.exec.attention = bc.attention;
    int checked = 0, equal = 0;
    for (const auto& beams : run.steps)
        for (const BeamState& b : beams) checked++, equal += naive.forward(b.tokens) == b.logits;
    const std::vector<BeamState>& last = run.steps.back();
    const auto text = [&](const BeamState& b) {
        std::string s;
        for (std::size_t i = prompt.size(); i < b.tokens.size(); i++) s += token_text(lm, b.tokens[i - 1], b.tokens[i]);
        return s;
    };
    if (o.json) {
        nlohmann::json j = {{"width", o.width},
                            {"steps", o.steps},
                            {"block_size", o.block_size},
                            {"peak_blocks", run.peak_blocks},
                            {"peak_unshared_blocks", run.peak_unshared_blocks},
                            {"beam_steps_checked", checked},
                            {"beam_steps_bitwise_equal_naive", equal},
                            {"threads", o.threads},
                            {"threads_choice", threads_json()}};
        for (const BeamState& b : last)
            j["beams"].push_back({{"tokens", b.tokens}, {"logprob", b.logprob}, {"text", text(b)}});
        fmt::print("{}\n", json_document(j));
        return equal == checked ? 0 : 1;
    }
    fmt::print("kvlab beam: width {}, {} steps after a prompt of {} on {} ({} KV), {}\n", o.width, o.steps,
               prompt.size(), lm.source, kv_format_name(bc.kv_format), threads_text(o.threads));
    for (std::size_t i = 0; i < last.size(); i++)
        fmt::print("  {}. logprob {:9.4f}  {}\n", i + 1, last[i].logprob, one_line(text(last[i])));
    fmt::print(
        "memory     peak {} blocks of {} positions shared by the beams, against {} in caches of their own "
        "({:.0f}% saved)\n",
        run.peak_blocks, o.block_size, run.peak_unshared_blocks,
        100.0 * (1.0 - double(run.peak_blocks) / std::max(1, run.peak_unshared_blocks)));
    fmt::print("exactness  {} of {} beam steps bitwise equal to naive decode of the beam's tokens\n", equal, checked);
    return equal == checked ? 0 : 1;
}

}  // namespace kvlab::cli
