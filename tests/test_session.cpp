// The viewer's session: the snapshots the panels draw come from the real decoders, step by step,
// and say what the caches and the pool really hold.
#include <catch2/catch.hpp>
#include <set>

#include "device.h"
#include "host_backend.h"
#include "planted.h"
#include "session.h"
#include "test_util.h"

using namespace kvlab;
using namespace kvlab::viz;

namespace {

// A random model (no files needed): 2 layers, 4 query heads over 2 KV heads. The prompt is BOS
// plus the bytes of "abcdefgh": 9 tokens.
Settings small(Variant v, int steps = 12) {
    Settings s;
    s.variant = v;
    s.random_model = true;
    s.shape = Config::parse("n_layers=2,n_heads=4,n_kv_heads=2", stories260k_shape());
    s.prompt = "abcdefgh";
    s.steps = steps;
    return s;
}

std::vector<std::shared_ptr<const Step>> run_all(const Session& session) {
    REQUIRE(session.wait_for(session.info().total_steps - 1));
    INFO(session.failure());
    CHECK(session.failure().empty());
    return session.steps();
}

bool has_event(const Step& s, EventKind kind) {
    for (const CacheEvent& e : s.events)
        if (e.kind == kind) return true;
    return false;
}

}  // namespace

TEST_CASE("session: every variant publishes one step per prefill and decode step, and A grows by one per decode") {
    for (Variant v : kVariants) {
        INFO(to_string(v));
        const Session session(small(v));
        const SessionInfo& info = session.info();
        const auto steps = run_all(session);
        REQUIRE(int(steps.size()) == info.total_steps);
        const int P = int(info.prompt.size());
        CHECK(P == 9);
        for (const auto& s : steps) {
            CHECK(s->index == int(&s - &steps[0]));
            // The attention snapshot: [n_layers, n_heads, n_attended], over A's newest row.
            CHECK(s->weights.size() == std::size_t(info.config.n_layers) * info.config.n_heads * s->attended.size());
            CHECK(s->attended.back() == s->length - 1);
            // A window row attends the sinks, then the last `window` positions (StreamingLLM); FIFO
            // has no sinks; H2O's layer 0 KV head 0 attends its budget, the latest `recent` included.
            std::vector<int> expect;
            const int pos = s->length - 1, window = info.settings.window, recent = info.settings.recent;
            const int sinks = v == Variant::window ? info.settings.sinks : 0;
            if (v == Variant::h2o) {
                CHECK(int(s->attended.size()) == std::min(pos + 1, recent + info.settings.heavy));
                REQUIRE(s->kept.size() >= s->attended.size());
                CHECK(std::equal(s->attended.begin(), s->attended.end(), s->kept.begin()));
                for (int t = std::max(0, pos - recent + 1); t <= pos; t++)
                    CHECK(std::find(s->attended.begin(), s->attended.end(), t) != s->attended.end());
                continue;
            }
            const bool evicts = v == Variant::window || v == Variant::fifo;
            for (int t = 0; t <= pos; t++)
                if (!evicts || t < sinks || t > pos - window) expect.push_back(t);
            CHECK(s->attended == expect);
        }
        const Step& last = *steps.back();
        CHECK(last.length == P + info.settings.steps);
        CHECK(last.phase == Step::Phase::decode);
        CHECK(last.first_pos == last.length - 1);
        CHECK(last.n_new == 1);
    }
}

TEST_CASE("session: exact variants are bitwise equal to naive decode at every step, and int4 is not") {
    for (Variant v : {Variant::contiguous_head, Variant::paged, Variant::prefix_shared}) {
        INFO(to_string(v));
        const Session session(small(v));
        CHECK(session.info().exact);
        for (const auto& s : run_all(session))
            for (const Exactness& e : s->exact) {
                CHECK(e.bitwise_equal);
                CHECK(e.max_ulp == 0);
                CHECK(e.n_differ == 0);
            }
    }
    Settings q = small(Variant::quantized);
    q.quant_bits = 4;
    const Session session(q);
    CHECK_FALSE(session.info().exact);
    bool all_equal = true;
    for (const auto& s : run_all(session))
        for (const Exactness& e : s->exact) {
            all_equal = all_equal && e.bitwise_equal;
            CHECK((e.n_differ > 0) == !e.bitwise_equal);
        }
    CHECK_FALSE(all_equal);
}

