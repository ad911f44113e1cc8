// Lab 10's grader: your per-thread attention kernel, launched over the whole grid on the host as
// gpu/host_backend.cpp launches gpu/kernels.h. The kernel on its own against the CPU's
// attention_row (every output, and the probe's softmax weights, bit for bit), and P1: kvlab's
// cached decoder with your kernel in place of the GPU's equals naive decode on the CPU, bit for
// bit, over generated shapes (grouped-query attention included), contiguous and paged caches
// (blocks of 1-8) and batches. Where this machine has nvcc and a CUDA device, a last check
// compiles your file with nvcc and runs it on the GPU (device_check.cu).
// GCC 12 misreads fmt's format-spec parser as an overflow when it inlines it here (a known false
// positive; tests/CMakeLists.txt silences it for test_pool_state.cpp too).
#pragma GCC diagnostic ignored "-Wstringop-overflow"

#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "decode.h"
#include "device.h"
#include "forwarding.h"
#include "grader.h"
#include "host_backend.h"
#include "lab.h"
#include "paged.h"

using namespace kvlab;

void kvlab::lab10::throw_not_implemented(const char* what) { throw lessons::NotImplemented(what); }

namespace {

// ----------------------------------------------------------------------------------------------
// The backend: the GPU's kernels launched on the host (GpuHostBackend), with yours for attention.

class StudentAttention final : public ForwardingBackend {
public:
    explicit StudentAttention(GpuHostBackend& host) : ForwardingBackend(host) {}
    std::string_view name() const override { return "gpu-host with your attention"; }

    // GpuHostBackend::attention's launch: one call per (row, head), the grid in row-major order.
    void attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                   const std::int64_t* slots, int max_n, const int* kv_head, int probe_row, float* probe) override {
        const Config& c = config();
        const int hs = c.head_size();
        // A safety net, not part of the contract: entries past a row's n (the decoder leaves -1
        // there) repeat its last slot, plus one entry past the end, so that a kernel reading past
        // n reads wrong numbers (and fails P1) instead of memory outside the cache.
        padded_.assign(std::size_t(n_rows) * max_n + 1, 0);
        for (int i = 0; i < n_rows; i++) {
            assert(rows[i].n >= 1 && rows[i].n <= max_n);
            ex.flops += c.n_heads * attention_row_flops(hs, rows[i].n);
            const std::int64_t* s = slots + std::int64_t(i) * max_n;
            for (int t = 0; t < max_n; t++) padded_[std::size_t(i) * max_n + t] = s[std::min(t, rows[i].n - 1)];
            padded_.back() = s[rows[i].n - 1];
        }
        for (int i = 0; i < n_rows; i++)
            for (int h = 0; h < c.n_heads; h++)
                lab10::attention_head(att, q, rows, l, padded_.data(), max_n, kv_head, c.dim, hs, probe_row, probe, i,
                                      h);
    }

private:
    std::vector<std::int64_t> padded_;  // [n_rows * max_n + 1]
};

// ----------------------------------------------------------------------------------------------
// 1. The kernel on its own

// A float's bits, for messages and comparisons (NaN payloads included).
std::uint32_t bits(float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
}
bool same(float a, float b) { return bits(a) == bits(b); }
constexpr std::uint32_t kSentinelBits = 0x7fbadbadu;  // a NaN nobody computes: "not written"
float sentinel() {
    float x;
    std::memcpy(&x, &kSentinelBits, sizeof x);
    return x;
}
std::string show(float x) { return fmt::format("{:.9g} (bits 0x{:08x})", x, bits(x)); }

// One launch's inputs: a paged layout with a NaN guard row after each (layer, KV head) run.
struct KernelCase {
    int n_layers = 1, l = 0, n_heads = 1, n_kv_heads = 1, head_size = 1, dim = 1, n_rows = 1, max_n = 1;
    int block_size = 1;
    // Each query row has a cache of its own (a batch), with its own layout: per row,
    // k[i], v[i]: [n_layers, n_kv_heads, head_rows[i], head_size], NaN where no slot of row i points.
    std::vector<std::int64_t> head_rows, layer_rows;  // [n_rows]
    std::vector<std::vector<float>> k, v;             // [n_rows]
    std::vector<float> q;                             // [n_rows, dim]
    std::vector<RowKV> rows;                          // [n_rows]
    std::vector<std::int64_t> slots;                  // [n_rows * max_n + 1]; past a row's n: the guard row
    std::vector<int> kv_head;                         // [n_heads]
    std::vector<std::vector<int>> pos;                // [n_rows] the slots of each row, for messages

