// kvlab viewer: the attention panel. The newest row of sequence A, one layer: for every query
// head, the softmax weights over the positions it attended, as a heatmap.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "draw.h"
#include "panels.h"

namespace kvlab::viz {
namespace {

constexpr int kMaxPitchX = 28, kMaxPitchY = 24;  // px per cell, gap included

// "0-4, 9-12": positions as ranges of consecutive values.
std::string ranges(const std::vector<int>& ts) {
    std::string out;
    char buf[32];
    for (std::size_t i = 0; i < ts.size();) {
        std::size_t j = i;
        while (j + 1 < ts.size() && ts[j + 1] == ts[j] + 1) j++;
        if (j == i)
            std::snprintf(buf, sizeof buf, "%s%d", out.empty() ? "" : ", ", ts[i]);
        else
            std::snprintf(buf, sizeof buf, "%s%d-%d", out.empty() ? "" : ", ", ts[i], ts[j]);
        out += buf;
        i = j + 1;
    }
    return out;
}

}  // namespace

void draw_attention(const Frame& f) {
    if (!begin_panel("Attention", f)) return;
    const SessionInfo& info = *f.info;
    const Config& cfg = info.config;
    const Step& s = f.step();
    const SeqView* a = seq_a(s);
    const int n_layers = std::max(1, cfg.n_layers);
    const int n_heads = std::max(1, cfg.n_heads);
    const int group = std::max(1, cfg.n_kv_heads > 0 ? n_heads / cfg.n_kv_heads : 1);  // query heads per KV head
    const int l = std::clamp(f.layer, 0, n_layers - 1);
    const int n_att = int(s.attended.size());
    if (n_att == 0) {
        ImGui::TextUnformatted("A computed no row in this step");
        ImGui::End();
        return;
    }
    // weights: [n_layers, n_heads, n_attended]
    assert(s.weights.size() == std::size_t(n_layers) * std::size_t(n_heads) * std::size_t(n_att));
    if (s.weights.size() != std::size_t(n_layers) * std::size_t(n_heads) * std::size_t(n_att)) {
        ImGui::Text("weights hold %zu floats, expected n_layers x n_heads x %d", s.weights.size(), n_att);
        ImGui::End();
        return;
    }
    auto weight = [&](int h, int i) { return s.weights[(std::size_t(l) * n_heads + h) * n_att + i]; };
    // The position column i holds for query head h: H2O's layers and KV heads keep their own.
    const int n_kv_heads = n_heads / group;
    const bool own = s.kept.size() == std::size_t(n_layers) * std::size_t(n_kv_heads) * std::size_t(n_att);
    auto position = [&](int h, int i) {
        return own ? s.kept[(std::size_t(l) * n_kv_heads + std::size_t(h / group)) * n_att + std::size_t(i)]
                   : s.attended[std::size_t(i)];
    };
    auto text_of = [&](int pos) {
        if (!a || pos < 0 || pos >= int(a->tokens.size())) return std::string("?");
        return token_text(info, a->tokens[std::size_t(pos)]);
    };

    const int q_pos = s.length - 1;  // the query: A's last position
    ImGui::Text("layer %d, query at position %d", l, q_pos);
    ImGui::SameLine();
    help_marker(
        "Each row is one query head's attention weights for the newest row: softmax(q k^T / "
        "sqrt(head_size)) over the cached keys it attended, so each row sums to 1. The output is the "
        "same weights applied to the cached V rows.\n\n"
        "Grouped-query attention: query head h reads the K and V rows of KV head h / (n_heads / "
        "n_kv_heads), so neighbouring rows of a group read the same cache rows with different "
        "queries.");
    // Columns: one per attended position, or, when they cannot all get a pixel, `bin` consecutive
    // positions per column with their weights summed (the attention mass on that range).
    char buf[64];
    std::snprintf(buf, sizeof buf, "h%d kv%d", n_heads - 1, n_heads / group - 1);
    const float label_w = std::ceil(ImGui::CalcTextSize(buf).x) + 8;
    const int avail_cols = std::max(1, int(ImGui::GetContentRegionAvail().x - label_w));
    const int bin = (n_att + avail_cols - 1) / avail_cols;
    const int n_cols = (n_att + bin - 1) / bin;
    auto col_first = [&](int col) { return col * bin; };
    auto col_end = [&](int col) { return std::min(n_att, (col + 1) * bin); };
    auto col_weight = [&](int h, int col) {
        float w = 0;
        for (int i = col_first(col); i < col_end(col); i++) w += weight(h, i);
        return w;
    };
    ImGui::PushTextWrapPos(0.0f);
    ImGui::Text("the query is A's newest row: position %d, \"%s\"; it attended %s (%d positions)", q_pos,
                text_of(q_pos).c_str(), ranges(s.attended).c_str(), n_att);
    if (own)
        ImGui::TextDisabled(
            "h2o: each layer's KV head keeps its own %d positions (listed: layer 0, KV head 0's); "
            "hover a cell for its position",
            n_att);
    if (s.phase == Step::Phase::prefill)
        ImGui::TextDisabled("prefill: all %d prompt rows were computed at once; this shows the last one", s.n_new);
    if (bin > 1) ImGui::TextDisabled("too many positions for one pixel each: a column sums %d positions' weights", bin);
    ImGui::PopTextWrapPos();
    static bool per_head = true;
    ImGui::Checkbox("per-head scale", &per_head);
    // Colour legend: a ramp from 0 to the scale's top, beside the checkbox when it fits.
    constexpr int kSteps = 48, kStepW = 3;
    const char* top_label = per_head ? "row max" : "1";
    const float spacing = ImGui::GetStyle().ItemSpacing.x;
    ImGui::SameLine(0, 20);
    if (ImGui::GetContentRegionAvail().x <
        ImGui::CalcTextSize("0").x + kSteps * kStepW + ImGui::CalcTextSize(top_label).x + 2 * spacing)
        ImGui::NewLine();
    ImGui::TextUnformatted("0");
    ImGui::SameLine();
    {
        ImDrawList* dl = ImGui::GetWindowDrawList();
        const float h = ImGui::GetFrameHeight();
        const ImVec2 p = floored(ImGui::GetCursorScreenPos());
        for (int i = 0; i < kSteps; i++)
            dl->AddRectFilled(ImVec2(p.x + i * kStepW, p.y + 4), ImVec2(p.x + (i + 1) * kStepW, p.y + h - 4),
                              heat(float(i) / (kSteps - 1)));
        ImGui::Dummy(ImVec2(kSteps * kStepW, h));
    }
    ImGui::SameLine();
    ImGui::TextUnformatted(top_label);

    // Fit the heatmap: rows = query heads (a little space between KV groups), columns as above.
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    const float line_h = ImGui::GetTextLineHeight();
    const int n_groups = (n_heads + group - 1) / group;
    const int group_gap = group > 1 ? 3 : 0;
    const float axis_h = 2 * line_h + 8;
    const int px = std::clamp(int(avail.x - label_w) / n_cols, 1, kMaxPitchX);
    Cells c = cells_for_pitch(px, 1);
    for (int py = kMaxPitchY; py >= 1; py--) {
        c = cells_for_pitch(px, py);
        if (n_heads * py - c.gap + (n_groups - 1) * group_gap + axis_h <= avail.y) break;
    }
    const int grid_w = n_cols * c.pitch_x() - c.gap;
    const int grid_h = n_heads * c.pitch_y() - c.gap + (n_groups - 1) * group_gap;

    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImU32 text_col = ImGui::GetColorU32(ImGuiCol_Text);
    const ImU32 dim_col = ImGui::GetColorU32(ImGuiCol_TextDisabled);
    const ImVec2 origin = floored(ImGui::GetCursorScreenPos());
    const ImVec2 g(origin.x + label_w, origin.y);
    auto row_y = [&](int h) { return g.y + h * c.pitch_y() + (h / group) * group_gap; };
    float last_label_y = -1e9f;
    for (int h = 0; h < n_heads; h++) {
        float top = 0;
        for (int col = 0; col < n_cols; col++) top = std::max(top, col_weight(h, col));
        const float scale = per_head ? (top > 0 ? 1 / top : 0) : 1;
        const float y = row_y(h);
        for (int col = 0; col < n_cols; col++) {
            const float x = g.x + col * c.pitch_x();
            dl->AddRectFilled(ImVec2(x, y), ImVec2(x + c.w, y + c.h), heat(col_weight(h, col) * scale));
        }
        if (y - last_label_y >= line_h) {
            std::snprintf(buf, sizeof buf, "h%d kv%d", h, h / group);
            dl->AddText(ImVec2(origin.x, y + std::floor((c.h - line_h) / 2)), dim_col, buf);
            last_label_y = y;
        }
    }
    const ImVec2 g_max(g.x + grid_w, g.y + grid_h);
    report_grid(f, "attention.heatmap", g, g_max, c);

    // Position axis: labels at round positions, and the query's column marked.
    const float axis_y = g_max.y + 2;
    std::snprintf(buf, sizeof buf, "%d", s.attended.back());
    const float tick_w = ImGui::CalcTextSize(buf).x + 8;
    const int every = tick_every(c.pitch_x(), tick_w, bin);
    const float q_x = g.x + (n_cols - 1) * c.pitch_x();
    const float q_label_w = ImGui::CalcTextSize("query").x;
    for (int col = 0; col < n_cols; col++) {
        const int t = s.attended[std::size_t(col_first(col))];
        const int prev = col > 0 ? s.attended[std::size_t(col_first(col)) - 1] : -1;
        // Label round positions, and the first after a gap (the window's jump past evicted rows).
        const bool jump = col > 0 && t != prev + 1;
        if (col > 0 && t / every == prev / every && !jump) continue;
        const float x = g.x + col * c.pitch_x();
        if (col != n_cols - 1 && x + tick_w > q_x + c.w - q_label_w) continue;  // keep clear of the query's label
        std::snprintf(buf, sizeof buf, "%d", t);
        tick(dl, x, axis_y, dim_col, buf);
        if (jump) dl->AddText(ImVec2(x - ImGui::CalcTextSize("|").x - 1, axis_y + 3), dim_col, "|");
    }
    const float qc = q_x + c.w * 0.5f;
    dl->AddTriangleFilled(ImVec2(qc, axis_y), ImVec2(qc - 4, axis_y + 6), ImVec2(qc + 4, axis_y + 6), palette::newest);
    std::snprintf(buf, sizeof buf, "query %d", q_pos);
    const float qw = ImGui::CalcTextSize(buf).x;
    dl->AddText(ImVec2(std::max(g.x, std::min(qc - qw / 2, g_max.x - qw)), axis_y + line_h + 4), text_col, buf);
    ImGui::Dummy(ImVec2(label_w + grid_w, grid_h + axis_h));

    // Tooltip: the hovered cell's head, position, token and weight.
    const ImVec2 mouse = ImGui::GetIO().MousePos;
    if (ImGui::IsWindowHovered() && ImGui::IsMouseHoveringRect(g, g_max, false)) {
        const int col = std::min(n_cols - 1, int((mouse.x - g.x) / c.pitch_x()));
        int h = 0;
        while (h + 1 < n_heads && mouse.y >= row_y(h + 1)) h++;
        float sum = 0, top = 0;
        for (int j = 0; j < n_att; j++) sum += weight(h, j), top = std::max(top, weight(h, j));
        ImGui::BeginTooltip();
        ImGui::Text("query head %d (reads KV head %d)", h, h / group);
        if (bin == 1) {
            const int t = position(h, col);
            ImGui::Text("pos %d, token \"%s\"%s", t, text_of(t).c_str(), t == q_pos ? " (the query itself)" : "");
            ImGui::Text("weight %.4f", weight(h, col));
        } else {
            const int t0 = position(h, col_first(col)), t1 = position(h, col_end(col) - 1);
            ImGui::Text("pos %d-%d, tokens \"%s\" .. \"%s\"", t0, t1, text_of(t0).c_str(), text_of(t1).c_str());
            ImGui::Text("summed weight %.4f", col_weight(h, col));
        }
        ImGui::TextDisabled("row max %.4f, row sum %.4f", top, sum);
        ImGui::EndTooltip();
    }
    ImGui::End();
}

}  // namespace kvlab::viz
