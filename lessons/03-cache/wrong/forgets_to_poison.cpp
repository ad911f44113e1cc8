// expect: not NaN
// A plausible mistake: rollback shortens the cache but leaves the forgotten rows in place, so
// a bug that reads one later gets stale numbers instead of an obvious NaN.
#include "lab.h"

namespace kvlab::lab03 {

namespace {
class ForgetsToPoison final : public ContiguousCache {
public:
    using ContiguousCache::ContiguousCache;

protected:
    void release(int n) override { (void)n; }
};
}  // namespace

std::unique_ptr<Cache> make_lab_cache(const Config& config) { return std::make_unique<ForgetsToPoison>(config); }

}  // namespace kvlab::lab03
