// The kernels keep the numeric contract on their own: the fast product equals the textbook
// one bit for bit, exp_f32 is accurate, masking adds exact zeros, and the GPU's softmax (scores
// recomputed, never stored) gives kernels.cpp's bits on any row. Each backend's kernels against
// the others and their float64 oracles: tests/test_backend_ops.cpp.
#include <rapidcheck/catch.h>

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>

#include "host_backend.h"
#include "kernels.h"
#include "planted.h"
#include "test_util.h"
#include "thread_pool.h"

using namespace kvlab;
using kvlab::first_difference;
using kvlab::test::full_range;

namespace {

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
    SplitMix64 rng(seed);
    std::vector<float> v(n);
    for (float& x : v) x = float(rng.gaussian());
    return v;
}

}  // namespace

TEST_CASE("matmul equals the textbook triple loop bit for bit, for any shape, stride and thread count",
          "[kernels][matmul]") {
    rc::prop("fast and reference products agree", [] {
        const int rows = *full_range(0, 40), n_in = *full_range(0, 80), n_out = *full_range(0, 150);
        const int pad = *full_range(0, 5);  // row strides wider than the rows
        const int threads = *rc::gen::elementOf(std::vector<int>{1, 2, 3, 4});
        const auto seed = *rc::gen::arbitrary<std::uint64_t>();
        const int ldx = n_in + pad, ldw = n_out + pad, ldy = n_out + pad;
        const std::vector<float> x = random_floats(std::size_t(rows) * ldx, seed);
        const std::vector<float> w = random_floats(std::size_t(n_in) * ldw, seed + 1);
        std::vector<float> fast(std::size_t(rows) * ldy, -1.0f), ref(fast);
        Exec ex{threads, 0, 0, {}};
        pool_always_threads(true);  // every tile on the threads, however small the product
        matmul(ex, fast.data(), ldy, x.data(), ldx, w.data(), ldw, rows, n_in, n_out);
        Exec ex_ref;
        matmul_reference(ex_ref, ref.data(), ldy, x.data(), ldx, w.data(), ldw, rows, n_in, n_out);
        if (auto diff = first_difference(fast, ref))
            RC_FAIL(
                fmt::format("rows {} n_in {} n_out {} pad {} threads {}: {}", rows, n_in, n_out, pad, threads, *diff));
        RC_ASSERT(ex.flops == 2ull * rows * n_in * n_out);  // every product counted, once
    });
}

namespace {

// Products of one x with several packed matrices, by `group`; the first product whose bits differ
// from matmul_reference's, or nothing.
using GroupFn = void (*)(Exec&, const float*, int, int, std::span<const PackedProduct>);
std::optional<std::string> group_mismatch(GroupFn group, int rows, int n_in, const std::vector<int>& n_outs,
                                          int threads, std::uint64_t seed) {
    const std::vector<float> x = random_floats(std::size_t(rows) * n_in, seed);  // [rows, n_in]
    std::vector<std::vector<float>> panels(n_outs.size()), w_in_out(n_outs.size()), ys(n_outs.size());
    std::vector<PackedMatrix> packed(n_outs.size());
    std::vector<PackedProduct> products;
    for (std::size_t p = 0; p < n_outs.size(); p++) {
        const int n_out = n_outs[p];
        const std::vector<float> w_out_in = random_floats(std::size_t(n_out) * n_in, seed + 1 + p);  // [n_out, n_in]
        w_in_out[p].resize(std::size_t(n_in) * n_out);                                               // [n_in, n_out]
        for (int o = 0; o < n_out; o++)
            for (int k = 0; k < n_in; k++)
                w_in_out[p][std::size_t(k) * n_out + o] = w_out_in[std::size_t(o) * n_in + k];
        panels[p].resize(std::size_t(PackedMatrix::floats(n_in, n_out)));
        PackedMatrix::pack(w_out_in.data(), n_in, n_out, panels[p].data());
        packed[p] = {n_in, n_out, panels[p].data()};
        ys[p].assign(std::size_t(rows) * n_out, -1.0f);  // [rows, n_out]
        products.push_back({ys[p].data(), n_out, &packed[p]});
    }
    Exec ex{threads, 0, 0, {}};
    pool_always_threads(true);  // every tile on the threads, however small the products
    group(ex, x.data(), n_in, rows, products);
    pool_always_threads(false);
    std::uint64_t flops = 0;
    for (std::size_t p = 0; p < n_outs.size(); p++) {
        std::vector<float> ref(ys[p].size());
        Exec ex_ref;
        matmul_reference(ex_ref, ref.data(), n_outs[p], x.data(), n_in, w_in_out[p].data(), n_outs[p], rows, n_in,
                         n_outs[p]);
        flops += ex_ref.flops;
        if (auto diff = first_difference(ys[p], ref)) return fmt::format("product {}: {}", p, *diff);
    }
    if (ex.flops != flops) return fmt::format("{} flops counted, not {}", ex.flops, flops);
    return std::nullopt;
}

}  // namespace

