// fuzz_options: kvlab's own parsers of option values, and `kvlab memory` on fuzzed options.
//
// Input: u8 which parser, then its text:
//   0 shape     Config::parse over stories260K's shape, then validate (what --shape runs)
//   1 int       parse_int                2 int list  parse_int_list (--tokens, --lengths)
//   3 variant   parse_variant (--variant) 4 devices  parse_devices (--device)
//   5 precision parse_precision and find_shape (kvlab memory's --precision and --model)
//   6 memory    run_memory: u32 context, u32 batch, u32 block size, u16 requests, u8 seed,
//               u8 model (one of "all" and the published shapes), u8 precision, then --lengths
// Seeds: fuzz/make_seeds.cpp; dictionary: fuzz/shape.dict.
// Checks: each parser returns or throws kvlab::Error, whose message is one line with no control
// character (the CLI prints it as is); a shape that validates has a parameter count inside
// kMaxElements and describes itself as a shape that parses back to itself.
#include <cstdint>

#include "cache_factory.h"
#include "device.h"
#include "fuzz_util.h"
#include "memory.h"
#include "memory_model.h"

using namespace kvlab;

namespace {

void check_message(const Error& e) {
    for (const char* p = e.what(); *p; p++) {
        const auto b = static_cast<unsigned char>(*p);
        FUZZ_CHECK(b >= 0x20 && b != 0x7f, "an error message has control byte 0x%02x: %s", b, e.what());
    }
}

void shape(const std::string& text) {
    const Config c = Config::parse(text, stories260k_shape());
    c.validate();
    FUZZ_CHECK(c.n_params(false) <= kMaxElements, "a validated shape has %lld parameters",
               static_cast<long long>(c.n_params(false)));
    // describe() is "dim=64 hidden_dim=172 ...": the same fields as a --shape list.
    std::string spec = c.describe();
    for (char& ch : spec)
        if (ch == ' ') ch = ',';
    FUZZ_CHECK(Config::parse(spec, Config{}) == c, "describe() does not parse back: %s", spec.c_str());
}

void memory(fuzz::Input& in) {
    cli::MemoryOptions o;
    // The ranges `kvlab memory` lets through (cli/memory.cpp, add_memory_options); requests capped
    // lower so that one run stays fast.
    o.context = 1 + int(in.u32() % (1u << 24));
    o.batch = 1 + int(in.u32() % (1u << 20));
    o.block_size = 1 + int(in.u32() % (1u << 20));
    o.requests = 1 + in.u16() % 2048;
    o.seed = in.u8();
    const auto& shapes = published_shapes();
    const std::size_t m = in.u8() % (shapes.size() + 1);
    o.model = m == 0 ? "all" : shapes[m - 1].name;
    const auto& precs = precisions();
    const std::size_t p = in.u8() % (precs.size() + 1);
    o.precision = p == 0 ? "all" : precs[p - 1].name;
    o.lengths = std::string(in.rest());
    (void)cli::run_memory(o);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    fuzz::silence_stdout();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Input in(data, size);
    const int which = in.u8() % 7;
    try {
        if (which == 6) return memory(in), 0;
        const std::string text(in.rest());
        switch (which) {
            case 0: shape(text); break;
            case 1: (void)parse_int("--option", text); break;
            case 2: (void)parse_int_list("--option", text); break;
            case 3: (void)parse_variant(text); break;
            case 4: (void)parse_devices(text); break;
            case 5: (void)parse_precision(text), (void)find_shape(text); break;
        }
    } catch (const Error& e) {
        check_message(e);
    }
    return 0;
}
