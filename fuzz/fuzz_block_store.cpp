// fuzz_block_store: a prefix store's record (core/block_store.h) on arbitrary bytes, fetched by a
// pool as a record some store outside kvlab handed back.
//
// Input: byte 0 chooses how the rest becomes the record under the key the pool asks for first:
// even, the rest is XOR-ed onto the valid record from byte 1 on (most of it stays valid: the
// checksum and header checks are what stand); odd, the rest is the record. Seeds: both kinds
// (make_seeds.cpp). Checks: the request is served bitwise equal to a cold decode, and the pool
// restores the block only when the record is byte for byte the valid one (anything else is
// refused: passing the check otherwise would take a SHA-256 collision).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "block_store.h"
#include "cpu_backend.h"
#include "fuzz_util.h"
#include "scheduler.h"
#include "speculative.h"

using namespace kvlab;

namespace {

// dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq
const Config kConfig{8, 8, 2, 2, 1, 16, 12};
const ServeRequest kRequest{{3, 1, 4, 1, 5, 9, 2, 6, 5}, 2, 0};

struct Base {
    Model m = random_model(kConfig, 5);
    HostStore store;  // the blocks of kRequest's prompt, put there by a first pool
    std::string key;  // the first block's
    std::vector<std::uint8_t> valid;
    std::vector<float> cold;  // [2, vocab_size] kRequest decoded alone
    Base() {
        CpuBackend backend(m);
        SchedulerConfig sc;
        sc.block_size = 4, sc.n_blocks = 6, sc.store = &store;
        Scheduler s(backend, m, sc);
        s.add(kRequest);
        while (s.step()) {
        }
        s.pool().flush_to_store();
        const BlockKey first = s.pool().key(0, m.w.fingerprint(), std::span(kRequest.prompt).first(4));
        key = store_key(first, s.pool().block_shape());
        valid = *store.get(key);
        CachedDecoder alone(m);
        cold = greedy_decode(alone, kRequest.prompt, kRequest.max_new_tokens).logits;
    }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static Base base;
    if (size == 0) return 0;
    std::vector<std::uint8_t> record(data + 1, data + size);
    if (data[0] % 2 == 0) {
        record = base.valid;
        for (std::size_t i = 1; i < size && i - 1 < record.size(); i++) record[i - 1] ^= data[i];
    }
    HostStore store = base.store;
    store.put(base.key, record);
    CpuBackend backend(base.m);
    SchedulerConfig sc;
    sc.block_size = 4, sc.n_blocks = 6, sc.store = &store;
    Scheduler s(backend, base.m, sc);
    s.add(kRequest);
    while (s.step()) {
    }
    if (s.result(0).logits != base.cold) std::abort();  // a record changed the logits
    // The first block restored (the second with it) only from the valid record.
    if (s.pool().store_stats().fetched > 0 && record != base.valid) std::abort();
    if (s.pool().store_stats().fetched == 0 && record == base.valid) std::abort();
    return 0;
}