TEST_CASE("a group of packed products gives each the textbook loop's bits, for any widths, rows and threads",
          "[kernels][matmul]") {
    rc::prop("matmul_packed_group vs matmul_reference", [] {
        const int rows = *full_range(0, 9), n_in = *full_range(1, 70);
        const auto n_outs = *rc::gen::container<std::vector<int>>(std::size_t(*full_range(1, 4)), full_range(0, 100));
        const int threads = *rc::gen::elementOf(std::vector<int>{1, 2, 3, 4});
        const auto seed = *rc::gen::arbitrary<std::uint64_t>();
        if (auto m = group_mismatch(matmul_packed_group, rows, n_in, n_outs, threads, seed))
            RC_FAIL(fmt::format("rows {} n_in {} threads {}: {}", rows, n_in, threads, *m));
    });
}

TEST_CASE("counter-test: a group that loses one tile at a boundary between products is caught",
          "[kernels][matmul][counter]") {
    // The group's one loop maps a tile index to its product and column; a mapping one tile short
    // at a product's end leaves that tile's columns as they were.
    GroupFn short_group = [](Exec& ex, const float* x, int ldx, int rows, std::span<const PackedProduct> group) {
        for (std::size_t p = 0; p < group.size(); p++) {
            const int n_out = group[p].w->n_out,
                      kept = p + 1 < group.size()
                                 ? n_out / PackedMatrix::kPanel * PackedMatrix::kPanel - PackedMatrix::kPanel
                                 : n_out;
            PackedMatrix first = *group[p].w;
            first.n_out = std::max(0, kept);
            matmul_packed(ex, group[p].y, group[p].ldy, x, ldx, first, rows);
            ex.flops += 2ull * std::uint64_t(rows) * std::uint64_t(ldx) * std::uint64_t(n_out - first.n_out);
        }
    };
    CHECK_FALSE(group_mismatch(matmul_packed_group, 3, 20, {2 * PackedMatrix::kPanel, 40}, 2, 11));
    CHECK(group_mismatch(short_group, 3, 20, {2 * PackedMatrix::kPanel, 40}, 2, 11));
}

TEST_CASE("matmul with n_in = 0 writes zeros and forms no pointer from x or w (null when empty)", "[kernels][matmul]") {
    // An empty vector's data() is null: x + offset or w + offset is undefined behaviour there
    // (UBSan: "applying non-zero offset to null pointer"), even if nothing is read through it.
    for (int n_out : {1, 7, 40}) {
        std::vector<float> y(std::size_t(5) * n_out, -1.0f);
        Exec ex;
        matmul(ex, y.data(), n_out, nullptr, 0, nullptr, n_out, 5, 0, n_out);
        for (float v : y) CHECK(float_bits(v) == 0u);  // +0.0f, as an empty sum starting at 0.0f gives
        CHECK(ex.flops == 0);
    }
}

TEST_CASE("counter-test: summing the same products in another order changes bits", "[kernels][counter]") {
    // Why the contract fixes the order: the reverse-order sum of one dot product differs from the
    // forward one for ordinary inputs. If it never did, the matmul property would prove nothing.
    const std::vector<float> x = random_floats(64, 5), w = random_floats(64, 6);
    int differing = 0;
    for (int n = 2; n <= 64; n++) {
        float forward = 0.0f, reverse = 0.0f;
        for (int k = 0; k < n; k++) forward = forward + x[k] * w[k];
        for (int k = n - 1; k >= 0; k--) reverse = reverse + x[k] * w[k];
        differing += float_bits(forward) != float_bits(reverse);
    }
    CHECK(differing > 10);
}

