// MLA (core/mla.h): each form's cached decode equals its own naive decode bitwise, over any
// chunking; the two forms agree only within rounding, which the property between forms finds;
// the latent cache holds the bytes `kvlab memory` states for an MLA shape, DeepSeek-V3's included.
#include <rapidcheck/catch.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "memory_model.h"
#include "mla.h"
#include "mla_property.h"
#include "mla_reference64.h"
#include "property.h"
#include "test_util.h"

using namespace kvlab;

namespace {
// The largest |got - want| / bound over the logits [vocab_size]: the share of the derived rounding
// bound (tests/mla_reference64.h) they use; a NaN uses all of it and more.
double bound_used(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& bound) {
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); i++) {
        const double d = std::fabs(double(got[i]) - want[i]);
        if (std::isnan(d)) return std::numeric_limits<double>::infinity();
        worst = std::max(worst, d == 0 ? 0.0 : d / bound[i]);
    }
    return worst;
}
double bound_used(const std::vector<float>& got, const mla_ref::Logits& want) {
    return bound_used(got, want.v, want.bound);
}

// How far past the derived bound a float result may go. The bound is a worst case to first order,
// so a float result uses at most all of it; what it leaves out (second-order terms, the double's
// own rounding) is under a thousandth of it here, and 2 covers that many times over. Evidence: over 200 seeds x 100
// drawn models and prompts, each form against the reference used at most 0.57 of its bound (dim = 1 models: a few
// roundings of the last norm, shared by every logit, make most of the error) and the two forms 0.37 of theirs; the
// typical share is 0.02. A planted bug uses thousands (the counter-tests).
constexpr double kSafety = 2;
}  // namespace

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
    // Each form is within its own derived bound of the same real logits, so the two are within
    // the sum of their bounds. A wrong absorption (another scale, another head's block of W_UK)
    // moves logits by their own size, far past it (the counter-tests).
    rc::prop("random MLA shapes and prompts", [] {
        const MlaConfig c = draw_mla_config();
        const MlaModel m = random_mla_model(c, *rc::gen::arbitrary<std::uint64_t>());
        const std::vector<int> tokens = draw_tokens(c.base, draw(1, c.base.max_seq));
        const std::vector<float> a = mla_naive(m, tokens, MlaForm::rebuild),
                                 b = mla_naive(m, tokens, MlaForm::absorbed);
        const mla_ref::Logits ra = mla_ref::mla_reference64(m, tokens, MlaForm::rebuild),
                              rb = mla_ref::mla_reference64(m, tokens, MlaForm::absorbed);
        std::vector<double> b64(b.begin(), b.end()), both(b.size());  // [vocab_size] each
        for (std::size_t i = 0; i < b.size(); i++) both[i] = ra.bound[i] + rb.bound[i];
        RC_ASSERT(bound_used(a, b64, both) <= kSafety);
    });
}

TEST_CASE("mla counter-test: a model whose absorbed query reads another head's W_UK is far outside the bound",
          "[mla][counter]") {
    MlaConfig c;
    c.base = Config{8, 8, 2, 2, 2, 16, 12};
    c.rank = 4, c.rope_dim = 2;
    MlaModel m = random_mla_model(c, 3);
    const std::vector<float> a = mla_naive(m, std::vector<int>{1, 5, 7, 2, 9}, MlaForm::absorbed);
    const mla_ref::Logits want = mla_ref::mla_reference64(m, std::vector<int>{1, 5, 7, 2, 9}, MlaForm::absorbed);
    // Swap the two heads' blocks of W_UK^T in every layer: the planted absorption bug.
    const std::size_t block = std::size_t(c.head_size()) * c.rank;
    for (int l = 0; l < c.base.n_layers; l++)
        std::swap_ranges(m.wuk_t.begin() + std::ptrdiff_t(2 * l * block),
                         m.wuk_t.begin() + std::ptrdiff_t((2 * l + 1) * block),
                         m.wuk_t.begin() + std::ptrdiff_t((2 * l + 1) * block));
    const std::vector<float> b = mla_naive(m, std::vector<int>{1, 5, 7, 2, 9}, MlaForm::absorbed);
    // Were b right, a and b would be within twice a's bound; b is thousands of times past it.
    std::vector<double> b64(b.begin(), b.end()), both(b.size());  // [vocab_size] each
    for (std::size_t i = 0; i < b.size(); i++) both[i] = 2 * want.bound[i];
    CHECK(bound_used(a, want) <= kSafety);
    CHECK(bound_used(a, b64, both) > 1000 * kSafety);
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

// The share of the derived bound that |full - cut| uses, over the logits of `form`. The bound:
// full's W_UK, W_UV have exactly zero rows past their rank k (truncate_rank keeps the zeros: Jacobi
// skips zero off-diagonals), so the top k singular vectors U_k of [W_UK | W_UV] span their row
// space, and cut's latent weights are float roundings of W_DKV U_k, U_k^T W_UK, U_k^T W_UV whose
// real products x W_DKV U_k U_k^T W_UK = x W_DKV W_UK (and W_UV's). So, with L the real logits of
// full and L' those of cut's float weights,
//   |full - cut| <= |full - L| + |L - L'| + |L' - cut|,
// the first the reference's bound for full, the other two (to first order) its bound for cut with
// each latent weight a rounding of its own (rho = u |w|, mla_reference64's rounded_latent). Left
// out, as in kSafety: second-order terms and U_k's double rounding (orthonormal within ~1e-15).
// Over 200 seeds x 100 cases, both forms, a cut to k used at most 0.26 of it (median 0.003); one latent weight
// off by a relative 1e-3 uses 10-30 times it, a cut below k thousands of times (the counter-tests).
double cut_bound_used(const MlaModel& full, const MlaModel& cut, std::span<const int> tokens, MlaForm form) {
    const std::vector<float> a = mla_naive(full, tokens, form), b = mla_naive(cut, tokens, form);
    const mla_ref::Logits ra = mla_ref::mla_reference64(full, tokens, form),
                          rb = mla_ref::mla_reference64(cut, tokens, form, false, /*rounded_latent=*/true);
    std::vector<double> b64(b.begin(), b.end()), both(b.size());  // [vocab_size] each
    for (std::size_t i = 0; i < b.size(); i++) both[i] = ra.bound[i] + rb.bound[i];
    return bound_used(a, b64, both);
}

// A drawn model whose latent has rank k (low_rank_model), its cut to k (or, below, to a drawn rank
// under k) and a prompt.
struct Cut {
    MlaModel full, cut;
    std::vector<int> tokens;
};

Cut draw_cut(bool below) {
    const MlaConfig c = draw_mla_config();
    if (below) RC_PRE(c.rank >= 2);
    const int k = draw(below ? 2 : 1, c.rank);
    Cut x{low_rank_model(c, k, *rc::gen::arbitrary<std::uint64_t>()), {}, {}};
    x.cut = truncate_rank(x.full, below ? draw(1, k - 1) : k);
    x.tokens = draw_tokens(c.base, draw(1, c.base.max_seq));
    return x;
}
}  // namespace

