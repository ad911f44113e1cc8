// Lab 12's grader: your tiled attention as the attention of both of kvlab's decoders on the CPU.
// It must be attention (against float64, any tile), and exact: naive decode (every row in one
// step of T rows), prefill then decode, and a chunked prefill on a paged cache give the same
// logits bit for bit, with tiles of 1 to 8 keys, so that rows span several tiles.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_backend.h"
#include "decode.h"
#include "forwarding.h"
#include "grader.h"
#include "lab.h"
#include "paged.h"

using namespace kvlab;

namespace {

// kvlab's CPU backend with your tiled_attention as both attentions (fp32 caches in host memory).
class YourAttention final : public ForwardingBackend {
public:
    YourAttention(Backend& inner, int tile) : ForwardingBackend(inner), tile_(tile) {}
    // Naive decode: row i of a step of T rows reads positions 0..i.
    void causal_attention(Exec&, float* att, const float* q, const float* k, const float* v, int T,
                          const int* kv_head) override {
        const Config& c = config();
        const int hs = c.head_size();
        for (int i = 0; i < T; i++)
            for (int h = 0; h < c.n_heads; h++) {
                gather(i + 1,
                       [&](int t, bool key) { return (key ? k : v) + std::int64_t(t) * c.kv_dim() + kv_head[h] * hs; });
                run(att + std::int64_t(i) * c.dim + h * hs, q + std::int64_t(i) * c.dim + h * hs, i + 1, T);
            }
    }
    // Cached decode: row i reads rows[i].n slots of its cache.
    void attention(Exec&, float* att, const float* q, const RowKV* rows, int n_rows, int l, const std::int64_t* slots,
                   int max_n, const int* kv_head, int, float*) override {
        const Config& c = config();
        const int hs = c.head_size();
        for (int i = 0; i < n_rows; i++)
            for (int h = 0; h < c.n_heads; h++) {
                const RowKV& r = rows[i];
                const std::int64_t* s = slots + std::int64_t(i) * max_n;
                gather(r.n, [&](int t, bool key) {
                    const std::int64_t row = r.row(l, kv_head[h], s[t]);
                    return static_cast<const float*>(key ? r.k_row(row) : r.v_row(row));
                });
                run(att + std::int64_t(i) * c.dim + h * hs, q + std::int64_t(i) * c.dim + h * hs, r.n, n_rows);
            }
    }

private:
    // k_, v_: [n, head_size] the rows of positions 0..n-1, contiguous, as your function takes them.
    template <class Row>
    void gather(int n, Row row) {
        const int hs = config().head_size();
        k_.resize(std::size_t(n) * hs), v_.resize(k_.size());
        for (int t = 0; t < n; t++) {
            std::memcpy(k_.data() + std::size_t(t) * hs, row(t, true), sizeof(float) * std::size_t(hs));
            std::memcpy(v_.data() + std::size_t(t) * hs, row(t, false), sizeof(float) * std::size_t(hs));
        }
    }
    void run(float* out, const float* q, int n, int rows) {
        lab12::tiled_attention(out, q, k_.data(), v_.data(), n, config().head_size(), tile_, rows);
    }
    int tile_;
    std::vector<float> k_, v_;
};

// Tiles of 1 to 8 keys, small ones most often: the tiny models' rows span several.
int draw_tile() { return draw(0, 1) == 0 ? draw(1, 3) : draw(1, 8); }

// 1. Attention, against float64: out within 1e-5 of the largest |v| (float sums of up to 64 terms).
void check_float64() {
    const int hs = draw(1, 16), n = draw(1, 64), tile = draw(0, 1) == 0 ? draw(1, 8) : draw(1, 70);
    const float range = draw(0, 1) == 0 ? 1.0f : 4.0f;
    auto floats = [&](int count) {
        std::vector<float> x(static_cast<std::size_t>(count));
        for (float& f : x) f = range * float(draw(-1000, 1000)) / 1000.0f;
        return x;
    };
    const std::vector<float> q = floats(hs), k = floats(n * hs), v = floats(n * hs);
    std::vector<float> out(static_cast<std::size_t>(hs), 0.0f);  // [head_size]
    const int rows = draw(1, 4);
    lessons::log_case(fmt::format("tiled_attention(n {}, head_size {}, tile {}, rows {}), values in [-{}, {}]", n, hs,
                                  tile, rows, range, range));
    lab12::tiled_attention(out.data(), q.data(), k.data(), v.data(), n, hs, tile, rows);
    std::vector<double> s(static_cast<std::size_t>(n));  // [n]
    double max = -1e300, sum = 0.0, v_max = 0.0;
    for (int t = 0; t < n; t++) {
        double x = 0.0;
        for (int d = 0; d < hs; d++) x += double(q[std::size_t(d)]) * k[std::size_t(t * hs + d)];
        s[std::size_t(t)] = x / std::sqrt(double(hs));
        max = std::max(max, s[std::size_t(t)]);
    }
    for (double& x : s) sum += (x = std::exp(x - max));
    for (float x : v) v_max = std::max(v_max, double(std::fabs(x)));
    for (int d = 0; d < hs; d++) {
        double want = 0.0;
        for (int t = 0; t < n; t++) want += s[std::size_t(t)] / sum * v[std::size_t(t * hs + d)];
        if (!(std::fabs(out[std::size_t(d)] - want) <= 1e-5 * v_max))
            fail(fmt::format("n = {} keys, tile {}, head_size {}: your out[{}] = {}, but float64 attention gives {}", n,
                             tile, hs, d, out[std::size_t(d)], want));
    }
}

// 2. Naive decode (every row in one step of T rows) against a prefill of P rows then one-row decode
// steps, both on your attention: the same logits, bit for bit, at every step.
void check_prefill_decode() {
    const Config c = draw_config(2);
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const std::vector<int> tokens = draw_tokens(c, draw(2, c.max_seq));
    const int prompt = draw(1, int(tokens.size()) - 1), tile = draw_tile();
    CpuBackend cpu(m);
    YourAttention yours(cpu, tile);
    NaiveDecoder naive(yours);
    ContiguousCache cache(c);
    CachedDecoder cached(yours, cache);
    const std::span<const int> all(tokens);
    for (int T = prompt; T <= int(tokens.size()); T++) {
        lessons::log_case(fmt::format(
            "{}, tile {}, {} tokens, prompt {}: {} at T = {}, then naive decode's step of {} rows", c.describe(), tile,
            tokens.size(), prompt, T == prompt ? "the prefill" : "a decode step", T, T));
        const std::vector<float> got =
            T == prompt ? cached.prefill(all.first(std::size_t(T))) : cached.decode(tokens[std::size_t(T - 1)]);
        const std::string diff = lessons::describe_difference(naive.forward(all.first(std::size_t(T))), got);
        if (!diff.empty())
            fail(
                fmt::format("{}, tile {}: at T = {} ({} after a prefill of {}), the logits of a step of {} row(s) "
                            "differ from naive decode's step of {} rows: {}",
                            c.describe(), tile, T, T == prompt ? "the prefill" : "a decode step", prompt,
                            T == prompt ? prompt : 1, T, diff));
    }
}

// 3. A prompt prefilled in chunks of any sizes on a paged cache (blocks of 1 to 4) against naive
// decode at the end of every chunk.
void check_chunks() {
    const Config c = draw_config(2);
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const std::vector<int> tokens = draw_tokens(c, draw(2, c.max_seq));
    const int tile = draw_tile(), bs = draw(1, std::min(4, c.max_seq));
    CpuBackend cpu(m);
    YourAttention yours(cpu, tile);
    NaiveDecoder naive(yours);
    BlockPool pool(c, bs, (c.max_seq + bs - 1) / bs);
    PagedCache cache(pool);
    CachedDecoder cached(yours, cache);
    const std::span<const int> all(tokens);
    std::string chunks;
    for (int at = 0; at < int(tokens.size());) {
        const int n = draw(1, int(tokens.size()) - at);
        chunks += fmt::format(" {}", n);
        lessons::log_case(fmt::format(
            "{}, tile {}, blocks of {}, {} tokens: chunks of{}, the last at {}..{}; then naive decode of {} rows",
            c.describe(), tile, bs, tokens.size(), chunks, at, at + n - 1, at + n));
        const std::vector<float> got = cached.prefill(all.subspan(std::size_t(at), std::size_t(n)));
        at += n;
        const std::string diff = lessons::describe_difference(naive.forward(all.first(std::size_t(at))), got);
        if (!diff.empty())
            fail(
                fmt::format("{}, tile {}, blocks of {}: after chunks of{} (T = {}), the logits differ from naive "
                            "decode's: {}",
                            c.describe(), tile, bs, chunks, at, diff));
    }
}

}  // namespace

int main(int argc, char** argv) {
    lessons::Lab lab{12, "tiled attention, exact", LAB_SOURCE, {}};
    lab.checks = {
        {"your tiled attention is attention (float64, any tile)", 3, check_float64},
        {"a row decoded == the same row in naive decode's step, bitwise", 4, check_prefill_decode},
        {"a chunked prefill on a paged cache == naive decode, bitwise", 3, check_chunks},
    };
    return lessons::grade(lab, argc, argv);
}
