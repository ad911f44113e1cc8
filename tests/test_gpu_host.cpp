// The GPU's per-thread code (gpu/kernels.h), launched on the host over the whole grid
// (GpuHostBackend, "gpu-host"), decodes exactly as the CPU backend does: naive and cached, on
// every cache layout and in batched steps, bit for bit at every step, with the same FLOP counts.
// A planted kernel bug shows the property can fail.
#include <rapidcheck/catch.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpu_backend.h"
#include "decode.h"
#include "device.h"
#include "host_backend.h"
#include "paged.h"
#include "planted.h"
#include "test_util.h"
#include "window_cache.h"

using namespace kvlab;
using kvlab::first_difference;

namespace {

// Configs small enough that 100 cases of four decoders run in a second: 1-3 layers, 1-4 query
// heads with n_kv_heads any divisor (GQA), head_size 1-12 (odd ones included: RoPE leaves the
// last element alone), hidden_dim 1-32, vocab 1-32, max_seq 1-24.
rc::Gen<Config> gen_gpu_config() {
    return rc::gen::resize(test::kFullSize, rc::gen::exec([] {
                               Config c;
                               c.n_layers = *rc::gen::inRange(1, 4);
                               c.n_heads = *rc::gen::inRange(1, 5);
                               c.n_kv_heads = *proofs::gen_n_kv_heads(c.n_heads);
                               c.dim = c.n_heads * *rc::gen::inRange(1, 13);
                               c.hidden_dim = *rc::gen::inRange(1, 33);
                               c.vocab_size = *rc::gen::inRange(1, 33);
                               c.max_seq = *rc::gen::inRange(1, 25);
                               return c;
                           }));
}

// The cache layouts a cached decoder runs on, each built twice (CPU run, gpu-host run) from
// the same parameters.
enum class Layout { head_major, seq_major, paged, window };

struct CacheCase {
    Layout layout = Layout::head_major;
    int block_size = 1;         // paged: 1-8
    int sinks = 0, window = 1;  // window: 0-3 sinks, window 1-8
};

struct Built {
    std::unique_ptr<BlockPool> pool;
    std::unique_ptr<Cache> cache;
};

Built build(const Config& c, const CacheCase& k) {
    Built b;
    switch (k.layout) {
        case Layout::head_major:
            b.cache = std::make_unique<ContiguousCache>(c, ContiguousCache::Layout::head_major);
            break;
        case Layout::seq_major:
            b.cache = std::make_unique<ContiguousCache>(c, ContiguousCache::Layout::seq_major);
            break;
        case Layout::paged:
            b.pool = std::make_unique<BlockPool>(c, k.block_size, (c.max_seq + k.block_size - 1) / k.block_size);
            b.cache = std::make_unique<PagedCache>(*b.pool);
            break;
        case Layout::window: b.cache = std::make_unique<WindowCache>(c, k.sinks, k.window); break;
    }
    return b;
}

const char* layout_name(Layout l) {
    switch (l) {
        case Layout::head_major: return "contiguous head-major";
        case Layout::seq_major: return "contiguous seq-major";
        case Layout::paged: return "paged";
        case Layout::window: return "window";
    }
    return "?";
}

// The property's body: on a generated case, four decoders (naive and cached, on the CPU and
// on gpu-host) agree bit for bit at every step, and each gpu-host decoder counts the FLOPs its
// CPU twin counts. A window cache is compared with its CPU twin at every step and with naive
// decode only while it is exact (T <= sinks + window). The first `prompt_len` tokens are a
// prefill, the rest decoded one at a time. planted: a product the gpu-host decoders run instead
// of their kernels (ProductBackend).
void check_gpu_host_decode(Layout layout, MatmulFn planted = nullptr) {
    const Config c = *gen_gpu_config();
    const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
    const std::vector<int> tokens = test::gen_tokens(c);
    const int prompt_len = *rc::gen::inRange(1, int(tokens.size()) + 1);
    CacheCase k;
    k.layout = layout;
    if (layout == Layout::paged) k.block_size = *rc::gen::inRange(1, std::min(8, c.max_seq) + 1);
    if (layout == Layout::window) {
        k.sinks = *rc::gen::inRange(0, 4);
        k.window = *rc::gen::inRange(1, 9);
    }
    const Model m = random_model(c, seed);
    CpuBackend cpu(m);
    GpuHostBackend gpu_host(m);
    const std::unique_ptr<Backend> planted_host =
        planted ? std::make_unique<ProductBackend>(gpu_host, m, planted) : nullptr;
    Backend& host = planted_host ? *planted_host : gpu_host;
    Built cpu_cache = build(c, k), host_cache = build(c, k);
    NaiveDecoder cpu_naive(cpu), host_naive(host);
    CachedDecoder cpu_cached(cpu, *cpu_cache.cache), host_cached(host, *host_cache.cache);
    // Simple or tiled attention (tiles of 1-8 keys, so that rows span several), for all four.
    AttentionSpec attention;
    if (*rc::gen::arbitrary<bool>()) attention = {AttentionSpec::Kind::tiled, *rc::gen::inRange(1, 9)};
    for (Exec* ex : {&cpu_naive.exec, &host_naive.exec, &cpu_cached.exec, &host_cached.exec}) ex->attention = attention;
    // The probe (softmax weights of the last row) must agree too; it changes no logit.
    AttentionProbe cpu_probe, host_probe;
    if (layout == Layout::head_major) cpu_cached.observer = &cpu_probe, host_cached.observer = &host_probe;
    const int exact_until = layout == Layout::window ? k.sinks + k.window : c.max_seq;
    const std::string where = fmt::format("{} cache, {}, model seed {}, {} attention", layout_name(layout),
                                          c.describe(), seed, attention_name(attention));
    for (int T = prompt_len; T <= int(tokens.size()); T++) {
        const std::span<const int> prefix(tokens.data(), std::size_t(T));
        const std::span<const int> fresh = T == prompt_len ? prefix : prefix.subspan(std::size_t(T - 1));
        const std::vector<float> lcc = cpu_cached.prefill(fresh);
        const std::vector<float> lhc = host_cached.prefill(fresh);
        const std::vector<float> lcn = cpu_naive.forward(prefix);
        const std::vector<float> lhn = host_naive.forward(prefix);
        auto expect_equal = [&](const std::vector<float>& a, const std::vector<float>& b, const char* what) {
            if (auto diff = first_difference(a, b))
                RC_FAIL(fmt::format("{} at T = {} (prompt {} tokens), {}: {}", what, T, prompt_len, where, *diff));
        };
        expect_equal(lhc, lcc, "gpu-host cached vs cpu cached");
        expect_equal(lhn, lcn, "gpu-host naive vs cpu naive");
        if (T <= exact_until) expect_equal(lhc, lhn, "gpu-host cached vs gpu-host naive");
        if (cpu_cached.observer) {
            RC_ASSERT(host_probe.n == cpu_probe.n);
            expect_equal(host_probe.weights, cpu_probe.weights, "gpu-host probe vs cpu probe");
        }
    }
    RC_ASSERT(host_naive.exec.flops == cpu_naive.exec.flops);
    RC_ASSERT(host_cached.exec.flops == cpu_cached.exec.flops);
}

// Batched steps: 2-3 sequences, each appending 1-3 tokens per step for 1-4 steps, all rows of a
// step in one CachedDecoder::step (on contiguous caches, or paged caches of one pool). gpu-host
// equals the CPU's batch, and each sequence's logits equal naive decode of its own prefix.
void check_gpu_host_batch() {
    const int n_seqs = *rc::gen::inRange(2, 4), n_steps = *rc::gen::inRange(1, 5);
    Config c = *gen_gpu_config();
    c.max_seq = 3 * n_steps;  // room for the longest sequence
    const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
    const bool paged = *rc::gen::arbitrary<bool>();
    const int block_size = *rc::gen::inRange(1, std::min(8, c.max_seq) + 1);
    // chunks[step][s]: the tokens sequence s appends at that step.
    std::vector<std::vector<std::vector<int>>> chunks(static_cast<std::size_t>(n_steps));
    for (auto& step : chunks)
        for (int s = 0; s < n_seqs; s++)
            step.push_back(*rc::gen::container<std::vector<int>>(std::size_t(*rc::gen::inRange(1, 4)),
                                                                 rc::gen::inRange(0, c.vocab_size)));
    const Model m = random_model(c, seed);
    CpuBackend cpu(m);
    GpuHostBackend host(m);
    // The sequences' caches, one set per backend.
    struct Batch {
        std::unique_ptr<BlockPool> pool;
        std::vector<std::unique_ptr<Cache>> caches;
        std::vector<Cache*> ptrs;
    };
    auto make_batch = [&] {
        Batch b;
        const int per_seq = (c.max_seq + block_size - 1) / block_size;
        if (paged) b.pool = std::make_unique<BlockPool>(c, block_size, n_seqs * per_seq);
        for (int s = 0; s < n_seqs; s++) {
            if (paged)
                b.caches.push_back(std::make_unique<PagedCache>(*b.pool, 0, s));
            else
                b.caches.push_back(std::make_unique<ContiguousCache>(c));
            b.ptrs.push_back(b.caches.back().get());
        }
        return b;
    };
    Batch cpu_batch = make_batch(), host_batch = make_batch();
    CachedDecoder cpu_dec(cpu, *cpu_batch.ptrs[0]), host_dec(host, *host_batch.ptrs[0]);
    NaiveDecoder naive(host);
    AttentionSpec attention;  // simple or tiled, for all three
    if (*rc::gen::arbitrary<bool>()) attention = {AttentionSpec::Kind::tiled, *rc::gen::inRange(1, 9)};
    for (Exec* ex : {&cpu_dec.exec, &host_dec.exec, &naive.exec}) ex->attention = attention;
    std::vector<std::vector<int>> seqs(static_cast<std::size_t>(n_seqs));  // each sequence's tokens so far
    const std::string where = fmt::format("{} sequences on {} caches, {}, model seed {}, {} attention", n_seqs,
                                          paged ? fmt::format("paged (block {})", block_size) : "contiguous",
                                          c.describe(), seed, attention_name(attention));
    for (int step = 0; step < n_steps; step++) {
        const std::vector<float> lc = cpu_dec.step(cpu_batch.ptrs, chunks[std::size_t(step)]);
        const std::vector<float> lh = host_dec.step(host_batch.ptrs, chunks[std::size_t(step)]);
        if (auto diff = first_difference(lh, lc))
            RC_FAIL(fmt::format("gpu-host batch vs cpu batch at step {}, {}: {}", step, where, *diff));
        for (int s = 0; s < n_seqs; s++) {
            auto& seq = seqs[std::size_t(s)];
            seq.insert(seq.end(), chunks[std::size_t(step)][std::size_t(s)].begin(),
                       chunks[std::size_t(step)][std::size_t(s)].end());
            const std::span<const float> row(lh.data() + std::size_t(s) * c.vocab_size, std::size_t(c.vocab_size));
            if (auto diff = first_difference(row, naive.forward(seq)))
                RC_FAIL(fmt::format("gpu-host batch row {} vs gpu-host naive at step {}, {}: {}", s, step, where,
                                    *diff));
        }
    }
    RC_ASSERT(host_dec.exec.flops == cpu_dec.exec.flops);
}

}  // namespace

