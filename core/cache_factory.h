// kvlab core: the cache variant registry, and the one place that builds caches.
//
// One table (kVariantTable in cache_factory.cpp), one entry per variant: its name, what it is,
// exact or approximate and when it is exact, its parameters (default, valid range, what a
// property test draws from), its presets, whether the viewer runs it, and how to build it.
// `kvlab bench` (its variant rows), `kvlab verify` (a row per variant and preset, `--list`),
// `kvlab view` (its variant list and labels), fuzz/fuzz_decode.cpp (the exact ones) and the
// variant table of docs/variants.md (tests/test_variants.cpp compares it) all read the table. Adding a
// variant is an enumerator in Variant plus an entry, and its Cache subclass.
//
// One vocabulary: the names below are the only ones, in every command, message and document.
// The prefix-caching variant is `prefix-shared` (the viewer's and its pictures' name), also in
// `kvlab verify`, whose check of it used to say `prefix`. A preset's verify and bench row is the
// variant's name, a dash and the preset's label: `quantized-int8-kivi`.
#pragma once

#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache.h"
#include "paged.h"
#include "quantized_cache.h"

namespace kvlab {

// One per registry entry, in its order (a test checks both).
enum class Variant { contiguous_head, contiguous_seq, growing, paged, prefix_shared, quantized, window, fifo, h2o };

// Each variant reads the fields it needs (its parameters in the registry).
struct CacheSpec {
    Variant variant = Variant::contiguous_head;
    int initial_capacity = 1;               // growing: positions before the first doubling
    int block_size = 16;                    // paged, prefix-shared: positions per block
    int n_blocks = 0;                       // paged, prefix-shared: blocks in the pool; 0 = one sequence's (registry)
    QuantSpec quant;                        // quantized
    int sinks = 4, window = 16, chunk = 0;  // window (window_cache.h); fifo: window
    int recent = 8, heavy = 8;              // h2o (h2o_cache.h)
    std::uint64_t model_identity = 0;       // paged, prefix-shared: the model's fingerprint (prefix hashes)
    int seq_id = 0;                         // names the sequence in events
    // Variants with kv_formats (VariantInfo): the format K and V are stored in, and its scales
    // ([n_layers, 2], read by fp8; empty: all 1). A paged variant's pool takes them.
    KVFormat kv_format = KVFormat::fp32;
    std::vector<float> kv_scales;
};

// A cache and, for the paged variants, the pool it draws from (declared first, so it outlives
// the cache).
struct CacheAndPool {
    std::unique_ptr<BlockPool> pool;
    std::unique_ptr<Cache> cache;
};

// Makes a paged variant's pool (BlockPool's constructor arguments); verify plants a wrong pool
// with it (proofs/planted.h). Empty: a BlockPool.
using PoolMaker = std::function<std::unique_ptr<BlockPool>(const Config&, int block_size, int n_blocks,
                                                           bool prefix_caching, Memory&)>;

struct IntRange {
    int lo, hi;  // inclusive; hi = kUnbounded: bounded only by memory (kMaxBytes)
};
inline constexpr int kUnbounded = INT_MAX;

struct VariantParam {
    std::string_view name;  // CacheSpec's field, by its glossary name
    std::string_view meaning;
    int (*get)(const CacheSpec&);
    void (*set)(CacheSpec&, int);
    int (*default_value)(const Config&);
    std::string_view default_text;
    // The bounds make_cache accepts, given the parameters before this one; valid_text says what
    // more a value inside them needs ("8 or 4", "divides head_size").
    IntRange (*valid)(const Config&, const CacheSpec&);
    std::string_view valid_text;
    // The values a property test draws from, given the parameters drawn before this one: small,
    // so that tiny models reach every case (a window's edge, a pool's last block).
    std::vector<int> (*property)(const Config&, const CacheSpec&);
    std::string_view property_text;
};

// Settings worth showing apart: bench measures each, verify checks each.
struct VariantPreset {
    std::string_view label;     // its rows are "<variant>-<label>"
    std::string_view settings;  // "bits=8,key_axis=1": parameters by name (apply_settings)
    std::string_view about;
};

struct VariantInfo {
    Variant id;
    std::string_view name;
    std::string_view alias = {};  // another name parse_variant accepts ("" when none)
    std::string_view summary;     // what it is, one line
    bool exact;                   // bitwise equal to naive decode at every step
    std::string_view regime;      // in words: where it is exact, and what it promises beyond
    // Approximate: the longest T (positions) at which the logits are still bitwise exact, and
    // that bound in the parameters' names ("sinks + window"); verify checks both sides of it.
    std::int64_t (*exact_up_to)(const CacheSpec&) = nullptr;
    std::string_view exact_limit = {};
    std::span<const VariantParam> params = {};
    std::span<const VariantPreset> presets = {};  // empty: the defaults are its one setting
    std::string_view viewer = {};                 // what `kvlab view` runs with it; "" when it does not
    bool kv_formats = false;                      // stores K and V in any KV format (CacheSpec::kv_format)
    void (*build)(const Config&, const CacheSpec&, Memory&, const PoolMaker&, CacheAndPool&);
};

std::span<const VariantInfo> variant_table();
const VariantInfo& variant_info(Variant v);
std::string_view to_string(Variant v);
// A name in the table (or an alias), else none.
std::optional<Variant> parse_variant(std::string_view name);
// "a, b or c": the names of `variants`, for an error message or a --help line.
std::string variant_names(std::span<const Variant> variants);
bool is_exact(Variant v);
std::vector<Variant> all_variants();
std::vector<Variant> exact_variants();
std::vector<Variant> viewer_variants();  // in the table's order: the viewer's variant list
std::vector<Variant> format_variants();  // those with kv_formats
// The variants with a parameter of this name ("block_size": paged, prefix-shared).
std::vector<Variant> variants_with(std::string_view param);
// Several lines: summary, regime, and each parameter with its default, valid range and what
// properties draw.
std::string describe(const VariantInfo& v);

// "window(sinks=1,window=2,chunk=0)": the spec's variant and its parameters.
std::string describe(const CacheSpec& spec);

// The parameter of `v` called `name`, or null.
const VariantParam* find_param(const VariantInfo& v, std::string_view name);
// A spec of `v` with every parameter at its default for `config`.
CacheSpec default_spec(Variant v, const Config& config);
// Sets "name=value,..." on spec (its variant's parameters); throws Error naming the first
// parameter the variant lacks or a value that is not an integer.
void apply_settings(CacheSpec& spec, std::string_view settings);

// One variant at one preset, or at its defaults when it has none: a row of bench and verify.
struct VariantSetting {
    std::string name;  // the variant's name, or "<variant>-<label>"
    Variant variant;
    const VariantPreset* preset;  // null: the defaults
};
std::vector<VariantSetting> variant_settings();  // every variant's, in the table's order
std::vector<VariantSetting> variant_settings(Variant v);
CacheSpec setting_spec(const VariantSetting& s, const Config& config);

// Builds the spec's variant. Throws Error for a parameter outside the registry's bounds, and the
// constructors for what more a value needs (a group that does not divide head_size).
CacheAndPool make_cache(const Config& config, const CacheSpec& spec, Memory& memory = host_memory(),
                        const PoolMaker& make_pool = {});

// The quantization group kvlab uses by default: the largest divisor of head_size up to 16 and
// up to max_seq (a per-channel group spans that many positions).
int default_quant_group(const Config& config);

}  // namespace kvlab
