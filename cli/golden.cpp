// kvlab golden: a small set of KV traces (trace.h) kept with the sources as the reference every
// backend must reproduce bit for bit, and the check that reruns them.
//
// --out DIR writes DIR/golden.json and one trace folder per run below: stories260K (when the
// shared model is there) and random models of two shapes, in fp32 and in narrow KV formats and
// tiled attention, so that the kernels' order for every element is pinned, not only one path's.
// golden.json lists each run's parameters and its manifest's SHA-256; each manifest lists its
// arrays' SHA-256. --check DIR reruns every run on each --device and diffs it with the kept trace.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common.h"
#include "device.h"
#include "file_writer.h"
#include "json_text.h"
#include "models_dir.h"
#include "trace.h"

namespace kvlab::cli {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct GoldenRun {
    const char* name;
    const char* model;  // a file in the shared models folder, or "" for a random model of `shape`
    const char* shape;
    std::uint64_t seed;
    const char* prompt;  // text (with the model's tokenizer), or token ids for a random model
    int steps;
    const char* cache;
    const char* kv_format;
    const char* attention;
    int tile;
};

// The runs, in order. Shapes: stories260K's own; a GQA shape with head_size 8; a wide one with
// head_size 64 (the sixteen-key attention path), each long enough to cross a tile or two.
const GoldenRun kRuns[] = {
    {"stories260k", "stories260K.bin", "", 0, "Once upon a time", 12, "contiguous-head", "fp32", "simple", 64},
    {"stories260k-paged-fp8", "stories260K.bin", "", 0, "Once upon a time", 8, "paged", "fp8-e4m3", "simple", 64},
    {"random-gqa", "", "dim=48,hidden_dim=64,n_layers=3,n_heads=6,n_kv_heads=2,vocab_size=96,max_seq=64", 1,
     "1,17,42,9,88,3", 16, "contiguous-head", "fp32", "simple", 64},
    {"random-gqa-tiled-bf16", "", "dim=48,hidden_dim=64,n_layers=3,n_heads=6,n_kv_heads=2,vocab_size=96,max_seq=64", 1,
     "1,17,42,9,88,3", 16, "growing", "bf16", "tiled", 8},
    {"random-wide-int8", "", "dim=128,hidden_dim=96,n_layers=2,n_heads=2,n_kv_heads=1,vocab_size=64,max_seq=48", 2,
     "5,4,3,2,1", 20, "contiguous-seq", "int8", "simple", 64},
};

TraceRun trace_run(const GoldenRun& g, const std::string& device, const std::string& models, int threads) {
    TraceRun r;
    r.threads = threads;
    if (*g.model) {
        r.model = (fs::path(models) / g.model).string();
        r.tokenizer = (fs::path(models) / "tok512.bin").string();
        r.prompt = g.prompt;
    } else {
        r.random = true;
        r.shape = shape_from_string(g.shape);
        r.seed = g.seed;
        r.tokens = g.prompt;
    }
    r.panel_cache = "off";
    r.steps = g.steps;
    r.device = device;
    r.cache = g.cache;
    r.kv_format = g.kv_format;
    r.attention = {g.attention, g.tile};
    r.weights = true;
    return r;
}

json run_json(const GoldenRun& g) {
    return {{"model", *g.model ? g.model : "random"},
            {"shape", g.shape},
            {"seed", g.seed},
            {"prompt", g.prompt},
            {"steps", g.steps},
            {"cache", g.cache},
            {"kv_format", g.kv_format},
            {"attention", g.attention},
            {"tile", g.tile}};
}

int write_golden(const GoldenOptions& o, const std::string& models) {
    json index = {{"format", "kvlab-golden"}, {"version", 1}, {"traces", json::array()}};
    for (const GoldenRun& g : kRuns) {
        if (*g.model && models.empty())
            throw Error("golden --out: stories260K.bin not found (the shared models folder)");
        const std::string dir = (fs::path(o.out) / g.name).string();
        record_trace(trace_run(g, "cpu", models, o.threads), dir);
        const std::string manifest = read_file_bytes((fs::path(dir) / "manifest.json").string(), 1 << 24);
        index["traces"].push_back({{"name", g.name}, {"run", run_json(g)}, {"manifest_sha256", sha256_hex(manifest)}});
        fmt::print("wrote {}/ ({})\n", one_line(dir), sha256_hex(manifest).substr(0, 16));
    }
    const std::string text = json_document(index) + "\n";
    FileWriter out((fs::path(o.out) / "golden.json").string(), "golden.json");
    out.bytes(text.data(), std::int64_t(text.size()));
    out.close();
    return 0;
}

// One kept trace against a rerun on `device`: "" when bitwise equal, else the difference.
std::string check_one(const GoldenRun& g, const std::string& kept, const std::string& device, const std::string& models,
                      const std::string& scratch, int threads) {
    const Trace want = read_trace(kept);
    const std::string dir = (fs::path(scratch) / fmt::format("{}-{}", g.name, device)).string();
    record_trace(trace_run(g, device, models, threads), dir);
    const TraceDiff d = diff_traces(want, read_trace(dir));
    fs::remove_all(dir);
    return d.equal ? "" : d.text;
}

}  // namespace

