#include "file_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <regex>

#include "config.h"

namespace kvlab {

namespace fs = std::filesystem;

namespace {

// The temporaries being written, for a signal handler to remove: a fixed table, since a handler may
// neither allocate nor lock. A slot's state goes 0 (free) -> 1 (claimed, path being copied) -> 2
// (ready) and back to 0; a writer that finds no slot (more than kSlots at once) still works, only
// without removal on a signal.
constexpr int kSlots = 16;
constexpr std::size_t kPathBytes = 4096;
std::array<std::array<char, kPathBytes>, kSlots> g_temp_paths{};
std::array<std::atomic<int>, kSlots> g_temp_state{};
std::atomic<unsigned> g_temp_counter{0};

int register_temp(const std::string& path) {
    if (path.size() >= kPathBytes) return -1;
    for (int i = 0; i < kSlots; i++) {
        int expected = 0;
        if (!g_temp_state[std::size_t(i)].compare_exchange_strong(expected, 1)) continue;
        std::memcpy(g_temp_paths[std::size_t(i)].data(), path.c_str(), path.size() + 1);
        g_temp_state[std::size_t(i)].store(2);
        return i;
    }
    return -1;
}

void unregister_temp(int slot) {
    if (slot >= 0) g_temp_state[std::size_t(slot)].store(0);
}

extern "C" void remove_temporaries_and_reraise(int sig) {
    for (int i = 0; i < kSlots; i++)
        if (g_temp_state[std::size_t(i)].load() == 2) ::unlink(g_temp_paths[std::size_t(i)].data());
    std::signal(sig, SIG_DFL);
    ::raise(sig);
}

// The end of a chain of symbolic links (at most 40, as the kernel allows), without requiring that
// the last one exist: a dangling link names the file to create.
fs::path follow_links(fs::path p, const std::string& what) {
    std::error_code ec;
    for (int hops = 0; fs::is_symlink(fs::symlink_status(p, ec)); hops++) {
        if (hops == 40) throw Error(fmt::format("{}: too many levels of symbolic links", what));
        const fs::path to = fs::read_symlink(p, ec);
        if (ec) throw Error(fmt::format("{}: cannot read the symbolic link: {}", what, ec.message()));
        p = to.is_absolute() ? to : p.parent_path() / to;
    }
    return p;
}

// /dev/null, /dev/stdout, /dev/stderr, /dev/fd/N and /proc/self/fd/N: written in place, whatever
// they stand for (a terminal, a pipe, a file the shell opened).
bool written_in_place(const std::string& path) {
    static const std::regex names(R"(/dev/(null|stdout|stderr|fd/[0-9]+)|/proc/self/fd/[0-9]+)");
    std::error_code ec;
    const fs::path resolved = fs::weakly_canonical(path, ec);
    return std::regex_match(fs::path(path).lexically_normal().string(), names) || (!ec && resolved == "/dev/null");
}

const char* kind_of(const fs::file_status& st) {
    switch (st.type()) {
        case fs::file_type::directory: return "a folder";
        case fs::file_type::fifo: return "a FIFO";
        case fs::file_type::socket: return "a socket";
        case fs::file_type::block: return "a block device";
        case fs::file_type::character: return "a character device";
        default: return "not a regular file";
    }
}

}  // namespace

bool names_standard_output(const std::string& path) {
    const std::string p = fs::path(path).lexically_normal().string();
    return p == "/dev/stdout" || p == "/dev/fd/1" || p == "/proc/self/fd/1";
}

OutputTarget output_target(const std::string& path, const std::string& what) {
    if (path.empty()) throw Error(fmt::format("{}: the path is empty", what));
    if (written_in_place(path)) return {path, true};
    const fs::path file = follow_links(path, what);
    std::error_code ec;
    const fs::file_status st = fs::status(file, ec);
    if (fs::exists(st) && !fs::is_regular_file(st))
        throw Error(fmt::format("{}: is {}; kvlab writes regular files, /dev/null, /dev/stdout and /dev/stderr", what,
                                kind_of(st)));
    const fs::path folder = file.parent_path().empty() ? fs::path(".") : file.parent_path();
    if (!fs::is_directory(folder, ec))
        throw Error(fmt::format("{}: the folder '{}' does not exist", what, one_line(folder.string())));
    // The bytes go to a temporary file beside the target, then are renamed: the folder must take new files.
    if (::access(folder.c_str(), W_OK | X_OK) != 0)
        throw Error(fmt::format("{}: cannot write into the folder '{}': {}", what, one_line(folder.string()),
                                std::strerror(errno)));
    return {file.string(), false};
}

FileWriter::FileWriter(const std::string& path, std::string what)
    : target_(output_target(path, what)), what_(std::move(what)) {
    const std::string opened = target_.direct
                                   ? target_.path
                                   : fmt::format("{}.tmp-{}-{}", target_.path, ::getpid(), g_temp_counter.fetch_add(1));
    if (!target_.direct) temp_ = opened, slot_ = register_temp(temp_);
    out_.open(opened, std::ios::binary | std::ios::trunc);
    if (!out_) {
        const std::string why = std::strerror(errno);
        unregister_temp(slot_);
        throw Error(fmt::format("{}: cannot open for writing: {}", what_, why));
    }
}

FileWriter::~FileWriter() {
    if (!target_.direct && !done_) {
        out_.close();
        std::error_code ec;
        fs::remove(temp_, ec);
    }
    unregister_temp(slot_);
}

void FileWriter::bytes(const void* src, std::int64_t n) {
    out_.write(static_cast<const char*>(src), n);
    if (!out_) throw Error(fmt::format("{}: write failed: {}", what_, std::strerror(errno)));
}

void FileWriter::close() {
    out_.close();
    if (!out_) throw Error(fmt::format("{}: write failed on close: {}", what_, std::strerror(errno)));
    if (!target_.direct) {
        std::error_code ec;
        fs::rename(temp_, target_.path, ec);
        if (ec) throw Error(fmt::format("{}: cannot rename the finished file into place: {}", what_, ec.message()));
    }
    done_ = true;
}

void write_file(const std::string& path, const std::string& what, std::string_view bytes) {
    FileWriter out(path, what);
    out.bytes(bytes.data(), std::int64_t(bytes.size()));
    out.close();
}

void remove_temporaries_on_signal() {
    struct sigaction action {};
    action.sa_handler = remove_temporaries_and_reraise;
    sigemptyset(&action.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &action, nullptr);
}

}  // namespace kvlab
