// kvlab proofs: planted bugs (mutants), each a real way a KV cache goes wrong, put into a decode
// from the outside. Nothing in core or gpu knows about them: each is a decorator over a product
// interface that kvlab's own code also uses.
//
//   backend decorator  (forwarding.h: ForwardingBackend) naive or cached decode runs its kernels
//                      through it: mask-off-by-one, read-before-write, kv-wrong-layer,
//                      fp8-scale-twice, bf16-truncates, fp16-overflow-inf,
//                      split-kv-from-length, key-tile-from-rows, extend-splits-prefix,
//                      norm-split-at-256, split-from-batch
//   plan transform     (decode.h: CachedDecoder::transform) edits a step's plan before it runs:
//                      rope-decode-off, gqa-modulo, batch-mixes-blocks
//   cache wrapper      (forwarding.h: ForwardingCache) stale-prefix, rollback-keeps-length,
//                      spec-rollback-short
//   log-probability    (kernels.h: token_logprob) the rescoring path's: logprob-unfused
//   pool override      (paged.h: BlockPool's slot, needs_copy, key, set_kv_format, check_record)
//                      slot-wrong-block, cow-no-copy, hash-ignores-model, prefix-keeps-format,
//                      store-unchecked
//   swap transform     (scheduler.h: Scheduler::swap_transform) swap-in-shifted
//   parent transform   (beam.h: BeamSearch::parent_transform) beam-wrong-parent
//
// The verification suite (verify.h) runs each with the check named in kMutants, and the check
// must fail: that is how we know it catches what it claims. A new planted bug is one entry in
// kMutants plus its decorator here.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string_view>

#include "backend.h"
#include "cache.h"
#include "cpu_backend.h"  // causal_attention on any product
#include "decode.h"
#include "forwarding.h"
#include "model.h"
#include "paged.h"
#include "scheduler.h"