int run_golden(const GoldenOptions& options) {
    // Library callers (the fuzzers) pass the options' default, 0: auto, which main resolves for the CLI.
    GoldenOptions o = options;
    resolve_threads(o.threads);
    const std::string models = models_dir();
    if (!o.out.empty()) return write_golden(o, models);
    if (o.check.empty()) throw Error("golden: give --out DIR (write) or --check DIR (rerun and compare)");
    const json index =
        json::parse(read_file_bytes((fs::path(o.check) / "golden.json").string(), 1 << 24), nullptr, false);
    if (index.is_discarded() || !index.is_object() || !index.contains("traces") || !index["traces"].is_array())
        throw Error(fmt::format("golden --check '{}': golden.json is not a kvlab golden index", one_line(o.check)));
    std::vector<std::string> devices{"cpu", "gpu-host"};
    if (o.device != "all")
        devices = parse_devices(o.device);
    else if (gpu_unavailable().empty())
        devices.push_back("gpu");
    const fs::path scratch = fs::temp_directory_path() / fmt::format("kvlab-golden-{}", ::getpid());
    fs::create_directories(scratch);
    int failed = 0, checked = 0;
    for (const GoldenRun& g : kRuns) {
        const std::string kept = (fs::path(o.check) / g.name).string();
        const auto it = std::find_if(index["traces"].begin(), index["traces"].end(),
                                     [&](const json& t) { return t.value("name", "") == g.name; });
        if (it == index["traces"].end() || (*it)["run"] != run_json(g))
            throw Error(
                fmt::format("golden --check: {} is missing from golden.json or was made by other parameters; "
                            "rewrite it with kvlab golden --out",
                            g.name));
        const std::string manifest = read_file_bytes((fs::path(kept) / "manifest.json").string(), 1 << 24);
        if (sha256_hex(manifest) != (*it).value("manifest_sha256", ""))
            throw Error(fmt::format("golden --check: {}/manifest.json does not match golden.json's SHA-256", g.name));
        for (const std::string& device : devices) {
            if (*g.model && models.empty()) {
                fmt::print("{:<24} {:<9} skipped: stories260K.bin not found\n", g.name, device);
                continue;
            }
            const std::string diff = check_one(g, kept, device, models, scratch.string(), o.threads);
            checked++, failed += !diff.empty();
            fmt::print("{:<24} {:<9} {}\n", g.name, device, diff.empty() ? "bitwise equal" : "DIFFERS: " + diff);
        }
    }
    fs::remove_all(scratch);
    fmt::print("{} of {} golden runs reproduced bit for bit ({})\n", checked - failed, checked,
               threads_text(o.threads));
    return failed == 0 ? 0 : 1;
}

}  // namespace kvlab::cli
