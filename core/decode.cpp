#include "decode.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <limits>
#include <numeric>

#include "cpu_backend.h"
#include "paged.h"  // check_pool_room

namespace kvlab {

void Activations::resize(Memory& memory, const Config& c, int n) {
    if (n <= capacity && x.memory() == &memory) {
        rows = n;
        return;
    }
    const std::int64_t r = n;
    // Charged before the buffers are replaced: naive decode's rows grow with T (5 dim + 2 kv_dim
    // + 2 hidden_dim floats each), and a long context must be refused, not allocated.
    charge = MemoryCharge();
    charge = MemoryCharge(
        fmt::format("a decoder's activations ({} rows of {})", n, c.describe()),
        r * (5 * std::int64_t(c.dim) + 2 * c.kv_dim() + 2 * std::int64_t(c.hidden_dim)) * std::int64_t(sizeof(float)));
    rows = n, capacity = n;
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

std::vector<float> rescore(CachedDecoder& dec, std::span<const int> sequence, int from) {
    const int n = int(sequence.size()), V = dec.backend().config().vocab_size;
    if (from < 1 || from >= n)
        throw Error(
            fmt::format("rescore: tokens from {} of a sequence of {} (the first has no logits before it)", from, n));
    if (dec.pos() != 0) throw Error(fmt::format("rescore: the cache must be empty, not hold {} positions", dec.pos()));
    const std::vector<float>& rows = dec.prefill_rows(sequence.first(std::size_t(n - 1)));  // [n - 1, vocab_size]
    assert(rows.size() == std::size_t(n - 1) * std::size_t(V));
    std::vector<float> lp;  // [n - from]
    for (int t = from; t < n; t++)
        lp.push_back(token_logprob(rows.data() + std::size_t(t - 1) * V, V, sequence[std::size_t(t)]));
    return lp;
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
    const Backend::Product qkv[] = {
        {a.q.data(), dim, Matrix::wq}, {a.k.data(), kv_dim, Matrix::wk}, {a.v.data(), kv_dim, Matrix::wv}};
    b.matmuls(ex, a.xb.data(), dim, l, n, qkv);
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
    const Backend::Product gate_up[] = {{a.h1.data(), hidden, Matrix::w1}, {a.h3.data(), hidden, Matrix::w3}};
    b.matmuls(ex, a.xb.data(), dim, l, n, gate_up);
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

// The quantized cache's rounding of naive decode's K and V [T, kv_dim] (host-visible) into kq
// and vq: values, and keys per token, each head row's groups of `group` channels; keys per
// channel, each channel over each complete group of `group` positions (rows past the last
// complete group are copied as they are). quant_fit, quant_encode and quant_decode, as the cache.
void quantize_like_cache(const Config& c, const QuantSpec& q, const float* k, const float* v, int T, float* kq,
                         float* vq) {
    const int hs = c.head_size(), kv_dim = c.kv_dim(), g = q.group, bits = q.bits;
    if ((bits != 8 && bits != 4) || g < 1 || hs % g != 0)
        throw Error(fmt::format("naive decode: quantization of {} bits in groups of {} does not fit head_size {}", bits,
                                g, hs));
    auto per_token = [&](const float* x, float* out) {
        for (int t = 0; t < T; t++)
            for (int g0 = 0; g0 < kv_dim; g0 += g) {  // g divides head_size: groups stay in a head
                const std::int64_t at = std::int64_t(t) * kv_dim + g0;
                const QuantRange r = quant_fit(x + at, g, 1, bits);
                for (int d = 0; d < g; d++) out[at + d] = quant_decode(quant_encode(x[at + d], r, bits), r);
            }
    };
    per_token(v, vq);
    if (q.key_axis == QuantSpec::Axis::per_token) {
        per_token(k, kq);
        return;
    }
    const int complete = T / g * g;
    for (int t0 = 0; t0 < complete; t0 += g)
        for (int e = 0; e < kv_dim; e++) {  // channel e = h * head_size + d, over positions t0..t0+g-1
            const QuantRange r = quant_fit(k + std::int64_t(t0) * kv_dim + e, g, kv_dim, bits);
            for (int i = 0; i < g; i++) {
                const std::int64_t at = std::int64_t(t0 + i) * kv_dim + e;
                kq[at] = quant_decode(quant_encode(k[at], r, bits), r);
            }
        }
    std::copy(k + std::int64_t(complete) * kv_dim, k + std::int64_t(T) * kv_dim, kq + std::int64_t(complete) * kv_dim);
}

// Causal attention where query p reads key t from kq when t's group of `group` positions ends at
// or before p ((t / group + 1) * group <= p + 1), else from k. The queries with m complete groups,
// p + 1 in [m * group, (m + 1) * group), see one key matrix: groups below m from kq, the rest
// from k; the backend's causal attention runs once per m over the rows up to the last such p.
void causal_attention_mixed(Backend& b, Exec& ex, float* att, const float* q, const float* k, const float* kq,
                            const float* v, int T, const int* kv_head, int group, Buffer<float>& k_mix,
                            Buffer<float>& att_mix) {
    const Config& c = b.config();
    Memory& memory = b.memory();
    const std::int64_t kv_row = std::int64_t(sizeof(float)) * c.kv_dim(), att_row = std::int64_t(sizeof(float)) * c.dim;
    for (int m = 0; m * group <= T; m++) {
        const int first = std::max(0, m * group - 1), last = std::min(T - 1, m * group + group - 2);
        if (first > last) continue;
        const int n = last + 1, quantized = std::min(m * group, n);  // rows attended; of them from kq
        if (quantized > 0) memory.copy(k_mix.data(), kq, kv_row * quantized);
        if (n > quantized)
            memory.copy(k_mix.data() + std::int64_t(quantized) * c.kv_dim(), k + std::int64_t(quantized) * c.kv_dim(),
                        kv_row * (n - quantized));
        b.causal_attention(ex, att_mix.data(), q, k_mix.data(), v, n, kv_head);
        memory.copy(att + std::int64_t(first) * c.dim, att_mix.data() + std::int64_t(first) * c.dim,
                    att_row * (n - first));
    }
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
    const bool stores = kv_format != KVFormat::fp32;
    if (quant) {
        if (stores) throw Error("naive decode: a KV format and the quantized cache's rounding are exclusive");
        if (!memory.host_visible())
            throw Error("naive decode: the quantized cache's rounding runs on host-visible memory (cpu, gpu-host)");
        const std::int64_t n = std::int64_t(T) * c.kv_dim();
        ensure(k_stored_, memory, n);
        ensure(v_stored_, memory, n);
        ensure(k_mix_, memory, n);
        ensure(att_mix_, memory, std::int64_t(T) * c.dim);
        assert(k_stored_.size() >= n && att_mix_.size() >= std::int64_t(T) * c.dim);
    }
    if (stores) {
        // Position t's rows of a [T, kv_dim] seq-major store: slot t * n_kv_heads of KV head 0,
        // the same rows for every layer (layer_rows 0), layer l's scales.
        const std::int64_t n = std::int64_t(T) * c.kv_dim();
        const std::int64_t row_bytes = kv_row_bytes(int(kv_format), c.head_size());
        const std::int64_t bytes = std::int64_t(T) * c.n_kv_heads * row_bytes;
        upload(scales_, memory, std::span<const float>(checked_kv_scales(c.n_layers, kv_scales)));
        ensure(k_codes_, memory, bytes);
        ensure(v_codes_, memory, bytes);
        ensure(k_stored_, memory, n);
        ensure(v_stored_, memory, n);
        assert(k_codes_.size() >= bytes && v_stored_.size() >= n);
        std::vector<RowKV> rows(static_cast<std::size_t>(T));  // [T]
        for (int t = 0; t < T; t++) {
            RowKV& r = rows[std::size_t(t)];
            r.k = k_codes_.data(), r.v = v_codes_.data(), r.scales = scales_.data();
            r.layer_rows = 0, r.head_rows = 1, r.write_slot = std::int64_t(t) * c.n_kv_heads;
            r.format = int(kv_format);
            r.row_bytes = row_bytes;
            r.group = kv_row_group(r.format, c.head_size());
        }
        upload(store_rows_, memory, std::span<const RowKV>(rows));
    }
    b.embed(exec, act_.x.data(), tokens_.data(), T);
    for (int l = 0; l < c.n_layers; l++) {
        attention_inputs(b, exec, l, act_, positions_.data());
        const float *k = act_.k.data(), *v = act_.v.data();  // [T, kv_dim]
        if (stores) {
            b.store_kv(exec, store_rows_.data(), T, l, act_.k.data(), act_.v.data());
            b.load_kv(exec, store_rows_.data(), T, l, k_stored_.data(), v_stored_.data());
            k = k_stored_.data(), v = v_stored_.data();
        }
        if (quant) {
            b.memory().synchronize();
            quantize_like_cache(c, *quant, k, v, T, k_stored_.data(), v_stored_.data());
            if (quant->key_axis == QuantSpec::Axis::per_channel) {
                causal_attention_mixed(b, exec, act_.att.data(), act_.q.data(), k, k_stored_.data(), v_stored_.data(),
                                       T, kv_head_.data(), quant->group, k_mix_, att_mix_);
                attention_output_and_ffn(b, exec, l, act_);
                continue;
            }
            k = k_stored_.data(), v = v_stored_.data();
        }
        b.causal_attention(exec, act_.att.data(), act_.q.data(), k, v, T, kv_head_.data());
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

CachedDecoder::CachedDecoder(Backend& backend, std::nullptr_t) : backend_(&backend), cache_(nullptr) {}

const Cache& CachedDecoder::cache() const {
    if (!cache_) throw Error("cached decoder: no cache to run on (set_cache)");
    return *cache_;
}

void CachedDecoder::set_cache(Cache& cache) {
    check_cache(cache);
    cache_ = &cache;
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
// the rows in chunks of max_step() (max_append(), or 1 for a quantized cache's per-channel keys);
// rows are independent, so the logits do not change. So does
// a long prefill: a step's slot list is [rows, max_n] (plan_step), T x T for a whole prompt, so
// chunks keep it under kMaxSlots (32 MB) at any length.
// all_rows keeps every row's logits in row_logits_ ([tokens, vocab_size]).
void CachedDecoder::run_chunks(std::span<const int> tokens, bool all_rows) {
    const Config& c = backend_->config();
    check_tokens(c, tokens, pos());
    constexpr std::int64_t kMaxSlots = std::int64_t{1} << 22;
    const std::int64_t widest = backend_->capturing() ? c.max_seq : pos() + std::int64_t(tokens.size());  // max_n
    const std::size_t chunk =
        std::size_t(std::max<std::int64_t>(1, std::min<std::int64_t>(cache().max_step(), kMaxSlots / widest)));
    Cache* const caches[] = {cache_};
    // A request of several chunks is one request: whatever would refuse a later chunk (its pool's
    // free blocks) refuses it before the first, and a later chunk that fails anyway (a device
    // error) puts the cache back as it was (Cache::snapshot).
    const bool chunked = tokens.size() > chunk;
    if (chunked) {
        const int added[] = {int(tokens.size())};
        check_pool_room(caches, added);
    }
    const std::unique_ptr<CacheSnapshot> before = chunked ? cache().snapshot(int(tokens.size())) : nullptr;
    row_logits_.clear();
    all_rows_ = all_rows;
    in_request_ = chunked;  // its chunks commit together, at the end
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
        all_rows_ = in_request_ = false;
        if (before) cache().restore(*before);
        throw;
    }
    all_rows_ = in_request_ = false;
    if (chunked) cache().committed();
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
        prefix_hit_ = cache().attach_prefix(sequence);
        assert(prefix_hit_ < int(sequence.size()));
    } else {
        const std::span<const int> held = cache().tokens();
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
    try {
        return prefill(sequence.subspan(pos()));
    } catch (...) {
        if (prefix_hit_ > 0) cache().truncate(0), prefix_hit_ = 0;  // the request is refused whole: the hit too
        throw;
    }
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
    std::vector<std::unique_ptr<CacheSnapshot>> before(static_cast<std::size_t>(n_seqs));  // [n_seqs]
    for (int s = 0; s < n_seqs; s++) {
        start[s] = caches[s]->length();
        before[std::size_t(s)] = caches[s]->snapshot(added[s]);
        try {
            caches[s]->append(tokens[s]);
        } catch (...) {
            for (int r = 0; r < s; r++) caches[r]->restore(*before[std::size_t(r)]);
            throw;
        }
    }
    // A step that fails on the way (a device out of memory, a CUDA error) leaves every cache as
    // it was before the step: host bookkeeping never runs ahead of the rows.
    try {
        // A backend that captures steps as graphs replays them with the same arguments: slot
        // lists are then sized for the longest sequence. A watched step (a download per layer) is
        // not captured.
        const bool capture = backend_->capturing() && !observer;
        StepPlan plan = plan_step(c, caches, tokens, start, all_rows_, capture ? c.max_seq : 1);
        if (transform) transform(plan);
        const std::vector<float>& logits = execute(plan);
        if (!in_request_)
            for (int s = 0; s < n_seqs; s++) caches[s]->committed();
        return logits;
    } catch (...) {
        for (int s = 0; s < n_seqs; s++) caches[s]->restore(*before[std::size_t(s)]);
        throw;
    }
}

// ----------------------------------------------------------------------------------------------
// Planning a step: host integers only

void StepPlan::check(const Config& c) const {
    const std::size_t n = tokens.size();
    assert(positions.size() == n && kv.size() == n);
    assert(slots.size() == n * std::size_t(max_n));  // [rows, max_n]
    assert(kv_head.size() == std::size_t(c.n_heads));
    assert(!out_rows.empty() && !seqs.empty());
    for (int r : out_rows) assert(r >= 0 && r < rows());
    for (const RowKV& r : kv) assert(r.n >= 0 && r.n <= max_n);
    (void)c, (void)n;
}

StepPlan plan_step(const Config& c, std::span<Cache* const> caches, std::span<const std::vector<int>> tokens,
                   std::span<const int> start, bool all_rows, int min_n) {
    assert(caches.size() == tokens.size() && caches.size() == start.size());
    assert(!all_rows || caches.size() == 1);
    StepPlan p;
    // Rows of every sequence, stacked.
    for (std::size_t s = 0; s < caches.size(); s++) {
        p.seqs.push_back({caches[s], p.rows(), int(tokens[s].size()), start[s]});
        for (std::size_t i = 0; i < tokens[s].size(); i++) {
            p.tokens.push_back(tokens[s][i]);
            p.positions.push_back(start[s] + int(i));
            p.max_n = std::max(p.max_n, start[s] + int(i) + 1);  // every variant attends at most pos + 1
        }
        if (!all_rows) p.out_rows.push_back(p.rows() - 1);
    }
    if (all_rows) p.out_rows.resize(std::size_t(p.rows())), std::iota(p.out_rows.begin(), p.out_rows.end(), 0);
    p.max_n = std::max(p.max_n, min_n);
    // Where each row's K and V go, and the slots it attends: the same for every layer and head.
    p.kv.resize(std::size_t(p.rows()));
    p.slots.assign(std::size_t(p.rows()) * p.max_n, -1);
    for (const StepPlan::Sequence& seq : p.seqs)
        for (int i = seq.first_row; i < seq.first_row + seq.n_rows; i++) {
            RowKV& r = p.kv[std::size_t(i)];
            r = seq.cache->row_kv();
            r.write_slot = seq.cache->write_slot(p.positions[i]);
            r.n = seq.cache->attended(p.positions[i], p.slots.data() + std::int64_t(i) * p.max_n);
        }
    p.kv_head = kv_head_map(c);
    p.check(c);
    return p;
}

// ----------------------------------------------------------------------------------------------
// Executing a plan: llama2.c's forward() over the step's rows

const std::vector<float>& CachedDecoder::execute(const StepPlan& p) {
    Backend& b = *backend_;
    Memory& memory = b.memory();
    const Config& c = b.config();
    p.check(c);
    const int n = p.rows(), n_out = int(p.out_rows.size()), dim = c.dim;
    const int fed = fed_row(p);  // the row whose weights its cache reads (H2O), or -1
    const bool capture = b.capturing() && !observer && fed < 0;
    upload(tokens_, memory, std::span<const int>(p.tokens));
    upload(positions_, memory, std::span<const int>(p.positions));
    upload(kv_, memory, std::span<const RowKV>(p.kv));
    upload(slots_, memory, std::span<const std::int64_t>(p.slots));
    upload(kv_head_, memory, std::span<const int>(p.kv_head));
    act_.resize(memory, c, n);
    ensure(out_x_, memory, std::int64_t(n_out) * dim);
    ensure(normed_, memory, std::int64_t(n_out) * dim);
    ensure(logits_dev_, memory, std::int64_t(n_out) * c.vocab_size);
    const int watched = observer ? observer->watch(p) : fed;  // the row whose weights are probed
    assert(watched < n);
    if (fed >= 0 && watched != fed)
        throw Error(fmt::format("{}: the viewer's probe watches row {}, its cache's weights are row {}'s",
                                p.seqs[0].cache->name(), watched, fed));
    if (watched >= 0) ensure(probe_dev_, memory, std::int64_t(c.n_heads) * p.max_n);
    // Layer l's rows are in storage: each cache's hook (host bookkeeping: quantize, publish).
    auto stored = [&](int l) {
        for (const StepPlan::Sequence& seq : p.seqs)
            seq.cache->stored(
                l, std::span<const int>(p.positions).subspan(std::size_t(seq.first_row), std::size_t(seq.n_rows)));
    };
    auto forward = [&] {
        b.embed(exec, act_.x.data(), tokens_.data(), n);
        for (int l = 0; l < c.n_layers; l++) {
            attention_inputs(b, exec, l, act_, positions_.data());
            // Write first, then read: row i attends over 0..pos, its own K and V included.
            b.store_kv(exec, kv_.data(), n, l, act_.k.data(), act_.v.data());
            if (!capture) stored(l);
            b.attention(exec, act_.att.data(), act_.q.data(), kv_.data(), n, l, slots_.data(), p.max_n, kv_head_.data(),
                        watched, watched >= 0 ? probe_dev_.data() : nullptr);
            if (watched >= 0)
                observe_layer(l, p.max_n, p.kv[std::size_t(watched)].n, fed >= 0 ? p.seqs[0].cache : nullptr);
            attention_output_and_ffn(b, exec, l, act_);
        }
        // logits[o] = rmsnorm(x[out_rows[o]]) · wcls, every output row in one product.
        for (int o = 0; o < n_out; o++)
            memory.copy(out_x_.data() + std::int64_t(o) * dim, act_.x.data() + std::int64_t(p.out_rows[o]) * dim,
                        std::int64_t(sizeof(float)) * dim);
        classify(b, exec, out_x_.data(), normed_.data(), logits_dev_.data(), n_out);
    };
    if (!capture) {
        forward();
    } else {
        // What the captured calls depend on besides buffer contents.
        StepSignature sig;
        sig.add(std::uint64_t(n));
        sig.add(std::uint64_t(p.max_n));
        sig.add(std::uint64_t(exec.attention.tiled() ? exec.attention.tile : 0));  // the attention kernel's
        for (int r : p.out_rows) sig.add(std::uint64_t(r));
        for (const void* ptr :
             {(const void*)act_.x.data(), (const void*)tokens_.data(), (const void*)positions_.data(),
              (const void*)kv_.data(), (const void*)slots_.data(), (const void*)kv_head_.data(),
              (const void*)out_x_.data(), (const void*)normed_.data(), (const void*)logits_dev_.data()})
            sig.add(ptr);
        b.run(sig, forward);
        for (int l = 0; l < c.n_layers; l++) stored(l);
    }
    logits_.resize(std::size_t(n_out) * c.vocab_size);
    memory.download(logits_.data(), logits_dev_.data(), std::int64_t(sizeof(float)) * n_out * c.vocab_size);
    return logits_;
}

void CachedDecoder::observe_layer(int l, int max_n, int n, Cache* fed) {
    const int n_heads = backend_->config().n_heads;
    probe_host_.resize(std::size_t(n_heads) * n);  // [n_heads, n]
    assert(probe_host_.size() == std::size_t(n_heads) * std::size_t(n));
    for (int h = 0; h < n_heads; h++)
        backend_->memory().download(probe_host_.data() + std::size_t(h) * n,
                                    probe_dev_.data() + std::int64_t(h) * max_n, std::int64_t(sizeof(float)) * n);
    if (observer) observer->attention_weights(l, n, probe_host_);
    if (fed) fed->attention_weights(l, probe_host_);
}

// The backends probe one row per step: a cache that reads its weights steps one row, alone.
int CachedDecoder::fed_row(const StepPlan& p) {
    int fed = -1;
    for (const StepPlan::Sequence& seq : p.seqs) {
        if (!seq.cache->reads_attention()) continue;
        if (p.seqs.size() != 1 || seq.n_rows != 1)
            throw Error(
                fmt::format("{} reads its query's attention weights: it steps one row alone, not {} rows of {} "
                            "sequences",
                            seq.cache->name(), p.rows(), p.seqs.size()));
        fed = seq.first_row;
    }
    return fed;
}

int AttentionProbe::watch(const StepPlan& plan) {
    // The model's n_heads is the head map's length; n_layers and max_seq are the cache's (the
    // decoder checked they are the model's).
    const Config& c = plan.seqs.at(0).cache->config();
    const int row = plan.seqs[0].first_row + plan.seqs[0].n_rows - 1;
    n_heads_ = int(plan.kv_head.size()), max_seq_ = c.max_seq;
    n = plan.kv[std::size_t(row)].n;
    weights.assign(std::size_t(c.n_layers) * n_heads_ * max_seq_, 0.0f);  // [n_layers, n_heads, max_seq]
    return row;
}

void AttentionProbe::attention_weights(int l, int count, std::span<const float> w) {
    assert(count == n && w.size() == std::size_t(n_heads_) * count);  // [n_heads, n]
    for (int h = 0; h < n_heads_; h++)
        std::copy_n(w.data() + std::size_t(h) * count, count,
                    weights.data() + (std::size_t(l) * n_heads_ + h) * std::size_t(max_seq_));
}

std::vector<float> calibrate_kv_scales(const Model& model, std::span<const int> tokens, KVFormat format) {
    if (!kv_format_scaled(int(format)))
        throw Error(fmt::format("KV scales: {} takes no scale (fp8-e5m2 and fp8-e4m3 do)", kv_format_name(format)));
    const Config& c = model.config();
    ContiguousCache cache(c);
    CachedDecoder(model, cache).prefill(tokens);
    const FloatFormat f = float_format(int(format));
    const float largest = decode_float(f, f.max_finite());
    std::vector<float> scales(std::size_t(2 * c.n_layers), 1.0f);  // [n_layers, 2]
    assert(scales.size() == std::size_t(2 * c.n_layers));
    for (int l = 0; l < c.n_layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            float amax = 0.0f;
            for (int t = 0; t < cache.length(); t++)
                for (int h = 0; h < c.n_kv_heads; h++) {
                    const float* row = kv ? cache.value(l, h, t) : cache.key(l, h, t);
                    for (int d = 0; d < c.head_size(); d++) amax = std::max(amax, std::fabs(row[d]));
                }
            if (amax > 0.0f && std::isfinite(amax)) scales[std::size_t(2 * l + kv)] = amax / largest;
        }
    return scales;
}

}  // namespace kvlab
