// kvlab verify: the verification suite from the command line (proofs/verify.h). Exit status 0
// when every row is what its variant promises (exact: bitwise equal; approximate: exact inside
// its regime and differing outside, or within its error bound; mutant: caught), 1 otherwise.
// --plugin runs the exact property on a cache plugin's books instead, in a child process;
// --plugin-stdio on a plugin served over stdin and stdout (plugin_stdio.h).
// GCC 12 misreads fmt's format-spec parser as an overflow when it inlines fmt::join here (a known
// false positive); clang has no such warning.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif

#include "verify.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>

#include "cache_factory.h"
#include "commands.h"
#include "common.h"
#include "device.h"
#include "file_writer.h"
#include "json_text.h"
#include "npy.h"
#include "plugin_cache.h"
#include "plugin_replay.h"
#include "plugin_stdio.h"

namespace kvlab::cli {

namespace {

// Every name `kvlab verify` takes: the groups, the registry's variants as describe() gives them
// (parameters, presets), then the scenarios and planted bugs, one a line.
int print_list() {
    std::vector<std::string> groups;
    std::vector<VerifyEntry> others;
    for (VerifyEntry& e : verify_list()) {
        if (e.kind == "group") groups.push_back(e.name);
        if (e.kind != "group" && !e.registry) others.push_back(std::move(e));
    }
    fmt::print(
        "groups: {}\n\ncache variants (core/cache_factory.cpp's registry; a variant's name runs all its rows):\n",
        fmt::join(groups, ", "));
    for (const VariantInfo& v : variant_table()) fmt::print("{}", describe(v));
    fmt::print("\nscenarios and planted bugs:\n");
    std::size_t w_name = 0;
    for (const VerifyEntry& e : others) w_name = std::max(w_name, e.name.size());
    for (const VerifyEntry& e : others) fmt::print("{:<{}}  {:<6}  {}\n", e.name, w_name, e.kind, e.about);
    return 0;
}

// The suite's options, with a progress line on a terminal.
VerifyOptions verify_options(const VerifyCommandOptions& o) {
    VerifyOptions vo{o.cases, o.seed, o.device};
    vo.kv_format = o.kv_format;
    vo.attention = o.attention.kind, vo.tile = o.attention.tile;
    vo.profile = o.profile;
    if (!o.block_sizes.empty()) vo.block_sizes = parse_int_list("--block-sizes", o.block_sizes);
    for (int bs : vo.block_sizes)
        if (bs < 1 || bs > 1024) throw Error(fmt::format("verify: --block-sizes: {} is not in 1..1024", bs));
    vo.max_sequences = o.max_sequences;
    vo.time_limit = o.time_limit;
    auto progress = std::make_shared<Progress>();
    vo.progress = [progress](std::string_view line) { (*progress)(std::string(line)); };
    return vo;
}

// A row as JSON, and back (the plugin's child process sends its row to the parent).
nlohmann::json row_json(const VerifyRow& r) {
    return {{"variant", r.name},
            {"kind", r.kind},
            {"parameters", r.parameters},
            {"cases", r.cases},
            {"result", r.result},
            {"ok", r.ok},
            {"counterexample", r.counterexample},
            {"counterexample_T", r.counterexample_T},
            {"counterexample_fill", r.counterexample_fill},
            {"counterexample_sequences", r.counterexample_sequences},
            {"figures", r.figures},
            {"replay_log", r.replay_log}};
}
VerifyRow row_from_json(const nlohmann::json& j) {
    return {j.at("variant"),
            j.at("kind"),
            j.at("parameters"),
            j.at("cases"),
            j.at("result"),
            j.at("ok"),
            j.at("counterexample"),
            j.at("figures"),
            j.at("counterexample_T"),
            j.at("counterexample_fill"),
            j.at("counterexample_sequences"),
            j.value("replay_log", std::string())};
}

std::string one_line(std::string s) {
    for (char& ch : s)
        if (ch == '\n' || ch == '\r') ch = ' ';
    return s;
}

// A child process's lines ("step <what it is on>", "row <json>", "error <message>") and how it
// ended: the parent's view of a plugin run that may crash or hang.
struct ChildRun {
    std::string last_step, row, error;
    // A plugin check's latest case as its call log came ("log h|f|p <line>", VerifyOptions::call_log).
    std::string log_header, log_pending;
    std::vector<std::string> log_final;
    bool hung = false;
    int status = 0;
    std::string inside;  // the plugin call it was in when it ended, or ""
    // "crashed: signal 11 (...) inside the plugin's slot(pos=3) ...; the last step: ...".
    std::string ending(int timeout_s) const {
        std::string what;
        if (hung)
            what = fmt::format("no answer in {} s", timeout_s);
        else if (WIFSIGNALED(status))
            what = fmt::format("crashed: signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
        else
            what = fmt::format("ended with exit status {} and no result", WEXITSTATUS(status));
        if (!inside.empty()) what += " inside the plugin's " + inside;
        return what + (last_step.empty() ? " before its first step" : "; the last step: " + last_step);
    }
};

// The plugin call a child is inside (set_plugin_call_note), in memory its parent reads after it.
struct SharedNote {
    static constexpr std::size_t kSize = 512;
    char* text = static_cast<char*>(::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    SharedNote() {
        if (text == MAP_FAILED) throw Error(fmt::format("verify --plugin: no shared memory: {}", std::strerror(errno)));
        text[0] = '\0';
    }
    ~SharedNote() { ::munmap(text, kSize); }
    SharedNote(const SharedNote&) = delete;
    SharedNote& operator=(const SharedNote&) = delete;
    std::string read() const { return std::string(text, strnlen(text, kSize)); }
};

// Runs body(out) in a child process, so that a crash or a hang in a plugin's code is a verdict on
// the plugin, never the end of kvlab: body writes its lines on out; no line for timeout_s seconds
// is a hang (the child is killed).
ChildRun run_child(int timeout_s, const std::function<void(std::FILE*)>& body) {
    int fds[2];
    if (::pipe(fds) != 0) throw Error(fmt::format("plugin: no pipe: {}", std::strerror(errno)));
    const SharedNote call;
    std::fflush(stdout), std::fflush(stderr);
    const pid_t pid = ::fork();
    if (pid < 0) throw Error(fmt::format("plugin: cannot start a process: {}", std::strerror(errno)));
    if (pid == 0) {
        ::close(fds[0]);
        set_plugin_call_note(call.text, SharedNote::kSize);
        FILE* out = fdopen(fds[1], "w");
        if (!out) _exit(3);
        try {
            body(out);
        } catch (const std::exception& e) {
            std::fprintf(out, "error %s\n", one_line(e.what()).c_str());
        }
        std::fflush(out);
        _exit(0);
    }
    ::close(fds[1]);
    ChildRun r;
    std::string buffer;
    for (;;) {
        pollfd p{fds[0], POLLIN, 0};
        const int ready = ::poll(&p, 1, timeout_s * 1000);
        if (ready < 0 && errno == EINTR) continue;
        if (ready == 0) {
            r.hung = true;
            ::kill(pid, SIGKILL);
            break;
        }
        char chunk[4096];
        const ssize_t n = ::read(fds[0], chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // the child closed its end: it has ended
        buffer.append(chunk, std::size_t(n));
        for (std::size_t nl; (nl = buffer.find('\n')) != std::string::npos; buffer.erase(0, nl + 1)) {
            const std::string line = buffer.substr(0, nl);
            if (line.rfind("step ", 0) == 0) r.last_step = line.substr(5);
            if (line.rfind("row ", 0) == 0) r.row = line.substr(4);
            if (line.rfind("error ", 0) == 0) r.error = line.substr(6);
            if (line.rfind("log h ", 0) == 0) r.log_header = line.substr(6), r.log_final.clear(), r.log_pending.clear();
            if (line.rfind("log f ", 0) == 0) r.log_final.push_back(line.substr(6));
            if (line.rfind("log p ", 0) == 0) r.log_pending = line.substr(6);
        }
    }
    ::close(fds[0]);
    while (::waitpid(pid, &r.status, 0) < 0 && errno == EINTR) {
    }
    r.inside = call.read();
    return r;
}

// --plugin: the property runs in a child process (run_child), its steps as progress lines. A
// child that ends without a row gets a row of its own: the signal or exit status, the plugin call
// it was inside, and the last step it reported.
VerifyRow run_plugin(const VerifyCommandOptions& o, VerifyOptions vo) {
    const ChildRun c = run_child(o.plugin_timeout, [&](std::FILE* out) {
        vo.progress = [out](std::string_view line) {
            std::fprintf(out, "step %s\n", one_line(std::string(line)).c_str());
            std::fflush(out);
        };
        vo.call_log = [out](std::string_view line) {  // flushed: the next call may never return
            std::fprintf(out, "log %.*s\n", int(line.size()), line.data());
            std::fflush(out);
        };
        std::fprintf(out, "row %s\n", json_text(row_json(verify_plugin(o.plugin, vo))).c_str());
    });
    if (!c.error.empty()) throw Error(c.error);  // the plugin did not load, or an option is wrong
    if (!c.row.empty() && !c.hung) return row_from_json(nlohmann::json::parse(c.row));
    VerifyRow r;
    r.name = fmt::format("plugin {}", o.plugin);
    r.kind = "exact";
    r.parameters = "-";
    r.result = c.hung ? "HUNG" : "CRASHED";
    r.counterexample = c.ending(o.plugin_timeout);
    // The case it died in, up to the call under way (not shrunk: shrinking needs the process).
    if (!c.log_header.empty()) {
        const nlohmann::json h = nlohmann::json::parse(c.log_header, nullptr, false);
        if (h.is_object() && h.contains("plugin") && h["plugin"].is_string())  // the name it reports
            r.name = "plugin " + h["plugin"].get<std::string>();
        r.replay_log = c.log_header + "\n";
        for (const std::string& line : c.log_final) r.replay_log += line + "\n";
        if (!c.log_pending.empty()) r.replay_log += c.log_pending + "\n";
        r.replay_log += replay_log_verdict(r.counterexample, true) + "\n";
    }
    return r;
}

// A failing plugin row's call log, written where --replay-log says (default
// kvlab-replay-NAME.jsonl here); returns the file's name, or "" when there is none to write.
std::string write_replay_log(const VerifyCommandOptions& o, const VerifyRow& row) {
    if (row.replay_log.empty()) return "";
    std::string path = o.replay_log;
    if (path.empty()) {
        std::string name = row.name.rfind("plugin ", 0) == 0 ? row.name.substr(7) : row.name;
        for (char& ch : name)
            if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '-') ch = '_';
        path = "kvlab-replay-" + name + ".jsonl";
    }
    write_file(path, "replay log", row.replay_log);
    return path;
}

}  // namespace

// --plugin-stdio: the plugin is served over stdin and stdout by the process that started kvlab;
// stdout carries the protocol only, and its last line is the result.
int run_plugin_stdio(const VerifyCommandOptions& o) {
    const VerifyOptions vo = verify_options(o);
    check_verify_options(vo);  // before hello: a bad option ends the run in one line, no server needed
    const std::unique_ptr<CachePlugin> plugin = stdio_plugin(stdin, stdout);
    const VerifyRow row = verify_plugin(*plugin, vo);
    if (!stdio_broken().empty()) throw Error(stdio_broken());
    stdio_send_result(row_json(row));
    return row.ok ? 0 : 1;
}

namespace {
// "; the log's verdict: ..." from a log's last line, or "" when it has none.
std::string logged_verdict(const std::string& text) {
    std::size_t end = text.size();
    while (end > 0 && text[end - 1] == '\n') end--;
    const std::size_t nl = end == 0 ? std::string::npos : text.rfind('\n', end - 1);
    const std::size_t from = nl == std::string::npos ? 0 : nl + 1;
    const nlohmann::json last = nlohmann::json::parse(text.substr(from, end - from), nullptr, false);
    if (!last.is_object() || !last.contains("verdict") || !last["verdict"].is_string()) return "";
    return "; the log's verdict: " + one_line(last["verdict"].get<std::string>());
}
}  // namespace

int run_replay(const ReplayOptions& o) {
    const std::string text = read_file_bytes(o.log, std::int64_t{1} << 30);
    if (o.plugin_stdio) {
        const std::unique_ptr<CachePlugin> plugin = stdio_plugin(stdin, stdout);
        const ReplayOutcome r = replay_plugin_log(*plugin, text);
        if (!stdio_broken().empty()) throw Error(stdio_broken());
        stdio_send_result({{"calls", r.calls},
                           {"verdict", r.verdict},
                           {"logged", r.logged},
                           {"same", r.same()},
                           {"divergence", r.divergence},
                           {"report", replay_report(r)}},
                          "replay");
        return r.verdict.empty() ? 0 : 1;
    }
    if (o.plugin.empty()) throw Error("replay: --plugin lib.so or --plugin-stdio says what to replay the log on");
    const ChildRun c = run_child(o.plugin_timeout, [&](std::FILE* out) {
        const CachePlugin plugin(o.plugin);
        const ReplayOutcome r = replay_plugin_log(plugin, text);
        std::fprintf(out, "row %s\n",
                     json_text(nlohmann::json{{"report", replay_report(r)}, {"failed", !r.verdict.empty()}}).c_str());
    });
    if (!c.error.empty()) throw Error(c.error);  // the plugin did not load, or the log is not one
    if (c.row.empty() || c.hung) {               // a log of a crash or a hang, replayed, ends the same way
        fmt::print("kvlab replay {} on {}: {}{}\n", one_line(o.log), one_line(o.plugin), c.ending(o.plugin_timeout),
                   logged_verdict(text));
        return 1;
    }
    const nlohmann::json r = nlohmann::json::parse(c.row);
    fmt::print("kvlab replay {} on {}: {}\n", one_line(o.log), one_line(o.plugin), r.at("report").get<std::string>());
    return r.at("failed").get<bool>() ? 1 : 0;
}

int run_verify(const VerifyCommandOptions& o) {
    if (o.list) return print_list();
    if ((!o.block_sizes.empty() || o.max_sequences > 0 || o.time_limit > 0) && o.plugin.empty() && !o.plugin_stdio)
        throw Error(
            "verify: --block-sizes, --max-sequences and --time-limit are for a plugin's check (--plugin or "
            "--plugin-stdio)");
    if (o.plugin_stdio) return run_plugin_stdio(o);
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<VerifyRow> rows = o.plugin.empty() ? verify(o.variant, verify_options(o))
                                                         : std::vector<VerifyRow>{run_plugin(o, verify_options(o))};
    const double seconds = seconds_since(t0);
    const std::string replay_file = o.plugin.empty() ? "" : write_replay_log(o, rows.front());
    int n_ok = 0, n_mutants = 0, n_caught = 0;
    for (const VerifyRow& r : rows) {
        n_ok += r.ok;
        if (r.kind == "mutant" && r.cases > 0) n_mutants++, n_caught += r.ok;  // a mutant not run is not counted
    }
    if (o.json) {
        nlohmann::json j;
        j["seed"] = o.seed;
        j["cases"] = o.cases;
        j["device"] = o.device;
        if (!o.kv_format.empty()) j["kv_format"] = o.kv_format;
        j["profile"] = o.profile;
        if (!o.attention.kind.empty()) j["attention"] = {{"kind", o.attention.kind}, {"tile", o.attention.tile}};
        j["seconds"] = seconds;
        j["all_ok"] = n_ok == int(rows.size());
        if (n_mutants) j["kill_rate"] = double(n_caught) / n_mutants;
        for (const VerifyRow& r : rows) j["rows"].push_back(row_json(r));
        if (!replay_file.empty()) j["replay_log_file"] = replay_file;
        fmt::print("{}\n", json_document(j));
        return n_ok == int(rows.size()) ? 0 : 1;
    }
    fmt::print("kvlab verify: cache variants against naive decode, logits compared bit for bit at every step\n");
    const std::vector<std::string> devices = parse_devices(o.device);
    if (devices.size() == 1)
        fmt::print("device {}: naive and cached decode both run there\n", devices[0]);
    else
        fmt::print("devices {0},{1}: naive decode on {0} is the reference; naive and cached on {1} must equal it\n",
                   devices[0], devices[1]);
    if (!o.kv_format.empty())
        fmt::print(
            "KV format {}: the variant rows and scenarios store K and V in it where the variant takes a format, "
            "and naive decode stores them the same way\n",
            o.kv_format);
    if (!o.attention.kind.empty())
        fmt::print("attention {}: naive decode and the decoders under test run it in every exact row\n",
                   attention_name(attention_spec(o.attention)));
    fmt::print("{} case(s) per property, seed {}; counterexamples are RapidCheck's shrunk cases\n\n", o.cases, o.seed);
    std::size_t w_name = 7, w_params = 10, w_result = 6;
    for (const VerifyRow& r : rows) {
        w_name = std::max(w_name, r.name.size());
        w_params = std::max(w_params, r.parameters.size());
        w_result = std::max(w_result, r.result.size());
    }
    fmt::print("{:<{}}  {:<11}  {:<{}}  {:>5}  {:<{}}  {}\n", "variant", w_name, "kind", "parameters", w_params,
               "cases", "result", w_result, "counterexample");
    for (const VerifyRow& r : rows) {
        fmt::print("{:<{}}  {:<11}  {:<{}}  {:>5}  {:<{}}  {}\n", r.name, w_name, r.kind, r.parameters, w_params,
                   r.cases, r.result + (r.ok ? "" : " !"), w_result, r.counterexample.empty() ? "-" : r.counterexample);
        if (!r.figures.empty()) fmt::print("{:<{}}  measured: {}\n", "", w_name, r.figures);
    }
    if (!replay_file.empty())
        fmt::print("\nthe failing case's calls: {} (run them again: kvlab replay {} --plugin {})\n", replay_file,
                   replay_file, o.plugin);
    fmt::print("\n{} of {} rows as promised", n_ok, rows.size());
    if (n_mutants)
        fmt::print("; mutants caught {} of {} (kill rate {:.0f}%)", n_caught, n_mutants, 100.0 * n_caught / n_mutants);
    fmt::print("; {:.1f} s\n", seconds);
    return n_ok == int(rows.size()) ? 0 : 1;
}

}  // namespace kvlab::cli
