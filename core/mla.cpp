#include "mla.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>

#include "numerics.h"

namespace kvlab {

void MlaConfig::validate() const {
    Config c = base;
    c.n_kv_heads = c.n_heads;  // MLA has no KV heads of its own: every head reads the latent
    c.validate();
    if (rank < 1) throw Error(fmt::format("mla: rank must be >= 1, not {}", rank));
    if (rope_dim < 0 || rope_dim % 2 != 0)
        throw Error(fmt::format("mla: rope_dim must be even and >= 0 (pairs are rotated), not {}", rope_dim));
    // Every float random_mla_model draws: per layer W_Q, W_QR, W_DKV, W_KR, W_UK, W_UV and its
    // transposed copy, W_O, the FFN and two norms; then the embedding, its classifier and a norm.
    const std::int64_t dim = c.dim, wide = std::int64_t(c.n_heads) * c.head_size(), r = rank, dr = rope_dim;
    const std::int64_t per_layer = dim * wide + dim * c.n_heads * dr + dim * r + dim * dr + 3 * r * wide + wide * dim +
                                   3 * dim * c.hidden_dim + 2 * dim;
    check_size("an MLA model", per_layer * c.n_layers + 2 * std::int64_t(c.vocab_size) * dim + dim, 4);
    check_size("an MLA cache", std::int64_t(c.n_layers) * c.max_seq * (std::int64_t(rank) + rope_dim), 4);
}

std::string MlaConfig::describe() const {
    Config c = base;
    c.n_kv_heads = c.n_heads;
    return fmt::format("{} rank={} rope_dim={}", c.describe(), rank, rope_dim);
}

namespace {
// The absorbed form's query product: W_UK_h [rank, head_size] transposed, per layer and head.
void absorb(MlaModel& m) {
    const std::size_t L = std::size_t(m.config.base.n_layers), H = std::size_t(m.config.base.n_heads);
    const std::size_t hs = std::size_t(m.config.head_size()), r = std::size_t(m.config.rank);
    m.wuk_t.resize(L * H * hs * r);
    for (std::size_t l = 0; l < L; l++)
        for (std::size_t h = 0; h < H; h++)
            for (std::size_t d = 0; d < hs; d++)
                for (std::size_t j = 0; j < r; j++)
                    m.wuk_t[((l * H + h) * hs + d) * r + j] = m.wuk[(l * r + j) * H * hs + h * hs + d];
}
}  // namespace

std::string_view to_string(MlaForm form) { return form == MlaForm::rebuild ? "rebuild" : "absorbed"; }

MlaModel random_mla_model(const MlaConfig& config, std::uint64_t seed) {
    config.validate();
    const Config& c = config.base;
    MlaModel m;
    m.config = config;
    SplitMix64 rng(seed);
    const std::size_t L = std::size_t(c.n_layers), dim = std::size_t(c.dim), H = std::size_t(c.n_heads);
    const std::size_t hs = std::size_t(c.head_size()), dr = std::size_t(config.rope_dim), r = std::size_t(config.rank);
    auto fill = [&rng](std::vector<float>& t, std::size_t n, double fan_in) {
        t.resize(n);
        for (float& x : t) x = float(rng.gaussian() / std::sqrt(fan_in));
    };
    auto norm = [&rng](std::vector<float>& t, std::size_t n) {
        t.resize(n);
        for (float& x : t) x = float(1.0 + 0.1 * rng.gaussian());
    };
    fill(m.token_embedding, std::size_t(c.vocab_size) * dim, double(dim));
    norm(m.rms_att, L * dim);
    fill(m.wq, L * dim * H * hs, double(dim));
    fill(m.wqr, L * dim * H * dr, double(dim));
    fill(m.wdkv, L * dim * r, double(dim));
    fill(m.wkr, L * dim * dr, double(dim));
    fill(m.wuk, L * r * H * hs, double(r));
    fill(m.wuv, L * r * H * hs, double(r));
    fill(m.wo, L * H * hs * dim, double(H * hs));
    norm(m.rms_ffn, L * dim);
    fill(m.w1, L * dim * std::size_t(c.hidden_dim), double(dim));
    fill(m.w2, L * std::size_t(c.hidden_dim) * dim, double(c.hidden_dim));
    fill(m.w3, L * dim * std::size_t(c.hidden_dim), double(dim));
    norm(m.rms_final, dim);
    absorb(m);
    m.wcls.resize(dim * std::size_t(c.vocab_size));
    for (std::size_t v = 0; v < std::size_t(c.vocab_size); v++)
        for (std::size_t d = 0; d < dim; d++)
            m.wcls[d * std::size_t(c.vocab_size) + v] = m.token_embedding[v * dim + d];
    m.rope = RopeTable(c.max_seq, config.rope_dim);
    return m;
}

namespace {

// The eigenvectors of the symmetric n x n matrix a (row-major, destroyed), as the columns of the
// returned matrix, by decreasing eigenvalue: cyclic Jacobi rotations until the off-diagonal is
// negligible.
std::vector<double> eigenvectors(std::vector<double>& a, int n) {
    std::vector<double> v(std::size_t(n) * n, 0.0);  // [n, n]
    for (int i = 0; i < n; i++) v[std::size_t(i) * n + i] = 1.0;
    auto at = [n](std::vector<double>& m, int i, int j) -> double& { return m[std::size_t(i) * n + j]; };
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0, diag = 0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) (i == j ? diag : off) += at(a, i, j) * at(a, i, j);
        if (off <= 1e-30 * (diag + 1e-300)) break;
        for (int p = 0; p < n; p++)
            for (int q = p + 1; q < n; q++) {
                if (at(a, p, q) == 0.0) continue;
                const double theta = (at(a, q, q) - at(a, p, p)) / (2 * at(a, p, q));
                const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
                const double c = 1 / std::sqrt(t * t + 1), s = t * c;
                for (int k = 0; k < n; k++) {  // a = J^T a J, v = v J
                    const double akp = at(a, k, p), akq = at(a, k, q);
                    at(a, k, p) = c * akp - s * akq, at(a, k, q) = s * akp + c * akq;
                }
                for (int k = 0; k < n; k++) {
                    const double apk = at(a, p, k), aqk = at(a, q, k);
                    at(a, p, k) = c * apk - s * aqk, at(a, q, k) = s * apk + c * aqk;
                }
                for (int k = 0; k < n; k++) {
                    const double vkp = at(v, k, p), vkq = at(v, k, q);
                    at(v, k, p) = c * vkp - s * vkq, at(v, k, q) = s * vkp + c * vkq;
                }
            }
    }
    std::vector<int> order(static_cast<std::size_t>(n));
    for (int i = 0; i < n; i++) order[std::size_t(i)] = i;
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return at(a, x, x) > at(a, y, y); });
    std::vector<double> sorted(v.size());
    for (int i = 0; i < n; i++)
        for (int k = 0; k < n; k++) sorted[std::size_t(k) * n + i] = v[std::size_t(k) * n + order[std::size_t(i)]];
    return sorted;
}

}  // namespace

