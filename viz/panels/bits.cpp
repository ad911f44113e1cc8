// kvlab viewer: the bits panel. One K row of A's newest position (layer 0, KV head 0) as layer 0
// computes it in fp32 and as the cache's format stores it: sign, exponent and mantissa bits side
// by side, the value each means, whether the cache holds exactly that, and the cache's bytes in
// every format.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "draw.h"
#include "panels.h"

namespace kvlab::viz {
namespace {

constexpr int kElements = 3;  // elements of the row shown

// A format's field widths: fp32's, or a KV format's. An integer format's code is unsigned, all
// of it one field (drawn as mantissa).
struct Fields {
    int exp_bits, man_bits;
    bool sign = true;
    int bits() const { return int(sign) + exp_bits + man_bits; }
};
Fields fields_of(KVFormat f) {
    if (f == KVFormat::fp32) return {8, 23};
    if (kv_format_int(int(f))) return {0, kv_int_bits(int(f)), false};
    const FloatFormat ff = float_format(int(f));
    return {ff.exp_bits, ff.man_bits};
}

// One code as a row of cells, most significant bit first, coloured by field; a set bit is the
// bright shade. Reports the row as `name` (cells of cell x cell pixels).
void bit_row(const Frame& f, const std::string& name, std::uint32_t code, Fields fl, int cell) {
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 at = floored(ImGui::GetCursorScreenPos());
    const Cells c = cells_for_pitch(cell, cell);
    for (int i = 0; i < fl.bits(); i++) {
        const int bit = fl.bits() - 1 - i;
        const bool on = (code >> bit) & 1u;
        const int field = i + int(!fl.sign);  // 0: sign, then exponent, then mantissa
        const ImU32 colour = field == 0             ? (on ? palette::bit_sign_on : palette::bit_sign_off)
                             : field <= fl.exp_bits ? (on ? palette::bit_exp_on : palette::bit_exp_off)
                                                    : (on ? palette::bit_man_on : palette::bit_man_off);
        const float x = at.x + float(i * c.pitch_x());
        fill(dl, x, at.y, x + float(c.w), at.y + float(c.h), colour);
    }
    const ImVec2 end(at.x + float(fl.bits() * c.pitch_x()), at.y + float(c.pitch_y()));
    report_grid(f, name, at, end, c);
    ImGui::Dummy(ImVec2(float(32 * c.pitch_x()), float(c.pitch_y())));
}

}  // namespace

void draw_bits(const Frame& f) {
    if (!begin_panel("K row bits", f)) return;
    const Step& s = f.step();
    const SessionInfo& info = *f.info;
    const KVFormat format = info.kv_format;
    ImGui::Text("A's newest position (%d), layer 0, KV head 0: fp32 as computed, then as stored in %s", s.length - 1,
                kv_format_name(format));
    ImGui::SameLine();
    help_marker(
        "Layer 0's K row depends only on the token and its position, so the panel computes it here with "
        "the same kernels. Top: its fp32 bits. Below: the code the cache stores for it. A narrower format "
        "keeps the sign, fewer exponent bits (its range) and fewer mantissa bits (its precision): the "
        "value is rounded to the nearest code, ties to even, and saturates at the largest finite one. An "
        "integer format (int8, int4) has no exponent: each group of channels gets a scale and a minimum "
        "fitted from the row, and a code is drawn whole. "
        "Both decoders store through the same conversion, so cached decode still equals the "
        "format-aware naive decode bit for bit; what moves is the distance to fp32.");
    legend_item(palette::bit_sign_on, "sign");
    legend_item(palette::bit_exp_on, "exponent");
    legend_item(palette::bit_man_on, "mantissa (bright: 1)");
    ImGui::NewLine();
    const float avail = ImGui::GetContentRegionAvail().x;
    const int cell = std::clamp(int(avail * 0.7f / 32.0f), 4, 14);
    const Fields fp32{8, 23};
    Fields code_fields = fields_of(format);
    if (f.plant == "bits-fp32-fields") code_fields = fp32;  // planted: the format drawn with fp32's fields
    const int n = std::min<int>(kElements, int(s.k_fp32.size()));
    for (int d = 0; d < n; d++) {
        const float x = s.k_fp32[std::size_t(d)];
        ImGui::Text("[%d] fp32  %.9g%s", d, double(x), format == KVFormat::fp32 ? " (stored as it is)" : "");
        bit_row(f, "bits.fp32.d" + std::to_string(d), float_bits(x), fp32, cell);
        if (format == KVFormat::fp32) continue;
        // The code's value, times the layer's scale (fp8), as attention reads it; an integer code
        // through its group's affine map.
        const std::uint32_t code = s.k_codes[std::size_t(d)];
        float v = 0.0f;
        if (kv_format_int(int(format))) {
            const QuantRange r = s.k_groups[std::size_t(d)];
            v = quant_decode(code, r);
            ImGui::Text("    %s  %.9g  (code %u x scale %.6g + min %.6g)", kv_format_name(format), double(v), code,
                        double(r.scale), double(r.min));
        } else {
            v = s.k_scale == 1.0f ? decode_float(float_format(int(format)), code)
                                  : decode_float(float_format(int(format)), code) * s.k_scale;
            ImGui::Text("    %s  %.9g  (code 0x%0*x)", kv_format_name(format), double(v),
                        2 * kv_format_bytes(int(format)), code);
        }
        if (d < int(s.k_held.size())) {
            const bool held = float_bits(s.k_held[std::size_t(d)]) == float_bits(v);
            ImGui::SameLine();
            ImGui::TextColored(colour4(held ? palette::equal : palette::differ), "%s",
                               held ? "the cache holds exactly this" : "the cache holds something else");
        }
        bit_row(f, "bits.code.d" + std::to_string(d), code, code_fields, cell);
    }
    // What the cache holds now in each format, the chosen one marked.
    ImGui::Separator();
    ImGui::Text("K and V of %d positions:", s.length);
    for (KVFormat k : kKVFormats) {
        const std::int64_t b = kv_bytes(info.config, s.length, k);
        ImGui::TextColored(colour4(k == format ? palette::newest : palette::formula), "%s%-9s %s",
                           k == format ? "> " : "  ", kv_format_name(k), bytes(double(b)).c_str());
        if (k != KVFormat::fp32 && s.length > 0) {
            ImGui::SameLine();
            ImGui::Text("(%.0f%% of fp32)", 100.0 * double(b) / double(kv_bytes(info.config, s.length)));
        }
    }
    ImGui::End();
}

}  // namespace kvlab::viz
