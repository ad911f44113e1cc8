// Output that never claims what did not happen: every kind of output path, a full disk and a
// closed pipe on standard output, an interrupt part-way through a write, two writers racing for
// one file, bytes that are not UTF-8, and the progress line that long commands show on a
// terminal (and only there). And work that is bounded: the pool's naive checks.
#include <fcntl.h>
#include <fmt/format.h>
#include <pty.h>
#include <rapidcheck.h>
#include <rapidcheck/catch.h>
#include <rapidcheck/detail/Configuration.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_util.h"
#include "config.h"
#include "cost_model.h"
#include "grader.h"
#include "test_util.h"

using kvlab::test::check_cases;

namespace {

const char* const kTiny = "dim=16,hidden_dim=24,n_layers=2,n_heads=4,n_kv_heads=2,vocab_size=40,max_seq=32";

fs::path exported(const std::string& name, const std::string& shape, int seed = 3) {
    const fs::path p = scratch() / name;
    const Run r = run_kvlab("export --shape " + shape + " --seed " + std::to_string(seed) + " " + p.string());
    REQUIRE(r.exit_code == 0);
    return p;
}

bool has_viewer() { return run_kvlab("view --help").exit_code == 0; }

// The commands that write a file named on their command line, with that name in place of {}.
std::vector<std::string> writers() {
    const std::string model = exported("writers.bin", kTiny).string();
    std::vector<std::string> w{"export --shape " + std::string(kTiny) + " {}",
                               "bench --shape " + std::string(kTiny) + " --lengths 8 --naive-max 8 --plot {}",
                               "frontier --model " + model + " --length 16 --prompts 1 --plot {}"};
    if (has_viewer()) w.push_back("view --headless --frames 1 --model " + model + " --screenshot {}");
    if (has_viewer()) w.push_back("view --headless --frames 1 --model " + model + " --layout {}");
    return w;
}

std::string with_path(std::string command, const std::string& path) {
    return command.replace(command.find("{}"), 2, path);
}

// A path of the given kind, made fresh under `dir`: what kvlab must refuse, and the words it says.
std::pair<fs::path, std::string> refused_path(const std::string& kind, const fs::path& dir) {
    fs::create_directories(dir);
    const fs::path p = dir / "out.png";
    if (kind == "folder") fs::create_directories(p);
    if (kind == "fifo" || kind == "link to a fifo") REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
    if (kind == "fifo") fs::rename(dir / "fifo", p);
    if (kind == "link to a fifo") fs::create_symlink(dir / "fifo", p);
    if (kind == "socket") {
        const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::strncpy(a.sun_path, p.c_str(), sizeof a.sun_path - 1);
        REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
        ::close(fd);
    }
    if (kind == "folder") return {p, "is a folder"};
    if (kind == "fifo" || kind == "link to a fifo") return {p, "is a FIFO"};
    if (kind == "socket") return {p, "is a socket"};
    if (kind == "device") return {"/dev/zero", "is a character device"};
    return {dir / "missing" / "out.png", "does not exist"};  // "missing folder"
}

}  // namespace

TEST_CASE("every file writer refuses a folder or FIFO or socket or device or missing folder in one line",
          "[output][cli][errors]") {
    const std::vector<std::string> commands = writers();
    int n = 0;
    for (const std::string& command : commands)
        for (const char* kind : {"folder", "fifo", "link to a fifo", "socket", "device", "missing folder"}) {
            const auto [path, words] = refused_path(kind, scratch() / ("refused" + std::to_string(n++)));
            INFO(command << " with " << kind);
            // A FIFO without a reader would block an open() for ever: the refusal must come first.
            check_refused(with_path(command, path.string()), words);
            if (fs::is_regular_file(path)) FAIL("a file was written at " << path);
        }
}