TEST_CASE("exp_f32 is within 1 ulp of the correctly rounded e^x", "[kernels][exp]") {
    // A sweep over the whole useful range, in steps that land on many binades and fractions.
    std::uint64_t worst = 0;
    float worst_x = 0;
    for (double xd = -103.0; xd <= 88.7; xd += 0.0137) {
        const float x = float(xd);
        const float want = float(std::exp(double(x)));  // correctly rounded except in rare ties
        const std::uint64_t d = ulp_distance(exp_f32(x), want);
        if (d > worst) worst = d, worst_x = x;
    }
    INFO("worst case x = " << worst_x);
    CHECK(worst <= 1);
}

TEST_CASE("log_f32 is within 2 ulp of the correctly rounded ln x for every 97th positive float", "[kernels][log]") {
    std::uint64_t worst = 0;
    float worst_x = 0;
    for (std::uint32_t u = 1; u < 0x7f800000u; u += 97) {  // subnormals, normals, both sides of 1
        const float x = std::bit_cast<float>(u);
        const std::uint64_t d = ulp_distance(log_f32(x), float(std::log(double(x))));
        if (d > worst) worst = d, worst_x = x;
    }
    INFO("worst case x = " << worst_x << " (" << worst << " ulp)");
    CHECK(worst <= 2);
    const float inf = std::numeric_limits<float>::infinity();
    CHECK(float_bits(log_f32(1.0f)) == float_bits(0.0f));
    CHECK(log_f32(0.0f) == -inf);
    CHECK(log_f32(inf) == inf);
    CHECK(std::isnan(log_f32(-1.0f)));
    CHECK(std::isnan(log_f32(std::numeric_limits<float>::quiet_NaN())));
}

// The log-softmax of one token, within 4e-6 (absolute, plus 2 ulp of the answer) of float64's; a
// token far below the maximum keeps its log-probability (about x - max), which ln of a rounded
// probability loses: that one underflows to -inf at 104 below the maximum.
void logprob_oracle(float (*logprob)(const float*, int, int)) {
    const int n = *rc::gen::inRange(1, 65);
    const float spread = *rc::gen::element(1.0f, 20.0f, 200.0f);
    std::vector<float> x = *rc::gen::container<std::vector<float>>(
        std::size_t(n),
        rc::gen::map(rc::gen::inRange(-1000, 1001), [=](int v) { return spread * float(v) / 1000.0f; }));
    const int token = *rc::gen::inRange(0, n);
    double max = x[0], sum = 0.0;
    for (float v : x) max = std::max(max, double(v));
    for (float v : x) sum += std::exp(double(v) - max);
    const double want = (double(x[std::size_t(token)]) - max) - std::log(sum);
    const float got = logprob(x.data(), n, token);
    if (!(std::fabs(got - want) <= 4e-6 + 2.4e-7 * std::fabs(want)))
        RC_FAIL(fmt::format("token {} of {} (spread {}): log-probability {} but float64 gives {}", token, n, spread,
                            got, want));
}

TEST_CASE("token_logprob is float64's log-softmax, far tails included", "[kernels][log]") {
    rc::prop("token_logprob vs float64", [] { logprob_oracle(token_logprob); });
}

TEST_CASE("token_logprob counter-test: ln of the rounded softmax probability is caught in the tail",
          "[kernels][log][counter]") {
    test::expect_failure([] { logprob_oracle(planted_logprob(Mutant::logprob_unfused)); }, "but float64 gives");
}

namespace {

// Bit patterns where a vector exp could differ from exp_f32 but is checked: every 257th pattern
// (all signs, exponents and mantissa bits move), and each case exp_f32 branches on, with its
// neighbours. The first few mismatches, or "" when every bit agrees.
std::string exp_vector_mismatches(const std::function<void(const float*, float*, std::int64_t)>& vector_exp) {
    std::vector<float> x;
    for (std::uint64_t u = 0; u <= 0xffffffffull; u += 257) x.push_back(float_from_bits(std::uint32_t(u)));
    for (float edge : {88.7228394f, -103.972084f, 88.3762589f, -87.3365479f, 0.0f, -0.0f, 1.0f})
        for (int d = -3; d <= 3; d++) x.push_back(float_from_bits(std::uint32_t(std::int64_t(float_bits(edge)) + d)));
    std::vector<float> got(x.size());  // [x.size()]
    vector_exp(x.data(), got.data(), std::int64_t(x.size()));
    std::string out;
    int n = 0;
    for (std::size_t i = 0; i < x.size(); i++)
        if (float_bits(got[i]) != float_bits(exp_f32(x[i])) && n++ < 3)
            out += fmt::format("x = {:a} ({:08x}): {:08x}, exp_f32 {:08x}; ", x[i], float_bits(x[i]),
                               float_bits(got[i]), float_bits(exp_f32(x[i])));
    return out;
}

}  // namespace

