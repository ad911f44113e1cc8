#include "cost_model.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <numeric>
#include <vector>

#include "cpu_backend.h"
#include "kernels.h"
#include "model.h"

namespace kvlab {

namespace {

// FLOPs of one layer's products, and of the small kernels, for `rows` query rows (decode.cpp's
// attention_inputs and attention_output_and_ffn, as kernels.cpp counts them).
std::uint64_t layer_product_flops(const Config& c, std::uint64_t rows) {
    const std::uint64_t dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim;
    return 2 * rows * (2 * dim * dim + 2 * dim * kv + 3 * dim * hidden);
}
std::uint64_t layer_other_flops(const Config& c, std::uint64_t rows) {
    const std::uint64_t dim = c.dim, hidden = c.hidden_dim, pairs = c.head_size() / 2;
    return 2 * rows * (5 * dim + 4)                                      // two rmsnorms
           + 6 * rows * std::uint64_t(c.n_heads + c.n_kv_heads) * pairs  // RoPE on q and k
           + 2 * rows * dim                                              // two residual adds
           + 5 * rows * hidden;                                          // silu_mul
}

StepCost step_cost(const Config& c, int rows, std::uint64_t attention_per_layer) {
    StepCost s;
    s.rows = rows;
    const std::uint64_t L = c.n_layers;
    s.product_flops = L * layer_product_flops(c, std::uint64_t(rows));
    s.classifier_flops = 2ull * c.dim * c.vocab_size;                                  // the last row's logits
    s.other_flops = L * layer_other_flops(c, std::uint64_t(rows)) + 5ull * c.dim + 4;  // the final rmsnorm, one row
    s.attention_flops = L * attention_per_layer;
    s.classifier_bytes = 4.0 * double(PackedMatrix::floats(c.dim, c.vocab_size));
    s.weight_bytes = panel_bytes(c) - s.classifier_bytes;
    return s;
}

template <class F>
double fastest_seconds(int reps, F&& run) {
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        const auto t0 = std::chrono::steady_clock::now();
        run();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
}

}  // namespace

double panel_bytes(const Config& c) {
    const std::int64_t dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim;
    const std::int64_t per_layer =
        2 * PackedMatrix::floats(int(dim), int(dim)) + 2 * PackedMatrix::floats(int(dim), int(kv)) +
        2 * PackedMatrix::floats(int(dim), int(hidden)) + PackedMatrix::floats(int(hidden), int(dim));
    return 4.0 * double(c.n_layers * per_layer + PackedMatrix::floats(int(dim), c.vocab_size));
}

StepCost cached_step_cost(const Config& c, int T, std::int64_t kv_row_bytes, const AttentionSpec& a) {
    const int hs = c.head_size();
    const std::uint64_t per_head = a.tiled() ? tiled_attention_flops(hs, T, a.tile) : attention_row_flops(hs, T);
    StepCost s = step_cost(c, 1, std::uint64_t(c.n_heads) * per_head);
    const double rows_per_position = double(c.n_layers) * c.n_kv_heads * 2;  // K and V, every layer and KV head
    s.kv_read_bytes = rows_per_position * T * double(kv_row_bytes);
    s.kv_write_bytes = rows_per_position * double(kv_row_bytes);
    return s;
}

StepCost naive_step_cost(const Config& c, int T, const AttentionSpec& a) {
    return step_cost(c, T, causal_attention_flops(c.n_heads, c.head_size(), T, a));
}

int kv_passes_weights_T(const Config& c, std::int64_t kv_row_bytes) {
    const double per_position = double(c.n_layers) * c.n_kv_heads * 2 * double(kv_row_bytes);
    const double T = std::floor(panel_bytes(c) / per_position) + 1;
    return T > double(1 << 30) ? 0 : int(T);
}

double predicted_seconds(const StepCost& s, const MachineRates& m) {
    auto roofline = [](double bytes, double bytes_per_s, double flops, double flops_per_s) {
        return std::max(bytes / bytes_per_s, flops / flops_per_s);
    };
    return roofline(s.weight_bytes, m.stream_bytes_per_s, double(s.product_flops), m.product_flops_per_s) +
           roofline(s.classifier_bytes, m.stream_bytes_per_s, double(s.classifier_flops), m.product_flops_per_s) +
           roofline(s.kv_read_bytes + s.kv_write_bytes, m.kv_bytes_per_s, double(s.attention_flops),
                    m.attention_flops_per_s) +
           double(s.other_flops) / m.other_flops_per_s;
}

namespace {

// The model's own panels (the CPU backend packs or maps them): a decode step's products, one row,
// stream them from wherever they fit; 64 rows of its w1 are bound by arithmetic.
void probe_products(const Model& model, Exec& ex, MachineRates& m) {
    const Config& shape = model.config();
    const CpuBackend model_backend(model);
    const PackedWeights& p = *model.cpu_panels;
    {
        std::vector<float> x(std::size_t(std::max(shape.dim, shape.hidden_dim)), 1.0f);  // [max(dim, hidden_dim)]
        std::vector<float> y(std::size_t(std::max({shape.dim, shape.hidden_dim, shape.vocab_size})), 0.0f);
        auto products = [&] {
            for (const PackedWeights::Layer& l : p.layers)
                for (const PackedMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3})
                    matmul_packed(ex, y.data(), w->n_out, x.data(), w->n_in, *w, 1);
            matmul_packed(ex, y.data(), p.wcls.n_out, x.data(), p.wcls.n_in, p.wcls, 1);
        };
        m.stream_bytes_per_s = panel_bytes(shape) / fastest_seconds(4, products);
    }
    const int rows = 64;
    const PackedMatrix& w = p.layers[0].w1;
    std::vector<float> x(std::size_t(rows) * w.n_in, 1.0f),
        y(std::size_t(rows) * w.n_out, 0.0f);  // [rows, in], [rows, out]
    const std::uint64_t f0 = ex.flops;
    matmul_packed(ex, y.data(), w.n_out, x.data(), w.n_in, w, rows);
    const double flops = double(ex.flops - f0);
    m.product_flops_per_s =
        flops / fastest_seconds(4, [&] { matmul_packed(ex, y.data(), w.n_out, x.data(), w.n_in, w, rows); });
}

// Attention on a one-layer model of the shape's heads: one row over 128 MB of fp32 K and V
// (head-major, far past any cache) for the KV stream rate; naive attention over 512 rows, which
// stay in cache, for its arithmetic rate.
void probe_attention(const Config& shape, Exec& ex, MachineRates& m) {
    Config c = shape;
    c.n_layers = 1, c.hidden_dim = 1, c.vocab_size = 1, c.max_seq = std::min(shape.max_seq, 1024);
    const Model heads = random_model(c, 1);
    CpuBackend backend(heads);
    const int hs = c.head_size(), kv_dim = c.kv_dim();
    std::vector<int> kv_head(std::size_t(c.n_heads));  // [n_heads]
    for (int h = 0; h < c.n_heads; h++) kv_head[std::size_t(h)] = h / c.group();
    {
        const int T = int((std::int64_t{128} << 20) / 2 / 4 / kv_dim);
        std::vector<float> k(std::size_t(T) * kv_dim, 0.25f), v(k.size(), 0.5f);        // [n_kv_heads, T, head_size]
        std::vector<float> q(std::size_t(c.dim), 0.1f), att(std::size_t(c.dim), 0.0f);  // [dim]
        std::vector<std::int64_t> slots(std::size_t(T), 0);                             // [T]
        std::iota(slots.begin(), slots.end(), std::int64_t{0});
        RowKV r;
        r.k = k.data(), r.v = v.data();
        r.layer_rows = std::int64_t(c.n_kv_heads) * T, r.head_rows = T;
        r.row_bytes = 4 * std::int64_t(hs), r.n = T, r.format = int(KVFormat::fp32);
        const double s = fastest_seconds(3, [&] {
            backend.attention(ex, att.data(), q.data(), &r, 1, 0, slots.data(), T, kv_head.data(), -1, nullptr);
        });
        m.kv_bytes_per_s = 8.0 * double(T) * kv_dim / s;
    }
    const int T = 512;
    std::vector<float> q(std::size_t(T) * c.dim, 0.1f), att(q.size(), 0.0f);  // [T, dim]
    std::vector<float> k(std::size_t(T) * kv_dim, 0.25f), v(k.size(), 0.5f);  // [T, kv_dim]
    auto run = [&] { backend.causal_attention(ex, att.data(), q.data(), k.data(), v.data(), T, kv_head.data()); };
    const std::uint64_t f0 = ex.flops;
    run();
    m.attention_flops_per_s = double(ex.flops - f0) / fastest_seconds(3, run);
}

// A layer's small kernels over 64 rows in cache: their mixed rate.
void probe_small_kernels(const Config& shape, Exec& ex, MachineRates& m) {
    const int rows = 64, dim = shape.dim, hidden = shape.hidden_dim, hs = shape.head_size();
    std::vector<float> x(std::size_t(rows) * dim, 0.5f), out(x.size(), 0.0f), w(std::size_t(dim), 1.0f);  // [rows, dim]
    std::vector<float> h1(std::size_t(rows) * hidden, 0.5f), h3(h1.size(), 0.25f);  // [rows, hidden_dim]
    std::vector<int> positions(std::size_t(rows), 0);                               // [rows]
    const RopeTable rope(1, hs);
    auto layer = [&] {
        rmsnorm(ex, out.data(), x.data(), w.data(), rows, dim);
        kvlab::rope(ex, out.data(), rows, shape.n_heads, hs, positions, rope);
        silu_mul(ex, h1.data(), h3.data(), std::int64_t(h1.size()));
        add(ex, x.data(), out.data(), std::int64_t(x.size()));
    };
    const std::uint64_t f0 = ex.flops;
    layer();
    m.other_flops_per_s = double(ex.flops - f0) / fastest_seconds(5, layer);
}

}  // namespace

MachineRates probe_machine(const Model& model, int n_threads, const AttentionSpec& attention) {
    const auto t0 = std::chrono::steady_clock::now();
    MachineRates m;
    m.n_threads = n_threads;
    Exec ex;
    ex.n_threads = n_threads;
    ex.attention = attention;
    probe_products(model, ex, m);
    probe_attention(model.config(), ex, m);
    probe_small_kernels(model.config(), ex, m);
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return m;
}

}  // namespace kvlab
