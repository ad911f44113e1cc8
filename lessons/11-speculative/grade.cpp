// Lab 11's grader: your speculative loop against plain greedy cached decode, over generated
// targets, drafts (the target itself, another random model, a smaller one), k and caches.
#include "cache_factory.h"
#include "grader.h"
#include "lab.h"
#include "model.h"

using namespace kvlab;

namespace {

struct Case {
    Config target_shape, draft_shape;
    std::uint64_t seed = 0;
    int draft_kind = 0;  // 0: the target itself, 1: another random model, 2: a smaller one
    int k = 1, steps = 1, block_size = 0;  // block_size 0: contiguous caches
    std::vector<int> prompt;
    std::string describe() const {
        static const char* const kinds[] = {"the target itself", "another random model", "a smaller model"};
        return fmt::format("target {}, draft {}, k = {}, {} cache, prompt of {}, {} steps", target_shape.describe(),
                           kinds[draft_kind], k, block_size ? fmt::format("paged(block_size={})", block_size)
                                                            : std::string("contiguous"),
                           prompt.size(), steps);
    }
};

Case draw_case() {
    Case k;
    k.target_shape = draw_config(2, 2);
    k.seed = *rc::gen::arbitrary<std::uint64_t>();
    k.draft_kind = draw(0, 2);
    k.draft_shape = k.target_shape;
    if (k.draft_kind == 2) {  // fewer layers and a narrower residual stream, the same vocabulary
        k.draft_shape.n_layers = 1;
        k.draft_shape.n_heads = k.draft_shape.n_kv_heads = 1;
        k.draft_shape.dim = draw(1, 4);
    }
    k.k = draw(1, 4);
    k.block_size = draw(0, 1) ? draw(1, k.target_shape.max_seq) : 0;
    k.prompt = draw_tokens(k.target_shape, draw(1, k.target_shape.max_seq - 1));
    k.steps = draw(1, k.target_shape.max_seq - int(k.prompt.size()) + 1);
    return k;
}

CacheAndPool make(const Config& c, int block_size) {
    CacheSpec spec;
    spec.variant = block_size ? Variant::paged : Variant::contiguous_head;
    spec.block_size = std::max(1, block_size);
    return make_cache(c, spec);
}

// Your run against greedy_decode, token by token and logit by logit.
void check_equals_greedy(bool stats_only_for_self) {
    const Case k = draw_case();
    const Model target_model = random_model(k.target_shape, k.seed);
    const Model draft_model = k.draft_kind == 0 ? random_model(k.target_shape, k.seed)
                                                : random_model(k.draft_shape, k.seed + 1);
    CacheAndPool tc = make(k.target_shape, k.block_size), dc = make(k.draft_shape, k.block_size);
    CacheAndPool rc_ = make(k.target_shape, k.block_size);
    CachedDecoder target(target_model, *tc.cache), draft(draft_model, *dc.cache), plain(target_model, *rc_.cache);
    const DecodeRun want = greedy_decode(plain, k.prompt, k.steps);
    lessons::log_case(fmt::format("lab_speculate(target, draft, k {}, prompt of {}, steps {}): {}; draft shape {}", k.k,
                                  k.prompt.size(), k.steps, k.describe(), k.draft_shape.describe()));
    const DecodeRun got = lab11::lab_speculate(target, draft, k.k, k.prompt, k.steps);
    const int V = k.target_shape.vocab_size;
    if (got.tokens.size() != want.tokens.size() || got.logits.size() != want.logits.size())
        fail(fmt::format("{}: you emitted {} tokens and {} logits; expected {} tokens, {} logits ({} per token)",
                         k.describe(), got.tokens.size(), got.logits.size(), want.tokens.size(), want.logits.size(), V));
    for (std::size_t i = 0; i < want.tokens.size(); i++) {
        const auto row = [&](const DecodeRun& r) { return std::span<const float>(r.logits).subspan(i * V, V); };
        const std::string diff = lessons::describe_difference(row(want), row(got));
        if (got.tokens[i] != want.tokens[i])
            fail(fmt::format("{}: emitted token {} (position {}) is {}, plain greedy decode emits {}", k.describe(), i,
                             k.prompt.size() + i, got.tokens[i], want.tokens[i]));
        if (!diff.empty())
            fail(fmt::format("{}: emitted token {} (position {}) is right, but the logits it was chosen from differ "
                             "from plain greedy decode's: {}",
                             k.describe(), i, k.prompt.size() + i, diff));
    }
    const SpeculativeStats& s = got.stats;
    if (s.accepted + s.target_steps != k.steps || s.accepted > s.proposed)
        fail(fmt::format("{}: stats say {} accepted of {} proposed over {} target steps; every target step emits its "
                         "accepted drafts plus one token, so accepted + target_steps must be {}",
                         k.describe(), s.accepted, s.proposed, s.target_steps, k.steps));
    if (stats_only_for_self && k.draft_kind == 0 && s.accepted != s.proposed)
        fail(fmt::format("{}: the draft is the target itself, yet only {} of {} drafts were accepted", k.describe(),
                         s.accepted, s.proposed));
}

}  // namespace

int main(int argc, char** argv) {
    lessons::Lab lab{11, "speculative decoding and rollback", LAB_SOURCE, {}};
    lab.checks = {
        {"tokens and logits == plain greedy decode, bitwise", 6, [] { check_equals_greedy(false); }},
        {"stats add up; the target as its own draft accepts all", 2, [] { check_equals_greedy(true); }},
    };
    return lessons::grade(lab, argc, argv);
}
