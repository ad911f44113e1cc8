#include "display.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "config.h"

namespace kvlab::viz {

bool have_display() {
    const char* d = std::getenv("DISPLAY");
    return d && *d;
}

namespace {

bool on_path(const std::string& program) {
    const char* path = std::getenv("PATH");
    if (!path) return false;
    std::string dirs = path;
    std::size_t start = 0;
    while (start <= dirs.size()) {
        const std::size_t end = std::min(dirs.find(':', start), dirs.size());
        const std::filesystem::path p = std::filesystem::path(dirs.substr(start, end - start)) / program;
        if (access(p.c_str(), X_OK) == 0) return true;
        start = end + 1;
    }
    return false;
}

// Starts one Xvfb and reads the display number it picked (-displayfd: no races on the number).
// Returns "" if it exited or did not answer within `wait_ms`; it is then stopped and reaped.
std::string start_xvfb(int width, int height, int wait_ms, int& pid) {
    int fds[2];
    if (pipe(fds) != 0) throw Error("cannot start Xvfb: pipe failed");
    const std::string screen = fmt::format("{}x{}x24", width, height), fd = std::to_string(fds[1]);
    pid = fork();
    if (pid < 0) {
        close(fds[0]), close(fds[1]);
        throw Error("cannot start Xvfb: fork failed");
    }
    if (pid == 0) {
        close(fds[0]);
        const int null = open("/dev/null", O_WRONLY);
        dup2(null, 1), dup2(null, 2);
        execlp("Xvfb", "Xvfb", "-displayfd", fd.c_str(), "-screen", "0", screen.c_str(), "-nolisten", "tcp",
               static_cast<char*>(nullptr));
        _exit(127);
    }
    close(fds[1]);
    std::string number;
    pollfd p{fds[0], POLLIN, 0};
    char ch;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    for (;;) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0 || poll(&p, 1, int(left.count())) <= 0) break;
        if (read(fds[0], &ch, 1) != 1 || ch == '\n') break;
        number += ch;
    }
    close(fds[0]);
    if (number.empty()) {
        kill(pid, SIGTERM);
        waitpid(pid, nullptr, 0);
        pid = -1;
    }
    return number;
}

}  // namespace

VirtualDisplay::VirtualDisplay(int width, int height) {
    if (!on_path("Xvfb"))
        throw Error("--headless needs a display or Xvfb: install xvfb (apt-get install xvfb), or run under xvfb-run");
    // On a loaded machine (a parallel test run under sanitizers) Xvfb has been seen to take more
    // than ten seconds to answer, or to lose a race for a display number with another Xvfb: so
    // wait long, and try again before giving up. A hung start still cannot hang kvlab.
    std::string number;
    for (int attempt = 0; attempt < 3 && number.empty(); attempt++) number = start_xvfb(width, height, 40000, pid_);
    if (number.empty()) throw Error("Xvfb did not start (try: xvfb-run -a kvlab view ...)");
    name_ = ":" + number;
    setenv("DISPLAY", name_.c_str(), 1);
}

VirtualDisplay::~VirtualDisplay() {
    if (pid_ > 0) {
        kill(pid_, SIGTERM);
        waitpid(pid_, nullptr, 0);
    }
}

}  // namespace kvlab::viz