    std::string describe() const {
        std::string s = fmt::format(
            "{} query rows, n_heads {}, n_kv_heads {}, head_size {}, layer {} of {}, "
            "block_size {}",
            n_rows, n_heads, n_kv_heads, head_size, l, n_layers, block_size);
        for (int i = 0; i < n_rows; i++)
            s += fmt::format("; row {}: n = {}, slots [{}]", i, rows[std::size_t(i)].n,
                             fmt::join(pos[std::size_t(i)], " "));
        return s;
    }
    // Where row i's position t of head h lives in its cache, in floats.
    std::int64_t at(int i, int h, int t) const {
        const std::size_t r = std::size_t(i);
        return (l * layer_rows[r] + kv_head[std::size_t(h)] * head_rows[r] + slots[r * max_n + std::size_t(t)]) *
               head_size;
    }
    const float* key(int i, int h, int t) const { return k[std::size_t(i)].data() + at(i, h, t); }
    const float* value(int i, int h, int t) const { return v[std::size_t(i)].data() + at(i, h, t); }
};

KernelCase draw_kernel_case() {
    KernelCase kc;
    kc.n_heads = draw(1, 4);
    kc.n_kv_heads = *proofs::gen_n_kv_heads(kc.n_heads);
    kc.head_size = draw(1, 8);
    kc.dim = kc.n_heads * kc.head_size;
    kc.n_layers = draw(1, 3);
    kc.l = draw(0, kc.n_layers - 1);
    kc.n_rows = draw(1, 3);
    kc.max_n = draw(1, 20);
    kc.block_size = draw(1, 8);
    const int bs = kc.block_size, blocks = 2 * ((kc.max_n + bs - 1) / bs) + 1;
    kc.kv_head = kv_head_map([&] {
        Config c;
        c.n_heads = kc.n_heads;
        c.n_kv_heads = kc.n_kv_heads;
        c.dim = kc.dim;
        return c;
    }());
    assert(int(kc.kv_head.size()) == kc.n_heads);

    // Values: uniform in [-1, 1) times 2^e, from a drawn seed (drawing each float would make the
    // shrunk case a wall of numbers); a large e makes the softmax peaky.
    std::uint64_t state = *rc::gen::arbitrary<std::uint64_t>();
    const float scale = std::ldexp(1.0f, draw(-2, 3));
    auto next = [&] {
        state = splitmix64_finalize(state + 0x9e3779b97f4a7c15ull);
        return (float(state >> 40) / float(1 << 24) * 2 - 1) * scale;
    };
    kc.q.resize(std::size_t(kc.n_rows) * kc.dim);
    for (float& x : kc.q) x = next();
    kc.slots.assign(std::size_t(kc.n_rows) * kc.max_n + 1, 0);
    kc.rows.resize(std::size_t(kc.n_rows));
    kc.pos.resize(std::size_t(kc.n_rows));
    for (int i = 0; i < kc.n_rows; i++) {
        // blocks * bs rows per (layer, KV head) run, then 1-3 rows no slot names; the last is the
        // guard the slots past n name (and the one past the end of slots).
        const std::int64_t head_rows = std::int64_t(blocks) * bs + draw(1, 3), layer_rows = kc.n_kv_heads * head_rows;
        const std::int64_t guard = head_rows - 1;
        kc.head_rows.push_back(head_rows);
        kc.layer_rows.push_back(layer_rows);
        std::vector<float>& k = kc.k.emplace_back(std::size_t(kc.n_layers * layer_rows * kc.head_size), kNaN);
        std::vector<float>& v = kc.v.emplace_back(k.size(), kNaN);
        std::fill_n(kc.slots.begin() + std::ptrdiff_t(i) * kc.max_n, kc.max_n, guard);
        kc.slots.back() = guard;
        const int n = draw(1, kc.max_n);
        std::vector<int> table(static_cast<std::size_t>(blocks));  // a random block table: distinct blocks
        for (int b = 0; b < blocks; b++) table[std::size_t(b)] = b;
        for (int b = blocks - 1; b > 0; b--) std::swap(table[std::size_t(b)], table[std::size_t(draw(0, b))]);
        for (int t = 0; t < n; t++) {
            const std::int64_t s = std::int64_t(table[std::size_t(t / bs)]) * bs + t % bs;
            kc.slots[std::size_t(i) * kc.max_n + t] = s;
            kc.pos[std::size_t(i)].push_back(int(s));
            for (int kvh = 0; kvh < kc.n_kv_heads; kvh++)  // rows of layer l only: another layer reads NaN
                for (int d = 0; d < kc.head_size; d++) {
                    const std::size_t at = std::size_t((kc.l * layer_rows + kvh * head_rows + s) * kc.head_size + d);
                    k[at] = next(), v[at] = next();
                }
        }
        RowKV& r = kc.rows[std::size_t(i)];
        r.k = k.data();
        r.v = v.data();
        r.layer_rows = layer_rows;
        r.head_rows = head_rows;
        r.row_bytes = std::int64_t(sizeof(float)) * kc.head_size;  // fp32
        r.n = n;
    }
    return kc;
}

