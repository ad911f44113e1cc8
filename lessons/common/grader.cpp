#include "grader.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include "compare.h"
#include "file_writer.h"

namespace kvlab::lessons {

namespace {

struct Options {
    int cases = 0;  // 0: each check's own
    std::uint64_t seed = 1;
    std::string report;   // "": none
    int time_limit = 10;  // seconds a generated case may take
    bool fork = true;
};

// --cases N / --seed S / --report FILE / --time-limit S / --no-fork; anything else is a one-line error.
bool parse_args(int argc, char** argv, Options& o) {
    for (int i = 1; i < argc; i++) {
        const std::string_view a = argv[i];
        if (a == "--report" && i + 1 < argc) {
            o.report = argv[++i];
        } else if (a == "--no-fork") {
            o.fork = false;
        } else if ((a == "--cases" || a == "--seed" || a == "--time-limit") && i + 1 < argc) {
            const std::string_view v = argv[++i];
            std::uint64_t x = 0;
            const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
            const std::uint64_t most = a == "--cases" ? 1000000 : a == "--time-limit" ? 86400 : ~std::uint64_t{0};
            if (ec != std::errc() || end != v.data() + v.size() || (a != "--seed" && (x < 1 || x > most))) {
                fmt::print(stderr, "grade: error: {} wants a number{}, not '{}'\n", argv[i - 1],
                           a == "--seed" ? "" : fmt::format(" from 1 to {}", most), one_line(argv[i]));
                return false;
            }
            (a == "--cases" ? void(o.cases = int(x)) : a == "--seed" ? void(o.seed = x) : void(o.time_limit = int(x)));
        } else {
            fmt::print(stderr,
                       "grade: error: unknown argument '{}' (--cases N, --seed S, --report FILE, --time-limit S, "
                       "--no-fork)\n",
                       one_line(argv[i]));
            return false;
        }
    }
    return true;
}

// Memory the grader shares with the child running a check: how many cases the child has started
// (the time limit counts from the latest), and the case it logged last (log_case).
struct CaseNote {
    std::atomic<std::uint64_t> started{0};
    std::atomic<std::uint32_t> length{0};
    char text[3000] = {};
};
CaseNote* g_note = nullptr;  // null: no check is running

CaseNote* shared_note() {
    static CaseNote* const note = [] {
        void* p = mmap(nullptr, sizeof(CaseNote), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? nullptr : new (p) CaseNote;
    }();
    return note;
}

std::string last_case() {
    const CaseNote* n = shared_note();
    const std::uint32_t length = n ? std::min<std::uint32_t>(n->length, sizeof n->text) : 0;
    return length == 0 ? "(this check logged no case)" : std::string(n->text, length);
}

// One check in this process: every case first clears the note and counts itself.
PropertyOutcome run_here(const LabCheck& c, int cases, std::uint64_t seed) {
    const auto body = [&c] {
        if (g_note) g_note->length = 0, g_note->started++;
        c.property();
    };
    try {
        return check_property(body, cases, seed);
    } catch (const std::exception& e) {  // a property that fails outside RapidCheck's case
        PropertyOutcome r;
        r.counterexample = e.what();
        return r;
    } catch (...) {
        PropertyOutcome r;
        r.counterexample =
            "your code threw something that is not a std::exception, on the case logged last: " + last_case();
        return r;
    }
}

void write_all(int fd, const std::string& text) {
    for (std::size_t done = 0; done < text.size();) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n <= 0 && errno != EINTR) return;
        if (n > 0) done += std::size_t(n);
    }
}

// Reads the child's answer until it closes the pipe; false when a case ran past the time limit
// (the child is then killed).
bool read_answer(int fd, pid_t child, int time_limit, std::string& answer) {
    using Clock = std::chrono::steady_clock;
    std::uint64_t seen = g_note->started;
    Clock::time_point since = Clock::now();
    for (;;) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 100) > 0) {
            char buf[4096];
            const ssize_t n = ::read(fd, buf, sizeof buf);
            if (n == 0 || (n < 0 && errno != EINTR)) return true;
            if (n > 0) answer.append(buf, std::size_t(n));
        }
        if (const std::uint64_t now = g_note->started; now != seen) seen = now, since = Clock::now();
        if (Clock::now() - since > std::chrono::seconds(time_limit)) {
            ::kill(child, SIGKILL);
            return false;
        }
    }
}

