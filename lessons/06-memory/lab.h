// Lab 6: memory. You write how many bytes a KV cache takes under multi-head (MHA), grouped-query
// (GQA), multi-query (MQA) and multi-head latent (MLA) attention, and which KV head each query
// head reads under GQA; the grader holds your numbers against `kvlab memory`'s table and runs
// kvlab's real decoders with your head map.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memory_model.h"

namespace kvlab::lab06 {

// "MLA" when s.mla_latent > 0; otherwise "MHA" when every query head has its own KV head
// (n_kv_heads == n_heads), "MQA" when all share one (n_kv_heads == 1), "GQA" in between.
std::string attention_kind(const PublishedShape& s);

// Bits one token adds to the cache, summed over all layers, at `bits` per stored element
// (fp16: 16, int4: 4). MHA, GQA and MQA cache a K row and a V row of head_size elements per KV
// head per layer; MLA caches one latent of mla_latent elements plus one RoPE key of mla_rope
// elements per layer, shared by all heads (n_kv_heads and head_size then say nothing).
std::int64_t bits_per_token(const PublishedShape& s, int bits);

// Bytes of cache for `batch` sequences of `context` tokens each, rounded up to a whole byte.
// context, batch >= 1; the result fits int64 for every published model up to 2^24 tokens x 2^20
// sequences at fp32.
std::int64_t cache_bytes(const PublishedShape& s, int bits, std::int64_t context, std::int64_t batch);

// GQA: the KV head each of n_heads query heads reads, [n_heads]. n_kv_heads divides n_heads;
// each KV head serves a group of n_heads / n_kv_heads consecutive query heads.
std::vector<int> kv_head_map(int n_heads, int n_kv_heads);

}  // namespace kvlab::lab06
