// fuzz_checkpoint: the llama2.c checkpoint loader (core/checkpoint.h) on arbitrary bytes.
//
// Input: the file itself (legacy or ak42 version 1). Seeds: `kvlab export` checkpoints, shared and
// unshared, and the same weights in the ak42 layout (fuzz/make_seeds.cpp).
// Checks: load_checkpoint either throws kvlab::Error or returns a model whose tensors all have
// their shapes; a loaded model saved again (legacy) loads back with the same fingerprint (config
// and every weight's bits, NaN payloads included).
#include <cstdint>

#include "checkpoint.h"
#include "fuzz_util.h"

using namespace kvlab;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static fuzz::MemFile file("checkpoint"), again("checkpoint-again");
    const std::string& path = file.write({reinterpret_cast<const char*>(data), size});
    try {
        const Model m = load_checkpoint(path);
        m.w.check_shapes();
        // The round trip writes the RoPE tables too: skip models whose tables alone are large.
        const Config& c = m.config();
        if (std::int64_t{c.max_seq} * c.head_size() > (std::int64_t{1} << 16)) return 0;
        save_checkpoint(again.path(), m);
        const Model back = load_checkpoint(again.path());
        FUZZ_CHECK(back.w.fingerprint() == m.w.fingerprint(), "a loaded checkpoint saved again loads differently");
        FUZZ_CHECK(back.w.shared_classifier == m.w.shared_classifier, "the classifier flag changed in a round trip");
    } catch (const Error&) {
        // A refusal: one line naming the file (the CLI tests check the wording).
    }
    return 0;
}
