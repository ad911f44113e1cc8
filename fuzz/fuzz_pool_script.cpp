// fuzz_pool_script: `kvlab pool`'s script executor (cli/pool.h) on arbitrary scripts.
//
// Input: u8 block size (1 + b % 8), u8 blocks (1 + b % 48), u8 flags (bit 0: no prefix cache,
// bit 1: --events, bit 2: --json), then the script text ("new a 1,2,3; fork a b; append b 4;
// show"). The model is a random one of a tiny shape (dim 8, 2 layers, GQA, vocab 32, max_seq 24),
// saved once as a checkpoint, so every run loads the same weights. Seeds: fuzz/make_seeds.cpp;
// dictionary: fuzz/pool_script.dict.
// Checks: run_pool throws kvlab::Error for a bad command, or returns 0: every prefill bitwise
// equal to naive decode of the sequence's whole token list. A 1 (a prefill that differs), a crash
// or a sanitizer report is a finding.
#include <cstdint>

#include "checkpoint.h"
#include "fuzz_util.h"
#include "pool.h"

using namespace kvlab;

namespace {

const std::string& tiny_model_path() {
    static fuzz::MemFile file("pool-model");
    static const bool written = [] {
        const Config c =
            Config::parse("dim=8,hidden_dim=12,n_layers=2,n_heads=2,n_kv_heads=1,vocab_size=32,max_seq=24", Config{});
        save_checkpoint(file.path(), random_model(c, 11));
        return true;
    }();
    (void)written;
    return file.path();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    fuzz::silence_stdout();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Input in(data, size);
    cli::PoolOptions o;
    o.m.model = tiny_model_path();
    o.block_size = 1 + in.u8() % 8;
    o.blocks = 1 + in.u8() % 48;
    const std::uint8_t flags = in.u8();
    o.prefix_cache = !(flags & 1);
    o.events = flags & 2;
    o.json = flags & 4;
    o.script = std::string(in.rest());
    int rc = 0;
    try {
        rc = cli::run_pool(o);
    } catch (const Error&) {
        return 0;  // a bad command, refused before it changed the pool
    }
    FUZZ_CHECK(rc == 0, "a prefill differs from naive decode (run_pool returned %d)", rc);
    return 0;
}
