// Tiled attention's kernels (core/tiled_attention.h): it computes attention (against a float64
// reference), the CPU's row and the GPU's per-thread code give one set of bits, and its options
// refuse what is out of range. That naive, prefill, chunked prefill and split-KV decode agree
// bit for bit is kvlab verify's tiled-attention row (tests/test_verify.cpp).
#include <rapidcheck/catch.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "../gpu/kernels.h"  // the GPU's per-thread code (core/ has a kernels.h too)
#include "kernels.h"
#include "test_util.h"

using namespace kvlab;

namespace {

// One query row over n keys: q [head_size], keys and values [n, head_size].
struct RowCase {
    int head_size = 1, n = 1, tile = 1;
    std::vector<float> q, k, v;
};

// Tiles are small most often (so that a row spans several), up to kMaxTile.
RowCase gen_row_case(float range) {
    RowCase r;
    r.head_size = *rc::gen::inRange(1, 17);
    r.n = *rc::gen::inRange(1, 97);
    r.tile = *rc::gen::arbitrary<bool>() ? *rc::gen::inRange(1, 9) : *rc::gen::inRange(1, AttentionSpec::kMaxTile + 1);
    auto floats = [&](std::size_t count) {
        return *rc::gen::container<std::vector<float>>(
            count, rc::gen::map(rc::gen::inRange(-1000, 1001), [=](int x) { return range * float(x) / 1000.0f; }));
    };
    r.q = floats(std::size_t(r.head_size));
    r.k = floats(std::size_t(r.n) * r.head_size);
    r.v = floats(std::size_t(r.n) * r.head_size);
    return r;
}

// The CPU's tiled row. fold: how a tile's partial joins the running state (kernels.h fold_tile;
// a counter-test passes a wrong one).
using Fold = void (*)(float* out, TileStats& acc, const float* o, TileStats stats, int head_size);
std::vector<float> cpu_tiled(const RowCase& r, Fold fold = fold_tile) {
    const int hs = r.head_size;
    std::vector<float> out(static_cast<std::size_t>(hs));    // [head_size]
    std::vector<float> e(static_cast<std::size_t>(r.tile));  // [tile]
    std::vector<float> o(static_cast<std::size_t>(hs));      // [head_size]
    auto key = [&](int t) { return r.k.data() + std::size_t(t) * hs; };
    auto value = [&](int t) { return r.v.data() + std::size_t(t) * hs; };
    if (fold == fold_tile) {
        std::vector<float> scratch(static_cast<std::size_t>(r.tile + hs));  // [tile + head_size]
        tiled_attention_row(out.data(), r.q.data(), hs, r.n, r.tile, key, value, scratch.data());
        return out;
    }
    TileStats acc = tile_fold_start();
    for (int t0 = 0; t0 < r.n; t0 += r.tile) {
        const TileStats st =
            attention_tile(o.data(), e.data(), r.q.data(), hs, t0, std::min(t0 + r.tile, r.n), key, value);
        fold(out.data(), acc, o.data(), st, hs);
    }
    for (float& x : out) x = x / acc.l;
    return out;
}

std::vector<float> gpu_tiled(const RowCase& r) {
    const int hs = r.head_size;
    const float scale = attention_scale(hs);
    std::vector<float> out(static_cast<std::size_t>(hs));  // [head_size]
    auto score = [&](int t) {
        float s = 0.0f;
        for (int d = 0; d < hs; d++) s = s + r.q[std::size_t(d)] * r.k[std::size_t(t) * hs + d];
        return s / scale;
    };
    auto value = [&](int t, int d) { return r.v[std::size_t(t) * hs + d]; };
    gpu::tiled_head(out.data(), r.n, r.tile, hs, score, value);
    return out;
}

// Attention of the row in float64: softmax(q.k / sqrt(head_size)) . v.
std::vector<double> reference(const RowCase& r) {
    const int hs = r.head_size;
    std::vector<double> s(static_cast<std::size_t>(r.n));        // [n]
    std::vector<double> out(static_cast<std::size_t>(hs), 0.0);  // [head_size]
    double max = -std::numeric_limits<double>::infinity(), sum = 0.0;
    for (int t = 0; t < r.n; t++) {
        double x = 0.0;
        for (int d = 0; d < hs; d++) x += double(r.q[std::size_t(d)]) * r.k[std::size_t(t) * hs + d];
        s[std::size_t(t)] = x / std::sqrt(double(hs));
        max = std::max(max, s[std::size_t(t)]);
    }
    for (double& x : s) sum += (x = std::exp(x - max));
    for (int t = 0; t < r.n; t++)
        for (int d = 0; d < hs; d++) out[std::size_t(d)] += s[std::size_t(t)] / sum * r.v[std::size_t(t) * hs + d];
    return out;
}

// The row is attention: within 1e-5 of the largest |v| of float64's (float sums of up to 96
// terms, each weight a few ulp off).
void check_against_reference(Fold fold) {
    const RowCase r = gen_row_case(*rc::gen::element(1.0f, 4.0f));
    const std::vector<float> got = cpu_tiled(r, fold);
    const std::vector<double> want = reference(r);
    double v_max = 0.0;
    for (float x : r.v) v_max = std::max(v_max, double(std::fabs(x)));
    for (int d = 0; d < r.head_size; d++)
        if (!(std::fabs(got[std::size_t(d)] - want[std::size_t(d)]) <= 1e-5 * v_max))
            RC_FAIL(fmt::format("tiled attention, n = {}, tile {}, head_size {}: out[{}] = {} but float64 gives {}",
                                r.n, r.tile, r.head_size, d, got[std::size_t(d)], want[std::size_t(d)]));
}

// A fold that forgets to rescale the running output to the new maximum (o' = o + o_j b).
void fold_without_rescale(float* out, TileStats& acc, const float* o, TileStats stats, int head_size) {
    const TileFold f = tile_fold(acc, stats);
    for (int d = 0; d < head_size; d++) out[d] = out[d] + o[d] * f.b;
    acc = f.next;
}

}  // namespace

