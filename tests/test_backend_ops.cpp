// The backend table, in the style of llama.cpp's test-backend-ops: every kernel of the Backend
// interface (core/backend.h) is one entry, run on every backend of the table on the same inputs.
// Every backend must give the first backend's bits and count its FLOPs, no backend may write
// outside its outputs, and the first backend must be within the kernel's float64 oracle
// (tests/kernel_oracles.h, whose bounds are derived from each kernel's float32 operations).
//
// Adding a kernel is one entry in kernel_table(); adding a backend is one entry in backend_table().
//
//   kernel_table()    what each case draws
//   embed             x[rows, dim] = token_embedding rows
//   matmul            y = x W for every Matrix (wq wk wv wo w1 w2 w3 wcls), row strides ldx and ldy
//                     wider than the rows, 1-4 threads, past the CPU's register tiles
//   rmsnorm           every Norm (att, ffn, final)
//   rope              the query heads or the KV heads, positions anywhere in max_seq, odd head_size
//   silu_mul          (exp_f32 inside)
//   add
//   causal_attention  naive decode's masked T x T attention (softmax and exp_f32 inside), GQA or any
//                     head map, T past the CPU's row tile (1024 rows at T > 1024)
//   store_kv          rows into their slots, head- or seq-major storage, rows of one or two caches
//   attention         cached decode's attention over slots (repeats, -1 slots that read NaN), GQA or
//                     any head map, one or two caches, and the probe: the softmax's output
//
//   backend_table()   cpu (CpuBackend), gpu-host (gpu/kernels.h run over the grid on the CPU), gpu
//                     (CUDA, where gpu/device.h finds a usable device; skipped, saying why, elsewhere)
//
// A case is one line, "kernel name=value ...", that re-runs exactly that case (the values come from
// its seed); a partial line takes the rest from the entry's defaults:
//   KVLAB_CASE='matmul matrix=wcls rows=5' ctest --test-dir build -R 'backend ops: matmul' -V
// Each kernel's test ("backend ops: <kernel>") runs the entry's boundary cases, then 100 cases
// RapidCheck draws (RC_PARAMS="max_success=1000" for more); every case prints its line, and a
// failure names the kernel, the backend and the buffer, and prints the line to re-run it.
//
// values=finite draws from the oracle's domain (hostile_vector: subnormal to near overflow, both
// zeros, ties), checked against float64; values=nonfinite mixes in +-inf, huge, subnormal and
// exp's edge values, and is compared bit for bit only. "Bit for bit" treats every NaN as equal:
// IEEE 754 leaves a NaN result's payload to the machine (x86 keeps an operand's, CUDA returns
// 0x7fffffff), and the contract is about numbers. Each output lies between two guard regions of a
// sentinel NaN that must keep its bits, as must the parts of a buffer the kernel does not own
// (stride gaps, cache rows it does not store); inputs must be unchanged; every element the kernel
// owns must be written.
#include <fmt/format.h>
#include <rapidcheck.h>
#include <rapidcheck/catch.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <catch2/catch.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend.h"
#include "device.h"
#include "format_oracle.h"
#include "forwarding.h"
#include "host_backend.h"
#include "kernel_oracles.h"
#include "planted.h"
#include "property.h"
#include "test_util.h"
#include "thread_pool.h"

using namespace kvlab;
using namespace kvlab::oracle;

namespace {

// ---- A case as text: "kernel name=value name=value ...", in the entry's order.

// The kernel a line names (its first word).
std::string kernel_of(std::string_view line) {
    const std::size_t from = std::min(line.find_first_not_of(' '), line.size());
    return std::string(line.substr(from, line.find(' ', from) - from));
}

class Case {
public:
    Case() = default;
    explicit Case(std::string kernel) : kernel_(std::move(kernel)) {}

    const std::string& kernel() const { return kernel_; }
    Case& set(const std::string& name, std::string value) {
        for (auto& [n, v] : args_)
            if (n == name) return v = std::move(value), *this;
        args_.emplace_back(name, std::move(value));
        return *this;
    }
    Case& set(const std::string& name, std::int64_t value) { return set(name, std::to_string(value)); }
    bool has(std::string_view name) const {
        return std::any_of(args_.begin(), args_.end(), [&](const auto& a) { return a.first == name; });
    }
    const std::string& text(std::string_view name) const {
        for (const auto& [n, v] : args_)
            if (n == name) return v;
        throw Error(fmt::format("case '{}' has no {}", line(), name));
    }
    int get(std::string_view name) const {
        const std::string& v = text(name);
        int x = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
        if (ec != std::errc() || end != v.data() + v.size())
            throw Error(fmt::format("case '{}': {}={} is not an integer", line(), name, v));
        return x;
    }
    std::string line() const {
        std::string s = kernel_;
        for (const auto& [n, v] : args_) s += " " + n + "=" + v;
        return s;
    }
    // The line's kernel and values over `defaults` (the same kernel), where a name defaults lacks is
    // an error; without defaults, the line as it is.
    static Case parse(std::string_view line, const Case* defaults = nullptr) {
        Case c = defaults ? *defaults : Case(kernel_of(line));
        std::size_t at = 0;
        bool first = true;
        while (at < line.size()) {
            if (line[at] == ' ') {
                at++;
                continue;
            }
            const std::size_t end = std::min(line.find(' ', at), line.size());
            const std::string_view word = line.substr(at, end - at);
            at = end;
            if (first) {
                if (word != c.kernel())
                    throw Error(fmt::format("'{}' is a case of {}, not of {}", line, word, c.kernel()));
                first = false;
                continue;
            }
            const std::size_t eq = word.find('=');
            const std::string name(word.substr(0, eq));
            if (eq == std::string_view::npos || (defaults && !defaults->has(name)))
                throw Error(fmt::format("'{}': {} takes no '{}' (it takes: {})", line, c.kernel(), word,
                                        defaults ? defaults->line() : ""));
            c.set(name, std::string(word.substr(eq + 1)));
        }
        if (first) throw Error(fmt::format("'{}' names no kernel", line));
        return c;
    }

private:
    std::string kernel_;
    std::vector<std::pair<std::string, std::string>> args_;
};

// ---- A case's values, drawn from its seed: the same line gives the same inputs on any machine.

class Values {
public:
    explicit Values(const Case& c) : rng_(std::uint64_t(c.get("seed"))), finite_(c.text("values") == "finite") {
        if (!finite_ && c.text("values") != "nonfinite")
            throw Error(fmt::format("values={}: use finite or nonfinite", c.text("values")));
    }
    bool finite() const { return finite_; }
    int uniform(int lo, int hi) {  // [lo, hi]
        assert(lo <= hi);
        return lo + int(rng_.next() % std::uint64_t(std::int64_t(hi) - lo + 1));
    }
    // n floats. finite: the oracle's domain, hostile_vector with a scale 2^e0, e0 in [lo_exp, hi_exp).
    // nonfinite: multiples of 2^-18 in [-4, 4) with one in seven a special value, infinities included.
    std::vector<float> floats(std::int64_t n, int lo_exp, int hi_exp) {
        if (finite_) return hostile_vector([this](int lo, int hi) { return uniform(lo, hi); }, n, lo_exp, hi_exp);
        static const float special[] = {0.0f,   -0.0f, 1e-40f, -3e-42f, 1.4e-45f, 1e-30f, -2e-38f, 1e15f,
                                        -7e14f, kInf,  -kInf,  3e38f,   -3.4e38f, 88.8f,  -104.0f, -87.5f};
        std::vector<float> v(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));  // [n]
        for (float& x : v)
            x = uniform(0, 6) == 0 ? special[uniform(0, int(std::size(special)) - 1)]
                                   : float(uniform(-(1 << 20), (1 << 20) - 1)) / float(1 << 18);
        return v;
    }

private:
    static constexpr float kInf = std::numeric_limits<float>::infinity();
    SplitMix64 rng_;
    bool finite_;
};

// The model a case's backends share: every tensor zero except those `fill` sets from the case's
// values (the classifier is a tensor of its own, so that wcls is an input like any other).
Model case_model(const Config& c, const std::function<void(Weights&)>& fill) {
    Weights w(c, /*shared_classifier=*/false);
    fill(w);
    return Model(std::move(w));
}

// The shape a case names; dim defaults to n_heads * head_size, the rest to 1.
Config config_of(const Case& k) {
    auto get_or = [&](const char* name, int fallback) { return k.has(name) ? k.get(name) : fallback; };
    Config c;
    c.n_heads = get_or("n_heads", 1);
    c.n_kv_heads = get_or("n_kv_heads", c.n_heads);
    c.dim = get_or("dim", c.n_heads * get_or("head_size", 1));
    c.hidden_dim = get_or("hidden_dim", 1);
    c.n_layers = get_or("n_layers", 1);
    c.vocab_size = get_or("vocab_size", 1);
    c.max_seq = get_or("max_seq", 1);
    c.validate();
    return c;
}

// Threads for the CPU; more than one always starts them (no minimum work).
Exec exec_of(const Case& c) {
    Exec ex;
    if (c.has("threads")) {
        ex.n_threads = c.get("threads");
        if (ex.n_threads > 1) ex.parallel_min_work = 0, pool_always_threads(true);
    }
    return ex;
}

// The KV head each query head reads: group (kv_head_map) or any (drawn: a kernel must index by
// the map, not compute h / group itself).
std::vector<int> kv_heads_of(const Case& k, const Config& c, Values& val) {
    std::vector<int> map = kv_head_map(c);  // [n_heads]
    if (k.text("kv_map") == "any")
        for (int& h : map) h = val.uniform(0, c.n_kv_heads - 1);
    else if (k.text("kv_map") != "group")
        throw Error(fmt::format("kv_map={}: use group or any", k.text("kv_map")));
    return map;
}

// ---- The backends.

struct BackendEntry {
    std::string name;
    std::function<std::unique_ptr<Backend>(const Model&)> make;
    std::function<std::string()> unavailable;  // why it cannot run here; "" when it can
};
using Backends = std::vector<BackendEntry>;

std::string runs_everywhere() { return ""; }

