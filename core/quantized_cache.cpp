#include "quantized_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

namespace kvlab {

namespace {

constexpr float kPoison = kNaN;

}  // namespace

void QuantizedCache::put_code(std::uint8_t* codes, int i, unsigned code, int bits) {
    if (bits == 8) {
        codes[i] = std::uint8_t(code);
        return;
    }
    std::uint8_t& byte = codes[i / 2];
    byte = (i % 2 == 0) ? std::uint8_t((byte & 0xf0u) | (code & 0x0fu)) : std::uint8_t((byte & 0x0fu) | (code << 4));
}

unsigned QuantizedCache::get_code(const std::uint8_t* codes, int i, int bits) {
    if (bits == 8) return codes[i];
    return (i % 2 == 0) ? (codes[i / 2] & 0x0fu) : (codes[i / 2] >> 4);
}

QuantizedCache::QuantizedCache(const Config& config, QuantSpec spec) : Cache(config), spec_(spec) {
    const Config& c = config_;
    const int hs = c.head_size(), g = spec_.group;
    if (spec_.bits != 8 && spec_.bits != 4)
        throw Error(fmt::format("quantized cache: bits must be 8 or 4, not {}", spec_.bits));
    if (g < 1) throw Error(fmt::format("quantized cache: quantization group must be positive, not {}", g));
    // Values are always quantized per token, so the group must tile a head's row.
    if (hs % g != 0) throw Error(fmt::format("quantization group {} does not divide head_size {}", g, hs));
    if (per_channel_keys() && g > c.max_seq)
        throw Error(fmt::format("quantization group {} of per-channel keys exceeds max_seq {}", g, c.max_seq));

    row_bytes_ = (hs * spec_.bits + 7) / 8;
    token_groups_ = hs / g;
    channel_groups_ = per_channel_keys() ? c.max_seq / g : 0;
    const std::size_t rows = std::size_t(c.n_layers) * c.n_kv_heads * c.max_seq, heads = rows / c.max_seq;
    // The float mirror and the codes, before any of it is allocated (the scales are smaller still).
    check_size(fmt::format("a quantized cache ({} rows of head_size {})", rows, hs), std::int64_t(rows),
               2 * (std::int64_t(sizeof(float)) * hs + row_bytes_));
    k_codes_.assign(rows * row_bytes_, 0);
    v_codes_.assign(rows * row_bytes_, 0);
    v_scales_.assign(rows * token_groups_, kPoison);
    v_mins_.assign(rows * token_groups_, kPoison);
    const std::size_t k_meta = per_channel_keys() ? heads * channel_groups_ * hs : rows * token_groups_;
    k_scales_.assign(k_meta, kPoison);
    k_mins_.assign(k_meta, kPoison);
    k_residual_.assign(per_channel_keys() ? heads * (g - 1) * hs : 0, kPoison);
    mirror_ = KVStorage(host_memory(), std::int64_t(rows), hs, std::int64_t(c.n_kv_heads) * c.max_seq, c.max_seq);
    k_mirror_ = mirror_.k_f32();
    v_mirror_ = mirror_.v_f32();
    key_rows_.assign(c.n_layers, 0);
    assert(k_codes_.size() == rows * row_bytes_ && v_codes_.size() == rows * row_bytes_);
    assert(v_scales_.size() == rows * token_groups_ && k_scales_.size() == k_meta && k_mins_.size() == k_meta);
    assert(k_residual_.size() == (per_channel_keys() ? heads * (g - 1) * hs : 0));
    assert(mirror_.n_rows == std::int64_t(rows) && mirror_.head_size == hs);
}

void QuantizedCache::reserve(int new_length) { assert(new_length <= config_.max_seq); }

void QuantizedCache::quantize_row(const float* x, std::int64_t r, std::vector<std::uint8_t>& codes,
                                  std::vector<float>& scales, std::vector<float>& mins, float* mirror) {
    const int hs = config_.head_size(), g = spec_.group;
    std::uint8_t* code_row = codes.data() + r * row_bytes_;
    float* out = mirror + r * hs;
    for (int gi = 0; gi < token_groups_; gi++) {
        const QuantRange range = quant_fit(x + gi * g, g, 1, spec_.bits);
        scales[r * token_groups_ + gi] = range.scale;
        mins[r * token_groups_ + gi] = range.min;
        for (int d = gi * g; d < (gi + 1) * g; d++) {
            const unsigned code = quant_encode(x[d], range, spec_.bits);
            put_code(code_row, d, code, spec_.bits);
            out[d] = quant_decode(get_code(code_row, d, spec_.bits), range);
        }
    }
}

void QuantizedCache::quantize_key_group(int l, int h, int gi, const float* rows) {
    const int hs = config_.head_size(), g = spec_.group;
    const std::int64_t meta = ((std::int64_t(l) * config_.n_kv_heads + h) * channel_groups_ + gi) * hs;
    for (int d = 0; d < hs; d++) {
        // Channel d over the group's positions: rows is [group, head_size], so stride head_size.
        const QuantRange range = quant_fit(rows + d, g, hs, spec_.bits);
        k_scales_[meta + d] = range.scale;
        k_mins_[meta + d] = range.min;
        for (int i = 0; i < g; i++) {
            const std::int64_t r = row_index(l, h, gi * g + i);
            std::uint8_t* code_row = k_codes_.data() + r * row_bytes_;
            put_code(code_row, d, quant_encode(rows[i * hs + d], range, spec_.bits), spec_.bits);
            k_mirror_[r * hs + d] = quant_decode(get_code(code_row, d, spec_.bits), range);
        }
    }
}

void QuantizedCache::on_stored(int l, int pos) {
    const int hs = config_.head_size(), g = spec_.group, kv_dim = config_.kv_dim();
    // The raw rows the backend wrote, [kv_dim] each, before their mirror rows are overwritten.
    std::vector<float> k_raw(std::size_t(kv_dim), 0.0f), v_raw(std::size_t(kv_dim), 0.0f);
    for (int h = 0; h < config_.n_kv_heads; h++) {
        std::copy_n(k_mirror_ + row(l, h, pos), hs, k_raw.data() + h * hs);
        std::copy_n(v_mirror_ + row(l, h, pos), hs, v_raw.data() + h * hs);
    }
    assert(k_raw.size() == std::size_t(kv_dim) && v_raw.size() == std::size_t(kv_dim));
    const float* k_row = k_raw.data();
    const float* v_row = v_raw.data();
    if (per_channel_keys() && pos > key_rows_[l])
        throw Error(fmt::format("quantized cache: per-channel keys go in order; layer {} got {} before {}", l, pos,
                                key_rows_[l]));
    for (int h = 0; h < config_.n_kv_heads; h++) {
        const std::int64_t r = row_index(l, h, pos);
        quantize_row(v_row + h * hs, r, v_codes_, v_scales_, v_mins_, v_mirror_);
        const float* k = k_row + h * hs;
        if (!per_channel_keys()) {
            quantize_row(k, r, k_codes_, k_scales_, k_mins_, k_mirror_);
            continue;
        }
        const int gi = pos / g, g0 = gi * g;
        const bool complete = key_rows_[l] >= g0 + g;  // a rewrite of a row in a quantized group
        const bool completes = !complete && pos == g0 + g - 1;
        if (complete || completes) {
            // The group's rows [group, head_size]: the fp32 residual (or, for a rewrite, the
            // dequantized rows, which is all that is left of them), with row pos replaced.
            std::vector<float> rows(std::size_t(g) * hs);  // [group, head_size]
            for (int i = 0; i < g; i++) {
                const float* src = g0 + i == pos ? k
                                   : complete    ? k_mirror_ + row(l, h, g0 + i)
                                                 : residual_row(l, h, g0 + i);
                std::copy_n(src, hs, rows.data() + std::size_t(i) * hs);
            }
            assert(rows.size() == std::size_t(g) * hs);
            quantize_key_group(l, h, gi, rows.data());
            if (completes) std::fill_n(residual_row(l, h, g0), std::size_t(g - 1) * hs, kPoison);
        } else {
            // Not yet complete: KIVI keeps the row in full precision, and attention reads it as is.
            std::copy_n(k, hs, residual_row(l, h, pos));
            std::copy_n(k, hs, k_mirror_ + row(l, h, pos));
        }
    }
    key_rows_[l] = std::max(key_rows_[l], pos + 1);
}

void QuantizedCache::release(int n) {
    const int hs = config_.head_size(), g = spec_.group;
    for (int l = 0; l < config_.n_layers; l++) {
        for (int h = 0; h < config_.n_kv_heads; h++) {
            for (int t = n; t < length(); t++) {
                std::fill_n(k_mirror_ + row(l, h, t), hs, kPoison);
                std::fill_n(v_mirror_ + row(l, h, t), hs, kPoison);
                std::fill_n(v_scales_.data() + row_index(l, h, t) * token_groups_, token_groups_, kPoison);
                std::fill_n(v_mins_.data() + row_index(l, h, t) * token_groups_, token_groups_, kPoison);
                if (!per_channel_keys()) {
                    std::fill_n(k_scales_.data() + row_index(l, h, t) * token_groups_, token_groups_, kPoison);
                    std::fill_n(k_mins_.data() + row_index(l, h, t) * token_groups_, token_groups_, kPoison);
                }
            }
            if (!per_channel_keys() || key_rows_[l] <= n) continue;
            // Per-channel keys: the group holding n becomes the residual again. If it was already
            // quantized, its kept positions g0..n-1 go back as their dequantized values (the fp32
            // originals are gone), so when the group completes again they are quantized a second
            // time, with the new group's range: rollback is approximate here, like the cache itself.
            const int gi = n / g, g0 = gi * g;
            const bool was_complete = key_rows_[l] >= g0 + g;
            for (int t = g0; t < g0 + g - 1 && t < config_.max_seq; t++) {
                float* res = residual_row(l, h, t);
                if (t >= n)
                    std::fill_n(res, hs, kPoison);
                else if (was_complete)
                    std::copy_n(k_mirror_ + row(l, h, t), hs, res);
            }
            // Scales of every group that is no longer complete.
            for (int gj = gi; gj < channel_groups_ && gj * g < key_rows_[l]; gj++) {
                const std::int64_t meta = ((std::int64_t(l) * config_.n_kv_heads + h) * channel_groups_ + gj) * hs;
                std::fill_n(k_scales_.data() + meta, hs, kPoison);
                std::fill_n(k_mins_.data() + meta, hs, kPoison);
            }
        }
        key_rows_[l] = std::min(key_rows_[l], n);
    }
}

MemoryStats QuantizedCache::memory() const {
    const Config& c = config_;
    const std::int64_t heads = std::int64_t(c.n_layers) * c.n_kv_heads, rows = heads * c.max_seq, hs = c.head_size();
    const std::int64_t residual_rows = per_channel_keys() ? heads * (spec_.group - 1) : 0;
    const std::int64_t k_groups = per_channel_keys() ? heads * channel_groups_ * hs : rows * token_groups_;
    MemoryStats m;
    m.used_bytes = kv_bytes(c, length());
    m.payload_bytes = 2 * rows * row_bytes_ + std::int64_t(sizeof(float)) * residual_rows * hs;
    m.metadata_bytes = std::int64_t(sizeof(float)) * 2 * (k_groups + rows * token_groups_);  // a scale and a min each
    m.reserved_bytes = m.payload_bytes + m.metadata_bytes;
    m.allocated_bytes = std::int64_t(k_codes_.size() + v_codes_.size()) +
                        std::int64_t(sizeof(float) * (k_scales_.size() + k_mins_.size() + v_scales_.size() +
                                                      v_mins_.size() + k_residual_.size()));
    m.scratch_bytes = mirror_.bytes();
    return m;
}

double QuantizedCache::bytes_per_token() const {
    const Config& c = config_;
    const double heads = double(c.n_layers) * c.n_kv_heads, hs = c.head_size();
    const double per_token_meta = 2.0 * sizeof(float) * token_groups_;  // scale + min per group of a head row
    const double k_meta = per_channel_keys() ? 2.0 * sizeof(float) * hs / spec_.group : per_token_meta;
    return heads * (2.0 * row_bytes_ + per_token_meta + k_meta);
}

std::string QuantizedCache::name() const {
    return fmt::format("quant-int{}(k={},v=per-token,group={})", spec_.bits,
                       per_channel_keys() ? "per-channel" : "per-token", spec_.group);
}

}  // namespace kvlab
