// kvlab core: planted bugs.
//
// Each mutant is a real way a KV cache goes wrong, compiled into the same decoders and caches as
// the correct code and switched on by a field (`mutant`) that is Mutant::none in normal use. The
// verification suite (verify.h) must catch every one of them: that is how we know it catches
// what it claims.
#pragma once

#include <array>
#include <string_view>

namespace kvlab {

enum class Mutant {
    none,
    mask_off_by_one,        // naive: the causal mask lets row i see position i + 1
    read_before_write,      // cached: attention runs before the step's K and V are written
    rope_decode_off,        // cached: decode steps rotate q and k at pos + 1
    kv_wrong_layer,         // cached: layer l writes its K and V into layer (l + 1) % n_layers
    gqa_modulo,             // cached: query head h reads KV head h % n_kv_heads, not h / group
    slot_wrong_block,       // paged: slot = pos % (block_size - 1) while block = pos / block_size
    stale_prefix,           // decoder: continues a cache that holds a different prefix
    hash_ignores_model,     // prefix cache: block hashes leave out the model's identity
    cow_no_copy,            // fork: a write into a shared partial block goes into the shared block
    batch_mixes_blocks,     // batch: sequence i attends through sequence i + 1's cache
    rollback_keeps_length,  // rollback: the rows are dropped but the length is not restored
    spec_rollback_short,    // speculative: after a rejection both caches keep one rejected draft row
};

struct MutantInfo {
    Mutant mutant;
    std::string_view name;
    std::string_view bug;
};

inline constexpr std::array<MutantInfo, 12> kMutants{{
    {Mutant::mask_off_by_one, "mask-off-by-one", "causal mask lets row i see position i+1"},
    {Mutant::read_before_write, "read-before-write", "attention reads before the step's K/V is written"},
    {Mutant::rope_decode_off, "rope-decode-off", "RoPE position off by one in decode"},
    {Mutant::kv_wrong_layer, "kv-wrong-layer", "K/V written into the next layer"},
    {Mutant::gqa_modulo, "gqa-modulo", "GQA maps head h to h % n_kv_heads instead of h / group"},
    {Mutant::slot_wrong_block, "slot-wrong-block", "slot computed with block_size - 1"},
    {Mutant::stale_prefix, "stale-prefix", "a stale cache reused after a prompt edit"},
    {Mutant::hash_ignores_model, "hash-ignores-model", "prefix hash ignores the model's identity"},
    {Mutant::cow_no_copy, "cow-no-copy", "copy-on-write does not copy a shared partial block"},
    {Mutant::batch_mixes_blocks, "batch-mixes-blocks", "a batch reads another sequence's blocks"},
    {Mutant::rollback_keeps_length, "rollback-keeps-length", "rollback forgets to restore the length"},
    {Mutant::spec_rollback_short, "spec-rollback-short", "speculative rollback one position short"},
}};

}  // namespace kvlab