const Backends& backend_table() {
    static const Backends table = {
        {"cpu", [](const Model& m) { return make_backend("cpu", m); }, runs_everywhere},
        {"gpu-host", [](const Model& m) { return make_backend("gpu-host", m); }, runs_everywhere},
        {"gpu", [](const Model& m) { return make_backend("gpu", m); }, gpu_unavailable},
    };
    return table;
}

// ---- One backend's buffers for one case.

// What every guard element holds: a quiet NaN no kernel makes (kNaN is 0x7fc00000, x86's default
// NaN 0xffc00000, CUDA's 0x7fffffff).
constexpr std::uint32_t kSentinelBits = 0x7fc0deadu;
constexpr std::int64_t kGuard = 64;  // floats of sentinel before and after every output
float sentinel() { return std::bit_cast<float>(kSentinelBits); }
std::vector<float> sentinels(std::int64_t n) {
    return std::vector<float>(std::size_t(std::max<std::int64_t>(n, 0)), sentinel());
}

using Outputs = std::vector<std::pair<std::string, std::vector<float>>>;  // by name, in allocation order

const std::vector<float>& output(const Outputs& outs, std::string_view name) {
    for (const auto& [n, v] : outs)
        if (n == name) return v;
    throw Error(fmt::format("no output named {}", name));
}

class Run {
public:
    Run(Backend& backend, const Exec& ex) : backend(backend), ex(ex) {}
    Backend& backend;
    Exec ex;

    // An output: init [n] (the sentinel for a pure output, the input of an in-place kernel) between
    // two guards of kGuard sentinels. writable[i] == 0: element i must keep its bits (a stride gap, a
    // row a store must leave alone); empty: all writable. Returns element 0 in the backend's memory.
    float* out(const std::string& name, std::vector<float> init, std::vector<char> writable = {}) {
        if (writable.empty()) writable.assign(init.size(), 1);
        assert(writable.size() == init.size());
        const std::int64_t n = std::int64_t(init.size());
        std::vector<float> host = sentinels(n + 2 * kGuard);  // [kGuard, n, kGuard]
        assert(host.size() == std::size_t(n + 2 * kGuard));
        std::copy(init.begin(), init.end(), host.begin() + kGuard);
        Buffer<float> b(backend.memory(), n + 2 * kGuard);
        b.upload(host);
        float* p = b.data() + kGuard;
        outs_.push_back({name, std::move(b), std::move(init), std::move(writable)});
        return p;
    }
    // A read-only input (floats, token ids, slots, RowKV): uploaded; it must be unchanged afterwards.
    template <class T>
    const T* in(const std::string& name, const std::vector<T>& host) {
        const std::int64_t bytes = std::int64_t(host.size() * sizeof(T));
        std::vector<unsigned char> raw(static_cast<std::size_t>(bytes));
        if (bytes > 0) std::memcpy(raw.data(), host.data(), std::size_t(bytes));
        Buffer<unsigned char> b(backend.memory(), bytes);
        if (bytes > 0) b.upload(raw);
        const T* p = reinterpret_cast<const T*>(b.data());
        ins_.push_back({name, std::move(b), std::move(raw)});
        return p;
    }

    // After the kernel: every buffer downloaded and checked; the outputs without their guards.
    Outputs finish(const std::string& who) {
        backend.memory().synchronize();
        Outputs result;
        for (Guarded& g : outs_) {
            const std::int64_t n = std::int64_t(g.init.size());
            std::vector<float> all(std::size_t(n + 2 * kGuard));  // [kGuard, n, kGuard]
            assert(g.buffer.size() == std::int64_t(all.size()));
            backend.memory().download(all.data(), g.buffer.data(), g.buffer.bytes());
            for (std::int64_t i = 0; i < kGuard; i++)
                for (const auto& [at, side] : {std::pair{kGuard - 1 - i, "before"}, std::pair{kGuard + n + i, "after"}})
                    if (float_bits(all[std::size_t(at)]) != kSentinelBits)
                        kvlab::fail(
                            fmt::format("{} wrote outside its output {}: guard element {} {} it is 0x{:08x}, not "
                                        "the sentinel 0x{:08x}",
                                        who, g.name, i, side, float_bits(all[std::size_t(at)]), kSentinelBits));
            std::vector<float> got(all.begin() + kGuard, all.begin() + kGuard + n);  // [n]
            for (std::int64_t i = 0; i < n; i++) {
                const std::uint32_t was = float_bits(g.init[std::size_t(i)]), is = float_bits(got[std::size_t(i)]);
                if (!g.writable[std::size_t(i)] && was != is)
                    kvlab::fail(
                        fmt::format("{} wrote element {} of {}, which the kernel must leave alone: 0x{:08x} "
                                    "became 0x{:08x}",
                                    who, i, g.name, was, is));
                if (g.writable[std::size_t(i)] && was == kSentinelBits && is == kSentinelBits)
                    kvlab::fail(fmt::format("{} did not write element {} of {}", who, i, g.name));
            }
            result.emplace_back(g.name, std::move(got));
        }
        for (const Input& in : ins_) {
            std::vector<unsigned char> now(in.bytes.size());
            if (!now.empty()) backend.memory().download(now.data(), in.buffer.data(), std::int64_t(now.size()));
            if (now != in.bytes) kvlab::fail(fmt::format("{} changed its input {}", who, in.name));
        }
        return result;
    }

private:
    struct Guarded {
        std::string name;
        Buffer<float> buffer;        // [kGuard + n + kGuard]
        std::vector<float> init;     // [n]
        std::vector<char> writable;  // [n]
    };
    struct Input {
        std::string name;
        Buffer<unsigned char> buffer;
        std::vector<unsigned char> bytes;
    };
    std::vector<Guarded> outs_;
    std::vector<Input> ins_;
};

// Allocates a case's buffers on one backend and calls its kernel there.
using Call = std::function<void(Run&)>;
// The float64 oracle, on the first backend's outputs.
using Oracle = std::function<void(const Outputs&)>;

// v with every NaN made kNaN: NaN payloads are the machine's (see the top of the file).
std::vector<float> nan_as_one(std::vector<float> v) {
    for (float& x : v)
        if (std::isnan(x)) x = kNaN;
    return v;
}

// The heart of the table: the kernel on every backend that runs here, the first backend against
// the oracle, then every other backend against the first: outputs bit for bit, FLOPs equal.
void run_on_backends(const Case& c, const Model& m, const Backends& backends, const Call& call, const Oracle& oracle) {
    struct Outcome {
        std::string backend;
        Outputs outputs;
        std::uint64_t flops;
    };
    std::vector<Outcome> outcomes;
    for (const BackendEntry& b : backends) {
        if (!b.unavailable().empty()) continue;
        const std::unique_ptr<Backend> backend = b.make(m);
        Run run(*backend, exec_of(c));
        call(run);
        Outputs outs = run.finish(b.name);
        outcomes.push_back({b.name, std::move(outs), run.ex.flops});
    }
    if (outcomes.empty()) kvlab::fail("no backend of the table runs here");
    const Outcome& ref = outcomes.front();
    try {
        oracle(ref.outputs);
    } catch (const rc::detail::CaseResult& r) {
        kvlab::fail(fmt::format("{}: {} (the reference) is off its float64 oracle: {}", c.kernel(), ref.backend,
                                r.description));
    }
    for (const Outcome& o : outcomes) {
        if (&o == &ref) continue;
        for (std::size_t i = 0; i < ref.outputs.size(); i++) {
            const auto& [name, want] = ref.outputs[i];
            if (auto diff = first_difference(nan_as_one(o.outputs[i].second), nan_as_one(want)))
                kvlab::fail(
                    fmt::format("{}: {} differs from {} in {}: {}", c.kernel(), o.backend, ref.backend, name, *diff));
        }
        if (o.flops != ref.flops)
            kvlab::fail(fmt::format("{}: {} counted {} FLOPs, {} counted {}", c.kernel(), o.backend, o.flops,
                                    ref.backend, ref.flops));
    }
}

// ---- The kernels. Each entry: its defaults (every parameter a case has, so that a partial line
// is a whole case), its boundary cases, a RapidCheck draw, and its run: inputs from the case, the
// call on one backend, the oracle.

struct KernelEntry {
    std::string defaults;               // a whole case line: the kernel and every parameter
    std::vector<std::string> boundary;  // cases at tile and size boundaries (partial lines over defaults)
    std::function<Case()> draw;         // a case drawn inside a RapidCheck property
    std::function<void(const Case&, const Backends&)> run;
    std::string name() const { return kernel_of(defaults); }
    // A line over the defaults; a line of only name=value words (a boundary case) is of this kernel.
    Case complete(std::string_view line) const {
        const Case d = Case::parse(defaults);
        const std::string first = kernel_of(line);
        return Case::parse(first.find('=') == std::string::npos ? std::string(line) : name() + " " + std::string(line),
                           &d);
    }
};

// Draws inside a property.
int pick(int lo, int hi) { return kvlab::draw(lo, hi); }  // [lo, hi]
std::string pick(std::initializer_list<const char*> names) {
    return *rc::gen::elementOf(std::vector<std::string>(names.begin(), names.end()));
}
// seed and values, last on every line.
Case& draw_values(Case& c) {
    c.set("seed", pick(0, 1 << 30));
    return c.set("values", *rc::gen::weightedElement<std::string>({{3, "finite"}, {1, "nonfinite"}}));
}
// n_heads 1..max_heads, n_kv_heads any divisor of it, head_size 1..max_head_size.
Case& draw_heads(Case& c, int max_heads, int max_head_size) {
    c.set("n_heads", pick(1, max_heads));
    c.set("n_kv_heads", *proofs::gen_n_kv_heads(c.get("n_heads")));
    return c.set("head_size", pick(1, max_head_size));
}

const Matrix kMatrices[] = {Matrix::wq, Matrix::wk, Matrix::wv, Matrix::wo,
                            Matrix::w1, Matrix::w2, Matrix::w3, Matrix::wcls};
const char* const kMatrixNames[] = {"wq", "wk", "wv", "wo", "w1", "w2", "w3", "wcls"};
const Norm kNorms[] = {Norm::att, Norm::ffn, Norm::final};
const char* const kNormNames[] = {"att", "ffn", "final"};

