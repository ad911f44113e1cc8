// Lab 3, reference solution: kvlab's own contiguous head-major cache (core/cache.cpp,
// ContiguousCache: slot, attended and release are the three TODOs, a few lines each).
#include "lab.h"

namespace kvlab::lab03 {

std::unique_ptr<Cache> make_lab_cache(const Config& config) { return std::make_unique<ContiguousCache>(config); }

}  // namespace kvlab::lab03
