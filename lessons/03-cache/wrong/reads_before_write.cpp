// expect: differs
// A plausible mistake: the read path lists only the positions cached before this step, as if
// attention ran before the step's own K and V were stored. Row pos never sees itself.
#include "lab.h"

namespace kvlab::lab03 {

namespace {
class ReadsBeforeWrite final : public ContiguousCache {
public:
    using ContiguousCache::ContiguousCache;
    int attended(int pos, std::int64_t* slots, int* positions) const override {
        return pos == 0 ? 0 : ContiguousCache::attended(pos - 1, slots, positions);
    }
};
}  // namespace

std::unique_ptr<Cache> make_lab_cache(const Config& config) { return std::make_unique<ReadsBeforeWrite>(config); }

}  // namespace kvlab::lab03
