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
#include "model_loader.h"
#include "paged.h"
#include "sampler.h"
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

}  // namespace

// One sequence the session decodes.
struct Seq {
    int id = 0;
    std::string name;
    std::unique_ptr<Cache> cache;
    std::vector<float> logits;       // [vocab_size] cached logits of its last row
    std::optional<Sampler> sampler;  // none: greedy
    bool alive = true;
    int next = 0;  // the token it appends next, drawn from its logits
};

// Members are destroyed in reverse order: the sequences give their blocks back to the pool, and
// both record those events, so the trace is declared first and the pool before the sequences;
// every cache's rows live in the backend's memory, so the backend comes before them all.
struct Session::Impl {
    std::vector<CacheEvent> events;
    std::optional<LoadedModel> lm_;  // set once, first thing in the constructor
    LoadedModel& lm() { return *lm_; }
    std::unique_ptr<Backend> backend;  // the chosen device's
    std::unique_ptr<BlockPool> pool;
    std::vector<Seq> seqs;  // A, then B and C for prefix_shared
    std::optional<NaiveDecoder> naive;
    std::optional<NaiveDecoder> cpu_naive;  // the reference when the decoders run elsewhere
    std::optional<CachedDecoder> cached;  // runs A's prefill and every batched decode step
    CachedDecoder::AttentionProbe probe;
    std::vector<int> last_attended;  // A's latest row: what it attended and with which weights
    std::vector<float> last_weights;
};

