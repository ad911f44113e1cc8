#include "common.h"

#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "decode.h"
#include "thread_pool.h"

namespace kvlab::cli {

void add_model_options(CLI::App* cmd, std::string& model, std::string& tokenizer, std::uint64_t& seed,
                       std::string& panel_cache) {
    cmd->add_option("--model", model,
                    "llama2.c checkpoint (default: ../shared/models/stories260K.bin if present, "
                    "else a random model of its shape)");
    cmd->add_option("--tokenizer", tokenizer, "llama2.c tokenizer.bin (default: tok512.bin beside the shared model)");
    cmd->add_option("--model-seed", seed, "seed of the random model (used when there is no checkpoint)");
    cmd->add_option("--panel-cache", panel_cache,
                    "the CPU's packed weights kept between runs: auto (beside a checkpoint of 8 MB or more, when "
                    "the folder is writable), on (an error when it cannot be written), off, or a folder to keep "
                    "them in");
}

void add_attention_options(CLI::App* cmd, AttentionOptions& a) {
    cmd->add_option("--attention", a.kind,
                    "simple (one softmax per row) or tiled (FlashAttention-style key tiles, split-KV decode; "
                    "exact too, other bits than simple): naive and cached decode both run it");
    cmd->add_option("--tile", a.tile, "tiled attention's keys per tile, fixed in key-index space (1..256)");
}

AttentionSpec attention_spec(const AttentionOptions& a) { return parse_attention(a.kind, a.tile); }

namespace {
std::optional<CpuBudget> auto_threads;  // set when --threads auto was resolved
}

void add_threads_option(CLI::App* cmd, int& threads) {
    cmd->add_option("--threads", threads,
                    "threads for the kernels: a count 1..256, or auto (default): the CPUs this process may use "
                    "(affinity mask, cgroup quota), at most 16")
        ->transform(
            [](const std::string& s) {
                if (s == "auto") return std::string("0");
                int n = 0;
                const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
                if (ec != std::errc() || end != s.data() + s.size() || n < 1 || n > 256)
                    throw CLI::ValidationError("a count 1..256, or auto: " + s);
                return s;
            },
            "")
        ->type_name("auto|1..256")
        ->default_str("auto");
}

int resolve_threads(int& threads) {
    if (threads == 0) {
        auto_threads = usable_cpus();
        threads = auto_threads->threads;
    }
    return threads;
}

nlohmann::json threads_json() {
    if (!auto_threads) return {{"auto", false}};
    const CpuBudget& b = *auto_threads;
    return {{"auto", true},
            {"affinity", b.affinity},
            {"kvlab_threads", b.from_env > 0 ? nlohmann::json(b.from_env) : nlohmann::json(nullptr)},
            {"quota", b.quota > 0 ? nlohmann::json(b.quota) : nlohmann::json(nullptr)},
            {"picked", b.threads}};
}

std::string threads_text(int threads) {
    std::string s = fmt::format("{} thread{}", threads, threads == 1 ? "" : "s");
    if (!auto_threads) return s;
    const CpuBudget& b = *auto_threads;
    if (b.from_env > 0) return s + " (auto: KVLAB_THREADS)";
    return s + fmt::format(" (auto: {} CPU{} in the affinity mask, {})", b.affinity, b.affinity == 1 ? "" : "s",
                           b.quota > 0 ? fmt::format("a cgroup quota of {:.2f} CPUs", b.quota) : "no cgroup quota");
}

void check_numbers(CLI::App& app) {
    // CLI::Range compares, and every comparison with NaN is false: NaN passed every range.
    const CLI::Validator finite(
        [](std::string& text) -> std::string {
            char* end = nullptr;
            const double v = std::strtod(text.c_str(), &end);
            if (end != text.c_str() && !std::isfinite(v))
                return fmt::format("{} is not a finite number", one_line(text));
            return "";
        },
        "", "finite");
    // CLI11 reads "-1" into an unsigned option as 2^64 - 1.
    const CLI::Validator non_negative(
        [](std::string& text) -> std::string {
            const std::size_t at = text.find_first_not_of(" \t");
            if (at != std::string::npos && text[at] == '-') return fmt::format("{} is negative", one_line(text));
            return "";
        },
        "", "non-negative");
    for (CLI::Option* opt : app.get_options()) {
        const std::string type = opt->get_type_name();  // "FLOAT", "UINT", then any checks' descriptions
        if (type.rfind("FLOAT", 0) == 0) opt->check(finite);
        if (type.rfind("UINT", 0) == 0) opt->check(non_negative);
    }
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) check_numbers(*sub);
}

std::vector<float> kv_calibration(const LoadedModel& lm, KVFormat format, const std::string& text) {
    if (text.empty()) return {};
    if (!kv_format_scaled(int(format)))
        throw Error(fmt::format("--kv-calibrate sets fp8 scales; {} takes none", kv_format_name(format)));
    return calibrate_kv_scales(lm.model, checked_prompt(lm, text, "", "", 0, 0), format);
}

void flush_stdout() {
    if (std::fflush(stdout) != 0 || std::ferror(stdout))
        throw Error(fmt::format("cannot write to standard output: {}", std::strerror(errno)));
}

Progress::Progress() : terminal_(::isatty(2) != 0) {}

Progress::~Progress() {
    if (terminal_ && shown_) fmt::print(stderr, "\r\x1b[K");
}

void Progress::operator()(const std::string& line) const {
    const auto now = std::chrono::steady_clock::now();
    if (!terminal_ || (shown_ && now - last_ < std::chrono::milliseconds(100))) return;
    last_ = now, shown_ = true;
    fmt::print(stderr, "\r\x1b[K{}", one_line(line));
    std::fflush(stderr);
}

}  // namespace kvlab::cli