TEST_CASE("mla: cutting the latent to the rank its up-projections have keeps the logits within rounding", "[mla]") {
    rc::prop("random MLA shapes, [W_UK | W_UV] of rank k <= rank, cut to k", [] {
        const Cut x = draw_cut(false);
        for (MlaForm form : {MlaForm::rebuild, MlaForm::absorbed})
            RC_ASSERT(cut_bound_used(x.full, x.cut, x.tokens, form) <= kSafety);
    });
}

TEST_CASE("mla counter-test: cutting below that rank moves the logits past rounding", "[mla][counter]") {
    MlaConfig c;
    c.base = Config{16, 16, 2, 2, 2, 32, 12};
    c.rank = 8, c.rope_dim = 2;
    const MlaModel full = low_rank_model(c, 6, 5);
    const std::vector<int> tokens{1, 5, 7, 2, 9, 30, 4};
    for (MlaForm form : {MlaForm::rebuild, MlaForm::absorbed}) {
        CHECK(cut_bound_used(full, truncate_rank(full, 6), tokens, form) <= kSafety);
        CHECK(cut_bound_used(full, truncate_rank(full, 5), tokens, form) > 1000 * kSafety);
        CHECK(cut_bound_used(full, truncate_rank(full, 3), tokens, form) > 1000 * kSafety);
    }
    CHECK_THROWS_WITH(truncate_rank(full, 9), "mla: a rank of 9 is outside 1..8, the model's");
    // Drawn: a cut below k is caught in some case.
    test::expect_failure(
        [] {
            const Cut x = draw_cut(true);
            if (cut_bound_used(x.full, x.cut, x.tokens, MlaForm::rebuild) > kSafety) fail("past the derived bound");
        },
        "past the derived bound");
}

TEST_CASE("mla counter-test: one latent weight of the cut off by a relative 1e-3 is past the derived bound",
          "[mla][counter]") {
    // The bound is not vacuous: a real error a thousandth of one weight, far below the logits'
    // size, is caught.
    test::expect_failure(
        [] {
            Cut x = draw_cut(false);
            float& w = x.cut.wuv[std::size_t(draw(0, int(x.cut.wuv.size()) - 1))];
            w *= 1.001f;
            for (MlaForm form : {MlaForm::rebuild, MlaForm::absorbed})
                if (cut_bound_used(x.full, x.cut, x.tokens, form) > kSafety) fail("past the derived bound");
        },
        "past the derived bound");
}

TEST_CASE("mla: both forms are the formulas of core/mla.h within float rounding of a double reference", "[mla]") {
    rc::prop("random MLA shapes and prompts", [] {
        const MlaConfig c = draw_mla_config();
        const MlaModel m = random_mla_model(c, *rc::gen::arbitrary<std::uint64_t>());
        const std::vector<int> tokens = draw_tokens(c.base, draw(1, c.base.max_seq));
        for (MlaForm form : {MlaForm::rebuild, MlaForm::absorbed})
            RC_ASSERT(bound_used(mla_naive(m, tokens, form), mla_ref::mla_reference64(m, tokens, form)) <= kSafety);
    });
}

TEST_CASE("mla counter-test: a reference that scales scores by sqrt(head_size) alone is told apart", "[mla][counter]") {
    test::expect_failure(
        [] {
            const MlaConfig c = draw_mla_config();
            const MlaModel m = random_mla_model(c, *rc::gen::arbitrary<std::uint64_t>());
            const std::vector<int> tokens = draw_tokens(c.base, draw(1, c.base.max_seq));
            if (bound_used(mla_naive(m, tokens, MlaForm::rebuild),
                           mla_ref::mla_reference64(m, tokens, MlaForm::rebuild, true)) > kSafety)
                fail("the planted scale differs");
        },
        "the planted scale differs");
}
