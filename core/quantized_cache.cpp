#include "quantized_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

namespace kvlab {

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

QuantizedCache::QuantizedCache(const Config& config, QuantSpec spec, Memory& memory) : Cache(config), spec_(spec) {
    const Config& c = config_;
    const int hs = c.head_size(), g = spec_.group;
    if (spec_.bits != 8 && spec_.bits != 4)
        throw Error(fmt::format("quantized cache: bits must be 8 or 4, not {}", spec_.bits));
    if (g < 1) throw Error(fmt::format("quantized cache: quantization group must be positive, not {}", g));
    // Values are always quantized per token, so the group must tile a head's row.
    if (hs % g != 0) throw Error(fmt::format("quantization group {} does not divide head_size {}", g, hs));
    if (per_channel_keys() && g > c.max_seq)
        throw Error(fmt::format("quantization group {} of per-channel keys exceeds max_seq {}", g, c.max_seq));
    if (!memory.host_visible())
        throw Error("quantized cache: its key groups are quantized on the host; it needs host-visible memory");
    const std::int64_t rows = std::int64_t(c.n_layers) * c.n_kv_heads * c.max_seq, pairs = rows / c.max_seq;
    // Rows of codes and row scales (size-checked where KVStorage allocates them), all NaN.
    storage_ = KVStorage(memory, rows, hs, std::int64_t(c.n_kv_heads) * c.max_seq, c.max_seq,
                         spec_.bits == 8 ? KVFormat::int8 : KVFormat::int4, {}, g);
    k_residual_ = Buffer<float>(memory, per_channel_keys() ? pairs * g * hs : 0);
    memory.fill_nan(k_residual_.data(), k_residual_.size(), int(KVFormat::fp32));
    key_rows_.assign(std::size_t(c.n_layers), 0);
    assert(storage_.n_rows == rows && storage_.group() == g);
    assert(k_residual_.size() == (per_channel_keys() ? pairs * g * hs : 0));
}

void QuantizedCache::reserve(int new_length) { assert(new_length <= config_.max_seq); }

RowKV QuantizedCache::row_kv() const {
    RowKV r = Cache::row_kv();
    if (per_channel_keys()) {
        r.k_residual = k_residual_.data();  // the backend stores raw keys there
        r.key_group = spec_.group;
        r.k_quantized = length() / spec_.group * spec_.group;  // groups complete once this step is stored
    }
    return r;
}

const float* QuantizedCache::key(int l, int h, int t) const {
    if (!per_channel_keys() || t < 0 || t >= length()) return Cache::key(l, h, t);  // and its checks
    check_head(l, h);
    key_row_.resize(std::size_t(config_.head_size()));
    read_key(l, h, t, key_row_.data());
    return key_row_.data();
}

void QuantizedCache::read_key(int l, int h, int t, float* out) const {
    RowKV r = row_kv();
    r.k_quantized = key_rows_[std::size_t(l)] / spec_.group * spec_.group;  // layer l's groups, as stored so far
    for (int d = 0; d < config_.head_size(); d++) out[d] = r.kivi_key(l, h, t, config_.head_size(), d);
}

void QuantizedCache::quantize_key_group(int l, int h, int gi, const float* rows) {
    const int hs = config_.head_size(), g = spec_.group, bits = spec_.bits;
    const int per_row = hs / g;  // channel scales a row holds
    for (int d = 0; d < hs; d++) {
        // Channel d over the group's positions: rows is [group, head_size], so stride head_size.
        const QuantRange range = quant_fit(rows + d, g, hs, bits);
        float* meta = kv_int_meta(storage_.k_row(storage_.row(l, h, gi * g + d / per_row)), d % per_row);
        meta[0] = range.scale;
        meta[1] = range.min;
        for (int i = 0; i < g; i++)
            kv_int_set_code(format(), storage_.k_row(storage_.row(l, h, gi * g + i)), d, g, hs,
                            quant_encode(rows[std::size_t(i) * hs + d], range, bits));
    }
}

void QuantizedCache::on_stored(int l, int pos) {
    if (!per_channel_keys()) return;  // keys and values are rows of codes: the backend wrote them
    const int hs = config_.head_size(), g = spec_.group, kept = key_rows_[std::size_t(l)];
    if (pos > kept)
        throw Error(
            fmt::format("quantized cache: per-channel keys go in order; layer {} got {} before {}", l, pos, kept));
    const int gi = pos / g, g0 = gi * g;
    const bool complete = kept >= g0 + g;  // a rewrite of a row in a quantized group
    const bool completes = !complete && pos == g0 + g - 1;
    const RowKV r = row_kv();
    if (complete && kept / g * g + pos % g < kept)
        throw Error(
            fmt::format("quantized cache: position {} of a quantized key group is written again while the "
                        "open group holds position {} in the same residual row",
                        pos, kept / g * g + pos % g));
    if (!complete && !completes) {  // the open group: its raw keys stay in the residual
        key_rows_[std::size_t(l)] = std::max(kept, pos + 1);
        return;
    }
    for (int h = 0; h < config_.n_kv_heads; h++) {
        // The group's rows [group, head_size]: the fp32 residual (or, for a rewrite, the dequantized
        // rows, which is all that is left of them), with row pos's new key from the residual.
        std::vector<float> rows(std::size_t(g) * hs);  // [group, head_size]
        for (int i = 0; i < g; i++) {
            float* row = rows.data() + std::size_t(i) * hs;
            if (g0 + i == pos || !complete)
                std::copy_n(r.kivi_residual(l, h, g0 + i, hs), hs, row);
            else
                read_key(l, h, g0 + i, row);
        }
        assert(rows.size() == std::size_t(g) * hs);
        quantize_key_group(l, h, gi, rows.data());
        if (completes)
            std::fill_n(r.kivi_residual(l, h, g0, hs), std::size_t(g) * hs, kNaN);  // free again
        else
            std::fill_n(r.kivi_residual(l, h, pos, hs), hs, kNaN);
    }
    key_rows_[std::size_t(l)] = std::max(kept, pos + 1);
}

void QuantizedCache::release(int n) {
    const int hs = config_.head_size(), g = spec_.group;
    if (per_channel_keys()) {
        const RowKV r = row_kv();
        for (int l = 0; l < config_.n_layers; l++) {
            const int kept = key_rows_[std::size_t(l)];
            if (kept <= n) continue;
            // The group holding n becomes the open one again. If it was quantized, its kept positions
            // g0..n-1 go back to the residual as their dequantized values (the fp32 originals are gone),
            // so when the group completes again they are quantized a second time, with the new group's
            // range: rollback is approximate here, like the cache itself.
            const int g0 = n / g * g;
            const bool was_complete = kept >= g0 + g;
            for (int h = 0; h < config_.n_kv_heads; h++)
                for (int t = g0; t < g0 + g && t < config_.max_seq; t++) {
                    float* residual = r.kivi_residual(l, h, t, hs);
                    if (t >= n)
                        std::fill_n(residual, hs, kNaN);
                    else if (was_complete)  // else the residual still holds the raw key
                        read_key(l, h, t, residual);
                }
            key_rows_[std::size_t(l)] = n;
        }
    }
    // Codes and row scales of positions n.. (and with them the channel scales of a group no longer
    // complete) read NaN again.
    storage_.poison(config_, n, length() - n);
}

namespace {
struct QuantizedSnapshot final : CacheSnapshot {
    Buffer<std::uint8_t> k;     // the key rows' codes and scales
    Buffer<float> k_residual;   // the open groups' raw keys
    std::vector<int> key_rows;  // [n_layers]
};
}  // namespace

std::unique_ptr<CacheSnapshot> QuantizedCache::snapshot(int added) const {
    if (!per_channel_keys() || length() % spec_.group + added < spec_.group) return Cache::snapshot(added);
    auto s = std::make_unique<QuantizedSnapshot>();
    s->length = length();
    s->k = storage_.k.clone(), s->k_residual = k_residual_.clone();
    s->key_rows = key_rows_;
    return s;
}

void QuantizedCache::restore(const CacheSnapshot& snapshot) {
    Cache::restore(snapshot);  // values (per token) and the length, as a rollback gives them back
    const auto* s = dynamic_cast<const QuantizedSnapshot*>(&snapshot);
    if (!s) return;
    storage_.k.copy_from(s->k), k_residual_.copy_from(s->k_residual);
    key_rows_ = s->key_rows;
}

MemoryStats QuantizedCache::memory() const {
    const Config& c = config_;
    const std::int64_t pairs = std::int64_t(c.n_layers) * c.n_kv_heads;
    const std::int64_t residual = k_residual_.bytes();
    MemoryStats m;
    m.used_bytes = 2 * pairs * length() * storage_.row_bytes();
    // Codes (and their padding) and the fp32 residual; the scales beside the codes are metadata.
    m.payload_bytes = storage_.payload_bytes() - storage_.group_scale_bytes() + residual;
    m.metadata_bytes = storage_.group_scale_bytes();
    m.reserved_bytes = m.payload_bytes + m.metadata_bytes;
    m.allocated_bytes = storage_.bytes() + residual;
    return m;
}

double QuantizedCache::bytes_per_token() const {
    const Config& c = config_;
    return 2.0 * double(c.n_layers) * c.n_kv_heads * double(storage_.row_bytes());
}

std::string QuantizedCache::name() const {
    return fmt::format("quant-int{}(k={},v=per-token,group={})", spec_.bits,
                       per_channel_keys() ? "per-channel" : "per-token", spec_.group);
}

}  // namespace kvlab
