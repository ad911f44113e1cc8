#include "session.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <limits>
#include <optional>

#include "cache_factory.h"
#include "compare.h"
#include "decode.h"
#include "device.h"
#include "h2o_cache.h"
#include "mla.h"
#include "model_loader.h"
#include "paged.h"
#include "sampler.h"
#include "sequence_engine.h"
#include "window_cache.h"

namespace kvlab::viz {

std::vector<std::string> viewer_devices() {
    std::vector<std::string> d{"cpu", "gpu-host"};
    if (gpu_unavailable().empty()) d.push_back("gpu");
    return d;
}

std::string token_text(const SessionInfo& info, int id) {
    if (id >= 0 && id < int(info.pieces.size())) return Tokenizer::printable(info.pieces[std::size_t(id)]);
    return fmt::format("<{}>", id);
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The five largest logits, largest first (ties: lower id first).
std::vector<TopToken> top5(const SessionInfo& info, std::span<const float> logits) {
    std::vector<int> ids(logits.size());
    for (std::size_t i = 0; i < ids.size(); i++) ids[i] = int(i);
    const std::size_t k = std::min<std::size_t>(5, ids.size());
    std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(), [&](int a, int b) {
        return logits[std::size_t(a)] > logits[std::size_t(b)] ||
               (logits[std::size_t(a)] == logits[std::size_t(b)] && a < b);
    });
    std::vector<TopToken> out;
    for (std::size_t i = 0; i < k; i++) out.push_back({ids[i], logits[std::size_t(ids[i])], token_text(info, ids[i])});
    return out;
}

// H2O: the positions each layer and KV head keeps after the step; resident is layer 0, head 0's.
void held_positions(Step& st, const H2OCache& h) {
    const Config& c = h.config();
    st.kept.clear();
    for (int l = 0; l < c.n_layers; l++)
        for (int kv = 0; kv < c.n_kv_heads; kv++)
            st.kept.insert(st.kept.end(), h.kept(l, kv).begin(), h.kept(l, kv).end());
    assert(st.kept.size() ==
           std::size_t(c.n_layers) * c.n_kv_heads * std::size_t(h.held()));  // [n_layers, n_kv_heads, held]
    st.resident.assign(std::size_t(st.length), 0);
    for (int t : h.kept(0, 0)) st.resident[std::size_t(t)] = 1;
}

// The MLA model decodes A's tokens it has not seen (absorbed form), and the step records its cache.
void follow_with_mla(Step& st, const MlaModel& mla, MlaCache& cache, std::span<const int> tokens) {
    if (cache.length() > int(tokens.size())) cache.truncate(int(tokens.size()));
    if (cache.length() < int(tokens.size()))
        MlaDecoder(mla, cache, MlaForm::absorbed).prefill(tokens.subspan(std::size_t(cache.length())));
    st.mla_length = cache.length(), st.mla_bytes = cache.used_bytes();
    const int row = mla.config.row();
    st.mla_newest.clear();
    for (int l = 0; l < mla.config.base.n_layers && cache.length() > 0; l++) {
        const float* r = cache.layer(l) + std::size_t(cache.length() - 1) * std::size_t(row);
        st.mla_newest.insert(st.mla_newest.end(), r, r + row);
    }
    assert(st.mla_newest.size() == std::size_t(mla.config.base.n_layers) * std::size_t(cache.length() > 0 ? row : 0));
}

}  // namespace

// One sequence the session decodes; its cache and logits are the engine's.
struct Seq {
    int id = 0;  // the engine's
    std::string name;
    std::optional<Sampler> sampler;  // none: greedy
    bool alive = true;
    int next = 0;  // the token it appends next, drawn from its logits
};