TEST_CASE("export writes /dev/null and /dev/stdout in place and replaces a symbolic link's file but not the link",
          "[output][cli]") {
    const fs::path reference = exported("reference.bin", kTiny);
    const std::string bytes = slurp(reference);
    CHECK(run_kvlab("export --shape " + std::string(kTiny) + " --seed 3 /dev/null").exit_code == 0);
    const Run to_stdout = run_kvlab("export --shape " + std::string(kTiny) + " --seed 3 /dev/stdout");
    REQUIRE(to_stdout.exit_code == 0);
    CHECK(to_stdout.out == bytes);  // the note went to stderr
    CHECK(to_stdout.err.find("wrote /dev/stdout") == 0);
    // A link, dangling or not, keeps pointing where it did; the file it names gets the bytes whole.
    for (const bool dangling : {true, false}) {
        const fs::path dir = scratch() / (dangling ? "dangling" : "linked");
        fs::create_directories(dir);
        if (!dangling) std::ofstream(dir / "target.bin") << "old";
        fs::create_symlink("target.bin", dir / "link.bin");
        REQUIRE(
            run_kvlab("export --shape " + std::string(kTiny) + " --seed 3 " + (dir / "link.bin").string()).exit_code ==
            0);
        CHECK(fs::is_symlink(dir / "link.bin"));
        CHECK(slurp(dir / "target.bin") == bytes);
        CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 2);  // no temporary left
    }
}

namespace {

// `kvlab <args>` run by bash with stdout redirected as `redirect` says; its status and stderr.
Run run_redirected(const std::string& args, const std::string& redirect) {
    const fs::path err = scratch() / "redirected.err", status = scratch() / "redirected.status";
    const std::string script = "timeout 300 " + std::string(KVLAB_BINARY) + " " + args + " 2>" + err.string() + " " +
                               redirect + "; echo ${PIPESTATUS[0]} >" + status.string();
    const std::string cmd = "bash -c '" + script + "' </dev/null";
    REQUIRE(std::system(cmd.c_str()) == 0);
    Run r;
    r.exit_code = std::stoi(slurp(status));
    r.signaled = r.exit_code > 128;
    r.err = slurp(err);
    return r;
}

}  // namespace

TEST_CASE("a full disk under standard output is a one-line error and exit status 1 for every command",
          "[output][cli][errors]") {
    const std::string model = exported("full.bin", kTiny).string(), m = " --model " + model;
    for (const std::string& args : std::vector<std::string>{
             "generate" + m + " --tokens 1,5 --steps 8", "generate" + m + " --tokens 1,5 --steps 8 --json",
             "demo" + m + " --tokens 1,5 --steps 4", "demo" + m + " --tokens 1,5 --steps 4 --json",
             "verify paged --cases 2", "pool" + m + " --script \"new a 1,2,3; show\"",
             "bench --shape " + std::string(kTiny) + " --lengths 8 --naive-max 8", "memory",
             "export --shape " + std::string(kTiny) + " /dev/stdout"}) {
        const Run r = run_redirected(args, ">/dev/full");
        INFO("kvlab " << args << " >/dev/full\nexit " << r.exit_code << "\nstderr: " << r.err);
        CHECK(r.exit_code == 1);
        CHECK(r.err.rfind("kvlab: error: ", 0) == 0);
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
        CHECK(r.err.find("No space left on device") != std::string::npos);
    }
}

TEST_CASE("a reader that goes away stops generate at once: exit status 1 and one line and no decode to the end",
          "[output][cli][errors]") {
    const std::string model =
        exported("pipe.bin", "dim=8,hidden_dim=16,n_layers=1,n_heads=2,n_kv_heads=1,vocab_size=40,max_seq=4096")
            .string();
    check_cases(6, [&] {  // the reader takes k bytes and closes the pipe
        const int k = *rc::gen::inRange(0, 64);
        const int steps = *rc::gen::inRange(3000, 4095);
        const Run r = run_redirected("generate --model " + model + " --tokens 1 --steps " + std::to_string(steps),
                                     "| head -c " + std::to_string(k) + " >/dev/null");
        RC_LOG() << "exit " << r.exit_code << ", stderr: " << r.err;
        RC_ASSERT(r.exit_code == 1);
        RC_ASSERT(r.err == "kvlab: error: cannot write to standard output: Broken pipe\n");  // no tok/s line
    });
}

namespace {

// kvlab started with stdin, stdout and stderr on /dev/null and every signal's default action (the
// test process's handlers must not run in the child, not even before exec).
pid_t spawn_kvlab(const std::vector<std::string>& args) {
    std::vector<char*> argv{const_cast<char*>(KVLAB_BINARY)};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    for (int fd : {0, 1, 2}) posix_spawn_file_actions_addopen(&files, fd, "/dev/null", O_RDWR, 0);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t all;
    sigfillset(&all);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    pid_t pid = -1;
    const int failed = posix_spawn(&pid, KVLAB_BINARY, &files, &attr, argv.data(), environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&files);
    REQUIRE(failed == 0);
    return pid;
}

int wait_for(pid_t pid) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    return status;
}

