// kvlab trace and diff-trace (trace.h): a decode run written as .npy arrays with a JSON
// manifest, and the first place two of them differ.
#include "trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "cache_factory.h"
#include "common.h"
#include "decode.h"
#include "device.h"
#include "file_writer.h"
#include "json_text.h"
#include "sampler.h"

namespace kvlab::cli {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr std::int64_t kMaxFileBytes = std::int64_t(1) << 31;  // a trace file larger than 2 GiB is refused

// ----------------------------------------------------------------------------------------------
// Recording

struct Recorded {
    std::vector<int> tokens;       // [T]
    std::vector<float> logits;     // [steps + 1, vocab_size]
    std::vector<float> k, v;       // [n_layers, n_kv_heads, T, head_size]
    std::vector<float> attention;  // [steps + 1, n_layers, n_heads, T], or empty
};

// The probe's weights of the watched row as [n_layers, n_heads, T], zero past what it attended.
void append_weights(const AttentionProbe& probe, const Config& c, int T, std::vector<float>& out) {
    for (int lh = 0; lh < c.n_layers * c.n_heads; lh++) {
        const float* w = probe.weights.data() + std::size_t(lh) * c.max_seq;
        for (int t = 0; t < T; t++) out.push_back(t < probe.n ? w[t] : 0.0f);
    }
}

// The prompt's prefill, then `steps` greedy decode steps on `threads` threads; K and V read back
// from the cache.
Recorded record(const Model& m, Backend& backend, Cache& cache, std::vector<int> prompt, int steps, bool weights,
                const AttentionSpec& attention, int threads) {
    const Config& c = m.config();
    const int T = int(prompt.size()) + steps;
    Recorded r;
    CachedDecoder dec(backend, cache);
    dec.exec.attention = attention;
    assert(threads >= 1);  // resolved from auto by the caller
    dec.exec.n_threads = threads;
    AttentionProbe probe;
    if (weights) dec.observer = &probe;
    r.tokens = prompt;
    std::vector<float> logits = dec.prefill(prompt);
    for (int i = 0;; i++) {
        r.logits.insert(r.logits.end(), logits.begin(), logits.end());
        if (weights) append_weights(probe, c, T, r.attention);
        if (i == steps) break;
        r.tokens.push_back(argmax(logits));
        logits = dec.decode(r.tokens.back());
    }
    const int hs = c.head_size();
    for (const bool values : {false, true}) {
        std::vector<float>& out = values ? r.v : r.k;
        for (int l = 0; l < c.n_layers; l++)
            for (int h = 0; h < c.n_kv_heads; h++)
                for (int t = 0; t < T; t++) {
                    const float* row = values ? cache.value(l, h, t) : cache.key(l, h, t);
                    out.insert(out.end(), row, row + hs);
                }
    }
    assert(r.k.size() == std::size_t(c.n_layers) * c.n_kv_heads * T * hs && r.v.size() == r.k.size());
    return r;
}

json config_json(const Config& c) {
    return {{"dim", c.dim},         {"hidden_dim", c.hidden_dim}, {"n_layers", c.n_layers},
            {"n_heads", c.n_heads}, {"n_kv_heads", c.n_kv_heads}, {"vocab_size", c.vocab_size},
            {"max_seq", c.max_seq}};
}

NpyArray f32_array(std::vector<std::int64_t> shape, std::vector<float> data) {
    NpyArray a;
    a.dtype = "<f4", a.shape = std::move(shape), a.f32 = std::move(data);
    return a;
}

// Each array as a file (written whole, then renamed into place), then the manifest listing them.
void write_trace(const std::string& dir, json manifest, const std::map<std::string, NpyArray>& arrays) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (!fs::is_directory(dir))
        throw Error(fmt::format("trace --out '{}': not a folder kvlab can create", one_line(dir)));
    for (const auto& [name, a] : arrays) {
        const std::string bytes = npy_bytes(a), file = name + ".npy";
        FileWriter out((fs::path(dir) / file).string(), fmt::format("trace file '{}'", one_line(file)));
        out.bytes(bytes.data(), std::int64_t(bytes.size()));
        out.close();
        manifest["arrays"][name] = {
            {"file", file}, {"dtype", a.dtype}, {"shape", a.shape}, {"sha256", sha256_hex(bytes)}};
    }
    const std::string text = json_document(manifest) + "\n";
    FileWriter out((fs::path(dir) / "manifest.json").string(), "trace manifest");
    out.bytes(text.data(), std::int64_t(text.size()));
    out.close();
}

}  // namespace

