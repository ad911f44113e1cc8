// kvlab bench --startup MODEL: what a run of a checkpoint costs before its first logits, and the
// memory it then holds while decoding, against the goals of a mapped checkpoint (README, "Start-up
// and the panel cache"): start-up well under the time to read the weights, and resident memory
// close to one copy of the weights plus the KV cache.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cache.h"
#include "checkpoint.h"
#include "commands.h"
#include "common.h"
#include "cpu_backend.h"
#include "decode.h"
#include "json_text.h"
#include "model_loader.h"

namespace kvlab::cli {

namespace {

// This process's resident set now, from /proc/self/status (0 where there is none).
double resident_bytes() {
    std::ifstream status("/proc/self/status");
    std::string key;
    while (status >> key) {
        if (key == "VmRSS:") {
            double kib = 0;
            status >> kib;
            return kib * 1024;
        }
        status.ignore(1 << 16, '\n');
    }
    return 0;
}

double seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int run_bench_startup(const BenchOptions& o) {
    using clock = std::chrono::steady_clock;
    const double baseline = resident_bytes();  // the program, its libraries, what the CLI parsed
    const auto t0 = clock::now();
    Model model = load_checkpoint(o.startup);
    model.panel_cache = parse_panel_cache(o.panel_cache);
    const auto t_load = clock::now();
    CpuBackend backend(model);  // packs the panels, or maps them from the panel cache
    const auto t_panels = clock::now();
    const Config& c = model.config();
    ContiguousCache cache(c);
    CachedDecoder dec(backend, cache);
    dec.exec.n_threads = o.threads;
    std::vector<float> logits = dec.prefill(std::vector<int>{1 % c.vocab_size});
    const auto t_first = clock::now();
    // Greedy decode to max_seq (at most 255 steps): every weight and every KV row is touched.
    const int steps = std::min(255, c.max_seq - 1);
    for (int s = 0; s < steps; s++)
        logits = dec.decode(int(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    const auto t_end = clock::now();
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    const double peak = double(usage.ru_maxrss) * 1024;  // Linux reports KiB
    const double weights = double(std::filesystem::file_size(o.startup));
    const double kv = double(cache.memory().reserved_bytes);
    const std::string source = model.cpu_panels->source;
    if (o.json) {
        nlohmann::json j{{"model", o.startup},
                         {"threads", o.threads},
                         {"threads_choice", threads_json()},
                         {"panels", source},
                         {"map_seconds", seconds(t0, t_load)},
                         {"panels_seconds", seconds(t_load, t_panels)},
                         {"first_prefill_seconds", seconds(t_panels, t_first)},
                         {"startup_seconds", seconds(t0, t_first)},
                         {"decode_steps", steps},
                         {"decode_seconds", seconds(t_first, t_end)},
                         {"peak_resident_bytes", peak},
                         {"program_resident_bytes", baseline},
                         {"weights_bytes", weights},
                         {"kv_reserved_bytes", kv},
                         {"peak_over_weights_and_kv", peak / (weights + kv)},
                         {"model_over_weights_and_kv", (peak - baseline) / (weights + kv)}};
        fmt::print("{}\n", json_document(j));
        return 0;
    }
    fmt::print("kvlab bench --startup: {} ({}), {}; panels {}\n", o.startup, c.describe(), threads_text(o.threads),
               source);
    fmt::print(
        "start-up, load to first logits: {:.1f} ms (map and check the file {:.1f} ms, panels {:.1f} ms, first "
        "prefill {:.1f} ms)\n",
        1e3 * seconds(t0, t_first), 1e3 * seconds(t0, t_load), 1e3 * seconds(t_load, t_panels),
        1e3 * seconds(t_panels, t_first));
    fmt::print("then {} greedy decode steps in {:.1f} ms\n", steps, 1e3 * seconds(t_first, t_end));
    fmt::print(
        "peak resident memory {:.1f} MB = {:.3f} x (weights {:.1f} MB + KV reserved {:.1f} MB); without the "
        "{:.1f} MB the program and its libraries held before loading: {:.3f} x\n",
        peak / 1e6, peak / (weights + kv), weights / 1e6, kv / 1e6, baseline / 1e6, (peak - baseline) / (weights + kv));
    fmt::print("(in-process: starting the program itself, exec and dynamic linking, comes before this)\n");
    return 0;
}

}  // namespace kvlab::cli
