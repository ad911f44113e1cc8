// Lab 6: KV-cache memory under MHA, GQA, MQA and MLA, and GQA's head map. Fill in the four TODOs;
// `lessons/grade 6` grades this file.
//
// A PublishedShape (core/memory_model.h) is one model's attention shape:
//   n_layers, n_heads (query heads), n_kv_heads, head_size        every kind
//   mla_latent, mla_rope                                          MLA only (0 otherwise)
// `kvlab memory` prints the table the grader holds your numbers against.
#include "grader.h"
#include "lab.h"

namespace kvlab::lab06 {

// TODO 1: which kind of attention the shape is: "MHA", "GQA", "MQA" or "MLA" (lab.h).
std::string attention_kind(const PublishedShape& s) {
    (void)s;
    throw lessons::NotImplemented("attention_kind");
}

// TODO 2: the bits one token adds to the cache, all layers together. What does each layer store
// for the new token, for each kind? Count in int64: GPT-3 at fp32 is already 2^22 bits a token.
std::int64_t bits_per_token(const PublishedShape& s, int bits) {
    (void)s, (void)bits;
    throw lessons::NotImplemented("bits_per_token");
}

// TODO 3: bytes for `batch` sequences of `context` tokens, rounded up to a whole byte (an odd
// shape at int4 or int2 can end mid-byte; round once, at the end).
std::int64_t cache_bytes(const PublishedShape& s, int bits, std::int64_t context, std::int64_t batch) {
    (void)s, (void)bits, (void)context, (void)batch;
    throw lessons::NotImplemented("cache_bytes");
}

// TODO 4: the KV head each query head reads, [n_heads]. The grader plugs this map into kvlab's
// cached attention (query head h reads KV head map[h]) and compares with naive decode, bit for
// bit: the model's weights were trained with a definite grouping, so only one map is right.
std::vector<int> kv_head_map(int n_heads, int n_kv_heads) {
    (void)n_heads, (void)n_kv_heads;
    throw lessons::NotImplemented("kv_head_map");
}

}  // namespace kvlab::lab06
