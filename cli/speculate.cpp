// kvlab speculate: greedy speculative decoding (core/speculative.h) against plain greedy cached
// decode of the same target in the same run: the acceptance figures, the target steps saved, the
// wall-clock speedup, and whether tokens and logits are bitwise equal (exit 1 when not).
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "checkpoint.h"
#include "commands.h"
#include "common.h"
#include "compare.h"
#include "device.h"
#include "speculative.h"

namespace kvlab::cli {

int run_speculate(const SpeculateOptions& o) {
    const LoadedModel lm = load_model(o.m.model, o.m.tokenizer, stories260k_shape(), o.m.seed);
    const Config& c = lm.model.config();
    // The last emitted token is never run, so it needs no position (as in generate).
    const std::vector<int> prompt = checked_prompt(lm, o.prompt, o.tokens, "", o.steps, -1);
    if (o.k < 1) throw Error(fmt::format("--k must be at least 1, not {}", o.k));

    // The draft: the target itself, a random model one layer deep, or a checkpoint.
    std::optional<Model> draft_model;
    std::string draft_name;
    if (o.draft == "self") {
        draft_name = "self (the target itself)";
    } else if (o.draft == "random") {
        Config dc = c;
        dc.n_layers = 1;
        draft_model.emplace(random_model(dc, o.draft_seed));
        draft_name = fmt::format("random: the target's shape with 1 layer (seed {})", o.draft_seed);
    } else {
        draft_model.emplace(load_checkpoint(o.draft));
        draft_name = o.draft;
    }
    if (draft_model && draft_model->config().vocab_size != c.vocab_size)
        throw Error(fmt::format("draft {}: vocab_size {} differs from the target's {}", one_line(o.draft),
                                draft_model->config().vocab_size, c.vocab_size));

    const std::vector<std::string> devices = parse_devices(o.device);
    if (devices.size() != 1) throw Error("speculate: --device takes one device (cpu, gpu or gpu-host)");
    const std::unique_ptr<Backend> backend = make_backend(devices[0], lm.model);
    const std::unique_ptr<Backend> draft_backend = draft_model ? make_backend(devices[0], *draft_model) : nullptr;
    CachedDecoder plain(*backend), target(*backend), draft(draft_backend ? *draft_backend : *backend);
    plain.exec.n_threads = target.exec.n_threads = draft.exec.n_threads = o.threads;
    SpeculativeDecoder spec(target, draft, o.k);

    // Each decode timed `reps` times, alternating; the fastest of each counts.
    DecodeRun want, got;
    double plain_s = std::numeric_limits<double>::infinity(), spec_s = plain_s;
    for (int r = 0; r < o.reps; r++) {
        auto t0 = std::chrono::steady_clock::now();
        want = greedy_decode(plain, prompt, o.steps);
        plain_s = std::min(plain_s, seconds_since(t0));
        t0 = std::chrono::steady_clock::now();
        got = spec.generate(prompt, o.steps);
        spec_s = std::min(spec_s, seconds_since(t0));
    }
    const bool tokens_equal = got.tokens == want.tokens;
    const BitComparison cmp = compare_bits(want.logits, got.logits);
    const bool equal = tokens_equal && cmp.equal;
    const SpeculativeStats& st = got.stats;
    const double tokens_per_step = double(o.steps) / st.target_steps;

    // The text, as generate prints it: the prompt echoed (BOS prints nothing), up to a BOS.
    auto piece = [&](int prev, int t) { return lm.tokenizer ? token_text(lm, prev, t) : fmt::format("{} ", t); };
    std::string text;
    for (std::size_t i = prompt[0] == Tokenizer::kBos ? 1 : 0; i < prompt.size(); i++)
        text += piece(i ? prompt[i - 1] : Tokenizer::kBos, prompt[i]);
    int prev = prompt.back();
    for (int t : got.tokens) {
        if (t == Tokenizer::kBos) break;
        text += piece(prev, t);
        prev = t;
    }

    if (o.json) {
        nlohmann::json j = {{"model", lm.source},
                            {"draft", draft_name},
                            {"k", o.k},
                            {"steps", o.steps},
                            {"prompt_tokens", prompt},
                            {"generated_tokens", got.tokens},
                            {"text", text},
                            {"proposed", st.proposed},
                            {"accepted", st.accepted},
                            {"acceptance_rate", st.acceptance_rate()},
                            {"mean_accepted_per_target_step", st.accepted_per_target_step()},
                            {"tokens_per_target_step", tokens_per_step},
                            {"target_steps", st.target_steps},
                            {"plain_steps", want.stats.target_steps},
                            {"draft_steps", st.draft_steps},
                            {"plain_seconds", plain_s},
                            {"speculative_seconds", spec_s},
                            {"speedup", plain_s / spec_s},
                            {"tokens_equal", tokens_equal},
                            {"logits_bitwise_equal", cmp.equal},
                            {"bitwise_equal", equal}};
        fmt::print("{}\n", j.dump(2));
        return equal ? 0 : 1;
    }
    fmt::print("{}\n\n", text);
    fmt::print("model       {}\n", lm.source);
    fmt::print("draft       {}, k = {}\n", draft_name, o.k);
    if (st.proposed)
        fmt::print("acceptance  {} of {} drafts accepted ({:.1f}%); {:.2f} accepted per target step (mean)\n",
                   st.accepted, st.proposed, 100.0 * st.acceptance_rate(), st.accepted_per_target_step());
    else
        fmt::print("acceptance  no drafts proposed (one token needs no draft)\n");
    fmt::print("steps       target {} steps for {} tokens ({:.2f} tokens a step); plain greedy decode {}; draft {}\n",
               st.target_steps, o.steps, tokens_per_step, want.stats.target_steps, st.draft_steps);
    fmt::print("time        plain greedy {:.2f} ms, speculative {:.2f} ms: {:.2f}x speedup (fastest of {} run{} each)\n",
               1e3 * plain_s, 1e3 * spec_s, plain_s / spec_s, o.reps, o.reps == 1 ? "" : "s");
    if (equal) {
        fmt::print("equality    tokens and logits bitwise equal to plain greedy cached decode ({} logit vectors of {} "
                   "floats)\n",
                   o.steps, c.vocab_size);
        return 0;
    }
    if (!tokens_equal) {
        const std::size_t i = std::size_t(
            std::mismatch(want.tokens.begin(), want.tokens.end(), got.tokens.begin()).first - want.tokens.begin());
        fmt::print("equality    NOT equal: token {} is {}, plain greedy decode's {}\n", i, got.tokens[i], want.tokens[i]);
    }
    if (!cmp.equal)
        fmt::print("equality    NOT bitwise equal: {} logits differ, the first in token {} (max {} ulp)\n", cmp.n_differ,
                   cmp.first / c.vocab_size, cmp.max_ulp);
    return 1;
}

}  // namespace kvlab::cli
