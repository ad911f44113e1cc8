// Kernel by kernel: each function of gpu/kernels.h, run over its whole grid by the host launcher
// (gpu/host_backend.h), equals its CPU kernel (core/kernels.h, kernels.cpp, CpuBackend) bit for
// bit over generated shapes and values, extreme values included (-inf, inf, huge, denormal),
// and counts the same FLOPs.
#include <rapidcheck/catch.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "cpu_backend.h"
#include "host_backend.h"
#include "kernels.h"
#include "test_util.h"

using namespace kvlab;
using kvlab::first_difference;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Ordinary values (multiples of 2^-18 in [-4, 4)), mixed with denormals, tiny and large ones.
// finite_only leaves out the infinities (a product kernel turns inf * 0 into NaN).
rc::Gen<float> gen_value(bool finite_only = true) {
    std::vector<float> special = {0.0f, -0.0f, 1e-40f, -3e-42f, 1.4e-45f, 1e-30f, -2e-38f, 1e15f, -7e14f};
    if (!finite_only) special.insert(special.end(), {kInf, -kInf, 3e38f, -3.4e38f, 88.8f, -104.0f, -87.5f});
    return rc::gen::weightedOneOf<float>(
        {{6, rc::gen::map(rc::gen::inRange(-(1 << 20), 1 << 20), [](int i) { return float(i) / float(1 << 18); })},
         {1, rc::gen::elementOf(special)}});
}

std::vector<float> gen_values(std::int64_t n, bool finite_only = true) {
    return *rc::gen::container<std::vector<float>>(std::size_t(n), gen_value(finite_only));
}

void expect_bits(std::span<const float> gpu_host, std::span<const float> cpu, const std::string& what) {
    if (auto diff = first_difference(gpu_host, cpu)) RC_FAIL(what + ": " + *diff);
}

// Model configs for the backend-level kernels: 1-3 layers, 1-4 heads, GQA, head_size 1-9.
rc::Gen<Config> gen_config() {
    return rc::gen::resize(test::kFullSize, rc::gen::exec([] {
                               Config c;
                               c.n_layers = *rc::gen::inRange(1, 4);
                               c.n_heads = *rc::gen::inRange(1, 5);
                               c.n_kv_heads = *proofs::gen_n_kv_heads(c.n_heads);
                               c.dim = c.n_heads * *rc::gen::inRange(1, 10);
                               c.hidden_dim = *rc::gen::inRange(1, 17);
                               c.vocab_size = *rc::gen::inRange(1, 17);
                               c.max_seq = *rc::gen::inRange(1, 17);
                               return c;
                           }));
}

}  // namespace

TEST_CASE("gpu kernels: the product element equals the CPU's tiled product, bit for bit", "[gpu-kernels]") {
    rc::prop("matmul over rows 0-6, n_in 0-40, n_out 0-70, strides past the width", [] {
        const int rows = *test::full_range(0, 7), n_in = *test::full_range(0, 41), n_out = *test::full_range(0, 71);
        const int ldx = n_in + *rc::gen::inRange(0, 3), ldw = n_out + *rc::gen::inRange(0, 3);
        const int ldy = n_out + *rc::gen::inRange(0, 3);
        const std::vector<float> x = gen_values(std::int64_t(rows) * ldx);  // [rows, ldx]
        const std::vector<float> w = gen_values(std::int64_t(n_in) * ldw);  // [n_in, ldw]
        std::vector<float> a(std::size_t(rows) * ldy, 0.5f), b = a, r = a;  // [rows, ldy]
        Exec ex;
        gpu::host::matmul(a.data(), ldy, x.data(), ldx, w.data(), ldw, rows, n_in, n_out);
        kvlab::matmul(ex, b.data(), ldy, x.data(), ldx, w.data(), ldw, rows, n_in, n_out);
        matmul_reference(ex, r.data(), ldy, x.data(), ldx, w.data(), ldw, rows, n_in, n_out);
        expect_bits(a, b, fmt::format("matmul {}x{}x{} vs the CPU's", rows, n_in, n_out));
        expect_bits(a, r, fmt::format("matmul {}x{}x{} vs matmul_reference", rows, n_in, n_out));
    });
}

