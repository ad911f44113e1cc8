// Lab 5's grader: your prefill on kvlab's CPU backend and caches. One wide step equals naive
// decode; P2: your prefill then kvlab's decode equals one token at a time, in the logits and in
// every cached K and V row, bit for bit; a second prefill continues the first; and the same on a
// paged cache, a window (whose max_append() bounds a step) and a quantized cache (which quantizes
// what cache.stored() announces). Then, not graded, how many tokens per second a wide step runs
// against single-row steps.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

#include "cache_factory.h"
#include "cpu_backend.h"
#include "decode.h"
#include "forwarding.h"
#include "grader.h"
#include "lab.h"

using namespace kvlab;

namespace {

// The backend your steps run on, counting the most rows one step embeds: a step is at most
// `chunk` rows (the contract), which the logits alone cannot show.
class StepRows final : public ForwardingBackend {
public:
    using ForwardingBackend::ForwardingBackend;
    void embed(Exec& ex, float* x, const int* tokens, int rows) override {
        most = std::max(most, rows);
        inner().embed(ex, x, tokens, rows);
    }
    int most = 0;
};

// The student's prefill; anything it throws (a cache refusing an append, say) fails the case, and
// so does a step of more than `chunk` rows.
std::vector<float> yours(Backend& b, Cache& cache, std::span<const int> prompt, int chunk, Exec& ex,
                         const std::string& what) {
    try {
        StepRows counted(b);
        std::vector<float> logits = lab05::prefill(counted, cache, prompt, chunk, ex);
        if (counted.most > chunk)
            fail(
                fmt::format("{}: your prefill of {} tokens with chunk {} ran a step of {} rows; a step takes at "
                            "most chunk rows",
                            what, prompt.size(), chunk, counted.most));
        return logits;
    } catch (const lessons::NotImplemented&) {
        throw;
    } catch (const std::exception& e) {
        fail(fmt::format("{}: your prefill of {} tokens (chunk {}) on {} threw: {}", what, prompt.size(), chunk,
                         cache.name(), e.what()));
    }
}

// After a prefill that began at `start`, the cache holds start + prompt positions, the prompt's
// tokens last.
void expect_holds(const Cache& cache, int start, std::span<const int> prompt, int chunk, const std::string& what) {
    const int want = start + int(prompt.size());
    if (cache.length() != want)
        fail(fmt::format("{}: after your prefill of {} tokens (chunk {}) onto {} positions, the cache holds {} "
                         "positions, not {}",
                         what, prompt.size(), chunk, start, cache.length(), want));
    if (!std::equal(prompt.begin(), prompt.end(), cache.tokens().begin() + start))
        fail(fmt::format("{}: after your prefill (chunk {}) the cache's tokens are not the prompt's", what, chunk));
}

// `where`: the step; `reference`: what the logits must equal.
void expect_logits(std::span<const float> want, std::span<const float> got, const std::string& what,
                   const std::string& where, const std::string& reference) {
    const std::string diff = lessons::describe_difference(want, got);
    if (!diff.empty()) fail(fmt::format("{}: {}, your logits differ from {}: {}", what, where, reference, diff));
}

// kvlab's decoder one row per step from an empty cache: the reference of P2. logits[T - 1]
// are those after T tokens.
std::vector<std::vector<float>> one_at_a_time(Backend& b, Cache& cache, std::span<const int> tokens) {
    CachedDecoder d(b, cache);
    std::vector<std::vector<float>> out;
    for (int t : tokens) out.push_back(d.decode(t));
    return out;
}

// Every K and V row of positions 0..n-1 the two caches hold, bit for bit.
void expect_same_rows(const Cache& mine, const Cache& ref, int n, const std::string& what) {
    const Config& c = mine.config();
    const int hs = c.head_size();
    for (int t = 0; t < n; t++) {
        if (ref.slot(t) < 0) continue;  // a window no longer holds t (nor may yours: checked by the logits)
        for (int l = 0; l < c.n_layers; l++)
            for (int h = 0; h < c.n_kv_heads; h++)
                for (const bool k : {true, false}) {
                    const float* a = k ? mine.key(l, h, t) : mine.value(l, h, t);
                    const float* b = k ? ref.key(l, h, t) : ref.value(l, h, t);
                    if (std::memcmp(a, b, sizeof(float) * std::size_t(hs)) == 0) continue;
                    int j = 0;
                    while (std::memcmp(a + j, b + j, sizeof(float)) == 0) j++;
                    fail(fmt::format("{}: layer {}, KV head {}, position {}: your {} row differs from the one "
                                     "single-row decode steps stored (element {}: yours {}, theirs {})",
                                     what, l, h, t, k ? "K" : "V", j, a[j], b[j]));
                }
    }
}

void check_one_step() {
    const Config c = draw_config();
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const std::vector<int> prompt = draw_tokens(c, draw(1, c.max_seq));
    const int chunk = int(prompt.size()) + draw(0, 2);
    CpuBackend b(m);
    ContiguousCache cache(c);
    Exec ex;
    const std::string what = c.describe();
    lessons::log_case(fmt::format("{}: prefill of {} tokens, chunk {}, onto an empty {} cache", what, prompt.size(),
                                  chunk, cache.name()));
    const std::vector<float> got = yours(b, cache, prompt, chunk, ex, what);
    expect_holds(cache, 0, prompt, chunk, what);
    NaiveDecoder naive(m);
    expect_logits(naive.forward(prompt), got, what,
                  fmt::format("a prompt of {} tokens in one step (chunk {})", prompt.size(), chunk),
                  "naive decode of the prompt");
}

// A generated model and sequence, of which the first `prompt` tokens go through your prefill.
struct Case {
    Config c;
    Model m;
    std::vector<int> tokens;
    int prompt, chunk;
    std::string what;
};

Case draw_case() {
    const Config c = draw_config();
    Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    std::vector<int> tokens = draw_tokens(c, draw(1, c.max_seq));
    const int prompt = draw(1, int(tokens.size())), chunk = draw(1, prompt);
    const std::string what = fmt::format("{}, {} tokens", c.describe(), tokens.size());
    return {c, std::move(m), std::move(tokens), prompt, chunk, what};
}

// P2 on one cache variant: your prefill of the prompt, then kvlab's decode of the rest, against
// one token at a time on a fresh cache of the same variant; rows compared after the prefill.
void p2(const Case& k, const CacheSpec& spec, bool rows) {
    CpuBackend b(k.m);
    const CacheAndPool mine = make_cache(k.c, spec), ref = make_cache(k.c, spec);
    const std::span<const int> all(k.tokens), prompt = all.first(std::size_t(k.prompt));
    Exec ex;
    const std::string what = fmt::format("{}, {}", k.what, mine.cache->name());
    lessons::log_case(
        fmt::format("{}: prefill of the first {} tokens, chunk {}, onto the empty cache", what, k.prompt, k.chunk));
    const std::vector<float> first = yours(b, *mine.cache, prompt, k.chunk, ex, what);
    expect_holds(*mine.cache, 0, prompt, k.chunk, what);
    const std::vector<std::vector<float>> want = one_at_a_time(b, *ref.cache, all);
    if (rows) {
        // The reference cache has gone on to the end: compare against a second one stopped at P.
        const CacheAndPool at_p = make_cache(k.c, spec);
        one_at_a_time(b, *at_p.cache, prompt);
        expect_same_rows(*mine.cache, *at_p.cache, k.prompt,
                         fmt::format("{}, prefill of {} tokens in chunks of {}", what, k.prompt, k.chunk));
        return;
    }
    expect_logits(want[std::size_t(k.prompt - 1)], first, what,
                  fmt::format("at T = {} (the end of your prefill, chunks of {})", k.prompt, k.chunk),
                  "one token at a time");
    CachedDecoder d(b, *mine.cache);
    for (int T = k.prompt + 1; T <= int(k.tokens.size()); T++)
        expect_logits(want[std::size_t(T - 1)], d.decode(k.tokens[std::size_t(T - 1)]), what,
                      fmt::format("at T = {} (a decode step after your prefill of {}, chunks of {})", T, k.prompt,
                                  k.chunk),
                      "one token at a time");
}

void check_p2_logits() { p2(draw_case(), CacheSpec{}, false); }
void check_p2_rows() { p2(draw_case(), CacheSpec{}, true); }

void check_continues() {
    const Config c = draw_config(2);
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const std::vector<int> a = draw_tokens(c, draw(1, c.max_seq - 1));
    const std::vector<int> more = draw_tokens(c, draw(1, c.max_seq - int(a.size())));
    const int chunk_a = draw(1, int(a.size())), chunk_b = draw(1, int(more.size()));
    CpuBackend b(m);
    ContiguousCache cache(c);
    Exec ex;
    const std::string what = c.describe();
    lessons::log_case(fmt::format("{}: prefill of {} tokens, chunk {}, onto an empty {} cache", what, a.size(), chunk_a,
                                  cache.name()));
    yours(b, cache, a, chunk_a, ex, what);
    expect_holds(cache, 0, a, chunk_a, what);
    lessons::log_case(
        fmt::format("{}: prefill of {} tokens, chunk {}, onto a {} cache holding {} (prefilled with chunk {})", what,
                    more.size(), chunk_b, cache.name(), a.size(), chunk_a));
    const std::vector<float> got = yours(b, cache, more, chunk_b, ex, what);
    expect_holds(cache, int(a.size()), more, chunk_b, what);
    std::vector<int> all = a;
    all.insert(all.end(), more.begin(), more.end());
    NaiveDecoder naive(m);
    expect_logits(naive.forward(all), got, what,
                  fmt::format("a prefill of {} tokens (chunk {}) onto a cache holding {} (prefilled with chunk {})",
                              more.size(), chunk_b, a.size(), chunk_a),
                  fmt::format("naive decode of all {} tokens", all.size()));
}

void check_variants() {
    const Case k = draw_case();
    CacheSpec spec;
    const int variant = draw(0, 2);
    if (variant == 0) {
        spec.variant = Variant::paged;
        spec.block_size = draw(1, k.c.max_seq);
    } else if (variant == 1) {
        spec.variant = Variant::window;
        spec.sinks = draw(0, 3);
        spec.window = draw(1, 4);
        spec.chunk = draw(0, 3);  // max_append(): chunk, or the window when 0
    } else {
        // Per-token keys and values: each row is quantized on its own when cache.stored() says it
        // is in, so a wide step and single-row steps store the same codes (KIVI's per-channel keys
        // would not: a group quantized within one step is read before its rows' own steps would).
        spec.variant = Variant::quantized;
        spec.quant.bits = draw(0, 1) == 0 ? 8 : 4;
        spec.quant.key_axis = QuantSpec::Axis::per_token;
        std::vector<int> divisors;  // of head_size: a group tiles a row
        for (int d = 1; d <= k.c.head_size(); d++)
            if (k.c.head_size() % d == 0) divisors.push_back(d);
        spec.quant.group = *rc::gen::elementOf(divisors);
    }
    p2(k, spec, false);
    p2(k, spec, true);
}

// Not graded: tokens per second of your prefill against its chunk size.
void measure() {
    const Config c = stories260k_shape();
    const Model m = random_model(c, 1);
    CpuBackend b(m);
    constexpr int P = 128, reps = 5;
    std::vector<int> prompt(P);  // [P]
    SplitMix64 rng(7);
    for (int& t : prompt) t = int(rng.next() % std::uint64_t(c.vocab_size));
    fmt::print("\nmeasured, not graded: your prefill of P = {} tokens, stories260K shape, random weights, 1 thread, "
               "best of {}\n",
               P, reps);
    fmt::print("{:>6} {:>6} {:>9} {:>9} {:>12}\n", "chunk", "steps", "ms", "tok/s", "MFLOP/token");
    double decode_rate = 0, prefill_rate = 0;
    for (int chunk : {1, 8, 32, P}) {
        double best = std::numeric_limits<double>::infinity();
        std::uint64_t flops = 0;
        for (int r = 0; r < reps; r++) {
            ContiguousCache cache(c);
            Exec ex;
            const auto t0 = std::chrono::steady_clock::now();
            lab05::prefill(b, cache, prompt, chunk, ex);
            best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            flops = ex.flops;
        }
        const double rate = P / best;
        if (chunk == 1) decode_rate = rate;
        if (chunk == P) prefill_rate = rate;
        fmt::print("{:>6} {:>6} {:>9.3f} {:>9.0f} {:>12.3f}\n", chunk, (P + chunk - 1) / chunk, 1e3 * best, rate,
                   double(flops) / P / 1e6);
    }
    fmt::print("prefill (one step of {}) / decode (steps of 1): {:.1f}x the tokens per second\n", P,
               prefill_rate / decode_rate);
}

}  // namespace

int main(int argc, char** argv) {
    lessons::Lab lab{5, "prefill vs decode", LAB_SOURCE, {}};
    lab.checks = {
        {"one step of P rows == naive decode of the prompt", 2, check_one_step},
        {"P2: prefill then decode == one at a time, logits", 3, check_p2_logits},
        {"P2: every cached K and V row == one at a time's", 2, check_p2_rows},
        {"a second prefill continues where the cache ends", 1, check_continues},
        {"P2 on paged, window and quantized caches", 2, check_variants},
    };
    const int status = lessons::grade(lab, argc, argv);
    if (status == 0) measure();
    return status;
}
