// kvlab proofs: the verification suite, one property per cache variant (library kvlab_verify).
//
// Each check generates small models, token sequences and variant parameters with RapidCheck,
// decodes them with a cached decoder on the variant, and compares the logits at every step
// with naive decode, bit for bit. A failure is shrunk to the smallest case RapidCheck finds and
// described in one line. The same checks run with each planted bug (planted.h) put in from the
// outside: every one must be caught.
//
//   exact        must be bitwise equal at every step
//   approximate  bitwise equal inside their exact regime (a window while T <= S + W) and shown
//                to differ outside it; quantized caches within a stated error bound
//   mutant       a correct check run on a planted bug: it must fail
//
// `kvlab verify` prints these rows; tests/test_verify.cpp asserts them. To verify a variant of
// your own, see "Verifying a cache variant of your own" in the README.
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

struct VerifyOptions {
    int cases = 100;            // generated cases per property
    std::uint64_t seed = 1;     // RapidCheck's seed: the same seed draws the same cases
    std::string device = "cpu";  // gpu/device.h's --device: where the decoders run. With two
                                 // ("both" = cpu,gpu), naive decode on the first is the reference
                                 // and the second's naive and cached decode must both equal it.
    // Builds a device's backend; empty: make_backend (gpu/device.h). Tests put a planted kernel
    // behind a device name with it, to show that a two-device run catches it.
    std::function<std::unique_ptr<Backend>(std::string_view device, const Model& model)> make_backend = nullptr;
};

struct VerifyRow {
    std::string name;            // the variant, or the mutant
    std::string kind;            // "exact", "approximate" or "mutant"
    std::string parameters;      // what the generator ranges over
    int cases = 0;               // cases run (a failing property stops at its first failure)
    std::string result;          // "bitwise equal", "differs outside T <= S + W", "caught", ...
    bool ok = false;             // the result is the one the variant promises
    std::string counterexample;  // the shrunk failing case, in one line ("" when none)
    std::string figures;         // measured figures (quantized error), "" when none
};

// The names verify() accepts: every variant and every mutant, plus "all", "exact",
// "approximate" and "mutants".
std::vector<std::string> verify_names();
// Runs the named checks; throws Error for an unknown name.
std::vector<VerifyRow> verify(std::string_view which, const VerifyOptions& options);

}  // namespace kvlab
