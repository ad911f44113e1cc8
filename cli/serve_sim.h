// kvlab serve-sim's request file (cli/serve_sim.cpp), readable on its own for fuzz_serve_trace.
#pragma once

#include <string>
#include <vector>

#include "scheduler.h"
#include "tokenizer.h"

namespace kvlab::cli {

// JSON lines, one request each: {"tokens": [...]} or {"prompt": "text"} (with a tokenizer),
// "max_new_tokens": N, optional "arrival": step; blank lines skipped; sorted by arrival (stable).
// Throws Error naming `what` and the line. Values are not checked against a model here
// (Scheduler::add does that).
std::vector<ServeRequest> parse_serve_trace(const std::string& text, const Tokenizer* tokenizer,
                                            const std::string& what);

}  // namespace kvlab::cli