TEST_CASE("the vector exp (softmax and silu_mul use it) gives exp_f32's bits in every lane", "[kernels][exp]") {
    CHECK(exp_vector_mismatches(exp_f32_n) == "");
}

TEST_CASE("counter-test: a vector exp one ulp off in one lane is caught", "[kernels][exp][counter]") {
    const std::string found = exp_vector_mismatches([](const float* x, float* out, std::int64_t n) {
        exp_f32_n(x, out, n);
        for (std::int64_t i = 5; i < n; i += 1000003)  // a lane now and then
            if (std::isfinite(out[i]) && out[i] > 0) out[i] = float_from_bits(float_bits(out[i]) + 1);
    });
    CHECK_THAT(found, Catch::Contains("exp_f32"));
}

namespace {

using DotRows = std::function<void(const float*, const float* const*, int, float*)>;

// Draws head_size (1..80: every vector width's loop and tail) and `n` rows of floats with the
// odd special value, runs `dot` over them, and returns the first row whose score is not the
// scalar loop's bits (s = 0; s = s + q[d] * row[d], d ascending), or "".
std::string dot_rows_mismatch(const DotRows& dot, int n) {
    const int hs = *rc::gen::inRange(1, 81);
    const auto value = rc::gen::weightedOneOf<float>(
        {{20, rc::gen::map(rc::gen::inRange(-4000, 4001), [](int v) { return float(v) / 512.0f; })},
         {1, rc::gen::element(std::numeric_limits<float>::infinity(), -0.0f, std::numeric_limits<float>::quiet_NaN(),
                              1e-40f, 3e38f)}});
    const auto q = *rc::gen::container<std::vector<float>>(std::size_t(hs), value);      // [head_size]
    const auto k = *rc::gen::container<std::vector<float>>(std::size_t(n * hs), value);  // [n, head_size]
    std::vector<const float*> rows(static_cast<std::size_t>(n));                         // [n]
    for (int j = 0; j < n; j++) rows[std::size_t(j)] = k.data() + std::size_t(j) * hs;
    std::vector<float> s(static_cast<std::size_t>(n));  // [n]
    dot(q.data(), rows.data(), hs, s.data());
    for (int j = 0; j < n; j++) {
        float want = 0.0f;
        for (int d = 0; d < hs; d++) want = want + q[std::size_t(d)] * rows[std::size_t(j)][d];
        // (Which NaN an add of two NaNs returns is the compiler's choice of operand order, in any
        // loop: a NaN only has to be a NaN.)
        if (float_bits(s[std::size_t(j)]) != float_bits(want) && !(std::isnan(want) && std::isnan(s[std::size_t(j)])))
            return fmt::format("head_size {}, row {}: {:08x}, the scalar loop {:08x}", hs, j,
                               float_bits(s[std::size_t(j)]), float_bits(want));
    }
    return "";
}

}  // namespace

TEST_CASE("dot_rows8 and dot_rows16 (attention's scores) give each row the scalar loop's bits",
          "[kernels][attention]") {
    rc::prop("any head_size 1..80, values with infinities, NaN, subnormals and -0", [] {
        RC_ASSERT(dot_rows_mismatch(dot_rows8, 8) == "");
        RC_ASSERT(dot_rows_mismatch(dot_rows16, 16) == "");
    });
}

TEST_CASE("counter-test: a dot_rows16 that sums each row in two halves is caught", "[kernels][attention][counter]") {
    test::expect_failure(
        [] {
            RC_ASSERT(dot_rows_mismatch(
                          [](const float* q, const float* const* rows, int hs, float* s) {
                              for (int j = 0; j < 16; j++) {  // two partial sums, added at the end
                                  float a = 0.0f, b = 0.0f;
                                  for (int d = 0; d < hs; d++)
                                      (d < hs / 2 ? a : b) = (d < hs / 2 ? a : b) + q[d] * rows[j][d];
                                  s[j] = a + b;
                              }
                          },
                          16) == "");
        },
        "the scalar loop");
}

