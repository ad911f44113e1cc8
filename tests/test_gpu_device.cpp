// The CUDA backend on a real device against the CPU, bit for bit. Built only when CMake found
// nvcc; each test exits 77 (ctest: skipped) when the CUDA runtime offers no device, printing why.
// The number of generated cases comes from RapidCheck's RC_PARAMS (default 100), so a session
// with a GPU can ask for more: RC_PARAMS="max_success=1000" ctest -R test_gpu_device.
#include <rapidcheck/catch.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "cpu_backend.h"
#include "cuda_backend.h"
#include "decode.h"
#include "device.h"
#include "paged.h"
#include "sampler.h"
#include "test_util.h"

using namespace kvlab;
using kvlab::first_difference;

namespace {

// True (after printing why) when there is no device; under ctest's one-test filter, exits 77.
bool no_device() {
    const std::string why = gpu_unavailable();
    if (why.empty()) return false;
    std::printf("SKIPPED: %s\n", why.c_str());
    std::fflush(stdout);
    if (Catch::getCurrentContext().getConfig()->hasTestFilters()) std::exit(77);
    return true;
}
#define KVLAB_GPU_OR_SKIP() \
    if (no_device()) return

std::unique_ptr<CudaBackend> cuda(const Model& m, bool graphs) { return std::make_unique<CudaBackend>(m, graphs); }

}  // namespace

TEST_CASE("gpu: CUDA naive and cached decode equal the CPU's, bit for bit, at every step, graphs on and off",
          "[gpu]") {
    KVLAB_GPU_OR_SKIP();
    rc::prop("CPU naive = CPU cached = CUDA naive = CUDA cached (graph) = CUDA cached (no graph); FLOPs equal", [] {
        const auto [c, seed, tokens, prompt_len] = test::gen_decode_case();
        const Model m = random_model(c, seed);
        const bool paged = *rc::gen::arbitrary<bool>();
        const int block_size = *rc::gen::inRange(1, std::min(9, c.max_seq + 1));
        const auto graph = cuda(m, true), plain = cuda(m, false);
        // The device caches: contiguous seq-major, or paged (blocks of 1-8, at most max_seq).
        auto device_cache = [&](CudaBackend& b, std::unique_ptr<BlockPool>& pool) -> std::unique_ptr<Cache> {
            if (!paged) return std::make_unique<ContiguousCache>(c, ContiguousCache::Layout::seq_major, b.memory());
            pool = std::make_unique<BlockPool>(c, block_size, (c.max_seq + block_size - 1) / block_size, false,
                                               b.memory());
            return std::make_unique<PagedCache>(*pool);
        };
        std::unique_ptr<BlockPool> graph_pool, plain_pool;
        const auto graph_cache = device_cache(*graph, graph_pool), plain_cache = device_cache(*plain, plain_pool);
        NaiveDecoder cpu_naive(m), gpu_naive(*plain);
        CachedDecoder cpu_cached(m), gpu_graph(*graph, *graph_cache), gpu_plain(*plain, *plain_cache);
        const int pl = prompt_len;
        for (int T = pl; T <= int(tokens.size()); T++) {
            const std::span<const int> prefix(tokens.data(), std::size_t(T));
            const std::span<const int> fresh = T == pl ? prefix : prefix.subspan(std::size_t(T - 1));
            const std::vector<float> ref = cpu_cached.prefill(fresh);
            const std::vector<float> cpu_n = cpu_naive.forward(prefix);
            const std::vector<float> gn = gpu_naive.forward(prefix);
            const std::vector<float> gg = gpu_graph.prefill(fresh);
            const std::vector<float> gp = gpu_plain.prefill(fresh);
            const std::string where = fmt::format("T = {} (prompt {}), {} cache, {}, seed {}", T, pl,
                                                  paged ? "paged" : "seq-major", c.describe(), seed);
            for (const auto& [what, got] : {std::pair{"cpu naive", &cpu_n}, std::pair{"cuda naive", &gn},
                                            std::pair{"cuda cached (graph)", &gg},
                                            std::pair{"cuda cached (no graph)", &gp}})
                if (auto diff = first_difference(*got, ref))
                    RC_FAIL(fmt::format("{} vs cpu cached at {}: {}", what, where, *diff));
        }
        RC_ASSERT(gpu_naive.exec.flops == cpu_naive.exec.flops);
        RC_ASSERT(gpu_graph.exec.flops == cpu_cached.exec.flops);
        RC_ASSERT(gpu_plain.exec.flops == cpu_cached.exec.flops);
        RC_ASSERT(graph->graphs_captured() >= 1);
        RC_ASSERT(plain->graphs_captured() == 0);
    });
}