TEST_CASE("gpu kernels: rmsnorm, RoPE, silu_mul and add elements equal the CPU kernels, bit for bit",
          "[gpu-kernels]") {
    rc::prop("each element kernel over its grid", [] {
        Exec ex;
        const int rows = *test::full_range(1, 5), dim = *test::full_range(1, 71);
        {
            const std::vector<float> x = gen_values(std::int64_t(rows) * dim), w = gen_values(dim);
            std::vector<float> a(x.size()), b(x.size());  // [rows, dim]
            gpu::host::rmsnorm(a.data(), x.data(), w.data(), rows, dim);
            kvlab::rmsnorm(ex, b.data(), x.data(), w.data(), rows, dim);
            expect_bits(a, b, fmt::format("rmsnorm [{}, {}]", rows, dim));
        }
        {
            const int n_heads = *test::full_range(1, 5), head_size = *test::full_range(1, 12);
            const int max_seq = *test::full_range(1, 40);
            const RopeTable table(max_seq, head_size);
            const std::vector<int> positions =
                *rc::gen::container<std::vector<int>>(std::size_t(rows), rc::gen::inRange(0, max_seq));  // [rows]
            std::vector<float> a = gen_values(std::int64_t(rows) * n_heads * head_size), b = a;
            gpu::host::rope(a.data(), rows, n_heads, head_size, positions.data(), table);
            kvlab::rope(ex, b.data(), rows, n_heads, head_size, positions, table);
            expect_bits(a, b, fmt::format("rope rows {} heads {} head_size {}", rows, n_heads, head_size));
        }
        {
            // Extreme inputs welcome: silu of +-inf, of huge and of denormal values.
            const std::int64_t n = *test::full_range(0, 100);
            const std::vector<float> h3 = gen_values(n, false);
            std::vector<float> a = gen_values(n, false), b = a;
            gpu::host::silu_mul(a.data(), h3.data(), n);
            kvlab::silu_mul(ex, b.data(), h3.data(), n);
            expect_bits(a, b, fmt::format("silu_mul n = {}", n));
            gpu::host::add(a.data(), h3.data(), n);
            kvlab::add(ex, b.data(), h3.data(), n);
            expect_bits(a, b, fmt::format("add n = {}", n));
        }
    });
}

TEST_CASE("gpu kernels: softmax by recomputed scores equals kernels.cpp softmax, -inf, huge and denormal inputs too",
          "[gpu-kernels]") {
    rc::prop("softmax over 1-40 values", [] {
        const int n = *test::full_range(1, 41);
        const std::vector<float> x = gen_values(n, false);  // [n]
        std::vector<float> a(x.size()), b = x;
        gpu::host::softmax(a.data(), x.data(), n);
        kvlab::softmax(b.data(), n);
        expect_bits(a, b, fmt::format("softmax n = {}", n));
    });
    // A masked row as naive attention builds it: exact zeros after the first entry.
    const std::vector<float> masked = {0.25f, -kInf, -kInf, -kInf};
    std::vector<float> a(4), b = masked;
    gpu::host::softmax(a.data(), masked.data(), 4);
    kvlab::softmax(b.data(), 4);
    CHECK(!first_difference(a, b));
    CHECK(a == std::vector<float>{1.0f, 0.0f, 0.0f, 0.0f});
}