TEST_CASE("gpu-host: naive and cached decode equal the CPU's, bit for bit, at every step (contiguous head-major)",
          "[gpu-host]") {
    rc::prop("four decoders, one set of bits; probe weights and FLOP counts equal too",
             [] { check_gpu_host_decode(Layout::head_major); });
}

TEST_CASE("gpu-host: naive and cached decode equal the CPU's, bit for bit, at every step (contiguous seq-major)",
          "[gpu-host]") {
    rc::prop("four decoders, one set of bits", [] { check_gpu_host_decode(Layout::seq_major); });
}

TEST_CASE("gpu-host: naive and cached decode equal the CPU's, bit for bit, at every step (paged, blocks of 1-8)",
          "[gpu-host]") {
    rc::prop("four decoders, one set of bits", [] { check_gpu_host_decode(Layout::paged); });
}

TEST_CASE("gpu-host: a window cache decodes as the CPU's window cache, bit for bit, and as naive while exact",
          "[gpu-host]") {
    rc::prop("gpu-host window = cpu window at every step; = naive while T <= sinks + window",
             [] { check_gpu_host_decode(Layout::window); });
}

TEST_CASE("gpu-host: batched steps equal the CPU's batch and each sequence's naive decode, bit for bit",
          "[gpu-host][batch]") {
    rc::prop("batch logits equal, row by row", [] { check_gpu_host_batch(); });
}