TEST_CASE("gpu: caches in every KV format (codes on the device) decode as the CPU's, bit for bit", "[gpu][kv-format]") {
    KVLAB_GPU_OR_SKIP();
    rc::prop("CPU format-aware naive = CPU cached = CUDA naive = CUDA cached, graphs on, fp8 with scales", [] {
        const auto [c, seed, tokens, prompt_len] = test::gen_decode_case();
        const Model m = random_model(c, seed);
        const KVFormat format = kKVFormats[std::size_t(*rc::gen::inRange(1, int(std::size(kKVFormats))))];
        std::vector<float> scales;
        if (kv_format_scaled(int(format)))
            for (int i = 0; i < 2 * c.n_layers; i++) scales.push_back(float(*rc::gen::inRange(1, 64)) / 16.0f);
        const auto gpu = cuda(m, true);
        const bool paged = *rc::gen::arbitrary<bool>();
        std::unique_ptr<BlockPool> pool;
        std::unique_ptr<Cache> device_cache;
        if (paged) {
            const int bs = *rc::gen::inRange(1, std::min(9, c.max_seq + 1));
            pool = std::make_unique<BlockPool>(c, bs, (c.max_seq + bs - 1) / bs, false, gpu->memory());
            pool->set_kv_format(format, scales);
            device_cache = std::make_unique<PagedCache>(*pool);
        } else {
            device_cache = std::make_unique<ContiguousCache>(c, ContiguousCache::Layout::head_major, gpu->memory());
            device_cache->set_kv_format(format, scales);
        }
        ContiguousCache host_cache(c);
        host_cache.set_kv_format(format, scales);
        NaiveDecoder cpu_naive(m), gpu_naive(*gpu);
        for (NaiveDecoder* n : {&cpu_naive, &gpu_naive}) n->kv_format = format, n->kv_scales = scales;
        CachedDecoder cpu_cached(m, host_cache), gpu_cached(*gpu, *device_cache);
        const int pl = prompt_len;
        for (int T = pl; T <= int(tokens.size()); T++) {
            const std::span<const int> prefix(tokens.data(), std::size_t(T));
            const std::span<const int> fresh = T == pl ? prefix : prefix.subspan(std::size_t(T - 1));
            const std::vector<float> ref = cpu_naive.forward(prefix);
            const std::string where =
                fmt::format("T = {} (prompt {}), {} cache in {}, {}, seed {}", T, pl, paged ? "paged" : "head-major",
                            kv_format_name(format), c.describe(), seed);
            for (const auto& [what, got] : {std::pair{"cpu cached", cpu_cached.prefill(fresh)},
                                            std::pair{"cuda naive", gpu_naive.forward(prefix)},
                                            std::pair{"cuda cached", gpu_cached.prefill(fresh)}})
                if (auto diff = first_difference(got, ref))
                    RC_FAIL(fmt::format("{} vs cpu naive at {}: {}", what, where, *diff));
        }
    });
}

TEST_CASE("gpu: a replayed graph decodes as the first capture did (decode steps reuse one graph)", "[gpu]") {
    KVLAB_GPU_OR_SKIP();
    const Config c{32, 48, 2, 4, 2, 40, 24};
    const Model m = random_model(c, 11);
    const auto graph = cuda(m, true);
    CachedDecoder dev(*graph);
    CachedDecoder cpu(m);
    const std::vector<int> prompt = {1, 2, 3};
    CHECK(!first_difference(dev.prefill(prompt), cpu.prefill(prompt)));
    for (int t = 0; t < 20; t++) {
        const int token = (7 * t + 5) % c.vocab_size;
        const auto diff = first_difference(dev.decode(token), cpu.decode(token));
        INFO("decode step " << t << ": " << diff.value_or("equal"));
        REQUIRE(!diff);
    }
    // One graph for the prefill and one for every single-row step after it.
    CHECK(graph->graphs_captured() == 2);
    CHECK(graph->graph_replays() == 19);
    CHECK(dev.exec.flops == cpu.exec.flops);
}

TEST_CASE("gpu: paged copy-on-write happens on the device and both sequences stay exact", "[gpu][paged]") {
    KVLAB_GPU_OR_SKIP();
    const Config c{16, 8, 2, 4, 2, 32, 12};
    const Model m = random_model(c, 6);
    for (const bool graphs : {false, true}) {
        const auto b = cuda(m, graphs);
        BlockPool pool(c, 4, 6, false, b->memory());
        std::vector<CacheEvent> events;
        pool.trace = &events;
        PagedCache parent(pool, 0, 0);
        CachedDecoder(*b, parent).prefill(std::vector<int>{1, 2, 3, 4, 5, 6});  // blocks 0 and 1, half full
        auto child = parent.fork(1);
        const std::vector<float> lc = CachedDecoder(*b, *child).decode(7);  // copies the shared partial block
        const std::vector<float> lp = CachedDecoder(*b, parent).decode(9);  // writes its own block
        CHECK(std::count_if(events.begin(), events.end(),
                            [](const CacheEvent& e) { return e.kind == EventKind::copy_on_write; }) == 1);
        CHECK(pool.shared_writes() == 0);
        NaiveDecoder naive(m);
        CHECK(!first_difference(lc, naive.forward(std::vector<int>{1, 2, 3, 4, 5, 6, 7})));
        CHECK(!first_difference(lp, naive.forward(std::vector<int>{1, 2, 3, 4, 5, 6, 9})));
    }
}

