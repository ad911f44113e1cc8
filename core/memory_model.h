// kvlab core: how much memory a KV cache takes for published model shapes, and how much of a
// reservation is wasted when every request reserves max_seq positions (contiguous) versus
// block_size-token pages (paged). Pure integer arithmetic: no model is built, nothing is allocated.
//
// Glossary as in config.h, plus:
//   bits        storage per cached element (fp16: 16; int4: 4)
//   block_size  positions per page of a paged cache
//   mla_latent  Multi-head Latent Attention: width of the one compressed KV vector cached per token
//               and layer (DeepSeek's kv_lora_rank), shared by all heads
//   mla_rope    MLA: width of the one RoPE key cached beside the latent (qk_rope_head_dim)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config.h"

namespace kvlab {

struct PublishedShape {
    std::string name;
    int n_layers = 0, n_heads = 0, n_kv_heads = 0, head_size = 0;
    // mla_latent > 0: the cache holds mla_latent + mla_rope elements per token and layer, with no
    // per-head K and no separate V (n_kv_heads and head_size are then informational only).
    int mla_latent = 0, mla_rope = 0;
    std::string source;  // where the figures come from, one line
};

// Llama 2 7B, Llama 3 8B, Llama 3 70B, Mistral 7B, GPT-3 175B, DeepSeek-V3, in that order.
const std::vector<PublishedShape>& published_shapes();

// Case-insensitive, ignoring spaces, dashes and underscores: "llama2-7b" finds "Llama 2 7B".
// An unknown name is an Error listing the valid ones.
const PublishedShape& find_shape(const std::string& name);

struct Precision {
    std::string name;
    int bits;
};

// fp32, fp16, fp8, int4, int2 (bf16 is accepted by parse_precision as fp16's 16 bits).
const std::vector<Precision>& precisions();

// Case-insensitive; "bf16" gives {"bf16", 16}. An unknown name is an Error listing the valid ones.
Precision parse_precision(const std::string& name);

// Bits one token adds to the cache, summed over layers: exact for every shape and precision.
// Standard attention: 2 (K and V) * n_layers * n_kv_heads * head_size * bits.
// MLA:                n_layers * (mla_latent + mla_rope) * bits.
// Throws Error for a shape with a non-positive field or bits < 1.
std::int64_t kv_bits_per_token(const PublishedShape& s, int bits);

// Bytes of KV cache for `batch` sequences of `context` tokens: kv_bits_per_token * context * batch / 8,
// rounded up to a whole byte (only an odd toy shape at int2/int4 ever rounds; every published shape is
// exact). Errors: context < 1, batch < 1, or a total past int64.
std::int64_t kv_bytes(const PublishedShape& s, int bits, std::int64_t context, std::int64_t batch);

// kv_bytes for a single token of a single sequence.
inline std::int64_t kv_bytes_per_token(const PublishedShape& s, int bits) { return kv_bytes(s, bits, 1, 1); }

// Positions (tokens) reserved and used by a set of requests, contiguous versus paged.
struct ReservationWaste {
    std::int64_t n_requests = 0;
    int min_len = 0, max_len = 0;
    std::int64_t used = 0;                 // sum of the lengths
    std::int64_t contiguous_reserved = 0;  // n_requests * max_seq
    std::int64_t paged_reserved = 0;       // sum of ceil(len / block_size) * block_size
    double contiguous_waste_fraction = 0;  // 1 - used / contiguous_reserved
    double paged_waste_fraction = 0;       // 1 - used / paged_reserved
    double mean_len() const { return double(used) / double(n_requests); }
};

// Every request reserves max_seq positions up front (contiguous), or whole pages of block_size
// positions as it grows (paged). Errors: empty `lengths`, max_seq < 1, block_size < 1, a length
// outside [1, max_seq].
ReservationWaste reservation_waste(const std::vector<int>& lengths, int max_seq, int block_size);

// n request lengths drawn uniformly from [min_len, max_len] with splitmix64 seeded by `seed`: the same
// list on every platform and compiler. Errors: n < 1, min_len < 1, max_len < min_len.
std::vector<int> spread_lengths(int n, int min_len, int max_len, std::uint64_t seed);

}  // namespace kvlab
