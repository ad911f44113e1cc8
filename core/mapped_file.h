// kvlab core: a file mapped into memory, for checkpoints and the CPU's panel cache. Kernels read
// weights where the page cache already holds them: no copy at start-up, and one resident copy
// however many processes run the same model.
#pragma once

#include <cstdint>
#include <string>

namespace kvlab {

// What stat says of a file: enough to notice that it changed (the panel cache's fast check).
struct FileStamp {
    std::uint64_t size = 0, mtime_ns = 0, device = 0, inode = 0;
    bool operator==(const FileStamp&) const = default;
};

// A regular file mapped privately: reads see the file, writes (tests that perturb a weight) go to
// this process's own copy of the page and never reach the file.
class MappedFile {
public:
    // Throws Error("<what> '<path>': ...") when the path is missing, not a regular file, or cannot be mapped.
    MappedFile(const std::string& path, const std::string& what);
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    ~MappedFile();

    const std::string& path() const { return path_; }
    unsigned char* data() const { return data_; }
    std::int64_t size() const { return size_; }
    const FileStamp& stamp() const { return stamp_; }
    // Asks the kernel to read the whole file ahead (a hint; nothing waits for it).
    void will_need() const;

private:
    std::string path_;
    unsigned char* data_ = nullptr;
    std::int64_t size_ = 0;
    FileStamp stamp_;
};

// stat of `path` into out; false when it cannot be read.
bool file_stamp(const std::string& path, FileStamp& out);

// A 64-bit checksum of n bytes: four independent multiply-xorshift lanes over 8-byte words, so
// it runs at memory speed (a checkpoint's identity for the panel cache, not a cryptographic hash).
std::uint64_t checksum64(const unsigned char* p, std::int64_t n);

}  // namespace kvlab