template <class E, std::size_t N>
E named(const char* const (&names)[N], const E (&values)[N], const std::string& name) {
    for (std::size_t i = 0; i < N; i++)
        if (name == names[i]) return values[i];
    throw Error(fmt::format("no such name: {}", name));
}

// -- embed: x[rows, dim] = token_embedding[tokens[r]]. Oracle: an exact copy.
void run_embed(const Case& k, const Backends& backends) {
    const Config c = config_of(k);
    const int rows = k.get("rows");
    Values val(k);
    const Model m = case_model(c, [&](Weights& w) {
        const std::vector<float> v = val.floats(std::int64_t(w.token_embedding.size()), -149, 127);
        std::copy(v.begin(), v.end(), w.token_embedding.begin());
    });
    std::vector<int> tokens(static_cast<std::size_t>(rows));  // [rows]
    for (int& t : tokens) t = val.uniform(0, c.vocab_size - 1);
    assert(tokens.size() == std::size_t(rows) && m.w.token_embedding.size() == std::size_t(c.vocab_size) * c.dim);
    run_on_backends(
        k, m, backends,
        [&](Run& r) {
            float* x = r.out("x", sentinels(std::int64_t(rows) * c.dim));  // [rows, dim]
            r.backend.embed(r.ex, x, r.in("tokens", tokens), rows);
        },
        [&](const Outputs& o) {
            const std::vector<float>& x = output(o, "x");
            for (int r = 0; r < rows; r++)
                for (int j = 0; j < c.dim; j++) {
                    const float want = m.w.token_embedding[std::size_t(tokens[r]) * c.dim + j];
                    if (float_bits(x[std::size_t(r) * c.dim + j]) != float_bits(want))
                        kvlab::fail(fmt::format("embed x[{}][{}] = 0x{:08x}, token_embedding[{}][{}] is 0x{:08x}", r, j,
                                                float_bits(x[std::size_t(r) * c.dim + j]), tokens[r], j,
                                                float_bits(want)));
                }
        });
}

// -- matmul: y[rows, ldy] = x[rows, ldx] W for the matrix `matrix` of layer `layer`.
void run_matmul(const Case& k, const Backends& backends) {
    const Config c = config_of(k);
    const Matrix mat = named(kMatrixNames, kMatrices, k.text("matrix"));
    const int l = k.get("layer"), rows = k.get("rows");
    Values val(k);
    const Model m = case_model(c, [&](Weights& w) {
        const MatrixRef ref = matrix_of(w, mat, l);
        // The weights are this lambda's to fill: matrix_of only hands out const pointers.
        const std::vector<float> v = val.floats(std::int64_t(ref.n_in) * ref.n_out, -149, 55);  // [n_out, n_in]
        std::copy(v.begin(), v.end(), const_cast<float*>(ref.w));
    });
    const MatrixRef w = matrix_of(m.w, mat, l);
    const std::vector<float> w_in_out = in_out_copy({w.w, std::size_t(w.n_in) * w.n_out}, 1, w.n_out, w.n_in);
    const int ldx = w.n_in + k.get("ldx_pad"), ldy = w.n_out + k.get("ldy_pad");
    // x[rows, ldx]: the gap past n_in holds NaN, which a kernel that read it would spread.
    std::vector<float> x = val.floats(std::int64_t(rows) * ldx, -149, 55);
    for (int r = 0; r < rows; r++) std::fill_n(x.begin() + std::int64_t(r) * ldx + w.n_in, ldx - w.n_in, kNaN);
    std::vector<char> writable(std::size_t(rows) * ldy, 0);  // [rows, ldy]: the gap past n_out stays
    for (int r = 0; r < rows; r++) std::fill_n(writable.begin() + std::int64_t(r) * ldy, w.n_out, 1);
    assert(x.size() == std::size_t(rows) * ldx && writable.size() == std::size_t(rows) * ldy);
    run_on_backends(
        k, m, backends,
        [&](Run& r) {
            float* y = r.out("y", sentinels(std::int64_t(rows) * ldy), writable);
            r.backend.matmul(r.ex, y, ldy, r.in("x", x), ldx, mat, l, rows);
        },
        [&](const Outputs& o) {
            if (val.finite())
                check_matmul(x.data(), ldx, w_in_out.data(), w.n_out, output(o, "y").data(), ldy, rows, w.n_in,
                             w.n_out);
        });
}

// -- rmsnorm: out[rows, dim] = rmsnorm(x[rows, dim]) with the weights of norm `norm` at `layer`.
void run_rmsnorm(const Case& k, const Backends& backends) {
    const Config c = config_of(k);
    const Norm n = named(kNormNames, kNorms, k.text("norm"));
    const int l = k.get("layer"), rows = k.get("rows");
    Values val(k);
    const Model m = case_model(c, [&](Weights& w) {
        const std::vector<float> v = val.floats(c.dim, -20, 10);  // [dim]
        std::copy(v.begin(), v.end(), const_cast<float*>(norm_of(w, n, l)));
    });
    const std::vector<float> x = val.floats(std::int64_t(rows) * c.dim, -149, 55);  // [rows, dim]
    assert(x.size() == std::size_t(rows) * c.dim);
    run_on_backends(
        k, m, backends,
        [&](Run& r) {
            float* out = r.out("out", sentinels(std::int64_t(rows) * c.dim));  // [rows, dim]
            r.backend.rmsnorm(r.ex, out, r.in("x", x), n, l, rows);
        },
        [&](const Outputs& o) {
            if (val.finite()) check_rmsnorm(x.data(), norm_of(m.w, n, l), output(o, "out").data(), rows, c.dim);
        });
}

// -- rope: vec[rows, heads * head_size] rotated in place; heads are the query heads or the KV heads.
void run_rope(const Case& k, const Backends& backends) {
    const Config c = config_of(k);
    const int rows = k.get("rows"), hs = c.head_size();
    if (k.text("heads") != "q" && k.text("heads") != "kv")
        throw Error(fmt::format("heads={}: use q or kv", k.text("heads")));
    const int heads = k.text("heads") == "q" ? c.n_heads : c.n_kv_heads;
    Values val(k);
    const Model m = case_model(c, [](Weights&) {});
    std::vector<int> positions(static_cast<std::size_t>(rows));  // [rows]
    for (int& p : positions) p = val.uniform(0, c.max_seq - 1);
    const std::vector<float> vec = val.floats(std::int64_t(rows) * heads * hs, -149, 100);  // [rows, heads * hs]
    assert(positions.size() == std::size_t(rows) && vec.size() == std::size_t(rows) * heads * hs);
    run_on_backends(
        k, m, backends,
        [&](Run& r) {
            float* v = r.out("vec", vec);
            r.backend.rope(r.ex, v, rows, heads, r.in("positions", positions));
        },
        [&](const Outputs& o) {
            check_rope_table(m.rope, hs);
            if (val.finite()) check_rope(vec.data(), output(o, "vec").data(), rows, heads, hs, positions, m.rope);
        });
}

// -- silu_mul: h1[n] = silu(h1) * h3.
void run_silu_mul(const Case& k, const Backends& backends) {
    const std::int64_t n = k.get("n");
    Values val(k);
    const Model m = case_model(config_of(k), [](Weights&) {});
    const std::vector<float> h1 = val.floats(n, -149, 11), h3 = val.floats(n, -149, 40);  // [n] each
    assert(h1.size() == std::size_t(n) && h3.size() == std::size_t(n));
    run_on_backends(
        k, m, backends,
        [&](Run& r) {
            float* out = r.out("h1", h1);
            r.backend.silu_mul(r.ex, out, r.in("h3", h3), n);
        },
        [&](const Outputs& o) {
            if (val.finite()) check_silu_mul(h1.data(), h3.data(), output(o, "h1").data(), n);
        });
}

// -- add: x[n] += y[n].
void run_add(const Case& k, const Backends& backends) {
    const std::int64_t n = k.get("n");
    Values val(k);
    const Model m = case_model(config_of(k), [](Weights&) {});
    const std::vector<float> x = val.floats(n, -149, 127), y = val.floats(n, -149, 127);  // [n] each
    assert(x.size() == std::size_t(n) && y.size() == std::size_t(n));
    run_on_backends(
        k, m, backends,
        [&](Run& r) {
            float* out = r.out("x", x);
            r.backend.add(r.ex, out, r.in("y", y), n);
        },
        [&](const Outputs& o) {
            if (val.finite()) check_add(x.data(), y.data(), output(o, "x").data(), n);
        });
}

// -- causal_attention: att[T, dim] from q[T, dim], k and v[T, kv_dim]. Oracle: row i of head h is
// attention_row over positions 0..i (the masked columns add exact zeros).
void run_causal_attention(const Case& k, const Backends& backends) {
    const Config c = config_of(k);
    const int T = k.get("T"), hs = c.head_size(), kv_dim = c.kv_dim();
    Values val(k);
    const Model m = case_model(c, [](Weights&) {});
    const std::vector<int> kv_head = kv_heads_of(k, c, val);                           // [n_heads]
    const std::vector<float> q = val.floats(std::int64_t(T) * c.dim, -60, 12);         // [T, dim]
    const std::vector<float> keys = val.floats(std::int64_t(T) * kv_dim, -60, 12);     // [T, kv_dim]
    const std::vector<float> values = val.floats(std::int64_t(T) * kv_dim, -149, 60);  // [T, kv_dim]
    assert(kv_head.size() == std::size_t(c.n_heads) && q.size() == std::size_t(T) * c.dim);
    assert(keys.size() == std::size_t(T) * kv_dim && values.size() == keys.size());
    run_on_backends(
        k, m, backends,
        [&](Run& r) {
            float* att = r.out("att", sentinels(std::int64_t(T) * c.dim));  // [T, dim]
            r.backend.causal_attention(r.ex, att, r.in("q", q), r.in("k", keys), r.in("v", values), T,
                                       r.in("kv_head", kv_head));
        },
        [&](const Outputs& o) {
            if (!val.finite()) return;
            const std::vector<float>& att = output(o, "att");
            for (int i = 0; i < T; i++)
                for (int h = 0; h < c.n_heads; h++) {
                    const std::int64_t col = std::int64_t(kv_head[h]) * hs;
                    check_attention_row(
                        q.data() + std::int64_t(i) * c.dim + h * hs, hs, i + 1,
                        [&](int t) { return keys.data() + std::int64_t(t) * kv_dim + col; },
                        [&](int t) { return values.data() + std::int64_t(t) * kv_dim + col; },
                        att.data() + std::int64_t(i) * c.dim + h * hs, nullptr, fmt::format("row {}, head {}", i, h));
                }
        });
}

