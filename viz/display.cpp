#include "display.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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

}  // namespace

VirtualDisplay::VirtualDisplay(int width, int height) {
    if (!on_path("Xvfb"))
        throw Error("--headless needs a display or Xvfb: install xvfb (apt-get install xvfb), or run under xvfb-run");
    // Xvfb picks a free display number and writes it to the pipe (-displayfd): no races.
    int fds[2];
    if (pipe(fds) != 0) throw Error("cannot start Xvfb: pipe failed");
    const std::string screen = fmt::format("{}x{}x24", width, height), fd = std::to_string(fds[1]);
    pid_ = fork();
    if (pid_ < 0) throw Error("cannot start Xvfb: fork failed");
    if (pid_ == 0) {
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
    // Ten seconds is far more than Xvfb needs; a hung start must not hang kvlab.
    while (poll(&p, 1, 10000) > 0 && read(fds[0], &ch, 1) == 1 && ch != '\n') number += ch;
    close(fds[0]);
    if (number.empty()) {
        kill(pid_, SIGTERM);
        waitpid(pid_, nullptr, 0);
        throw Error("Xvfb did not start (try: xvfb-run -a kvlab view ...)");
    }
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