// What a child that gave no whole answer did, as a failing outcome.
PropertyOutcome died(int status, bool hung, int time_limit) {
    PropertyOutcome r;
    r.cases = int(std::max<std::uint64_t>(g_note->started, 1));
    const std::string on = "on the case logged last: " + last_case();
    if (hung) {
        r.counterexample = fmt::format("no answer in {} s (an endless loop?) {}", time_limit, on);
    } else if (WIFSIGNALED(status)) {
        const int sig = WTERMSIG(status);
        const char* abbrev = sigabbrev_np(sig);
        r.counterexample =
            fmt::format("your code crashed the check with SIG{} ({}) {}{}", abbrev ? abbrev : "?", strsignal(sig), on,
                        sig == SIGABRT ? "; the report above it, if any, says where" : "");
    } else {
        r.counterexample = fmt::format(
            "the check ended with exit status {} before it answered {}; the report "
            "above it, if any, says why",
            WIFEXITED(status) ? WEXITSTATUS(status) : -1, on);
    }
    return r;
}

// One check in a child process: "<passed> <cases> <counterexample>" comes back through a pipe.
PropertyOutcome run_isolated(const LabCheck& c, int cases, std::uint64_t seed, int time_limit) {
    g_note = shared_note();
    int fds[2];
    if (g_note == nullptr || ::pipe(fds) != 0) return run_here(c, cases, seed);  // no isolation to be had
    g_note->started = 0, g_note->length = 0;
    std::fflush(nullptr);  // nothing buffered twice
    const pid_t child = ::fork();
    if (child < 0) {
        ::close(fds[0]), ::close(fds[1]);
        return run_here(c, cases, seed);
    }
    if (child == 0) {
        ::close(fds[0]);
        const PropertyOutcome r = run_here(c, cases, seed);
        write_all(fds[1], fmt::format("{} {} {}", r.passed ? 1 : 0, r.cases, r.counterexample));
        std::fflush(nullptr);
        ::_exit(0);
    }
    ::close(fds[1]);
    std::string answer;
    const bool answered = read_answer(fds[0], child, time_limit, answer);
    ::close(fds[0]);
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    PropertyOutcome r;
    int passed = 0;
    std::size_t at = 0;
    const bool whole = answered && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
                       std::sscanf(answer.c_str(), "%d %d %zn", &passed, &r.cases, &at) >= 2 && at > 0;
    if (!whole) return died(status, !answered, time_limit);
    r.passed = passed == 1;
    r.counterexample = answer.substr(at);
    return r;
}

}  // namespace

void log_case(std::string_view what) {
    if (g_note == nullptr) return;
    const std::size_t n = std::min(what.size(), sizeof g_note->text);
    std::memcpy(g_note->text, what.data(), n);
    g_note->length = std::uint32_t(n);
}

