#include "cache_factory.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <numeric>

#include "h2o_cache.h"
#include "window_cache.h"

namespace kvlab {

namespace {

// ----------------------------------------------------------------------------------------------
// Parameters

std::vector<int> values_in(int lo, int hi) {
    std::vector<int> v(std::size_t(std::max(0, hi - lo + 1)));
    std::iota(v.begin(), v.end(), lo);
    return v;
}

int ceil_blocks(const Config& c, int block_size) { return (c.max_seq + block_size - 1) / std::max(1, block_size); }

// Shorthands for the table's functions of (config, the parameters before).
template <int V>
int constant(const Config&) {
    return V;
}
template <int Lo, int Hi = kUnbounded>
IntRange bounds(const Config&, const CacheSpec&) {
    return {Lo, Hi};
}
IntRange one_to_max_seq(const Config& c, const CacheSpec&) { return {1, c.max_seq}; }
template <int... V>
std::vector<int> one_of(const Config&, const CacheSpec&) {
    return {V...};
}
template <int Lo, int Hi>
std::vector<int> each_of(const Config&, const CacheSpec&) {
    return values_in(Lo, Hi);
}
std::vector<int> each_up_to_max_seq(const Config& c, const CacheSpec&) { return values_in(1, c.max_seq); }

constexpr VariantParam kGrowingParams[] = {
    {.name = "initial_capacity",
     .meaning = "positions reserved before the first doubling",
     .get = [](const CacheSpec& s) { return s.initial_capacity; },
     .set = [](CacheSpec& s, int v) { s.initial_capacity = v; },
     .default_value = constant<1>,
     .default_text = "1",
     .valid = one_to_max_seq,
     .valid_text = "1..max_seq",
     .property = each_up_to_max_seq,
     .property_text = "1..max_seq"},
};

constexpr VariantParam kBlockSize = {.name = "block_size",
                                     .meaning = "positions per block",
                                     .get = [](const CacheSpec& s) { return s.block_size; },
                                     .set = [](CacheSpec& s, int v) { s.block_size = v; },
                                     .default_value = [](const Config& c) { return std::min(16, c.max_seq); },
                                     .default_text = "min(16, max_seq)",
                                     .valid = one_to_max_seq,
                                     .valid_text = "1..max_seq",
                                     .property = each_up_to_max_seq,
                                     .property_text = "1..max_seq"};

// A pool of one sequence's blocks plus Spare to Spare + 2 for properties (a spare block lets a
// rollback write into a published block, which copies it first).
template <int Spare>
constexpr VariantParam pool_blocks(std::string_view meaning, std::string_view property_text) {
    return {.name = "n_blocks",
            .meaning = meaning,
            .get = [](const CacheSpec& s) { return s.n_blocks; },
            .set = [](CacheSpec& s, int v) { s.n_blocks = v; },
            .default_value = constant<0>,
            .default_text = "0",
            .valid = bounds<0>,
            .valid_text = "0 or more, the pool within 1 GiB",
            .property =
                [](const Config& c, const CacheSpec& s) {
                    const int n = ceil_blocks(c, s.block_size) + Spare;
                    return values_in(n, n + 2);
                },
            .property_text = property_text};
}

constexpr VariantParam kPagedParams[] = {
    kBlockSize,
    pool_blocks<0>("blocks in the pool (0: ceil(max_seq / block_size), one sequence's)", "one sequence's + 0..2")};
constexpr VariantParam kPrefixSharedParams[] = {
    kBlockSize,
    pool_blocks<1>("blocks in the pool (0: one sequence's + 1, the copy a write into a published block takes)",
                   "one sequence's + 1..3")};

constexpr VariantParam kQuantizedParams[] = {
    {.name = "bits",
     .meaning = "bits per code",
     .get = [](const CacheSpec& s) { return s.quant.bits; },
     .set = [](CacheSpec& s, int v) { s.quant.bits = v; },
     .default_value = constant<8>,
     .default_text = "8",
     .valid = bounds<4, 8>,
     .valid_text = "8 or 4",
     .property = one_of<4, 8>,
     .property_text = "4 or 8"},
    {.name = "key_axis",
     .meaning = "0: keys quantized per token, 1: per channel (KIVI); values always per token",
     .get = [](const CacheSpec& s) { return int(s.quant.key_axis); },
     .set = [](CacheSpec& s, int v) { s.quant.key_axis = QuantSpec::Axis(v); },
     .default_value = constant<int(QuantSpec::Axis::per_channel)>,
     .default_text = "1",
     .valid = bounds<0, 1>,
     .valid_text = "0 or 1",
     .property = one_of<0, 1>,
     .property_text = "0 or 1"},
    {.name = "group",
     .meaning = "channels (per token) or positions (per channel) sharing a scale",
     .get = [](const CacheSpec& s) { return s.quant.group; },
     .set = [](CacheSpec& s, int v) { s.quant.group = v; },
     .default_value = default_quant_group,
     .default_text = "the largest divisor of head_size up to min(16, max_seq)",
     .valid =
         [](const Config& c, const CacheSpec& s) {
             const bool per_channel = s.quant.key_axis == QuantSpec::Axis::per_channel;
             return IntRange{1, per_channel ? std::min(c.head_size(), c.max_seq) : c.head_size()};
         },
     .valid_text = "divides head_size; at most max_seq with keys per channel",
     // Group 1 is lossless (every value its own scale): properties draw the lossy ones.
     .property =
         [](const Config& c, const CacheSpec& s) {
             const bool per_channel = s.quant.key_axis == QuantSpec::Axis::per_channel;
             std::vector<int> v;
             for (int g = 2; g <= c.head_size(); g++)
                 if (c.head_size() % g == 0 && (!per_channel || g <= c.max_seq)) v.push_back(g);
             return v.empty() ? std::vector<int>{1} : v;
         },
     .property_text = "divisors of head_size above 1"},
};

constexpr VariantPreset kQuantizedPresets[] = {
    {"int8-kivi", "bits=8,key_axis=1", "int8, keys per channel (KIVI)"},
    {"int8-token", "bits=8,key_axis=0", "int8, keys per token"},
    {"int4-kivi", "bits=4,key_axis=1", "int4, keys per channel (KIVI)"},
    {"int4-token", "bits=4,key_axis=0", "int4, keys per token"},
};

constexpr VariantParam kWindowParams[] = {
    {.name = "sinks",
     .meaning = "first positions always attended (attention sinks)",
     .get = [](const CacheSpec& s) { return s.sinks; },
     .set = [](CacheSpec& s, int v) { s.sinks = v; },
     .default_value = constant<4>,
     .default_text = "4",
     .valid = bounds<0>,
     .valid_text = "0 or more",
     .property = each_of<0, 3>,
     .property_text = "0..3"},
    {.name = "window",
     .meaning = "latest positions attended",
     .get = [](const CacheSpec& s) { return s.window; },
     .set = [](CacheSpec& s, int v) { s.window = v; },
     .default_value = constant<16>,
     .default_text = "16",
     .valid = bounds<1>,
     .valid_text = "1 or more",
     .property = each_of<1, 4>,
     .property_text = "1..4"},
    {.name = "chunk",
     .meaning = "most positions one append adds (0: window)",
     .get = [](const CacheSpec& s) { return s.chunk; },
     .set = [](CacheSpec& s, int v) { s.chunk = v; },
     .default_value = constant<0>,
     .default_text = "0",
     .valid = bounds<0>,
     .valid_text = "0 or more",
     .property = each_of<0, 3>,
     .property_text = "0..3"},
};

// A window's, without its sinks: the ring holds window + chunk - 1 rows.
constexpr VariantParam kFifoParams[] = {kWindowParams[1], kWindowParams[2]};

constexpr VariantParam kH2OParams[] = {
    {.name = "recent",
     .meaning = "latest positions always kept (the query's own included)",
     .get = [](const CacheSpec& s) { return s.recent; },
     .set = [](CacheSpec& s, int v) { s.recent = v; },
     .default_value = constant<8>,
     .default_text = "8",
     .valid = bounds<1>,
     .valid_text = "1 or more",
     .property = each_of<1, 4>,
     .property_text = "1..4"},
    {.name = "heavy",
     .meaning = "older positions kept by accumulated attention, per layer and KV head",
     .get = [](const CacheSpec& s) { return s.heavy; },
     .set = [](CacheSpec& s, int v) { s.heavy = v; },
     .default_value = constant<8>,
     .default_text = "8",
     .valid = bounds<0>,
     .valid_text = "0 or more",
     .property = each_of<0, 4>,
     .property_text = "0..4"},
};

// ----------------------------------------------------------------------------------------------
// Building

void build_contiguous(const Config& c, ContiguousCache::Layout layout, Memory& memory, CacheAndPool& out) {
    out.cache = std::make_unique<ContiguousCache>(c, layout, memory);
}

void build_paged(const Config& c, const CacheSpec& s, bool prefix_caching, Memory& memory, const PoolMaker& make_pool,
                 CacheAndPool& out) {
    const int n_blocks = s.n_blocks ? s.n_blocks : ceil_blocks(c, s.block_size) + (prefix_caching ? 1 : 0);
    out.pool = make_pool ? make_pool(c, s.block_size, n_blocks, prefix_caching, memory)
                         : std::make_unique<BlockPool>(c, s.block_size, n_blocks, prefix_caching, memory);
    out.cache = std::make_unique<PagedCache>(*out.pool, s.model_identity, s.seq_id);
}

constexpr std::string_view kBitwise = "bitwise equal to naive decode at every step";

// The registry. Entries in Variant's order.
constexpr VariantInfo kVariantTable[] = {
    {.id = Variant::contiguous_head,
     .name = "contiguous-head",
     .alias = "contiguous",
     .summary = "one array per tensor, [n_layers][n_kv_heads][max_seq][head_size], reserved up front",
     .exact = true,
     .regime = kBitwise,
     .viewer = "one sequence, its arrays reserved for max_seq",
     .kv_formats = true,
     .build = [](const Config& c, const CacheSpec&, Memory& m, const PoolMaker&,
                 CacheAndPool& out) { build_contiguous(c, ContiguousCache::Layout::head_major, m, out); }},
    {.id = Variant::contiguous_seq,
     .name = "contiguous-seq",
     .summary = "[n_layers][max_seq][n_kv_heads][head_size] (llama2.c's), reserved up front",
     .exact = true,
     .regime = kBitwise,
     .kv_formats = true,
     .build = [](const Config& c, const CacheSpec&, Memory& m, const PoolMaker&,
                 CacheAndPool& out) { build_contiguous(c, ContiguousCache::Layout::seq_major, m, out); }},
    {.id = Variant::growing,
     .name = "growing",
     .summary = "head-major, capacity doubling on demand (counts moves and bytes copied)",
     .exact = true,
     .regime = kBitwise,
     .params = kGrowingParams,
     .kv_formats = true,
     .build = [](const Config& c, const CacheSpec& s, Memory& m, const PoolMaker&,
                 CacheAndPool& out) { out.cache = std::make_unique<GrowingCache>(c, s.initial_capacity, m); }},
    {.id = Variant::paged,
     .name = "paged",
     .summary = "blocks of block_size positions from a shared pool, one block table per sequence",
     .exact = true,
     .regime = kBitwise,
     .params = kPagedParams,
     .viewer = "one sequence over a block pool",
     .kv_formats = true,
     .build = [](const Config& c, const CacheSpec& s, Memory& m, const PoolMaker& p,
                 CacheAndPool& out) { build_paged(c, s, false, m, p, out); }},
    {.id = Variant::prefix_shared,
     .name = "prefix-shared",
     .summary = "paged; full blocks published under a hash chained over (parent hash, tokens, model identity) "
                "for later requests to map; LRU eviction",
     .exact = true,
     .regime = kBitwise,
     .params = kPrefixSharedParams,
     .viewer = "requests A and B with one prompt (B maps A's full blocks); A forks into C (copy-on-write)",
     .kv_formats = true,
     .build = [](const Config& c, const CacheSpec& s, Memory& m, const PoolMaker& p,
                 CacheAndPool& out) { build_paged(c, s, true, m, p, out); }},
    {.id = Variant::quantized,
     .name = "quantized",
     .summary = "int8 or int4 codes with a scale and zero point per group: keys per channel (KIVI) or per "
                "token, values per token",
     .exact = false,
     .regime = "never bitwise against fp32 decode: logits within the error bounds `kvlab verify quantized` "
               "states; bitwise equal to naive decode that rounds K and V the same way (`quantized-exact`)",
     .exact_up_to = [](const CacheSpec&) { return std::int64_t{0}; },
     .exact_limit = "0",
     .params = kQuantizedParams,
     .presets = kQuantizedPresets,
     .viewer = "one sequence, int8 or int4 codes",
     .build = [](const Config& c, const CacheSpec& s, Memory&, const PoolMaker&,
                 CacheAndPool& out) { out.cache = std::make_unique<QuantizedCache>(c, s.quant); }},
    {.id = Variant::window,
     .name = "window",
     .summary = "StreamingLLM: the first sinks positions plus the last window, in a ring",
     .exact = false,
     .regime = "exact while T <= sinks + window; approximate beyond (the positions between are evicted)",
     .exact_up_to = [](const CacheSpec& s) { return std::int64_t{s.sinks} + s.window; },
     .exact_limit = "sinks + window",
     .params = kWindowParams,
     .viewer = "one sequence; evicted rows shown in red",
     .kv_formats = true,
     .build = [](const Config& c, const CacheSpec& s, Memory& m, const PoolMaker&,
                 CacheAndPool& out) { out.cache = std::make_unique<WindowCache>(c, s.sinks, s.window, s.chunk, m); }},
    {.id = Variant::fifo,
     .name = "fifo",
     .summary = "the last window positions only, the oldest dropped first (a window without sinks)",
     .exact = false,
     .regime = "exact while T <= window; approximate beyond (every older position is evicted)",
     .exact_up_to = [](const CacheSpec& s) { return std::int64_t{s.window}; },
     .exact_limit = "window",
     .params = kFifoParams,
     .viewer = "one sequence; evicted rows shown in red",
     .kv_formats = true,
     .build = [](const Config& c, const CacheSpec& s, Memory& m, const PoolMaker&,
                 CacheAndPool& out) { out.cache = std::make_unique<FifoCache>(c, s.window, s.chunk, m); }},
    {.id = Variant::h2o,
     .name = "h2o",
     .summary = "heavy hitters: per layer and KV head, the recent positions plus the heavy ones with the most "
                "accumulated attention (lowest evicted, oldest on a tie)",
     .exact = false,
     .regime = "exact while T <= recent + heavy; approximate beyond (each layer and head evicts its lightest)",
     .exact_up_to = [](const CacheSpec& s) { return std::int64_t{s.recent} + s.heavy; },
     .exact_limit = "recent + heavy",
     .params = kH2OParams,
     .viewer = "one sequence; the positions each layer and KV head keeps, step by step",
     .kv_formats = true,
     .build = [](const Config& c, const CacheSpec& s, Memory& m, const PoolMaker&,
                 CacheAndPool& out) { out.cache = std::make_unique<H2OCache>(c, s.recent, s.heavy, m); }},
};

constexpr bool in_variant_order() {
    for (std::size_t i = 0; i < std::size(kVariantTable); i++)
        if (std::size_t(kVariantTable[i].id) != i) return false;
    return true;
}
static_assert(in_variant_order(), "kVariantTable's entries follow Variant's order");

std::vector<Variant> variants_if(auto&& keep) {
    std::vector<Variant> out;
    for (const VariantInfo& v : kVariantTable)
        if (keep(v)) out.push_back(v.id);
    return out;
}

int parse_int(std::string_view text, std::string_view what) {
    int value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || text.empty())
        throw Error(fmt::format("{}: '{}' is not an integer", what, text));
    return value;
}

}  // namespace

