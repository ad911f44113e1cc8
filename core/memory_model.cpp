#include "memory_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <limits>

#include "model.h"

namespace kvlab {

namespace {

// Lower case without spaces, dashes or underscores, so "Llama-2 7b" and "llama2_7B" compare equal.
std::string normalized(const std::string& name) {
    std::string out;
    for (char ch : name)
        if (ch != ' ' && ch != '-' && ch != '_') out += char(std::tolower(static_cast<unsigned char>(ch)));
    return out;
}

// a * b, or an Error when the product leaves int64 (both are non-negative here). The caller knows
// which of its inputs made it too big, and says so (kvlab memory names the option).
std::int64_t checked_mul(std::int64_t a, std::int64_t b) {
    if (a != 0 && b > std::numeric_limits<std::int64_t>::max() / a)
        throw Error(fmt::format("memory: {} x {} bits does not fit in a 64-bit count", a, b));
    return a * b;
}

}  // namespace

const std::vector<PublishedShape>& published_shapes() {
    static const std::vector<PublishedShape> shapes = {
        {"Llama 2 7B", 32, 32, 32, 128, 0, 0, "Touvron et al. 2023, Llama 2 (arXiv:2307.09288); Llama-2-7b-hf config"},
        {"Llama 3 8B", 32, 32, 8, 128, 0, 0, "Meta-Llama-3-8B config.json (hidden 4096, 32 heads, 8 KV heads)"},
        {"Llama 3 70B", 80, 64, 8, 128, 0, 0, "Meta-Llama-3-70B config.json (hidden 8192, 64 heads, 8 KV heads)"},
        {"Mistral 7B", 32, 32, 8, 128, 0, 0, "Jiang et al. 2023, Mistral 7B (arXiv:2310.06825), Table 1"},
        {"GPT-3 175B", 96, 96, 96, 128, 0, 0, "Brown et al. 2020, GPT-3 (arXiv:2005.14165), Table 2.1"},
        // n_kv_heads and head_size (qk_nope_head_dim) are what MLA expands the latent into; not cached.
        {"DeepSeek-V3", 61, 128, 128, 128, 512, 64,
         "DeepSeek-V3 config.json: kv_lora_rank 512, qk_rope_head_dim 64 (arXiv:2412.19437)"},
    };
    return shapes;
}

const PublishedShape& find_shape(const std::string& name) {
    const std::string key = normalized(name);
    std::string valid;
    for (const auto& s : published_shapes()) {
        if (!key.empty() && normalized(s.name) == key) return s;
        valid += (valid.empty() ? "" : ", ") + s.name;
    }
    throw Error(fmt::format("unknown model '{}' (models: {})", one_line(name), valid));
}

const std::vector<Precision>& precisions() {
    static const std::vector<Precision> list = {{"fp32", 32}, {"fp16", 16}, {"fp8", 8}, {"int4", 4}, {"int2", 2}};
    return list;
}

Precision parse_precision(const std::string& name) {
    const std::string key = normalized(name);
    if (key == "bf16") return {"bf16", 16};  // same storage as fp16, different number format
    if (key == "fp8e4m3") return {"fp8-e4m3", 8};  // kvlab's KV format names (--kv-format)
    if (key == "fp8e5m2") return {"fp8-e5m2", 8};
    if (key == "int8") return {"int8", 8};  // kvlab's int8 format (its group scales excluded, as int4's)
    for (const auto& p : precisions())
        if (p.name == key) return p;
    throw Error(
        fmt::format("unknown precision '{}' (precisions: fp32, fp16, bf16, fp8, fp8-e4m3, fp8-e5m2, int8, int4, int2)",
                    one_line(name)));
}

std::int64_t kv_bits_per_token(const PublishedShape& s, int bits) {
    if (bits < 1) throw Error(fmt::format("memory: bits must be positive, got {}", bits));
    if (s.n_layers < 1) throw Error(fmt::format("memory: {}: n_layers must be positive", one_line(s.name)));
    // Integer bits, divided by 8 only in kv_bytes: int4 and int2 stay exact. This is the payload only:
    // the per-group scales (and zero points) that real int4/int2 caches store beside it are excluded.
    if (s.mla_latent > 0) {
        if (s.mla_rope < 0) throw Error(fmt::format("memory: {}: mla_rope must be >= 0", one_line(s.name)));
        // One latent plus one shared RoPE key per token and layer; K and V of every head come from it.
        return std::int64_t{s.n_layers} * (std::int64_t{s.mla_latent} + s.mla_rope) * bits;
    }
    if (s.n_kv_heads < 1 || s.head_size < 1)
        throw Error(fmt::format("memory: {}: n_kv_heads and head_size must be positive", one_line(s.name)));
    return 2 * std::int64_t{s.n_layers} * s.n_kv_heads * s.head_size * bits;  // 2: K and V
}

std::int64_t kv_bytes(const PublishedShape& s, int bits, std::int64_t context, std::int64_t batch) {
    if (context < 1) throw Error(fmt::format("memory: context must be at least 1 token, got {}", context));
    if (batch < 1) throw Error(fmt::format("memory: batch must be at least 1 sequence, got {}", batch));
    const std::int64_t total_bits = checked_mul(checked_mul(kv_bits_per_token(s, bits), context), batch);
    return total_bits / 8 + (total_bits % 8 != 0);
}

ReservationWaste reservation_waste(const std::vector<int>& lengths, int max_seq, int block_size) {
    if (lengths.empty()) throw Error("memory: no request lengths given");
    if (max_seq < 1) throw Error(fmt::format("memory: max_seq (the context) must be at least 1, got {}", max_seq));
    if (block_size < 1) throw Error(fmt::format("memory: block_size must be at least 1, got {}", block_size));
    ReservationWaste w;
    w.n_requests = std::int64_t(lengths.size());
    w.min_len = lengths[0];
    w.max_len = lengths[0];
    for (int len : lengths) {
        if (len < 1 || len > max_seq)
            throw Error(fmt::format("memory: request length {} is outside [1, max_seq = {}]", len, max_seq));
        w.min_len = std::min(w.min_len, len);
        w.max_len = std::max(w.max_len, len);
        w.used += len;
        // A paged cache holds whole blocks: the last one is partly empty.
        w.paged_reserved += (std::int64_t{len} + block_size - 1) / block_size * block_size;
    }
    w.contiguous_reserved = w.n_requests * max_seq;
    w.contiguous_waste_fraction = 1.0 - double(w.used) / double(w.contiguous_reserved);
    w.paged_waste_fraction = 1.0 - double(w.used) / double(w.paged_reserved);
    return w;
}

std::vector<int> spread_lengths(int n, int min_len, int max_len, std::uint64_t seed) {
    if (n < 1) throw Error(fmt::format("memory: need at least 1 request, got {}", n));
    if (min_len < 1 || max_len < min_len)
        throw Error(
            fmt::format("memory: request lengths [{}, {}] are not a range of positive lengths", min_len, max_len));
    const std::uint64_t range = std::uint64_t(max_len) - std::uint64_t(min_len) + 1;
    // Draws below 2^64 mod range are rejected, so that every length is exactly equally likely.
    const std::uint64_t reject_below = (std::uint64_t{0} - range) % range;
    // splitmix64, not std::uniform_int_distribution (which differs between standard libraries):
    // the spread depends on nothing but the seed.
    SplitMix64 rng(seed);
    std::vector<int> lengths(n);
    for (int& len : lengths) {
        std::uint64_t x = rng.next();
        while (x < reject_below) x = rng.next();
        len = min_len + int(x % range);
    }
    return lengths;
}

}  // namespace kvlab