// The storage of `caches` caches at one layout: rows of head_size floats, row (l, h, slot) at
// l * layer_rows + h * head_rows + slot. head: [n_layers, n_kv_heads, n_slots, hs]; seq:
// [n_layers, n_slots, n_kv_heads, hs], where position t's slot is t * n_kv_heads.
struct Storage {
    std::int64_t layer_rows = 0, head_rows = 0, n_floats = 0;
    int n_slots = 0, caches = 1, stride = 1;  // slot of position t: t * stride
    Storage(const Case& k, const Config& c) : n_slots(k.get("n_slots")), caches(k.get("caches")) {
        const bool head = k.text("layout") == "head";
        if (!head && k.text("layout") != "seq")
            throw Error(fmt::format("layout={}: use head or seq", k.text("layout")));
        layer_rows = std::int64_t(c.n_kv_heads) * n_slots;
        head_rows = head ? n_slots : 1;
        stride = head ? 1 : c.n_kv_heads;
        n_floats = c.n_layers * layer_rows * c.head_size();
    }
    std::int64_t at(int l, int h, std::int64_t slot, int hs) const {
        return (l * layer_rows + h * head_rows + slot) * hs;
    }
};

const proofs::FormatTable& oracle_table(const FloatFormat& f) {
    static std::map<const FloatFormat*, proofs::FormatTable> tables;
    auto it = tables.find(&f);
    if (it == tables.end()) it = tables.emplace(&f, proofs::format_table(f)).first;
    return it->second;
}

// The code the format oracle stores fp32 x as in `format` (fp32: x's own bits).
std::uint32_t oracle_code(KVFormat format, float x) {
    switch (format) {
        case KVFormat::fp32: return float_bits(x);
        case KVFormat::bf16: return proofs::oracle_encode(kBf16, oracle_table(kBf16), x);
        case KVFormat::fp16: return proofs::oracle_encode(kFp16, oracle_table(kFp16), x);
        case KVFormat::fp8_e5m2: return proofs::oracle_encode(kFp8E5M2, oracle_table(kFp8E5M2), x);
        case KVFormat::fp8_e4m3: return proofs::oracle_encode(kFp8E4M3, oracle_table(kFp8E4M3), x);
        case KVFormat::int8:
        case KVFormat::int4: break;  // a code of its group: IntGroupOracle
    }
    return 0;
}

// What an fp32 element is once stored in `format`, by the format oracle (proofs/format_oracle.h),
// not by kvlab's conversion: its code's meaning, NaN as the quiet NaN with the input's sign.
float oracle_stored(KVFormat format, float x) {
    const FloatFormat* f = format == KVFormat::bf16       ? &kBf16
                           : format == KVFormat::fp16     ? &kFp16
                           : format == KVFormat::fp8_e5m2 ? &kFp8E5M2
                           : format == KVFormat::fp8_e4m3 ? &kFp8E4M3
                                                          : nullptr;
    if (!f) return x;
    const proofs::CodeMeaning m = proofs::code_meaning(*f, proofs::oracle_encode(*f, oracle_table(*f), x));
    if (m.nan) return std::bit_cast<float>(m.negative ? 0xffc00000u : 0x7fc00000u);
    if (m.inf) return m.negative ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
    return float(m.value);  // exact: every value of these formats is an fp32
}

// One group of an integer format by its definition (kv_format.h, "Integer formats"), written
// with the standard library rather than kvlab's functions: the range by min_element and
// max_element (the first of equals, as kvlab's comparisons keep), codes by std::round and a
// clamp, the value as code * scale + min.
struct IntGroupOracle {
    float scale = 0, min = 0;
    std::vector<unsigned> codes;
    IntGroupOracle(const float* x, int n, int bits) {
        const float levels = float((1 << bits) - 1);
        min = *std::min_element(x, x + n);
        scale = (*std::max_element(x, x + n) - min) / levels;
        for (int j = 0; j < n; j++) {
            const float q = scale == 0.0f ? 0.0f : std::round((x[j] - min) / scale);
            codes.push_back(std::isnan(q) ? 0u : unsigned(std::clamp(q, 0.0f, levels)));
        }
    }
    float value(int j) const { return float(codes[std::size_t(j)]) * scale + min; }
};

// -- store_kv, then load_kv: row i's K and V (k, v: [n_rows, kv_dim]) into its cache (i % caches)
// at layer l, at its write slot (distinct within a cache), stored in `format` with layer l's
// scales (scaled=1: drawn, else none), then read back into [n_rows, kv_dim]. Oracle: those rows
// hold exactly the format oracle's codes of k and v (divided by the scale, for fp8), every other
// storage byte keeps its value, and the read back is each code's meaning (times the scale).
void run_store_kv(const Case& k, const Backends& backends) {
    const Config c = config_of(k);
    const int l = k.get("layer"), n_rows = k.get("n_rows"), hs = c.head_size(), kv_dim = c.kv_dim();
    const KVFormat format = parse_kv_format(k.text("format"));
    const Storage st(k, c);
    Values val(k);
    const Model m = case_model(c, [](Weights&) {});
    // Each cache's positions in a random order: row i takes the next one of its cache.
    std::vector<std::vector<int>> free(static_cast<std::size_t>(st.caches));
    for (auto& f : free) {
        for (int t = 0; t < st.n_slots; t++) f.push_back(t);
        for (int t = st.n_slots - 1; t > 0; t--) std::swap(f[std::size_t(t)], f[std::size_t(val.uniform(0, t))]);
    }
    std::vector<RowKV> rows(static_cast<std::size_t>(n_rows));  // [n_rows]; k and v set per backend
    for (int i = 0; i < n_rows; i++) {
        auto& f = free[std::size_t(i % st.caches)];
        if (f.empty())
            throw Error(fmt::format("n_rows={}: more rows than {} caches of {} slots", n_rows, st.caches, st.n_slots));
        rows[std::size_t(i)].write_slot = std::int64_t(f.back()) * st.stride;
        f.pop_back();
        rows[std::size_t(i)].layer_rows = st.layer_rows;
        rows[std::size_t(i)].head_rows = st.head_rows;
        rows[std::size_t(i)].format = int(format);
        rows[std::size_t(i)].row_bytes = kv_row_bytes(int(format), hs);
        rows[std::size_t(i)].group = kv_row_group(int(format), hs);
    }
    // Storage in words of 4 bytes: each cache's K and V hold st.n_floats / hs rows of rb bytes
    // (a float format's elements are eb bytes each).
    const bool integer = kv_format_int(int(format));
    const int eb = integer ? 1 : kv_format_bytes(int(format));
    const std::int64_t rb = kv_row_bytes(int(format), hs);
    const std::int64_t n_bytes = st.n_floats / hs * rb, n_words = (n_bytes + 3) / 4;
    std::vector<std::vector<float>> init;     // [caches * 2] K then V of each cache, [n_words]
    std::vector<std::vector<char>> writable;  // the same shape: the words a stored row touches
    for (int s = 0; s < 2 * st.caches; s++) {
        init.push_back(val.floats(n_words, -149, 127));
        writable.emplace_back(std::size_t(n_words), 0);
    }
    for (int i = 0; i < n_rows; i++)
        for (int h = 0; h < c.n_kv_heads; h++)
            for (int kv = 0; kv < 2; kv++) {
                const std::int64_t from = st.at(l, h, rows[std::size_t(i)].write_slot, hs) / hs * rb, to = from + rb;
                std::fill(writable[std::size_t(2 * (i % st.caches) + kv)].begin() + from / 4,
                          writable[std::size_t(2 * (i % st.caches) + kv)].begin() + (to + 3) / 4, 1);
            }
    // Layer scales [n_layers, 2], read by fp8: 1, or drawn from [2^-6, 2^6) when scaled=1.
    std::vector<float> scales(std::size_t(2 * c.n_layers), 1.0f);
    if (k.get("scaled"))
        for (float& x : scales) x = std::ldexp(1.0f + float(val.uniform(0, 255)) / 256.0f, val.uniform(-6, 5));
    const std::vector<float> new_k = val.floats(std::int64_t(n_rows) * kv_dim, -149, 127);  // [n_rows, kv_dim]
    const std::vector<float> new_v = val.floats(std::int64_t(n_rows) * kv_dim, -149, 127);  // [n_rows, kv_dim]
    assert(rows.size() == std::size_t(n_rows) && init.size() == std::size_t(2 * st.caches));
    assert(init[0].size() == std::size_t(n_words) && writable[0].size() == init[0].size());
    assert(new_k.size() == std::size_t(n_rows) * kv_dim && new_v.size() == new_k.size());
    // What the oracle says each stored element is: its code, and the value a read gives back.
    auto scale_of = [&](int kv) { return kv_format_scaled(int(format)) ? scales[std::size_t(2 * l + kv)] : 1.0f; };
    auto want_code = [&](int kv, float x) { return oracle_code(format, x / scale_of(kv)); };
    auto want_value = [&](int kv, float x) {
        const float s = scale_of(kv), v = oracle_stored(format, x / s);
        return s == 1.0f ? v : v * s;
    };
    // An integer format's row by the group oracle: its bytes (padding left out) and its values.
    // The row: every group's scale and min, then the head_size codes (int4: two a byte, the even
    // element low).
    const int group = kv_row_group(int(format), hs);
    auto int_row = [&](const float* x, std::vector<std::pair<std::int64_t, std::uint8_t>>* bytes, float* values) {
        const int bits = format == KVFormat::int8 ? 8 : 4;
        std::vector<unsigned> codes;  // [head_size]
        for (int g0 = 0; g0 < hs; g0 += group) {
            const IntGroupOracle o(x + g0, group, bits);
            std::uint8_t meta[8];
            std::memcpy(meta, &o.scale, 4);
            std::memcpy(meta + 4, &o.min, 4);
            for (int b = 0; b < 8; b++) bytes->emplace_back(std::int64_t(g0 / group) * 8 + b, meta[b]);
            for (int j = 0; j < group; j++) values[g0 + j] = o.value(j), codes.push_back(o.codes[std::size_t(j)]);
        }
        const std::int64_t at = std::int64_t(hs / group) * 8;  // the codes' first byte
        for (int d = 0; d < hs; d++) {
            if (bits == 8)
                bytes->emplace_back(at + d, std::uint8_t(codes[std::size_t(d)]));
            else if (d % 2 == 0)
                bytes->emplace_back(at + d / 2, std::uint8_t(codes[std::size_t(d)] |
                                                             (d + 1 < hs ? codes[std::size_t(d + 1)] : 0u) << 4));
        }
    };
    run_on_backends(
        k, m, backends,
        [&](Run& r) {
            std::vector<float*> storage;  // [caches * 2]
            for (int s = 0; s < 2 * st.caches; s++)
                storage.push_back(r.out(fmt::format("{} of cache {}", s % 2 ? "V" : "K", s / 2), init[std::size_t(s)],
                                        writable[std::size_t(s)]));
            float* loaded_k = r.out("K read back", sentinels(std::int64_t(n_rows) * kv_dim));
            float* loaded_v = r.out("V read back", sentinels(std::int64_t(n_rows) * kv_dim));
            std::vector<RowKV> mine = rows;
            const float* dev_scales = k.get("scaled") ? r.in("scales", scales) : nullptr;
            for (int i = 0; i < n_rows; i++) {
                mine[std::size_t(i)].k = storage[std::size_t(2 * (i % st.caches))];
                mine[std::size_t(i)].v = storage[std::size_t(2 * (i % st.caches) + 1)];
                mine[std::size_t(i)].scales = dev_scales;
            }
            const RowKV* dev_rows = r.in("rows", mine);
            r.backend.store_kv(r.ex, dev_rows, n_rows, l, r.in("k", new_k), r.in("v", new_v));
            r.backend.load_kv(r.ex, dev_rows, n_rows, l, loaded_k, loaded_v);
        },
        [&](const Outputs& o) {
            // Every byte of each storage: the oracle's codes in the rows stored, the old bytes elsewhere.
            for (int s = 0; s < 2 * st.caches; s++) {
                std::vector<unsigned char> want(std::size_t(n_words) * 4), got(want.size());
                std::memcpy(want.data(), init[std::size_t(s)].data(), want.size());
                std::memcpy(got.data(), o[std::size_t(s)].second.data(), got.size());
                for (int i = s / 2; i < n_rows; i += st.caches)
                    for (int h = 0; h < c.n_kv_heads; h++) {
                        const std::int64_t row = st.at(l, h, rows[std::size_t(i)].write_slot, hs) / hs * rb;
                        const float* x = (s % 2 ? new_v : new_k).data() + std::size_t(i) * kv_dim + h * hs;
                        if (integer) {
                            std::vector<std::pair<std::int64_t, std::uint8_t>> bytes;
                            std::vector<float> values(std::size_t(hs), 0.0f);  // [head_size]
                            int_row(x, &bytes, values.data());
                            for (const auto& [b, byte] : bytes) want[std::size_t(row + b)] = byte;
                            continue;
                        }
                        for (int d = 0; d < hs; d++) {
                            const std::uint32_t code = want_code(s % 2, x[d]);
                            std::memcpy(want.data() + row + std::int64_t(d) * eb, &code,
                                        std::size_t(eb));  // little-endian
                        }
                    }
                for (std::size_t b = 0; b < want.size(); b++)
                    if (want[b] != got[b])
                        kvlab::fail(
                            fmt::format("store_kv row: {} of cache {}: byte {} (row {} of {} B in {}) is 0x{:02x}, "
                                        "the format oracle's is 0x{:02x}",
                                        s % 2 ? "V" : "K", s / 2, b, std::int64_t(b) / rb, rb, kv_format_name(format),
                                        got[b], want[b]));
            }
            // Read back: the value of each stored element, as the oracle means its code.
            for (int kv = 0; kv < 2; kv++) {
                const std::vector<float>& got = o[std::size_t(2 * st.caches + kv)].second;
                const std::vector<float>& x = kv ? new_v : new_k;
                std::vector<float> int_values(x.size(), 0.0f);  // [n_rows, kv_dim] integer formats' reads
                if (integer) {
                    std::vector<std::pair<std::int64_t, std::uint8_t>> unused;
                    for (std::size_t r0 = 0; r0 < x.size(); r0 += std::size_t(hs))
                        int_row(x.data() + r0, &unused, int_values.data() + r0);
                }
                for (std::size_t e = 0; e < got.size(); e++) {
                    const float w = integer ? int_values[e] : want_value(kv, x[e]);
                    if (float_bits(got[e]) != float_bits(w))
                        kvlab::fail(
                            fmt::format("store_kv row {}: {} element {} reads back as 0x{:08x}, the row's "
                                        "is 0x{:08x}",
                                        e / std::size_t(kv_dim), kv ? "value" : "key", e % std::size_t(kv_dim),
                                        float_bits(got[e]), float_bits(w)));
                }
            }
        });
}

