#include "mapped_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "config.h"
#include "model.h"

namespace kvlab {

namespace {

FileStamp stamp_of(const struct stat& st) {
    return FileStamp{std::uint64_t(st.st_size),
                     std::uint64_t(st.st_mtim.tv_sec) * 1000000000ull + std::uint64_t(st.st_mtim.tv_nsec),
                     std::uint64_t(st.st_dev), std::uint64_t(st.st_ino)};
}

}  // namespace

bool file_stamp(const std::string& path, FileStamp& out) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return false;
    out = stamp_of(st);
    return true;
}

MappedFile::MappedFile(const std::string& path, const std::string& what) : path_(path) {
    auto fail = [&](std::string_view problem) {
        return Error(fmt::format("{} '{}': {}", what, one_line(path), problem));
    };
    // Looked at before opening: opening a FIFO would block.
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        throw fail(errno == ENOENT ? "file not found" : fmt::format("cannot read: {}", std::strerror(errno)));
    if (!S_ISREG(st.st_mode)) throw fail("not a regular file");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw fail(fmt::format("cannot open: {}", std::strerror(errno)));
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw fail("not a regular file");
    }
    stamp_ = stamp_of(st);
    size_ = std::int64_t(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, std::size_t(size_), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        const int err = errno;
        ::close(fd);
        if (p == MAP_FAILED) throw fail(fmt::format("cannot map: {}", std::strerror(err)));
        data_ = static_cast<unsigned char*>(p);
    } else {
        ::close(fd);
    }
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(data_, std::size_t(size_));
}

void MappedFile::will_need() const {
    if (data_) (void)::madvise(data_, std::size_t(size_), MADV_WILLNEED);
}

std::uint64_t checksum64(const unsigned char* p, std::int64_t n) {
    constexpr std::uint64_t kMul = 0x9e3779b97f4a7c15ull;
    std::uint64_t h[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull};
    auto mix = [](std::uint64_t x, std::uint64_t w) {
        x = (x ^ w) * kMul;
        return x ^ (x >> 29);
    };
    std::int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 4; j++) {
            std::uint64_t w;
            std::memcpy(&w, p + i + 8 * j, 8);
            h[j] = mix(h[j], w);
        }
    std::uint64_t out = std::uint64_t(n);
    for (; i < n; i++) out = mix(out, p[i]);  // the last n % 32 bytes
    for (std::uint64_t x : h) out = splitmix64_finalize(out ^ x);
    return out;
}

}  // namespace kvlab
