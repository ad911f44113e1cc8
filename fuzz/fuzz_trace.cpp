// fuzz_trace: the KV trace reader and diff-trace (cli/trace.h) on arbitrary bytes.
//
// Input: one byte choosing a file of a small valid trace (manifest.json, tokens.npy, logits.npy,
// k.npy, v.npy), then that file's new bytes. Seeds: the valid files themselves (make_seeds.cpp).
// Checks: reading the changed trace ends in a kvlab::Error or a trace whose every array matches
// its manifest (dtype, shape, SHA-256) and the model's shape; diff-trace against the original
// never crashes, and finds nothing when the bytes did not change.
#include <cstdint>
#include <filesystem>
#include <string>

#include "fuzz_util.h"
#include "npy.h"
#include "trace.h"

using namespace kvlab;

namespace {

const char* const kFiles[] = {"manifest.json", "tokens.npy", "logits.npy", "k.npy", "v.npy"};

struct Base {
    std::string dir;
    cli::Trace trace;
    Base() {
        char tmpl[] = "/tmp/kvlab_fuzz_trace_XXXXXX";
        dir = ::mkdtemp(tmpl);
        cli::TraceRun run;
        run.random = true;
        run.shape = fuzz::trace_fuzz_shape();
        run.seed = 3;
        run.tokens = "1,2,3";
        run.steps = 2;
        cli::record_trace(run, dir);
        trace = cli::read_trace(dir);
    }
    ~Base() { std::filesystem::remove_all(dir); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const Base base;
    if (size == 0) return 0;
    const std::string which = kFiles[data[0] % 5];
    const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
    const auto read = [&](const std::string& file) {
        return file == which ? bytes : read_file_bytes(base.dir + "/" + file, std::int64_t(1) << 30);
    };
    bool same = false;
    try {
        same = read(which) == bytes && bytes == read_file_bytes(base.dir + "/" + which, std::int64_t(1) << 30);
        const cli::Trace t = cli::parse_trace(read("manifest.json"), read, "fuzzed trace");
        const cli::TraceDiff d = cli::diff_traces(base.trace, t);
        FUZZ_CHECK(!same || d.equal, "fuzz_trace: an unchanged trace differs from itself");
    } catch (const Error&) {
        FUZZ_CHECK(!same, "fuzz_trace: an unchanged trace does not read");
    }
    return 0;
}
