#include "decode.h"

#include "cpu_backend.h"
#include "paged.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <limits>
#include <numeric>

namespace kvlab {

void Activations::resize(Memory& memory, const Config& c, int n) {
    rows = n;
    if (n <= capacity && x.memory() == &memory) return;
    capacity = n;
    const std::int64_t r = n;
    for (auto* t : {&x, &xb, &q, &att, &out}) *t = Buffer<float>(memory, r * c.dim);
    for (auto* t : {&k, &v}) *t = Buffer<float>(memory, r * c.kv_dim());
    for (auto* t : {&h1, &h3}) *t = Buffer<float>(memory, r * c.hidden_dim);
    check(c);
}

void Activations::check(const Config& c) const {
    const std::int64_t r = capacity;
    assert(rows <= capacity);
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

// ----------------------------------------------------------------------------------------------
// The layer code both decoders share. Only attention differs between them.

// xb = rmsnorm(x); q, k, v = xb · (wq, wk, wv); RoPE on q and k at each row's position.
void attention_inputs(Backend& b, Exec& ex, int l, Activations& a, const int* positions) {
    const Config& c = b.config();
    const int dim = c.dim, kv_dim = c.kv_dim(), n = a.rows;
    a.check(c);
    b.rmsnorm(ex, a.xb.data(), a.x.data(), Norm::att, l, n);
    b.matmul(ex, a.q.data(), dim, a.xb.data(), dim, Matrix::wq, l, n);
    b.matmul(ex, a.k.data(), kv_dim, a.xb.data(), dim, Matrix::wk, l, n);
    b.matmul(ex, a.v.data(), kv_dim, a.xb.data(), dim, Matrix::wv, l, n);
    b.rope(ex, a.q.data(), n, c.n_heads, positions);
    b.rope(ex, a.k.data(), n, c.n_kv_heads, positions);
}

// x += att · wo;  x += w2 · (silu(xb · w1) * (xb · w3)) with xb = rmsnorm(x).
void attention_output_and_ffn(Backend& b, Exec& ex, int l, Activations& a) {
    const Config& c = b.config();
    const int dim = c.dim, hidden = c.hidden_dim, n = a.rows;
    a.check(c);
    b.matmul(ex, a.out.data(), dim, a.att.data(), dim, Matrix::wo, l, n);
    b.add(ex, a.x.data(), a.out.data(), std::int64_t(n) * dim);
    b.rmsnorm(ex, a.xb.data(), a.x.data(), Norm::ffn, l, n);
    b.matmul(ex, a.h1.data(), hidden, a.xb.data(), dim, Matrix::w1, l, n);
    b.matmul(ex, a.h3.data(), hidden, a.xb.data(), dim, Matrix::w3, l, n);
    b.silu_mul(ex, a.h1.data(), a.h3.data(), std::int64_t(n) * hidden);
    b.matmul(ex, a.out.data(), dim, a.h1.data(), hidden, Matrix::w2, l, n);
    b.add(ex, a.x.data(), a.out.data(), std::int64_t(n) * dim);
}

// logits[rows, vocab_size] = rmsnorm(x[rows, dim]) · wcls; normed is [rows, dim] scratch.
void classify(Backend& b, Exec& ex, const float* x, float* normed, float* logits, int rows) {
    const Config& c = b.config();
    b.rmsnorm(ex, normed, x, Norm::final, 0, rows);
    b.matmul(ex, logits, c.vocab_size, normed, c.dim, Matrix::wcls, 0, rows);
}

template <class T>
void ensure(Buffer<T>& buffer, Memory& memory, std::int64_t n) {
    if (buffer.size() < n || buffer.memory() != &memory) buffer = Buffer<T>(memory, n);
}

template <class T>
void upload(Buffer<T>& buffer, Memory& memory, std::span<const T> host) {
    ensure(buffer, memory, std::int64_t(host.size()));
    if (!host.empty()) buffer.upload(host);
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// Naive decode

NaiveDecoder::NaiveDecoder(Backend& backend) : backend_(&backend) {}

NaiveDecoder::NaiveDecoder(const Model& model, int n_threads)
    : own_(std::make_unique<CpuBackend>(model)), backend_(own_.get()) {
    exec.n_threads = n_threads;
}

NaiveDecoder::~NaiveDecoder() = default;

const std::vector<float>& NaiveDecoder::forward(std::span<const int> tokens) {
    Backend& b = *backend_;
    Memory& memory = b.memory();
    const Config& c = b.config();
    check_tokens(c, tokens, 0);
    const int T = int(tokens.size());
    std::vector<int> positions(std::size_t(T), 0);  // [T]
    std::iota(positions.begin(), positions.end(), 0);
    upload(tokens_, memory, tokens);
    upload(positions_, memory, std::span<const int>(positions));
    upload(kv_head_, memory, std::span<const int>(kv_head_map(c)));
    act_.resize(memory, c, T);
    b.embed(exec, act_.x.data(), tokens_.data(), T);
    // The planted bug lets row i see one position into its future.
    const int future = mutant == Mutant::mask_off_by_one ? 1 : 0;
    for (int l = 0; l < c.n_layers; l++) {
        attention_inputs(b, exec, l, act_, positions_.data());
        b.causal_attention(exec, act_.att.data(), act_.q.data(), act_.k.data(), act_.v.data(), T, kv_head_.data(),
                           future);
        attention_output_and_ffn(b, exec, l, act_);
    }
    // Only the last row's logits: rmsnorm and the classifier on that row alone.
    ensure(logits_dev_, memory, c.vocab_size);
    const std::int64_t last = std::int64_t(T - 1) * c.dim;
    classify(b, exec, act_.x.data() + last, act_.xb.data() + last, logits_dev_.data(), 1);
    logits_.resize(std::size_t(c.vocab_size));
    memory.download(logits_.data(), logits_dev_.data(), std::int64_t(sizeof(float)) * c.vocab_size);
    return logits_;
}

// ----------------------------------------------------------------------------------------------
// Cached decode

CachedDecoder::CachedDecoder(Backend& backend)
    : backend_(&backend),
      own_cache_(std::make_unique<ContiguousCache>(backend.config(), ContiguousCache::Layout::head_major,
                                                   backend.memory())),
      cache_(own_cache_.get()) {}

CachedDecoder::CachedDecoder(Backend& backend, Cache& cache) : backend_(&backend), cache_(&cache) {
    check_cache(cache);
}

CachedDecoder::CachedDecoder(const Model& model, int n_threads)
    : own_backend_(std::make_unique<CpuBackend>(model)), backend_(own_backend_.get()),
      own_cache_(std::make_unique<ContiguousCache>(model.config())), cache_(own_cache_.get()) {
    exec.n_threads = n_threads;
}

CachedDecoder::CachedDecoder(const Model& model, Cache& cache, int n_threads)
    : own_backend_(std::make_unique<CpuBackend>(model)), backend_(own_backend_.get()), cache_(&cache) {
    exec.n_threads = n_threads;
    check_cache(cache);
}

CachedDecoder::~CachedDecoder() = default;

void CachedDecoder::check_cache(const Cache& cache) const {
    const Config &c = backend_->config(), &k = cache.config();
    if (k.n_layers != c.n_layers || k.n_kv_heads != c.n_kv_heads || k.head_size() != c.head_size() ||
        k.max_seq != c.max_seq)
        throw Error(fmt::format("cache shape ({}) does not fit the model ({})", k.describe(), c.describe()));
    if (&cache.storage().memory() != &backend_->memory())
        throw Error(fmt::format("the {} cache keeps its rows in {} memory; the {} backend needs them in {} memory",
                                cache.name(), cache.storage().memory().name(), backend_->name(),
                                backend_->memory().name()));
}

// A variant that reads rows before a long append would overwrite them (a window's ring) takes
// the rows in chunks of max_append(); rows are independent, so the logits do not change. So does
// a long prefill: a step's slot list is [rows, max_n] (run_step), T x T for a whole prompt, so
// chunks keep it under kMaxSlots (32 MB) at any length.
// all_rows keeps every row's logits in row_logits_ ([tokens, vocab_size]).
void CachedDecoder::run_chunks(std::span<const int> tokens, bool all_rows) {
    const Config& c = backend_->config();
    check_tokens(c, tokens, pos());
    constexpr std::int64_t kMaxSlots = std::int64_t{1} << 22;
    const std::int64_t widest = backend_->capturing() ? c.max_seq : pos() + std::int64_t(tokens.size());  // max_n
    const std::size_t chunk =
        std::size_t(std::max<std::int64_t>(1, std::min<std::int64_t>(cache_->max_append(), kMaxSlots / widest)));
    Cache* const caches[] = {cache_};
    row_logits_.clear();
    all_rows_ = all_rows;
    try {
        for (std::size_t i = 0; i < tokens.size(); i += chunk) {
            const std::span<const int> part = tokens.subspan(i, std::min(chunk, tokens.size() - i));
            const std::vector<int> rows(part.begin(), part.end());
            step(caches, std::span<const std::vector<int>>(&rows, 1));
            if (!all_rows) continue;
            assert(logits_.size() == part.size() * std::size_t(c.vocab_size));  // [part, vocab_size]
            row_logits_.insert(row_logits_.end(), logits_.begin(), logits_.end());
        }
    } catch (...) {
        all_rows_ = false;
        throw;
    }
    all_rows_ = false;
    assert(!all_rows || row_logits_.size() == tokens.size() * std::size_t(c.vocab_size));
}

const std::vector<float>& CachedDecoder::prefill(std::span<const int> tokens) {
    run_chunks(tokens, false);
    return logits_;
}

const std::vector<float>& CachedDecoder::prefill_rows(std::span<const int> tokens) {
    run_chunks(tokens, true);
    return row_logits_;
}

const std::vector<float>& CachedDecoder::extend(std::span<const int> sequence) {
    const Config& c = backend_->config();
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
    const Config& c = backend_->config();
    const int n_seqs = int(caches.size());
    if (n_seqs == 0 || tokens.size() != caches.size())
        throw Error(fmt::format("batch: {} caches and {} token lists", caches.size(), tokens.size()));
    // Check everything first, pools included, then append: a copy-on-write cannot be rolled back,
    // so only an append that fails to allocate (a growing cache) undoes the earlier ones. The
    // refusal of one sequence of several names its index.
    std::vector<int> added(n_seqs);
    for (int s = 0; s < n_seqs; s++) {
        if (!caches[s]) throw Error(fmt::format("batch: sequence {} has a null cache", s));
        for (int r = 0; r < s; r++)
            if (caches[r] == caches[s]) throw Error(fmt::format("batch: sequences {} and {} share one cache", r, s));
        try {
            check_cache(*caches[s]);
            check_tokens(c, tokens[s], caches[s]->length());
            caches[s]->check_append(std::int64_t(tokens[s].size()));
        } catch (const Error& e) {
            if (n_seqs == 1) throw;
            throw Error(fmt::format("batch: sequence {}: {}", s, e.what()));
        }
        added[s] = int(tokens[s].size());
    }
    check_pool_room(caches, added);
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
    // A step that fails on the way (a device out of memory, a CUDA error) leaves every cache as
    // it was before the step: host bookkeeping never runs ahead of the rows.
    try {
        return run_step(caches, tokens, start);
    } catch (...) {
        for (int s = 0; s < n_seqs; s++) caches[s]->truncate(start[s]);
        throw;
    }
}

const std::vector<float>& CachedDecoder::run_step(std::span<Cache* const> caches,
                                                  std::span<const std::vector<int>> tokens, std::span<const int> start) {
    const Config& c = backend_->config();
    const int n_seqs = int(caches.size());
    // Rows of every sequence, stacked: row i belongs to seq_of_row[i] at logical positions[i].
    // Then the host-side bookkeeping for the whole step: where each row's K and V go, and the
    // slots each row attends (the same for every layer and head).
    std::vector<int> all_tokens, seq_of_row, positions, rope_positions;
    std::vector<int> last_row(caches.size(), 0);  // [n_seqs]
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
        last_row[std::size_t(s)] = int(positions.size()) - 1;
    }
    const int n = int(all_tokens.size());
    Backend& b = *backend_;
    Memory& memory = b.memory();
    // A backend that captures steps as graphs replays them with the same arguments: the slot
    // lists are then sized for the longest sequence, and the probe (a download per layer) is off.
    const bool capture = b.capturing() && !probe;
    int max_n = 1;
    for (int pos : positions) max_n = std::max(max_n, pos + 1);  // every variant attends at most pos + 1
    if (capture) max_n = c.max_seq;
    std::vector<RowKV> write_kv(all_tokens.size()), read_kv(all_tokens.size());  // [rows]
    std::vector<std::int64_t> slots(std::size_t(n) * max_n, -1);            // [rows, max_n]
    for (int i = 0; i < n; i++) {
        Cache& own = *caches[seq_of_row[i]];
        // The planted bug reads through the next sequence's cache.
        const Cache& read = mutant == Mutant::batch_mixes_blocks ? *caches[(seq_of_row[i] + 1) % n_seqs] : own;
        write_kv[i] = own.row_kv();
        write_kv[i].write_slot = own.write_slot(positions[i]);
        read_kv[i] = read.row_kv();
        read_kv[i].n = read.attended(positions[i], slots.data() + std::int64_t(i) * max_n);
        assert(read_kv[i].n <= max_n);
    }
    std::vector<int> kv_head = kv_head_map(c);  // [n_heads]
    // The planted GQA bug interleaves query heads over KV heads instead of grouping them.
    if (mutant == Mutant::gqa_modulo)
        for (int h = 0; h < c.n_heads; h++) kv_head[h] = h % c.n_kv_heads;

    upload(tokens_, memory, std::span<const int>(all_tokens));
    upload(positions_, memory, std::span<const int>(rope_positions));
    upload(write_kv_, memory, std::span<const RowKV>(write_kv));
    upload(read_kv_, memory, std::span<const RowKV>(read_kv));
    upload(slots_, memory, std::span<const std::int64_t>(slots));
    upload(kv_head_, memory, std::span<const int>(kv_head));
    int probe_row = -1;  // the first sequence's last row, whose weights the probe copies
    if (probe) {
        probe_row = last_row[0];
        ensure(probe_dev_, memory, std::int64_t(c.n_heads) * max_n);
        probe->weights.assign(std::size_t(c.n_layers) * c.n_heads * c.max_seq, 0.0f);  // [n_layers, n_heads, max_seq]
        probe->n = read_kv[std::size_t(probe_row)].n;
    }
    // Rows classified: each sequence's last, or with all_rows_ (prefill_rows: one sequence) all n.
    assert(!all_rows_ || n_seqs == 1);
    const int n_out = all_rows_ ? n : n_seqs;
    act_.resize(memory, c, n);
    ensure(last_, memory, std::int64_t(n_seqs) * c.dim);
    ensure(normed_, memory, std::int64_t(n_out) * c.dim);
    ensure(logits_dev_, memory, std::int64_t(n_out) * c.vocab_size);

    // Layer l's rows of each sequence are in storage: the caches' hooks (host bookkeeping).
    auto stored = [&](int l) {
        for (int s = 0; s < n_seqs; s++)
            caches[s]->stored(l, std::span<const int>(positions).subspan(
                                     std::size_t(last_row[s] + 1) - tokens[s].size(), tokens[s].size()));
    };
    const int write_layer_shift = mutant == Mutant::kv_wrong_layer ? 1 : 0;  // the planted bug writes into l + 1
    auto forward = [&] {
        b.embed(exec, act_.x.data(), tokens_.data(), n);
        for (int l = 0; l < c.n_layers; l++) {
            attention_inputs(b, exec, l, act_, positions_.data());
            // Write first, then read: row i attends over 0..pos, its own K and V included.
            const int wl = (l + write_layer_shift) % c.n_layers;
            auto write_rows = [&] {
                b.store_kv(exec, write_kv_.data(), n, wl, act_.k.data(), act_.v.data());
                if (!capture) stored(wl);
            };
            if (mutant != Mutant::read_before_write) write_rows();
            b.attention(exec, act_.att.data(), act_.q.data(), read_kv_.data(), n, l, slots_.data(), max_n,
                        kv_head_.data(), probe_row, probe ? probe_dev_.data() : nullptr);
            if (mutant == Mutant::read_before_write) write_rows();
            if (probe)
                for (int h = 0; h < c.n_heads; h++)
                    memory.download(probe->weights.data() + (std::size_t(l) * c.n_heads + h) * c.max_seq,
                                    probe_dev_.data() + std::int64_t(h) * max_n, std::int64_t(sizeof(float)) * probe->n);
            attention_output_and_ffn(b, exec, l, act_);
        }
        if (all_rows_) {
            // logits[i] = rmsnorm(x[i]) · wcls for every row i, as one product.
            classify(b, exec, act_.x.data(), normed_.data(), logits_dev_.data(), n);
            return;
        }
        // logits[s] = rmsnorm(x[last row of s]) · wcls, all sequences as one product.
        for (int s = 0; s < n_seqs; s++)
            memory.copy(last_.data() + std::int64_t(s) * c.dim, act_.x.data() + std::int64_t(last_row[s]) * c.dim,
                        std::int64_t(sizeof(float)) * c.dim);
        classify(b, exec, last_.data(), normed_.data(), logits_dev_.data(), n_seqs);
    };
    if (!capture) {
        forward();
    } else {
        // Everything the captured calls depend on, besides buffer contents.
        std::uint64_t key = 0x6b766c6162ull;  // "kvlab"
        auto mix = [&key](std::uint64_t x) { key = (key ^ x) * 0x100000001b3ull; };
        for (int s = 0; s < n_seqs; s++) mix(std::uint64_t(last_row[s]));
        mix(std::uint64_t(n));
        mix(std::uint64_t(mutant));
        mix(std::uint64_t(all_rows_));
        for (const void* p : {(const void*)act_.x.data(), (const void*)tokens_.data(), (const void*)positions_.data(),
                              (const void*)write_kv_.data(), (const void*)read_kv_.data(), (const void*)slots_.data(),
                              (const void*)kv_head_.data(), (const void*)last_.data(), (const void*)logits_dev_.data()})
            mix(std::uint64_t(reinterpret_cast<std::uintptr_t>(p)));
        b.run(key, forward);
        for (int l = 0; l < c.n_layers; l++) stored((l + write_layer_shift) % c.n_layers);
    }
    logits_.resize(std::size_t(n_out) * c.vocab_size);
    memory.download(logits_.data(), logits_dev_.data(), std::int64_t(sizeof(float)) * n_out * c.vocab_size);
    return logits_;
}

}  // namespace kvlab
