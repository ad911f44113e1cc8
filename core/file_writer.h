// kvlab core: writing a file whole or not at all (checkpoints, KV traces, golden vectors).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace kvlab {

// Writes the bytes to a temporary file beside `path` and renames it into place, so a reader (or a
// model mapped from the old file) never sees a half-written file. A symbolic link, or a path that
// exists and is not a regular file (/dev/null, /dev/stdout), is written directly. Errors are one
// line starting with `what` ("checkpoint 'model.bin'"); a writer destroyed before close() removes
// its temporary file.
class FileWriter {
public:
    FileWriter(const std::string& path, std::string what);
    ~FileWriter();
    FileWriter(const FileWriter&) = delete;
    FileWriter& operator=(const FileWriter&) = delete;
    void bytes(const void* src, std::int64_t n);
    void close();

private:
    std::string path_, what_, target_;
    std::ofstream out_;
    bool direct_ = false, done_ = false;
};

}  // namespace kvlab
