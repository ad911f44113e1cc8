// Lab 4's grader. fast_matmul against the textbook loop (matmul_reference), bit for bit, over
// generated shapes, strides and thread counts, then planted in whole decoders (P1). Then your
// planted_split_k: it must be a correct product in real arithmetic (within float rounding of a
// float64 reference), and the same two comparisons must catch it: those checks pass when
// RapidCheck finds a counterexample, and print the smallest one it shrank to.
#include <bit>
#include <cmath>

#include "cpu_backend.h"
#include "decode.h"
#include "grader.h"
#include "lab.h"
#include "planted.h"

using namespace kvlab;

namespace {

// One product: shapes, row strides, threads and the inputs X [rows, ldx], W [n_in, ldw].
struct Product {
    int rows = 0, n_in = 0, n_out = 0, ldx = 0, ldw = 0, ldy = 0, threads = 1;
    std::vector<float> x, w;
    std::string describe() const {
        return fmt::format("rows={} n_in={} n_out={} ldx={} ldw={} ldy={} threads={}", rows, n_in, n_out, ldx, ldw, ldy,
                           threads);
    }
};

std::vector<float> gaussians(std::size_t n, std::uint64_t seed) {
    SplitMix64 rng(seed);
    std::vector<float> v(n);
    for (float& f : v) f = float(rng.gaussian());
    return v;
}

// Big enough for several tiles of rows and of columns (the kernel's are 4 rows x 16 or 32).
Product draw_product(int max_threads) {
    Product p;
    p.rows = draw(0, 12), p.n_in = draw(0, 40), p.n_out = draw(0, 70);
    p.ldx = p.n_in + draw(0, 3), p.ldw = p.n_out + draw(0, 3), p.ldy = p.n_out + draw(0, 3);
    p.threads = draw(1, max_threads);
    const auto seed = *rc::gen::arbitrary<std::uint64_t>();
    p.x = gaussians(std::size_t(p.rows) * p.ldx, seed);
    p.w = gaussians(std::size_t(p.n_in) * p.ldw, seed + 1);
    return p;
}

constexpr std::uint32_t kGuard = 0x7fc0dead;  // a NaN with a payload: no product writes it

// Runs f on p into Y [rows + 1, ldy] filled with the guard (the extra row: a write past Y's end);
// fails if anything but Y's rows x n_out was written. Returns Y [rows, ldy].
std::vector<float> run(const char* fn, MatmulFn f, const Product& p, Exec& ex) {
    std::vector<float> y(std::size_t(p.rows + 1) * p.ldy, std::bit_cast<float>(kGuard));
    ex.n_threads = p.threads;
    ex.parallel_min_work = 0;  // threads on every product, however small
    lessons::log_case(fmt::format("{}({})", fn, p.describe()));
    f(ex, y.data(), p.ldy, p.x.data(), p.ldx, p.w.data(), p.ldw, p.rows, p.n_in, p.n_out);
    for (int r = 0; r <= p.rows; r++)
        for (int o = r < p.rows ? p.n_out : 0; o < p.ldy; o++)
            if (float_bits(y[std::size_t(r) * p.ldy + o]) != kGuard)
                fail(r < p.rows ? fmt::format("{}: your {} wrote Y[{}][{}], past the row's n_out = {} columns (the floats "
                                              "from n_out up to ldy belong to someone else)",
                                              p.describe(), fn, r, o, p.n_out)
                                : fmt::format("{}: your {} wrote past the end of Y (row {}, float {}; Y has rows 0..{})",
                                              p.describe(), fn, r, o, p.rows - 1));
    y.resize(std::size_t(p.rows) * p.ldy);
    return y;
}

// Fails unless f(p) equals the textbook loop bit for bit.
void expect_textbook(const char* fn, MatmulFn f, const Product& p) {
    Exec ex, ex_ref;
    const std::vector<float> got = run(fn, f, p, ex);
    std::vector<float> want(got.size());
    matmul_reference(ex_ref, want.data(), p.ldy, p.x.data(), p.ldx, p.w.data(), p.ldw, p.rows, p.n_in, p.n_out);
    for (int r = 0; r < p.rows; r++)
        for (int o = 0; o < p.n_out; o++) {
            const float a = want[std::size_t(r) * p.ldy + o], b = got[std::size_t(r) * p.ldy + o];
            if (float_bits(a) != float_bits(b))
                fail(fmt::format("{}: your {} differs from the textbook loop at Y[{}][{}]: expected {:.9g} (bits "
                                 "0x{:08x}), yours {:.9g} (bits 0x{:08x}), {} ulp apart",
                                 p.describe(), fn, r, o, a, float_bits(a), b, float_bits(b), ulp_distance(a, b)));
        }
}

void check_shapes() { expect_textbook("fast_matmul", lab04::fast_matmul, draw_product(1)); }
void check_threads() { expect_textbook("fast_matmul", lab04::fast_matmul, draw_product(4)); }

void check_flops() {
    const Product p = draw_product(4);
    Exec ex;
    ex.flops = 5;  // added to, not set
    run("fast_matmul", lab04::fast_matmul, p, ex);
    const std::uint64_t want = 5 + 2ull * std::uint64_t(p.rows) * std::uint64_t(p.n_in) * std::uint64_t(p.n_out);
    if (ex.flops != want)
        fail(fmt::format("{}: your fast_matmul added {} to ex.flops; the kernels add 2 * rows * n_in * n_out = {}, once",
                         p.describe(), std::int64_t(ex.flops) - 5, want - 5));
    Exec split;
    split.flops = 5;
    run("planted_split_k", lab04::planted_split_k, p, split);
    if (split.flops != want)
        fail(
            fmt::format("{}: your planted_split_k added {} to ex.flops; a split sum does the same multiplies and adds, "
                        "2 * rows * n_in * n_out = {}",
                        p.describe(), std::int64_t(split.flops) - 5, want - 5));
}

std::string threads(int n) { return n == 1 ? "1 thread" : fmt::format("{} threads", n); }

// A decode case: a tiny model, tokens, how many are prefilled, threads for the decoders.
struct DecodeCase {
    Config c;
    Model m;
    std::vector<int> tokens;
    int prompt = 0, threads = 1;
};
DecodeCase draw_decode_case() {
    const Config c = draw_config();
    DecodeCase d{c, random_model(c, *rc::gen::arbitrary<std::uint64_t>()), draw_tokens(c, draw(1, c.max_seq)), 0, 1};
    d.prompt = draw(1, int(d.tokens.size()));
    d.threads = draw(1, 4);
    return d;
}

// Every product of naive and cached decode (the weights' and naive attention's) on your
// fast_matmul: both equal naive decode on kvlab's kernels, at every step.
void check_p1_fast() {
    const DecodeCase d = draw_decode_case();
    CpuBackend kernels(d.m), cpu(d.m);
    ProductBackend yours(cpu, d.m, lab04::fast_matmul);
    NaiveDecoder want(kernels), naive(yours);
    CachedDecoder cached(yours);
    // Threads as drawn, but only on products big enough to pay (Exec's default): thousands of
    // tiny products on threads would be slow, and check_threads has tried every split already.
    naive.exec.n_threads = cached.exec.n_threads = d.threads;
    const std::span<const int> all(d.tokens);
    for (int T = d.prompt; T <= int(d.tokens.size()); T++) {
        lessons::log_case(fmt::format("{}, {} tokens, prompt {}, {}: naive and cached decode on fast_matmul at T = {}",
                                      d.c.describe(), d.tokens.size(), d.prompt, threads(d.threads), T));
        const std::vector<float> w = want.forward(all.first(T));
        const std::vector<float> n = naive.forward(all.first(T));
        const std::vector<float> c = T == d.prompt ? cached.prefill(all.first(T)) : cached.decode(d.tokens[T - 1]);
        for (const auto& [what, got] : {std::pair{"naive", &n}, std::pair{"cached", &c}}) {
            const std::string diff = lessons::describe_difference(w, *got);
            if (!diff.empty())
                fail(fmt::format("{}, prompt of {} tokens, {}: at T = {} {} decode on your fast_matmul differs "
                                 "from naive decode on kvlab's kernels: {}",
                                 d.c.describe(), d.prompt, threads(d.threads), T, what, diff));
        }
    }
}

// planted_split_k computes the product, in another order: every output within the rounding
// error any summation order can make, |error| <= gamma(n_in) * sum_k |X[r][k] W[k][o]| with
// gamma(n) = n u / (1 - n u), u = 2^-24 (Higham, Accuracy and Stability, section 3.1), plus
// the float64 reference's own, the same with u = 2^-53.
void check_split_k_is_a_product() {
    const Product p = draw_product(4);
    Exec ex;
    const std::vector<float> got = run("planted_split_k", lab04::planted_split_k, p, ex);
    auto gamma = [&](double u) { return p.n_in * u / (1 - p.n_in * u); };
    const double bound = gamma(std::ldexp(1.0, -24)) + gamma(std::ldexp(1.0, -53));
    for (int r = 0; r < p.rows; r++)
        for (int o = 0; o < p.n_out; o++) {
            double exact = 0, magnitude = 0;
            for (int k = 0; k < p.n_in; k++) {
                const double t = double(p.x[std::size_t(r) * p.ldx + k]) * double(p.w[std::size_t(k) * p.ldw + o]);
                exact += t, magnitude += std::fabs(t);
            }
            const double y = got[std::size_t(r) * p.ldy + o];
            if (!(std::fabs(y - exact) <= bound * magnitude))
                fail(fmt::format("{}: your planted_split_k gives Y[{}][{}] = {:.9g}, but X·W is {:.9g} there, further "
                                 "than any order of summation rounds ({:.3g}): split-K must compute the same product, "
                                 "only adding in another order",
                                 p.describe(), r, o, y, exact, bound * magnitude));
        }
}

// The comparison of check_threads, on your split-K: it must find an output that differs.
void check_split_k_caught() { expect_textbook("planted_split_k", lab04::planted_split_k, draw_product(4)); }

// P1 with your split-K in naive decode's products only: it must find a step that differs.
void check_split_k_caught_by_p1() {
    const DecodeCase d = draw_decode_case();
    CpuBackend cpu(d.m);
    ProductBackend planted(cpu, d.m, lab04::planted_split_k);
    NaiveDecoder naive(planted);
    CachedDecoder cached(d.m);
    naive.exec.n_threads = d.threads;
    const std::span<const int> all(d.tokens);
    for (int T = d.prompt; T <= int(d.tokens.size()); T++) {
        const std::vector<float> c = T == d.prompt ? cached.prefill(all.first(T)) : cached.decode(d.tokens[T - 1]);
        lessons::log_case(fmt::format("{}, {} tokens, prompt {}, {}: naive decode on planted_split_k at T = {}",
                                      d.c.describe(), d.tokens.size(), d.prompt, threads(d.threads), T));
        const std::string diff = lessons::describe_difference(c, naive.forward(all.first(T)));
        if (!diff.empty())
            fail(fmt::format("{}, prompt of {} tokens: at T = {} naive decode on your planted_split_k ({}) "
                             "differs from cached decode: {}",
                             d.c.describe(), d.prompt, T, threads(d.threads), diff));
    }
}

}  // namespace

int main(int argc, char** argv) {
    lessons::Lab lab{4, "why the bits agree, and how to break them", LAB_SOURCE, {}};
    lab.checks = {
        {"fast_matmul == textbook loop, bitwise, any shape and stride", 3, check_shapes},
        {"... and on 1-4 threads", 2, check_threads},
        {"fast_matmul and planted_split_k count 2 * rows * n_in * n_out FLOPs", 1, check_flops},
        {"P1: naive and cached decode on fast_matmul == kernels", 1, check_p1_fast},
        {"planted_split_k is the same product, within rounding", 1, check_split_k_is_a_product},
        {"planted_split_k is caught: bits differ from the loop", 1, check_split_k_caught, 100,
         "your planted_split_k differs from the textbook loop"},
        {"planted_split_k is caught by P1: naive != cached", 1, check_split_k_caught_by_p1, 100,
         "differs from cached decode"},
    };
    return lessons::grade(lab, argc, argv);
}
