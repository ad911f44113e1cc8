#include "view_command.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iterator>

#include "cache_factory.h"
#include "commands.h"
#include "common.h"

#ifdef KVLAB_HAVE_VIEWER
#include "view.h"
#endif

namespace kvlab::cli {

#ifdef KVLAB_HAVE_VIEWER

struct ViewCommand::Options {
    viz::ViewOptions view;
    std::string variant = "contiguous";
    std::string kv_format = "fp32";
    AttentionOptions attention;
    std::string shape;  // random model's shape: "n_layers=2,n_heads=4,n_kv_heads=2" over stories260K's
    std::string size = "1600x1000";
    std::string step;  // a step number, or "end"
    int threads = 0;   // 0: auto (common.h resolve_threads)
};

ViewCommand::ViewCommand(CLI::App& app)
    : o_(std::make_unique<Options>()),
      cmd_(app.add_subcommand(
          "view", "a Dear ImGui viewer: watch the cache fill while the real decoders run (--headless for pictures)")) {
    CLI::App* cmd = cmd_;
    viz::ViewOptions& v = o_->view;
    viz::Settings& s = v.settings;
    add_model_options(cmd, s.model_path, s.tokenizer_path, s.seed, s.panel_cache);
    cmd->add_option("--shape", o_->shape,
                    "run a random model of this shape instead, e.g. n_layers=2,n_heads=4,n_kv_heads=2");
    cmd->add_option("--variant", o_->variant, variant_names(viz::kVariants) + " (contiguous: contiguous-head)");
    cmd->add_option("--device", s.device,
                    "cpu (default), gpu or gpu-host: where the decoders run; off the CPU the Exactness panel also "
                    "compares with the CPU");
    cmd->add_option("--prompt", s.prompt, "prompt text");
    cmd->add_option("--steps", s.steps, "decode steps after the prefill")->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--block-size", s.block_size, "paged variants: positions per block")->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--n-blocks", s.n_blocks, "paged variants: blocks in the pool (0: enough for every sequence)")
        ->check(CLI::Range(0, 1 << 20));
    cmd->add_option("--bits", s.quant_bits, "quantized: 8 or 4")->check(CLI::IsMember({8, 4}));
    cmd->add_option(
        "--kv-format", o_->kv_format,
        "K and V stored in fp32, bf16, fp16, fp8-e5m2, fp8-e4m3, int8 or int4 (variants that take a format)");
    add_attention_options(cmd, o_->attention);
    add_threads_option(cmd, o_->threads);
    cmd->add_option("--sinks", s.sinks, "window: attention sinks")->check(CLI::Range(0, 1 << 20));
    cmd->add_option("--window", s.window, "window, fifo: positions in the sliding window")
        ->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--recent", s.recent, "h2o: latest positions always kept")->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--heavy", s.heavy, "h2o: older positions kept by accumulated attention")
        ->check(CLI::Range(0, 1 << 20));
    cmd->add_option("--fork-at", s.fork_at, "prefix-shared: A forks into C after this decode step")
        ->check(CLI::Range(0, 1 << 20));
    cmd->add_option("--free-at", s.free_fork_at, "prefix-shared: C is freed after this decode step (0: never)")
        ->check(CLI::Range(0, 1 << 20));
    cmd->add_option("--mla-rank", s.mla_rank,
                    "a random MLA model of the model's shape with this latent rank follows the tokens; the Layouts "
                    "panel draws its latent cache (0: none)")
        ->check(CLI::Range(0, 1 << 16));
    cmd->add_flag("--serve", s.serve,
                  "the serving view: a workload through the continuous-batching scheduler, the pool under load");
    cmd->add_option("--requests", s.serve_requests, "--serve: requests in the workload (default 24)")
        ->check(CLI::Range(1, 4096));
    cmd->add_option("--beam", s.beam_width,
                    "the same view of beam search: this many beams over the prompt for --steps, sharing blocks")
        ->check(CLI::Range(1, 64));
    cmd->add_flag("--headless", v.headless, "render offscreen (starts Xvfb when there is no display)");
    cmd->add_option("--frames", v.frames, "render this many frames, then exit")->check(CLI::Range(1, 1 << 24));
    cmd->add_option("--size", o_->size, "window size, WIDTHxHEIGHT (default 1600x1000)");
    cmd->add_option("--speed", v.speed, "playback speed in steps per second")->check(CLI::Range(0.01f, 1000.0f));
    cmd->add_option("--step", o_->step, "show this step, paused (a number, or 'end' for the last)");
    cmd->add_option("--screenshot", v.screenshot, "write the last frame as PNG");
    cmd->add_option("--layout", v.layout, "write the panels' regions, palette and state as JSON (for tests)");
    cmd->add_option("--record", v.record, "write every frame as DIR/frame_NNNN.png, and DIR/animation.gif if possible");
    cmd->add_option("--record-every", v.record_every, "keep every n-th frame when recording")
        ->check(CLI::Range(1, 1 << 20));
    cmd->add_flag("--fps", v.fps, "report frames per second (playback in real time)");
    // A planted viewer bug: the pixel tests must catch it. Not for users, so not in --help.
    cmd->add_option("--plant", v.plant)->group("");
}

int ViewCommand::run() {
    Options& o = *o_;
    viz::ViewOptions& v = o.view;
    const auto variant = parse_variant(o.variant);
    if (!variant || std::ranges::find(viz::kVariants, *variant) == std::end(viz::kVariants))
        throw Error(
            fmt::format("unknown variant '{}' (variants: {})", one_line(o.variant), variant_names(viz::kVariants)));
    v.settings.variant = *variant;
    v.settings.kv_format = parse_kv_format(o.kv_format);
    v.settings.attention = attention_spec(o.attention);
    v.settings.n_threads = resolve_threads(o.threads);
    if (!o.shape.empty()) {
        v.settings.shape = shape_from_string(o.shape);
        v.settings.random_model = true;
    }
    const std::size_t x = o.size.find('x');
    if (x == std::string::npos) throw Error(fmt::format("--size: '{}' is not WIDTHxHEIGHT", one_line(o.size)));
    v.width = parse_int("--size", o.size.substr(0, x));
    v.height = parse_int("--size", o.size.substr(x + 1));
    if (o.step == "end") {
        v.step = -1;
    } else if (!o.step.empty()) {
        v.step = parse_int("--step", o.step, " (a step number, or 'end')");
        if (v.step < 0) throw Error(fmt::format("--step must be a step number >= 0 or 'end', not {}", v.step));
    }
    return viz::run_view(v);
}

#else  // built without the viewer

struct ViewCommand::Options {};

ViewCommand::ViewCommand(CLI::App& app)
    : o_(std::make_unique<Options>()), cmd_(app.add_subcommand("view", "the Dear ImGui viewer (not in this build)")) {
    cmd_->allow_extras();  // whatever options it was given, the answer is the one line below
}

int ViewCommand::run() {
    throw Error(
        "this kvlab was built without the viewer (it needs libimgui-dev libglfw3-dev libstb-dev libgl-dev, "
        "and KVLAB_VIEWER=ON)");
}

#endif

ViewCommand::~ViewCommand() = default;

}  // namespace kvlab::cli