TEST_CASE("gpu-host counter-test: a split-K product kernel is caught and shrunk", "[gpu-host][counter]") {
    const auto failure =
        test::run_to_failure([] { check_gpu_host_decode(Layout::head_major, test::matmul_two_halves); });
    REQUIRE(failure);
    const std::string example = test::counterexample_text(*failure);
    INFO("shrunk counterexample:\n" << example << failure->description);
    CHECK(!failure->reproduce.shrinkPath.empty());
    CHECK(failure->description.find("gpu-host cached vs cpu cached") != std::string::npos);
    std::printf("planted bug (split-K product element) caught after %d passing cases, shrunk in %zu steps to:\n%s\n",
                failure->numSuccess, failure->reproduce.shrinkPath.size(), example.c_str());
}

TEST_CASE("make_backend names cpu, gpu-host and gpu, and a GPU it cannot use is a one-line error", "[gpu-host][device]") {
    const Model m = random_model(Config{8, 8, 1, 2, 1, 5, 4}, 1);
    CHECK(make_backend("cpu", m)->name() == "cpu");
    CHECK(make_backend("gpu-host", m)->name() == "gpu-host");
    CHECK(&make_backend("gpu-host", m)->memory() == &host_memory());
    CHECK_THROWS_WITH(make_backend("tpu", m), "unknown device 'tpu': use cpu, gpu or gpu-host");
    const std::string why = gpu_unavailable();
    if (!gpu_built()) CHECK_THAT(why, Catch::StartsWith("this build of kvlab has no GPU support"));
    if (!why.empty()) {
        CHECK_THROWS_WITH(make_backend("gpu", m), why);
        CHECK(why.find('\n') == std::string::npos);
    } else {
        CHECK(make_backend("gpu", m)->name() == "gpu");
    }
}