// Your kernel over the whole grid; att [n_rows, dim] starts as the sentinel.
std::vector<float> launch(const KernelCase& kc, int probe_row, float* probe) {
    std::vector<float> att(std::size_t(kc.n_rows) * kc.dim, sentinel());
    for (int i = 0; i < kc.n_rows; i++)
        for (int h = 0; h < kc.n_heads; h++) {
            lessons::log_case(fmt::format("attention_head(i {}, h {}, probe_row {}, max_n {}, dim {}) with {}", i, h,
                                          probe_row, kc.max_n, kc.dim, kc.describe()));
            lab10::attention_head(att.data(), kc.q.data(), kc.rows.data(), kc.l, kc.slots.data(), kc.max_n,
                                  kc.kv_head.data(), kc.dim, kc.head_size, probe_row, probe, i, h);
        }
    return att;
}

// Weights a few ulps off: the right computation, rounded differently somewhere.
constexpr std::uint64_t kFewUlps = 8;
std::string rounding_hint(std::uint64_t ulps) {
    return fmt::format(
        " ({} ulp at most): the same math rounded differently. e^x must be kvlab::exp_f32 (std::exp "
        "and the GPU's expf round their own way); the max scanned from t = 0; the sum over t ascending "
        "from +0; p_t = e_t / sum",
        ulps);
}

