#include "cache_factory.h"

#include <algorithm>

#include "window_cache.h"

namespace kvlab {

std::string_view to_string(Variant v) {
    switch (v) {
        case Variant::contiguous_head: return "contiguous-head";
        case Variant::contiguous_seq: return "contiguous-seq";
        case Variant::growing: return "growing";
        case Variant::paged: return "paged";
        case Variant::prefix_shared: return "prefix-shared";
        case Variant::quantized: return "quantized";
        case Variant::window: return "window";
    }
    return "?";
}

std::optional<Variant> parse_variant(std::string_view name) {
    if (name == "contiguous") return Variant::contiguous_head;
    for (Variant v : kAllVariants)
        if (to_string(v) == name) return v;
    return std::nullopt;
}

std::string variant_names(std::span<const Variant> variants) {
    std::string s;
    for (std::size_t i = 0; i < variants.size(); i++) {
        if (i) s += i + 1 == variants.size() ? " or " : ", ";
        s += to_string(variants[i]);
    }
    return s;
}

bool is_exact(Variant v) { return v != Variant::quantized && v != Variant::window; }

CacheAndPool make_cache(const Config& c, const CacheSpec& s, Memory& memory) {
    CacheAndPool out;
    switch (s.variant) {
        case Variant::contiguous_head:
            out.cache = std::make_unique<ContiguousCache>(c, ContiguousCache::Layout::head_major, memory);
            break;
        case Variant::contiguous_seq:
            out.cache = std::make_unique<ContiguousCache>(c, ContiguousCache::Layout::seq_major, memory);
            break;
        case Variant::growing: out.cache = std::make_unique<GrowingCache>(c, s.initial_capacity, memory); break;
        case Variant::paged:
        case Variant::prefix_shared: {
            const int n_blocks = s.n_blocks ? s.n_blocks : (c.max_seq + s.block_size - 1) / std::max(1, s.block_size);
            out.pool =
                std::make_unique<BlockPool>(c, s.block_size, n_blocks, s.variant == Variant::prefix_shared, memory);
            out.cache = std::make_unique<PagedCache>(*out.pool, s.model_identity, s.seq_id);
            break;
        }
        case Variant::quantized: out.cache = std::make_unique<QuantizedCache>(c, s.quant); break;
        case Variant::window: out.cache = std::make_unique<WindowCache>(c, s.sinks, s.window, s.chunk, memory); break;
    }
    out.cache->seq_id = s.seq_id;
    return out;
}

int default_quant_group(const Config& c) {
    int g = 1;
    for (int d = 1; d <= std::min(16, c.head_size()); d++)
        if (c.head_size() % d == 0) g = d;
    return g;
}

}  // namespace kvlab