void record_trace(const TraceRun& run, const std::string& dir) {
    const LoadedModel lm = run.random ? LoadedModel{random_model(run.shape, run.seed), std::nullopt,
                                                    fmt::format("random (seed {})", run.seed)}
                                      : load_model(run.model, run.tokenizer, run.shape, run.seed, run.panel_cache);
    const Config& c = lm.model.config();
    const std::vector<int> prompt = checked_prompt(lm, run.prompt, run.tokens, "", run.steps, 0);
    const auto v = parse_variant(run.cache);
    if (!v || !is_exact(*v))
        throw Error(fmt::format("trace: --cache '{}' is not an exact variant ({})", one_line(run.cache),
                                variant_names(exact_variants())));
    const std::unique_ptr<Backend> backend = make_backend(run.device, lm.model);
    CacheAndPool made = make_cache(c, default_spec(*v, c), backend->memory());
    const KVFormat format = parse_kv_format(run.kv_format);
    if (made.pool)
        made.pool->set_kv_format(format);  // a paged cache's blocks are its pool's
    else
        made.cache->set_kv_format(format);
    const AttentionSpec attention = attention_spec(run.attention);
    int threads = run.threads;  // 0 from a library caller (the fuzzers): auto, as main resolves it for the CLI
    resolve_threads(threads);
    const Recorded r = record(lm.model, *backend, *made.cache, prompt, run.steps, run.weights, attention, threads);
    const int T = int(r.tokens.size()), S = run.steps + 1;
    json model = {{"source", fs::path(lm.source).filename().string()},
                  {"config", config_json(c)},
                  {"fingerprint", fmt::format("{:016x}", lm.model.w.fingerprint())}};
    if (lm.source.starts_with("random")) model["seed"] = run.seed, model["source"] = "random";
    // The run's threads are not in it: any count writes the same trace (and golden.json keeps its SHA-256).
    const json manifest = {{"format", "kvlab-trace"},
                           {"version", 1},
                           {"model", model},
                           {"run",
                            {{"device", run.device},
                             {"cache", to_string(*v)},
                             {"kv_format", kv_format_name(format)},
                             {"attention", attention_name(attention)},
                             {"prompt_length", int(prompt.size())},
                             {"steps", run.steps}}}};
    std::map<std::string, NpyArray> arrays;
    arrays["tokens"].dtype = "<i4", arrays["tokens"].shape = {T};
    arrays["tokens"].i32.assign(r.tokens.begin(), r.tokens.end());
    arrays["logits"] = f32_array({S, c.vocab_size}, r.logits);
    arrays["k"] = f32_array({c.n_layers, c.n_kv_heads, T, c.head_size()}, r.k);
    arrays["v"] = f32_array({c.n_layers, c.n_kv_heads, T, c.head_size()}, r.v);
    if (run.weights) arrays["attention"] = f32_array({S, c.n_layers, c.n_heads, T}, r.attention);
    write_trace(dir, manifest, arrays);
}

// ----------------------------------------------------------------------------------------------
// Reading

