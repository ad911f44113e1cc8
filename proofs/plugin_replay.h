// kvlab proofs: a plugin check's failing case as a replayable call log, and its replay.
//
// The log is JSON lines: a header (the plugin, the model's shape, the pool), then a line for each
// call kvlab made into the pool and each run of rows it wrote or read (plugin_cache.h's
// PluginLogEntry, with the plugin's answers), then the verdict:
//
//   {"kvlab_replay": 1, "plugin": "block_manager", "config": {"dim": 8, ...}, "n_slots": 64,
//    "max_sequences": 4, "block_size": 4, "kv_format": "fp32"}
//   {"call": "create", "seq": 0}
//   {"call": "reserve", "seq": 0, "length": 0, "tokens": [3, 1], "copies": [], "slots": [0, 1]}
//   {"call": "write", "seq": 0, "from": 0, "to": 1}
//   {"call": "read", "seq": 0, "from": 0, "to": 1}
//   {"call": "step_done", "seq": 0, "moves": []}
//   {"call": "release", "seq": 0, "n": 1}        (also attach_prefix, fork, destroy)
//   {"verdict": "plugin block_manager, sequence 0: ...", "books": true}
//
// A replay runs exactly those calls against the plugin alone, through the same books (no model:
// a write marks the rows as computed for the sequence's tokens), so the verdict is kvlab's own
// check again, not a comparison with the log; the answers are compared with the log's too, and
// the first that differs is named. Lines after the call that raised the verdict are kvlab's
// clean-up (a rollback of the failed step, sequences destroyed), which a replay does not reach.
// "books": false marks a verdict on logits (naive decode differed while every answer passed the
// books), which a replay without the model cannot show.
#pragma once

#include <span>
#include <string>

#include "config.h"
#include "plugin_cache.h"

namespace kvlab {

struct ReplayHeader {
    std::string plugin;  // the plugin's name, as reported
    Config config;       // the model's shape (a replay needs n_layers, n_kv_heads, head_size, max_seq)
    int n_slots = 0, max_sequences = 1, block_size = 1;
    std::string kv_format = "fp32";
};

// The log's lines, each one JSON object without its newline: the header, a call, the verdict.
std::string replay_log_header(const ReplayHeader& header);
std::string replay_log_line(const PluginLogEntry& entry);
std::string replay_log_verdict(const std::string& verdict, bool books);
// The log as JSON lines (each ending in a newline), the verdict last.
std::string replay_log_text(const ReplayHeader& header, std::span<const PluginLogEntry> entries,
                            const std::string& verdict, bool books);

struct ReplayOutcome {
    int calls = 0;        // log lines replayed (a write or read run counts once)
    std::string verdict;  // the replay's: the Error kvlab's checks raised ("" when every call passed)
    std::string logged;   // the log's verdict
    bool logged_books = true;
    std::string divergence;  // the first line whose answer differs from the log's ("" when none)
    bool same() const { return verdict == logged; }
};

// Replays a log against `plugin`. Throws Error, in one line naming the line, for text that is
// not a replay log (not JSON, a field missing or out of range, a sequence never created).
ReplayOutcome replay_plugin_log(const CachePlugin& plugin, const std::string& log_text);

// The outcome in words: what was replayed, the verdict and whether it is the log's.
std::string replay_report(const ReplayOutcome& outcome);

}  // namespace kvlab
