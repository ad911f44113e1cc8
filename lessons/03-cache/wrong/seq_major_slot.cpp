// expect: shares row
// A plausible mistake: the storage laid out as llama2.c's, [n_layers][max_seq][n_kv_heads]
// [head_size] (a position's rows of every KV head side by side: head_rows = 1), but slot(t) kept
// the head-major answer t instead of t * n_kv_heads, so position t's row of KV head 1 is position
// t + 1's row of KV head 0. Every row stays inside the storage; the heads overwrite each other.
#include "lab.h"

namespace kvlab::lab03 {

namespace {
class SeqMajorSlot final : public ContiguousCache {
public:
    explicit SeqMajorSlot(const Config& c) : ContiguousCache(c, Layout::seq_major) {}
    std::int64_t slot(int t) const override { return t; }  // the mistake: a position spans n_kv_heads rows here
};
}  // namespace

std::unique_ptr<Cache> make_lab_cache(const Config& config) { return std::make_unique<SeqMajorSlot>(config); }

}  // namespace kvlab::lab03