MlaModel truncate_rank(const MlaModel& model, int r) {
    const MlaConfig& mc = model.config;
    const int R = mc.rank, L = mc.base.n_layers, dim = mc.base.dim, wide = mc.base.n_heads * mc.head_size();
    if (r < 1 || r > R) throw Error(fmt::format("mla: a rank of {} is outside 1..{}, the model's", r, R));
    MlaModel m = model;
    m.config.rank = r;
    m.wdkv.assign(std::size_t(L) * dim * r, 0.0f), m.wuk.assign(std::size_t(L) * r * wide, 0.0f);
    m.wuv.assign(m.wuk.size(), 0.0f);
    for (int l = 0; l < L; l++) {
        const float* uk = model.wuk.data() + std::size_t(l) * R * wide;  // [R, wide]
        const float* uv = model.wuv.data() + std::size_t(l) * R * wide;
        std::vector<double> gram(std::size_t(R) * R, 0.0);  // [R, R] = [W_UK | W_UV] [W_UK | W_UV]^T
        for (int i = 0; i < R; i++)
            for (int j = 0; j < R; j++)
                for (int o = 0; o < wide; o++)
                    gram[std::size_t(i) * R + j] +=
                        double(uk[i * wide + o]) * uk[j * wide + o] + double(uv[i * wide + o]) * uv[j * wide + o];
        const std::vector<double> u = eigenvectors(gram, R);  // [R, R], columns by decreasing eigenvalue
        for (int k = 0; k < dim; k++)
            for (int j = 0; j < r; j++) {
                double s = 0;
                for (int i = 0; i < R; i++)
                    s += double(model.wdkv[(std::size_t(l) * dim + k) * R + i]) * u[std::size_t(i) * R + j];
                m.wdkv[(std::size_t(l) * dim + k) * r + j] = float(s);
            }
        for (int j = 0; j < r; j++)
            for (int o = 0; o < wide; o++) {
                double sk = 0, sv = 0;
                for (int i = 0; i < R; i++)
                    sk += u[std::size_t(i) * R + j] * uk[i * wide + o],
                        sv += u[std::size_t(i) * R + j] * uv[i * wide + o];
                m.wuk[(std::size_t(l) * r + j) * wide + o] = float(sk),
                                                        m.wuv[(std::size_t(l) * r + j) * wide + o] = float(sv);
            }
    }
    absorb(m);
    return m;
}