namespace {

// A manifest field: present and of the kind asked, else an Error naming it.
const json& member(const json& j, const char* key, bool (json::*is)() const noexcept, const char* kind,
                   const std::string& what) {
    const auto it = j.is_object() ? j.find(key) : j.end();
    if (it == j.end() || !((*it).*is)()) throw Error(fmt::format("{}: its manifest has no {} \"{}\"", what, kind, key));
    return *it;
}
std::int64_t int_member(const json& j, const char* key, std::int64_t lo, std::int64_t hi, const std::string& what) {
    const std::int64_t v = member(j, key, &json::is_number_integer, "integer", what).get<std::int64_t>();
    if (v < lo || v > hi)
        throw Error(fmt::format("{}: its manifest's \"{}\" is {}, not in [{}, {}]", what, key, v, lo, hi));
    return v;
}

// A file name inside the trace's folder: no folders, nothing hidden.
bool plain_name(const std::string& f) {
    return !f.empty() && f.size() <= 64 && f[0] != '.' && std::all_of(f.begin(), f.end(), [](char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
               ch == '-' || ch == '.';
    });
}

Config manifest_config(const json& manifest, const std::string& what) {
    const json& c =
        member(member(manifest, "model", &json::is_object, "object", what), "config", &json::is_object, "object", what);
    Config config;
    config.dim = int(int_member(c, "dim", 1, 1 << 16, what));
    config.hidden_dim = int(int_member(c, "hidden_dim", 1, 1 << 18, what));
    config.n_layers = int(int_member(c, "n_layers", 1, 1024, what));
    config.n_heads = int(int_member(c, "n_heads", 1, 1024, what));
    config.n_kv_heads = int(int_member(c, "n_kv_heads", 1, 1024, what));
    config.vocab_size = int(int_member(c, "vocab_size", 1, 1 << 20, what));
    config.max_seq = int(int_member(c, "max_seq", 1, 1 << 20, what));
    try {
        config.validate();
    } catch (const Error& e) {
        throw Error(fmt::format("{}: its manifest's model config: {}", what, e.what()));
    }
    return config;
}

// The array the manifest lists as `name`, read and checked against its entry.
NpyArray manifest_array(const json& arrays, const std::string& name,
                        const std::function<std::string(const std::string&)>& read_file, const std::string& what) {
    const json& entry = member(arrays, name.c_str(), &json::is_object, "object", what + " arrays");
    const std::string file = member(entry, "file", &json::is_string, "string", what).get<std::string>();
    if (!plain_name(file))
        throw Error(fmt::format("{}: array {} names the file '{}', not a plain name in the trace's folder", what, name,
                                one_line(file)));
    const std::string bytes = read_file(file);
    const std::string sha = member(entry, "sha256", &json::is_string, "string", what).get<std::string>();
    if (sha256_hex(bytes) != sha)
        throw Error(fmt::format("{}: {} does not match the SHA-256 its manifest gives (changed or damaged)", what,
                                one_line(file)));
    NpyArray a = parse_npy(bytes, fmt::format("{}: {}", what, one_line(file)));
    const json& shape = member(entry, "shape", &json::is_array, "list", what);
    if (member(entry, "dtype", &json::is_string, "string", what).get<std::string>() != a.dtype ||
        shape != json(a.shape))
        throw Error(fmt::format("{}: {} holds {} {}, not what its manifest says", what, one_line(file), a.dtype,
                                json_text(json(a.shape))));
    return a;
}

void expect_shape(const NpyArray& a, const std::vector<std::int64_t>& want, const char* dtype, const std::string& name,
                  const std::string& what) {
    if (a.dtype != dtype || a.shape != want)
        throw Error(fmt::format("{}: {} is {} {}, but the model and run need {} {}", what, name, a.dtype,
                                json_text(json(a.shape)), dtype, json_text(json(want))));
}

}  // namespace

Trace parse_trace(const std::string& manifest_text, const std::function<std::string(const std::string&)>& read_file,
                  const std::string& what) {
    Trace tr;
    tr.manifest = json::parse(manifest_text, nullptr, false);
    const json& m = tr.manifest;
    if (m.is_discarded() || !m.is_object()) throw Error(fmt::format("{}: manifest.json is not a JSON object", what));
    if (!m.contains("format") || m["format"] != "kvlab-trace")
        throw Error(fmt::format("{}: manifest.json is not a kvlab trace's (no \"format\": \"kvlab-trace\")", what));
    if (int_member(m, "version", 1, 1, what) != 1) throw Error(fmt::format("{}: trace version not 1", what));
    const Config c = manifest_config(m, what);
    const json& run = member(m, "run", &json::is_object, "object", what);
    const std::int64_t P = int_member(run, "prompt_length", 1, c.max_seq, what);
    const std::int64_t steps = int_member(run, "steps", 0, c.max_seq - P, what);
    const json& arrays = member(m, "arrays", &json::is_object, "object", what);
    for (const char* name : {"tokens", "logits", "k", "v"})
        tr.arrays[name] = manifest_array(arrays, name, read_file, what);
    if (arrays.contains("attention")) tr.arrays["attention"] = manifest_array(arrays, "attention", read_file, what);
    const std::int64_t T = P + steps, S = steps + 1;
    expect_shape(tr.arrays["tokens"], {T}, "<i4", "tokens.npy", what);
    expect_shape(tr.arrays["logits"], {S, c.vocab_size}, "<f4", "logits.npy", what);
    for (const char* kv : {"k", "v"})
        expect_shape(tr.arrays[kv], {c.n_layers, c.n_kv_heads, T, c.head_size()}, "<f4", std::string(kv) + ".npy",
                     what);
    if (tr.arrays.count("attention"))
        expect_shape(tr.arrays["attention"], {S, c.n_layers, c.n_heads, T}, "<f4", "attention.npy", what);
    return tr;
}

