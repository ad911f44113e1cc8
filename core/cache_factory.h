// kvlab core: the cache variants by name, and the one place that builds them.
//
//   contiguous-head  ContiguousCache, head-major ("contiguous" names it too)
//   contiguous-seq   ContiguousCache, sequence-major (llama2.c's)
//   growing          GrowingCache: head-major, capacity doubling on demand
//   paged            PagedCache over its own BlockPool
//   prefix-shared    paged, the pool publishing full blocks for later requests (prefix caching)
//   quantized        QuantizedCache (approximate)
//   window           WindowCache: attention sinks plus a sliding window (approximate)
//
// `kvlab bench`, `kvlab view` and the verification suite (proofs/verify.cpp) build their caches
// here; each picks the parameters it ranges over.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "cache.h"
#include "paged.h"
#include "quantized_cache.h"

namespace kvlab {

enum class Variant { contiguous_head, contiguous_seq, growing, paged, prefix_shared, quantized, window };
inline constexpr Variant kAllVariants[] = {Variant::contiguous_head, Variant::contiguous_seq, Variant::growing,
                                           Variant::paged,           Variant::prefix_shared,  Variant::quantized,
                                           Variant::window};
std::string_view to_string(Variant v);
// A name above (or "contiguous"), else none.
std::optional<Variant> parse_variant(std::string_view name);
// "a, b or c": the names of `variants`, for an error message or a --help line.
std::string variant_names(std::span<const Variant> variants);
// Bitwise equal to naive decode at every step (all but quantized and window).
bool is_exact(Variant v);

// Each variant reads the fields it needs.
struct CacheSpec {
    Variant variant = Variant::contiguous_head;
    int initial_capacity = 1;               // growing: positions before the first doubling
    int block_size = 16;                    // paged, prefix-shared: positions per block
    int n_blocks = 0;                       // paged, prefix-shared: blocks in the pool; 0 = ceil(max_seq / block_size)
    QuantSpec quant;                        // quantized
    int sinks = 4, window = 16, chunk = 0;  // window (window_cache.h)
    std::uint64_t model_identity = 0;       // paged, prefix-shared: the model's fingerprint (prefix hashes)
    int seq_id = 0;                         // names the sequence in events
};

// A cache and, for the paged variants, the pool it draws from (declared first, so it outlives
// the cache). The constructors throw Error for parameters that do not fit the config.
struct CacheAndPool {
    std::unique_ptr<BlockPool> pool;
    std::unique_ptr<Cache> cache;
};
CacheAndPool make_cache(const Config& config, const CacheSpec& spec, Memory& memory = host_memory());

// The quantization group kvlab uses by default: the largest divisor of head_size up to 16.
int default_quant_group(const Config& config);

}  // namespace kvlab