std::string echo(const std::string& text) {
    std::string out;
    for (std::size_t start = 0;;) {
        const std::size_t end = text.find('\n', start);
        out += one_line(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
        if (end == std::string::npos) return out;
        out += '\n', start = end + 1;
    }
}

std::string describe_difference(std::span<const float> expected, std::span<const float> got) {
    if (expected.size() != got.size())
        return fmt::format("{} logits where {} were expected", got.size(), expected.size());
    const BitComparison cmp = compare_bits(expected, got);
    if (cmp.equal) return "";
    const std::size_t i = std::size_t(cmp.first);
    std::uint32_t e = 0, g = 0;
    std::memcpy(&e, &expected[i], sizeof e);
    std::memcpy(&g, &got[i], sizeof g);
    return fmt::format("logit {} differs: expected {:.9g} (bits 0x{:08x}), yours {:.9g} (bits 0x{:08x}); {} of {} logits "
                       "differ",
                       i, expected[i], e, got[i], g, cmp.n_differ, expected.size());
}

int grade(const Lab& lab, int argc, char** argv) {
    Options o;
    if (!parse_args(argc, argv, o)) return 2;
    const int cases = o.cases;
    const std::uint64_t seed = o.seed;
    const std::string& report = o.report;
    // A report left by an earlier run must not pass for this one's if this one dies midway.
    if (!report.empty()) std::remove(report.c_str());
    fmt::print("kvlab lab {}: {}\ngrading {} (seed {})\n\n", lab.number, lab.title, lab.source, seed);
    std::size_t w = 5;
    for (const LabCheck& c : lab.checks) w = std::max(w, c.name.size());
    fmt::print("{:<{}}  {:>6}  {:>5}  {}\n", "check", w, "points", "cases", "result");
    int score = 0, total = 0;
    std::vector<std::string> failures;  // each failing check's smallest counterexample
    std::vector<std::string> expected;  // the counterexamples "exists" checks found, as they should
    std::string lines;                  // the report: "<index>\t<result>\t<name>" per check
    for (const LabCheck& c : lab.checks) {
        total += c.points;
        const int n = cases ? cases : c.cases;
        const int limit = std::max(o.time_limit, c.time_limit);
        PropertyOutcome r = o.fork ? run_isolated(c, n, seed, limit) : run_here(c, n, seed);
        // Whatever the student's code put in a message (an exception's text, a value) is shown escaped.
        r.counterexample = echo(r.counterexample);
        // A stub says so on every case; say it plainly instead of as a shrunk case.
        const std::size_t stub = r.counterexample.find("not implemented: ");
        const bool exists = !c.expect_counterexample.empty();
        const bool found = exists && !r.passed && stub == std::string::npos &&
                           r.counterexample.find(c.expect_counterexample) != std::string::npos;
        const bool passed = exists ? found : r.passed;
        const std::string result = passed ? "pass" : stub != std::string::npos ? "not implemented" : "FAIL";
        if (passed) score += c.points;
        fmt::print("{:<{}}  {:>6}  {:>5}  {}\n", c.name, w, passed ? fmt::format("{}/{}", c.points, c.points)
                                                                : fmt::format("0/{}", c.points),
                   r.cases, result);
        lines += fmt::format("{}\t{}\t{}\n", &c - lab.checks.data() + 1, result, c.name);
        if (found) expected.push_back(fmt::format("{}: {}", c.name, r.counterexample));
        if (passed) continue;
        if (stub != std::string::npos)
            failures.push_back(r.counterexample.substr(stub));
        else if (exists && r.passed)
            failures.push_back(fmt::format("{}: no counterexample in {} cases, but there must be one ({})", c.name,
                                           r.cases, c.expect_counterexample));
        else
            failures.push_back(fmt::format("{}: {}", c.name, r.counterexample));
    }
    fmt::print("\nscore {}/{}\n", score, total);
    if (!expected.empty()) fmt::print("\nthe smallest counterexample RapidCheck found, as these checks expect:\n");
    for (const std::string& e : expected) fmt::print("- {}\n", e);
    // A stub fails every check that reaches it the same way: say it once.
    std::vector<std::string> shown;
    for (const std::string& f : failures)
        if (!f.starts_with("not implemented: ") || std::find(shown.begin(), shown.end(), f) == shown.end())
            shown.push_back(f);
    if (!shown.empty()) fmt::print("\nthe smallest failing case RapidCheck found, per failing check:\n");
    for (const std::string& f : shown) fmt::print("- {}\n", f);
    if (!report.empty()) {
        try {
            write_file(report, fmt::format("the report '{}'", one_line(report)), lines);
        } catch (const Error& e) {
            fmt::print(stderr, "grade: error: {}\n", e.what());
            return 2;
        }
    }
    return score == total ? 0 : 1;
}

}  // namespace kvlab::lessons