void check_kernel() {
    const KernelCase kc = draw_kernel_case();
    const int hs = kc.head_size;
    // The CPU: kernels.h attention_row per (row, head), and its softmax weights.
    std::vector<float> want(std::size_t(kc.n_rows) * kc.dim, sentinel());
    std::vector<float> weights(std::size_t(kc.n_rows) * kc.n_heads * kc.max_n, sentinel());  // [rows, n_heads, max_n]
    for (int i = 0; i < kc.n_rows; i++)
        for (int h = 0; h < kc.n_heads; h++)
            attention_row(
                want.data() + std::size_t(i) * kc.dim + std::size_t(h) * hs,
                kc.q.data() + std::size_t(i) * kc.dim + std::size_t(h) * hs, hs, kc.rows[std::size_t(i)].n,
                [&](int t) { return kc.key(i, h, t); }, [&](int t) { return kc.value(i, h, t); },
                weights.data() + (std::size_t(i) * kc.n_heads + std::size_t(h)) * kc.max_n);
    auto weight = [&](int i, int h, int t) {
        return weights[(std::size_t(i) * kc.n_heads + std::size_t(h)) * kc.max_n + std::size_t(t)];
    };

    const std::vector<float> got = launch(kc, -1, nullptr);
    std::size_t e = 0;
    while (e < got.size() && same(got[e], want[e])) e++;
    if (e < got.size()) {
        const int i = int(e / std::size_t(kc.dim)), h = int(e % std::size_t(kc.dim)) / hs,
                  d = int(e % std::size_t(kc.dim)) % hs;
        const int n = kc.rows[std::size_t(i)].n;
        const std::string where = fmt::format(
            "{}: att[{}][{}] (row {}, head {} reading KV head {}, element {}) is {}, "
            "the CPU's {}",
            kc.describe(), i, h * hs + d, i, h, kc.kv_head[std::size_t(h)], d, show(got[e]), show(want[e]));
        if (same(got[e], sentinel()))
            fail(where + ": your kernel did not write it (each (row, head) writes its head_size outputs)");
        // Diagnose with your softmax weights of this row, from a launch with the probe on it.
        std::vector<float> probe(std::size_t(kc.n_heads) * kc.max_n, sentinel());
        launch(kc, i, probe.data());
        const float* p = probe.data() + std::size_t(h) * kc.max_n;
        const auto is_nan = [](float x) { return std::isnan(x) && !same(x, sentinel()); };
        bool nan = std::isnan(got[e]), written = true;
        for (int t = 0; t < n; t++) nan = nan || is_nan(p[t]), written = written && !same(p[t], sentinel());
        if (nan)
            fail(where +
                 ": NaN; check the rows you read: only the rows that row i's slots name (slots[i * max_n + t], t < "
                 "rows[i].n, at layer l, KV head kv_head[h]) hold numbers here, every other row is NaN");
        if (!written)
            fail(where +
                 ": and the probe (softmax weights of probe_row) is not written, so there is no telling "
                 "which stage differs; write probe[h * max_n + t] = p_t when i == probe_row");
        std::uint64_t worst = 0;
        int first = -1;
        for (int t = 0; t < n; t++)
            if (!same(p[t], weight(i, h, t))) {
                if (first < 0) first = t;
                worst = std::max(worst, ulp_distance(p[t], weight(i, h, t)));
            }
        if (first < 0)
            fail(where +
                 ": your softmax weights of this (row, head) are the CPU's bit for bit, so the weights are right " +
                 (ulp_distance(got[e], want[e]) <= kFewUlps
                      ? "and the P.V sum rounds differently: sum p_t * v_t[d] over t = 0..n-1 in increasing order "
                        "into one accumulator per element, starting at +0 (a split or tree sum rounds differently)"
                      : "and the output is far off: check the V rows you read (row i's own cache, rows[i].v, at the "
                        "same slots as K)"));
        const std::string w =
            fmt::format("{}: weight p_{} is {}, the CPU's {}", where, first, show(p[first]), show(weight(i, h, first)));
        if (worst <= kFewUlps) fail(w + rounding_hint(worst));
        fail(w +
             ": far off; check the rows you read (slots[i * max_n + t] of KV head kv_head[h] at layer l) and "
             "the score (q . k_t, summed over d ascending, divided by sqrt(head_size))");
    }

    // The probe: with probe_row = i, the softmax weights of row i, every head, and nothing else.
    for (int i = 0; i < kc.n_rows; i++) {
        std::vector<float> probe(std::size_t(kc.n_heads) * kc.max_n, sentinel());
        const std::vector<float> again = launch(kc, i, probe.data());
        if (std::memcmp(again.data(), want.data(), sizeof(float) * want.size()) != 0)
            fail(fmt::format("{}: with probe_row = {}, your outputs change: the probe only reads the weights",
                             kc.describe(), i));
        for (int h = 0; h < kc.n_heads; h++)
            for (int t = 0; t < kc.max_n; t++) {
                const float g = probe[std::size_t(h) * kc.max_n + std::size_t(t)];
                const float x = t < kc.rows[std::size_t(i)].n ? weight(i, h, t) : sentinel();
                if (same(g, x)) continue;
                const bool weight_t = t < kc.rows[std::size_t(i)].n;
                const std::uint64_t ulps = ulp_distance(g, x);
                fail(fmt::format("{}: the probe with probe_row = {}: probe[{} * max_n + {}] is {}, expected {} ({}){}",
                                 kc.describe(), i, h, t, show(g), show(x),
                                 weight_t ? fmt::format("row {} head {}'s softmax weight p_{}", i, h, t)
                                          : fmt::format("untouched: row {} has n = {}", i, kc.rows[std::size_t(i)].n),
                                 weight_t && !same(g, sentinel()) && ulps <= kFewUlps ? rounding_hint(ulps) : ""));
            }
    }
}

