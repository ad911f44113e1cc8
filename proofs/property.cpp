#include "property.h"

#include <fcntl.h>
#include <rapidcheck.h>
#include <rapidcheck/detail/Configuration.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>

namespace kvlab {

namespace {

// RapidCheck's default listener reads its global configuration (and announces it on stderr);
// our parameters are explicit, and the report is the outcome.
struct QuietListener : rc::detail::TestListener {
    void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
    void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
    void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

// RapidCheck loads its global configuration on first use and announces a seed on stderr; every
// parameter is passed explicitly here, so load it once with stderr silenced.
void configure_quietly() {
    static const bool configured = [] {
        std::fflush(stderr);
        const int saved = ::dup(2), null = ::open("/dev/null", O_WRONLY);
        if (saved >= 0 && null >= 0) ::dup2(null, 2);
        (void)rc::detail::configuration();
        std::fflush(stderr);
        if (saved >= 0) ::dup2(saved, 2), ::close(saved);
        if (null >= 0) ::close(null);
        return true;
    }();
    (void)configured;
}

}  // namespace

PropertyOutcome check_property(const std::function<void()>& body, int cases, std::uint64_t seed) {
    configure_quietly();
    rc::detail::TestParams params;
    params.seed = seed;
    params.maxSuccess = cases;
    params.maxSize = proofs::kFullSize;
    QuietListener listener;
    const rc::detail::TestResult result = rc::detail::checkTestable(body, rc::detail::TestMetadata{}, params, listener);
    PropertyOutcome out;
    rc::detail::SuccessResult success;
    rc::detail::FailureResult failure;
    rc::detail::GaveUpResult gave_up;
    rc::detail::Error error;
    if (result.match(success)) {
        out.passed = true;
        out.cases = success.numSuccess;
    } else if (result.match(failure)) {
        out.cases = failure.numSuccess + 1;
        out.counterexample = failure.description;
    } else if (result.match(gave_up)) {
        out.cases = gave_up.numSuccess;
        out.counterexample = "gave up: " + gave_up.description;
    } else if (result.match(error)) {
        out.counterexample = "error: " + error.description;
    }
    for (char& ch : out.counterexample)
        if (ch == '\n') ch = ' ';
    return out;
}

Config draw_config(int min_seq, int min_vocab, bool wide_heads) {
    Config c;
    c.n_layers = draw(1, 3);
    c.n_heads = draw(1, 4);
    c.n_kv_heads = *proofs::gen_n_kv_heads(c.n_heads);
    // head_size 1-8, and a fifth of the time one that fills the CPU's vector registers (16, 48,
    // 64 with AVX-512) or misses them by one: attention then scores sixteen keys at once.
    const int head_size = wide_heads && draw(0, 4) == 0 ? *rc::gen::element(15, 16, 17, 48, 64) : draw(1, 8);
    c.dim = c.n_heads * head_size;
    c.hidden_dim = draw(1, 16);
    c.vocab_size = draw(min_vocab, 32);
    c.max_seq = draw(min_seq, kFastMaxSeq);
    return c;
}

const std::vector<int>& size_thresholds() {
    static const std::vector<int> sizes = [] {
        std::vector<int> s{96, 97, 98};
        for (int p = 2; p <= 8192; p *= 2)
            for (int d : {-1, 0, 1, 2}) s.push_back(p + d);
        std::sort(s.begin(), s.end());
        s.erase(std::unique(s.begin(), s.end()), s.end());
        return s;
    }();
    return sizes;
}

int draw_size(int lo, int hi) {
    std::vector<int> in_range;
    for (int t : size_thresholds())
        if (t >= lo && t <= hi) in_range.push_back(t);
    if (!in_range.empty() && draw(0, 1) == 0) return in_range[std::size_t(draw(0, int(in_range.size()) - 1))];
    return draw(lo, hi);
}

int draw_vocab_size(int lo) {
    std::vector<int> in_range;
    for (int v : {255, 256, 257, 1023, 1024, 1025, 4095, 4096, 4097, kMaxVocab - 1, kMaxVocab})
        if (v >= lo) in_range.push_back(v);
    if (!in_range.empty() && draw(0, 1) == 0) return in_range[std::size_t(draw(0, int(in_range.size()) - 1))];
    return draw(lo, kMaxVocab);
}

namespace {

// A thin model (draw_long_config's shape): a naive decode of thousands of positions takes milliseconds.
Config draw_thin_config() {
    Config c;
    c.n_layers = draw(1, 2);
    // Query heads over KV heads, each pair as likely: 4 over 2 is grouped query attention's index
    // map at its smallest (groups of 2, more than one group), its heads of 1-2 dimensions so that
    // dim stays at most 8 (naive decode's cost).
    const auto [n_heads, n_kv_heads] =
        *rc::gen::element(std::pair{1, 1}, std::pair{2, 1}, std::pair{2, 2}, std::pair{4, 2});
    c.n_heads = n_heads, c.n_kv_heads = n_kv_heads;
    c.dim = c.n_heads * draw(c.n_heads == 1 ? 2 : 1, c.n_heads == 4 ? 2 : 4);
    c.hidden_dim = draw(1, 8);
    c.vocab_size = draw(2, 16);
    return c;
}

}  // namespace

Config draw_long_config(int min_seq) {
    Config c = draw_thin_config();
    // The longest an eighth of the time (on the last value: shrinking moves to the other branch);
    // else a threshold half the time, or a length in a drawn power-of-two octave: naive decode
    // costs T^2, and a uniform draw would spend most of a run's time on its top octave.
    const int lo = std::max(min_seq, 2);
    if (draw(0, 7) == 7) {
        c.max_seq = 8192;
    } else if (draw(0, 1) == 0) {
        c.max_seq = draw_size(lo, 8192);
    } else {
        const int octave = draw(int(std::bit_width(unsigned(lo))) - 1, 12);  // [2^octave, 2^(octave+1))
        c.max_seq = draw(std::max(lo, 1 << octave), std::min(8192, (2 << octave) - 1));
    }
    return c;
}

Config draw_reaching_config(bool long_profile, int min_seq) {
    if (long_profile) return draw_long_config(min_seq);
    // Shrinking moves to the first branch of each choice: the usual small models, any length.
    if (!*rc::gen::arbitrary<bool>()) return draw_config(min_seq);
    Config c = draw_thin_config();
    const int lo = std::max(min_seq, 2);
    // Lengths that hold position 97 or 257 (and one more) half the time.
    c.max_seq = draw(0, 1) == 0 ? draw_size(lo, kFastMaxPositions) : *rc::gen::element(98, 99, 258, 259);
    c.max_seq = std::max(c.max_seq, lo);
    return c;
}

std::vector<int> draw_tokens(const Config& c, int n) {
    std::vector<int> t(std::size_t(std::max(n, 0)));
    if (n <= kPickedTokens) {
        for (int& x : t) x = draw(0, c.vocab_size - 1);
        return t;
    }
    // A long run's tokens come from one drawn seed (splitmix64): shrinking then tries a few dozen
    // values, not one per token (thousands of cases of thousands of positions).
    std::uint64_t state = *rc::gen::arbitrary<std::uint64_t>();
    for (int& x : t) {
        std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        x = int((z ^ (z >> 31)) % std::uint64_t(c.vocab_size));
    }
    return t;
}

void fail(std::string message) {
    throw rc::detail::CaseResult(rc::detail::CaseResult::Type::Failure, std::move(message));
}

}  // namespace kvlab
