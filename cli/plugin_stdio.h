// kvlab verify --plugin-stdio: a cache plugin served over stdin and stdout by the process that
// started kvlab (the Python module's kvlab.verify, or a server in any language), one JSON object
// a line each way. kvlab asks, the server answers, and kvlab checks every answer exactly as it
// checks a shared library's (plugin_cache.h). The protocol, which docs/plugin-protocol.md
// spells out, is include/kvlab/cache_plugin.h's table as messages:
//
//   kvlab -> {"op": "hello", "abi": 3}              <- {"name": "...", "abi": 3, "methods": ["fork", ...],
//            "block_sizes": [...], "max_sequences": n}   (no "abi": 3: a version 2 server, release assumed)
//   kvlab -> {"op": "create_pool", "config": {...}} <- {"pool": id}  or {"refused": "why"}
//   kvlab -> {"op": "create", "pool": id}           <- {"seq": id}   or {"refused": "why"}
//   kvlab -> {"op": "fork", "seq": id}              <- {"seq": id}   or {"refused": "why"}
//   kvlab -> {"op": "reserve", "seq": id, "length": L, "tokens": [...]}
//                                                   <- {"copies": [[from, to, count], ...]} or {"refused": "why"}
//   kvlab -> {"op": "slot", "seq": id, "pos": p}    <- {"slot": s}
//   kvlab -> {"op": "slots", "seq": id, "n": n}     <- {"slots": [s0, ..., s(n-1)]}   (a server that says
//            "slots" in hello: every held position's slot in one answer, asked once per step; an
//            exception in one slot answers {"error": "text", "pos": p})
//   kvlab -> {"op": "attach_prefix", "seq": id, "tokens": [...]} <- {"n": k}
//   kvlab -> {"op": "attended", "seq": id, "pos": p} <- {"positions": [...]}
//   kvlab -> {"op": "release", "seq": id, "n": n}   <- {}
//   kvlab -> {"op": "step_done", "seq": id}         <- {} or {"moves": [[pos, count, slot], ...]}
//   kvlab -> {"op": "memory", "pool": id}           <- {"bytes": b}
//   kvlab -> {"op": "destroy", "seq": id} / {"op": "destroy_pool", "pool": id} <- {}
//   kvlab -> {"op": "result", "row": {...}}         (the last line; no answer)
//
// Any answer may instead be {"error": "text"} (an exception in the server's cache): the check
// fails naming the call. An answer that is not one line of a JSON object of the expected shape,
// or the pipe closing, breaks the channel (stdio_broken): the run ends with that one-line Error.
#pragma once

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "plugin_cache.h"

namespace kvlab {

// Says hello on `out`, reads the answer from `in`, and returns the plugin whose calls go over
// them (one per process: the table's functions share the channel). Throws Error in one line.
std::unique_ptr<CachePlugin> stdio_plugin(std::FILE* in, std::FILE* out);
// The last line, {"op": "result", key: result}: the check's row, or a replay's outcome ("replay").
void stdio_send_result(const nlohmann::json& result, const char* key = "row");

// The answer that broke the protocol (not one line of a JSON object of the expected shape, or
// the pipe closed), or "": after it every call fails, and the run ends with it as its error.
const std::string& stdio_broken();

// An answer that is not a JSON object.
struct StdioProtocolError : Error {
    using Error::Error;
};
// One answer as the protocol reads it: `line` parsed and checked to be an object (else a
// StdioProtocolError); {"error": ...} becomes an Error naming `call`, unless `errors` keeps it.
nlohmann::json stdio_parse_answer(const std::string& line, const std::string& call, bool errors = false);

}  // namespace kvlab
