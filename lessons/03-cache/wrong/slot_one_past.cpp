// expect: but the storage has
// A crash-kind mistake: slot(t) counts positions from 1 (t + 1), as if row 0 were reserved. Each
// row is shifted by one, and the last position's row of the last layer and KV head is one past
// the storage's end: unchecked, the decoders would write there. The grader checks every slot
// before the decoders use it, so this is a FAIL naming the slot.
#include "lab.h"

namespace kvlab::lab03 {

namespace {
class SlotOnePast final : public ContiguousCache {
public:
    explicit SlotOnePast(const Config& c) : ContiguousCache(c) {}
    std::int64_t slot(int t) const override { return t + 1; }  // the mistake
};
}  // namespace

std::unique_ptr<Cache> make_lab_cache(const Config& config) { return std::make_unique<SlotOnePast>(config); }

}  // namespace kvlab::lab03