TEST_CASE("exp_f32 handles the edges: -inf is an exact zero, overflow is inf, NaN stays NaN", "[kernels][exp]") {
    const float inf = std::numeric_limits<float>::infinity();
    CHECK(float_bits(exp_f32(-inf)) == float_bits(0.0f));
    CHECK(float_bits(exp_f32(-1000.0f)) == float_bits(0.0f));
    CHECK(exp_f32(0.0f) == 1.0f);
    CHECK(exp_f32(89.0f) == inf);
    CHECK(exp_f32(inf) == inf);
    CHECK(std::isnan(exp_f32(kNaN)));
    // The subnormal range: positive, increasing, and close to the true value.
    float prev = 0.0f;
    for (float x = -103.9f; x < -87.0f; x += 0.05f) {
        const float y = exp_f32(x);
        CHECK(y >= prev);
        CHECK(std::fabs(double(y) - std::exp(double(x))) <=
              1.5 * std::numeric_limits<float>::denorm_min() + 2e-7 * std::exp(double(x)));
        prev = y;
    }
}

namespace {

// The three properties of exp the binary32 proofs assume (proofs/coq/Masking.v): exp(-inf) = +0,
// exp(+0) = 1, and every non-NaN x <= 0 other than +inf (so -inf, -0, +0 and every negative
// float) gives a finite result with its sign bit clear. The first violation, or nothing.
std::optional<std::string> exp_contract_violation(float (*exp)(float)) {
    const float inf = std::numeric_limits<float>::infinity();
    if (float_bits(exp(-inf)) != float_bits(0.0f)) return "exp(-inf) is not +0";
    if (float_bits(exp(0.0f)) != float_bits(1.0f)) return "exp(+0) is not 1";
    auto check = [&](std::uint32_t bits) -> std::optional<std::string> {
        const float x = std::bit_cast<float>(bits);
        const float y = exp(x);
        if (!std::isfinite(y) || std::signbit(y))
            return "exp(" + std::to_string(x) + ") (bits " + std::to_string(bits) + ") = " + std::to_string(y);
        return std::nullopt;
    };
    // +0, then the negative floats from -0 to -inf: every 97th bit pattern (about 22 million, every
    // binade), and the first and last 4096 of each binade, where subnormals and rounding change.
    if (auto bad = check(0u)) return bad;
    for (std::uint64_t bits = 0x80000000u; bits <= 0xff800000u; bits += 97)
        if (auto bad = check(std::uint32_t(bits))) return bad;
    for (std::uint32_t e = 0; e < 0xffu; e++)  // exponent 0xff is -inf (checked above) and NaNs
        for (std::uint32_t m = 0; m < 4096; m++) {
            const std::uint32_t base = 0x80000000u | (e << 23);
            if (auto bad = check(base | m)) return bad;
            if (auto bad = check(base | (0x7fffffu - m))) return bad;
        }
    return std::nullopt;
}

}  // namespace

TEST_CASE("exp_f32 has the properties the binary32 proofs assume (-inf to +0, +0 to 1, x <= 0 to finite >= +0)",
          "[kernels][exp][proofs]") {
    const auto bad = exp_contract_violation([](float x) { return exp_f32(x); });
    INFO(bad.value_or(""));
    CHECK(!bad);
    rc::prop("any non-positive float maps to a finite float with its sign bit clear", [] {
        const float x = -std::fabs(std::bit_cast<float>(*rc::gen::arbitrary<std::uint32_t>()));
        RC_PRE(!std::isnan(x));
        const float y = exp_f32(x);
        RC_ASSERT(std::isfinite(y));
        RC_ASSERT(!std::signbit(y));
    });
}

