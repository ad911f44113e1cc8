// kvlab core: a quantized KV cache (approximate against fp32, exact against naive decode that
// rounds K and V the same way: NaiveDecoder::quant).
//
// K and V are stored as 8- or 4-bit codes with a scale and a minimum per group (asymmetric
// min/max quantization with a zero point, kv_format.h's arithmetic):
//   scale = (max - min) / (2^bits - 1),  code = round((x - min) / scale) in [0, 2^bits - 1],
//   x_hat = code * scale + min           (max == min: scale 0, x_hat = min).
// Values are quantized per token: groups of `group` consecutive channels of one head's row at one
// position, the int8/int4 KV formats' rows with that group (a scale and minimum beside each
// group's codes). Keys either the same way, or per channel as in KIVI: channel d of a (layer, KV
// head) is quantized over `group` consecutive positions, because key outliers live in fixed
// channels. A per-channel group can only be quantized once all its positions are known, so the
// keys of the open group stay in fp32 (KIVI's residual) and the group is quantized when its last
// row is written: its rows then hold codes, and its head_size channels' scales and minimums in
// the rows' own scale slots (as many slots as channels, because a row has head_size / group of
// them and the group has group rows). No fp32 copy: attention decodes the codes as it reads
// them (RowKV::kivi_key), on the CPU and gpu-host backends. Quantizing a completed group runs on
// the host, so this cache needs host-visible memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache.h"

namespace kvlab {

// One group's arithmetic (quant_fit, quant_encode, quant_decode) is kv_format.h's, shared with the
// int8 and int4 KV formats and with lessons/09-approximate.

struct QuantSpec {
    enum class Axis { per_token, per_channel };
    int bits = 8;                       // 8 or 4
    Axis key_axis = Axis::per_channel;  // values are always per token
    int group = 32;                     // channels (per token) or positions (per channel) per scale
};

class QuantizedCache : public Cache {
public:
    // Throws Error for a spec that does not fit the config (bits, group size), or memory that is
    // not host-visible (completed key groups are quantized on the host).
    explicit QuantizedCache(const Config& config, QuantSpec spec = {}, Memory& memory = host_memory());

    std::int64_t slot(int t) const override { return t; }
    const KVStorage& storage() const override { return storage_; }
    RowKV row_kv() const override;
    // Per-channel keys: layer l's groups as stored so far (codes, or the fp32 residual).
    const float* key(int l, int h, int t) const override;
    MemoryStats memory() const override;
    std::string name() const override;  // "quant-int8(k=per-channel,v=per-token,group=32)"
    const QuantSpec& spec() const { return spec_; }
    // Per-channel keys: one position a step, so a query at p reads a key quantized exactly when
    // the key's group ends at or before p, whatever steps the positions came in (a longer prefill
    // would quantize a group before its earlier rows' queries run). NaiveDecoder::quant follows
    // the same rule.
    int max_step() const override { return per_channel_keys() ? 1 : config_.max_seq; }
    // Per-channel keys: the key rows, the residual and the groups' state, since a request that
    // completes a group replaces the open group's raw keys, which no rollback can give back.
    std::unique_ptr<CacheSnapshot> snapshot(int added) const override;
    void restore(const CacheSnapshot& s) override;

    // Bytes one more position costs in steady state (codes and row scales of K and V; the fixed
    // fp32 residual is left out): the number for a table.
    double bytes_per_token() const;

    // Code i of a packed code array: one byte per code for 8 bits, two codes per byte for 4 bits
    // (even i in the low nibble). Public so the tests can check the packing on its own.
    static void put_code(std::uint8_t* codes, int i, unsigned code, int bits);
    static unsigned get_code(const std::uint8_t* codes, int i, int bits);

protected:
    void reserve(int new_length) override;
    // Per-channel keys: quantizes a key group when its last row is stored (or requantizes it when a
    // row of a complete group is written again).
    void on_stored(int l, int pos) override;
    void release(int n) override;

private:
    bool per_channel_keys() const { return spec_.key_axis == QuantSpec::Axis::per_channel; }
    int format() const { return int(storage_.format); }
    // Per-channel keys: quantizes group gi of (l, h) from rows [group, head_size].
    void quantize_key_group(int l, int h, int gi, const float* rows);
    // Per-channel keys: the key row of position t of (l, h) as attention reads it, into out [head_size].
    void read_key(int l, int h, int t, float* out) const;

    QuantSpec spec_;
    // k, v: [n_layers, n_kv_heads, max_seq, row_bytes] int8 or int4 rows in groups of spec.group
    // channels, NaN where nothing is stored; per-channel keys' rows hold their group's channel
    // scales in place of their own.
    KVStorage storage_;
    Buffer<float> k_residual_;       // per-channel: [n_layers, n_kv_heads, group, head_size] by t % group; else empty
    std::vector<int> key_rows_;      // [n_layers]: positions 0..key_rows_[l]-1 of layer l are written
    mutable std::vector<float> key_row_;  // [head_size] key()'s row
};

}  // namespace kvlab
