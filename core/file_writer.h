// kvlab core: writing a file whole or not at all (checkpoints, KV traces, golden vectors, pictures).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace kvlab {

// Where an output path's bytes go. kvlab's policy for every file it writes (README "Bad input"):
//  - a regular file, new or existing, is written to a temporary file in the same folder and renamed
//    into place, so no reader ever sees a half-written file;
//  - a symbolic link is followed to its end, and that file is replaced the same way (the link stays);
//  - /dev/null, /dev/stdout, /dev/stderr and /dev/fd/N are written in place, on purpose;
//  - a folder, a FIFO, a socket or any other device is refused, as is a folder that is missing or
//    cannot take new files.
struct OutputTarget {
    std::string path;     // the file the bytes end up in
    bool direct = false;  // written in place rather than through a temporary file
};

// The target of `path`, or an Error (one line starting with `what`) for what the policy refuses.
// Commands call it before their work, so that a bad path is refused before minutes are spent.
OutputTarget output_target(const std::string& path, const std::string& what);

// Whether path names standard output (/dev/stdout, /dev/fd/1, /proc/self/fd/1): a command that
// writes its file there prints its own notes on stderr, not into the file's bytes.
bool names_standard_output(const std::string& path);

// Writes the bytes to output_target(path) whole or not at all. Errors are one line starting with
// `what` ("checkpoint 'model.bin'"); a writer destroyed before close() removes its temporary file,
// and so does SIGINT, SIGTERM or SIGHUP (see remove_temporaries_on_signal).
class FileWriter {
public:
    FileWriter(const std::string& path, std::string what);
    ~FileWriter();
    FileWriter(const FileWriter&) = delete;
    FileWriter& operator=(const FileWriter&) = delete;
    void bytes(const void* src, std::int64_t n);
    void close();

private:
    OutputTarget target_;
    std::string what_, temp_;
    std::ofstream out_;
    int slot_ = -1;  // this writer's entry in the table of temporaries a signal removes
    bool done_ = false;
};

// The whole of `bytes` to `path` through a FileWriter.
void write_file(const std::string& path, const std::string& what, std::string_view bytes);

// Installs handlers for SIGINT, SIGTERM and SIGHUP that remove the temporary files of unfinished
// writers, then end the process as the signal would have: an interrupted command leaves neither a
// partial output nor a stray temporary. Call once, early in main.
void remove_temporaries_on_signal();

}  // namespace kvlab