// ----------------------------------------------------------------------------------------------
// 2. P1: cached decode with your kernel == naive decode on the CPU

void check_p1() {
    const Config c = draw_config();
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const int n_seqs = draw(1, 2);
    std::vector<std::unique_ptr<BlockPool>> pools;
    std::vector<std::unique_ptr<Cache>> caches;
    std::vector<std::string> kinds;
    std::vector<std::vector<int>> tokens;
    std::vector<int> done;  // [n_seqs] positions run so far
    for (int s = 0; s < n_seqs; s++) {
        const int kind = draw(0, 2);
        if (kind == 2) {
            const int bs = draw(1, std::min(8, c.max_seq));
            pools.push_back(std::make_unique<BlockPool>(c, bs, (c.max_seq + bs - 1) / bs));
            caches.push_back(std::make_unique<PagedCache>(*pools.back()));
            kinds.push_back(fmt::format("paged, block_size {}", bs));
        } else {
            const auto layout = kind == 0 ? ContiguousCache::Layout::head_major : ContiguousCache::Layout::seq_major;
            caches.push_back(std::make_unique<ContiguousCache>(c, layout));
            kinds.push_back(kind == 0 ? "contiguous head-major" : "contiguous seq-major");
        }
        tokens.push_back(draw_tokens(c, draw(1, c.max_seq)));
        done.push_back(draw(1, int(tokens.back().size())));  // the prompt
    }
    std::string setup = fmt::format("{}", c.describe());
    for (int s = 0; s < n_seqs; s++)
        setup += fmt::format("; sequence {}: {} cache, {} tokens, prompt {}", s, kinds[std::size_t(s)],
                             tokens[std::size_t(s)].size(), done[std::size_t(s)]);

    GpuHostBackend host(m);
    StudentAttention backend(host);
    CachedDecoder cached(backend, *caches[0]);
    NaiveDecoder naive(m);
    std::vector<int> run(std::size_t(n_seqs), 0);  // positions in each cache
    for (bool first = true;; first = false) {
        // This step: every sequence with tokens left; the first step is each prompt at once.
        std::vector<Cache*> step_caches;
        std::vector<std::vector<int>> step_tokens;
        std::vector<int> who;
        for (int s = 0; s < n_seqs; s++) {
            const auto& all = tokens[std::size_t(s)];
            const int until = first ? done[std::size_t(s)] : run[std::size_t(s)] + 1;
            if (until > int(all.size())) continue;
            step_caches.push_back(caches[std::size_t(s)].get());
            step_tokens.emplace_back(all.begin() + run[std::size_t(s)], all.begin() + until);
            who.push_back(s);
            run[std::size_t(s)] = until;
        }
        if (who.empty()) break;
        std::string batch;
        for (int s : who)
            batch += fmt::format("{}sequence {} to T = {}", batch.empty() ? "" : ", ", s, run[std::size_t(s)]);
        lessons::log_case(fmt::format("{}: {} ({})", setup, first ? "the prefill" : "a decode step", batch));
        const std::vector<float> logits = cached.step(step_caches, step_tokens);
        assert(logits.size() == who.size() * std::size_t(c.vocab_size));
        for (std::size_t j = 0; j < who.size(); j++) {
            const int s = who[j], T = run[std::size_t(s)];
            const std::span<const float> got(logits.data() + j * std::size_t(c.vocab_size), std::size_t(c.vocab_size));
            const std::string diff = lessons::describe_difference(
                naive.forward(std::span(tokens[std::size_t(s)]).first(std::size_t(T))), got);
            if (!diff.empty())
                fail(
                    fmt::format("{}: sequence {} at T = {} ({}, in a batch of {}): the cached logits with your "
                                "kernel differ from naive decode: {}",
                                setup, s, T, first ? "the prefill" : "a decode step", who.size(), diff));
        }
    }
}

