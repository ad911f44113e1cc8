// kvlab CLI: one function per command; main.cpp parses the options into these structs.
#pragma once

#include <cstdint>
#include <string>

#include "config.h"

namespace kvlab::cli {

// --attention and --tile (core/tiled_attention.h): the attention every decoder of a command runs.
struct AttentionOptions {
    std::string kind = "simple";  // simple or tiled
    int tile = 64;                // keys per tile (tiled)
};

struct ModelOptions {
    std::string model;                 // llama2.c checkpoint; default: the shared stories260K, else random
    std::string tokenizer;             // llama2.c tokenizer.bin
    std::uint64_t seed = 7;            // for the random model
    std::string panel_cache = "auto";  // auto, on, off or a folder (core/panel_cache.h)
};

struct DemoOptions {
    ModelOptions m;
    AttentionOptions attention;
    std::string prompt, tokens;
    int steps = 64;
    int threads = 0;             // 0: auto (common.h resolve_threads)
    std::string device = "cpu";  // one device, or two side by side (gpu/device.h: parse_devices)
    bool graphs = true;
    bool json = false;
    std::string kv_format = "fp32";  // core/kv_format.h: the format the cache stores K and V in
    std::string kv_calibrate;        // fp8: text whose fp32 prefill sets the scales ("": all 1)
    bool logprobs = false;           // each decoded token's log-probability, rescored by one prefill
};
int run_demo(const DemoOptions& o);

struct GenerateOptions {
    ModelOptions m;
    AttentionOptions attention;
    std::string prompt, tokens;
    int steps = 256;
    float temperature = 0.0f;  // 0 = greedy
    float top_p = 0.9f;
    std::uint64_t sample_seed = 42;
    int threads = 0;  // 0: auto (common.h resolve_threads)
    std::string device = "cpu";
    bool graphs = true;
    bool json = false;
    std::string kv_format = "fp32";  // core/kv_format.h: the format the cache stores K and V in
    std::string kv_calibrate;        // fp8: text whose fp32 prefill sets the scales ("": all 1)
    bool logprobs = false;           // print each generated token's log-probability, and rescore them
};
int run_generate(const GenerateOptions& o);

struct SpeculateOptions {
    ModelOptions m;
    AttentionOptions attention;
    std::string draft = "random";  // a checkpoint, "self" (the target), or "random" (the target's shape, 1 layer)
    std::uint64_t draft_seed = 1;  // for the random draft
    int k = 4;                     // draft tokens per target step
    std::string prompt, tokens;
    int steps = 100;
    int reps = 3;     // timed runs of each decode; the fastest counts
    int threads = 0;  // 0: auto (common.h resolve_threads)
    std::string device = "cpu";
    std::string kv_format = "fp32";  // the target's, plain decode's and the draft's caches
    bool json = false;
};
int run_speculate(const SpeculateOptions& o);

// What kvlab trace records: a model (a checkpoint, or random of `shape` and `seed` when
// `random`), a prompt, greedy steps, and where and how the cached decoder runs.
struct TraceRun {
    std::string model, tokenizer;  // "": the shared stories260K when present (unless random)
    bool random = false;
    Config shape = stories260k_shape();
    std::uint64_t seed = 7;
    std::string panel_cache = "auto";
    std::string prompt, tokens;
    int steps = 8;
    std::string device = "cpu";
    std::string cache = "contiguous-head";  // an exact variant, at its defaults
    std::string kv_format = "fp32";
    AttentionOptions attention;
    bool weights = false;  // attention.npy too
    int threads = 0;       // 0: auto (common.h resolve_threads); the trace is the same for any count
};
struct TraceOptions {
    TraceRun run;
    std::string shape;  // --shape: a random model of this shape
    std::string out;
    bool json = false;
};
// Records a run into folder `dir` (cli/trace.h).
void record_trace(const TraceRun& run, const std::string& dir);
int run_trace(const TraceOptions& o);

struct DiffTraceOptions {
    std::string a, b;
    bool json = false;
};
int run_diff_trace(const DiffTraceOptions& o);

// kvlab golden (cli/golden.cpp): write the golden traces, or rerun and compare them.
struct GoldenOptions {
    std::string out, check;
    std::string device = "cpu";  // --check: one device, or two (cpu,gpu-host)
    int threads = 0;             // 0: auto (common.h resolve_threads)
};
int run_golden(const GoldenOptions& o);

// kvlab serve-sim (cli/serve_sim.cpp): a workload through the continuous-batching scheduler.
struct ServeSimOptions {
    ModelOptions m;
    std::string trace;  // a JSON-lines request file; "": a generated workload
    int requests = 200;
    std::uint64_t workload_seed = 1;
    double arrival_rate = 4.0;  // requests per step, Poisson (0: all at step 0)
    double system_prompt_share = 0.5;
    int system_prompt_len = 16;
    std::string prompt_len = "8-48", output_len = "8-64";
    int max_model_len = 0, block_size = 16, num_blocks = 0, max_batch_tokens = 256;
    double memory_utilization = 0.9, watermark = 0.01;
    std::string device_memory = "2MiB";
    std::string prefix_caching = "on", preemption = "recompute", kv_format = "fp32";
    std::string store;          // the tier below the pool (open_block_store); "": none
    std::string role = "both";  // both, or disaggregated: prefill (into the store) or decode (from it)
    AttentionOptions attention;
    int threads = 0;  // 0: auto (common.h resolve_threads)
    bool check = true;
    bool json = false;
};
int run_serve_sim(const ServeSimOptions& o);

// kvlab beam (cli/beam.cpp): beam search on forked caches.
struct BeamOptions {
    ModelOptions m;
    std::string prompt, tokens;
    int width = 4, steps = 16, block_size = 4;
    std::string kv_format = "fp32";
    AttentionOptions attention;
    int threads = 0;  // 0: auto (common.h resolve_threads)
    bool json = false;
};
int run_beam(const BeamOptions& o);

// kvlab frontier (cli/frontier.cpp): each cache strategy's quality against its KV bytes per token.
struct FrontierOptions {
    ModelOptions m;
    int prompts = 8;         // texts the model writes, each decoded by every setting
    int length = 0;          // tokens per text; 0: max_seq
    int prefill = 0;         // positions each cache prefills before it decodes; 0: length / 4
    int probe_gap = 96;      // the recall probe's tokens between the fact and its cue (fewer if it must fit)
    std::uint64_t seed = 1;  // the texts' sampling seed
    int threads = 0;         // 0: auto (common.h resolve_threads)
    std::string plot;        // a PNG of mean KL against bytes per token ("": none)
    bool json = false;
};
int run_frontier(const FrontierOptions& o);

struct BenchOptions {
    std::string shape = "stories15M";
    std::uint64_t seed = 7;
    int reps = 5;
    int threads = 0;  // 0: auto (common.h resolve_threads)
    std::string lengths = "64,128,256";
    int naive_max = 1024;  // naive decode is timed only up to this T (its step is O(T^2))
    std::string plot;      // a PNG of tok/s and bytes per step against T ("": none)
    std::string startup;   // a checkpoint: time to its first logits and resident memory instead of the table
    std::string panel_cache = "auto";   // --startup's --panel-cache
    int block_size = 0;                 // the paged variant's; 0: 16, or max_seq if smaller
    int group = 0;                      // the quantized variants' (channels per value scale, positions per key scale);
                                        // 0: the largest divisor of head_size up to 16
    std::string device = "cpu";         // cpu: the full table; gpu or gpu-host: the device table
    std::string kv_formats;             // the format table's formats ("all", or names); "": no format table
    std::string attentions = "simple";  // the format table's attentions ("simple,tiled"); other than simple: the table
    int tile = 64;                      // tiled attention's keys per tile
    bool lengths_given = false;         // --lengths was set (the device and format tables have their own defaults)
    int background_load = -1;           // >= 0: the threads table, idle and beside this many busy processes
    std::string plant;                  // the threads table's planted bug (tests only): "", "step" or "checkpoint"
    bool json = false;
};
int run_bench(const BenchOptions& o);
int run_bench_startup(const BenchOptions& o);
int run_bench_threads(const BenchOptions& o);  // cli/bench_threads.cpp: --background-load
// The context lengths of --lengths, ascending, each within max_seq (an Error otherwise).
std::vector<int> bench_lengths(const Config& c, const BenchOptions& o);

struct ExportOptions {
    std::string shape = "stories260K";
    std::uint64_t seed = 7;
    bool unshared = false;
    std::string out;
};
int run_export(const ExportOptions& o);

struct VerifyCommandOptions {
    std::string variant = "all";  // a variant, a mutant, or all / exact / approximate / mutants
    int cases = 100;
    std::uint64_t seed = 1;
    std::string device = "cpu";  // where the decoders run; two devices: the second checked against the first
    std::string kv_format;       // "": variant rows in fp32, scenarios draw; a name: every format-taking cache in it
    AttentionOptions attention{"", 64};  // kind "": simple, and the tiled-attention row draws its tiles
    std::string profile = "fast";        // fast, or long: contexts up to 8192, with a progress line
    std::string plugin;                  // a cache plugin's path: its property instead of the variants
    int plugin_timeout = 60;             // seconds without a step before a plugin is called hung
    bool plugin_stdio = false;           // the plugin is served over stdin/stdout (plugin_stdio.h)
    std::string replay_log;              // where a failing plugin case's call log goes ("": the default)
    std::string block_sizes;             // a plugin's pools: block sizes drawn from ("": the plugin's or kvlab's)
    int max_sequences = 0;               // a plugin's pools: the most sequences (0: kvlab's draw)
    double time_limit = 0;               // a plugin's check: seconds after which no case starts (0: none)
    bool json = false;
    bool list = false;
};
int run_verify(const VerifyCommandOptions& o);

// kvlab replay LOG --plugin lib.so: a plugin check's failing case (its call log) run again
// against the plugin alone (proofs/plugin_replay.h), in a child process as verify --plugin runs.
struct ReplayOptions {
    std::string log;
    std::string plugin;
    int plugin_timeout = 60;
    bool plugin_stdio = false;
};
int run_replay(const ReplayOptions& o);

// "stories260K", "stories15M", or "dim=64,n_layers=2,..." on top of stories260K's shape.
Config shape_from_string(const std::string& spec);

}  // namespace kvlab::cli