// The files in dir whose names hold ".tmp-": temporaries a writer left behind.
int temporaries(const fs::path& dir) {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir))
        n += e.path().filename().string().find(".tmp-") != std::string::npos;
    return n;
}

// 100 MB of weights: an export whose writing takes a good part of a second, long enough to be
// interrupted part-way.
const char* const kLarge = "dim=512,hidden_dim=1024,n_layers=8,n_heads=8,n_kv_heads=8,vocab_size=8192,max_seq=64";

}  // namespace

TEST_CASE("an interrupt at any moment of an export leaves either nothing or the whole model and no temporary",
          "[output][cli][signals]") {
    const std::string reference = slurp(exported("interrupt-reference.bin", kLarge, 7));
    check_cases(
        10,
        [&] {  // SIGINT, SIGTERM or SIGHUP after a drawn delay
            const int delay_ms = *rc::gen::inRange(0, 400);
            const int sig = *rc::gen::element(SIGINT, SIGTERM, SIGHUP);
            const fs::path dir = scratch() / "interrupted";
            fs::remove_all(dir);
            fs::create_directories(dir);
            const fs::path out = dir / "model.bin";
            const pid_t pid = spawn_kvlab({"export", "--shape", kLarge, "--seed", "7", out.string()});
            std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
            ::kill(pid, sig);
            const int status = wait_for(pid);
            RC_LOG() << "delay " << delay_ms << " ms, signal " << sig << ", status " << status;
            RC_ASSERT((WIFSIGNALED(status) && WTERMSIG(status) == sig) ||
                      (WIFEXITED(status) && WEXITSTATUS(status) == 0));
            RC_ASSERT(temporaries(dir) == 0);
            if (fs::exists(out)) RC_ASSERT(slurp(out) == reference);
            RC_TAG(fs::exists(out) ? "finished" : "interrupted");
        },
        false);
}

TEST_CASE("two exports racing for one path leave one of the two models whole", "[output][cli]") {
    const std::string a = slurp(exported("race-a.bin", kLarge, 11)), b = slurp(exported("race-b.bin", kLarge, 12));
    for (int round = 0; round < 3; round++) {
        const fs::path dir = scratch() / ("race" + std::to_string(round));
        fs::create_directories(dir);
        const fs::path out = dir / "model.bin";
        const pid_t p = spawn_kvlab({"export", "--shape", kLarge, "--seed", "11", out.string()});
        const pid_t q = spawn_kvlab({"export", "--shape", kLarge, "--seed", "12", out.string()});
        CHECK(wait_for(p) == 0);
        CHECK(wait_for(q) == 0);
        const std::string got = slurp(out);
        CHECK((got == a || got == b));
        CHECK(temporaries(dir) == 0);
    }
}

