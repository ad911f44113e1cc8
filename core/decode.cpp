#include "decode.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cassert>
#include <limits>
#include <numeric>

namespace kvlab {

void Activations::resize(const Config& c, int n) {
    rows = n;
    const std::size_t r = std::size_t(n);
    for (auto* t : {&x, &xb, &q, &att, &out}) t->resize(r * c.dim);
    for (auto* t : {&k, &v}) t->resize(r * c.kv_dim());
    for (auto* t : {&h1, &h3}) t->resize(r * c.hidden_dim);
    check(c);
}

void Activations::check(const Config& c) const {
    const std::size_t r = std::size_t(rows);
    assert(x.size() == r * c.dim && xb.size() == r * c.dim && q.size() == r * c.dim);
    assert(att.size() == r * c.dim && out.size() == r * c.dim);
    assert(k.size() == r * c.kv_dim() && v.size() == r * c.kv_dim());
    assert(h1.size() == r * c.hidden_dim && h3.size() == r * c.hidden_dim);
    (void)c, (void)r;
}

void check_tokens(const Config& c, std::span<const int> tokens, int start_pos) {
    if (tokens.empty()) throw Error("no tokens to run: a sequence needs at least one token");
    for (std::size_t i = 0; i < tokens.size(); i++)
        if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
            throw Error(fmt::format("token id {} (at position {}) is outside the vocabulary [0, {})", tokens[i],
                                    start_pos + std::int64_t(i), c.vocab_size));
    if (start_pos + std::int64_t(tokens.size()) > c.max_seq)
        throw Error(
            fmt::format("sequence of {} tokens does not fit max_seq = {}", start_pos + tokens.size(), c.max_seq));
}

namespace {

// The layer code both decoders share. Only attention differs between them.

// x[i] = token_embedding[tokens[i]]
void embed(const Model& m, std::span<const int> tokens, Activations& a) {
    const int dim = m.config().dim;
    assert(a.rows == int(tokens.size()) && a.x.size() == std::size_t(a.rows) * dim);
    for (int i = 0; i < a.rows; i++)
        std::copy_n(m.w.token_embedding.data() + std::int64_t(tokens[i]) * dim, dim,
                    a.x.data() + std::int64_t(i) * dim);
}

// How the layer code multiplies: weights through their packed panels, activations with
// matmul; a test may plant its own product, which then runs on the unpacked weights.
struct Products {
    MatmulFn planted = nullptr;
    void weights(Exec& ex, float* y, int ldy, const float* x, int ldx, const PackedMatrix& w, int rows) const {
        if (planted)
            planted(ex, y, ldy, x, ldx, w.w, w.n_out, rows, w.n_in, w.n_out);
        else
            matmul_packed(ex, y, ldy, x, ldx, w, rows);
    }
    MatmulFn activations() const { return planted ? planted : kvlab::matmul; }
};

// xb = rmsnorm(x); q, k, v = xb · (wq, wk, wv); RoPE on q and k at each row's position.
void attention_inputs(Exec& ex, Products mm, const Model& m, int l, Activations& a, std::span<const int> positions) {
    const Config& c = m.config();
    const PackedLayer& w = m.packed[l];
    const int dim = c.dim, kv_dim = c.kv_dim(), n = a.rows;
    a.check(c);
    assert(int(positions.size()) == n);
    rmsnorm(ex, a.xb.data(), a.x.data(), m.w.rms_att.data() + std::int64_t(l) * dim, n, dim);
    mm.weights(ex, a.q.data(), dim, a.xb.data(), dim, w.wq, n);
    mm.weights(ex, a.k.data(), kv_dim, a.xb.data(), dim, w.wk, n);
    mm.weights(ex, a.v.data(), kv_dim, a.xb.data(), dim, w.wv, n);
    rope(ex, a.q.data(), n, c.n_heads, c.head_size(), positions, m.rope);
    rope(ex, a.k.data(), n, c.n_kv_heads, c.head_size(), positions, m.rope);
}

// x += att · wo;  x += w2 · (silu(xb · w1) * (xb · w3)) with xb = rmsnorm(x).
void attention_output_and_ffn(Exec& ex, Products mm, const Model& m, int l, Activations& a) {
    const Config& c = m.config();
    const PackedLayer& w = m.packed[l];
    const int dim = c.dim, hidden = c.hidden_dim, n = a.rows;
    a.check(c);
    mm.weights(ex, a.out.data(), dim, a.att.data(), dim, w.wo, n);
    add(ex, a.x.data(), a.out.data(), std::int64_t(n) * dim);
    rmsnorm(ex, a.xb.data(), a.x.data(), m.w.rms_ffn.data() + std::int64_t(l) * dim, n, dim);
    mm.weights(ex, a.h1.data(), hidden, a.xb.data(), dim, w.w1, n);
    mm.weights(ex, a.h3.data(), hidden, a.xb.data(), dim, w.w3, n);
    silu_mul(ex, a.h1.data(), a.h3.data(), std::int64_t(n) * hidden);
    mm.weights(ex, a.out.data(), dim, a.h1.data(), hidden, w.w2, n);
    add(ex, a.x.data(), a.out.data(), std::int64_t(n) * dim);
}

// logits = rmsnorm(x[last row]) · wcls
void classify(Exec& ex, Products mm, const Model& m, Activations& a, std::vector<float>& logits) {
    const Config& c = m.config();
    const std::int64_t last = std::int64_t(a.rows - 1) * c.dim;
    logits.resize(c.vocab_size);
    rmsnorm(ex, a.xb.data() + last, a.x.data() + last, m.w.rms_final.data(), 1, c.dim);
    mm.weights(ex, logits.data(), c.vocab_size, a.xb.data() + last, c.dim, m.wcls, 1);
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// Naive decode

NaiveDecoder::NaiveDecoder(const Model& model, int n_threads) : model_(model) { exec.n_threads = n_threads; }

const std::vector<float>& NaiveDecoder::forward(std::span<const int> tokens) {
    const Config& c = model_.config();
    check_tokens(c, tokens, 0);
    const int T = int(tokens.size());
    std::vector<int> positions(T);
    std::iota(positions.begin(), positions.end(), 0);
    act_.resize(c, T);
    embed(model_, tokens, act_);
    for (int l = 0; l < c.n_layers; l++) {
        attention_inputs(exec, Products{matmul}, model_, l, act_, positions);
        attention(T);
        attention_output_and_ffn(exec, Products{matmul}, model_, l, act_);
    }
    classify(exec, Products{matmul}, model_, act_, logits_);
    return logits_;
}

// For each head: S = Q_h K_h^T / sqrt(head_size) with S[i][j] = -inf for j > i, P = softmax by
// row, att_h = P V_h. Masked entries become exact zeros in P and add exact zeros to P V_h, so row
// i computes bit for bit what a cached decode computes at position i (NUMERICS.md).
// K and V are this layer's rows in act_, recomputed every step.
void NaiveDecoder::attention(int T) {
    const Config& c = model_.config();
    const int hs = c.head_size(), dim = c.dim, kv_dim = c.kv_dim();
    kt_.resize(std::size_t(hs) * T);     // [head_size, T]
    scores_.resize(std::size_t(T) * T);  // [T, T]
    assert(act_.rows == T);
    const float scale = attention_scale(hs);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const MatmulFn mm = Products{matmul}.activations();
    for (int h = 0; h < c.n_heads; h++) {
        const int kvh = h / c.group();
        for (int j = 0; j < T; j++)
            for (int d = 0; d < hs; d++) kt_[std::size_t(d) * T + j] = act_.k[std::size_t(j) * kv_dim + kvh * hs + d];
        // S[T, T] = Q_h[T, hs] · Kt[hs, T]
        mm(exec, scores_.data(), T, act_.q.data() + h * hs, dim, kt_.data(), T, T, hs, T);
        for (int i = 0; i < T; i++) {
            float* s = scores_.data() + std::size_t(i) * T;
            // The planted bug lets row i see one position into its future.
            const int last = mutant == Mutant::mask_off_by_one ? std::min(i + 1, T - 1) : i;
            for (int j = 0; j <= last; j++) s[j] = s[j] / scale;
            for (int j = last + 1; j < T; j++) s[j] = neg_inf;
            softmax(s, T);
        }
        exec.flops += std::uint64_t(T) * (T + 1) / 2 + std::uint64_t(T) * softmax_flops(T);
        // att_h[T, hs] = P[T, T] · V_h[T, hs]
        mm(exec, act_.att.data() + h * hs, dim, scores_.data(), T, act_.v.data() + kvh * hs, kv_dim, T, T, hs);
    }
}

// ----------------------------------------------------------------------------------------------
// Cached decode

CachedDecoder::CachedDecoder(const Model& model, int n_threads)
    : model_(model), own_(std::make_unique<ContiguousCache>(model.config())), cache_(own_.get()) {
    exec.n_threads = n_threads;
}

CachedDecoder::CachedDecoder(const Model& model, Cache& cache, int n_threads) : model_(model), cache_(&cache) {
    exec.n_threads = n_threads;
    check_cache(cache);
}

void CachedDecoder::check_cache(const Cache& cache) const {
    const Config &c = model_.config(), &k = cache.config();
    if (k.n_layers != c.n_layers || k.n_kv_heads != c.n_kv_heads || k.head_size() != c.head_size() ||
        k.max_seq != c.max_seq)
        throw Error(fmt::format("cache shape ({}) does not fit the model ({})", k.describe(), c.describe()));
}

const std::vector<float>& CachedDecoder::prefill(std::span<const int> tokens) {
    check_tokens(model_.config(), tokens, pos());
    // A variant that reads rows before a long append would overwrite them (a window's ring)
    // takes the prefill in chunks; rows are independent, so the logits do not change.
    const std::size_t chunk = std::size_t(std::max(1, cache_->max_append()));
    Cache* const caches[] = {cache_};
    for (std::size_t i = 0; i < tokens.size(); i += chunk) {
        const std::span<const int> part = tokens.subspan(i, std::min(chunk, tokens.size() - i));
        const std::vector<int> rows(part.begin(), part.end());
        step(caches, std::span<const std::vector<int>>(&rows, 1));
    }
    return logits_;
}

const std::vector<float>& CachedDecoder::extend(std::span<const int> sequence) {
    const Config& c = model_.config();
    check_tokens(c, sequence, 0);
    prefix_hit_ = 0;
    if (pos() == 0) {
        prefix_hit_ = cache_->attach_prefix(sequence);
        assert(prefix_hit_ < int(sequence.size()));
    } else if (mutant != Mutant::stale_prefix) {
        const std::span<const int> held = cache_->tokens();
        const std::size_t n = std::min(held.size(), sequence.size());
        const std::size_t i = std::mismatch(held.begin(), held.begin() + n, sequence.begin()).first - held.begin();
        if (i < held.size() && i < sequence.size())
            throw Error(fmt::format(
                "stale cache: it holds {} tokens and the request differs at position {} (token {} cached, {} "
                "requested); roll back to {} or start a new sequence",
                held.size(), i, held[i], sequence[i], i));
    }
    if (std::size_t(pos()) >= sequence.size())
        throw Error(fmt::format("the cache already holds all {} tokens of the request; roll back to run the last one",
                                sequence.size()));
    return prefill(sequence.subspan(pos()));
}

const std::vector<float>& CachedDecoder::step(std::span<Cache* const> caches,
                                              std::span<const std::vector<int>> tokens) {
    const Config& c = model_.config();
    const int n_seqs = int(caches.size());
    if (n_seqs == 0 || tokens.size() != caches.size())
        throw Error(fmt::format("batch: {} caches and {} token lists", caches.size(), tokens.size()));
    // Check everything first, then append; an append that fails undoes the earlier ones.
    for (int s = 0; s < n_seqs; s++) {
        check_cache(*caches[s]);
        for (int r = 0; r < s; r++)
            if (caches[r] == caches[s]) throw Error(fmt::format("batch: sequences {} and {} share one cache", r, s));
        check_tokens(c, tokens[s], caches[s]->length());
    }
    std::vector<int> start(n_seqs);
    for (int s = 0; s < n_seqs; s++) {
        start[s] = caches[s]->length();
        try {
            caches[s]->append(tokens[s]);
        } catch (...) {
            for (int r = 0; r < s; r++) caches[r]->truncate(start[r]);
            throw;
        }
    }
    // Rows of every sequence, stacked: row i belongs to seq_of_row[i] at logical positions[i].
    std::vector<int> all_tokens, seq_of_row, positions, rope_positions, last_row(n_seqs);
    for (int s = 0; s < n_seqs; s++) {
        for (std::size_t i = 0; i < tokens[s].size(); i++) {
            const int pos = start[s] + int(i);
            all_tokens.push_back(tokens[s][i]);
            seq_of_row.push_back(s);
            positions.push_back(pos);
            // The planted bug rotates a decode step's row one position too far.
            const bool off = mutant == Mutant::rope_decode_off && tokens[s].size() == 1 && start[s] > 0;
            rope_positions.push_back(off ? (pos + 1) % c.max_seq : pos);
        }
        last_row[s] = int(positions.size()) - 1;
    }
    const int n = int(all_tokens.size());
    act_.resize(c, n);
    embed(model_, all_tokens, act_);
    for (int l = 0; l < c.n_layers; l++) {
        attention_inputs(exec, Products{matmul}, model_, l, act_, rope_positions);
        // Write first, then read: row i attends over 0..pos, its own K and V included.
        const int wl = mutant == Mutant::kv_wrong_layer ? (l + 1) % c.n_layers : l;
        auto write_rows = [&] {
            for (int i = 0; i < n; i++)
                caches[seq_of_row[i]]->write(wl, positions[i], act_.k.data() + std::size_t(i) * c.kv_dim(),
                                             act_.v.data() + std::size_t(i) * c.kv_dim());
        };
        if (mutant != Mutant::read_before_write) write_rows();
        attention(l, caches, seq_of_row, positions);
        if (mutant == Mutant::read_before_write) write_rows();
        attention_output_and_ffn(exec, Products{matmul}, model_, l, act_);
    }
    // logits[s] = rmsnorm(x[last row of s]) · wcls, all sequences as one product.
    last_.resize(std::size_t(n_seqs) * c.dim);  // [n_seqs, dim]
    for (int s = 0; s < n_seqs; s++)
        std::copy_n(act_.x.data() + std::size_t(last_row[s]) * c.dim, c.dim, last_.data() + std::size_t(s) * c.dim);
    std::vector<float>& normed = act_.xb;  // [rows, dim], rows >= n_seqs: reused as scratch
    assert(normed.size() >= last_.size());
    rmsnorm(exec, normed.data(), last_.data(), model_.w.rms_final.data(), n_seqs, c.dim);
    logits_.resize(std::size_t(n_seqs) * c.vocab_size);
    Products{matmul}.weights(exec, logits_.data(), c.vocab_size, normed.data(), c.dim, model_.wcls, n_seqs);
    return logits_;
}

void CachedDecoder::attention(int l, std::span<Cache* const> caches, std::span<const int> seq_of_row,
                              std::span<const int> positions) {
    const Config& c = model_.config();
    const int hs = c.head_size(), n_heads = c.n_heads, rows = int(positions.size()), n_seqs = int(caches.size());
    const std::int64_t n_items = std::int64_t(rows) * n_heads;
    std::int64_t work = 0;  // multiply-adds, to decide whether threads pay off
    for (int pos : positions) {
        exec.flops += n_heads * attention_row_flops(hs, pos + 1);
        work += std::int64_t(n_heads) * 2 * hs * (pos + 1);
    }
    const std::size_t per_thread = std::size_t(c.max_seq);
    scores_.resize(std::size_t(exec.n_threads) * per_thread);  // [n_threads, max_seq]
    keys_.resize(std::size_t(exec.n_threads) * per_thread);    // [n_threads, max_seq]
    values_.resize(std::size_t(exec.n_threads) * per_thread);  // [n_threads, max_seq]
    const bool parallel = exec.n_threads > 1 && n_items > 1 && work >= exec.parallel_min_work;
    int probe_row = -1;  // the first sequence's last row, whose weights the probe copies
    if (probe) {
        for (int i = 0; i < rows; i++)
            if (seq_of_row[i] == 0) probe_row = i;
        probe->weights.resize(std::size_t(c.n_layers) * n_heads * per_thread);  // [n_layers, n_heads, max_seq]
    }
    // Each (row, head) is independent: one thread computes it whole, in the kernel's order.
#pragma omp parallel for num_threads(exec.n_threads) schedule(static) if (parallel)
    for (std::int64_t item = 0; item < n_items; item++) {
        const int i = int(item / n_heads), h = int(item % n_heads);
        // The planted GQA bug interleaves query heads over KV heads instead of grouping them.
        const int kvh = mutant == Mutant::gqa_modulo ? h % c.n_kv_heads : h / c.group();
        const int s = mutant == Mutant::batch_mixes_blocks ? (seq_of_row[i] + 1) % n_seqs : seq_of_row[i];
        const std::size_t th = std::size_t(omp_get_thread_num()) * per_thread;
        const float** keys = keys_.data() + th;
        const float** values = values_.data() + th;
        const int n = caches[s]->attended(l, kvh, positions[i], keys, values);
        attention_row(
            act_.att.data() + std::size_t(i) * c.dim + h * hs, act_.q.data() + std::size_t(i) * c.dim + h * hs, hs, n,
            [&](int t) { return keys[t]; }, [&](int t) { return values[t]; }, scores_.data() + th);
        if (i == probe_row) {
            std::copy(scores_.data() + th, scores_.data() + th + n,
                      probe->weights.data() + (std::size_t(l) * n_heads + h) * per_thread);
            if (h == 0) probe->n = n;
        }
    }
}

}  // namespace kvlab