Trace read_trace(const std::string& dir) {
    const std::string what = fmt::format("trace '{}'", one_line(dir));
    if (!fs::is_directory(dir)) throw Error(fmt::format("{}: not a folder", what));
    const auto read = [&](const std::string& file) {
        return read_file_bytes((fs::path(dir) / file).string(), kMaxFileBytes);
    };
    return parse_trace(read("manifest.json"), read, what);
}

// ----------------------------------------------------------------------------------------------
// Comparing

namespace {

// Distance in units in the last place: how many floats lie between a and b (null for a NaN).
json ulps(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return nullptr;
    const auto ordered = [](float x) {
        const std::int64_t i = std::bit_cast<std::int32_t>(x);
        return i < 0 ? std::int64_t(INT32_MIN) - i : i;
    };
    return std::llabs(ordered(a) - ordered(b));
}

struct Walker {
    const Trace& a;
    const Trace& b;
    TraceDiff d;
    std::map<std::string, std::int64_t> differing;

    // Element i of array `name`; at the first difference, its coordinates are kept.
    void element(const std::string& name, std::int64_t i, const json& where) {
        const NpyArray &x = a.arrays.at(name), &y = b.arrays.at(name);
        const bool same = name == "tokens" ? x.i32[std::size_t(i)] == y.i32[std::size_t(i)]
                                           : std::bit_cast<std::uint32_t>(x.f32[std::size_t(i)]) ==
                                                 std::bit_cast<std::uint32_t>(y.f32[std::size_t(i)]);
        if (same) return;
        differing[name]++;
        if (!d.equal) return;
        d.equal = false;
        d.first = where;
        d.first["array"] = name;
        if (name == "tokens") {
            d.first["a"] = x.i32[std::size_t(i)], d.first["b"] = y.i32[std::size_t(i)];
        } else {
            const float fa = x.f32[std::size_t(i)], fb = y.f32[std::size_t(i)];
            d.first["a"] = fmt::format("{:.9g}", fa), d.first["b"] = fmt::format("{:.9g}", fb);
            d.first["a_bits"] = fmt::format("0x{:08x}", std::bit_cast<std::uint32_t>(fa));
            d.first["b_bits"] = fmt::format("0x{:08x}", std::bit_cast<std::uint32_t>(fb));
            d.first["ulps"] = ulps(fa, fb);
        }
    }

    // Step s: its tokens, each layer's K then V rows of the positions it wrote, its logits, its weights.
    void step(int s, int P, const Config& c) {
        const int T = int(a.arrays.at("tokens").shape[0]), hs = c.head_size();
        const int from = s == 0 ? 0 : P - 1 + s, to = s == 0 ? P : P + s;
        for (int t = from; t < to; t++) element("tokens", t, {{"step", s}, {"position", t}});
        for (int l = 0; l < c.n_layers; l++)
            for (const char* kv : {"k", "v"})
                for (int h = 0; h < c.n_kv_heads; h++)
                    for (int t = from; t < to; t++)
                        for (int ch = 0; ch < hs; ch++)
                            element(kv, ((std::int64_t(l) * c.n_kv_heads + h) * T + t) * hs + ch,
                                    {{"step", s}, {"layer", l}, {"head", h}, {"position", t}, {"channel", ch}});
        for (int i = 0; i < c.vocab_size; i++)
            element("logits", std::int64_t(s) * c.vocab_size + i, {{"step", s}, {"position", P - 1 + s}, {"index", i}});
        if (!a.arrays.count("attention") || !b.arrays.count("attention")) return;
        for (int lh = 0; lh < c.n_layers * c.n_heads; lh++)
            for (int t = 0; t < T; t++)
                element("attention", (std::int64_t(s) * c.n_layers * c.n_heads + lh) * T + t,
                        {{"step", s},
                         {"position", P - 1 + s},
                         {"layer", lh / c.n_heads},
                         {"head", lh % c.n_heads},
                         {"key", t}});
    }
};

std::string where_text(const json& f) {
    std::string s = fmt::format("step {}", f["step"].get<int>());
    for (const char* k : {"layer", "head", "position", "channel", "index", "key"})
        if (f.contains(k)) s += fmt::format(", {} {}", k, f[k].get<int>());
    return s;
}

}  // namespace

