// Running the kvlab program from a test: its exit code and both streams, in a scratch folder
// of the test process's own.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

struct Run {
    int exit_code = -1;
    bool signaled = false;
    std::string out, err;
};

// A folder of this process's own, removed when the process ends.
inline fs::path scratch() {
    struct Dir {
        fs::path path = fs::temp_directory_path() / ("kvlab_test_" + std::to_string(::getpid()));
        Dir() { fs::create_directories(path); }
        ~Dir() {
            std::error_code ec;
            fs::remove_all(path, ec);
        }
    };
    static const Dir dir;
    return dir.path;
}

inline std::string slurp(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Runs `kvlab <args>` with a time limit, capturing both streams; `launcher` goes before the
// program ("env -u DISPLAY", "xvfb-run -a").
inline Run run_kvlab(const std::string& args, const std::string& launcher = "") {
    const fs::path out = scratch() / "stdout", err = scratch() / "stderr";
    const std::string cmd = "timeout 300 " + launcher + " " + std::string(KVLAB_BINARY) + " " + args + " >" +
                            out.string() + " 2>" + err.string() + " </dev/null";
    const int status = std::system(cmd.c_str());
    Run r;
    r.signaled = WIFSIGNALED(status);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
}

// A clean refusal: non-zero exit (not a crash, not the 124 of a timeout), and exactly one line
// on stderr that starts "kvlab: error:" and contains `needle`.
inline void check_refused(const std::string& args, const std::string& needle, const std::string& launcher = "") {
    const Run r = run_kvlab(args, launcher);
    INFO("kvlab " << args << "\nexit " << r.exit_code << "\nstderr: " << r.err);
    CHECK(!r.signaled);
    CHECK(r.exit_code != 0);
    CHECK(r.exit_code != 124);
    CHECK(r.exit_code < 128);
    CHECK(r.err.rfind("kvlab: error: ", 0) == 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find(needle) != std::string::npos);
}