// Members are destroyed in reverse order: the engine's sequences give their blocks back to the
// pool, so the pool comes before the engine; every cache's rows live in the backend's memory,
// so the backend comes before them all.
struct Session::Impl {
    std::optional<LoadedModel> lm_;  // set once, first thing in the constructor
    LoadedModel& lm() { return *lm_; }
    std::unique_ptr<Backend> backend;  // the chosen device's
    std::unique_ptr<BlockPool> pool;   // the paged variants'
    std::optional<SequenceEngine> engine;  // runs every prefill and decode step
    std::vector<Seq> seqs;                 // A, then B and C for prefix_shared
    std::optional<NaiveDecoder> naive;
    std::optional<NaiveDecoder> cpu_naive;  // the reference when the decoders run elsewhere
    AttentionProbe probe;
    std::vector<int> last_attended;  // A's latest row: what it attended and with which weights
    std::vector<float> last_weights;
    std::optional<MlaModel> mla;  // settings.mla_rank > 0: a random MLA model following A's tokens
    std::optional<MlaCache> mla_cache;
};

Session::Session(const Settings& s) : impl_(std::make_unique<Impl>()) {
    info_.settings = s;
    Impl& m = *impl_;
    Config shape = s.shape.dim ? s.shape : stories260k_shape();
    if (s.random_model) {
        shape.validate();
        m.lm_.emplace(LoadedModel{random_model(shape, s.seed), std::nullopt, fmt::format("random (seed {})", s.seed)});
    } else {
        m.lm_.emplace(load_model(s.model_path, s.tokenizer_path, shape, s.seed, s.panel_cache));
    }
    const Config& c = m.lm().model.config();
    info_.config = c;
    info_.model_source = m.lm().source;
    if (m.lm().tokenizer)
        for (int i = 0; i < m.lm().tokenizer->vocab_size(); i++) info_.pieces.push_back(m.lm().tokenizer->piece(i));

    // The prompt: text through the tokenizer, or (a random model has no text) its bytes as ids.
    if (m.lm().tokenizer) {
        info_.prompt = encode_prompt(*m.lm().tokenizer, s.prompt, c.max_seq, std::max(s.steps, 0),
                                     fmt::format("{} steps", s.steps));
    } else {
        info_.prompt.push_back(1 % c.vocab_size);
        for (unsigned char ch : s.prompt) info_.prompt.push_back(int(ch) % c.vocab_size);
    }
    const int P = int(info_.prompt.size());
    if (s.steps < 1) throw Error(fmt::format("steps must be at least 1, not {}", s.steps));
    if (P + s.steps > c.max_seq)
        throw Error(fmt::format("the prompt ({} tokens) plus {} steps needs {} positions, but max_seq is {}", P,
                                s.steps, P + s.steps, c.max_seq));
    // The serving view's run, whole, before any thread starts: bad settings are errors here too.
    if (s.serve && s.beam_width > 0) throw Error("--serve and --beam are two views: give one");
    if (s.serve) serving_ = run_serving(m.lm().model, s);
    if (s.beam_width > 0) serving_ = run_beam_view(m.lm().model, s, info_.prompt);
    const int T = P + s.steps;

    // A's cache (with its pool when paged), checked here so that bad settings fail before the
    // worker starts. Every event goes to one trace, split into steps as they are published.
    CacheSpec spec = default_spec(s.variant, c);  // the registry's defaults; the viewer's settings below
    spec.model_identity = m.lm().model.w.fingerprint();
    spec.kv_format = s.kv_format;  // make_cache refuses it for a variant that takes no format
    switch (s.variant) {
        case Variant::paged:
        case Variant::prefix_shared: {
            if (s.block_size < 1 || s.block_size > c.max_seq)
                throw Error(fmt::format("block_size must be in 1..{} (max_seq), not {}", c.max_seq, s.block_size));
            if (s.variant == Variant::prefix_shared && s.free_fork_at > 0 && s.free_fork_at <= s.fork_at)
                throw Error(fmt::format("C is freed after decode step {} but forked only after step {}: free it later",
                                        s.free_fork_at, s.fork_at));
            // Enough: every sequence's blocks (A; or A, B and C), plus one for a copy-on-write.
            const int n_seqs = s.variant == Variant::prefix_shared ? 3 : 1;
            const int enough = n_seqs * ceil_div(T, s.block_size) + (n_seqs > 1 ? 1 : 0);
            spec.block_size = s.block_size;
            spec.n_blocks = s.n_blocks ? s.n_blocks : enough;
            if (spec.n_blocks < ceil_div(P, s.block_size))
                throw Error(fmt::format("n_blocks {} cannot hold the prompt's {} positions at block_size {}",
                                        spec.n_blocks, P, s.block_size));
            break;
        }
        case Variant::quantized:
            spec.quant.bits = s.quant_bits;
            spec.quant.group = default_quant_group(c);
            break;
        case Variant::window:
            if (s.sinks < 0 || s.window < 1)
                throw Error(fmt::format("window needs sinks >= 0 and window >= 1, not {} and {}", s.sinks, s.window));
            spec.sinks = s.sinks, spec.window = s.window;
            break;
        case Variant::fifo:
            if (s.window < 1) throw Error(fmt::format("fifo needs window >= 1, not {}", s.window));
            spec.window = s.window;
            break;
        case Variant::h2o:
            if (s.recent < 1 || s.heavy < 0)
                throw Error(fmt::format("h2o needs recent >= 1 and heavy >= 0, not {} and {}", s.recent, s.heavy));
            spec.recent = s.recent, spec.heavy = s.heavy;
            break;
        default: break;
    }
    m.backend = s.make_backend ? s.make_backend(s.device, m.lm().model) : make_backend(s.device, m.lm().model);
    info_.device = std::string(m.backend->name());
    if (s.variant == Variant::quantized && !m.backend->memory().host_visible())
        throw Error(fmt::format("the quantized cache quantizes on the host: run it on cpu or gpu-host, not {}",
                                info_.device));
    // A first cache, made and dropped here: bad parameters throw before the worker starts.
    CacheAndPool a = make_cache(c, spec, m.backend->memory());
    info_.cache_name = a.cache->name();
    m.pool = std::move(a.pool);
    a.cache.reset();
    if (m.pool) {
        m.engine.emplace(*m.backend, *m.pool, spec.model_identity);
    } else {
        Memory& memory = m.backend->memory();
        m.engine.emplace(*m.backend, [c, spec, &memory](int) { return make_cache(c, spec, memory).cache; });
    }
    if (s.mla_rank > 0) {  // the model's shape with a latent of mla_rank and a RoPE key of one head's width
        MlaConfig mc;
        mc.base = c, mc.base.n_kv_heads = c.n_heads;
        mc.rank = s.mla_rank, mc.rope_dim = c.head_size() - c.head_size() % 2;
        m.mla.emplace(random_mla_model(mc, s.seed));
        m.mla_cache.emplace(mc);
        info_.mla_rank = mc.rank, info_.mla_rope_dim = mc.rope_dim;
    }
    m.engine->decoder().observer = &m.probe;
    m.engine->decoder().exec.attention = s.attention;
    m.engine->decoder().exec.n_threads = s.n_threads;
    info_.exact = is_exact(s.variant);
    info_.total_steps = 1 + (s.variant == Variant::prefix_shared ? 1 : 0) + s.steps;
    info_.kv_bytes_per_token = kv_bytes(c, 1, s.kv_format);
    info_.kv_format = s.kv_format;
    m.seqs.reserve(3);  // A, B, C: run() holds references to them while B and C are added
    m.naive.emplace(*m.backend);
    if (info_.device != "cpu") m.cpu_naive.emplace(m.lm().model);
    for (std::optional<NaiveDecoder>* n : {&m.naive, &m.cpu_naive})
        if (*n) {
            (*n)->kv_format = s.kv_format, (*n)->exec.attention = s.attention;  // the format-aware naive decode
            (*n)->exec.n_threads = s.n_threads;
        }
    worker_ = std::thread([this] { run(); });
}