MlaCache::MlaCache(const MlaConfig& config) : config_(config) {
    config_.validate();
    rows_.assign(std::size_t(config_.base.n_layers) * stride(), kNaN);
    assert(rows_.size() == std::size_t(config_.base.n_layers) * config_.base.max_seq * std::size_t(config_.row()));
}

void MlaCache::truncate(int n) {
    if (n < 0 || n > length_) throw Error(fmt::format("mla cache: cannot roll back to {} (length is {})", n, length_));
    for (int l = 0; l < config_.base.n_layers; l++)
        std::fill(layer(l) + std::size_t(n) * config_.row(), layer(l) + std::size_t(length_) * config_.row(), kNaN);
    length_ = n;
}

std::int64_t MlaCache::used_bytes() const {
    return std::int64_t(sizeof(float)) * config_.base.n_layers * length_ * config_.row();
}

std::int64_t MlaCache::allocated_bytes() const { return std::int64_t(sizeof(float)) * std::int64_t(rows_.size()); }

namespace {

// A step's working rows; sized for `rows` rows over `n_keys` keys.
struct Scratch {
    std::vector<float> x, xb, xo, qc, qr, kr, att, h1, h3;  // [rows, *]
    std::vector<float> kc, v, kfull;                        // rebuild: [n_keys, n_heads, *]
    std::vector<float> q, scores, olat;                     // one head's query, weights, latent sum
};

// Head h's attention for query row i (at position pos) over positions 0..pos, in `form`; lat:
// layer l's cached rows [c ; k_R] (row() floats each); out: head_size floats.
void mla_head(const MlaModel& m, MlaForm form, int l, int h, const float* qc, const float* qr, int pos,
              const float* lat, float* out, Scratch& s, Exec& ex) {
    const MlaConfig& mc = m.config;
    const int H = mc.base.n_heads, hs = mc.head_size(), dr = mc.rope_dim, r = mc.rank, n = pos + 1;
    const float scale = attention_scale(hs + dr);  // the head's, whatever width the keys have
    s.scores.resize(std::size_t(n));
    if (form == MlaForm::rebuild) {
        s.q.assign(qc, qc + hs);  // [q_C,h ; q_R,h]: head_size + rope_dim
        s.q.insert(s.q.end(), qr, qr + dr);
        const std::size_t kw = std::size_t(hs + dr);
        score_rows_scaled(s.scores.data(), s.q.data(), hs + dr, scale, 0, n,
                          [&](int t) { return s.kfull.data() + (std::size_t(t) * H + h) * kw; });
        softmax(s.scores.data(), n);
        sum_values(out, s.scores.data(), hs, 0, n,
                   [&](int t) { return s.v.data() + (std::size_t(t) * H + h) * std::size_t(hs); });
        return;
    }
    // Absorbed: q~ = q_C,h W_UK_h^T (rank floats), then [q~ ; q_R,h] against the cached rows.
    s.q.resize(std::size_t(r + dr));
    matmul(ex, s.q.data(), r, qc, hs, m.wuk_t.data() + (std::size_t(l) * H + h) * hs * r, r, 1, hs, r);
    std::copy(qr, qr + dr, s.q.begin() + r);
    const std::size_t row = std::size_t(mc.row());
    score_rows_scaled(s.scores.data(), s.q.data(), r + dr, scale, 0, n, [&](int t) { return lat + t * row; });
    softmax(s.scores.data(), n);
    s.olat.resize(std::size_t(r));  // [rank]: the weighted sum of latents
    sum_values(s.olat.data(), s.scores.data(), r, 0, n, [&](int t) { return lat + t * row; });
    // out = olat W_UV_h: head h's columns of W_UV [rank, n_heads * head_size].
    matmul(ex, out, hs, s.olat.data(), r, m.wuv.data() + std::size_t(l) * r * H * hs + std::size_t(h) * hs, H * hs, 1,
           r, hs);
}

// Layer l's attention for `rows` rows at positions first..first+rows-1; att: [rows, n_heads * head_size].
void mla_attention(const MlaModel& m, MlaForm form, int l, int first, int rows, const float* lat, Scratch& s,
                   Exec& ex) {
    const MlaConfig& mc = m.config;
    const int H = mc.base.n_heads, hs = mc.head_size(), dr = mc.rope_dim, r = mc.rank, n_keys = first + rows;
    if (form == MlaForm::rebuild) {
        // Every attended position's K_C and V, rebuilt from its latent: [n_keys, n_heads, head_size].
        const std::size_t wide = std::size_t(H) * hs, kw = std::size_t(hs + dr);
        s.kc.resize(std::size_t(n_keys) * wide), s.v.resize(s.kc.size());
        matmul(ex, s.kc.data(), int(wide), lat, mc.row(), m.wuk.data() + std::size_t(l) * r * wide, int(wide), n_keys,
               r, int(wide));
        matmul(ex, s.v.data(), int(wide), lat, mc.row(), m.wuv.data() + std::size_t(l) * r * wide, int(wide), n_keys, r,
               int(wide));
        s.kfull.resize(std::size_t(n_keys) * H * kw);  // [n_keys, n_heads, head_size + rope_dim]
        for (int t = 0; t < n_keys; t++)
            for (int h = 0; h < H; h++) {
                float* k = s.kfull.data() + (std::size_t(t) * H + h) * kw;
                std::copy_n(s.kc.data() + std::size_t(t) * wide + std::size_t(h) * hs, hs, k);
                std::copy_n(lat + std::size_t(t) * mc.row() + r, dr, k + hs);
            }
    }
    s.att.resize(std::size_t(rows) * H * hs);
    for (int i = 0; i < rows; i++)
        for (int h = 0; h < H; h++)
            mla_head(m, form, l, h, s.qc.data() + (std::size_t(i) * H + h) * hs,
                     s.qr.data() + (std::size_t(i) * H + h) * dr, first + i, lat,
                     s.att.data() + (std::size_t(i) * H + h) * hs, s, ex);
}

// Layer l over the rows in s.x [rows, dim]; their latents go to lat (layer l's rows).
void mla_layer(const MlaModel& m, MlaForm form, int l, int first, int rows, float* lat, Scratch& s, Exec& ex) {
    const MlaConfig& mc = m.config;
    const Config& c = mc.base;
    const int dim = c.dim, H = c.n_heads, hs = mc.head_size(), dr = mc.rope_dim, r = mc.rank, hid = c.hidden_dim;
    std::vector<int> positions(static_cast<std::size_t>(rows));
    for (int i = 0; i < rows; i++) positions[std::size_t(i)] = first + i;
    const std::size_t n = std::size_t(rows);
    s.xb.resize(n * dim), s.qc.resize(n * H * hs), s.qr.resize(n * H * dr), s.kr.resize(n * dr);
    rmsnorm(ex, s.xb.data(), s.x.data(), m.rms_att.data() + std::size_t(l) * dim, rows, dim);
    matmul(ex, s.qc.data(), H * hs, s.xb.data(), dim, m.wq.data() + std::size_t(l) * dim * H * hs, H * hs, rows, dim,
           H * hs);
    matmul(ex, s.qr.data(), H * dr, s.xb.data(), dim, m.wqr.data() + std::size_t(l) * dim * H * dr, H * dr, rows, dim,
           H * dr);
    rope(ex, s.qr.data(), rows, H, dr, positions, m.rope);
    // The cached row of each new position: c = x W_DKV, then k_R = rope(x W_KR).
    float* row0 = lat + std::size_t(first) * mc.row();
    matmul(ex, row0, mc.row(), s.xb.data(), dim, m.wdkv.data() + std::size_t(l) * dim * r, r, rows, dim, r);
    matmul(ex, s.kr.data(), dr, s.xb.data(), dim, m.wkr.data() + std::size_t(l) * dim * dr, dr, rows, dim, dr);
    rope(ex, s.kr.data(), rows, 1, dr, positions, m.rope);
    for (int i = 0; i < rows; i++)
        std::copy_n(s.kr.data() + std::size_t(i) * dr, dr, row0 + std::size_t(i) * mc.row() + r);
    mla_attention(m, form, l, first, rows, lat, s, ex);
    s.xo.resize(n * dim);
    matmul(ex, s.xo.data(), dim, s.att.data(), H * hs, m.wo.data() + std::size_t(l) * H * hs * dim, dim, rows, H * hs,
           dim);
    add(ex, s.x.data(), s.xo.data(), std::int64_t(n) * dim);
    rmsnorm(ex, s.xb.data(), s.x.data(), m.rms_ffn.data() + std::size_t(l) * dim, rows, dim);
    s.h1.resize(n * hid), s.h3.resize(n * hid);
    matmul(ex, s.h1.data(), hid, s.xb.data(), dim, m.w1.data() + std::size_t(l) * dim * hid, hid, rows, dim, hid);
    matmul(ex, s.h3.data(), hid, s.xb.data(), dim, m.w3.data() + std::size_t(l) * dim * hid, hid, rows, dim, hid);
    silu_mul(ex, s.h1.data(), s.h3.data(), std::int64_t(n) * hid);
    matmul(ex, s.xo.data(), dim, s.h1.data(), hid, m.w2.data() + std::size_t(l) * hid * dim, dim, rows, hid, dim);
    add(ex, s.x.data(), s.xo.data(), std::int64_t(n) * dim);
}

// tokens at positions first..; layer l's latents at layer(l) (positions 0..first-1 held, the new
// ones written). logits: the last row's [vocab_size].
template <class Layer>
void mla_rows(const MlaModel& m, MlaForm form, std::span<const int> tokens, int first, Layer layer,
              std::vector<float>& logits) {
    const Config& c = m.config.base;
    const int rows = int(tokens.size()), dim = c.dim;
    for (int t : tokens)
        if (t < 0 || t >= c.vocab_size) throw Error(fmt::format("mla: token {} is outside [0, {})", t, c.vocab_size));
    if (rows < 1 || first + rows > c.max_seq)
        throw Error(fmt::format("mla: {} positions from {} do not fit max_seq = {}", rows, first, c.max_seq));
    Scratch s;
    Exec ex;
    s.x.resize(std::size_t(rows) * dim);  // [rows, dim]
    for (int i = 0; i < rows; i++)
        std::copy_n(m.token_embedding.data() + std::size_t(tokens[std::size_t(i)]) * dim, dim,
                    s.x.data() + std::size_t(i) * dim);
    for (int l = 0; l < c.n_layers; l++) mla_layer(m, form, l, first, rows, layer(l), s, ex);
    std::vector<float> last(static_cast<std::size_t>(dim));  // [dim]: the last row, normed
    rmsnorm(ex, last.data(), s.x.data() + std::size_t(rows - 1) * dim, m.rms_final.data(), 1, dim);
    logits.resize(std::size_t(c.vocab_size));
    matmul(ex, logits.data(), c.vocab_size, last.data(), dim, m.wcls.data(), c.vocab_size, 1, dim, c.vocab_size);
}

}  // namespace