std::span<const VariantInfo> variant_table() { return kVariantTable; }

const VariantInfo& variant_info(Variant v) {
    const auto i = std::size_t(v);
    if (i >= std::size(kVariantTable) || kVariantTable[i].id != v)
        throw Error(fmt::format("variant {} has no registry entry", i));
    return kVariantTable[i];
}

std::string_view to_string(Variant v) { return variant_info(v).name; }

std::optional<Variant> parse_variant(std::string_view name) {
    for (const VariantInfo& v : kVariantTable)
        if (v.name == name || (!v.alias.empty() && v.alias == name)) return v.id;
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

bool is_exact(Variant v) { return variant_info(v).exact; }
std::vector<Variant> all_variants() {
    return variants_if([](const VariantInfo&) { return true; });
}
std::vector<Variant> exact_variants() {
    return variants_if([](const VariantInfo& v) { return v.exact; });
}
std::vector<Variant> viewer_variants() {
    return variants_if([](const VariantInfo& v) { return !v.viewer.empty(); });
}
std::vector<Variant> format_variants() {
    return variants_if([](const VariantInfo& v) { return v.kv_formats; });
}
std::vector<Variant> variants_with(std::string_view param) {
    return variants_if([&](const VariantInfo& v) { return find_param(v, param) != nullptr; });
}

std::string describe(const VariantInfo& v) {
    std::string s = fmt::format("{}: {}\n  {}: {}\n", v.name, v.summary, v.exact ? "exact" : "approximate", v.regime);
    for (const VariantParam& p : v.params)
        s += fmt::format("  {}: {}; default {}; valid {}; properties draw {}\n", p.name, p.meaning, p.default_text,
                         p.valid_text, p.property_text);
    for (const VariantPreset& p : v.presets)
        s += fmt::format("  preset {}: {} ({}); its row: {}-{}\n", p.label, p.about, p.settings, v.name, p.label);
    if (!v.viewer.empty()) s += fmt::format("  kvlab view: {}\n", v.viewer);
    return s;
}

std::string describe(const CacheSpec& spec) {
    const VariantInfo& v = variant_info(spec.variant);
    std::string s(v.name);
    for (std::size_t i = 0; i < v.params.size(); i++)
        s += fmt::format("{}{}={}", i ? "," : "(", v.params[i].name, v.params[i].get(spec));
    return v.params.empty() ? s : s + ")";
}

const VariantParam* find_param(const VariantInfo& v, std::string_view name) {
    for (const VariantParam& p : v.params)
        if (p.name == name) return &p;
    return nullptr;
}

CacheSpec default_spec(Variant v, const Config& config) {
    CacheSpec spec;
    spec.variant = v;
    for (const VariantParam& p : variant_info(v).params) p.set(spec, p.default_value(config));
    return spec;
}

void apply_settings(CacheSpec& spec, std::string_view settings) {
    const VariantInfo& v = variant_info(spec.variant);
    while (!settings.empty()) {
        const std::size_t comma = std::min(settings.find(','), settings.size());
        const std::string_view item = settings.substr(0, comma), name = item.substr(0, item.find('='));
        settings.remove_prefix(std::min(comma + 1, settings.size()));
        const VariantParam* p = find_param(v, name);
        if (!p || name.size() == item.size())
            throw Error(fmt::format("{}: '{}' is not one of its parameters set as name=value", v.name, item));
        p->set(spec, parse_int(item.substr(name.size() + 1), fmt::format("{} {}", v.name, name)));
    }
}

std::vector<VariantSetting> variant_settings(Variant v) {
    const VariantInfo& info = variant_info(v);
    if (info.presets.empty()) return {{std::string(info.name), v, nullptr}};
    std::vector<VariantSetting> out;
    for (const VariantPreset& p : info.presets) out.push_back({fmt::format("{}-{}", info.name, p.label), v, &p});
    return out;
}

std::vector<VariantSetting> variant_settings() {
    std::vector<VariantSetting> out;
    for (const VariantInfo& v : kVariantTable)
        for (VariantSetting& s : variant_settings(v.id)) out.push_back(std::move(s));
    return out;
}

CacheSpec setting_spec(const VariantSetting& s, const Config& config) {
    CacheSpec spec = default_spec(s.variant, config);
    if (s.preset) apply_settings(spec, s.preset->settings);
    return spec;
}

CacheAndPool make_cache(const Config& c, const CacheSpec& s, Memory& memory, const PoolMaker& make_pool) {
    const VariantInfo& info = variant_info(s.variant);
    // The registry's bounds first, one message for every parameter (the constructors check what
    // more a value needs, and what they share with callers that build caches themselves).
    for (const VariantParam& p : info.params) {
        const int value = p.get(s);
        const IntRange r = p.valid(c, s);
        if (value < r.lo && r.hi == kUnbounded)
            throw Error(
                fmt::format("{}: {} must be at least {} ({}), not {}", info.name, p.name, r.lo, p.valid_text, value));
        if (value < r.lo || value > r.hi)
            throw Error(
                fmt::format("{}: {} {} is outside [{}, {}] ({})", info.name, p.name, value, r.lo, r.hi, p.valid_text));
    }
    if ((s.kv_format != KVFormat::fp32 || !s.kv_scales.empty()) && !info.kv_formats)
        throw Error(fmt::format("{} stores K and V in its own way, not in a KV format ({} take one)", info.name,
                                variant_names(format_variants())));
    CacheAndPool out;
    info.build(c, s, memory, make_pool, out);
    if (s.kv_format != KVFormat::fp32 || !s.kv_scales.empty()) {
        if (out.pool) out.pool->set_kv_format(s.kv_format, s.kv_scales);
        out.cache->set_kv_format(s.kv_format, s.kv_scales);
    }
    out.cache->seq_id = s.seq_id;
    return out;
}

int default_quant_group(const Config& c) {
    int g = 1;
    for (int d = 1; d <= std::min({16, c.head_size(), c.max_seq}); d++)
        if (c.head_size() % d == 0) g = d;
    return g;
}

}  // namespace kvlab
