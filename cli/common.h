// kvlab CLI: what the commands share beyond core (core/model_loader.h chooses the model and
// reads the prompt): the model options, one-line text, timing.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "kv_format.h"
#include "model_loader.h"
#include "tiled_attention.h"

namespace CLI {
class App;
}

namespace kvlab::cli {

// --model, --tokenizer, --model-seed and --panel-cache, with one help text for every command that takes them.
void add_model_options(CLI::App* cmd, std::string& model, std::string& tokenizer, std::uint64_t& seed,
                       std::string& panel_cache);

// --attention and --tile, with one help text for every command that takes them.
void add_attention_options(CLI::App* cmd, AttentionOptions& a);
// The options as core's spec; Error (one line) for a kind or tile out of range.
AttentionSpec attention_spec(const AttentionOptions& a);

// --threads, for every command that decodes: a count 1..256, or auto (the default), held as 0
// until resolve_threads replaces it with what core's usable_cpus() picks.
void add_threads_option(CLI::App* cmd, int& threads);
// Replaces 0 (auto) by the pick, remembering it for threads_json and threads_text; returns it.
int resolve_threads(int& threads);
// {"auto": false}, or {"auto": true, "affinity": CPUs in the mask, "kvlab_threads": the environment's
// count or null, "quota": CPUs or null, "picked": n}
nlohmann::json threads_json();
// "2 threads (auto: 2 CPUs in the affinity mask, no cgroup quota)", or "1 thread"
std::string threads_text(int threads);

// Refuses what CLI11's own checks let through, for every option of every command of `app`: a
// value that is not finite (nan, inf) for a floating-point option, and a negative one for an
// unsigned option (which would wrap to 2^64 - 1). Call once, after every option is added.
void check_numbers(CLI::App& app);

// The fp8 scales --kv-calibrate asks for (core/decode.h: calibrate_kv_scales), or none when the
// text is empty; an Error for a format without scales or a text the model cannot hold.
std::vector<float> kv_calibration(const LoadedModel& lm, KVFormat format, const std::string& text);

// Standard output, flushed; an Error ("cannot write to standard output: ...") when it cannot take
// the bytes (a closed pipe, a full disk). Commands call it after each line of a long run, so that
// a reader gone away stops the work at once; main checks it once more before exit status 0.
void flush_stdout();

// A long command's progress: one line on stderr, rewritten in place at most 10 times a second,
// when stderr is a terminal, and cleared at the end; nothing elsewhere (a log or a pipe).
class Progress {
public:
    Progress();
    ~Progress();
    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;
    void operator()(const std::string& line) const;

private:
    bool terminal_;
    mutable std::chrono::steady_clock::time_point last_{};
    mutable bool shown_ = false;
};

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace kvlab::cli
