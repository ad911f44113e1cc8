// The kernels no backend runs on their own, against their float64 oracles (tests/kernel_oracles.h):
// the raw products (kernels.cpp's tiled matmul, which naive attention's products run on, and
// matmul_reference), softmax on any row (-inf and far-out-of-range scores that attention never
// forms), exp_f32 anywhere, and the RoPE table checker. Each oracle has a counter-test: a planted
// bug that it must catch.
//
// Every backend kernel (embed, the weights' products, rmsnorm, rope, silu_mul, add, naive and
// cached attention, the K/V store) runs against the same oracles in the backend table,
// tests/test_backend_ops.cpp, with its planted bugs there.
#include <fmt/format.h>
#include <rapidcheck.h>
#include <rapidcheck/catch.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kernel_oracles.h"
#include "kernels.h"
#include "property.h"
#include "test_util.h"

using kvlab::Exec;
using namespace kvlab::oracle;

namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

// An integer in [lo, hi], both included, drawn by RapidCheck at full size.
int draw(int lo, int hi) { return kvlab::draw(lo, hi); }

std::vector<float> hostile(std::int64_t n, int lo_exp, int hi_exp) { return hostile_vector(draw, n, lo_exp, hi_exp); }

// ---- matmul on raw arrays: rows 1-2, n_in 0-39, n_out 1-8.
void matmul_oracle(kvlab::MatmulFn mm) {
    const int rows = draw(1, 2), n_in = draw(0, 39), n_out = draw(1, 8);
    // Scales up to 2^55: products below 2^112, sums of 40 of them far below float's 2^128.
    const std::vector<float> x = hostile(rows * n_in, -149, 55);   // [rows, n_in]
    const std::vector<float> w = hostile(n_in * n_out, -149, 55);  // [n_in, n_out]
    std::vector<float> y(std::size_t(rows) * n_out, -1.0f);        // [rows, n_out]
    assert(x.size() == std::size_t(rows) * n_in && w.size() == std::size_t(n_in) * n_out);
    Exec ex;
    mm(ex, y.data(), n_out, x.data(), n_in, w.data(), n_out, rows, n_in, n_out);
    check_matmul(x.data(), n_in, w.data(), n_out, y.data(), n_out, rows, n_in, n_out);
}

// ---- softmax over 1-39 scores from subnormal to 2^100 (far past exp's range, so a kernel that
// forgets to subtract the maximum overflows), a quarter of them -inf (masked); entry 0 stays
// finite, as in a causal row.
using SoftmaxFn = std::function<void(float*, int)>;

void softmax_oracle(const SoftmaxFn& softmax) {
    const int n = draw(1, 39);
    std::vector<float> x = hostile(n, -149, 100);  // [n]
    for (int i = 1; i < n; i++)
        if (draw(0, 3) == 0) x[i] = neg_inf;
    std::vector<float> p = x;
    softmax(p.data(), n);
    check_softmax(x, p);
}

// exp_f32 is within 1 ulp of the correctly rounded e^x wherever e^x is a normal float, for any
// bit pattern in that range (the sweep in test_kernels.cpp covers a grid; this draws anywhere).
using ExpFn = std::function<float(float)>;

void exp_oracle(const ExpFn& exp) {
    const float x = std::bit_cast<float>(*rc::gen::arbitrary<std::uint32_t>());
    RC_PRE(x >= -87.3f && x <= 88.7f);  // e^x normal and finite
    const float want = float(std::exp(double(x)));
    const std::uint64_t d = kvlab::ulp_distance(exp(x), want);
    if (d > 1) kvlab::fail(fmt::format("exp_f32({:a}) = {:a}, {} ulp from e^x = {:a}", x, exp(x), d, want));
}

}  // namespace

TEST_CASE("kernel oracles: matmul is within the derived bound of the float64 sum, over the whole domain",
          "[kernels][oracle]") {
    rc::prop("matmul vs float64", [] { matmul_oracle(kvlab::matmul); });
    rc::prop("matmul_reference vs float64", [] { matmul_oracle(kvlab::matmul_reference); });
}

TEST_CASE("kernel oracles: softmax (huge, subnormal and tied scores, -inf) is within the derived bound",
          "[kernels][oracle]") {
    rc::prop("softmax vs float64", [] { softmax_oracle(kvlab::softmax); });
}

TEST_CASE("kernel oracles: exp_f32 within 1 ulp for every float whose e^x is normal", "[kernels][oracle]") {
    rc::prop("exp_f32 vs float64", [] { exp_oracle([](float x) { return kvlab::exp_f32(x); }); });
}

TEST_CASE("kernel oracles counter-test: a planted bug in each kernel is caught by its oracle",
          "[kernels][oracle][counter]") {
    SECTION("matmul that drops the last term") {
        kvlab::test::expect_failure(
            [] {
                matmul_oracle([](Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw,
                                 int rows, int n_in, int n_out) {
                    kvlab::matmul_reference(ex, y, ldy, x, ldx, w, ldw, rows, n_in > 0 ? n_in - 1 : 0, n_out);
                });
            },
            "matmul Y");
    }
    SECTION("softmax that does not subtract the maximum (overflows on large scores)") {
        kvlab::test::expect_failure(
            [] {
                softmax_oracle([](float* x, int n) {
                    float sum = 0;
                    for (int i = 0; i < n; i++) sum = sum + (x[i] = kvlab::exp_f32(x[i]));
                    for (int i = 0; i < n; i++) x[i] = x[i] / sum;
                });
            },
            "softmax of");
    }
    SECTION("softmax whose sum skips the last entry") {
        kvlab::test::expect_failure(
            [] {
                softmax_oracle([](float* x, int n) {
                    float max = x[0];
                    for (int i = 1; i < n; i++) max = std::max(max, x[i]);
                    float sum = 0;
                    for (int i = 0; i < n; i++) {
                        x[i] = kvlab::exp_f32(x[i] - max);
                        if (i + 1 < n) sum = sum + x[i];
                    }
                    for (int i = 0; i < n; i++) x[i] = x[i] / sum;
                });
            },
            "softmax of");
    }
    SECTION("a RoPE table with frequencies 10000^(-j / head_size)") {
        kvlab::test::expect_failure(
            [] {
                const int hs = 2 * draw(1, 5), max_seq = draw(2, 99);
                kvlab::RopeTable wrong(max_seq, hs);
                for (int pos = 0; pos < max_seq; pos++)
                    for (int j = 0; j < wrong.n_pairs; j++) {
                        const float angle = float(pos) * (1.0f / std::pow(10000.0f, float(j) / float(hs)));
                        wrong.cos[std::size_t(pos) * wrong.n_pairs + j] = float(std::cos(double(angle)));
                        wrong.sin[std::size_t(pos) * wrong.n_pairs + j] = float(std::sin(double(angle)));
                    }
                check_rope_table(wrong, hs);
            },
            "RoPE table");
    }
    SECTION("exp_f32 two ulps high above 1") {
        kvlab::test::expect_failure(
            [] {
                exp_oracle([](float x) {
                    const float y = kvlab::exp_f32(x);
                    return x > 0 ? std::nextafter(std::nextafter(y, INFINITY), INFINITY) : y;
                });
            },
            "exp_f32(");
    }
}
