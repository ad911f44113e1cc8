// MLA (core/mla.h): each form's cached decode equals its own naive decode bitwise, over any
// chunking; the two forms agree only within rounding, which the property between forms finds;
// the latent cache holds the bytes `kvlab memory` states for an MLA shape, DeepSeek-V3's included.
#include <rapidcheck/catch.h>

#include <catch2/catch.hpp>
#include <cmath>

#include "memory_model.h"
#include "mla.h"
#include "mla_property.h"
#include "property.h"
#include "test_util.h"

using namespace kvlab;

TEST_CASE("mla: rebuilding K and V from the latent cache equals MLA naive decode in that form bitwise", "[mla]") {
    rc::prop("random MLA shapes, prompts in chunks of any size",
             [] { mla_property(MlaForm::rebuild, MlaForm::rebuild); });
}

TEST_CASE("mla: the absorbed form over the latent cache equals MLA naive decode in that form bitwise", "[mla]") {
    rc::prop("random MLA shapes, prompts in chunks of any size",
             [] { mla_property(MlaForm::absorbed, MlaForm::absorbed); });
}

TEST_CASE("mla counter-test: the absorbed form is not bitwise equal to naive decode in the rebuild form",
          "[mla][counter]") {
    test::expect_failure([] { mla_property(MlaForm::absorbed, MlaForm::rebuild); }, "logits differ from naive");
    test::expect_failure([] { mla_property(MlaForm::rebuild, MlaForm::absorbed); }, "logits differ from naive");
}

TEST_CASE("mla: the two forms agree within rounding: equal in real arithmetic", "[mla]") {
    // The bound: a few float steps of the logits' scale. A wrong absorption (another scale,
    // another head's block of W_UK) moves logits by their own size, far past it.
    rc::prop("random MLA shapes and prompts", [] {
        const MlaConfig c = draw_mla_config();
        const MlaModel m = random_mla_model(c, *rc::gen::arbitrary<std::uint64_t>());
        const std::vector<int> tokens = draw_tokens(c.base, draw(1, c.base.max_seq));
        const std::vector<float> a = mla_naive(m, tokens, MlaForm::rebuild),
                                 b = mla_naive(m, tokens, MlaForm::absorbed);
        double scale = 0, diff = 0;
        for (std::size_t i = 0; i < a.size(); i++)
            scale = std::max(scale, double(std::fabs(a[i]))), diff = std::max(diff, double(std::fabs(a[i] - b[i])));
        RC_ASSERT(diff <= 1e-5 * (1.0 + scale));
    });
}

TEST_CASE("mla counter-test: a model whose absorbed query reads another head's W_UK is far outside the bound",
          "[mla][counter]") {
    MlaConfig c;
    c.base = Config{8, 8, 2, 2, 2, 16, 12};
    c.rank = 4, c.rope_dim = 2;
    MlaModel m = random_mla_model(c, 3);
    const std::vector<float> a = mla_naive(m, std::vector<int>{1, 5, 7, 2, 9}, MlaForm::absorbed);
    // Swap the two heads' blocks of W_UK^T in every layer: the planted absorption bug.
    const std::size_t block = std::size_t(c.head_size()) * c.rank;
    for (int l = 0; l < c.base.n_layers; l++)
        std::swap_ranges(m.wuk_t.begin() + std::ptrdiff_t(2 * l * block),
                         m.wuk_t.begin() + std::ptrdiff_t((2 * l + 1) * block),
                         m.wuk_t.begin() + std::ptrdiff_t((2 * l + 1) * block));
    const std::vector<float> b = mla_naive(m, std::vector<int>{1, 5, 7, 2, 9}, MlaForm::absorbed);
    double scale = 0, diff = 0;
    for (std::size_t i = 0; i < a.size(); i++)
        scale = std::max(scale, double(std::fabs(a[i]))), diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    CHECK(diff > 1e-5 * (1.0 + scale));
}

