// kvlab lessons: the autograder every lab shares.
//
// A lab's grader is a list of checks, each a RapidCheck property over generated inputs (shapes,
// tokens, block sizes) worth some points. grade() runs them in order and prints a score table;
// a failing check prints RapidCheck's shrunk counterexample in the words its property chose
// ("step 3, logit 17 differs: ..."). The exit status is 0 when every check passes, 1 when one
// fails, 2 for bad arguments.
//
// The student's code may crash or hang, so each check runs in a child process of its own: a
// signal (a segmentation fault, an abort) or a case that gives no answer within the time limit
// fails that check, naming the signal and the case the check logged last (log_case), and the
// other checks still run. A grader also checks every index, size or count the student's code
// returns before it uses one, so a bad one fails the check in words, with a shrunk case.
//
//   build/lessons/lab03                  grades your code (lessons/03-cache/starter/)
//   build/lessons/lab03 --cases 1000     more generated cases per check
//   build/lessons/lab03 --report FILE    also writes each check's result to FILE, one line per check,
//                                        "<index>\t<pass|FAIL|not implemented>\t<name>" (for
//                                        lessons/coverage.sh: which checks each wrong solution fails)
//   build/lessons/lab03 --time-limit S   seconds one generated case may take (default 10)
//   build/lessons/lab03 --no-fork        run the checks in the grader's own process (a debugger)
//   lessons/grade 3                      builds, then grades (the command the labs name)
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "property.h"

namespace kvlab::lessons {

// The implementation this grader binary was linked with (lessons/CMakeLists.txt generates both
// per binary): the file named to the student, and the file compiled (a wrong/*.sed's output).
const char* lab_source();
const char* lab_file();
#define LAB_SOURCE ::kvlab::lessons::lab_source()
#define LAB_FILE ::kvlab::lessons::lab_file()

// What a starter's stubs throw: never a silently wrong result.
struct NotImplemented : Error {
    explicit NotImplemented(std::string_view what)
        : Error(fmt::format("not implemented: {} (the TODO in your lab file)", what)) {}
};

struct LabCheck {
    std::string name;                // what it checks, in a student's words
    int points = 1;
    std::function<void()> property;  // draws its inputs (kvlab::draw), fails with kvlab::fail
    int cases = 100;                 // generated cases (scaled by --cases)
    // Non-empty: an "exists" check. It passes when RapidCheck finds a counterexample whose message
    // says this phrase (an approximate cache that must differ somewhere, say); the grader prints
    // that shrunk counterexample. Finding none, or another failure, fails the check.
    std::string expect_counterexample = "";
    // Seconds one case may take, when more than the grader's --time-limit (a case that compiles
    // the student's file, say); 0: the grader's.
    int time_limit = 0;
};

struct Lab {
    int number = 0;
    std::string title;
    std::string source;  // the implementation this grader was built with, e.g. "starter/cache_lab.cpp"
    std::vector<LabCheck> checks;
};

// Runs the lab's checks; argv takes --cases N (per check, instead of each check's own), --seed S,
// --report FILE, --time-limit S and --no-fork. Returns the exit status.
int grade(const Lab& lab, int argc, char** argv);

// Inside a check, before it calls the student's code: the case about to run, in a student's words
// ("translate(table [3, 1], t 5, block_size 4, block_stride 96)"). When the code crashes or hangs,
// the check's line names the case logged last. Keeps the first 3000 bytes.
void log_case(std::string_view what);

// Text from a student's program (an exception's message, a counterexample quoting it) made safe to
// print: each line through one_line (controls and bytes that are not UTF-8 escaped), the line
// breaks kept.
std::string echo(const std::string& text);

// For properties: the first index where two logit vectors differ, in a student's words
// ("logit 17 differs: 0.5 (0x3f000000) vs 0.25 (0x3e800000)"), or "" when bitwise equal.
std::string describe_difference(std::span<const float> expected, std::span<const float> got);

}  // namespace kvlab::lessons
