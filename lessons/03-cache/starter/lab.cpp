// Lab 3: the contiguous KV cache. Fill in the three TODOs; `lessons/grade 3` grades this file.
//
// Storage (given): one array for K and one for V, head-major, reserved for max_seq positions:
//   k, v: [n_layers][n_kv_heads][max_seq][head_size]
// A "row" is head_size floats. The row of (layer l, KV head h, slot s) starts at float
// (l * layer_rows + h * head_rows + s) * head_size. The decoder and the kernels add the layer
// and head parts; your cache says only which slot a logical position t uses.
#include <cassert>

#include "grader.h"
#include "lab.h"

namespace kvlab::lab03 {

namespace {

class LabCache final : public Cache {
public:
    explicit LabCache(const Config& c)
        : Cache(c),
          storage_(host_memory(), std::int64_t(c.n_layers) * c.n_kv_heads * c.max_seq, c.head_size(),
                   /*layer_rows=*/std::int64_t(c.n_kv_heads) * c.max_seq, /*head_rows=*/c.max_seq) {
        assert(storage_.n_rows == std::int64_t(c.n_layers) * c.n_kv_heads * c.max_seq &&
               storage_.head_size == c.head_size());
    }

    // TODO 1 (the store): the slot holding position t's rows, for every layer and head.
    // The decoder writes the new rows of a step at slot(pos) before attention reads them.
    std::int64_t slot(int t) const override {
        (void)t;
        throw lessons::NotImplemented("LabCache::slot");
    }

    // TODO 2 (the read path): the slots a query at position pos attends to, in increasing
    // position, with those positions in `positions` when it is not null; return how many.
    // Write first, then read: the decoder has already stored pos's own K and V when it asks.
    int attended(int pos, std::int64_t* slots, int* positions) const override {
        (void)pos, (void)slots, (void)positions;
        throw lessons::NotImplemented("LabCache::attended");
    }

    const KVStorage& storage() const override { return storage_; }
    MemoryStats memory() const override {
        MemoryStats m;
        m.used_bytes = kv_bytes(config_, length());
        m.payload_bytes = m.reserved_bytes = m.allocated_bytes = storage_.bytes();
        return m;
    }
    std::string name() const override { return "lab03"; }

protected:
    void reserve(int new_length) override { assert(new_length <= config_.max_seq); }  // reserved up front

    // TODO 3 (rollback): forget positions n..length()-1. Their rows must read NaN afterwards, so
    // a bug that reads a forgotten row shows up at once (storage_.poison(config_, slot, count)
    // fills `count` slots from `slot` with NaN in every layer and KV head).
    void release(int n) override {
        (void)n;
        throw lessons::NotImplemented("LabCache::release");
    }

private:
    KVStorage storage_;
};

}  // namespace

std::unique_ptr<Cache> make_lab_cache(const Config& config) { return std::make_unique<LabCache>(config); }

}  // namespace kvlab::lab03
