// kvlab fuzz: what the libFuzzer targets share (README "Fuzzing and sanitizers").
//
// Each fuzz_<name>.cpp defines LLVMFuzzerTestOneInput over one of kvlab's entry points for
// untrusted input. The contract every target checks: bad input ends in a kvlab::Error (caught
// here, a normal outcome); anything else is a finding that libFuzzer reports and saves: a crash,
// a sanitizer report, an exception of another type, a hang past -timeout, memory past
// -rss_limit_mb, or a broken property (fuzz_check: __builtin_trap with a message).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "config.h"

namespace kvlab::fuzz {

// The checkpoint whose panel cache fuzz_panel_cache feeds (make_seeds writes its seeds).
inline Config panel_fuzz_shape() { return Config{16, 24, 2, 4, 2, 40, 8}; }
// The random model of fuzz_trace's trace (make_seeds writes its files as seeds).
inline Config trace_fuzz_shape() { return Config{8, 8, 2, 2, 1, 12, 8}; }

// A broken property: print it on stderr (libFuzzer shows it above its report) and crash, so the
// input is saved as a crash file.
#define FUZZ_CHECK(cond, ...)                                            \
    do {                                                                 \
        if (!(cond)) {                                                   \
            std::fprintf(stderr, "fuzz: property broken: " __VA_ARGS__); \
            std::fputc('\n', stderr);                                    \
            __builtin_trap();                                            \
        }                                                                \
    } while (0)

// The loaders read files by path. An in-memory file (memfd) rewritten on every run keeps the disk
// out of the loop; its /proc/self/fd path opens like any regular file.
class MemFile {
public:
    explicit MemFile(const char* name) : fd_(memfd_create(name, 0)) {
        if (fd_ < 0) {
            std::perror("fuzz: memfd_create");
            std::abort();
        }
        path_ = "/proc/self/fd/" + std::to_string(fd_);
    }
    ~MemFile() { close(fd_); }
    MemFile(const MemFile&) = delete;
    MemFile& operator=(const MemFile&) = delete;

    // Replaces the file's contents with `bytes`; returns its path.
    const std::string& write(std::string_view bytes) {
        if (ftruncate(fd_, 0) != 0 || pwrite(fd_, bytes.data(), bytes.size(), 0) != ssize_t(bytes.size())) {
            std::perror("fuzz: writing the memfd");
            std::abort();
        }
        return path_;
    }
    const std::string& path() const { return path_; }

private:
    int fd_;
    std::string path_;
};

// Reads the input front to back: fixed fields first, the rest as one blob. Past the end, fields
// read as zero, so every input, however short, is a valid case.
class Input {
public:
    Input(const std::uint8_t* data, std::size_t size) : p_(data), end_(data + size) {}
    std::uint8_t u8() { return p_ < end_ ? *p_++ : 0; }
    std::uint16_t u16() { return std::uint16_t(u8() | (u8() << 8)); }
    std::uint32_t u32() { return std::uint32_t(u16()) | (std::uint32_t(u16()) << 16); }
    // `n` bytes or what is left, as text.
    std::string_view bytes(std::size_t n) {
        const std::size_t k = std::min<std::size_t>(n, std::size_t(end_ - p_));
        std::string_view out(reinterpret_cast<const char*>(p_), k);
        p_ += k;
        return out;
    }
    std::string_view rest() { return bytes(std::size_t(end_ - p_)); }

private:
    const std::uint8_t* p_;
    const std::uint8_t* end_;
};

// Send stdout (the commands' tables) to /dev/null: millions of runs of output help nobody, and
// libFuzzer reports on stderr.
inline void silence_stdout() {
    std::fflush(stdout);
    if (std::freopen("/dev/null", "w", stdout) == nullptr) std::abort();
}

}  // namespace kvlab::fuzz