TEST_CASE("counter-test: the exp contract check catches an exp that breaks each property", "[kernels][exp][counter]") {
    // -0 for underflow instead of +0: the masked sum's -0 rule would no longer hold.
    CHECK(exp_contract_violation([](float x) { return x < -103.0f ? -0.0f : exp_f32(x); }));
    // -inf not mapped to +0 (a NaN from inf - inf, as a naive polynomial would give).
    CHECK(exp_contract_violation(
        [](float x) { return std::isinf(x) ? std::numeric_limits<float>::quiet_NaN() : exp_f32(x); }));
    // exp(0) one ulp off: the sum would no longer be at least 1 for sure.
    CHECK(exp_contract_violation([](float x) { return x == 0.0f ? std::nextafter(1.0f, 0.0f) : exp_f32(x); }));
    // A sign error inside the subnormal range only.
    CHECK(exp_contract_violation([](float x) { return x < -90.0f && x > -95.0f ? -exp_f32(x) : exp_f32(x); }));
}

TEST_CASE("masked scores add exact zeros: a causal row equals the unmasked prefix", "[kernels][mask]") {
    rc::prop("softmax over a row with -inf tail, then the product with V, equals the prefix alone", [] {
        const int T = *full_range(1, 40), n = *full_range(1, T + 1), hs = *full_range(1, 20);
        const auto seed = *rc::gen::arbitrary<std::uint64_t>();
        std::vector<float> row = random_floats(T, seed), prefix(row.begin(), row.begin() + n);
        for (int j = n; j < T; j++) row[j] = -std::numeric_limits<float>::infinity();
        softmax(row.data(), T);
        softmax(prefix.data(), n);
        for (int j = n; j < T; j++) RC_ASSERT(float_bits(row[j]) == 0u);
        const std::vector<float> v = random_floats(std::size_t(T) * hs, seed + 7);  // V [T, hs]
        std::vector<float> full(hs), part(hs);
        Exec ex;
        matmul(ex, full.data(), hs, row.data(), T, v.data(), hs, 1, T, hs);
        matmul(ex, part.data(), hs, prefix.data(), n, v.data(), hs, 1, n, hs);
        if (auto diff = first_difference(full, part)) RC_FAIL(*diff);
    });
}

TEST_CASE(
    "softmax by recomputed scores (gpu/kernels.h) equals kernels.cpp softmax bit for bit on -inf and huge and "
    "denormal inputs",
    "[kernels][softmax]") {
    // Any row, not only those attention forms: ordinary values (multiples of 2^-18 in [-4, 4))
    // mixed with zeros, denormals, huge values, infinities and exp's edges.
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> special = {0.0f,   -0.0f, 1e-40f, -3e-42f, 1.4e-45f, 1e-30f, -2e-38f, 1e15f,
                                        -7e14f, inf,   -inf,   3e38f,   -3.4e38f, 88.8f,  -104.0f, -87.5f};
    rc::prop("softmax over 1-40 values", [&] {
        const int n = *full_range(1, 41);
        const std::vector<float> x = *rc::gen::container<std::vector<float>>(  // [n]
            std::size_t(n),
            rc::gen::weightedOneOf<float>({{6, rc::gen::map(rc::gen::inRange(-(1 << 20), 1 << 20),
                                                            [](int i) { return float(i) / float(1 << 18); })},
                                           {1, rc::gen::elementOf(special)}}));
        std::vector<float> a(x.size()), b = x;
        gpu::host::softmax(a.data(), x.data(), n);
        softmax(b.data(), n);
        if (auto diff = first_difference(a, b)) RC_FAIL(fmt::format("softmax n = {}: {}", n, *diff));
    });
    // A masked row as naive attention builds it: exact zeros after the first entry.
    const std::vector<float> masked = {0.25f, -inf, -inf, -inf};
    std::vector<float> a(4), b = masked;
    gpu::host::softmax(a.data(), masked.data(), 4);
    softmax(b.data(), 4);
    CHECK(!first_difference(a, b));
    CHECK(a == std::vector<float>{1.0f, 0.0f, 0.0f, 0.0f});
}

TEST_CASE("ulp_distance counts representable floats between two values", "[kernels][ulp]") {
    CHECK(ulp_distance(1.0f, 1.0f) == 0);
    CHECK(ulp_distance(1.0f, std::nextafter(1.0f, 2.0f)) == 1);
    CHECK(ulp_distance(-1.0f, std::nextafter(-1.0f, -2.0f)) == 1);
    CHECK(ulp_distance(0.0f, -0.0f) == 1);  // bitwise exactness tells the zeros apart
    CHECK(ulp_distance(1.0f, 2.0f) == (1u << 23));
    CHECK(ulp_distance(kNaN, 1.0f) == std::numeric_limits<std::uint64_t>::max());
}