TEST_CASE("mla: the latent cache holds the bytes kvlab memory states for the shape, DeepSeek-V3's included", "[mla]") {
    // DeepSeek-V3: 61 layers, kv_lora_rank 512, qk_rope_head_dim 64 (core/memory_model.cpp).
    const PublishedShape& v3 = find_shape("deepseek-v3");
    MlaConfig c;
    c.base = Config{4, 4, v3.n_layers, 2, 2, 8, 16};
    c.rank = v3.mla_latent, c.rope_dim = v3.mla_rope;
    const MlaModel m = random_mla_model(c, 1);
    MlaCache cache(c);
    MlaDecoder d(m, cache, MlaForm::absorbed);
    d.prefill(std::vector<int>{1, 2, 3});
    CHECK(cache.used_bytes() == kv_bytes(v3, 32, 3, 1));
    CHECK(cache.allocated_bytes() == kv_bytes(v3, 32, c.base.max_seq, 1));
    // Any drawn shape: bytes per token in fp32 are n_layers x (rank + rope_dim) x 4.
    rc::check([] {
        const MlaConfig s = draw_mla_config();
        const MlaModel model = random_mla_model(s, 2);
        MlaCache k(s);
        MlaDecoder dec(model, k, MlaForm::rebuild);
        const int T = draw(1, s.base.max_seq);
        dec.prefill(draw_tokens(s.base, T));
        PublishedShape p;
        p.name = "drawn", p.n_layers = s.base.n_layers, p.n_heads = s.base.n_heads, p.n_kv_heads = s.base.n_heads;
        p.head_size = s.head_size(), p.mla_latent = s.rank, p.mla_rope = s.rope_dim;
        RC_ASSERT(k.used_bytes() == kv_bytes(p, 32, T, 1));
        k.truncate(T - 1);
        RC_ASSERT(k.used_bytes() == kv_bytes(p, 32, T, 1) - kv_bytes(p, 32, 1, 1));
    });
}

TEST_CASE("mla: shapes, tokens and lengths that make no sense are one-line errors", "[mla][errors]") {
    MlaConfig c;
    c.base = Config{8, 8, 1, 2, 2, 16, 4};
    c.rank = 0, c.rope_dim = 2;
    CHECK_THROWS_WITH(random_mla_model(c, 1), "mla: rank must be >= 1, not 0");
    c.rank = 4, c.rope_dim = 3;
    CHECK_THROWS_WITH(random_mla_model(c, 1), "mla: rope_dim must be even and >= 0 (pairs are rotated), not 3");
    c.rope_dim = 2;
    const MlaModel m = random_mla_model(c, 1);
    MlaCache cache(c);
    MlaDecoder d(m, cache, MlaForm::rebuild);
    CHECK_THROWS_WITH(d.prefill(std::vector<int>{16}), "mla: token 16 is outside [0, 16)");
    CHECK_THROWS_WITH(d.prefill(std::vector<int>{1, 2, 3, 4, 5}), "mla: 5 positions from 0 do not fit max_seq = 4");
    CHECK(cache.length() == 0);
    MlaConfig other = c;
    other.rank = 2;
    MlaCache small(other);
    CHECK_THROWS_WITH(MlaDecoder(m, small, MlaForm::absorbed), Catch::Contains("mla: a cache of shape"));
    CHECK_THROWS_WITH(cache.truncate(1), "mla cache: cannot roll back to 1 (length is 0)");
}

namespace {
// The largest |a - b| over the logits, against the bound the forms keep.
bool within_rounding(const std::vector<float>& a, const std::vector<float>& b) {
    double scale = 0, diff = 0;
    for (std::size_t i = 0; i < a.size(); i++)
        scale = std::max(scale, double(std::fabs(a[i]))), diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    return diff <= 1e-4 * (1.0 + scale);
}

// A model whose latent reaches keys and values through only its first k latent channels.
MlaModel low_rank_model(const MlaConfig& c, int k, std::uint64_t seed) {
    MlaModel m = random_mla_model(c, seed);
    const std::size_t wide = std::size_t(c.base.n_heads) * c.head_size();
    for (int l = 0; l < c.base.n_layers; l++)
        for (int j = k; j < c.rank; j++)
            for (std::size_t o = 0; o < wide; o++)
                m.wuk[(std::size_t(l) * c.rank + j) * wide + o] = 0.0f,
                                                             m.wuv[(std::size_t(l) * c.rank + j) * wide + o] = 0.0f;
    return truncate_rank(m, c.rank);  // rank unchanged: recomputes wuk_t (rotated, within rounding)
}
}  // namespace

TEST_CASE("mla: cutting the latent to the rank its up-projections have keeps the logits within rounding", "[mla]") {
    rc::prop("random MLA shapes, [W_UK | W_UV] of rank k <= rank, cut to k", [] {
        const MlaConfig c = draw_mla_config();
        const int k = draw(1, c.rank);
        const MlaModel full = low_rank_model(c, k, *rc::gen::arbitrary<std::uint64_t>());
        const MlaModel cut = truncate_rank(full, k);
        RC_ASSERT(cut.config.rank == k);
        const std::vector<int> tokens = draw_tokens(c.base, draw(1, c.base.max_seq));
        for (MlaForm form : {MlaForm::rebuild, MlaForm::absorbed})
            RC_ASSERT(within_rounding(mla_naive(full, tokens, form), mla_naive(cut, tokens, form)));
    });
}

