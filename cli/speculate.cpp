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
#include "json_text.h"
#include "speculative.h"

namespace kvlab::cli {

namespace {

// The draft: the target itself (no model of its own), a random model one layer deep, or a checkpoint.
struct Draft {
    std::optional<Model> model;
    std::string name;
};

Draft load_draft(const SpeculateOptions& o, const Config& c) {
    Draft d;
    if (o.draft == "self") {
        d.name = "self (the target itself)";
    } else if (o.draft == "random") {
        Config dc = c;
        dc.n_layers = 1;
        d.model.emplace(random_model(dc, o.draft_seed));
        d.name = fmt::format("random: the target's shape with 1 layer (seed {})", o.draft_seed);
    } else {
        d.model.emplace(load_checkpoint(o.draft));
        d.name = o.draft;
    }
    if (d.model && d.model->config().vocab_size != c.vocab_size)
        throw Error(fmt::format("draft {}: vocab_size {} differs from the target's {}", one_line(o.draft),
                                d.model->config().vocab_size, c.vocab_size));
    return d;
}

// Plain greedy decode (want) and speculative decode (got) of the same target, and how they compare.
struct Race {
    DecodeRun want, got;
    double plain_s = std::numeric_limits<double>::infinity(), spec_s = plain_s;  // the fastest run of each
    bool tokens_equal = false;
    BitComparison cmp;  // of the logits
    bool equal() const { return tokens_equal && cmp.equal; }
};

Race race(const SpeculateOptions& o, const Model& model, const Draft& d, const std::vector<int>& prompt) {
    const std::vector<std::string> devices = parse_devices(o.device);
    if (devices.size() != 1) throw Error("speculate: --device takes one device (cpu, gpu or gpu-host)");
    const std::unique_ptr<Backend> backend = make_backend(devices[0], model);
    const std::unique_ptr<Backend> draft_backend = d.model ? make_backend(devices[0], *d.model) : nullptr;
    CachedDecoder plain(*backend), target(*backend), draft(draft_backend ? *draft_backend : *backend);
    plain.exec.n_threads = target.exec.n_threads = draft.exec.n_threads = o.threads;
    plain.exec.attention = target.exec.attention = draft.exec.attention = attention_spec(o.attention);
    // Every cache in the format: speculative decoding must still give plain greedy decode's bits.
    const KVFormat format = parse_kv_format(o.kv_format);
    for (CachedDecoder* dec : {&plain, &target, &draft}) dec->cache().set_kv_format(format);
    SpeculativeDecoder spec(target, draft, o.k);

    // Each decode timed `reps` times, alternating; the fastest of each counts.
    Race r;
    for (int rep = 0; rep < o.reps; rep++) {
        auto t0 = std::chrono::steady_clock::now();
        r.want = greedy_decode(plain, prompt, o.steps);
        r.plain_s = std::min(r.plain_s, seconds_since(t0));
        t0 = std::chrono::steady_clock::now();
        r.got = spec.generate(prompt, o.steps);
        r.spec_s = std::min(r.spec_s, seconds_since(t0));
    }
    r.tokens_equal = r.got.tokens == r.want.tokens;
    r.cmp = compare_bits(r.want.logits, r.got.logits);
    return r;
}

// The text, as generate prints it: the prompt echoed (BOS prints nothing), up to a BOS.
std::string decoded_text(const LoadedModel& lm, const std::vector<int>& prompt, const std::vector<int>& tokens) {
    auto piece = [&](int prev, int t) { return lm.tokenizer ? token_text(lm, prev, t) : fmt::format("{} ", t); };
    std::string text;
    for (std::size_t i = prompt[0] == Tokenizer::kBos ? 1 : 0; i < prompt.size(); i++)
        text += piece(i ? prompt[i - 1] : Tokenizer::kBos, prompt[i]);
    int prev = prompt.back();
    for (int t : tokens) {
        if (t == Tokenizer::kBos) break;
        text += piece(prev, t);
        prev = t;
    }
    return text;
}

void print_json(const SpeculateOptions& o, const LoadedModel& lm, const Draft& d, const std::vector<int>& prompt,
                const Race& r) {
    const SpeculativeStats& st = r.got.stats;
    nlohmann::json j = {{"model", lm.source},
                        {"draft", d.name},
                        {"kv_format", o.kv_format},
                        {"k", o.k},
                        {"steps", o.steps},
                        {"threads", o.threads},
                        {"threads_choice", threads_json()},
                        {"prompt_tokens", prompt},
                        {"generated_tokens", r.got.tokens},
                        {"text", decoded_text(lm, prompt, r.got.tokens)},
                        {"proposed", st.proposed},
                        {"accepted", st.accepted},
                        {"acceptance_rate", st.acceptance_rate()},
                        {"mean_accepted_per_target_step", st.accepted_per_target_step()},
                        {"tokens_per_target_step", double(o.steps) / st.target_steps},
                        {"target_steps", st.target_steps},
                        {"plain_steps", r.want.stats.target_steps},
                        {"draft_steps", st.draft_steps},
                        {"plain_seconds", r.plain_s},
                        {"speculative_seconds", r.spec_s},
                        {"speedup", r.plain_s / r.spec_s},
                        {"tokens_equal", r.tokens_equal},
                        {"logits_bitwise_equal", r.cmp.equal},
                        {"bitwise_equal", r.equal()}};
    fmt::print("{}\n", json_document(j));
}

// The text, then the acceptance, steps, time and equality lines.
void print_report(const SpeculateOptions& o, const LoadedModel& lm, const Draft& d, const std::vector<int>& prompt,
                  const Race& r) {
    const SpeculativeStats& st = r.got.stats;
    const int vocab_size = lm.model.config().vocab_size;
    fmt::print("{}\n\n", decoded_text(lm, prompt, r.got.tokens));
    fmt::print("model       {}\n", lm.source);
    fmt::print("draft       {}, k = {}{}\n", d.name, o.k,
               o.kv_format == "fp32" ? "" : fmt::format("; every cache stores K and V in {}", o.kv_format));
    if (st.proposed)
        fmt::print("acceptance  {} of {} drafts accepted ({:.1f}%); {:.2f} accepted per target step (mean)\n",
                   st.accepted, st.proposed, 100.0 * st.acceptance_rate(), st.accepted_per_target_step());
    else
        fmt::print("acceptance  no drafts proposed (one token needs no draft)\n");
    fmt::print("steps       target {} steps for {} tokens ({:.2f} tokens a step); plain greedy decode {}; draft {}\n",
               st.target_steps, o.steps, double(o.steps) / st.target_steps, r.want.stats.target_steps, st.draft_steps);
    fmt::print(
        "time        plain greedy {:.2f} ms, speculative {:.2f} ms: {:.2f}x speedup (fastest of {} run{} each)\n",
        1e3 * r.plain_s, 1e3 * r.spec_s, r.plain_s / r.spec_s, o.reps, o.reps == 1 ? "" : "s");
    if (r.equal()) {
        fmt::print(
            "equality    tokens and logits bitwise equal to plain greedy cached decode ({} logit vectors of {} "
            "floats)\n",
            o.steps, vocab_size);
        return;
    }
    if (!r.tokens_equal) {
        const std::vector<int>&want = r.want.tokens, &got = r.got.tokens;
        const std::size_t i = std::size_t(std::mismatch(want.begin(), want.end(), got.begin()).first - want.begin());
        fmt::print("equality    NOT equal: token {} is {}, plain greedy decode's {}\n", i, got[i], want[i]);
    }
    if (!r.cmp.equal)
        fmt::print("equality    NOT bitwise equal: {} logits differ, the first in token {} (max {} ulp)\n",
                   r.cmp.n_differ, r.cmp.first / vocab_size, r.cmp.max_ulp);
}

}  // namespace

int run_speculate(const SpeculateOptions& o) {
    const LoadedModel lm = load_model(o.m.model, o.m.tokenizer, stories260k_shape(), o.m.seed, o.m.panel_cache);
    // The last emitted token is never run, so it needs no position (as in generate).
    const std::vector<int> prompt = checked_prompt(lm, o.prompt, o.tokens, "", o.steps, -1);
    if (o.k < 1) throw Error(fmt::format("--k must be at least 1, not {}", o.k));
    const Draft draft = load_draft(o, lm.model.config());
    const Race r = race(o, lm.model, draft, prompt);
    if (o.json)
        print_json(o, lm, draft, prompt, r);
    else
        print_report(o, lm, draft, prompt, r);
    return r.equal() ? 0 : 1;
}

}  // namespace kvlab::cli
