// kvlab memory: KV-cache bytes for published model shapes at each precision, and the reservation
// waste of a contiguous cache (max_seq positions per request) against a paged one (block_size pages).
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace kvlab::cli {

struct MemoryOptions {
    int context = 4096;             // tokens per sequence; also max_seq, the contiguous reservation per request
    int batch = 1;                  // sequences held at once
    std::string precision = "all";  // or fp32, fp16, bf16, fp8, int4, int2
    std::string model = "all";      // or one published shape, e.g. "llama2-7b"
    int block_size = 16;            // positions per page of the paged cache
    std::string lengths;            // request lengths as a comma list; empty: a uniform spread in [1, context]
    int requests = 64;              // how many lengths the spread draws
    std::uint64_t seed = 1;         // seed of the spread
    bool json = false;
};

int run_memory(const MemoryOptions& o);

// Adds --context, --batch, --precision, --model, --block-size, --lengths, --requests, --seed, --json to `cmd`.
void add_memory_options(CLI::App* cmd, MemoryOptions& o);

}  // namespace kvlab::cli