namespace kvlab {

enum class Mutant {
    none,
    mask_off_by_one,        // naive: the causal mask lets row i see position i + 1
    read_before_write,      // cached: attention runs before the step's K and V are written
    rope_decode_off,        // cached: decode steps rotate q and k at pos + 1
    kv_wrong_layer,         // cached: layer l writes its K and V into layer (l + 1) % n_layers
    gqa_modulo,             // cached: query head h reads KV head h % n_kv_heads, not h / group
    slot_wrong_block,       // paged: the row inside a block is taken modulo block_size - 1
    stale_prefix,           // a cache that forgets its tokens is continued with an edited prompt
    hash_ignores_model,     // prefix cache: block keys leave out the model's identity
    cow_no_copy,            // fork: a write into a shared partial block goes into the shared block
    batch_mixes_blocks,     // batch: sequence i attends through sequence i + 1's slots
    rollback_keeps_length,  // rollback: the rows are dropped but the length is not restored
    spec_rollback_short,    // speculative: a rollback past rejected drafts keeps one of their rows
    fp8_scale_twice,        // fp8 cache: the store divides by the layer's scale twice
    bf16_truncates,         // bf16 cache: the store truncates to 16 bits instead of rounding
    fp16_overflow_inf,      // fp16 cache: a finite value past 65504 is stored as infinity
    prefix_keeps_format,    // prefix cache: a pool switched to another format keeps its cached blocks
    int_scale_prev_block,   // int8/int4 paged cache: a block's first row gets the previous block's group scales
    chunk_boundary_rope,    // a prefill chunk after the first rotates its first row at the previous position
    split_kv_from_length,   // tiled decode: the key tile is a quarter of the KV length (four splits)
    key_tile_from_rows,     // tiled: a step of several rows runs twice the key tile of a one-row step
    extend_splits_prefix,   // a multi-row step after cached rows (an extend) splits its softmax at the prefix
    logprob_unfused,        // rescoring takes log(softmax(x)[token]); decode took the fused log-softmax
    norm_split_at_256,      // cached: rmsnorm of a step of 256 rows or more sums its squares in two halves
    split_from_batch,       // cached: a step of two or more sequences sums every product's k in two halves
    swap_in_shifted,        // scheduler: a swapped-out request's rows come back one position late
    beam_wrong_parent,      // beam search: a continuation forks the beam after its parent
    store_unchecked,        // prefix store: a record of the right length is used without its checksum or identity
};

struct MutantInfo {
    Mutant mutant;
    std::string_view name;
    std::string_view bug;
    std::string_view check;  // the verify check that must catch it (verify.cpp)
    bool long_only = false;  // its threshold lies past the fast profile: `kvlab verify --profile long` catches it
};

inline constexpr std::array<MutantInfo, 27> kMutants{{
    {Mutant::mask_off_by_one, "mask-off-by-one", "causal mask lets row i see position i+1", "contiguous-head"},
    {Mutant::read_before_write, "read-before-write", "attention reads before the step's K/V is written",
     "contiguous-head"},
    {Mutant::rope_decode_off, "rope-decode-off", "RoPE position off by one in decode", "contiguous-head"},
    {Mutant::kv_wrong_layer, "kv-wrong-layer", "K/V written into the next layer", "contiguous-head"},
    {Mutant::gqa_modulo, "gqa-modulo", "GQA maps head h to h % n_kv_heads instead of h / group", "contiguous-head"},
    {Mutant::slot_wrong_block, "slot-wrong-block", "slot computed with block_size - 1", "paged"},
    {Mutant::stale_prefix, "stale-prefix", "a stale cache reused after a prompt edit", "stale"},
    {Mutant::hash_ignores_model, "hash-ignores-model", "prefix hash ignores the model's identity", "prefix-shared"},
    {Mutant::cow_no_copy, "cow-no-copy", "copy-on-write does not copy a shared partial block", "fork"},
    {Mutant::batch_mixes_blocks, "batch-mixes-blocks", "a batch reads another sequence's blocks", "batch"},
    {Mutant::rollback_keeps_length, "rollback-keeps-length", "rollback forgets to restore the length", "rollback"},
    {Mutant::spec_rollback_short, "spec-rollback-short", "speculative rollback one position short", "speculate"},
    {Mutant::fp8_scale_twice, "fp8-scale-twice", "fp8 store divides by the scale twice", "format-fp8-e4m3"},
    {Mutant::bf16_truncates, "bf16-truncates", "fp32 to bf16 truncates instead of rounding", "format-bf16"},
    {Mutant::fp16_overflow_inf, "fp16-overflow-inf", "fp16 overflow stored as infinity, not saturated", "format-fp16"},
    {Mutant::prefix_keeps_format, "prefix-keeps-format",
     "a prefix hit maps blocks written in another KV format (a format switch keeps the prefix cache)", "format-switch"},
    {Mutant::int_scale_prev_block, "int-scale-prev-block",
     "a paged block's first row gets the previous block's group scales (int8, int4)", "format-int8"},
    {Mutant::chunk_boundary_rope, "chunk-boundary-rope",
     "a prefill chunk after the first rotates its first row at the previous position (the boundary row repeated)",
     "chunked-prefill"},
    {Mutant::split_kv_from_length, "split-kv-from-length",
     "split-KV decode with a fixed split count: the key tiles follow the KV length", "tiled-attention"},
    {Mutant::key_tile_from_rows, "key-tile-from-rows",
     "the key tile follows the query row count: prefill tiles twice as wide as decode's", "tiled-attention"},
    {Mutant::extend_splits_prefix, "extend-splits-prefix",
     "an extend after a prefix hit runs another kernel than cold prefill: its softmax split at the cached prefix",
     "prefix-hit-extend"},
    {Mutant::logprob_unfused, "logprob-unfused",
     "rescoring computes log(softmax(x)) where decode computed a fused log-softmax", "rescoring"},
    {Mutant::norm_split_at_256, "norm-split-at-256",
     "rmsnorm switches its reduction at 256 rows: a long prefill differs from decoding it (long profile)",
     "chunked-prefill", true},
    {Mutant::split_from_batch, "split-from-batch",
     "a product's reduction split chosen from the batch size: a sequence batched differs from it alone", "batch"},
    {Mutant::swap_in_shifted, "swap-in-shifted",
     "a preempted request's swapped rows are restored one position late (position t gets t - 1's rows)", "serve"},
    {Mutant::beam_wrong_parent, "beam-wrong-parent",
     "a beam's continuation forks the cache of the next beam instead of its own", "beam"},
    {Mutant::store_unchecked, "store-unchecked",
     "the pool restores a store's record of the right length without checking its checksum, model, format or "
     "block",
     "store"},
}};

// The decorators. Each returns nullptr (or an empty function) when the bug is not of its kind,
// and a decorator returned refers to `inner`, which must outlive it.
// Naive decode's backend (mask-off-by-one).
std::unique_ptr<Backend> planted_naive_backend(Mutant m, Backend& inner);
// Cached decode's backend (read-before-write, kv-wrong-layer, the KV format bugs, the tiled
// attention bugs, and norm-split-at-256 and split-from-batch, which compute with `model`'s weights).
std::unique_ptr<Backend> planted_cached_backend(Mutant m, Backend& inner, const Model& model);
// A cached decoder's plan transform (rope-decode-off, gqa-modulo, batch-mixes-blocks,
// chunk-boundary-rope; split-from-batch notes the step's batch size for its backend).
std::function<void(StepPlan&)> planted_transform(Mutant m);
// A cache of any variant (stale-prefix, rollback-keeps-length, spec-rollback-short,
// int-scale-prev-block).
std::unique_ptr<Cache> planted_cache(Mutant m, Cache& inner);
// The log-probability a rescoring computes from a row of logits (kernels.h token_logprob; for
// logprob-unfused the log of the rounded probability).
using LogprobFn = float (*)(const float* logits, int n, int token);
LogprobFn planted_logprob(Mutant m);
// A block pool: planted for slot-wrong-block, cow-no-copy, hash-ignores-model, prefix-keeps-format
// and store-unchecked, a correct BlockPool otherwise (the constructor's arguments are BlockPool's).
std::unique_ptr<BlockPool> planted_pool(Mutant m, const Config& config, int block_size, int n_blocks,
                                        bool prefix_caching = false, Memory& memory = host_memory());
// The scheduler's swap transform (scheduler.h: Scheduler::swap_transform; swap-in-shifted), or
// empty.
SwapTransform planted_swap(Mutant m);
// Beam search's parent transform (beam.h: BeamSearch::parent_transform; beam-wrong-parent), or empty.
std::function<int(int, int)> planted_beam_parent(Mutant m);

// Products on `mm` instead of the backend's kernels: the weights' (on [in][out] copies of the model's
// arrays), and with Products::all both of naive attention's too (cpu_backend.h: causal_attention;
// the inner backend's attention otherwise). Counter-tests plant an order-changing product this
// way; a lab grader runs a student's product. Host memory only. Owns `inner` when given it as a
// unique_ptr.
class ProductBackend : public ForwardingBackend {
public:
    enum class Products { weights, all };
    ProductBackend(Backend& inner, const Model& model, MatmulFn mm, Products products = Products::all);
    ProductBackend(std::unique_ptr<Backend> inner, const Model& model, MatmulFn mm, Products products = Products::all);
    void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) override;
    void causal_attention(Exec& ex, float* att, const float* q, const float* k, const float* v, int T,
                          const int* kv_head) override;

private:
    std::unique_ptr<Backend> own_;
    const Model& model_;
    MatmulFn mm_;
    Products products_;
    NaiveAttentionScratch scratch_;
};

}  // namespace kvlab