// -- attention: att[n_rows, dim] from q[n_rows, dim] over each row's slots [n_rows, max_n] at layer
// l; the probe [n_heads, max_n] holds row probe_row's softmax weights. Oracle: a row with a -1
// slot is NaN (it reads a NaN row); every other (row, head) is attention_row over its slots.
void run_attention(const Case& k, const Backends& backends) {
    const Config c = config_of(k);
    const int l = k.get("layer"), n_rows = k.get("n_rows"), max_n = k.get("max_n"), probe_row = k.get("probe_row");
    const int hs = c.head_size();
    const bool holes = k.get("holes") != 0;
    if (probe_row < -1 || probe_row >= n_rows)
        throw Error(fmt::format("probe_row={}: -1 or a row below {}", probe_row, n_rows));
    const Storage st(k, c);
    Values val(k);
    const Model m = case_model(c, [](Weights&) {});
    const std::vector<int> kv_head = kv_heads_of(k, c, val);  // [n_heads]
    std::vector<std::vector<float>> storage;                  // [caches * 2] K then V, [n_floats]
    for (int s = 0; s < st.caches; s++) {
        storage.push_back(val.floats(st.n_floats, -60, 12));
        storage.push_back(val.floats(st.n_floats, -149, 60));
    }
    std::vector<RowKV> rows(static_cast<std::size_t>(n_rows));         // [n_rows]; k and v set per backend
    std::vector<std::int64_t> slots(std::size_t(n_rows) * max_n, -1);  // [n_rows, max_n]; -1 past n too
    std::vector<char> has_hole(static_cast<std::size_t>(n_rows), 0);   // [n_rows]
    for (int i = 0; i < n_rows; i++) {
        RowKV& r = rows[std::size_t(i)];
        r.layer_rows = st.layer_rows;
        r.head_rows = st.head_rows;
        r.row_bytes = std::int64_t(sizeof(float)) * hs;  // fp32
        r.n = val.uniform(1, max_n);
        for (int t = 0; t < r.n; t++) {
            const bool hole = holes && val.uniform(0, 8) == 0;
            slots[std::size_t(i) * max_n + t] = hole ? -1 : std::int64_t(val.uniform(0, st.n_slots - 1)) * st.stride;
            has_hole[std::size_t(i)] |= hole;
        }
    }
    const std::vector<float> q = val.floats(std::int64_t(n_rows) * c.dim, -60, 12);  // [n_rows, dim]
    std::vector<char> probed(std::size_t(c.n_heads) * max_n, 0);                     // [n_heads, max_n]
    if (probe_row >= 0)
        for (int h = 0; h < c.n_heads; h++)
            std::fill_n(probed.begin() + std::int64_t(h) * max_n, rows[std::size_t(probe_row)].n, 1);
    assert(kv_head.size() == std::size_t(c.n_heads) && storage.size() == std::size_t(2 * st.caches));
    assert(storage[0].size() == std::size_t(st.n_floats) && storage[1].size() == storage[0].size());
    assert(rows.size() == std::size_t(n_rows) && slots.size() == std::size_t(n_rows) * max_n);
    assert(q.size() == std::size_t(n_rows) * c.dim && probed.size() == std::size_t(c.n_heads) * max_n);
    run_on_backends(
        k, m, backends,
        [&](Run& r) {
            std::vector<const float*> kv;  // [caches * 2]
            for (int s = 0; s < 2 * st.caches; s++)
                kv.push_back(r.in(fmt::format("{} of cache {}", s % 2 ? "V" : "K", s / 2), storage[std::size_t(s)]));
            std::vector<RowKV> mine = rows;
            for (int i = 0; i < n_rows; i++)  // only read through these
                mine[std::size_t(i)].k = const_cast<float*>(kv[std::size_t(2 * (i % st.caches))]),
                mine[std::size_t(i)].v = const_cast<float*>(kv[std::size_t(2 * (i % st.caches) + 1)]);
            float* att = r.out("att", sentinels(std::int64_t(n_rows) * c.dim));  // [n_rows, dim]
            float* probe = r.out("probe", sentinels(std::int64_t(c.n_heads) * max_n), probed);
            r.backend.attention(r.ex, att, r.in("q", q), r.in("rows", mine), n_rows, l, r.in("slots", slots), max_n,
                                r.in("kv_head", kv_head), probe_row, probe);
        },
        [&](const Outputs& o) {
            if (!val.finite()) return;
            const std::vector<float>& att = output(o, "att");
            const std::vector<float>& probe = output(o, "probe");
            for (int i = 0; i < n_rows; i++)
                for (int h = 0; h < c.n_heads; h++) {
                    const float* out = att.data() + std::int64_t(i) * c.dim + h * hs;
                    const float* weights = i == probe_row ? probe.data() + std::int64_t(h) * max_n : nullptr;
                    const int n = rows[std::size_t(i)].n;
                    if (has_hole[std::size_t(i)]) {
                        for (int d = 0; d < hs; d++)
                            if (!std::isnan(out[d]))
                                kvlab::fail(
                                    fmt::format("attention row {} reads a -1 slot (a NaN row), yet head {} element "
                                                "{} is {:a}, not NaN",
                                                i, h, d, out[d]));
                        for (int t = 0; weights && t < n; t++)
                            if (!std::isnan(weights[t]))
                                kvlab::fail(
                                    fmt::format("attention row {} reads a -1 slot, yet its probe weight [{}][{}] "
                                                "is {:a}, not NaN",
                                                i, h, t, weights[t]));
                        continue;
                    }
                    const float* kc = storage[std::size_t(2 * (i % st.caches))].data();
                    const float* vc = storage[std::size_t(2 * (i % st.caches) + 1)].data();
                    const std::int64_t* s = slots.data() + std::int64_t(i) * max_n;
                    check_attention_row(
                        q.data() + std::int64_t(i) * c.dim + h * hs, hs, n,
                        [&](int t) { return kc + st.at(l, kv_head[h], s[t], hs); },
                        [&](int t) { return vc + st.at(l, kv_head[h], s[t], hs); }, out, weights,
                        fmt::format("row {}, head {}", i, h));
                }
        });
}