Session::Session(const Settings& s) : impl_(std::make_unique<Impl>()) {
    info_.settings = s;
    Impl& m = *impl_;
    Config shape = s.shape.dim ? s.shape : stories260k_shape();
    if (s.random_model) {
        shape.validate();
        m.lm_.emplace(LoadedModel{random_model(shape, s.seed), std::nullopt, fmt::format("random (seed {})", s.seed)});
    } else {
        m.lm_.emplace(load_model(s.model_path, s.tokenizer_path, shape, s.seed));
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
    const int T = P + s.steps;

    // A's cache (with its pool when paged), checked here so that bad settings fail before the
    // worker starts. Every event goes to one trace, split into steps as they are published.
    CacheSpec spec;
    spec.variant = s.variant;
    spec.model_identity = m.lm().model.w.fingerprint();
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
        default: break;
    }
    m.backend = s.make_backend ? s.make_backend(s.device, m.lm().model) : make_backend(s.device, m.lm().model);
    info_.device = std::string(m.backend->name());
    if (s.variant == Variant::quantized && !m.backend->memory().host_visible())
        throw Error(fmt::format("the quantized cache quantizes on the host: run it on cpu or gpu-host, not {}",
                                info_.device));
    CacheAndPool a = make_cache(c, spec, m.backend->memory());
    m.pool = std::move(a.pool);
    if (m.pool) m.pool->trace = &m.events;
    a.cache->trace = &m.events;
    info_.cache_name = a.cache->name();
    info_.exact = is_exact(s.variant);
    info_.total_steps = 1 + (s.variant == Variant::prefix_shared ? 1 : 0) + s.steps;
    info_.kv_bytes_per_token = kv_bytes(c, 1);
    m.seqs.reserve(3);  // A, B, C: run() holds references to them while B and C are added
    m.seqs.push_back(Seq{0, "A", std::move(a.cache), {}, std::nullopt, true});
    m.naive.emplace(*m.backend);
    if (info_.device != "cpu") m.cpu_naive.emplace(m.lm().model);
    m.cached.emplace(*m.backend, *m.seqs[0].cache);
    m.cached->probe = &m.probe;
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
    Seq& A = m.seqs[0];

    // Freezes what the panels need after a step.
    auto snapshot = [&](Step& st) {
        for (const Seq& q : m.seqs) {
            SeqView v{q.id, q.name, q.alive, {}, {}};
            if (q.alive) {
                v.tokens.assign(q.cache->tokens().begin(), q.cache->tokens().end());
                if (auto* p = dynamic_cast<const PagedCache*>(q.cache.get())) v.table = p->block_table();
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
            const MemoryStats ms = q.cache->memory();
            st.kv_used_bytes += ms.used_bytes;
            if (!m.pool) st.kv_reserved_bytes += ms.reserved_bytes;
        }
        st.length = A.cache->length();
        if (auto* w = dynamic_cast<const WindowCache*>(A.cache.get()))
            for (int t = 0; t < st.length; t++) st.resident.push_back(w->resident(t));
        st.events = std::move(m.events);
        m.events.clear();
        st.attended = m.last_attended;
        st.weights = m.last_weights;
    };
    // A's newest row: the positions it attended (the cache's own list) and the weights.
    std::vector<std::int64_t> slots(std::size_t(c.max_seq));  // [max_seq]
    auto take_probe = [&] {
        const int pos = A.cache->length() - 1;
        m.last_attended.assign(std::size_t(c.max_seq), -1);
        const int n = A.cache->attended(pos, slots.data(), m.last_attended.data());
        assert(n == m.probe.n);
        m.last_attended.resize(std::size_t(n));
        m.last_weights.resize(std::size_t(c.n_layers) * c.n_heads * std::size_t(n));  // [n_layers, n_heads, n]
        for (int lh = 0; lh < c.n_layers * c.n_heads; lh++)
            std::copy_n(m.probe.weights.data() + std::size_t(lh) * std::size_t(c.max_seq), n,
                        m.last_weights.data() + std::size_t(lh) * std::size_t(n));
    };
    auto next_token = [&](Seq& q) {
        if (!q.sampler) return argmax(q.logits);
        std::vector<float> scratch = q.logits;  // the sampler works in place
        return q.sampler->sample(scratch);
    };
    // Naive decode of q's whole sequence against q's cached logits; q's next token is drawn here.
    auto check = [&](Step& st, Seq& q) {
        q.next = next_token(q);
        const auto t0 = Clock::now();
        const std::uint64_t f0 = m.naive->exec.flops;
        const std::vector<float>& ln = m.naive->forward(q.cache->tokens());
        st.naive_seconds += seconds(t0);
        st.naive_flops += m.naive->exec.flops - f0;
        const BitComparison cmp = compare_bits(ln, q.logits);
        Exactness e;
        e.seq = q.id;
        e.bitwise_equal = cmp.equal;
        e.max_ulp = std::int64_t(std::min<std::uint64_t>(cmp.max_ulp, std::numeric_limits<std::int64_t>::max()));
        e.n_differ = cmp.n_differ;
        e.max_abs = cmp.max_abs;
        e.next_token = q.next;
        e.top_cached = top5(info_, q.logits);
        e.top_naive = top5(info_, ln);
        if (m.cpu_naive) {
            const std::vector<float>& ref = m.cpu_naive->forward(q.cache->tokens());
            const BitComparison n = compare_bits(ref, ln), k = compare_bits(ref, q.logits);
            e.cross_device = true;
            e.naive_equals_cpu = n.equal;
            e.cached_equals_cpu = k.equal;
            e.max_ulp_cpu = std::int64_t(
                std::min<std::uint64_t>(std::max(n.max_ulp, k.max_ulp), std::numeric_limits<std::int64_t>::max()));
        }
        st.exact.push_back(std::move(e));
    };
    try {
        // Step 0: A's prompt as one prefill.
        {
            auto st = std::make_shared<Step>();
            st->phase = Step::Phase::prefill;
            st->label = "prefill A";
            st->first_pos = 0;
            st->n_new = int(info_.prompt.size());
            const auto t0 = Clock::now();
            const std::uint64_t f0 = m.cached->exec.flops;
            A.logits = m.cached->prefill(info_.prompt);
            st->cached_seconds = seconds(t0);
            st->cached_flops = m.cached->exec.flops - f0;
            take_probe();
            check(*st, A);
            snapshot(*st);
            publish(std::move(st));
        }
        // prefix_shared: B asks for the same prompt and maps A's published full blocks.
        if (s.variant == Variant::prefix_shared && !stop_) {
            auto st = std::make_shared<Step>();
            Seq b{1,
                  "B",
                  std::make_unique<PagedCache>(*m.pool, m.lm().model.w.fingerprint(), 1),
                  {},
                  Sampler(c.vocab_size, 0.8f, 0.9f, 11),
                  true};
            b.cache->trace = &m.events;
            CachedDecoder dec(*m.backend, *b.cache);
            const auto t0 = Clock::now();
            b.logits = dec.extend(info_.prompt);
            st->cached_seconds = seconds(t0);
            st->cached_flops = dec.exec.flops;
            st->phase = Step::Phase::prefill;
            st->label = fmt::format("prefill B (prefix hit {})", dec.prefix_hit());
            st->first_pos = A.cache->length();
            check(*st, b);
            m.seqs.push_back(std::move(b));
            snapshot(*st);
            publish(std::move(st));
        }
        for (int d = 1; d <= s.steps && !stop_; d++) {
            auto st = std::make_shared<Step>();
            st->phase = Step::Phase::decode;
            st->label = "decode";
            // prefix_shared: A forks into C after decode step fork_at; C may be freed later.
            if (s.variant == Variant::prefix_shared && d == s.fork_at + 1 && m.seqs.size() == 2) {
                Seq cs{2,
                       "C",
                       static_cast<PagedCache&>(*A.cache).fork(2),
                       A.logits,
                       Sampler(c.vocab_size, 0.8f, 0.9f, 23),
                       true};
                cs.cache->trace = &m.events;
                cs.next = next_token(cs);  // C draws its own next token from A's logits
                m.seqs.push_back(std::move(cs));
                st->label = "fork A -> C, decode";
            }
            if (s.free_fork_at > 0 && d == s.free_fork_at + 1 && m.seqs.size() == 3 && m.seqs[2].alive) {
                m.seqs[2].cache.reset();
                m.seqs[2].alive = false;
                st->label = "free C, decode";
            }
            std::vector<Seq*> live;
            for (Seq& q : m.seqs)
                if (q.alive) live.push_back(&q);
            std::vector<std::vector<int>> toks;
            std::vector<Cache*> caches;
            for (Seq* q : live) {
                toks.push_back({q->next});
                caches.push_back(q->cache.get());
            }
            st->first_pos = A.cache->length();
            st->n_new = 1;
            const auto t0 = Clock::now();
            const std::uint64_t f0 = m.cached->exec.flops;
            std::vector<float> logits;
            try {
                logits = m.cached->step(caches, toks);
            } catch (const Error& e) {
                // The pool ran dry (the step changed nothing): stop here and say so.
                st->note = fmt::format("stopped: {}", e.what());
                std::lock_guard lock(mu_);
                failure_ = st->note;
                break;
            }
            st->cached_seconds = seconds(t0);
            st->cached_flops = m.cached->exec.flops - f0;
            for (std::size_t i = 0; i < live.size(); i++)
                live[i]->logits.assign(logits.begin() + std::ptrdiff_t(i) * c.vocab_size,
                                       logits.begin() + std::ptrdiff_t(i + 1) * c.vocab_size);
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
