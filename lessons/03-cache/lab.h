// Lab 3: the cache. You write the contiguous KV cache that cached decode stores into and reads
// from; the grader runs kvlab's real decoders on it.
#pragma once

#include <memory>

#include "cache.h"

namespace kvlab::lab03 {

// A cache for a model of `config`'s shape, holding up to max_seq positions, in host memory.
std::unique_ptr<Cache> make_lab_cache(const Config& config);

}  // namespace kvlab::lab03
