// Lab 2's grader: your one-head causal attention against kvlab's, bit for bit, over generated
// shapes (grouped-query heads, row strides), lengths and inputs. The mask, the naive kernel
// (CpuBackend::causal_attention), the cached decode's attention_row at every position, and
// naive decode of a whole model running on your attention against cached decode.
#include <bit>
#include <cassert>
#include <cstring>

#include "cpu_backend.h"
#include "decode.h"
#include "forwarding.h"
#include "grader.h"
#include "lab.h"

using namespace kvlab;

namespace {

// One head's inputs inside a layer's activations: q [T, dim], k and v [T, kv_dim].
struct Case {
    Config c;
    int T = 0;
    std::vector<float> q, k, v;
};

std::vector<float> gaussians(std::size_t n, std::uint64_t seed, float scale) {
    SplitMix64 rng(seed);
    std::vector<float> x(n);
    for (float& f : x) f = scale * float(rng.gaussian());
    return x;
}

Case draw_case(int min_T = 1) {
    Case a;
    a.c = draw_config(min_T);
    a.T = draw(min_T, a.c.max_seq);
    const auto seed = *rc::gen::arbitrary<std::uint64_t>();
    const float scale = float(draw(1, 4));  // larger scores make the softmax peak
    a.q = gaussians(std::size_t(a.T) * a.c.dim, seed, scale);
    a.k = gaussians(std::size_t(a.T) * a.c.kv_dim(), seed + 1, scale);
    a.v = gaussians(std::size_t(a.T) * a.c.kv_dim(), seed + 2, 1.0f);
    return a;
}

// A value no correct computation writes: a write outside the head's columns shows.
constexpr std::uint32_t kGuard = 0x7fc0dead;  // a NaN with a payload

// Your attention for query head h: out [T, head_size + pad], the pad columns guarded.
std::vector<float> yours(const Case& a, int h, int pad) {
    const Config& c = a.c;
    const int hs = c.head_size(), ldo = hs + pad, kvh = kv_head_map(c)[std::size_t(h)];
    std::vector<float> out(std::size_t(a.T) * ldo, std::bit_cast<float>(kGuard));
    lab02::causal_attention_head(out.data(), ldo, a.q.data() + h * hs, c.dim, a.k.data() + kvh * hs, c.kv_dim(),
                                 a.v.data() + kvh * hs, c.kv_dim(), a.T, hs);
    for (int i = 0; i < a.T; i++)
        for (int d = hs; d < ldo; d++)
            if (float_bits(out[std::size_t(i) * ldo + d]) != kGuard)
                fail(fmt::format("{}, T = {}: your function wrote out[{}][{}], past the head's {} columns (ldo = {}: "
                                 "the floats after a row's head_size belong to other heads)",
                                 a.c.describe(), a.T, i, d, hs, ldo));
    return out;
}

// The call yours(a, h, pad) makes, in words (for log_case).
std::string call_of(const Case& a, int h, int pad) {
    const Config& c = a.c;
    return fmt::format(
        "causal_attention_head for head {} (KV head {}), T {}, head_size {}, ldo {}, ldq {}, ldk = ldv {}, with {}", h,
        kv_head_map(c)[std::size_t(h)], a.T, c.head_size(), c.head_size() + pad, c.dim, c.kv_dim(), c.describe());
}

std::string bits(float x) { return fmt::format("{:.9g} (bits 0x{:08x})", x, float_bits(x)); }

// "" when your row i equals want[0..head_size) bit for bit; else the first difference in words.
std::string row_difference(const float* want, const float* got, int head_size) {
    for (int d = 0; d < head_size; d++)
        if (float_bits(want[d]) != float_bits(got[d]))
            return fmt::format("column {}: expected {}, yours {}, {} ulp apart", d, bits(want[d]), bits(got[d]),
                               ulp_distance(want[d], got[d]));
    return "";
}

// Changing K and V at positions m..T-1 leaves your rows 0..m-1 bit for bit as they were.
void check_mask() {
    Case a = draw_case(2);
    const Config& c = a.c;
    const int hs = c.head_size(), h = draw(0, c.n_heads - 1), m = draw(1, a.T - 1);
    lessons::log_case(call_of(a, h, 0));
    const std::vector<float> before = yours(a, h, 0);
    const auto seed = *rc::gen::arbitrary<std::uint64_t>();
    const std::vector<float> other = gaussians(a.k.size(), seed, 3.0f);
    for (std::size_t x = std::size_t(m) * c.kv_dim(); x < a.k.size(); x++) a.k[x] = other[x], a.v[x] = -other[x];
    lessons::log_case(fmt::format("{}; again with K and V changed at positions {}..{}", call_of(a, h, 0), m, a.T - 1));
    const std::vector<float> after = yours(a, h, 0);
    for (int i = 0; i < m; i++)
        if (std::memcmp(&before[std::size_t(i) * hs], &after[std::size_t(i) * hs], sizeof(float) * hs))
            fail(fmt::format("{}, T = {}, head {}: your output row {} changed when only K and V at positions {}..{} "
                             "changed: row i must attend to positions 0..i only (the causal mask)",
                             c.describe(), a.T, h, i, m, a.T - 1));
}

// Every head (grouped-query: query head h reads KV head h / group), row strides of whole
// activations, against the kernel naive decode runs.
void check_naive_kernel() {
    const Case a = draw_case();
    const Config& c = a.c;
    const int hs = c.head_size(), pad = draw(0, 3);
    const Model model{Weights(c)};  // causal_attention reads q, k, v only
    CpuBackend backend(model);
    std::vector<float> want(std::size_t(a.T) * c.dim);  // [T, dim]
    Exec ex;
    backend.causal_attention(ex, want.data(), a.q.data(), a.k.data(), a.v.data(), a.T, kv_head_map(c).data());
    for (int h = 0; h < c.n_heads; h++) {
        lessons::log_case(call_of(a, h, pad));
        const std::vector<float> got = yours(a, h, pad);
        for (int i = 0; i < a.T; i++) {
            const std::string diff = row_difference(&want[std::size_t(i) * c.dim + h * hs],
                                                    &got[std::size_t(i) * (hs + pad)], hs);
            if (!diff.empty())
                fail(fmt::format("{}, T = {}, head {}: your row {} differs from kvlab's naive attention at {}",
                                 c.describe(), a.T, h, i, diff));
        }
    }
}

// Row i of the T x T attention is what a cached decode step computes at position i: one query
// against the rows of positions 0..i (kernels.h, attention_row). NUMERICS.md says why.
void check_rows_are_cached_steps() {
    const Case a = draw_case();
    const Config& c = a.c;
    const int hs = c.head_size(), kv_dim = c.kv_dim(), h = draw(0, c.n_heads - 1);
    const int kvh = kv_head_map(c)[std::size_t(h)];
    lessons::log_case(call_of(a, h, 0));
    const std::vector<float> got = yours(a, h, 0);
    std::vector<float> want(static_cast<std::size_t>(hs)), scores(static_cast<std::size_t>(a.T));
    for (int i = 0; i < a.T; i++) {
        attention_row(
            want.data(), a.q.data() + std::size_t(i) * c.dim + h * hs, hs, i + 1,
            [&](int t) { return a.k.data() + std::size_t(t) * kv_dim + kvh * hs; },
            [&](int t) { return a.v.data() + std::size_t(t) * kv_dim + kvh * hs; }, scores.data());
        const std::string diff = row_difference(want.data(), &got[std::size_t(i) * hs], hs);
        if (!diff.empty())
            fail(fmt::format("{}, T = {}, head {}: your row {} differs from the cached decode step at position {} "
                             "(attention_row over positions 0..{}) at {}",
                             c.describe(), a.T, h, i, i, i, diff));
    }
}

// The CPU backend with your function as naive decode's attention; everything else unchanged.
class WithYourAttention final : public ForwardingBackend {
public:
    explicit WithYourAttention(CpuBackend& cpu) : ForwardingBackend(cpu) {}
    std::string_view name() const override { return "cpu, your attention"; }
    // q, att: [T, dim]; k, v: [T, kv_dim]: head h is a column block of each.
    void causal_attention(Exec&, float* att, const float* q, const float* k, const float* v, int T,
                          const int* kv_head) override {
        const Config& c = config();
        const int hs = c.head_size();
        for (int h = 0; h < c.n_heads; h++)
            lab02::causal_attention_head(att + h * hs, c.dim, q + h * hs, c.dim, k + kv_head[h] * hs, c.kv_dim(),
                                         v + kv_head[h] * hs, c.kv_dim(), T, hs);
    }
};

// P1 with your attention in naive decode: prefill a prompt, decode the rest, equal at every step.
void check_p1() {
    const Config c = draw_config();
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const std::vector<int> tokens = draw_tokens(c, draw(1, c.max_seq));
    const int prompt = draw(1, int(tokens.size()));
    CpuBackend cpu(m);
    WithYourAttention backend(cpu);
    NaiveDecoder naive(backend);
    CachedDecoder cached(m);
    const std::span<const int> all(tokens);
    for (int T = prompt; T <= int(tokens.size()); T++) {
        const std::vector<float>& want = T == prompt ? cached.prefill(all.first(T)) : cached.decode(tokens[T - 1]);
        lessons::log_case(fmt::format("{}, {} tokens, prompt {}: naive decode on your attention at T = {}",
                                      c.describe(), tokens.size(), prompt, T));
        const std::string diff = lessons::describe_difference(want, naive.forward(all.first(T)));
        if (!diff.empty())
            fail(fmt::format("{}, prompt of {} tokens: at T = {} naive decode on your attention differs from cached "
                             "decode: {}",
                             c.describe(), prompt, T, diff));
    }
}

}  // namespace

int main(int argc, char** argv) {
    lessons::Lab lab{2, "causal attention, naively", LAB_SOURCE, {}};
    lab.checks = {
        {"the mask: row i reads positions 0..i only", 2, check_mask},
        {"bitwise == kvlab's naive attention, every head and stride", 4, check_naive_kernel},
        {"row i == the cached decode step at position i", 2, check_rows_are_cached_steps},
        {"P1: naive decode on your attention == cached, bitwise", 2, check_p1},
    };
    return lessons::grade(lab, argc, argv);
}