TEST_CASE("tiled attention computes attention: within 1e-5 of a float64 softmax at any tile", "[tiled]") {
    rc::prop("tiled row vs float64", [] { check_against_reference(fold_tile); });
}

TEST_CASE("tiled attention counter-test: a fold that does not rescale to the new maximum is caught",
          "[tiled][counter]") {
    test::expect_failure([] { check_against_reference(fold_without_rescale); }, "but float64 gives");
}

TEST_CASE("tiled attention: the CPU's row and the GPU's per-thread code give the same bits", "[tiled][gpu-host]") {
    rc::prop("kernels.h tiled_attention_row == gpu/kernels.h tiled_head", [] {
        // Scores up to +-1e4 reach exp's underflow: tiles whose maximum is far below the row's.
        const RowCase r = gen_row_case(*rc::gen::element(1.0f, 30.0f, 100.0f));
        const std::vector<float> a = cpu_tiled(r), b = gpu_tiled(r);
        if (auto diff = first_difference(a, b))
            RC_FAIL(fmt::format("n = {}, tile {}, head_size {}: {}", r.n, r.tile, r.head_size, *diff));
    });
}

TEST_CASE("tiled and simple attention are different algorithms: the same row gives other bits", "[tiled]") {
    // Not a defect: the tiled row divides once at the end and rescales per tile. It shows that
    // --attention tiled runs another kernel, and why both decoders must run the same one.
    int differ = 0;
    std::mt19937 rng(20261126);
    std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
    for (int round = 0; round < 50; round++) {
        std::vector<float> x(8 + 2 * 64 * 8);  // q [8], k [64, 8], v [64, 8]
        for (float& f : x) f = uniform(rng);
        RowCase r{8,
                  64,
                  4,
                  {x.begin(), x.begin() + 8},
                  {x.begin() + 8, x.begin() + 8 + 512},
                  {x.begin() + 8 + 512, x.begin() + 8 + 1024}};
        std::vector<float> simple(8), scores(64);
        attention_row(
            simple.data(), r.q.data(), 8, 64, [&](int t) { return r.k.data() + std::size_t(t) * 8; },
            [&](int t) { return r.v.data() + std::size_t(t) * 8; }, scores.data());
        differ += first_difference(simple, cpu_tiled(r)).has_value();
    }
    CHECK(differ > 0);
}

TEST_CASE("the attention options: simple or tiled with tiles of 1..256 keys and anything else one line",
          "[tiled][errors]") {
    CHECK(parse_attention("simple", 64) == AttentionSpec{});
    CHECK(parse_attention("tiled", 1) == AttentionSpec{AttentionSpec::Kind::tiled, 1});
    CHECK(parse_attention("tiled", 256).tile == 256);
    CHECK(attention_name(parse_attention("tiled", 96)) == "tiled (tile 96)");
    CHECK_THROWS_WITH(parse_attention("flash", 64), "unknown attention 'flash' (simple, tiled)");
    CHECK_THROWS_WITH(parse_attention("tiled", 0), "attention tile 0 is out of range (1..256 keys)");
    CHECK_THROWS_WITH(parse_attention("tiled", 257), "attention tile 257 is out of range (1..256 keys)");
}