const std::vector<KernelEntry>& kernel_table() {
    static const std::vector<KernelEntry> table = {
        {"embed dim=1 vocab_size=1 rows=1 seed=1 values=finite",
         {"rows=0", "dim=64 vocab_size=512 rows=7", "dim=33 vocab_size=3 rows=9 values=nonfinite"},
         [] {
             Case c("embed");
             c.set("dim", pick(1, 80)).set("vocab_size", pick(1, 40)).set("rows", pick(0, 8));
             return draw_values(c);
         },
         run_embed},
        {"matmul matrix=wq layer=0 n_layers=1 n_heads=1 n_kv_heads=1 head_size=1 hidden_dim=1 vocab_size=1 rows=1 "
         "ldx_pad=0 ldy_pad=0 threads=1 seed=1 values=finite",
         // The CPU's tiles: 4 rows by 2 vector registers (16 columns with AVX2, 32 with AVX-512).
         {"rows=0 matrix=wcls vocab_size=7", "matrix=wcls head_size=33 vocab_size=65 rows=5 ldx_pad=1 ldy_pad=3",
          "matrix=w1 head_size=16 hidden_dim=64 rows=4 threads=2",
          "matrix=w2 head_size=31 hidden_dim=17 rows=9 ldy_pad=2 threads=3",
          "matrix=wk n_heads=4 n_kv_heads=2 head_size=8 rows=1",
          "matrix=wv n_layers=2 layer=1 n_heads=2 n_kv_heads=1 head_size=16 rows=8 values=nonfinite",
          "matrix=wcls n_heads=8 n_kv_heads=4 head_size=8 hidden_dim=172 vocab_size=512 rows=3 threads=4"},
         [] {
             Case c("matmul");
             c.set("matrix", pick({"wq", "wk", "wv", "wo", "w1", "w2", "w3", "wcls"}));
             c.set("n_layers", pick(1, 2));
             c.set("layer", pick(0, c.get("n_layers") - 1));
             draw_heads(c, 8, 10);
             c.set("hidden_dim", pick(1, 70)).set("vocab_size", pick(1, 150)).set("rows", pick(0, 40));
             c.set("ldx_pad", pick(0, 4)).set("ldy_pad", pick(0, 4)).set("threads", pick(1, 4));
             return draw_values(c);
         },
         run_matmul},
        {"rmsnorm norm=att layer=0 n_layers=1 dim=1 rows=1 seed=1 values=finite",
         {"rows=0", "norm=final dim=64 rows=5", "norm=ffn n_layers=3 layer=2 dim=255 rows=2 values=nonfinite"},
         [] {
             Case c("rmsnorm");
             c.set("norm", pick({"att", "ffn", "final"})).set("n_layers", pick(1, 2));
             c.set("layer", pick(0, c.get("n_layers") - 1)).set("dim", pick(1, 80)).set("rows", pick(0, 4));
             return draw_values(c);
         },
         run_rmsnorm},
        {"rope heads=q n_heads=1 n_kv_heads=1 head_size=2 rows=1 max_seq=1 seed=1 values=finite",
         {"rows=0", "head_size=1 rows=3 max_seq=4", "heads=kv n_heads=4 n_kv_heads=2 head_size=7 rows=5 max_seq=20",
          "n_heads=8 n_kv_heads=4 head_size=8 rows=5 max_seq=512", "head_size=12 rows=2 max_seq=300 values=nonfinite"},
         [] {
             Case c("rope");
             c.set("heads", pick({"q", "kv"}));
             draw_heads(c, 4, 12);
             c.set("rows", pick(0, 4)).set("max_seq", pick(1, 300));
             return draw_values(c);
         },
         run_rope},
        {"silu_mul n=1 seed=1 values=finite",
         {"n=0", "n=1000", "n=257 values=nonfinite"},
         [] {
             Case c("silu_mul");
             c.set("n", pick(0, 100));
             return draw_values(c);
         },
         run_silu_mul},
        {"add n=1 seed=1 values=finite",
         {"n=0", "n=1000", "n=257 values=nonfinite"},
         [] {
             Case c("add");
             c.set("n", pick(0, 100));
             return draw_values(c);
         },
         run_add},
        {"causal_attention n_heads=1 n_kv_heads=1 head_size=1 T=1 kv_map=group threads=1 seed=1 values=finite",
         // Past one row tile of the CPU's scores (2^20 / T rows): T = 1025 is two tiles, 2100 five.
         {"n_heads=2 head_size=4 n_kv_heads=1 T=1025", "n_heads=2 head_size=4 n_kv_heads=1 T=2100 threads=2",
          "n_heads=4 n_kv_heads=2 head_size=16 T=40 kv_map=any threads=4",
          "n_heads=8 n_kv_heads=4 head_size=8 T=24 values=nonfinite"},
         [] {
             Case c("causal_attention");
             draw_heads(c, 4, 16);
             c.set("T", pick(1, 40)).set("kv_map", pick({"group", "any"})).set("threads", pick(1, 4));
             return draw_values(c);
         },
         run_causal_attention},
        {"store_kv n_layers=1 layer=0 n_heads=1 n_kv_heads=1 head_size=1 n_slots=1 layout=head caches=1 n_rows=1 "
         "format=fp32 scaled=0 seed=1 values=finite",
         {"n_layers=3 layer=2 n_heads=4 n_kv_heads=2 head_size=8 n_slots=8 n_rows=5",
          "n_layers=2 layer=1 n_heads=4 n_kv_heads=4 head_size=5 n_slots=3 layout=seq caches=2 n_rows=6",
          "n_heads=2 n_kv_heads=2 head_size=3 n_slots=4 n_rows=4 values=nonfinite",
          "n_heads=4 n_kv_heads=2 head_size=8 n_slots=6 n_rows=5 format=bf16",
          "n_heads=2 n_kv_heads=1 head_size=16 n_slots=4 n_rows=3 format=fp16 values=nonfinite",
          "n_heads=2 n_kv_heads=2 head_size=8 n_slots=4 n_rows=4 layout=seq format=fp8-e5m2",
          "n_heads=2 n_kv_heads=2 head_size=8 n_slots=4 n_rows=4 format=fp8-e4m3 values=nonfinite",
          "n_layers=2 layer=1 n_heads=2 n_kv_heads=1 head_size=3 n_slots=5 n_rows=3 format=fp8-e4m3 scaled=1",
          "n_heads=2 n_kv_heads=2 head_size=5 n_slots=3 n_rows=2 layout=seq caches=2 format=fp8-e5m2 scaled=1",
          "n_heads=4 n_kv_heads=2 head_size=8 n_slots=6 n_rows=5 format=int8",
          "n_heads=2 n_kv_heads=1 head_size=12 n_slots=4 n_rows=3 layout=seq caches=2 format=int4",
          "n_heads=2 n_kv_heads=2 head_size=7 n_slots=3 n_rows=2 format=int4 values=nonfinite",
          "n_heads=2 n_kv_heads=2 head_size=6 n_slots=4 n_rows=4 format=int8 values=nonfinite"},
         [] {
             Case c("store_kv");
             c.set("n_layers", pick(1, 3));
             c.set("layer", pick(0, c.get("n_layers") - 1));
             draw_heads(c, 4, 12);
             c.set("n_slots", pick(1, 10)).set("layout", pick({"head", "seq"})).set("caches", pick(1, 2));
             c.set("n_rows", pick(1, std::min(6, c.get("caches") * c.get("n_slots"))));
             c.set("format", pick({"fp32", "bf16", "fp16", "fp8-e5m2", "fp8-e4m3", "int8", "int4"}))
                 .set("scaled", pick(0, 1));
             return draw_values(c);
         },
         run_store_kv},
        {"attention n_layers=1 layer=0 n_heads=1 n_kv_heads=1 head_size=1 kv_map=group n_slots=1 layout=head "
         "caches=1 n_rows=1 max_n=1 probe_row=-1 holes=0 threads=1 seed=1 values=finite",
         {"n_heads=8 n_kv_heads=2 head_size=8 n_slots=16 n_rows=3 max_n=40 probe_row=2 threads=2",
          "n_layers=2 layer=1 n_heads=4 n_kv_heads=2 head_size=7 kv_map=any n_slots=5 layout=seq caches=2 n_rows=4 "
          "max_n=9 probe_row=1 holes=1",
          "n_heads=2 n_kv_heads=1 head_size=16 n_slots=64 n_rows=1 max_n=64 probe_row=0",
          "n_heads=4 n_kv_heads=4 head_size=4 n_slots=6 n_rows=3 max_n=12 probe_row=0 holes=1 values=nonfinite"},
         [] {
             Case c("attention");
             c.set("n_layers", pick(1, 3));
             c.set("layer", pick(0, c.get("n_layers") - 1));
             draw_heads(c, 4, 16);
             c.set("kv_map", pick({"group", "any"})).set("n_slots", pick(1, 10)).set("layout", pick({"head", "seq"}));
             c.set("caches", pick(1, 2)).set("n_rows", pick(1, 4)).set("max_n", pick(1, 24));
             c.set("probe_row", pick(-1, c.get("n_rows") - 1)).set("holes", pick(0, 1)).set("threads", pick(1, 4));
             return draw_values(c);
         },
         run_attention},
    };
    return table;
}