// ----------------------------------------------------------------------------------------------
// 3. On a GPU: your file compiled by nvcc, launched on the device (device_check.cu)

// Why the GPU check cannot run here, or "" when it can.
std::string gpu_skip_reason(std::string& nvcc) {
    if (std::string why = gpu_unavailable(); !why.empty()) return why;
    for (const char* p : {"/usr/local/cuda/bin/nvcc"})
        if (std::filesystem::exists(p)) nvcc = p;
    if (nvcc.empty() && std::system("command -v nvcc >/dev/null 2>&1") == 0) nvcc = "nvcc";
    if (nvcc.empty()) return "no nvcc on PATH or in /usr/local/cuda/bin";
    return "";
}

// The repository root, from this file's path (CMake compiles it by its absolute path).
std::filesystem::path repo_root() { return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path(); }

// A log's first 2000 characters, without trailing whitespace.
std::string read_log(const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    std::string text = s.str().substr(0, 2000);
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    return text;
}

// Compiles and runs device_check.cu once ("" when every launch was equal, else why not).
std::string run_on_gpu(const std::string& nvcc, std::uint64_t seed) {
    namespace fs = std::filesystem;
    const fs::path root = repo_root(), lab = root / "lessons" / "10-gpu-kernel";
    const fs::path dir = fs::temp_directory_path() / fmt::format("kvlab-lab10-{}", ::getpid());
    fs::create_directories(dir);
    const fs::path exe = dir / "device_check", log = dir / "log.txt";
    // The numeric contract's flags (gpu/CMakeLists.txt); your file is included by the harness.
    const std::string compile = fmt::format(
        "'{}' -std=c++20 -O2 -arch=native -fmad=false -prec-div=true -prec-sqrt=true -ftz=false "
        "-Xcompiler=-ffp-contract=off -Xcompiler=-fno-fast-math -I'{}' -I'{}' -DLAB10_FILE='\"{}\"' "
        "-DKVLAB_GPU_KERNELS='\"{}\"' '{}' -o '{}' >'{}' 2>&1",
        nvcc, (root / "core").string(), lab.string(), std::string(LAB_FILE),
        (root / "gpu" / "kernels.h").string(), (lab / "device_check.cu").string(), exe.string(), log.string());
    if (std::system(compile.c_str()) != 0) {
        const std::string out = read_log(log);
        fs::remove_all(dir);
        return fmt::format("nvcc could not compile your file for the device: {}", out);
    }
    const int status = std::system(fmt::format("'{}' {} >'{}' 2>&1", exe.string(), seed, log.string()).c_str());
    const std::string out = read_log(log);
    fs::remove_all(dir);
    return status == 0 ? "" : out;
}

// The property's body: the device run happens once, however many cases are asked for.
void check_gpu(const std::string& nvcc, std::uint64_t seed) {
    lessons::log_case(
        fmt::format("your file compiled by {} and launched on the GPU by device_check.cu, seed {}", nvcc, seed));
    static const std::string outcome = run_on_gpu(nvcc, seed);
    if (!outcome.empty()) fail(outcome);
}

}  // namespace

int main(int argc, char** argv) {
    lessons::Lab lab{10, "the GPU decode kernel", LAB_SOURCE, {}};
    lab.checks = {
        {"kernel: every (row, head) == the CPU's attention_row, bitwise", 4, check_kernel},
        {"P1: cached decode with your kernel == naive, bitwise", 6, check_p1},
    };
    std::string nvcc;
    const std::string skip = gpu_skip_reason(nvcc);
    if (skip.empty()) {
        std::uint64_t seed = 1;  // the same --seed the other checks use
        for (int a = 1; a + 1 < argc; a++)
            if (std::string_view(argv[a]) == "--seed") seed = std::strtoull(argv[a + 1], nullptr, 10);
        lab.checks.push_back({"on the GPU: your kernel (nvcc) == the CPU's, bitwise", 2,
                              [nvcc, seed] { check_gpu(nvcc, seed); }, 1, "", 600});
    }
    const int status = lessons::grade(lab, argc, argv);
    if (!skip.empty()) fmt::print("\n(the GPU check was skipped, and is not in the score: {})\n", skip);
    return status;
}