namespace {

// `kvlab <args>` with stderr on a terminal (a pseudo-terminal this test reads) and stdout on a
// file: what the terminal showed.
std::string on_terminal(const std::string& args) {
    int master = -1;
    const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
    REQUIRE(pid >= 0);
    if (pid == 0) {
        const int out = ::open((scratch() / "terminal.out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        ::dup2(out, 1);
        ::execl("/bin/sh", "sh", "-c", (std::string(KVLAB_BINARY) + " " + args).c_str(), nullptr);
        ::_exit(127);
    }
    std::string shown;
    char buf[4096];
    for (ssize_t n; (n = ::read(master, buf, sizeof buf)) > 0;) shown.append(buf, std::size_t(n));
    ::close(master);
    const int status = wait_for(pid);
    INFO("kvlab " << args << "\n" << shown);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    return shown;
}

}  // namespace

TEST_CASE("long commands show a progress line on a terminal that is cleared at the end and nothing in a pipe",
          "[output][cli][progress]") {
    const std::string model = exported("progress.bin", kTiny).string(), m = " --model " + model;
    for (const auto& [args, line] : std::vector<std::pair<std::string, std::string>>{
             {"verify paged --cases 3", "verify: row 1 of 1: paged"},
             {"demo" + m + " --tokens 1,2 --steps 8", "demo: step 1 of 8, T = 3"},
             {"pool" + m + " --json --script \"new a 1,2,3; append a 4; show\"", "pool: command 1 of 3"},
             {"bench --shape " + std::string(kTiny) + " --lengths 8 --naive-max 8", "bench: "},
             {"serve-sim" + m + " --requests 4 --prompt-len 2-6 --output-len 2-6 --system-prompt-len 2",
              "serve-sim: step "},
             {"frontier" + m + " --length 16 --prompts 1", "frontier: "}}) {
        INFO("kvlab " << args);
        const std::string shown = on_terminal(args);
        CHECK(shown.find("\r\x1b[K" + line) != std::string::npos);
        // The line is cleared at the end: nothing of it follows the last clearing.
        const std::size_t cleared = shown.rfind("\r\x1b[K");
        CHECK(shown.find(line.substr(0, line.find(':')), cleared + 4) == std::string::npos);
        const Run piped = run_kvlab(args);
        CHECK(piped.exit_code == 0);
        CHECK(piped.err.find('\x1b') == std::string::npos);
    }
}

namespace {

// `kvlab` with exactly these arguments (any bytes: no shell between), capturing both streams.
Run run_argv(const std::vector<std::string>& args) {
    const fs::path out = scratch() / "argv.out", err = scratch() / "argv.err";
    std::vector<char*> argv{const_cast<char*>(KVLAB_BINARY)};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&files, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&files, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid = -1;
    const int failed = posix_spawn(&pid, KVLAB_BINARY, &files, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&files);
    REQUIRE(failed == 0);
    const int status = wait_for(pid);
    Run r;
    r.signaled = WIFSIGNALED(status);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out), r.err = slurp(err);
    return r;
}

// Bytes for a file name: anything but '/' and NUL, with a bias to what breaks UTF-8.
rc::Gen<std::string> name_bytes() {
    const auto byte = rc::gen::oneOf(rc::gen::inRange<int>(1, 256), rc::gen::inRange<int>(0x80, 256),
                                     rc::gen::element<int>(0xC0, 0xC1, 0xE0, 0xED, 0xF4, 0xF5, 0xFF, 0x1B, '\n'));
    return rc::gen::map(rc::gen::container<std::vector<int>>(rc::gen::suchThat(byte, [](int b) { return b != '/'; })),
                        [](const std::vector<int>& v) {
                            std::string s = "m-";
                            for (int b : v) s += char(b);
                            return s;
                        });
}

bool is_valid_utf8(const std::string& s) { return kvlab::valid_utf8(s) == s; }

}  // namespace

TEST_CASE("bytes that are not UTF-8 in a path are escaped in --json and in messages and never crash",
          "[output][cli][errors]") {
    const fs::path model = exported("utf8.bin", kTiny);
    check_cases(30, [&] {
        const std::string name = *name_bytes();
        const fs::path link = scratch() / name;
        fs::remove(link);
        fs::create_symlink(model, link);
        const Run r = run_argv({"demo", "--json", "--model", link.string(), "--tokens", "1,5", "--steps", "2"});
        RC_LOG() << "stderr: " << r.err;
        RC_ASSERT(r.exit_code == 0);
        const auto j = nlohmann::json::parse(r.out);  // throws on bytes that are not UTF-8
        RC_ASSERT(j["model"].get<std::string>() == kvlab::valid_utf8(link.string()));
        fs::remove(link);
        // Missing, the path is named in one line, escaped: no control byte, nothing that is not UTF-8.
        const Run missing = run_argv({"demo", "--json", "--model", link.string(), "--steps", "2"});
        RC_ASSERT(missing.exit_code == 1);
        RC_ASSERT(std::count(missing.err.begin(), missing.err.end(), '\n') == 1);
        RC_ASSERT(is_valid_utf8(missing.err));
        RC_ASSERT(std::none_of(missing.err.begin(), missing.err.end() - 1,
                               [](char ch) { return static_cast<unsigned char>(ch) < 0x20; }));
    });
}

TEST_CASE("prompts of any bytes give JSON that parses for generate and demo", "[output][cli][errors]") {
    KVLAB_MODEL_FILE_OR_SKIP(model, "stories260K.bin");
    KVLAB_MODEL_FILE_OR_SKIP(tokenizer, "tok512.bin");  // with byte-fallback pieces: <0xFF> is one byte
    check_cases(20, [&] {
        const std::string prompt = *name_bytes();
        for (const char* command : {"generate", "demo"}) {
            const Run r = run_argv(
                {command, "--json", "--model", model, "--tokenizer", tokenizer, "--prompt", prompt, "--steps", "8"});
            RC_LOG() << command << ": " << r.err;
            RC_ASSERT(r.exit_code == 0);
            RC_ASSERT(is_valid_utf8(r.out));
            RC_ASSERT(nlohmann::json::parse(r.out).contains("generated_tokens"));
        }
    });
}

TEST_CASE("a lab grader escapes what a student's code says: its table and counterexamples stay printable",
          "[output][lessons]") {
    check_cases(40, [] {
        const std::string said = *rc::gen::container<std::string>(rc::gen::inRange<char>(-128, 127));
        kvlab::lessons::Lab lab{99, "escapes", "wrong/escape.cpp", {}};
        lab.checks.push_back({"a student's exception", 1, [said] { throw kvlab::Error(said); }, 2});
        // The grader prints on stdout: into a file for the length of the call.
        const fs::path out = scratch() / "grader.out";
        std::fflush(stdout);
        const int saved = ::dup(1), file = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        ::dup2(file, 1);
        char arg0[] = "lab99";
        char* argv[] = {arg0, nullptr};
        const int status = kvlab::lessons::grade(lab, 1, argv);
        std::fflush(stdout);
        ::dup2(saved, 1), ::close(saved), ::close(file);
        const std::string shown = slurp(out);
        RC_LOG() << shown;
        RC_ASSERT(status == 1);
        RC_ASSERT(is_valid_utf8(shown));
        RC_ASSERT(std::none_of(shown.begin(), shown.end(), [](char ch) {
            return (static_cast<unsigned char>(ch) < 0x20 && ch != '\n') || ch == 0x7f;
        }));
        // Each line of it is shown escaped (what() is a C string: the message ends at a NUL).
        std::istringstream lines{std::string(said.c_str())};
        for (std::string line; std::getline(lines, line);)
            RC_ASSERT(shown.find(kvlab::one_line(line)) != std::string::npos);
    });
}

TEST_CASE("kvlab pool: the naive check's work stays within --check-budget and every prefill past it says so",
          "[output][cli][pool]") {
    const fs::path model = exported("budget.bin", kTiny);
    const kvlab::Config c = kvlab::Config::parse(kTiny, kvlab::Config{});
    check_cases(25, [&] {
        // A script of new, append and fork commands, each sequence within max_seq = 32.
        const auto tokens = [](int n) {
            std::string list;
            for (int i = 0; i < n; i++) list += (i ? "," : "") + std::to_string(*rc::gen::inRange(0, 40));
            return list;
        };
        std::vector<int> lengths{*rc::gen::inRange(1, 12)};
        std::string script = "new s0 " + tokens(lengths[0]);
        for (int n = *rc::gen::inRange(0, 10), i = 0; i < n; i++) {
            const int s = *rc::gen::inRange(0, int(lengths.size()));
            const int add = *rc::gen::inRange(1, 6);
            if (*rc::gen::inRange(0, 3) == 0 && lengths.size() < 6) {
                script += fmt::format("; fork s{} s{}", s, lengths.size());
                lengths.push_back(lengths[std::size_t(s)]);
            } else if (lengths[std::size_t(s)] + add <= 32) {
                script += fmt::format("; append s{} {}", s, tokens(add));
                lengths[std::size_t(s)] += add;
            }
        }
        const double budget = *rc::gen::element(0.0, 1e-5, 1e-4, 3e-4, 1e-3, 1e9);
        const Run r = run_argv({"pool", "--model", model.string(), "--json", "--blocks", "64", "--check-budget",
                                fmt::format("{}", budget), "--script", script});
        RC_LOG() << script << "\n" << r.err;
        RC_ASSERT(r.exit_code == 0);
        const auto j = nlohmann::json::parse(r.out);
        const auto& s = j["summary"];
        RC_ASSERT(s["naive_gflop"].get<double>() <= budget);
        int prefills = 0, checked = 0;
        bool stopped = false;
        for (const auto& record : j["commands"]) {
            if (!record.contains("checked")) continue;  // not a prefill
            prefills++;
            const bool was = record["checked"];
            RC_ASSERT(!(stopped && was));  // once past the budget, no prefill is checked
            if (!was && !stopped) {
                // The first unchecked prefill did not fit: the budget was not left unused.
                const double cost = double(kvlab::naive_step_cost(c, record["length"], {}).flops());
                RC_ASSERT(s["naive_gflop"].get<double>() * 1e9 + cost > budget * 1e9);
            }
            stopped = stopped || !was;
            checked += was;
            RC_ASSERT(record["bitwise_equal"] == (was ? nlohmann::json(true) : nlohmann::json(nullptr)));
        }
        RC_ASSERT(s["prefills"] == prefills);
        RC_ASSERT(s["prefills_checked"] == checked);
        if (budget >= 1) RC_ASSERT(checked == prefills);
        RC_TAG(checked == prefills ? "all checked" : checked == 0 ? "none checked" : "some checked");
    });
}

TEST_CASE("the memory budget: charges are refused exactly when the process's total would pass kMaxBytes", "[budget]") {
    check_cases(200, [] {
        const std::int64_t base = kvlab::memory_charged();
        std::vector<std::pair<std::string, kvlab::MemoryCharge>> live;
        std::int64_t model = 0;  // the sum the ledger must hold beyond base
        for (int op = 0, n = *rc::gen::inRange(1, 30); op < n; op++) {
            if (!live.empty() && *rc::gen::inRange(0, 3) == 0) {
                const std::size_t i = std::size_t(*rc::gen::inRange(0, int(live.size())));
                model -= live[i].second.bytes();
                live.erase(live.begin() + std::ptrdiff_t(i));
                continue;
            }
            const std::int64_t bytes = *rc::gen::inRange<std::int64_t>(0, kvlab::kMaxBytes / 2);
            const std::string name = "thing " + std::to_string(op);
            const bool fits = base + model + bytes <= kvlab::kMaxBytes;
            try {
                kvlab::MemoryCharge c(name, bytes);
                RC_ASSERT(fits);
                if (*rc::gen::inRange(0, 4) == 0 && base + model + 2 * bytes <= kvlab::kMaxBytes) {
                    live.emplace_back(name + " (copy)", c);  // a copy holds its own bytes
                    model += bytes;
                }
                live.emplace_back(name, std::move(c));
                model += bytes;
            } catch (const kvlab::Error& e) {
                RC_ASSERT(!fits);
                // The refusal names what asked and the biggest holder.
                const std::string what = e.what();
                RC_ASSERT(what.find(name + " would take") == 0);
                auto biggest = std::max_element(live.begin(), live.end(), [](const auto& a, const auto& b) {
                    return a.second.bytes() < b.second.bytes();
                });
                if (biggest != live.end() && base == 0) RC_ASSERT(what.find("the biggest thing") != std::string::npos);
            }
            RC_ASSERT(kvlab::memory_charged() == base + model);
        }
        live.clear();
        RC_ASSERT(kvlab::memory_charged() == base);
    });
}

// Under a budget of B (KVLAB_MEMORY_BUDGET, drawn from 128 to 256 MiB so that a case allocates
// a fraction of a GiB): things that each fit in B alone, but not together.
TEST_CASE("kvlab refuses in one line naming the biggest holder what fits alone but not beside the rest",
          "[budget][cli][errors]") {
    check_cases(
        4,
        [] {
            const std::int64_t mib = 1 << 20, budget = mib * *rc::gen::inRange(128, 257);
            const std::string env = fmt::format("env KVLAB_MEMORY_BUDGET={}MiB", budget / mib);
            const std::string says =
                fmt::format("kvlab's memory budget of {}.0 MiB (KVLAB_MEMORY_BUDGET)", budget / mib);
            RC_LOG() << env << "\n";
            // bench: KV caches of 0.55 B .. B - 32 MiB each (the first fits beside the weights, their
            // packed copy and the RoPE tables, up to about 21 MiB), two or more of them at once.
            const int layers = *rc::gen::element(4, 8);
            const std::int64_t bytes = *rc::gen::inRange<std::int64_t>(budget * 11 / 20, budget - 32 * mib);
            const int max_seq = int(bytes / (2 * 4 * 256 * std::int64_t(layers)));
            const Run bench = run_kvlab(
                fmt::format("bench --shape dim=256,hidden_dim=64,n_layers={},n_heads=8,n_kv_heads=8,vocab_size=64,"
                            "max_seq={} --lengths 8",
                            layers, max_seq),
                env);
            RC_LOG() << bench.err;
            RC_ASSERT(bench.exit_code == 1);
            RC_ASSERT(std::count(bench.err.begin(), bench.err.end(), '\n') == 1);
            RC_ASSERT(bench.err.find(says) != std::string::npos);
            RC_ASSERT(bench.err.find("the biggest a KV cache") != std::string::npos);
            // export: RoPE tables of 8 KiB a position (1024 pairs) beside a model of dim 2048 (64 MiB of
            // attention weights), each under B alone.
            const int long_seq = *rc::gen::inRange(int((budget - 48 * mib) / 8192), int(budget / 8192) + 1);
            const Run rope = run_kvlab(
                fmt::format("export --shape dim=2048,hidden_dim=8,n_layers=1,n_heads=1,n_kv_heads=1,vocab_size=8,"
                            "max_seq={} {}",
                            long_seq, (scratch() / "rope.bin").string()),
                env);
            RC_LOG() << rope.err;
            RC_ASSERT(rope.exit_code == 1);
            RC_ASSERT(rope.err.find("the RoPE tables (" + std::to_string(long_seq) + " positions") !=
                      std::string::npos);
            RC_ASSERT(rope.err.find(says) != std::string::npos);
            RC_ASSERT(rope.err.find("the biggest a model of") != std::string::npos);
            RC_ASSERT(!fs::exists(scratch() / "rope.bin"));
            // pool --json: a show copies the whole pool's table into the report, which grows with the
            // script; the pool's blocks scale with B, as both the pool and each show's copy do.
            std::string script = "new a 1,2,3";
            for (int i = 0, n = *rc::gen::inRange(200, 400); i < n; i++) script += "; show";
            const Run pool = run_kvlab(
                fmt::format("pool --blocks {} --json --script '{}'", 65536 * (budget / mib) / 1024, script), env);
            RC_LOG() << pool.err;
            RC_ASSERT(pool.exit_code == 1);
            RC_ASSERT(pool.err.find("pool --json's report (") != std::string::npos);
            RC_ASSERT(pool.err.find(says) != std::string::npos);
        },
        false);
}

// KVLAB_MEMORY_BUDGET lowers the budget and never raises it; a value it cannot read is one line.
TEST_CASE("KVLAB_MEMORY_BUDGET: a lower budget refuses what the default holds and a bad value is one line",
          "[budget][cli][errors]") {
    const std::string shape =
        "--shape dim=64,hidden_dim=64,n_layers=2,n_heads=4,n_kv_heads=4,vocab_size=64,max_seq=65536";
    const std::string args = "export " + shape + " " + (scratch() / "b.bin").string();
    CHECK(run_kvlab(args).exit_code == 0);
    for (const char* one_mib : {"1MiB", "1048576", "1024KiB"}) {  // the RoPE tables alone take 4 MiB
        const Run low = run_kvlab(args, fmt::format("env KVLAB_MEMORY_BUDGET={}", one_mib));
        INFO(low.err);
        CHECK(low.exit_code == 1);
        CHECK(low.err.find("kvlab's memory budget of 1.0 MiB (KVLAB_MEMORY_BUDGET)") != std::string::npos);
    }
    for (const char* bad : {"0", "1023KiB", "2GiB", "1073741825", "12XB", "-5", "64 MiB", "", "1e9"}) {
        const Run r = run_kvlab(args, fmt::format("env 'KVLAB_MEMORY_BUDGET={}'", bad));
        INFO("KVLAB_MEMORY_BUDGET='" << bad << "': " << r.err);
        CHECK(r.exit_code == 1);
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
        CHECK(r.err.find("is not a size from 1MiB to 1GiB") != std::string::npos);
    }
    for (const char* good : {"1GiB", "16777216", "16384KiB", "512MiB"})
        CHECK(run_kvlab(args, fmt::format("env KVLAB_MEMORY_BUDGET={}", good)).exit_code == 0);
}