const KernelEntry& entry_named(const std::string& kernel) {
    for (const KernelEntry& e : kernel_table())
        if (e.name() == kernel) return e;
    throw Error(fmt::format("no kernel '{}' in the table", kernel));
}

// ---- Running cases.

std::string rerun_text(const Case& c) {
    return fmt::format("  case: {}\n  re-run: KVLAB_CASE='{}' ctest --test-dir build -R 'backend ops: {}' -V", c.line(),
                       c.line(), c.kernel());
}

// One case on `backends`; a failure (in a property: RapidCheck's) says how to re-run it.
void run_case(const KernelEntry& e, const Case& c, const Backends& backends, bool print) {
    try {
        e.run(c, backends);
    } catch (const rc::detail::CaseResult& r) {
        if (r.type != rc::detail::CaseResult::Type::Failure) throw;
        kvlab::fail(r.description + "\n" + rerun_text(c));
    } catch (const std::exception& x) {
        kvlab::fail(fmt::format("{}\n{}", x.what(), rerun_text(c)));
    }
    if (print) std::printf("  %s: ok\n", c.line().c_str());
}

// A case given as a line, outside RapidCheck: a failure is a Catch failure.
void run_line(const KernelEntry& e, const std::string& line, const Backends& backends) {
    try {
        run_case(e, e.complete(line), backends, true);
    } catch (const rc::detail::CaseResult& r) {
        FAIL(r.description);
    } catch (const std::exception& x) {
        FAIL(x.what());
    }
}

std::string describe_backends(const Backends& backends) {
    std::string runs, skipped;
    for (const BackendEntry& b : backends) {
        const std::string why = b.unavailable();
        if (why.empty())
            runs += (runs.empty() ? "" : ", ") + b.name;
        else
            skipped += fmt::format("; {} skipped: {}", b.name, why);
    }
    return runs + skipped;
}

// One kernel's test: its boundary cases, then RapidCheck's; only KVLAB_CASE when that is set.
void test_kernel(const KernelEntry& e) {
    const Backends& backends = backend_table();
    std::printf("backend ops: %s on %s\n", e.name().c_str(), describe_backends(backends).c_str());
    if (const char* only = std::getenv("KVLAB_CASE")) {
        const std::string kernel = kernel_of(only);
        INFO("KVLAB_CASE='" << only << "'");
        REQUIRE_NOTHROW(entry_named(kernel).complete(only));  // a bad line fails every test
        if (kernel == e.name())
            run_line(e, only, backends);
        else
            std::printf("  KVLAB_CASE is a case of %s: nothing to run here\n", kernel.c_str());
        return;
    }
    for (const std::string& line : e.boundary) run_line(e, line, backends);
    rc::prop(e.name() +
                 ": every backend equals the first bit for bit and in FLOPs, writes only its outputs, and "
                 "the first is within the float64 oracle",
             [&] { run_case(e, e.draw(), backends, true); });
}

// One Catch test per entry, "backend ops: <kernel>", registered as TEST_CASE would (each its own
// ctest test), so that a new entry needs nothing else.
class KernelTest final : public Catch::ITestInvoker {
public:
    explicit KernelTest(std::size_t i) : i_(i) {}
    void invoke() const override { test_kernel(kernel_table()[i_]); }

private:
    std::size_t i_;
};

[[maybe_unused]] const bool kRegistered = [] {
    static std::deque<std::string> names;  // Catch keeps references
    for (std::size_t i = 0; i < kernel_table().size(); i++) {
        names.push_back("backend ops: " + kernel_table()[i].name());
        Catch::AutoReg(new KernelTest(i), Catch::SourceLineInfo(__FILE__, static_cast<std::size_t>(__LINE__)),
                       Catch::StringRef(), Catch::NameAndTags(names.back().c_str(), "[backend-ops]"));
    }
    return true;
}();

// ---- Planted backends, for the counter-tests: a CPU backend with one thing changed.

// A decorator (a ForwardingBackend over `inner`) and the backend it decorates, as one backend.
// (Layers is a base, constructed before ForwardingBackend takes a reference to the top layer.)
struct Layers {
    std::unique_ptr<Backend> base, top;
    Layers(std::unique_ptr<Backend> b, const std::function<std::unique_ptr<Backend>(Backend&)>& decorate)
        : base(std::move(b)), top(decorate(*base)) {}
};
class Decorated final : private Layers, public ForwardingBackend {
public:
    Decorated(std::unique_ptr<Backend> b, const std::function<std::unique_ptr<Backend>(Backend&)>& decorate)
        : Layers(std::move(b), decorate), ForwardingBackend(*top) {}
};

BackendEntry planted(const std::string& name,
                     std::function<std::unique_ptr<Backend>(Backend&, const Model&)> decorate) {
    return {name,
            [decorate](const Model& m) -> std::unique_ptr<Backend> {
                return std::make_unique<Decorated>(make_backend("cpu", m),
                                                   [&](Backend& cpu) { return decorate(cpu, m); });
            },
            runs_everywhere};
}

// After kernel `kernel` runs, one of: its first output element one ulp off (bit 0 flipped; an
// infinity becomes the largest finite float), a write just before or just after its output, a
// bit of its first input flipped, or one FLOP more counted. Host memory: it writes through the
// kernels' pointers.
class Sabotage final : public ForwardingBackend {
public:
    enum class Kind { one_ulp, write_before, write_after, write_input, extra_flop };
    Sabotage(Backend& inner, std::string kernel, Kind kind)
        : ForwardingBackend(inner), kernel_(std::move(kernel)), kind_(kind) {}

    void embed(Exec& ex, float* x, const int* tokens, int rows) override {
        inner().embed(ex, x, tokens, rows);
        touch("embed", ex, x, std::int64_t(rows) * config().dim, tokens, rows * sizeof(int));
    }
    void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) override {
        inner().matmul(ex, y, ldy, x, ldx, m, l, rows);
        touch("matmul", ex, y, std::int64_t(rows) * ldy, x, rows * sizeof(float));
    }
    void rmsnorm(Exec& ex, float* out, const float* x, Norm n, int l, int rows) override {
        inner().rmsnorm(ex, out, x, n, l, rows);
        touch("rmsnorm", ex, out, std::int64_t(rows) * config().dim, x, rows * sizeof(float));
    }
    void rope(Exec& ex, float* vec, int rows, int n_heads, const int* positions) override {
        inner().rope(ex, vec, rows, n_heads, positions);
        touch("rope", ex, vec, std::int64_t(rows) * n_heads * config().head_size(), positions, rows * sizeof(int));
    }
    void silu_mul(Exec& ex, float* h1, const float* h3, std::int64_t n) override {
        inner().silu_mul(ex, h1, h3, n);
        touch("silu_mul", ex, h1, n, h3, n * sizeof(float));
    }
    void add(Exec& ex, float* x, const float* y, std::int64_t n) override {
        inner().add(ex, x, y, n);
        touch("add", ex, x, n, y, n * sizeof(float));
    }
    void causal_attention(Exec& ex, float* att, const float* q, const float* k, const float* v, int T,
                          const int* kv_head) override {
        inner().causal_attention(ex, att, q, k, v, T, kv_head);
        touch("causal_attention", ex, att, std::int64_t(T) * config().dim, q, T * sizeof(float));
    }
    void store_kv(Exec& ex, const RowKV* rows, int n_rows, int l, const float* k, const float* v) override {
        inner().store_kv(ex, rows, n_rows, l, k, v);
        if (n_rows == 0) return;
        // Row 0's K storage: [n_layers * layer_rows, head_size] elements of its format, touched as
        // 4-byte words; the word holding its first stored element's first byte is the one changed.
        const RowKV& r = rows[0];
        const std::int64_t eb = kv_format_bytes(r.format), hs = config().head_size();
        touch("store_kv", ex, static_cast<float*>(r.k), (config().n_layers * r.layer_rows * hs * eb + 3) / 4, k,
              sizeof(float), (l * r.layer_rows + r.write_slot) * hs * eb / 4);
    }
    void attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                   const std::int64_t* slots, int max_n, const int* kv_head, int probe_row, float* probe) override {
        inner().attention(ex, att, q, rows, n_rows, l, slots, max_n, kv_head, probe_row, probe);
        touch("attention", ex, att, std::int64_t(n_rows) * config().dim, q, n_rows * sizeof(float));
    }

private:
    // out: the kernel's output, [n]; element `first` is the one an ulp changes. in: its first input,
    // of which `in_bytes` (none when it is empty) are certainly there.
    void touch(std::string_view kernel, Exec& ex, float* out, std::int64_t n, const void* in, std::size_t in_bytes,
               std::int64_t first = 0) {
        if (kernel != kernel_) return;
        switch (kind_) {
            case Kind::one_ulp:
                if (n > 0) {
                    float& x = out[first];
                    if (std::isinf(x))
                        x = std::nextafter(x, 0.0f);
                    else if (!std::isnan(x))
                        x = std::bit_cast<float>(float_bits(x) ^ 1u);
                }
                break;
            case Kind::write_before: out[-1] = 0.0f; break;
            case Kind::write_after: out[n] = 0.0f; break;
            case Kind::write_input:
                if (in_bytes > 0) *static_cast<unsigned char*>(const_cast<void*>(in)) ^= 1u;
                break;
            case Kind::extra_flop: ex.flops += 1; break;
        }
    }
    std::string kernel_;
    Kind kind_;
};

BackendEntry sabotaged(const std::string& kernel, Sabotage::Kind kind, const std::string& name) {
    return planted(name, [=](Backend& cpu, const Model&) { return std::make_unique<Sabotage>(cpu, kernel, kind); });
}

// The case line a failure message prints ("  case: <line>").
std::string case_line_of(const std::string& description) {
    const std::size_t at = description.find("  case: ");
    if (at == std::string::npos) return "";
    const std::size_t from = at + 8;
    return description.substr(from, description.find('\n', from) - from);
}

