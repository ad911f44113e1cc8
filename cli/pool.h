// kvlab pool: a scripted session over one paged block pool. Requests arrive, continue, fork, roll
// back and leave; after each command the pool shows what moved (blocks allocated, shared through a
// prefix hit or a fork, copied on write, freed, evicted), and every prefill is checked against
// naive decode of the sequence's whole token list, bit for bit.
//
// Script: commands separated by ';' (blank ones skipped), words by whitespace:
//   new NAME t1,t2,...      a new request: its longest cached prefix is mapped, the rest prefilled
//   append NAME t1,t2,...   continue NAME with these tokens (a prefill)
//   fork NAME NEWNAME       NEWNAME maps every block of NAME (copy-on-write on its first write)
//   rollback NAME N         forget NAME's positions >= N
//   free NAME               NAME's blocks go back (published ones stay cached)
//   show                    every sequence's block table and every block's state
// The first bad command stops the run with an Error naming it; the pool is as it was before it.
#pragma once

#include <string>

#include "commands.h"

namespace CLI {
class App;
}

namespace kvlab::cli {

struct PoolOptions {
    ModelOptions m;
    int block_size = 4;        // positions per block; BlockPool checks it against max_seq
    int blocks = 32;           // blocks in the pool
    bool prefix_cache = true;  // publish full blocks for later requests to share (--no-prefix-cache: off)
    std::string kv_format = "fp32";  // what every block stores K and V in (the naive check stores them so too)
    std::string script;        // the commands above
    bool events = false;       // print every CacheEvent of every command
    bool json = false;
    AttentionOptions attention;  // what the engine and the naive check both run
    int threads = 0;             // 0: auto (common.h resolve_threads)
    // The naive check re-runs a whole sequence after every prefill: O(T^2) a command. Its FLOPs
    // are capped here; the first prefill that would pass the cap, and every one after it, is
    // reported unchecked (the summary says how many).
    double check_gflop = 50;
};

// Runs the script; 0 when every checked prefill equals naive decode bit for bit, 1 when one differs.
// Throws Error for a bad script, option or request (the first bad command; nothing after it runs).
int run_pool(const PoolOptions& o);

// Adds --model, --tokenizer, --model-seed, --block-size, --blocks, --no-prefix-cache, --kv-format,
// --script, --events, --json, --attention, --tile, --check-budget, --threads.
void add_pool_options(CLI::App* cmd, PoolOptions& o);

}  // namespace kvlab::cli
