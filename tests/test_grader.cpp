// The lab grader (lessons/common/grader.h) survives the student's code: generated labs whose
// checks pass, fail, crash (a segmentation fault, an abort), hang, exit or throw something odd
// always print the whole table, score exactly the passing checks, fail every other one naming
// how and the case it logged last, and exit 0 only when everything passed.
#include <rapidcheck/catch.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdlib>
#include <string>
#include <vector>

#include "grader.h"
#include "test_util.h"

using namespace kvlab;

namespace {

enum class Behavior { pass, fail, segv, abort, hang, exit, odd_throw };
const char* const kBehaviorNames[] = {"pass", "fail", "segv", "abort", "hang", "exit", "odd_throw"};

// A check that behaves so on its third case (the first two pass, so shrinking has work to do).
lessons::LabCheck make_check(int index, Behavior b, int points) {
    const std::string name = fmt::format("check {} ({})", index, kBehaviorNames[int(b)]);
    return {name, points,
            [b, index] {
                const int x = draw(0, 1000);
                lessons::log_case(fmt::format("case x = {} of check {}", x, index));
                static thread_local int calls = 0;
                if (++calls < 3 || b == Behavior::pass) return;
                switch (b) {
                    case Behavior::fail: fail(fmt::format("x = {} is wrong", x));
                    case Behavior::segv: std::raise(SIGSEGV); break;
                    case Behavior::abort: std::abort();
                    case Behavior::hang:
                        for (volatile bool spin = true; spin;) {
                        }
                        break;
                    case Behavior::exit: std::exit(3);
                    case Behavior::odd_throw: throw 42;
                    case Behavior::pass: break;
                }
            },
            20};
}

struct Graded {
    int status = -1;
    bool signaled = false;
    std::string out;
};

// grade() in a child process of its own, its standard output captured.
Graded run_grade(const lessons::Lab& lab, std::vector<std::string> args) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(fds[0]);
        ::dup2(fds[1], STDOUT_FILENO);
        std::vector<char*> argv{const_cast<char*>("grader")};
        for (std::string& a : args) argv.push_back(a.data());
        const int status = lessons::grade(lab, int(argv.size()), argv.data());
        std::fflush(nullptr);
        ::_exit(status);
    }
    ::close(fds[1]);
    Graded g;
    char buf[4096];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) g.out.append(buf, std::size_t(n));
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    g.signaled = WIFSIGNALED(status);
    g.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return g;
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

}  // namespace

TEST_CASE("lab grader: checks that crash, hang, exit or throw fail alone and the table stays whole",
          "[lessons][grader]") {
    test::check_cases(8, [] {
        const int n = *rc::gen::inRange(1, 6);
        lessons::Lab lab{99, "a generated lab", "generated", {}};
        std::vector<Behavior> behaviors;
        int want_score = 0, total = 0, hangs = 0;
        for (int i = 0; i < n; i++) {
            Behavior b = Behavior(*rc::gen::inRange(0, 7));
            if (b == Behavior::hang && hangs++ > 0) b = Behavior::fail;  // one hang a lab: each costs the limit
            const int points = *rc::gen::inRange(1, 4);
            behaviors.push_back(b);
            lab.checks.push_back(make_check(i + 1, b, points));
            total += points, want_score += b == Behavior::pass ? points : 0;
        }
        const Graded g = run_grade(lab, {"--time-limit", "1"});
        RC_LOG() << g.out;
        RC_ASSERT(!g.signaled);
        RC_ASSERT(g.status == (want_score == total ? 0 : 1));
        RC_ASSERT(g.out.find(fmt::format("\nscore {}/{}\n", want_score, total)) != std::string::npos);
        for (int i = 0; i < n; i++) {
            const std::string name = fmt::format("check {} ({})", i + 1, kBehaviorNames[int(behaviors[i])]);
            const std::size_t row = g.out.find("\n" + name + "  ");
            RC_ASSERT(row != std::string::npos);
            const std::string line = g.out.substr(row + 1, g.out.find('\n', row + 1) - row - 1);
            RC_ASSERT(line.ends_with(behaviors[i] == Behavior::pass ? "pass" : "FAIL"));
            // A crash, a hang or an exit: the failure names how, and the case that was running.
            if (behaviors[i] == Behavior::pass || behaviors[i] == Behavior::fail || behaviors[i] == Behavior::odd_throw)
                continue;
            const std::size_t why = g.out.find("\n- " + name + ": ");
            RC_ASSERT(why != std::string::npos);
            const std::string text = g.out.substr(why, g.out.find('\n', why + 1) - why);
            RC_ASSERT(text.find(fmt::format("of check {}", i + 1)) != std::string::npos);
            // exit() in the middle of a check runs the process's static destructors under a live
            // property, which may abort ("pure virtual method called") before the status 3 is out;
            // under ASan a raised SIGSEGV goes through its report (and may outlast the time limit).
            const bool exited = text.find("ended with exit status 3") != std::string::npos ||
                                text.find("crashed the check with SIGABRT") != std::string::npos;
            RC_ASSERT(behaviors[i] != Behavior::exit || exited);
            const char* how = behaviors[i] == Behavior::hang    ? "no answer in 1 s"
                              : behaviors[i] == Behavior::segv  ? (kSanitized ? "" : "SIGSEGV")
                              : behaviors[i] == Behavior::abort ? "SIGABRT"
                                                                : "";
            RC_ASSERT(text.find(how) != std::string::npos);
        }
    });
}

TEST_CASE("lab grader: bad arguments are one line and status 2", "[lessons][grader][errors]") {
    lessons::Lab lab{99, "a generated lab", "generated", {make_check(1, Behavior::pass, 1)}};
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"--time-limit", "0"}, {"--time-limit", "x"}, {"--cases", "0"}, {"--bogus"}}) {
        const Graded g = run_grade(lab, args);
        CHECK(g.status == 2);
        CHECK(g.out.find("score") == std::string::npos);
    }
    CHECK(run_grade(lab, {"--no-fork"}).status == 0);
}