TEST_CASE("gpu kernels: embed, naive attention, K/V store and cached attention equal the CPU backend's, bit for bit",
          "[gpu-kernels]") {
    rc::prop("backend calls on generated shapes; FLOP counts equal", [] {
        const Config c = *gen_config();
        const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
        const Model m = random_model(c, seed);
        CpuBackend cpu(m);
        GpuHostBackend host(m);
        Exec ec, eh;
        const int hs = c.head_size(), kv_dim = c.kv_dim();
        const std::vector<int> kv_head = kv_head_map(c);  // [n_heads]

        // embed: x[rows, dim]
        const int rows = *test::full_range(1, 6);
        const std::vector<int> tokens =
            *rc::gen::container<std::vector<int>>(std::size_t(rows), rc::gen::inRange(0, c.vocab_size));
        std::vector<float> xa(std::size_t(rows) * c.dim), xb(xa.size());
        host.embed(eh, xa.data(), tokens.data(), rows);
        cpu.embed(ec, xb.data(), tokens.data(), rows);
        expect_bits(xa, xb, "embed");

        // Naive attention over T rows: q, att [T, dim]; k, v [T, kv_dim].
        const int T = *test::full_range(1, 12);
        const std::vector<float> q = gen_values(std::int64_t(T) * c.dim), k = gen_values(std::int64_t(T) * kv_dim),
                                 v = gen_values(std::int64_t(T) * kv_dim);
        std::vector<float> aa(q.size(), 7.0f), ab(q.size(), 7.0f);  // [T, dim]
        host.causal_attention(eh, aa.data(), q.data(), k.data(), v.data(), T, kv_head.data());
        cpu.causal_attention(ec, ab.data(), q.data(), k.data(), v.data(), T, kv_head.data());
        expect_bits(aa, ab, fmt::format("causal_attention T = {}", T));

        // A cache storage of n_slots rows per (layer, KV head), every row NaN until stored:
        // k, v [n_layers, n_kv_heads, n_slots, head_size].
        const int n_slots = *test::full_range(1, 10), n_rows = *test::full_range(1, 4);
        const std::int64_t storage_n = std::int64_t(c.n_layers) * c.n_kv_heads * n_slots * hs;
        std::vector<float> ska(std::size_t(storage_n), kNaN), sva = ska, skb = ska, svb = ska;
        const int l = *rc::gen::inRange(0, c.n_layers);
        std::vector<RowKV> ra(static_cast<std::size_t>(n_rows));  // [n_rows]
        const int max_n = *test::full_range(1, 12);
        std::vector<std::int64_t> slots(std::size_t(n_rows) * max_n, -1);  // [n_rows, max_n]
        for (int i = 0; i < n_rows; i++) {
            RowKV& r = ra[std::size_t(i)];
            r.layer_rows = std::int64_t(c.n_kv_heads) * n_slots;
            r.head_rows = n_slots;
            r.write_slot = *rc::gen::inRange(0, n_slots);
            r.n = *rc::gen::inRange(1, max_n + 1);
            // Slots in any order, repeats allowed, some -1 (a position the cache does not hold).
            for (int t = 0; t < r.n; t++)
                slots[std::size_t(i) * max_n + t] = *rc::gen::weightedOneOf<std::int64_t>(
                    {{8, rc::gen::inRange<std::int64_t>(0, n_slots)}, {1, rc::gen::just<std::int64_t>(-1)}});
        }
        std::vector<RowKV> rb = ra;
        for (RowKV& r : ra) r.k = ska.data(), r.v = sva.data();
        for (RowKV& r : rb) r.k = skb.data(), r.v = svb.data();
        // Fill every layer, so attention reads stored rows, then the written ones.
        const std::vector<float> nk = gen_values(std::int64_t(n_rows) * kv_dim),
                                 nv = gen_values(std::int64_t(n_rows) * kv_dim);  // [n_rows, kv_dim]
        for (int layer = 0; layer < c.n_layers; layer++) {
            host.store_kv(eh, ra.data(), n_rows, layer, nk.data(), nv.data());
            cpu.store_kv(ec, rb.data(), n_rows, layer, nk.data(), nv.data());
        }
        expect_bits(ska, skb, "store_kv keys");
        expect_bits(sva, svb, "store_kv values");
        const std::vector<float> qc = gen_values(std::int64_t(n_rows) * c.dim);  // [n_rows, dim]
        std::vector<float> oa(qc.size(), 7.0f), ob(qc.size(), 7.0f);
        const int probe_row = *rc::gen::inRange(-1, n_rows);
        std::vector<float> pa(std::size_t(c.n_heads) * max_n, 3.0f), pb = pa;  // [n_heads, max_n]
        host.attention(eh, oa.data(), qc.data(), ra.data(), n_rows, l, slots.data(), max_n, kv_head.data(), probe_row,
                       pa.data());
        cpu.attention(ec, ob.data(), qc.data(), rb.data(), n_rows, l, slots.data(), max_n, kv_head.data(), probe_row,
                      pb.data());
        expect_bits(oa, ob, fmt::format("attention at layer {}, {} rows", l, n_rows));
        expect_bits(pa, pb, fmt::format("attention probe of row {}", probe_row));
        RC_ASSERT(eh.flops == ec.flops);
    });
}

TEST_CASE("naive attention past one row tile (T > 1024): the CPU's tiles equal the per-row kernel, bit for bit",
          "[gpu-kernels][tiles]") {
    // CpuBackend::causal_attention forms S and P [tile, T] at a time (tile = 2^20 / T rows); the
    // host-launched kernel computes each row alone. At these T the last tile is partial.
    Config c = stories260k_shape();
    c.dim = 8, c.hidden_dim = 8, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 1, c.vocab_size = 8;
    c.max_seq = 2100;
    const Model m = random_model(c, 3);
    CpuBackend cpu(m);
    GpuHostBackend host(m);
    const std::vector<int> kv_head = kv_head_map(c);  // [n_heads]
    for (int T : {1025, 2100}) {
        {
            SplitMix64 rng(std::uint64_t(T) * 2);
            const auto values = [&](std::int64_t n) {
                std::vector<float> v(static_cast<std::size_t>(n));
                for (float& x : v) x = float(rng.gaussian());
                return v;
            };
            const std::vector<float> q = values(std::int64_t(T) * c.dim), k = values(std::int64_t(T) * c.kv_dim()),
                                     v = values(std::int64_t(T) * c.kv_dim());
            std::vector<float> aa(q.size(), 7.0f), ab(q.size(), 7.0f);  // [T, dim]
            Exec eh, ec;
            host.causal_attention(eh, aa.data(), q.data(), k.data(), v.data(), T, kv_head.data());
            cpu.causal_attention(ec, ab.data(), q.data(), k.data(), v.data(), T, kv_head.data());
            const auto diff = first_difference(aa, ab);
            INFO("T = " << T << ": " << (diff ? *diff : std::string("equal")));
            CHECK(!diff);
            CHECK(eh.flops == ec.flops);
        }
    }
}