std::vector<float> mla_naive(const MlaModel& m, std::span<const int> tokens, MlaForm form) {
    const MlaConfig& mc = m.config;
    const std::size_t T = tokens.size(), row = std::size_t(mc.row());
    // Every position's latent, computed afresh: [n_layers, T, rank + rope_dim].
    std::vector<float> lat(std::size_t(mc.base.n_layers) * T * row, kNaN);
    std::vector<float> logits;
    mla_rows(
        m, form, tokens, 0, [&](int l) { return lat.data() + std::size_t(l) * T * row; }, logits);
    return logits;
}

MlaDecoder::MlaDecoder(const MlaModel& model, MlaCache& cache, MlaForm form)
    : model_(model), cache_(cache), form_(form) {
    if (!(cache.config().base == model.config.base) || cache.config().rank != model.config.rank ||
        cache.config().rope_dim != model.config.rope_dim)
        throw Error(fmt::format("mla: a cache of shape {} for a model of shape {}", cache.config().describe(),
                                model.config.describe()));
}

const std::vector<float>& MlaDecoder::prefill(std::span<const int> tokens) {
    const int first = cache_.length();
    mla_rows(
        model_, form_, tokens, first, [&](int l) { return cache_.layer(l); }, logits_);
    cache_.set_length(first + int(tokens.size()));
    return logits_;
}

}  // namespace kvlab
