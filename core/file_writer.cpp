#include "file_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "config.h"

namespace kvlab {

FileWriter::FileWriter(const std::string& path, std::string what) : path_(path), what_(std::move(what)) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec), link = fs::symlink_status(path, ec);
    if (fs::is_directory(st)) throw Error(fmt::format("{}: cannot open for writing: is a directory", what_));
    // A link is written through (a rename would replace the link itself), as is a special file.
    direct_ = fs::is_symlink(link) || (fs::exists(st) && !fs::is_regular_file(st));
    target_ = direct_ ? path : fmt::format("{}.tmp-{}", path, ::getpid());
    out_.open(target_, std::ios::binary | std::ios::trunc);
    if (!out_) throw Error(fmt::format("{}: cannot open for writing: {}", what_, std::strerror(errno)));
}

FileWriter::~FileWriter() {
    if (!direct_ && !done_) {
        std::error_code ec;
        std::filesystem::remove(target_, ec);
    }
}

void FileWriter::bytes(const void* src, std::int64_t n) {
    out_.write(static_cast<const char*>(src), n);
    if (!out_) throw Error(fmt::format("{}: write failed: {}", what_, std::strerror(errno)));
}

void FileWriter::close() {
    out_.close();
    if (!out_) throw Error(fmt::format("{}: write failed on close: {}", what_, std::strerror(errno)));
    if (!direct_) {
        std::error_code ec;
        std::filesystem::rename(target_, path_, ec);
        if (ec) throw Error(fmt::format("{}: cannot rename the finished file into place: {}", what_, ec.message()));
    }
    done_ = true;
}

}  // namespace kvlab