TEST_CASE("mla counter-test: cutting below that rank moves the logits past rounding", "[mla][counter]") {
    MlaConfig c;
    c.base = Config{16, 16, 2, 2, 2, 32, 12};
    c.rank = 8, c.rope_dim = 2;
    const MlaModel full = low_rank_model(c, 6, 5);
    const std::vector<int> tokens{1, 5, 7, 2, 9, 30, 4};
    CHECK(within_rounding(mla_naive(full, tokens, MlaForm::rebuild),
                          mla_naive(truncate_rank(full, 6), tokens, MlaForm::rebuild)));
    CHECK(!within_rounding(mla_naive(full, tokens, MlaForm::rebuild),
                           mla_naive(truncate_rank(full, 3), tokens, MlaForm::rebuild)));
    CHECK_THROWS_WITH(truncate_rank(full, 9), "mla: a rank of 9 is outside 1..8, the model's");
}

namespace {
// MLA in double, written from the formulas in core/mla.h and nothing of its code: every position
// recomputed, K and V rebuilt per head, the scale sqrt(head_size + rope_dim). planted_scale: the
// scale of a head without its RoPE part, sqrt(head_size) (the counter-test's bug).
std::vector<double> mla_reference64(const MlaModel& m, std::span<const int> tokens, bool planted_scale = false) {
    const MlaConfig& mc = m.config;
    const int dim = mc.base.dim, H = mc.base.n_heads, hs = mc.head_size(), dr = mc.rope_dim, r = mc.rank;
    const int hid = mc.base.hidden_dim, V = mc.base.vocab_size, T = int(tokens.size());
    using Vec = std::vector<double>;
    auto product = [](const Vec& x, const float* w, int n_in, int n_out, int ldw) {  // x[n_in] W[n_in, n_out]
        Vec y(static_cast<std::size_t>(n_out), 0.0);
        for (int o = 0; o < n_out; o++)
            for (int k = 0; k < n_in; k++) y[std::size_t(o)] += x[std::size_t(k)] * double(w[std::size_t(k) * ldw + o]);
        return y;
    };
    auto norm = [dim](const Vec& x, const float* w) {
        double ss = 0;
        for (double v : x) ss += v * v;
        Vec y(x.size());
        for (int i = 0; i < dim; i++) y[std::size_t(i)] = x[std::size_t(i)] / std::sqrt(ss / dim + 1e-5) * double(w[i]);
        return y;
    };
    auto rotate = [&](Vec& v, int pos) {  // pairs (2j, 2j + 1) of one rope_dim-wide head
        for (int j = 0; j < dr / 2; j++) {
            const double c = m.rope.cos[std::size_t(pos) * (dr / 2) + j],
                         s = m.rope.sin[std::size_t(pos) * (dr / 2) + j];
            const double a = v[std::size_t(2 * j)], b = v[std::size_t(2 * j + 1)];
            v[std::size_t(2 * j)] = a * c - b * s, v[std::size_t(2 * j + 1)] = a * s + b * c;
        }
    };
    std::vector<Vec> x(static_cast<std::size_t>(T));
    for (int t = 0; t < T; t++)
        x[std::size_t(t)] = Vec(m.token_embedding.begin() + std::ptrdiff_t(tokens[std::size_t(t)]) * dim,
                                m.token_embedding.begin() + std::ptrdiff_t(tokens[std::size_t(t)] + 1) * dim);
    for (int l = 0; l < mc.base.n_layers; l++) {
        const std::size_t n = static_cast<std::size_t>(T);
        std::vector<Vec> qc(n), qr(n), c(n), kr(n);
        for (int t = 0; t < T; t++) {
            const Vec xb = norm(x[std::size_t(t)], m.rms_att.data() + std::size_t(l) * dim);
            qc[std::size_t(t)] = product(xb, m.wq.data() + std::size_t(l) * dim * H * hs, dim, H * hs, H * hs);
            qr[std::size_t(t)] = product(xb, m.wqr.data() + std::size_t(l) * dim * H * dr, dim, H * dr, H * dr);
            c[std::size_t(t)] = product(xb, m.wdkv.data() + std::size_t(l) * dim * r, dim, r, r);
            kr[std::size_t(t)] = product(xb, m.wkr.data() + std::size_t(l) * dim * dr, dim, dr, dr);
            for (int h = 0; h < H; h++) {
                Vec q(qr[std::size_t(t)].begin() + h * dr, qr[std::size_t(t)].begin() + (h + 1) * dr);
                rotate(q, t);
                std::copy(q.begin(), q.end(), qr[std::size_t(t)].begin() + h * dr);
            }
            rotate(kr[std::size_t(t)], t);
        }
        const double scale = std::sqrt(double(planted_scale ? hs : hs + dr));
        for (int i = 0; i < T; i++) {
            Vec att(static_cast<std::size_t>(H * hs), 0.0);
            for (int h = 0; h < H; h++) {
                Vec s(static_cast<std::size_t>(i + 1));
                std::vector<Vec> v(static_cast<std::size_t>(i + 1));
                for (int t = 0; t <= i; t++) {
                    const Vec k =
                        product(c[std::size_t(t)], m.wuk.data() + std::size_t(l) * r * H * hs + h * hs, r, hs, H * hs);
                    v[std::size_t(t)] =
                        product(c[std::size_t(t)], m.wuv.data() + std::size_t(l) * r * H * hs + h * hs, r, hs, H * hs);
                    double d = 0;
                    for (int e = 0; e < hs; e++) d += qc[std::size_t(i)][std::size_t(h * hs + e)] * k[std::size_t(e)];
                    for (int e = 0; e < dr; e++)
                        d += qr[std::size_t(i)][std::size_t(h * dr + e)] * kr[std::size_t(t)][std::size_t(e)];
                    s[std::size_t(t)] = d / scale;
                }
                const double top = *std::max_element(s.begin(), s.end());
                double sum = 0;
                for (double& e : s) sum += (e = std::exp(e - top));
                for (int t = 0; t <= i; t++)
                    for (int e = 0; e < hs; e++)
                        att[std::size_t(h * hs + e)] += s[std::size_t(t)] / sum * v[std::size_t(t)][std::size_t(e)];
            }
            const Vec o = product(att, m.wo.data() + std::size_t(l) * H * hs * dim, H * hs, dim, dim);
            for (int e = 0; e < dim; e++) x[std::size_t(i)][std::size_t(e)] += o[std::size_t(e)];
            const Vec xb = norm(x[std::size_t(i)], m.rms_ffn.data() + std::size_t(l) * dim);
            Vec h1 = product(xb, m.w1.data() + std::size_t(l) * dim * hid, dim, hid, hid);
            const Vec h3 = product(xb, m.w3.data() + std::size_t(l) * dim * hid, dim, hid, hid);
            for (int e = 0; e < hid; e++)
                h1[std::size_t(e)] = h1[std::size_t(e)] / (1 + std::exp(-h1[std::size_t(e)])) * h3[std::size_t(e)];
            const Vec f = product(h1, m.w2.data() + std::size_t(l) * hid * dim, hid, dim, dim);
            for (int e = 0; e < dim; e++) x[std::size_t(i)][std::size_t(e)] += f[std::size_t(e)];
        }
    }
    const Vec last = norm(x.back(), m.rms_final.data());
    Vec logits(static_cast<std::size_t>(V), 0.0);
    for (int v = 0; v < V; v++)
        for (int e = 0; e < dim; e++)
            logits[std::size_t(v)] += last[std::size_t(e)] * double(m.token_embedding[std::size_t(v) * dim + e]);
    return logits;
}

// Whether float logits are the double reference's within float rounding of their scale.
bool near_reference(const std::vector<float>& got, const std::vector<double>& want) {
    double scale = 0, diff = 0;
    for (std::size_t i = 0; i < got.size(); i++)
        scale = std::max(scale, std::fabs(want[i])), diff = std::max(diff, std::fabs(double(got[i]) - want[i]));
    return diff <= 1e-4 * (1.0 + scale);
}
}  // namespace

