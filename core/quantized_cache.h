// kvlab core: a quantized KV cache (approximate in values, exact in layout).
//
// K and V are stored as 8- or 4-bit codes with a scale and a minimum per group (asymmetric
// min/max quantization with a zero point):
//   scale = (max - min) / (2^bits - 1),  code = round((x - min) / scale) in [0, 2^bits - 1],
//   x_hat = code * scale + min           (max == min: scale 0, x_hat = min).
// Values are quantized per token: groups of `group` consecutive channels of one head's row at one
// position. Keys either the same way, or per channel as in KIVI: channel d of a (layer, KV head)
// is quantized over `group` consecutive positions, because key outliers live in fixed channels.
// A per-channel group can only be quantized once all its positions are known, so the positions
// of the incomplete group stay in fp32 (KIVI's residual) and the group is quantized when its last
// row is written.
//
// Attention reads dequantized floats through slots, so it runs the same kernel as every other
// cache. A production kernel dequantizes in registers; we keep a float mirror instead (the
// cache's storage, where the backend writes each new row and stored() replaces it by its
// dequantized value) and report it as scratch memory, not as cache memory. Quantizing runs on
// the host, so this cache needs host-visible memory (the CPU backend).
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
    // Throws Error for a spec that does not fit the config (bits, group size).
    explicit QuantizedCache(const Config& config, QuantSpec spec = {});

    std::int64_t slot(int t) const override { return t; }
    const KVStorage& storage() const override { return mirror_; }
    MemoryStats memory() const override;
    std::string name() const override;  // "quant-int8(k=per-channel,v=per-token,group=32)"
    const QuantSpec& spec() const { return spec_; }
    // Per-channel keys: one position a step, so a query at p reads a key quantized exactly when
    // the key's group ends at or before p, whatever steps the positions came in (a longer prefill
    // would quantize a group before its earlier rows' queries run). NaiveDecoder::quant follows
    // the same rule.
    int max_step() const override { return per_channel_keys() ? 1 : config_.max_seq; }

    // Payload + metadata bytes one more position costs in steady state (per-channel scales are
    // amortized over their group; the fixed fp32 residual is left out): the number for a table.
    double bytes_per_token() const;

    // Code i of a packed code array: one byte per code for 8 bits, two codes per byte for 4 bits
    // (even i in the low nibble). Public so the tests can check the packing on its own.
    static void put_code(std::uint8_t* codes, int i, unsigned code, int bits);
    static unsigned get_code(const std::uint8_t* codes, int i, int bits);

protected:
    void reserve(int new_length) override;
    // Quantizes the raw rows the backend wrote into the mirror and replaces them by their
    // dequantized values.
    void on_stored(int l, int pos) override;
    void release(int n) override;

private:
    bool per_channel_keys() const { return spec_.key_axis == QuantSpec::Axis::per_channel; }
    // Offset of the row (l, h, t) in a [n_layers, n_kv_heads, max_seq, X] array, in rows.
    std::int64_t row_index(int l, int h, int t) const {
        return (std::int64_t(l) * config_.n_kv_heads + h) * config_.max_seq + t;
    }
    std::int64_t row(int l, int h, int t) const { return row_index(l, h, t) * config_.head_size(); }
    // Per-token: quantizes the head_size floats x of row (l, h, t) into codes/scales/mins, and
    // writes the dequantized values into mirror.
    void quantize_row(const float* x, std::int64_t r, std::vector<std::uint8_t>& codes, std::vector<float>& scales,
                      std::vector<float>& mins, float* mirror);
    // Per-channel keys: quantizes group rows [group, head_size] of group gi of (l, h).
    void quantize_key_group(int l, int h, int gi, const float* rows);
    // Per-channel keys: the residual row of position t (t's group not yet complete).
    float* residual_row(int l, int h, int t) {
        return k_residual_.data() +
               ((std::int64_t(l) * config_.n_kv_heads + h) * (spec_.group - 1) + t % spec_.group) * config_.head_size();
    }

    QuantSpec spec_;
    int row_bytes_;       // code bytes of one head row: ceil(head_size * bits / 8)
    int token_groups_;    // per-token groups in one head row: head_size / group
    int channel_groups_;  // per-channel key groups that fit max_seq: max_seq / group (0 for per-token keys)
    std::vector<std::uint8_t> k_codes_;     // [n_layers, n_kv_heads, max_seq, row_bytes]
    std::vector<std::uint8_t> v_codes_;     // [n_layers, n_kv_heads, max_seq, row_bytes]
    std::vector<float> k_scales_, k_mins_;  // per-token: [n_layers, n_kv_heads, max_seq, token_groups]
                                            // per-channel: [n_layers, n_kv_heads, channel_groups, head_size]
    std::vector<float> v_scales_, v_mins_;  // [n_layers, n_kv_heads, max_seq, token_groups]
    std::vector<float> k_residual_;         // per-channel: [n_layers, n_kv_heads, group - 1, head_size]; else empty
    KVStorage mirror_;                      // k, v: [n_layers, n_kv_heads, max_seq, head_size], NaN where nothing is stored
    float* k_mirror_ = nullptr;             // mirror_.k on the host
    float* v_mirror_ = nullptr;             // mirror_.v on the host
    std::vector<int> key_rows_;             // [n_layers]: positions 0..key_rows_[l]-1 of layer l are written
};

}  // namespace kvlab