TEST_CASE("session on gpu-host: naive and cached equal each other and the CPU's naive decode at every step") {
    for (Variant v : {Variant::contiguous_head, Variant::paged, Variant::prefix_shared, Variant::window,
                      Variant::quantized}) {
        INFO(to_string(v));
        Settings st = small(v);
        st.device = "gpu-host";
        const Session session(st);
        CHECK(session.info().device == "gpu-host");
        int checked = 0;
        for (const auto& s : run_all(session))
            for (const Exactness& e : s->exact) {
                CHECK(e.cross_device);
                CHECK(e.naive_equals_cpu);
                if (is_exact(v)) CHECK(e.cached_equals_cpu);
                if (is_exact(v)) CHECK(e.equal());
                checked++;
            }
        CHECK(checked >= session.info().total_steps);
    }
    // On the CPU there is nothing to compare across.
    const Session cpu(small(Variant::paged));
    for (const auto& s : run_all(cpu))
        for (const Exactness& e : s->exact) CHECK_FALSE(e.cross_device);
}

TEST_CASE("session, counter-test: a split-K kernel on gpu-host is equal naive-to-cached but not to the CPU") {
    Settings st = small(Variant::paged);
    st.device = "gpu-host";
    st.make_backend = [](std::string_view, const Model& m) -> std::unique_ptr<Backend> {
        return std::make_unique<ProductBackend>(std::make_unique<GpuHostBackend>(m), m, test::matmul_two_halves,
                                                ProductBackend::Products::weights);
    };
    const Session session(st);
    bool any_off = false;
    for (const auto& s : run_all(session))
        for (const Exactness& e : s->exact) {
            CHECK(e.bitwise_equal);  // one device's naive and cached share the planted kernel
            if (!e.naive_equals_cpu) CHECK(e.max_ulp_cpu > 0);
            any_off = any_off || !e.equal();
        }
    CHECK(any_off);
}

TEST_CASE("session: a device this machine lacks, or an unknown one, is a one-line error") {
    Settings st = small(Variant::contiguous_head);
    st.device = "tpu";
    CHECK_THROWS_WITH(Session(st), Catch::Contains("'tpu'"));
    st.device = "gpu";
    if (!gpu_unavailable().empty()) {
        CHECK_THROWS_WITH(Session(st), Catch::Equals(gpu_unavailable()));
        CHECK(viewer_devices() == std::vector<std::string>{"cpu", "gpu-host"});
    } else {
        CHECK(viewer_devices().back() == "gpu");
        st.variant = Variant::quantized;
        CHECK_THROWS_WITH(Session(st), Catch::Contains("quantizes on the host"));
    }
}

TEST_CASE("session: prefix sharing, fork and free show up in the pool snapshots as they happen") {
    Settings st = small(Variant::prefix_shared, 16);
    st.block_size = 4;
    st.fork_at = 2;  // A holds 11 positions then: its last block is partly filled
    st.free_fork_at = 9;
    const Session session(st);
    const auto steps = run_all(session);
    // Step 1 is B's prefill: the prefix cache serves A's two full prompt blocks (8 of 9 tokens).
    CHECK(steps[1]->label == "prefill B (prefix hit 8)");
    CHECK(has_event(*steps[1], EventKind::prefix_hit));
    bool forked = false, copied = false, freed = false;
    for (const auto& s : steps) {
        const PoolView& pool = *s->pool;
        int used = 0;
        for (int b = 0; b < pool.n_blocks; b++) {
            CHECK(int(pool.owners[std::size_t(b)].size()) == pool.refcount[std::size_t(b)]);
            used += pool.state[std::size_t(b)] == PoolView::State::used;
        }
        CHECK(used == pool.n_used);
        CHECK(pool.n_free + pool.n_cached + pool.n_used == pool.n_blocks);
        forked = forked || s->seqs.size() == 3;
        copied = copied || has_event(*s, EventKind::copy_on_write);
        freed = freed || (s->seqs.size() == 3 && !s->seqs[2].alive);
    }
    CHECK(forked);
    CHECK(copied);  // A and C write into their shared, partly filled last block
    CHECK(freed);
}