// A reference kernel with a bug its float64 oracle must see, in kernel `kernel` only: the planted
// bugs of tests/test_kernel_oracles.cpp's counter-tests, now behind a backend. Host memory.
class OffOracle final : public ForwardingBackend {
public:
    OffOracle(Backend& inner, const Model& m, std::string kernel)
        : ForwardingBackend(inner),
          model_(m),
          kernel_(std::move(kernel)),
          sees_next_(planted_naive_backend(Mutant::mask_off_by_one, inner)) {}

    // embed the row of the next token
    void embed(Exec& ex, float* x, const int* tokens, int rows) override {
        if (kernel_ != "embed") return inner().embed(ex, x, tokens, rows);
        std::vector<int> next(tokens, tokens + rows);  // [rows]
        for (int& t : next) t = (t + 1) % config().vocab_size;
        inner().embed(ex, x, next.data(), rows);
    }
    // a product that drops the last term
    void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) override {
        if (kernel_ != "matmul") return inner().matmul(ex, y, ldy, x, ldx, m, l, rows);
        const MatrixRef w = matrix_of(model_.w, m, l);
        const std::vector<float> t = in_out_copy({w.w, std::size_t(w.n_in) * w.n_out}, 1, w.n_out, w.n_in);
        matmul_reference(ex, y, ldy, x, ldx, t.data(), w.n_out, rows, std::max(w.n_in - 1, 0), w.n_out);
    }
    // rmsnorm with epsilon 1e-6 (visible only on rows of tiny values)
    void rmsnorm(Exec& ex, float* out, const float* x, Norm n, int l, int rows) override {
        if (kernel_ != "rmsnorm") return inner().rmsnorm(ex, out, x, n, l, rows);
        const int dim = config().dim;
        const float* w = norm_of(model_.w, n, l);
        for (int r = 0; r < rows; r++) {
            float ss = 0;
            for (int j = 0; j < dim; j++) ss = ss + x[r * dim + j] * x[r * dim + j];
            const float s = 1.0f / std::sqrt(ss / float(dim) + 1e-6f);
            for (int j = 0; j < dim; j++) out[r * dim + j] = w[j] * (s * x[r * dim + j]);
        }
    }
    // rope that reads the table at pos + 1
    void rope(Exec& ex, float* vec, int rows, int n_heads, const int* positions) override {
        if (kernel_ != "rope") return inner().rope(ex, vec, rows, n_heads, positions);
        std::vector<int> shifted(positions, positions + rows);  // [rows]
        for (int& p : shifted) p = std::min(p + 1, config().max_seq - 1);
        inner().rope(ex, vec, rows, n_heads, shifted.data());
    }
    // silu with e^a instead of e^-a
    void silu_mul(Exec& ex, float* h1, const float* h3, std::int64_t n) override {
        if (kernel_ != "silu_mul") return inner().silu_mul(ex, h1, h3, n);
        for (std::int64_t i = 0; i < n; i++) h1[i] = h1[i] * (1.0f / (1.0f + exp_f32(h1[i]))) * h3[i];
    }
    // add that rounds through a 16-bit significand
    void add(Exec& ex, float* x, const float* y, std::int64_t n) override {
        if (kernel_ != "add") return inner().add(ex, x, y, n);
        for (std::int64_t i = 0; i < n; i++) x[i] = std::bit_cast<float>(float_bits(x[i] + y[i]) & 0xffffff00u);
    }
    // naive attention whose mask lets row i see position i + 1 (proofs/planted.h: mask-off-by-one)
    void causal_attention(Exec& ex, float* att, const float* q, const float* k, const float* v, int T,
                          const int* kv_head) override {
        if (kernel_ != "causal_attention") return inner().causal_attention(ex, att, q, k, v, T, kv_head);
        sees_next_->causal_attention(ex, att, q, k, v, T, kv_head);
    }
    // a store that swaps K and V
    void store_kv(Exec& ex, const RowKV* rows, int n_rows, int l, const float* k, const float* v) override {
        if (kernel_ != "store_kv") return inner().store_kv(ex, rows, n_rows, l, k, v);
        inner().store_kv(ex, rows, n_rows, l, v, k);
    }
    // attention without the 1 / sqrt(head_size) scale (q scaled up to cancel it)
    void attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                   const std::int64_t* slots, int max_n, const int* kv_head, int probe_row, float* probe) override {
        if (kernel_ != "attention")
            return inner().attention(ex, att, q, rows, n_rows, l, slots, max_n, kv_head, probe_row, probe);
        std::vector<float> scaled(q, q + std::int64_t(n_rows) * config().dim);  // [n_rows, dim]
        for (float& x : scaled) x = x * std::sqrt(float(config().head_size()));
        inner().attention(ex, att, scaled.data(), rows, n_rows, l, slots, max_n, kv_head, probe_row, probe);
    }

private:
    const Model& model_;
    std::string kernel_;
    std::unique_ptr<Backend> sees_next_;
};

// A property over `e` on `backends` must fail with every one of `expected` in its message (the
// first is RapidCheck's check); then the case line it prints must fail again on its own with
// `backends`, and pass on the real table.
void expect_caught(const KernelEntry& e, const Backends& backends, const std::vector<std::string>& expected) {
    INFO("kernel " << e.name());
    const rc::detail::FailureResult failure =
        test::expect_failure([&] { run_case(e, e.draw(), backends, false); }, expected.at(0));
    for (const std::string& text : expected) CHECK_THAT(failure.description, Catch::Contains(text));
    const std::string line = case_line_of(failure.description);
    INFO("the case it printed: " << line);
    REQUIRE(kernel_of(line) == e.name());
    CHECK_THROWS_AS(run_case(e, e.complete(line), backends, false), rc::detail::CaseResult);
    CHECK_NOTHROW(run_case(e, e.complete(line), backend_table(), false));
}

}  // namespace

TEST_CASE("backend ops: every line parses back to its case and every boundary case is whole", "[backend-ops]") {
    for (const KernelEntry& e : kernel_table()) {
        const Case d = e.complete(e.defaults);
        CHECK(d.line() == e.defaults);
        for (const std::string& b : e.boundary) {
            const Case c = e.complete(b);
            CHECK(e.complete(c.line()).line() == c.line());
        }
    }
    const KernelEntry& mm = entry_named("matmul");
    CHECK(mm.complete("matmul rows=5 matrix=wcls").text("matrix") == "wcls");
    CHECK_THROWS_WITH(mm.complete("matmul rowz=5"), Catch::Contains("takes no 'rowz=5'"));
    CHECK_THROWS_WITH(mm.complete("rmsnorm rows=5"), Catch::Contains("is a case of rmsnorm, not of matmul"));
    CHECK_THROWS_WITH(entry_named("softmax"), Catch::Contains("no kernel 'softmax'"));
}

TEST_CASE("backend ops: the backend table names its backends and skips the GPU where there is none", "[backend-ops]") {
    const Model m = random_model(Config{8, 8, 1, 2, 1, 4, 4}, 1);
    for (const BackendEntry& b : backend_table()) {
        const std::string why = b.unavailable();
        INFO(b.name << ": " << (why.empty() ? "runs here" : why));
        if (why.empty()) {
            CHECK(b.make(m)->name() == b.name);
        } else {
            CHECK(b.name == "gpu");
            CHECK(why == gpu_unavailable());
            CHECK_THROWS_WITH(b.make(m), why);
        }
    }
}

TEST_CASE("backend ops counter-test: a backend one ulp off in one element of any kernel is caught and named",
          "[backend-ops][counter]") {
    for (const KernelEntry& e : kernel_table()) {
        const Backends table = {backend_table()[0], sabotaged(e.name(), Sabotage::Kind::one_ulp, "one-ulp-off")};
        expect_caught(e, table, {fmt::format("{}: one-ulp-off differs from cpu", e.name()), "1 ulp"});
    }
}

TEST_CASE("backend ops counter-test: a write just outside a kernel's output lands in a guard and is caught",
          "[backend-ops][counter]") {
    for (const KernelEntry& e : kernel_table()) {
        const Backends before = {backend_table()[0],
                                 sabotaged(e.name(), Sabotage::Kind::write_before, "writes-before")};
        expect_caught(e, before, {"writes-before wrote outside its output", "before it"});
        const Backends after = {backend_table()[0], sabotaged(e.name(), Sabotage::Kind::write_after, "writes-after")};
        expect_caught(e, after, {"writes-after wrote outside its output", "after it"});
    }
}

TEST_CASE("backend ops counter-test: a kernel that changes a bit of its input is caught", "[backend-ops][counter]") {
    for (const KernelEntry& e : kernel_table()) {
        const Backends table = {backend_table()[0], sabotaged(e.name(), Sabotage::Kind::write_input, "writes-input")};
        expect_caught(e, table, {"writes-input changed its input"});
    }
}

TEST_CASE("backend ops counter-test: a backend that counts one FLOP more in any kernel is caught",
          "[backend-ops][counter]") {
    for (const KernelEntry& e : kernel_table()) {
        const Backends table = {backend_table()[0], sabotaged(e.name(), Sabotage::Kind::extra_flop, "extra-flop")};
        expect_caught(e, table, {fmt::format("{}: extra-flop counted", e.name())});
    }
}

TEST_CASE("backend ops counter-test: a planted reference kernel off its float64 oracle is caught by the oracle",
          "[backend-ops][counter]") {
    // The text each kernel's oracle fails with (kernel_oracles.h, and the exact copies here).
    const std::pair<const char*, const char*> kernels[] = {{"embed", "embed x["},
                                                           {"matmul", "matmul Y"},
                                                           {"rmsnorm", "rmsnorm row"},
                                                           {"rope", "rope row"},
                                                           {"silu_mul", "silu_mul("},
                                                           {"add", "add("},
                                                           {"causal_attention", "attention_row"},
                                                           {"store_kv", "store_kv row"},
                                                           {"attention", "attention_row"}};
    CHECK(std::size(kernels) == kernel_table().size());
    for (const auto& [kernel, oracle_text] : kernels) {
        const std::string k = kernel;
        // Alone in its table: nothing to compare it with, only the oracle can catch it.
        const Backends table = {planted(
            "off-oracle", [k](Backend& cpu, const Model& m) { return std::make_unique<OffOracle>(cpu, m, k); })};
        expect_caught(entry_named(k), table,
                      {fmt::format("{}: off-oracle (the reference) is off its float64 oracle", k), oracle_text});
    }
}
