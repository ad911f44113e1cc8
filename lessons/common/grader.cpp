#include "grader.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>

#include "compare.h"
#include "file_writer.h"

namespace kvlab::lessons {

namespace {

// --cases N / --seed S / --report FILE; anything else is a one-line error.
bool parse_args(int argc, char** argv, int& cases, std::uint64_t& seed, std::string& report) {
    for (int i = 1; i < argc; i++) {
        const std::string_view a = argv[i];
        if (a == "--report" && i + 1 < argc) {
            report = argv[++i];
        } else if ((a == "--cases" || a == "--seed") && i + 1 < argc) {
            const std::string_view v = argv[++i];
            std::uint64_t x = 0;
            const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
            if (ec != std::errc() || end != v.data() + v.size() || (a == "--cases" && (x < 1 || x > 1000000))) {
                fmt::print(stderr, "grade: error: {} wants a positive number, not '{}'\n", argv[i - 1],
                           one_line(argv[i]));
                return false;
            }
            (a == "--cases" ? void(cases = int(x)) : void(seed = x));
        } else {
            fmt::print(stderr, "grade: error: unknown argument '{}' (--cases N, --seed S, --report FILE)\n",
                       one_line(argv[i]));
            return false;
        }
    }
    return true;
}

}  // namespace

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
    int cases = 0;  // 0: each check's own
    std::uint64_t seed = 1;
    std::string report;  // "": none
    if (!parse_args(argc, argv, cases, seed, report)) return 2;
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
        PropertyOutcome r;
        try {
            r = check_property(c.property, cases ? cases : c.cases, seed);
        } catch (const std::exception& e) {  // a property that fails outside RapidCheck's case
            r.counterexample = e.what();
        }
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