// A prefix pool keys its blocks by model, so one pool may serve two models (verify's prefix-shared
// row). Each model has its own CudaBackend: the pool made on one must serve the other's decoder.
// (Each backend once had its own memory and stream, and refused the other's pool.)
TEST_CASE("gpu: a pool made on one model's backend serves another model's decoder, both exact", "[gpu][paged]") {
    KVLAB_GPU_OR_SKIP();
    const Config c{16, 8, 2, 4, 2, 32, 12};
    const Model ma = random_model(c, 8), mb = random_model(c, 9);
    const auto a = cuda(ma, true), b = cuda(mb, true);
    CHECK(&a->memory() == &b->memory());
    BlockPool pool(c, 4, 8, true, a->memory());
    const std::vector<int> tokens{1, 2, 3, 4, 5, 6, 7};
    PagedCache seq_a(pool, ma.w.fingerprint(), 0), seq_b(pool, mb.w.fingerprint(), 1);
    const std::vector<float> la = CachedDecoder(*a, seq_a).prefill(tokens);
    const std::vector<float> lb = CachedDecoder(*b, seq_b).prefill(tokens);
    CHECK(!first_difference(la, NaiveDecoder(ma).forward(tokens)));
    CHECK(!first_difference(lb, NaiveDecoder(mb).forward(tokens)));
}

TEST_CASE("gpu: exp_f32 on the device gives the host's bits (every 257th float bit pattern)", "[gpu][exp]") {
    KVLAB_GPU_OR_SKIP();
    const Model m = random_model(Config{8, 8, 1, 1, 1, 4, 4}, 1);
    const auto b = cuda(m, false);
    std::vector<float> x, host, dev;
    for (std::uint64_t u = 0; u <= 0xffffffffull; u += 257) x.push_back(float_from_bits(std::uint32_t(u)));
    host.resize(x.size());
    dev.resize(x.size());
    for (std::size_t i = 0; i < x.size(); i++) host[i] = exp_f32(x[i]);
    b->exp_f32_on_device(dev.data(), x.data(), std::int64_t(x.size()));
    const auto diff = first_difference(dev, host);
    INFO(diff.value_or("equal"));
    CHECK(!diff);
}

TEST_CASE("gpu: device memory errors are one line", "[gpu][errors]") {
    KVLAB_GPU_OR_SKIP();
    const Model m = random_model(Config{8, 8, 1, 1, 1, 4, 4}, 1);
    const auto b = cuda(m, false);
    try {
        Buffer<float> huge(b->memory(), std::int64_t{1} << 48);  // 1 PiB
        FAIL("a 1 PiB allocation succeeded");
    } catch (const Error& e) {
        const std::string what = e.what();
        CHECK_THAT(what, Catch::StartsWith("out of GPU memory: cannot allocate"));
        CHECK(what.find('\n') == std::string::npos);
    }
    // The backend still works afterwards.
    CachedDecoder dev(*b);
    CHECK(!first_difference(dev.decode(1), CachedDecoder(m).decode(1)));
}

TEST_CASE("gpu: stories260K, 200 greedy steps on the device give the CPU's tokens and logits", "[gpu][stories260k]") {
    KVLAB_GPU_OR_SKIP();
    KVLAB_MODEL_FILE_OR_SKIP(model_path, "stories260K.bin");
    const Model m = load_checkpoint(model_path);
    const auto b = cuda(m, true);
    CachedDecoder cpu(m), dev(*b);
    NaiveDecoder dev_naive(*b);
    std::vector<int> tokens = {1};  // BOS
    std::vector<float> lc = cpu.prefill(tokens), ld = dev.prefill(tokens);
    int equal_steps = 0;
    for (int step = 0; step < 200; step++) {
        const auto diff = first_difference(ld, lc);
        const auto diff_naive = first_difference(dev_naive.forward(tokens), lc);
        INFO("step " << step << ", T = " << tokens.size() << ": cached " << diff.value_or("equal") << ", naive "
                     << diff_naive.value_or("equal"));
        REQUIRE(!diff);
        REQUIRE(!diff_naive);
        equal_steps++;
        const int next = argmax(lc);
        if (next == 1) break;
        tokens.push_back(next);
        if (step + 1 < 200) lc = cpu.decode(next), ld = dev.decode(next);
    }
    CHECK(equal_steps == 200);
    CHECK(dev.exec.flops == cpu.exec.flops);
}