TEST_CASE("session: bad settings are one-line errors before any thread starts") {
    struct Bad {
        Variant variant;
        void (*edit)(Settings&);
        const char* needle;
    };
    const Bad cases[] = {
        {Variant::contiguous_head, [](Settings& s) { s.steps = 600; }, "max_seq"},  // 9 + 600 > 512
        {Variant::paged, [](Settings& s) { s.block_size = 0; }, "block_size"},
        {Variant::paged, [](Settings& s) { s.n_blocks = 1; }, "n_blocks"},
        {Variant::quantized, [](Settings& s) { s.quant_bits = 3; }, "bits"},
        {Variant::window, [](Settings& s) { s.window = 0; }, "window"},
        {Variant::prefix_shared, [](Settings& s) { s.free_fork_at = s.fork_at; }, "free it later"},
        {Variant::contiguous_head, [](Settings& s) { s.shape.n_kv_heads = 3; }, "n_kv_heads"},
    };
    for (const Bad& b : cases) {
        Settings s = small(b.variant);
        b.edit(s);
        INFO(b.needle);
        try {
            const Session session(s);
            FAIL("accepted");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find(b.needle) != std::string::npos);
            CHECK(std::string(e.what()).find('\n') == std::string::npos);
        }
    }
}

TEST_CASE("session: a pool too small for the run stops with a message, never a crash") {
    Settings s = small(Variant::paged, 20);
    s.block_size = 4;
    s.n_blocks = 4;  // 16 positions; the run needs 29
    const Session session(s);
    session.wait_for(1000);
    CHECK(session.done());
    CHECK(session.n_steps() == 1 + (16 - 9));  // the prefill, then decode up to 16 positions
    CHECK(session.failure().find("stopped") != std::string::npos);
}

TEST_CASE("session in a KV format: exact, and the bits panel's K row is what layer 0 computes and the cache holds") {
    for (KVFormat f : kKVFormats)
        for (Variant v : {Variant::contiguous_head, Variant::paged, Variant::prefix_shared}) {
            INFO(to_string(v) << " in " << kv_format_name(f));
            Settings s = small(v, 6);
            s.kv_format = f;
            const Session session(s);
            CHECK(session.info().kv_format == f);
            for (const auto& st : run_all(session)) {
                for (const Exactness& e : st->exact) CHECK(e.bitwise_equal);  // the format-aware naive decode
                const int hs = session.info().config.head_size();
                REQUIRE(int(st->k_fp32.size()) == hs);
                REQUIRE(int(st->k_codes.size()) == hs);
                REQUIRE(int(st->k_held.size()) == hs);
                for (int d = 0; d < hs; d++) {
                    const float x = st->k_fp32[std::size_t(d)];
                    if (kv_format_int(int(f))) {
                        // The code in its group's range, fitted from the fp32 row; the cache holds its value.
                        const int group = kv_int_group(hs), bits = kv_int_bits(int(f));
                        const QuantRange r = quant_fit(st->k_fp32.data() + d / group * group, group, 1, bits);
                        REQUIRE(int(st->k_groups.size()) == hs);
                        CHECK(float_bits(st->k_groups[std::size_t(d)].scale) == float_bits(r.scale));
                        CHECK(st->k_codes[std::size_t(d)] == quant_encode(x, r, bits));
                        CHECK(float_bits(st->k_held[std::size_t(d)]) ==
                              float_bits(quant_decode(quant_encode(x, r, bits), r)));
                        continue;
                    }
                    // The code is the format's conversion of the fp32 value, and the cache holds its value.
                    const std::uint32_t want =
                        f == KVFormat::fp32 ? float_bits(x) : encode_float(float_format(int(f)), x);
                    CHECK(st->k_codes[std::size_t(d)] == want);
                    CHECK(float_bits(st->k_held[std::size_t(d)]) == float_bits(store_value(int(f), x)));
                }
            }
        }
    // A variant that stores K and V its own way refuses a format before the session starts.
    Settings q = small(Variant::quantized, 2);
    q.kv_format = KVFormat::bf16;
    CHECK_THROWS_WITH(Session(q), Catch::Contains("stores K and V in its own way"));
}

TEST_CASE("session: --mla-rank follows A's tokens with an MLA model whose latent cache holds its stated bytes") {
    Settings s = small(Variant::contiguous_head);
    s.mla_rank = 3;
    const Session session(s);
    const SessionInfo& info = session.info();
    CHECK(info.mla_rank == 3);
    const int row = 3 + info.mla_rope_dim;
    for (const auto& st : run_all(session)) {
        CHECK(st->mla_length == st->length);
        CHECK(st->mla_bytes == std::int64_t(4) * info.config.n_layers * row * st->length);
        CHECK(st->mla_newest.size() == std::size_t(info.config.n_layers) * std::size_t(row));
    }
    // Without it, nothing of MLA is recorded.
    const Session plain(small(Variant::contiguous_head));
    CHECK(plain.info().mla_rank == 0);
    CHECK(run_all(plain).back()->mla_length == 0);
}
