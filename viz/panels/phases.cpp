// kvlab viewer: the phases panel. The prefill is one wide block (the prompt's rows go through
// the model together), then one narrow box per decode step; under the timeline, each step's time
// and FLOPs for naive and cached decoding, aligned with its box.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "draw.h"
#include "panels.h"

namespace kvlab::viz {
namespace {

constexpr int kMarkerW = 3;  // the marker's frame around the current block, inside the strip
constexpr int kBlockH = 26;

// One step on the timeline: [x0, x1) in whole pixels.
struct Slot {
    int x0 = 0, x1 = 0;
    bool computed = false;
    Step::Phase phase = Step::Phase::decode;
};

double ratio(double naive, double cached) { return cached > 0 ? naive / cached : 0.0; }

// Bar height in pixels: linear, or over three decades below the top on a log scale, and at least
// 2 px for any non-zero value so a small cached bar never vanishes.
float bar_height(double v, double top, bool log_scale, float bar_h) {
    if (!(v > 0) || !(top > 0)) return 0;
    double frac = v / top;
    if (log_scale) frac = std::clamp(1.0 + std::log10(frac) / 3.0, 0.0, 1.0);
    return std::max(2.0f, std::floor(float(frac) * (bar_h - 2)));
}

// Bars of one quantity per step, aligned with the timeline's slots: naive on the left half,
// cached on the right (overlaid, larger behind, when a slot is too narrow to split).
void step_bars(const Frame& f, const std::vector<Slot>& slots, float left, const char* title, bool flops,
               bool log_scale, float bar_h) {
    ImDrawList* dl = ImGui::GetWindowDrawList();
    double top = 0;
    for (const auto& s : f.steps)
        top = std::max(top, flops ? double(s->naive_flops) : s->naive_seconds),
        top = std::max(top, flops ? double(s->cached_flops) : s->cached_seconds);
    char scale[64];
    if (flops)
        std::snprintf(scale, sizeof scale, "%s (top %.2f MFLOP%s)", title, top / 1e6, log_scale ? ", log" : "");
    else
        std::snprintf(scale, sizeof scale, "%s (top %.3f ms%s)", title, top * 1e3, log_scale ? ", log" : "");
    ImGui::TextDisabled("%s", scale);

    const ImVec2 p = ImGui::GetCursorScreenPos();
    const float y0 = std::floor(p.y), y1 = y0 + bar_h;
    const float right = slots.empty() ? left : float(slots.back().x1);
    fill(dl, left, y0, right + kMarkerW, y1, IM_COL32(30, 33, 40, 255));
    if (top > 0) {
        for (int i = 0; i < int(f.steps.size()) && i < int(slots.size()); ++i) {
            const Step& s = *f.steps[size_t(i)];
            const double vn = flops ? double(s.naive_flops) : s.naive_seconds;
            const double vc = flops ? double(s.cached_flops) : s.cached_seconds;
            const float hn = bar_height(vn, top, log_scale, bar_h), hc = bar_height(vc, top, log_scale, bar_h);
            const float x0 = float(slots[size_t(i)].x0), x1 = float(slots[size_t(i)].x1);
            if (i == f.cursor) fill(dl, x0 - 1, y0, x1 + 1, y1, IM_COL32(255, 255, 255, 36));
            if (x1 - x0 >= 4) {
                const float mid = std::floor((x0 + x1) / 2);
                fill(dl, x0, y1 - hn, mid, y1, palette::naive);
                fill(dl, mid, y1 - hc, x1, y1, palette::cached);
            } else if (hn >= hc) {
                fill(dl, x0, y1 - hn, x1, y1, palette::naive);
                fill(dl, x0, y1 - hc, x1, y1, palette::cached);
            } else {
                fill(dl, x0, y1 - hc, x1, y1, palette::cached);
                fill(dl, x0, y1 - hn, x1, y1, palette::naive);
            }
        }
    }
    dl->AddLine(ImVec2(left, y1 - 0.5f), ImVec2(right + kMarkerW, y1 - 0.5f), IM_COL32(150, 150, 160, 255));
    ImGui::Dummy(ImVec2(right + kMarkerW - p.x, bar_h + 2));
}

void legend_swatch(ImU32 colour, const char* text) {
    const float h = ImGui::GetTextLineHeight();
    const ImVec2 p = ImGui::GetCursorScreenPos();
    const float x = std::floor(p.x), y = std::floor(p.y + h * 0.15f);
    ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(x, y), ImVec2(x + std::floor(h * 0.7f), y + std::floor(h * 0.7f)),
                                              colour);
    ImGui::Dummy(ImVec2(h * 0.8f, h));
    ImGui::SameLine();
    ImGui::TextUnformatted(text);
}

// Tiled attention: the keys 0..T-1 the shown step's last row reads, cell by cell in alternating
// colours per key tile of B keys. The tiles are fixed in key-index space, so a decode step and a
// prefill row see the same boundaries, cut at their own position.
void key_tiles(const Frame& f, const Step& cur) {
    const AttentionSpec& a = f.info->settings.attention;
    const int T = std::max(1, cur.length);
    const bool prefill = cur.phase == Step::Phase::prefill;
    const int tile = f.plant == "tiles-follow-rows" && prefill ? 2 * a.tile : a.tile;
    ImGui::Text("key tiles of %d: %d for T = %d", a.tile, tile_count(T, a.tile), T);
    ImGui::SameLine();
    help_marker(
        "Tiled attention (--attention tiled): the step's last row reads keys 0..T-1 in tiles of a fixed "
        "number of keys, drawn here in alternating colours. Each tile's softmax partial is computed alone "
        "(a one-row decode step runs each tile as a split of its own, as flash-decoding does) and the "
        "partials are folded in tile order. The tiles are fixed by the key index alone, so a row gets the "
        "same tiles in a prefill, a chunk or a decode step: that is why the bits agree.");
    ImGui::SameLine(0, 10);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 origin = ImGui::GetCursorScreenPos();
    const float left = std::floor(origin.x), top = std::floor(origin.y) + 2;
    const float w = std::max(8.0f, std::floor(ImGui::GetContentRegionAvail().x) - 2 * kMarkerW);
    for (int t0 = 0, j = 0; t0 < T; t0 += tile, j++) {
        const float x0 = left + std::floor(float(t0) * w / float(T));
        const float x1 = left + std::floor(float(std::min(t0 + tile, T)) * w / float(T));
        fill(dl, x0, top, std::max(x1, x0 + 1), top + 12, j % 2 == 0 ? palette::tile_even : palette::tile_odd);
    }
    report(f, "phases.tiles", ImVec2(left, top), ImVec2(left + w, top + 12));
    ImGui::Dummy(ImVec2(w, ImGui::GetTextLineHeight()));
}

}  // namespace