TEST_CASE("mla: both forms are the formulas of core/mla.h within float rounding of a double reference", "[mla]") {
    rc::prop("random MLA shapes and prompts", [] {
        const MlaConfig c = draw_mla_config();
        const MlaModel m = random_mla_model(c, *rc::gen::arbitrary<std::uint64_t>());
        const std::vector<int> tokens = draw_tokens(c.base, draw(1, c.base.max_seq));
        const std::vector<double> want = mla_reference64(m, tokens);
        RC_ASSERT(near_reference(mla_naive(m, tokens, MlaForm::rebuild), want));
        RC_ASSERT(near_reference(mla_naive(m, tokens, MlaForm::absorbed), want));
    });
}

TEST_CASE("mla counter-test: a reference that scales scores by sqrt(head_size) alone is told apart", "[mla][counter]") {
    test::expect_failure(
        [] {
            const MlaConfig c = draw_mla_config();
            const MlaModel m = random_mla_model(c, *rc::gen::arbitrary<std::uint64_t>());
            const std::vector<int> tokens = draw_tokens(c.base, draw(1, c.base.max_seq));
            if (!near_reference(mla_naive(m, tokens, MlaForm::rebuild), mla_reference64(m, tokens, true)))
                fail("the planted scale differs");
        },
        "the planted scale differs");
}
