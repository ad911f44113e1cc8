// kvlab bench --background-load N: greedy decode tok/s for each thread count, on an idle machine
// and beside N busy-looping processes that kvlab starts and stops itself, in one interleaved run
// (each repetition measures every row, idle then loaded), so that noise hits every row alike.
// Every run's logits are checked: at four positions they equal naive decode's bit for bit, and
// every step's hash (64-bit FNV-1a of the bits) equals the untimed 1-thread reference run's.
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "common.h"
#include "compare.h"
#include "cost_model.h"
#include "decode.h"
#include "json_text.h"
#include "model.h"
#include "thread_pool.h"

namespace kvlab::cli {

namespace {

// N processes that spin until stopped, each killed by the kernel when kvlab dies (parent death
// signal) and by its own alarm after bound_s seconds at the latest.
class BackgroundLoad {
public:
    BackgroundLoad(int n, unsigned bound_s) {
        const pid_t parent = getpid();
        for (int i = 0; i < n; i++) {
            const pid_t pid = fork();
            if (pid < 0)
                throw Error(fmt::format("bench --background-load: cannot start a process: {}", std::strerror(errno)));
            if (pid == 0) {  // only async-signal-safe calls from here on: the parent has threads
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() != parent) _exit(0);
                alarm(bound_s);
                volatile unsigned long spin = 0;
                for (;;) spin = spin + 1;
            }
            pids_.push_back(pid);
        }
    }
    ~BackgroundLoad() {
        for (const pid_t pid : pids_) kill(pid, SIGKILL);
        for (const pid_t pid : pids_) waitpid(pid, nullptr, 0);
    }
    BackgroundLoad(const BackgroundLoad&) = delete;
    BackgroundLoad& operator=(const BackgroundLoad&) = delete;

private:
    std::vector<pid_t> pids_;
};

int argmax(const std::vector<float>& logits) {
    return int(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

std::uint64_t fnv1a(std::uint64_t h, const std::vector<float>& v) {
    for (const float x : v) {
        std::uint32_t bits;
        std::memcpy(&bits, &x, sizeof bits);
        for (int b = 0; b < 4; b++) h = (h ^ ((bits >> (8 * b)) & 0xff)) * 0x100000001b3ull;
    }
    return h;
}

// The machine's memory read bandwidth on `threads` threads, in GB/s (best of 3 passes over `bytes`):
// a decode step streams every weight once, so at this rate a model's decode stops speeding up
// with more threads, whatever its kernels do.
double read_bandwidth(int threads, std::size_t bytes) {
    const std::size_t n = bytes / sizeof(std::uint32_t);
    std::vector<std::uint32_t> buffer(n, 1);  // [n]
    assert(buffer.size() == n);
    double best = 0;
    for (int pass = 0; pass < 3; pass++) {
        std::vector<std::uint32_t> sums(std::size_t(threads), 0);  // [threads]
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> readers;
        for (int t = 0; t < threads; t++)
            readers.emplace_back([&, t] {
                std::uint32_t sum = 0;  // unsigned: the compiler may vectorize and reorder it
                for (std::size_t i = n * std::size_t(t) / std::size_t(threads);
                     i < n * std::size_t(t + 1) / std::size_t(threads); i++)
                    sum += buffer[i];
                sums[std::size_t(t)] = sum;
            });
        for (std::thread& r : readers) r.join();
        const double s = seconds_since(t0);
        std::uint32_t total = 0;
        for (const std::uint32_t x : sums) total += x;
        if (total != std::uint32_t(n)) throw Error("bench: the bandwidth probe read wrong sums");
        best = std::max(best, double(n * sizeof(std::uint32_t)) / s / 1e9);
    }
    return best;
}

// One greedy decode: the tokens it fed, a hash of every step's logits, the logits after each
// checkpoint's number of tokens, and how many of its loops the pool ran on threads.
struct Run {
    double seconds = 0;
    std::vector<int> tokens;
    std::uint64_t hash = 0xcbf29ce484222325ull;
    std::vector<std::vector<float>> at_checkpoints;  // [checkpoints.size()][vocab_size]
    std::uint64_t loops_threaded = 0, loops_alone = 0, stalls = 0;
};

// Where bench --plant (tests only) flips a logit's lowest bit, so that one check must see it: in
// the most-threaded loaded rows at a step between checkpoints (only the reference's hashes catch
// it), or in every run at the last checkpoint, the reference too (only naive decode catches it).
enum class Plant { none, step, checkpoint };

Run greedy_run(const Model& model, int threads, int steps, const std::vector<int>& checkpoints, Plant plant) {
    CachedDecoder dec(model, threads);
    Run r;
    r.tokens = {1};
    const PoolCounters before = pool_counters();
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> logits = dec.prefill(r.tokens);
    bool planted = false;
    for (int s = 0;; s++) {
        const bool at_checkpoint =
            std::find(checkpoints.begin(), checkpoints.end(), int(r.tokens.size())) != checkpoints.end();
        if (!planted && ((plant == Plant::step && !at_checkpoint) || (plant == Plant::checkpoint && s == steps))) {
            float& lowest = *std::min_element(logits.begin(), logits.end());  // never the argmax: tokens stay
            std::uint32_t bits;
            std::memcpy(&bits, &lowest, sizeof bits);
            bits ^= 1;
            std::memcpy(&lowest, &bits, sizeof bits);
            planted = true;
        }
        r.hash = fnv1a(r.hash, logits);
        if (at_checkpoint) r.at_checkpoints.push_back(logits);
        if (s == steps) break;
        r.tokens.push_back(argmax(logits));
        logits = dec.decode(r.tokens.back());
    }
    r.seconds = seconds_since(t0);
    if (plant == Plant::step && !planted) throw Error("bench --plant step: no step lies between the checkpoints");
    const PoolCounters after = pool_counters();
    r.loops_threaded = after.loops - before.loops, r.loops_alone = after.serial_loops - before.serial_loops;
    r.stalls = after.stalls - before.stalls;
    return r;
}

struct Cell {
    int threads = 1, load = 0;
    std::vector<double> seconds;
    std::uint64_t loops_threaded = 0, loops_alone = 0, stalls = 0;
    bool equal_reference = true;  // every run's every step hashes as the reference run's
    bool equal_naive = true;      // every run's logits at the checkpoints equal naive decode's
    bool bitwise() const { return equal_reference && equal_naive; }
    double median() const {
        std::vector<double> s = seconds;
        std::sort(s.begin(), s.end());
        return s.size() % 2 ? s[s.size() / 2] : 0.5 * (s[s.size() / 2 - 1] + s[s.size() / 2]);
    }
};

// Every (load, thread count) cell, each repetition running them all: idle, then loaded. An
// untimed first run (1 thread, idle) is the reference: naive decode over its tokens gives the
// logits at the checkpoints, which every run must equal bit for bit, and every run's every step
// must hash as the reference's do.
std::vector<Cell> measure_cells(const Model& model, const BenchOptions& o, int steps) {
    const std::vector<int> checkpoints = {1 + steps / 4, 1 + steps / 2, 1 + 3 * steps / 4, 1 + steps};
    std::vector<int> loads = {0};
    if (o.background_load > 0) loads.push_back(o.background_load);
    std::vector<Cell> cells;  // [loads][threads 1..o.threads]
    for (const int load : loads)
        for (int t = 1; t <= o.threads; t++) {
            Cell cell;
            cell.threads = t, cell.load = load;
            cells.push_back(cell);
        }
    const Plant plant = o.plant == "step" ? Plant::step : o.plant == "checkpoint" ? Plant::checkpoint : Plant::none;
    const Run reference = greedy_run(model, 1, steps, checkpoints, plant == Plant::checkpoint ? plant : Plant::none);
    std::vector<std::vector<float>> naive_at;  // [checkpoints.size()][vocab_size]
    {
        NaiveDecoder naive(model, 1);
        for (const int T : checkpoints)
            naive_at.push_back(naive.forward(std::span<const int>(reference.tokens.data(), std::size_t(T))));
    }
    const Progress progress;
    const unsigned bound_s = 600;  // a load outlives no run of this table: one cell takes seconds
    for (int rep = 0; rep < o.reps; rep++)
        for (const int load : loads) {
            progress(fmt::format("bench: run {} of {}, {} busy process(es) beside", rep + 1, o.reps, load));
            const BackgroundLoad busy(load, bound_s);
            for (Cell& cell : cells) {
                if (cell.load != load) continue;
                const bool planted = plant == Plant::checkpoint ||
                                     (cell.threads == o.threads && cell.threads > 1 && load == loads.back());
                const Run r = greedy_run(model, cell.threads, steps, checkpoints, planted ? plant : Plant::none);
                cell.seconds.push_back(r.seconds);
                cell.loops_threaded += r.loops_threaded, cell.loops_alone += r.loops_alone, cell.stalls += r.stalls;
                cell.equal_reference = cell.equal_reference && r.hash == reference.hash && r.tokens == reference.tokens;
                for (std::size_t k = 0; k < checkpoints.size(); k++)
                    cell.equal_naive = cell.equal_naive && r.at_checkpoints.size() == checkpoints.size() &&
                                       !first_difference(naive_at[k], r.at_checkpoints[k]);
            }
        }
    return cells;
}

// The 1-thread cell's median at the same load.
double one_thread_median(const std::vector<Cell>& cells, const Cell& cell) {
    for (const Cell& b : cells)
        if (b.load == cell.load && b.threads == 1) return b.median();
    return cell.median();
}

// What a decode step reads (every weight, once), and the rate the machine reads memory at, idle.
struct Bandwidth {
    double weight_bytes = 0;
    std::vector<double> read_gb_s;  // [threads]: on 1..threads threads
    double weights_gb_s(const Cell& cell, int steps) const { return weight_bytes * steps / cell.median() / 1e9; }
};

Bandwidth measure_bandwidth(const Model& model, int threads) {
    Bandwidth b;
    b.weight_bytes = panel_bytes(model.config());
    // Four times the weights, so that no cache holds it, from 64 MB to 256 MB.
    const auto bytes = std::size_t(std::clamp(4 * b.weight_bytes, 64e6, 256e6));
    for (int t = 1; t <= threads; t++) b.read_gb_s.push_back(read_bandwidth(t, bytes));
    assert(b.read_gb_s.size() == std::size_t(threads));
    return b;
}

void print_threads_json(const Config& c, const BenchOptions& o, int steps, const std::vector<Cell>& cells,
                        const Bandwidth& bw) {
    nlohmann::json rows = nlohmann::json::array();
    for (const Cell& cell : cells)
        rows.push_back({{"threads", cell.threads},
                        {"background_load", cell.load},
                        {"decode_tokens_per_second", steps / cell.median()},
                        {"weights_read_gb_per_second", bw.weights_gb_s(cell, steps)},
                        {"vs_1_thread_same_load", one_thread_median(cells, cell) / cell.median()},
                        {"loops_on_threads", cell.loops_threaded},
                        {"loops_on_caller_alone", cell.loops_alone},
                        {"stalls", cell.stalls},
                        {"bitwise_equal_naive", cell.bitwise()},
                        {"checkpoints_equal_naive", cell.equal_naive},
                        {"steps_equal_reference", cell.equal_reference}});
    fmt::print("{}\n", json_document({{"shape", c.describe()},
                                      {"steps", steps},
                                      {"reps", o.reps},
                                      {"threads", o.threads},
                                      {"threads_choice", threads_json()},
                                      {"background_load", o.background_load},
                                      {"weight_bytes", bw.weight_bytes},
                                      {"memory_read_gb_per_second_idle", bw.read_gb_s},
                                      {"rows", rows}}));
}

void print_threads_text(const Config& c, const BenchOptions& o, int steps, const std::vector<Cell>& cells,
                        const Bandwidth& bw) {
    fmt::print("kvlab bench --background-load {}: random model, {}\n", o.background_load, c.describe());
    fmt::print(
        "greedy decode of {} tokens after one, cached; median of {} runs, every row in each run (idle, then beside "
        "{} busy-looping process{} of kvlab's own); threads 1..{}: {}\n\n",
        steps, o.reps, o.background_load, o.background_load == 1 ? "" : "es", o.threads, threads_text(o.threads));
    fmt::print("{:>7} {:>5} {:>13} {:>20} {:>13} {:>17} {:>7}  {}\n", "threads", "load", "decode tok/s",
               "vs 1 thread, same load", "weights GB/s", "loops on threads", "stalls", "logits");
    for (const Cell& cell : cells) {
        const std::uint64_t loops = cell.loops_threaded + cell.loops_alone;
        const bool one = cell.threads == 1;
        fmt::print("{:>7} {:>5} {:>13.1f} {:>19.2f}x {:>13.1f} {:>17} {:>7}  {}\n", cell.threads, cell.load,
                   steps / cell.median(), one_thread_median(cells, cell) / cell.median(), bw.weights_gb_s(cell, steps),
                   one ? std::string("-") : fmt::format("{:.0f}%", loops ? 100.0 * cell.loops_threaded / loops : 0.0),
                   one ? std::string("-") : std::to_string(cell.stalls),
                   cell.bitwise() ? "bitwise equal to naive decode" : "DIFFER");
    }
    fmt::print(
        "\nloops on threads: of a row's parallel loops, those the pool gave its workers; it ran the rest on the "
        "caller alone, where workers had lately cost more than they saved (core/thread_pool.h); stalls: loops whose "
        "caller waited on a descheduled worker's chunk, over all runs\n");
    std::string rates;
    for (std::size_t t = 0; t < bw.read_gb_s.size(); t++)
        rates += fmt::format("{}{:.1f} GB/s on {} thread{}", t ? ", " : "", bw.read_gb_s[t], t + 1, t ? "s" : "");
    fmt::print(
        "weights GB/s: the {:.1f} MB of weights a step reads, times steps per second; this machine reads memory at "
        "{} (idle, best of 3): where a row comes near that, more threads cannot make it faster\n",
        bw.weight_bytes / 1e6, rates);
}

}  // namespace

int run_bench_threads(const BenchOptions& o) {
    const Config c = shape_from_string(o.shape);
    const Model model = random_model(c, o.seed);
    const int steps = bench_lengths(c, o).back() - 1;
    if (steps < 1) throw Error("bench --background-load: the longest of --lengths must be at least 2");
    const std::vector<Cell> cells = measure_cells(model, o, steps);
    const Bandwidth bw = measure_bandwidth(model, o.threads);
    if (o.json)
        print_threads_json(c, o, steps, cells, bw);
    else
        print_threads_text(c, o, steps, cells, bw);
    for (const Cell& cell : cells)
        if (!cell.bitwise()) {
            fmt::print(stderr, "kvlab: error: the decoders' logits are not bitwise equal\n");
            return 1;
        }
    return 0;
}

}  // namespace kvlab::cli
