// kvlab proofs: the verification suite, one property per cache variant (library kvlab_verify).
//
// Each check generates small models, token sequences and variant parameters with RapidCheck,
// decodes them with a cached decoder on the variant, and compares the logits at every step
// with naive decode, bit for bit. A failure is shrunk to the smallest case RapidCheck finds and
// described in one line. The same checks run with each planted bug (planted.h) put in from the
// outside: every one must be caught.
//
// The variants and what they promise come from the registry (core/cache_factory.h): a row per
// variant, or per preset (`quantized-int8-kivi`), its parameters drawn from the ranges the
// registry gives. Scenarios that are no single variant (fork, rollback, batch, stale,
// speculate) are the suite's own.
//
//   exact        must be bitwise equal at every step
//   approximate  bitwise equal inside their exact regime (a window while T <= sinks + window)
//                and shown to differ outside it; quantized caches within a stated error bound
//   mutant       a correct check run on a planted bug: it must fail
//
// `kvlab verify` prints these rows; tests/test_verify.cpp asserts them. To add a variant, see
// "Adding a cache variant" in the README.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend.h"
#include "model.h"

namespace kvlab {

class CachePlugin;  // plugin_cache.h

struct VerifyOptions {
    int cases = 100;             // generated cases per property
    std::uint64_t seed = 1;      // RapidCheck's seed: the same seed draws the same cases
    std::string device = "cpu";  // gpu/device.h's --device: where the decoders run. With two
                                 // ("both" = cpu,gpu), naive decode on the first is the reference
                                 // and the second's naive and cached decode must both equal it.
    // Builds a device's backend; empty: make_backend (gpu/device.h). Tests put a planted kernel
    // behind a device name with it, to show that a two-device run catches it.
    std::function<std::unique_ptr<Backend>(std::string_view device, const Model& model)> make_backend = nullptr;
    // A KV format name (kv_format.h): the caches of the variant rows and scenarios store K and V in
    // it, wherever the variant takes a format, and naive decode stores them the same way. "": the
    // variant rows run in fp32 and the scenarios draw a format per case.
    std::string kv_format = "";
    // "simple" or "tiled" (core/tiled_attention.h): what naive decode and the decoders under test
    // run in every exact row, with this key tile when tiled. "": simple, and the tiled-attention
    // row draws its tiles.
    std::string attention = "";
    int tile = 64;
    // "fast" or "long": the long profile's scenarios reach contexts up to 8192 (Devices in
    // verify.cpp), and planted bugs with long_only run only there.
    std::string profile = "fast";
    // Called with one line as each case of a long-profile scenario starts (the progress line).
    std::function<void(std::string_view line)> progress = nullptr;
    // A plugin's checks only: the block sizes its pools are drawn from (empty: the plugin's, else
    // kvlab's 1..16, or 1..64 in the long profile), the most sequences a pool holds (0: kvlab's
    // draw, up to 8, or 64 in the long profile), and the seconds after which no new case starts
    // (0: none; cases then run in rounds of 10, round r with seed + r).
    std::vector<int> block_sizes = {};
    int max_sequences = 0;
    double time_limit = 0;
    // A plugin's checks only: each case's call log as it grows, one line at a time: "h <header>"
    // as a case starts, then before each plugin call "f <entry>" for entries that are final and
    // "p <entry>" for the call under way (plugin_replay.h's lines). `kvlab verify --plugin`'s
    // child sends them to its parent, so that a plugin that crashes or hangs still leaves its log.
    std::function<void(std::string_view line)> call_log = nullptr;
};

struct VerifyRow {
    std::string name;            // the variant (or preset), the scenario, or the mutant
    std::string kind;            // "exact", "approximate" or "mutant"
    std::string parameters;      // what the generator ranges over
    int cases = 0;               // cases run (a failing property stops at its first failure)
    std::string result;          // "bitwise equal", "bitwise equal while T <= sinks + window; differs beyond", ...
    bool ok = false;             // the result is the one the variant promises
    std::string counterexample;  // the shrunk failing case, in one line ("" when none)
    std::string figures;         // measured figures (quantized error; the long profile's sizes reached), "" when none
    int counterexample_T = 0;    // the sequence length of the counterexample ("T = N" in it), 0 when none
    // The counterexample's largest pool fill (percent of its slots held) and the most sequences
    // it held at once ("pool N% full, M sequences" in it), 0 when it names none.
    int counterexample_fill = 0, counterexample_sequences = 0;
    // A plugin row's failing case as a replayable call log (plugin_replay.h), "" when none.
    std::string replay_log{};
};

// A name verify() accepts: a group ("all", "exact", "approximate", "mutants"), a registry variant
// (its rows), a preset's or a scenario's row, or a planted bug.
struct VerifyEntry {
    std::string name;
    std::string kind;       // "group", "exact", "approximate" or "mutant"
    std::string about;      // one line
    bool registry = false;  // a registry variant or preset: describe() (cache_factory.h) says more
};
std::vector<VerifyEntry> verify_list();
std::vector<std::string> verify_names();  // verify_list()'s names
// Runs the named checks; throws Error for an unknown name.
std::vector<VerifyRow> verify(std::string_view which, const VerifyOptions& options);
// Throws Error, in one line, for options verify() and verify_plugin() refuse (cases, device, KV
// format, attention, profile): `kvlab verify --plugin-stdio` checks them before it says hello.
void check_verify_options(const VerifyOptions& options);
// Runs the exact property on a cache plugin's bookkeeping (include/kvlab/cache_plugin.h, loaded
// from `path`): prefill, decode and rollback against naive decode, shrunk on failure. Throws
// Error when the plugin does not load. A crash inside the plugin is not caught here: `kvlab
// verify --plugin` runs this in a child process. options.progress hears each case's steps.
VerifyRow verify_plugin(const std::string& path, const VerifyOptions& options);
// The same on a plugin already loaded, or one that is not a library (the Python module's).
VerifyRow verify_plugin(const CachePlugin& plugin, const VerifyOptions& options);

}  // namespace kvlab