TraceDiff diff_traces(const Trace& a, const Trace& b) {
    const Config c = manifest_config(a.manifest, "trace A"), cb = manifest_config(b.manifest, "trace B");
    const int P = a.manifest["run"]["prompt_length"], S = int(a.arrays.at("logits").shape[0]);
    if (config_json(c) != config_json(cb) || P != b.manifest["run"]["prompt_length"].get<int>() ||
        S != int(b.arrays.at("logits").shape[0]))
        throw Error(
            fmt::format("diff-trace: the traces cannot be compared: A is {} with a prompt of {} and {} steps, "
                        "B {} with {} and {}",
                        c.describe(), P, S - 1, cb.describe(), b.manifest["run"]["prompt_length"].get<int>(),
                        b.arrays.at("logits").shape[0] - 1));
    Walker w{a, b, {}, {}};
    for (int s = 0; s < S; s++) w.step(s, P, c);
    TraceDiff d = std::move(w.d);
    std::string counts;
    for (const auto& [name, arr] : a.arrays) {
        if (!b.arrays.count(name)) continue;
        d.counts[name] = {{"elements", arr.size()}, {"differing", w.differing[name]}};
        counts += fmt::format("{}{} {} of {}", counts.empty() ? "" : ", ", name, w.differing[name], arr.size());
    }
    if (d.equal) {
        d.text = fmt::format("bitwise equal: {} (elements differing of compared)\n", counts);
        return d;
    }
    const json& f = d.first;
    std::int64_t total = 0;
    for (const auto& [name, n] : w.differing) total += n;
    d.text =
        f["array"] == "tokens"
            ? fmt::format("first divergence: tokens at {}: A {} vs B {}\n", where_text(f), f["a"].get<int>(),
                          f["b"].get<int>())
            : fmt::format("first divergence: {} at {}: A {} ({}) vs B {} ({}), {}\n", f["array"].get<std::string>(),
                          where_text(f), f["a"].get<std::string>(), f["a_bits"].get<std::string>(),
                          f["b"].get<std::string>(), f["b_bits"].get<std::string>(),
                          f["ulps"].is_null() ? "a NaN" : fmt::format("{} ulp", f["ulps"].get<std::int64_t>()));
    d.text += fmt::format("{}: {} (elements differing of compared)\n",
                          total == 1 ? "the rest is bitwise equal" : fmt::format("{} more differ", total - 1), counts);
    return d;
}

// ----------------------------------------------------------------------------------------------
// The commands

int run_trace(const TraceOptions& o) {
    if (o.out.empty()) throw Error("trace: give --out DIR");
    record_trace(o.run, o.out);
    const Trace tr = read_trace(o.out);  // what was written reads back, every SHA-256 checked
    const NpyArray& tokens = tr.arrays.at("tokens");
    if (o.json) {
        fmt::print("{}\n", json_document(json{{"out", o.out},
                                              {"manifest", tr.manifest},
                                              {"threads", o.run.threads},
                                              {"threads_choice", threads_json()}}));
        return 0;
    }
    fmt::print(
        "kvlab trace: {} tokens ({} prompt, {} greedy steps) of {} on {}, {}, with a {} cache in {}; wrote {}/\n",
        tokens.shape[0], tr.manifest["run"]["prompt_length"].get<int>(), o.run.steps,
        tr.manifest["model"]["source"].get<std::string>(), o.run.device, threads_text(o.run.threads),
        tr.manifest["run"]["cache"].get<std::string>(), tr.manifest["run"]["kv_format"].get<std::string>(),
        one_line(o.out));
    for (const auto& [name, a] : tr.arrays)
        fmt::print("  {:<10} {} {}\n", name + ".npy", a.dtype, json_text(json(a.shape)));
    return 0;
}

int run_diff_trace(const DiffTraceOptions& o) {
    const Trace a = read_trace(o.a), b = read_trace(o.b);
    const TraceDiff d = diff_traces(a, b);
    if (o.json)
        fmt::print("{}\n", json_document(json{
                               {"a", o.a}, {"b", o.b}, {"equal", d.equal}, {"first", d.first}, {"counts", d.counts}}));
    else
        fmt::print("kvlab diff-trace {} {}\n{}", one_line(o.a), one_line(o.b), d.text);
    return d.equal ? 0 : 1;
}

}  // namespace kvlab::cli