Session::~Session() {
    stop_ = true;
    if (worker_.joinable()) worker_.join();
}

std::vector<std::shared_ptr<const Step>> Session::steps() const {
    std::lock_guard lock(mu_);
    return steps_;
}

int Session::n_steps() const {
    std::lock_guard lock(mu_);
    return int(steps_.size());
}

bool Session::wait_for(int k) const {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return int(steps_.size()) > k || done_; });
    return int(steps_.size()) > k;
}

std::string Session::failure() const {
    std::lock_guard lock(mu_);
    return failure_;
}

void Session::publish(std::shared_ptr<Step> step) {
    {
        std::lock_guard lock(mu_);
        step->index = int(steps_.size());
        steps_.push_back(std::move(step));
    }
    cv_.notify_all();
}

void Session::run() {
    Impl& m = *impl_;
    const Config& c = info_.config;
    const Settings& s = info_.settings;
    SequenceEngine& engine = *m.engine;
    CachedDecoder& cached = engine.decoder();

    // Freezes what the panels need after a step.
    // A's newest position at layer 0, KV head 0: K as layer 0 computes it (from the token and the
    // position alone: embed, rmsnorm, the wk product, RoPE, by core's kernels, which every backend
    // matches bit for bit), each element's code in the cache's format, and what the cache holds.
    auto k_row_bits = [&](Step& st, const Cache& a) {
        const Model& model = m.lm().model;
        const Weights& w = model.w;
        const int pos = a.length() - 1, hs = c.head_size(), dim = c.dim, kv_dim = c.kv_dim();
        if (pos < 0) return;
        const int token = a.tokens()[std::size_t(pos)];
        Exec ex;
        std::vector<float> x(w.token_embedding.begin() + std::ptrdiff_t(token) * dim,
                             w.token_embedding.begin() + std::ptrdiff_t(token + 1) * dim);          // [dim]
        std::vector<float> xb(static_cast<std::size_t>(dim)), k(static_cast<std::size_t>(kv_dim));  // [dim], [kv_dim]
        assert(x.size() == std::size_t(dim));
        rmsnorm(ex, xb.data(), x.data(), w.rms_att.data(), 1, dim);
        // matmul multiplies by W[in, out]; layer 0's wk is kept [kv_dim, dim] (out, in).
        const std::vector<float> wk0 = in_out_copy(w.wk.first(std::size_t(kv_dim) * dim), 1, kv_dim, dim);
        matmul(ex, k.data(), kv_dim, xb.data(), dim, wk0.data(), kv_dim, 1, dim, kv_dim);
        const int positions[] = {pos};
        rope(ex, k.data(), 1, c.n_kv_heads, hs, positions, model.rope);
        const int f = int(a.kv_format());
        const float scale = kv_format_scaled(f) ? a.storage().scale(0, 0) : 1.0f;
        st.k_scale = scale;
        st.k_fp32.assign(k.begin(), k.begin() + hs);
        if (kv_format_int(f)) {
            // Each element's group, fitted from the row as the store fits it.
            const int group = kv_int_group(hs), bits = kv_int_bits(f);
            for (int d = 0; d < hs; d++) {
                const QuantRange r = quant_fit(st.k_fp32.data() + d / group * group, group, 1, bits);
                st.k_groups.push_back(r);
                st.k_codes.push_back(quant_encode(st.k_fp32[std::size_t(d)], r, bits));
            }
        } else {
            for (float v : st.k_fp32)
                st.k_codes.push_back(f == int(KVFormat::fp32) ? float_bits(v)
                                                              : encode_float(float_format(f), v / scale));
        }
        if (a.storage().memory().host_visible()) {
            const float* held = a.key(0, 0, pos);
            st.k_held.assign(held, held + hs);
        }
    };
    auto snapshot = [&](Step& st) {
        for (const Seq& q : m.seqs) {
            SeqView v{q.id, q.name, q.alive, {}, {}};
            if (q.alive) {
                v.tokens.assign(engine.cache(q.id).tokens().begin(), engine.cache(q.id).tokens().end());
                v.table.assign(engine.block_table(q.id).begin(), engine.block_table(q.id).end());
            }
            st.seqs.push_back(std::move(v));
        }
        if (m.pool) {
            const BlockPool& bp = *m.pool;
            PoolView pv;
            pv.block_size = bp.block_size();
            pv.n_blocks = bp.n_blocks();
            pv.owners.resize(std::size_t(pv.n_blocks));
            for (const SeqView& v : st.seqs)
                for (int b : v.table) pv.owners[std::size_t(b)].push_back(v.id);
            for (int b = 0; b < pv.n_blocks; b++) {
                pv.refcount.push_back(bp.refcount(b));
                pv.published.push_back(bp.published(b));
                pv.state.push_back(bp.refcount(b) > 0 ? PoolView::State::used
                                   : bp.published(b)  ? PoolView::State::cached
                                                      : PoolView::State::free);
                assert(int(pv.owners[std::size_t(b)].size()) == bp.refcount(b));
            }
            pv.n_free = bp.n_free(), pv.n_cached = bp.n_cached(), pv.n_used = bp.n_used();
            pv.prefix_hit_positions = bp.prefix_hit_positions();
            st.kv_reserved_bytes = std::int64_t(pv.n_used) * bp.block_bytes();
            st.pool = std::move(pv);
        }
        for (const Seq& q : m.seqs) {
            if (!q.alive) continue;
            const MemoryStats ms = engine.cache(q.id).memory();
            st.kv_used_bytes += ms.used_bytes;
            if (!m.pool) st.kv_reserved_bytes += ms.reserved_bytes;
        }
        const Cache& a = engine.cache(m.seqs[0].id);
        st.length = a.length();
        if (auto* w = dynamic_cast<const WindowCache*>(&a))
            for (int t = 0; t < st.length; t++) st.resident.push_back(w->resident(t));
        if (auto* h = dynamic_cast<const H2OCache*>(&a)) held_positions(st, *h);
        if (m.mla) follow_with_mla(st, *m.mla, *m.mla_cache, a.tokens());
        st.events = engine.events();
        engine.clear_events();
        st.attended = m.last_attended;
        st.weights = m.last_weights;
        k_row_bits(st, a);
    };
    // A's newest row: the positions it attended (the cache's own list) and the weights.
    std::vector<std::int64_t> slots(std::size_t(c.max_seq));  // [max_seq]
    auto take_probe = [&] {
        const Cache& a = engine.cache(m.seqs[0].id);
        const int pos = a.length() - 1;
        m.last_attended.assign(std::size_t(c.max_seq), -1);
        const int n = a.attended(pos, slots.data(), m.last_attended.data());
        assert(n == m.probe.n);
        m.last_attended.resize(std::size_t(n));
        m.last_weights.resize(std::size_t(c.n_layers) * c.n_heads * std::size_t(n));  // [n_layers, n_heads, n]
        for (int lh = 0; lh < c.n_layers * c.n_heads; lh++)
            std::copy_n(m.probe.weights.data() + std::size_t(lh) * std::size_t(c.max_seq), n,
                        m.last_weights.data() + std::size_t(lh) * std::size_t(n));
    };
    auto next_token = [&](Seq& q) {
        std::vector<float> logits(engine.logits(q.id).begin(), engine.logits(q.id).end());
        return q.sampler ? q.sampler->sample(logits) : argmax(logits);  // the sampler works in place
    };
    // Naive decode of q's whole sequence against q's cached logits; q's next token is drawn here.
    auto check = [&](Step& st, Seq& q) {
        q.next = next_token(q);
        const auto t0 = Clock::now();
        const std::uint64_t f0 = m.naive->exec.flops;
        const std::span<const int> tokens = engine.cache(q.id).tokens();
        const std::span<const float> logits = engine.logits(q.id);
        const std::vector<float>& ln = m.naive->forward(tokens);
        st.naive_seconds += seconds(t0);
        st.naive_flops += m.naive->exec.flops - f0;
        const BitComparison cmp = compare_bits(ln, logits);
        Exactness e;
        e.seq = q.id;
        e.bitwise_equal = cmp.equal;
        e.max_ulp = std::int64_t(std::min<std::uint64_t>(cmp.max_ulp, std::numeric_limits<std::int64_t>::max()));
        e.n_differ = cmp.n_differ;
        e.max_abs = cmp.max_abs;
        e.next_token = q.next;
        e.top_cached = top5(info_, logits);
        e.top_naive = top5(info_, ln);
        if (m.cpu_naive) {
            const std::vector<float>& ref = m.cpu_naive->forward(tokens);
            const BitComparison n = compare_bits(ref, ln), k = compare_bits(ref, logits);
            e.cross_device = true;
            e.naive_equals_cpu = n.equal;
            e.cached_equals_cpu = k.equal;
            e.max_ulp_cpu = std::int64_t(
                std::min<std::uint64_t>(std::max(n.max_ulp, k.max_ulp), std::numeric_limits<std::int64_t>::max()));
        }
        st.exact.push_back(std::move(e));
    };
    // A new sequence for the prompt (A's prefill; B's prefix hit and prefill), timed, as one step.
    auto add = [&](const std::string& name, std::optional<Sampler> sampler) {
        auto st = std::make_shared<Step>();
        st->phase = Step::Phase::prefill;
        st->first_pos = m.seqs.empty() ? 0 : engine.cache(m.seqs[0].id).length();
        const auto t0 = Clock::now();
        const std::uint64_t f0 = cached.exec.flops;
        const int id = engine.add(info_.prompt);
        st->cached_seconds = seconds(t0);
        st->cached_flops = cached.exec.flops - f0;
        m.seqs.push_back(Seq{id, name, std::move(sampler), true});
        return st;
    };
    try {
        // Step 0: A's prompt as one prefill.
        {
            auto st = add("A", std::nullopt);
            st->label = "prefill A";
            st->n_new = int(info_.prompt.size());
            take_probe();
            check(*st, m.seqs[0]);
            snapshot(*st);
            publish(std::move(st));
        }
        // prefix_shared: B asks for the same prompt and maps A's published full blocks.
        if (s.variant == Variant::prefix_shared && !stop_) {
            auto st = add("B", Sampler(c.vocab_size, 0.8f, 0.9f, 11));
            st->label = fmt::format("prefill B (prefix hit {})", engine.prefix_hit(m.seqs.back().id));
            check(*st, m.seqs.back());
            snapshot(*st);
            publish(std::move(st));
        }
        for (int d = 1; d <= s.steps && !stop_; d++) {
            auto st = std::make_shared<Step>();
            st->phase = Step::Phase::decode;
            st->label = "decode";
            // prefix_shared: A forks into C after decode step fork_at; C may be freed later.
            if (s.variant == Variant::prefix_shared && d == s.fork_at + 1 && m.seqs.size() == 2) {
                Seq cs{engine.fork(m.seqs[0].id), "C", Sampler(c.vocab_size, 0.8f, 0.9f, 23), true};
                cs.next = next_token(cs);  // C draws its own next token from A's logits
                m.seqs.push_back(std::move(cs));
                st->label = "fork A -> C, decode";
            }
            if (s.free_fork_at > 0 && d == s.free_fork_at + 1 && m.seqs.size() == 3 && m.seqs[2].alive) {
                engine.free(m.seqs[2].id);
                m.seqs[2].alive = false;
                st->label = "free C, decode";
            }
            std::vector<Seq*> live;
            std::vector<int> ids;
            std::vector<std::vector<int>> toks;
            for (Seq& q : m.seqs)
                if (q.alive) live.push_back(&q), ids.push_back(q.id), toks.push_back({q.next});
            st->first_pos = engine.cache(m.seqs[0].id).length();
            st->n_new = 1;
            const auto t0 = Clock::now();
            const std::uint64_t f0 = cached.exec.flops;
            try {
                engine.step(ids, toks);
            } catch (const Error& e) {
                // The pool ran dry (the step changed nothing): stop here and say so.
                st->note = fmt::format("stopped: {}", e.what());
                std::lock_guard lock(mu_);
                failure_ = st->note;
                break;
            }
            st->cached_seconds = seconds(t0);
            st->cached_flops = cached.exec.flops - f0;
            take_probe();
            for (Seq* q : live) check(*st, *q);
            snapshot(*st);
            publish(std::move(st));
        }
    } catch (const std::exception& e) {
        std::lock_guard lock(mu_);
        failure_ = one_line(e.what());
    }
    done_ = true;
    cv_.notify_all();
}

}  // namespace kvlab::viz
