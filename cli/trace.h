// kvlab trace, diff-trace and golden: a decode run as files another engine can compare with.
//
// A trace is a folder: manifest.json, and .npy arrays numpy.load and torch.from_numpy read.
//   tokens.npy     int32   [T]                                  the prompt, then the greedy tokens
//   logits.npy     float32 [steps + 1, vocab_size]              row i: the logits at position P - 1 + i
//   k.npy, v.npy   float32 [n_layers, n_kv_heads, T, head_size] each position's K and V as attention
//                                                               reads them (after the KV format)
//   attention.npy  float32 [steps + 1, n_layers, n_heads, T]    with --attention-weights: row i, the
//                                                               weights of the query at P - 1 + i (0 past it)
// The manifest names the model (its file or random seed, shape and fingerprint), the run
// (device, cache, KV format, attention, prompt length, steps) and each array's file, dtype,
// shape and SHA-256. docs/traces.md says how to read one and compare with it.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "npy.h"

namespace kvlab::cli {

struct Trace {
    nlohmann::json manifest;
    std::map<std::string, NpyArray> arrays;  // tokens, logits, k, v, and attention when recorded
};

// A trace from its manifest's text, reading each listed file through read_file (a name inside the
// trace's folder): every field checked, every array's dtype, shape and SHA-256 against the
// manifest and the shapes against each other. Throws Error in one line naming `what`.
Trace parse_trace(const std::string& manifest_text, const std::function<std::string(const std::string&)>& read_file,
                  const std::string& what);
// The trace in folder `dir`.
Trace read_trace(const std::string& dir);

// Where two traces first differ, in the order the run computed them: step by step (step 0 is the
// prompt's prefill), each layer's K then V rows of the positions the step wrote, then the
// step's logits and attention weights. Tokens first: a different token makes a different run.
struct TraceDiff {
    bool equal = true;
    nlohmann::json first;   // the first difference's coordinates and values (null when equal)
    nlohmann::json counts;  // per array: elements compared and elements differing
    std::string text;       // the report, a few lines
};
// Throws Error when the traces cannot be compared (another shape, another prompt length).
TraceDiff diff_traces(const Trace& a, const Trace& b);

}  // namespace kvlab::cli
