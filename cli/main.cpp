// kvlab: the command-line program. Each command lives in its own file; this one only parses.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <system_error>

#include "build_info.h"
#include "cache_factory.h"
#include "checkpoint.h"
#include "commands.h"
#include "common.h"
#include "completions.h"
#include "file_writer.h"
#include "memory.h"
#include "model.h"
#include "pool.h"
#include "view_command.h"

namespace kvlab::cli {

Config shape_from_string(const std::string& spec) {
    // A named shape, alone or followed by fields that change it: "stories15M,max_seq=8192".
    for (const auto& [name, shape] :
         {std::pair{"stories260K", stories260k_shape()}, {"stories15M", stories15m_shape()}}) {
        const std::string n = name;
        if (spec == n) return shape;
        if (spec.starts_with(n + ",")) {
            Config c = Config::parse(spec.substr(n.size() + 1), shape);
            c.validate();
            return c;
        }
    }
    Config c = Config::parse(spec, stories260k_shape());
    c.validate();
    return c;
}

int run_export(const ExportOptions& o) {
    const Config c = shape_from_string(o.shape);
    const Model m = random_model(c, o.seed, !o.unshared);
    save_checkpoint(o.out, m);
    // Written to standard output, the model is the output: the note goes to stderr.
    fmt::print(names_standard_output(o.out) ? stderr : stdout, "wrote {} ({}, seed {}, {} classifier)\n",
               one_line(o.out), c.describe(), o.seed, o.unshared ? "separate" : "shared");
    return 0;
}

namespace {

// Every command's options, and its subcommand (true after parsing when it was chosen).
struct Commands {
    DemoOptions demo;
    GenerateOptions gen;
    SpeculateOptions spec;
    BenchOptions bench;
    ExportOptions exp;
    VerifyCommandOptions ver;
    ReplayOptions replay;
    MemoryOptions mem;
    PoolOptions pool;
    TraceOptions trace;
    DiffTraceOptions diff;
    GoldenOptions golden;
    ServeSimOptions serve;
    BeamOptions beam;
    FrontierOptions frontier;
    CompletionsOptions completions;
    ManOptions man;
    CLI::App *demo_cmd, *gen_cmd, *spec_cmd, *bench_cmd, *export_cmd, *verify_cmd, *replay_cmd, *memory_cmd, *pool_cmd,
        *trace_cmd, *diff_cmd, *golden_cmd, *serve_cmd, *beam_cmd, *frontier_cmd, *completions_cmd, *man_cmd;
};

constexpr const char* kKvCalibrateHelp =
    "fp8 formats: each layer's K and V scale from an fp32 prefill of this text (its largest |value| over the "
    "format's largest finite one); default: scale 1";

CLI::App* add_demo(CLI::App& app, DemoOptions& demo) {
    auto* demo_cmd = app.add_subcommand("demo", "decode naive and cached side by side, checking bitwise equality");
    add_model_options(demo_cmd, demo.m.model, demo.m.tokenizer, demo.m.seed, demo.m.panel_cache);
    demo_cmd->add_option("--prompt", demo.prompt, "prompt text (needs a tokenizer)");
    demo_cmd->add_option("--tokens", demo.tokens, "prompt as token ids, e.g. 1,403,407");
    demo_cmd->add_option("--steps", demo.steps, "tokens to decode after the prompt")->check(CLI::Range(1, 1 << 20));
    add_threads_option(demo_cmd, demo.threads);
    demo_cmd->add_option("--device", demo.device,
                         "cpu, gpu, gpu-host (the GPU's kernels run on the host), or two side by side: both (cpu,gpu) "
                         "or e.g. cpu,gpu-host");
    demo_cmd->add_flag("!--no-graph", demo.graphs, "gpu: run each cached decode step without CUDA Graph replay");
    demo_cmd->add_flag("--json", demo.json, "machine-readable output");
    demo_cmd->add_option(
        "--kv-format", demo.kv_format,
        "store K and V in fp32, bf16, fp16, fp8-e5m2, fp8-e4m3, int8 or int4; naive decode stores them the same "
        "way, and each step's drift from fp32 naive decode is reported");
    demo_cmd->add_option("--kv-calibrate", demo.kv_calibrate, kKvCalibrateHelp);
    add_attention_options(demo_cmd, demo.attention);
    demo_cmd->add_flag("--logprobs", demo.logprobs,
                       "each decoded token's log-probability; then one prefill of the whole text on a fresh cache "
                       "must give every one back bit for bit (rescoring)");
    return demo_cmd;
}

CLI::App* add_generate(CLI::App& app, GenerateOptions& gen) {
    auto* gen_cmd = app.add_subcommand("generate", "generate text with the cached decoder (greedy by default)");
    add_model_options(gen_cmd, gen.m.model, gen.m.tokenizer, gen.m.seed, gen.m.panel_cache);
    gen_cmd->add_option("--prompt", gen.prompt, "prompt text (needs a tokenizer)");
    gen_cmd->add_option("--tokens", gen.tokens, "prompt as token ids, e.g. 1,403,407");
    gen_cmd
        ->add_option("--steps", gen.steps,
                     "tokens to generate after the prompt (llama2.c's -n counts the prompt too: "
                     "its -n 200 from BOS is --steps 199)")
        ->check(CLI::Range(1, 1 << 20));
    gen_cmd->add_option("--temperature", gen.temperature, "0 = greedy; otherwise sample from softmax(logits / T)")
        ->check(CLI::Range(0.0f, 1e6f));
    gen_cmd->add_option("--top-p", gen.top_p, "nucleus sampling threshold in [0, 1] (0 or 1: plain sampling)")
        ->check(CLI::Range(0.0f, 1.0f));
    // llama2.c's xorshift generator is stuck at 0 from seed 0, so 0 is refused.
    gen_cmd->add_option("--seed", gen.sample_seed, "sampling seed, positive (llama2.c's xorshift generator)")
        ->check(CLI::Range(std::uint64_t{1}, std::numeric_limits<std::uint64_t>::max()));
    add_threads_option(gen_cmd, gen.threads);
    gen_cmd->add_option("--device", gen.device, "cpu, gpu or gpu-host");
    gen_cmd->add_flag("!--no-graph", gen.graphs, "gpu: run each cached decode step without CUDA Graph replay");
    gen_cmd->add_flag("--json", gen.json, "machine-readable output");
    gen_cmd->add_option("--kv-format", gen.kv_format,
                        "store K and V in fp32, bf16, fp16, fp8-e5m2, fp8-e4m3, int8 or int4");
    gen_cmd->add_option("--kv-calibrate", gen.kv_calibrate, kKvCalibrateHelp);
    add_attention_options(gen_cmd, gen.attention);
    gen_cmd->add_flag("--logprobs", gen.logprobs,
                      "print each generated token's log-probability under the model's softmax (temperature 1), "
                      "then rescore the text with one prefill: every one must come back bit for bit");
    return gen_cmd;
}

CLI::App* add_speculate(CLI::App& app, SpeculateOptions& spec) {
    auto* spec_cmd = app.add_subcommand(
        "speculate", "greedy speculative decoding against plain greedy decode: acceptance, speedup, bitwise equality");
    add_model_options(spec_cmd, spec.m.model, spec.m.tokenizer, spec.m.seed, spec.m.panel_cache);
    spec_cmd->add_option("--draft", spec.draft,
                         "the draft model: a llama2.c checkpoint of the target's vocab_size, self (the target "
                         "itself: every draft accepted), or random (default: a random model of the target's shape "
                         "with 1 layer, seed --draft-seed; its drafts are rarely accepted)");
    spec_cmd->add_option("--draft-seed", spec.draft_seed, "seed of the random draft");
    spec_cmd->add_option("--k", spec.k, "draft tokens proposed per target step (at least 1)");
    spec_cmd->add_option("--prompt", spec.prompt, "prompt text (needs a tokenizer)");
    spec_cmd->add_option("--tokens", spec.tokens, "prompt as token ids, e.g. 1,403,407");
    spec_cmd->add_option("--steps", spec.steps, "tokens to generate after the prompt")->check(CLI::Range(1, 1 << 20));
    spec_cmd->add_option("--reps", spec.reps, "timed runs of each decode, alternating (the fastest counts)")
        ->check(CLI::Range(1, 1000));
    add_threads_option(spec_cmd, spec.threads);
    spec_cmd->add_option("--device", spec.device, "cpu, gpu or gpu-host (target and draft both run there)");
    spec_cmd->add_option(
        "--kv-format", spec.kv_format,
        "every cache (target, draft, plain) stores K and V in fp32, bf16, fp16, fp8-e5m2, fp8-e4m3, int8 or int4");
    add_attention_options(spec_cmd, spec.attention);
    spec_cmd->add_flag("--json", spec.json, "machine-readable output");
    return spec_cmd;
}

CLI::App* add_bench(CLI::App& app, BenchOptions& bench) {
    auto* bench_cmd = app.add_subcommand("bench", "benchmark cached, naive and llama2.c-style decode");
    bench_cmd->add_option(
        "--shape", bench.shape,
        "stories15M (default), stories260K, either with changes (stories15M,max_seq=8192), or dim=..,n_layers=..,...");
    bench_cmd->add_option("--model-seed", bench.seed, "seed of the random model");
    bench_cmd->add_option("--reps", bench.reps, "repetitions per figure (the median is reported)")
        ->check(CLI::Range(1, 1000));
    add_threads_option(bench_cmd, bench.threads);
    bench_cmd
        ->add_option("--background-load", bench.background_load,
                     "the threads table: greedy decode tok/s for 1..--threads threads, idle and beside N busy-looping "
                     "processes kvlab starts and stops (0..64), interleaved, every row's logits checked")
        ->check(CLI::Range(0, 64));
    // A planted bug in the threads table's checks: the tests must see it caught. Not for users.
    bench_cmd->add_option("--plant", bench.plant)->check(CLI::IsMember({"step", "checkpoint"}))->group("");
    bench_cmd->add_option("--lengths", bench.lengths,
                          "context lengths T to measure, e.g. 64,128,256, each up to the shape's max_seq");
    bench_cmd
        ->add_option("--naive-max", bench.naive_max,
                     "time naive decode only up to this T (one naive step costs a prefill of T); above it one "
                     "untimed run still checks the bits")
        ->check(CLI::Range(1, 1 << 20));
    bench_cmd->add_option("--startup", bench.startup,
                          "a checkpoint: time from loading it to its first logits, and the resident memory of 255 "
                          "decode steps against the weights and KV cache (instead of the tables)");
    bench_cmd->add_option("--panel-cache", bench.panel_cache, "with --startup: auto, on, off or a folder");
    bench_cmd->add_option(
        "--plot", bench.plot,
        "write a PNG: decode tok/s (measured and the cost model's) and bytes read per step, against T");
    bench_cmd->add_option("--device", bench.device,
                          "cpu (default), or gpu / gpu-host: per-step microseconds of cached decode with and without "
                          "graph replay, naive decode, prefill, and bytes read per step (default T = 64,256,1024)");
    bench_cmd
        ->add_option("--block-size", bench.block_size,
                     "positions per block, for " + kvlab::variant_names(kvlab::variants_with("block_size")) +
                         " (default min(16, max_seq))")
        ->check(CLI::Range(1, 1 << 24));
    bench_cmd
        ->add_option("--group", bench.group,
                     "quantization group, for " + kvlab::variant_names(kvlab::variants_with("group")) +
                         " (divides head_size; default: its largest divisor up to 16)")
        ->check(CLI::Range(1, 1 << 24));
    bench_cmd->add_option("--kv-format", bench.kv_formats,
                          "KV formats to compare, e.g. fp32,fp8-e4m3, or all: bytes per token and decode tok/s per "
                          "format (default T = 1024,2048,4096,8192)");
    bench_cmd->add_option("--attention", bench.attentions,
                          "attentions to compare in the format table, e.g. simple,tiled (default T = "
                          "1024,2048,4096,8192; formats: --kv-format, default fp32)");
    bench_cmd->add_option("--tile", bench.tile, "tiled attention's keys per tile (1..256)");
    bench_cmd->add_flag("--json", bench.json, "machine-readable output");
    return bench_cmd;
}

CLI::App* add_export(CLI::App& app, ExportOptions& exp) {
    auto* export_cmd = app.add_subcommand("export", "write a random model as a llama2.c checkpoint");
    export_cmd->add_option(
        "--shape", exp.shape,
        "stories260K (default), stories15M, either with changes (stories15M,max_seq=8192), or dim=..,n_layers=..,...");
    export_cmd->add_option("--seed", exp.seed, "seed of the random model");
    export_cmd->add_flag("--unshared", exp.unshared, "write a separate classifier (negative vocab_size in the header)");
    export_cmd->add_option("out", exp.out, "output file")->required();
    return export_cmd;
}

CLI::App* add_trace(CLI::App& app, TraceOptions& tr) {
    auto* cmd = app.add_subcommand(
        "trace", "write a greedy run (tokens, logits, K and V, attention weights) as .npy files and a JSON manifest");
    TraceRun& run = tr.run;
    add_model_options(cmd, run.model, run.tokenizer, run.seed, run.panel_cache);
    cmd->add_option("--shape", tr.shape,
                    "a random model of this shape (stories260K, stories15M, either with changes, or dim=..,...) "
                    "instead of a checkpoint");
    cmd->add_option("--prompt", run.prompt, "prompt text (needs a tokenizer)");
    cmd->add_option("--tokens", run.tokens, "prompt as token ids, e.g. 1,403,407");
    cmd->add_option("--steps", run.steps, "greedy decode steps after the prompt")->check(CLI::Range(0, 1 << 20));
    cmd->add_option("--device", run.device, "cpu, gpu or gpu-host");
    cmd->add_option("--cache", run.cache, "the exact cache variant the run decodes on, at its defaults");
    cmd->add_option("--kv-format", run.kv_format,
                    "store K and V in fp32, bf16, fp16, fp8-e5m2, fp8-e4m3, int8 or int4");
    add_attention_options(cmd, run.attention);
    cmd->add_flag("--attention-weights", run.weights, "also write attention.npy: each step's weights, every head");
    add_threads_option(cmd, run.threads);
    cmd->add_option("--out", tr.out, "the trace's folder (made if missing; its files are replaced whole)")->required();
    cmd->add_flag("--json", tr.json, "print the manifest as JSON");
    return cmd;
}

CLI::App* add_diff_trace(CLI::App& app, DiffTraceOptions& d) {
    auto* cmd = app.add_subcommand(
        "diff-trace",
        "compare two traces: the first difference (step, layer, head, position, channel) in ULPs, and "
        "whether the rest is bitwise equal; exit 0 when equal, 1 when not");
    cmd->add_option("a", d.a, "a trace folder")->required();
    cmd->add_option("b", d.b, "another")->required();
    cmd->add_flag("--json", d.json, "machine-readable output");
    return cmd;
}

CLI::App* add_golden(CLI::App& app, GoldenOptions& g) {
    auto* cmd = app.add_subcommand("golden",
                                   "write the golden traces (stories260K and random shapes), or rerun them "
                                   "on each device and compare bit for bit");
    auto* out = cmd->add_option("--out", g.out, "write the golden traces and golden.json into this folder");
    auto* check = cmd->add_option("--check", g.check, "rerun the golden traces of this folder and diff each");
    out->excludes(check);
    cmd->add_option("--device", g.device,
                    "--check: cpu, gpu, gpu-host, both, two joined by a comma, or all (cpu, gpu-host, and gpu where "
                    "there is one)");
    add_threads_option(cmd, g.threads);
    return cmd;
}

CLI::App* add_serve_sim(CLI::App& app, ServeSimOptions& o) {
    auto* cmd = app.add_subcommand("serve-sim",
                                   "serve a request workload by continuous batching under a memory "
                                   "budget; every request checked against decoding it alone");
    add_model_options(cmd, o.m.model, o.m.tokenizer, o.m.seed, o.m.panel_cache);
    cmd->add_option("--trace", o.trace,
                    "a JSON-lines request file ({\"tokens\": [...] or \"prompt\": \"...\", \"max_new_tokens\": N, "
                    "\"arrival\": step}); default: a generated workload");
    cmd->add_option("--requests", o.requests, "generated: requests (default 200)")->check(CLI::Range(1, 1000000));
    cmd->add_option("--workload-seed", o.workload_seed, "generated: the workload's seed");
    cmd->add_option("--arrival-rate", o.arrival_rate, "generated: requests per step, Poisson (0: all at step 0)")
        ->check(CLI::Range(0.0, 1e6));
    cmd->add_option("--system-prompt-share", o.system_prompt_share,
                    "generated: the share of requests that start with one system prompt (default 0.5)")
        ->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--system-prompt-len", o.system_prompt_len, "generated: its tokens (default 16)")
        ->check(CLI::Range(0, 1 << 20));
    cmd->add_option("--prompt-len", o.prompt_len, "generated: prompt tokens, N or MIN-MAX (default 8-48)");
    cmd->add_option("--output-len", o.output_len, "generated: tokens to generate, N or MIN-MAX (default 8-64)");
    cmd->add_option("--max-model-len", o.max_model_len, "a request's prompt plus output at most (default: max_seq)")
        ->check(CLI::Range(0, 1 << 24));
    cmd->add_option("--block-size", o.block_size, "positions per block (default 16)")->check(CLI::Range(1, 1 << 16));
    cmd->add_option("--num-blocks", o.num_blocks, "blocks in the pool (overrides --memory-utilization)")
        ->check(CLI::Range(0, 1 << 24));
    cmd->add_option("--memory-utilization", o.memory_utilization,
                    "the share of --device-memory for the weights and the KV blocks (default 0.9)");
    cmd->add_option("--device-memory", o.device_memory,
                    "the device's memory: bytes, or with KiB, MiB, GiB (default 2MiB)");
    cmd->add_option("--max-batch-tokens", o.max_batch_tokens, "rows per step, prefill chunks and decode (default 256)")
        ->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--prefix-caching", o.prefix_caching, "on (default) or off");
    cmd->add_option("--watermark", o.watermark,
                    "the share of blocks (rounded up) admission leaves free while requests run (default 0.01)")
        ->check(CLI::Range(0.0, 0.99));
    cmd->add_option("--preemption", o.preemption, "recompute (default) or swap (to host memory)");
    cmd->add_option("--kv-format", o.kv_format,
                    "the pool's KV format: fp32, bf16, fp16, fp8-e5m2, fp8-e4m3, int8, int4");
    add_attention_options(cmd, o.attention);
    cmd->add_option("--store", o.store,
                    "prefix blocks below the pool: host[:SIZE], dir:PATH, redis:HOST:PORT or redis:unix:PATH; "
                    "evicted blocks go there, later prefixes come back from it, and the pool's blocks are put "
                    "there at the end");
    cmd->add_option("--role", o.role,
                    "both (default); or disaggregated prefill: prefill (each prompt and its first token, blocks "
                    "into --store) or decode (the workload, prompt blocks fetched from --store)");
    cmd->add_flag("!--no-check", o.check, "skip decoding every request alone to compare bit for bit");
    add_threads_option(cmd, o.threads);
    cmd->add_flag("--json", o.json, "machine-readable output");
    return cmd;
}

CLI::App* add_beam(CLI::App& app, BeamOptions& o) {
    auto* cmd = app.add_subcommand("beam",
                                   "beam search on forked caches: beams share their prefix's blocks, each "
                                   "checked against naive decode");
    add_model_options(cmd, o.m.model, o.m.tokenizer, o.m.seed, o.m.panel_cache);
    cmd->add_option("--prompt", o.prompt, "prompt text (needs a tokenizer)");
    cmd->add_option("--tokens", o.tokens, "prompt as token ids, e.g. 1,403,407");
    cmd->add_option("--width", o.width, "beams kept (default 4)")->check(CLI::Range(1, 64));
    cmd->add_option("--steps", o.steps, "tokens each beam adds (default 16)")->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--block-size", o.block_size, "positions per block of the shared pool (default 4)")
        ->check(CLI::Range(1, 1 << 16));
    cmd->add_option("--kv-format", o.kv_format, "fp32, bf16, fp16, fp8-e5m2, fp8-e4m3, int8 or int4");
    add_attention_options(cmd, o.attention);
    add_threads_option(cmd, o.threads);
    cmd->add_flag("--json", o.json, "machine-readable output");
    return cmd;
}

CLI::App* add_frontier(CLI::App& app, FrontierOptions& o) {
    auto* cmd = app.add_subcommand("frontier",
                                   "quality against KV bytes per token for KV formats, quantized, window, fifo, h2o "
                                   "and GQA settings, measured against exact decode, with the Pareto front");
    add_model_options(cmd, o.m.model, o.m.tokenizer, o.m.seed, o.m.panel_cache);
    cmd->add_option("--prompts", o.prompts, "texts the model writes, each decoded by every setting (default 8)")
        ->check(CLI::Range(1, 1000));
    cmd->add_option("--length", o.length, "tokens per text, 2..max_seq (default max_seq)")
        ->check(CLI::Range(2, 1 << 24));
    cmd->add_option("--prefill", o.prefill,
                    "positions each cache prefills before it decodes the rest a token a step (default length / 4)")
        ->check(CLI::Range(1, 1 << 24));
    cmd->add_option("--probe-gap", o.probe_gap,
                    "the recall probe's tokens between the fact and its cue (default 96; fewer when --length is "
                    "short)")
        ->check(CLI::Range(0, 1 << 24));
    cmd->add_option("--seed", o.seed, "the texts' sampling seed (default 1)");
    add_threads_option(cmd, o.threads);
    cmd->add_option("--plot", o.plot,
                    "write a PNG: mean KL (log) against KV bytes per token (log), a colour per family, the Pareto "
                    "front as a line");
    cmd->add_flag("--json", o.json, "machine-readable output");
    return cmd;
}

CLI::App* add_verify(CLI::App& app, VerifyCommandOptions& ver) {
    auto* verify_cmd =
        app.add_subcommand("verify", "property-test every cache variant against naive decode, and every planted bug");
    verify_cmd->add_option(
        "variant", ver.variant,
        "a cache variant (" + kvlab::variant_names(kvlab::all_variants()) +
            "), a preset, scenario or planted bug (see --list), or all, exact, approximate, mutants");
    verify_cmd->add_option("--cases", ver.cases, "generated cases per property")->check(CLI::Range(1, 1000000));
    verify_cmd->add_option("--seed", ver.seed, "RapidCheck seed: the same seed draws the same cases");
    verify_cmd->add_option(
        "--kv-format", ver.kv_format,
        "bf16, fp16, fp8-e5m2, fp8-e4m3, int8, int4 or fp32: the variant rows and scenarios store K and V in it "
        "wherever the variant takes a format, naive decode too (default: variant rows in fp32, "
        "scenarios draw a format per case)");
    verify_cmd->add_option("--device", ver.device,
                           "cpu (default), gpu or gpu-host: the decoders and caches under test and naive decode run "
                           "there; both (cpu,gpu) or two joined by a comma: naive on the first is the reference, the "
                           "second's naive and cached decode must equal it");
    auto* attention =
        verify_cmd->add_option("--attention", ver.attention.kind,
                               "simple or tiled: naive decode and the decoders under test run it in every exact row "
                               "(default: simple, and the tiled-attention row draws its tiles)");
    verify_cmd->add_option("--tile", ver.attention.tile, "with --attention: tiled attention's keys per tile (1..256)")
        ->needs(attention);
    verify_cmd->add_option("--profile", ver.profile,
                           "fast (default: tiny models, sequences up to 20, and half the time thin models to "
                           "position 257; a plugin's pools filled to a refusal) or long (thin models, contexts up to "
                           "8192, sizes biased to 96-98, 255-258 and powers of two; a plugin's pools hold 1-64 "
                           "sequences; a progress line on stderr; runs the planted bugs whose threshold lies past "
                           "the fast profile)");
    auto* plugin = verify_cmd->add_option(
        "--plugin", ver.plugin,
        "a cache plugin (a shared library with include/kvlab/cache_plugin.h's table): its "
        "bookkeeping under kvlab's exact property, in a child process (instead of the variants)");
    verify_cmd
        ->add_option("--plugin-timeout", ver.plugin_timeout,
                     "with --plugin: seconds without progress before the plugin is called hung (default 60)")
        ->check(CLI::Range(1, 86400))
        ->needs(plugin);
    auto* stdio = verify_cmd->add_flag(
        "--plugin-stdio", ver.plugin_stdio,
        "a cache plugin served over stdin and stdout, one JSON object a line each way (docs/plugin-protocol.md; "
        "the Python module's kvlab.verify starts kvlab this way); stdout's last line is the result");
    verify_cmd->add_option(
        "--block-sizes", ver.block_sizes,
        "a plugin's check: the block sizes its pools are drawn from, e.g. 16,32 (default: those the plugin "
        "declares, else 1-16, or 1-64 with --profile long); a size the plugin does not accept is left out");
    verify_cmd
        ->add_option("--max-sequences", ver.max_sequences,
                     "a plugin's check: the most sequences a pool holds (default: drawn, up to "
                     "8, or 64 with --profile long, and at most the plugin's)")
        ->check(CLI::Range(1, 4096));
    verify_cmd
        ->add_option("--time-limit", ver.time_limit,
                     "a plugin's check: seconds after which no new case starts (cases then run in "
                     "rounds of 10, round k with seed + k); the report says how many ran")
        ->check(CLI::Range(0.001, 1e7));
    verify_cmd
        ->add_option("--replay-log", ver.replay_log,
                     "with --plugin: where the failing case's call log is written, for `kvlab replay` (default: "
                     "kvlab-replay-NAME.jsonl in the current directory)")
        ->needs(plugin);
    verify_cmd->add_flag("--json", ver.json, "machine-readable output");
    verify_cmd->add_flag("--list", ver.list, "list the variants, their parameters, the scenarios and planted bugs");
    verify_cmd->get_option("variant")->excludes(plugin);
    verify_cmd->get_option("variant")->excludes(stdio);
    plugin->excludes(stdio);
    // --block-sizes, --max-sequences and --time-limit need --plugin or --plugin-stdio: run_verify says so.
    return verify_cmd;
}

CLI::App* add_replay(CLI::App& app, ReplayOptions& r) {
    auto* cmd = app.add_subcommand("replay",
                                   "run a plugin check's failing case again, from its call log, against the plugin "
                                   "alone: the same calls, kvlab's same checks (exit 1 on a verdict)");
    cmd->add_option("log", r.log, "the call log `kvlab verify --plugin` wrote (JSON lines)")
        ->required()
        ->check(CLI::ExistingFile);
    auto* plugin = cmd->add_option("--plugin", r.plugin, "the cache plugin (a shared library) to replay it on");
    cmd->add_option("--plugin-timeout", r.plugin_timeout,
                    "with --plugin: seconds without progress before the plugin is called hung (default 60)")
        ->check(CLI::Range(1, 86400))
        ->needs(plugin);
    auto* stdio = cmd->add_flag("--plugin-stdio", r.plugin_stdio,
                                "a plugin served over stdin and stdout (docs/plugin-protocol.md; kvlab.replay)");
    plugin->excludes(stdio);
    return cmd;
}

// Every command but `view` (ViewCommand adds itself), in the order --help lists them.
void add_commands(CLI::App& app, Commands& c) {
    c.demo_cmd = add_demo(app, c.demo);
    c.gen_cmd = add_generate(app, c.gen);
    c.spec_cmd = add_speculate(app, c.spec);
    c.bench_cmd = add_bench(app, c.bench);
    c.export_cmd = add_export(app, c.exp);
    c.verify_cmd = add_verify(app, c.ver);
    c.replay_cmd = add_replay(app, c.replay);
    c.memory_cmd = app.add_subcommand(
        "memory", "KV cache bytes of published model shapes, and the waste of reserving max_seq vs paging");
    add_memory_options(c.memory_cmd, c.mem);
    c.pool_cmd = app.add_subcommand(
        "pool", "a scripted session over one paged block pool: requests, prefix hits, forks, rollbacks");
    add_pool_options(c.pool_cmd, c.pool);
    c.trace_cmd = add_trace(app, c.trace);
    c.diff_cmd = add_diff_trace(app, c.diff);
    c.golden_cmd = add_golden(app, c.golden);
    c.serve_cmd = add_serve_sim(app, c.serve);
    c.beam_cmd = add_beam(app, c.beam);
    c.frontier_cmd = add_frontier(app, c.frontier);
    c.completions_cmd = add_completions(app, c.completions);
    c.man_cmd = add_man(app, c.man);
}

// CLI11 would call a mistyped command "a missing subcommand"; name it instead, with the commands
// the app has. True when it did.
bool refused_unknown_command(CLI::App& app, int argc, char** argv) {
    const std::string first = argc > 1 ? argv[1] : "";
    if (first.empty() || first[0] == '-') return false;
    std::string names;
    for (const CLI::App* cmd : app.get_subcommands({})) {
        if (cmd->get_name() == first) return false;
        names += (names.empty() ? "" : ", ") + cmd->get_name();
    }
    fmt::print(stderr, "kvlab: error: unknown command '{}' (commands: {})\n", kvlab::one_line(first), names);
    return true;
}

// Runs the parsed command: its exit code, or 1 after one line on stderr for what it threw. The
// whole app is passed for completions and man, which describe every command.
int run_command(const CLI::App& app, Commands& c, ViewCommand& view) {
    try {
        if (*c.demo_cmd) return resolve_threads(c.demo.threads), run_demo(c.demo);
        if (*c.gen_cmd) return resolve_threads(c.gen.threads), run_generate(c.gen);
        if (*c.spec_cmd) return resolve_threads(c.spec.threads), run_speculate(c.spec);
        if (*c.bench_cmd) {
            resolve_threads(c.bench.threads);
            c.bench.lengths_given = c.bench_cmd->count("--lengths") > 0;
            return run_bench(c.bench);
        }
        if (*c.export_cmd) return run_export(c.exp);
        if (*c.verify_cmd) return run_verify(c.ver);
        if (*c.replay_cmd) return run_replay(c.replay);
        if (*c.memory_cmd) return run_memory(c.mem);
        if (*c.pool_cmd) return resolve_threads(c.pool.threads), run_pool(c.pool);
        if (*c.trace_cmd) {
            if (!c.trace.shape.empty()) c.trace.run.random = true, c.trace.run.shape = shape_from_string(c.trace.shape);
            resolve_threads(c.trace.run.threads);
            return run_trace(c.trace);
        }
        if (*c.diff_cmd) return run_diff_trace(c.diff);
        if (*c.golden_cmd) return resolve_threads(c.golden.threads), run_golden(c.golden);
        if (*c.serve_cmd) return resolve_threads(c.serve.threads), run_serve_sim(c.serve);
        if (*c.beam_cmd) return resolve_threads(c.beam.threads), run_beam(c.beam);
        if (*c.frontier_cmd) return resolve_threads(c.frontier.threads), run_frontier(c.frontier);
        if (*c.completions_cmd) return run_completions(app, c.completions);
        if (*c.man_cmd) return run_man(app, c.man);
        if (view.command()) return view.run();
    } catch (const std::bad_alloc&) {
        fmt::print(stderr, "kvlab: error: out of memory\n");
    } catch (const std::system_error& e) {
        // fmt's own failure to write stdout says "cannot write to file": name the stream instead.
        if (std::ferror(stdout))
            fmt::print(stderr, "kvlab: error: cannot write to standard output: {}\n", e.code().message());
        else
            fmt::print(stderr, "kvlab: error: {}\n", kvlab::one_line(e.what()));
    } catch (const std::exception& e) {
        // The last guard of "one printable line": user text that reached a message unescaped.
        fmt::print(stderr, "kvlab: error: {}\n", kvlab::one_line(e.what()));
    }
    return 1;
}

// The command, then its output flushed: a full disk or a closed pipe is an error, never status 0.
int run_and_flush(const CLI::App& app, Commands& c, ViewCommand& view) {
    const int status = run_command(app, c, view);
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
        if (status == 0)
            fmt::print(stderr, "kvlab: error: cannot write to standard output: {}\n", std::strerror(errno));
        return status == 0 ? 1 : status;
    }
    return status;
}

}  // namespace

}  // namespace kvlab::cli

int main(int argc, char** argv) {
    using namespace kvlab::cli;
    CLI::App app{"kvlab: naive and KV-cached decode of a tiny Llama-style transformer, bitwise equal"};
    app.require_subcommand(1);
    // Which kvlab this is, for a bug report: version, commit, compiler, build type (core/build_info.h).
    app.set_version_flag(
        "--version", [] { return kvlab::version_line(); },
        "print kvlab's version, commit, compiler and build type, and exit");
    Commands commands;
    add_commands(app, commands);
    ViewCommand view(app);
    check_numbers(app);

    if (refused_unknown_command(app, argc, argv)) return 2;
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e);  // --help
        fmt::print(stderr, "kvlab: error: {} (see kvlab --help)\n", kvlab::one_line(e.what()));
        return 2;
    }
    // A closed pipe is a write error (EPIPE) with one line, not a silent death by SIGPIPE; an
    // interrupt removes the temporary files of unfinished writes (core/file_writer.h).
    std::signal(SIGPIPE, SIG_IGN);
    kvlab::remove_temporaries_on_signal();
    return run_and_flush(app, commands, view);
}