void draw_phases(const Frame& f) {
    if (!begin_panel("Phases", f)) return;
    const SessionInfo& info = *f.info;
    const Step& cur = f.step();
    const int n_steps = std::max(info.total_steps, int(f.steps.size()));
    // Steps not run yet are still placed: prefills come first, and there are total_steps minus
    // the decode steps of them.
    const int n_prefill_planned = std::max(1, info.total_steps - info.settings.steps);
    const int prompt_len = std::max(1, int(info.prompt.size()));

    ImGui::Text("Timeline: %d of %d steps computed, showing step %d", int(f.steps.size()), n_steps, f.cursor);
    ImGui::SameLine();
    help_marker(
        "Prefill: the prompt's positions go through every matrix product together, as one matrix "
        "with a row per position. The weights are read once for all rows, so prefill is "
        "compute-bound, and it writes the whole prompt's K and V into the cache in one step.\n\n"
        "Decode: one new position per step, so every product is a single row (a matrix-vector "
        "product), and attention reads the K and V of every earlier position from the cache. Little "
        "arithmetic per byte read: decode is memory-bound.\n\n"
        "Naive decoding has no cache: every step recomputes the whole prefix of T positions, so "
        "step t costs about as much as a prefill of t positions, and the total over T steps grows "
        "like T^2/2 rows. Cached decoding computes one row per step, and only attention's read of "
        "the cache grows with T.");

    // Units along the strip: a prefill is as wide as the positions it writes, a decode step is 1.
    std::vector<int> units(static_cast<size_t>(n_steps), 1);
    std::vector<Slot> slots(static_cast<size_t>(n_steps));
    int total_units = 0;
    for (int i = 0; i < n_steps; ++i) {
        Slot& s = slots[size_t(i)];
        s.computed = i < int(f.steps.size());
        s.phase = s.computed ? f.steps[size_t(i)]->phase
                             : (i < n_prefill_planned ? Step::Phase::prefill : Step::Phase::decode);
        if (s.phase == Step::Phase::prefill) {
            const int n_new = s.computed ? f.steps[size_t(i)]->n_new : 0;
            units[size_t(i)] = n_new > 0 ? n_new : prompt_len;
        }
        total_units += units[size_t(i)];
    }

    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 origin = ImGui::GetCursorScreenPos();
    const float avail = ImGui::GetContentRegionAvail().x;
    const float left = std::floor(origin.x), top = std::floor(origin.y);
    // Blocks span [left + kMarkerW, left + kMarkerW + strip_w): the strip never leaves the window.
    const float strip_w = std::max(8.0f, std::floor(avail) - 2 * kMarkerW);
    const double unit_w = double(strip_w) / std::max(1, total_units);
    const int gap = unit_w >= 4 ? 1 : 0;  // separate boxes only when they stay visible
    int u = 0;
    for (int i = 0; i < n_steps; ++i) {
        Slot& s = slots[size_t(i)];
        s.x0 = int(left) + kMarkerW + int(std::floor(u * unit_w));
        u += units[size_t(i)];
        s.x1 = std::max(s.x0 + 1, int(left) + kMarkerW + int(std::floor(u * unit_w)) - gap);
        s.x1 = std::min(s.x1, int(left) + kMarkerW + int(strip_w));
        s.x0 = std::min(s.x0, s.x1 - 1);
    }
    const float y0 = top + kMarkerW, y1 = y0 + kBlockH;
    const float strip_right = left + 2 * kMarkerW + strip_w;
    for (const Slot& s : slots) {
        const ImU32 colour = !s.computed                       ? palette::empty
                             : s.phase == Step::Phase::prefill ? palette::prefill
                                                               : palette::decode;
        fill(dl, float(s.x0), y0, float(s.x1), y1, colour);
    }
    // The marker: a solid frame around the current step's block, in the strip's margin.
    const int marked = f.plant == "marker-stuck" ? 0 : f.cursor;
    if (marked >= 0 && marked < n_steps) {
        const Slot& s = slots[size_t(marked)];
        const float x0 = float(s.x0 - kMarkerW), x1 = float(s.x1 + kMarkerW);
        fill(dl, x0, top, x1, y0, palette::marker);
        fill(dl, x0, y1, x1, y1 + kMarkerW, palette::marker);
        fill(dl, x0, y0, float(s.x0), y1, palette::marker);
        fill(dl, float(s.x1), y0, x1, y1, palette::marker);
    }
    const ImVec2 strip_min(left, top), strip_max(strip_right, y1 + kMarkerW);
    report(f, "phases.timeline", strip_min, strip_max);
    ImGui::Dummy(ImVec2(strip_max.x - origin.x, strip_max.y - origin.y));

    // Hovering a box names its step.
    if (ImGui::IsItemHovered()) {
        const float mx = ImGui::GetIO().MousePos.x;
        for (int i = 0; i < n_steps; ++i) {
            if (mx < float(slots[size_t(i)].x0) - 0.5f * gap || mx >= float(slots[size_t(i)].x1 + gap)) continue;
            ImGui::BeginTooltip();
            if (i < int(f.steps.size())) {
                const Step& s = *f.steps[size_t(i)];
                ImGui::Text("step %d: %s", i, s.label.c_str());
                ImGui::Text("positions %d..%d, T = %d after it", s.first_pos, s.first_pos + s.n_new - 1, s.length);
                ImGui::Text("cached %.3f ms, naive %.3f ms", s.cached_seconds * 1e3, s.naive_seconds * 1e3);
            } else {
                ImGui::Text("step %d: not computed yet", i);
            }
            ImGui::EndTooltip();
            break;
        }
    }

    // Labels under the strip: "prefill" under each prefill block, decode numbers spaced so they
    // never overlap.
    {
        const ImVec2 p = ImGui::GetCursorScreenPos();
        const float label_h = ImGui::GetTextLineHeight();
        const float digit_w = ImGui::CalcTextSize("000").x + 6;
        float next_free = -1e9f;
        int decode_no = 0;
        for (int i = 0; i < n_steps; ++i) {
            const Slot& s = slots[size_t(i)];
            char text[32];
            if (s.phase == Step::Phase::prefill) {
                // "prefill A" when there are several prefills and it fits, else "prefill" or "P".
                const std::string& label = i < int(f.steps.size()) ? f.steps[size_t(i)]->label : std::string();
                const bool named = n_prefill_planned > 1 && label.size() >= 9 && label.compare(0, 8, "prefill ") == 0;
                std::snprintf(text, sizeof text, "%s", named ? label.substr(0, 9).c_str() : "prefill");
                const float room = float(s.x1 - s.x0) - 6;
                if (room < ImGui::CalcTextSize(text).x) std::snprintf(text, sizeof text, "%s", "prefill");
                if (room < ImGui::CalcTextSize(text).x) std::snprintf(text, sizeof text, "%s", "P");
            } else {
                ++decode_no;
                if (float(s.x0) < next_free || (decode_no != 1 && decode_no % 4 != 0)) continue;
                std::snprintf(text, sizeof text, "%d", decode_no);
            }
            const float w = ImGui::CalcTextSize(text).x;
            const float x = std::max(float(s.x0), std::floor((float(s.x0 + s.x1) - w) / 2));
            if (x < next_free) continue;
            dl->AddText(ImVec2(x, p.y), i == f.cursor ? IM_COL32(255, 255, 255, 255) : IM_COL32(170, 170, 180, 255),
                        text);
            next_free = x + std::max(w, digit_w);
        }
        ImGui::Dummy(ImVec2(1, label_h));
    }
    legend_swatch(palette::prefill, "prefill");
    ImGui::SameLine(0, 14);
    legend_swatch(palette::decode, "decode");
    ImGui::SameLine(0, 14);
    legend_swatch(palette::empty, "not yet run");
    ImGui::SameLine(0, 14);
    legend_swatch(palette::marker, "step shown");
    if (info.settings.attention.tiled()) {
        ImGui::SameLine(0, 30);
        key_tiles(f, cur);
    }
    ImGui::Separator();

    // The step shown, in words, before the bars: a short window still shows it.
    const bool prefill = cur.phase == Step::Phase::prefill;
    ImGui::Text("step %d of %d: %s", f.cursor, n_steps,
                cur.label.empty() ? (prefill ? "prefill" : "decode") : cur.label.c_str());
    char written[96];
    if (cur.n_new > 0)
        std::snprintf(written, sizeof written, "positions written %d..%d (%d), T = %d after it", cur.first_pos,
                      cur.first_pos + cur.n_new - 1, cur.n_new, cur.length);
    else
        std::snprintf(written, sizeof written, "no positions of A written, T = %d", cur.length);
    ImGui::SameLine(0, 20);
    if (ImGui::GetContentRegionAvail().x < ImGui::CalcTextSize(written).x) ImGui::NewLine();
    ImGui::TextUnformatted(written);
    const ImVec4 good = colour4(palette::equal);
    ImGui::Text("time:  cached %.3f ms, naive %.3f ms", cur.cached_seconds * 1e3, cur.naive_seconds * 1e3);
    if (const double r = ratio(cur.naive_seconds, cur.cached_seconds); r > 0) {
        ImGui::SameLine();
        ImGui::TextColored(good, " cached is %.1fx faster", r);
    }
    ImGui::Text("FLOPs: cached %.3f M, naive %.3f M", double(cur.cached_flops) / 1e6, double(cur.naive_flops) / 1e6);
    if (const double r = ratio(double(cur.naive_flops), double(cur.cached_flops)); r > 0) {
        ImGui::SameLine();
        ImGui::TextColored(good, " naive does %.1fx the work", r);
    }
    if (!cur.note.empty()) ImGui::TextColored(colour4(palette::differ), "%s", cur.note.c_str());

    // Bars fill what is left of the window, between 24 and 64 px each.
    ImGui::Spacing();
    static bool log_scale = false;  // the panel's own view option; the session is untouched
    const float line = ImGui::GetTextLineHeightWithSpacing();
    const float rest = ImGui::GetContentRegionAvail().y - 2 * line - ImGui::GetFrameHeightWithSpacing() - 8;
    const float bar_h = std::clamp(std::floor(rest / 2 - 2), 24.0f, 64.0f);
    step_bars(f, slots, left, "time per step", false, log_scale, bar_h);
    step_bars(f, slots, left, "FLOPs per step", true, log_scale, bar_h);
    legend_swatch(palette::naive, "naive: recomputes the prefix");
    ImGui::SameLine(0, 14);
    legend_swatch(palette::cached, "cached: one row per decode step");
    ImGui::SameLine(0, 14);
    ImGui::Checkbox("log scale", &log_scale);
    ImGui::End();
}

}  // namespace kvlab::viz
