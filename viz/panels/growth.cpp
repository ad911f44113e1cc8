// kvlab viewer: the growth panel. Per layer, a K grid and a V grid (columns = positions, rows = KV
// heads) filling as sequence A's cache grows: the prefill writes every prompt column at once, each
// decode step one more column. All grids fill together because every layer and KV head caches a
// row per position.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "draw.h"
#include "panels.h"

namespace kvlab::viz {
namespace {

constexpr int kMaxPitch = 20;  // px per cell, gap included: bigger cells stop helping

// The header's sizes: whole bytes below 10 KiB, one decimal above; its own rule, not bytes()'s.
std::string bytes_text(std::int64_t b) {
    char buf[64];
    if (b < 10 * 1024)
        std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
    else if (b < 10 * 1024 * 1024)
        std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024);
    else
        std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / (1024 * 1024));
    return buf;
}

// Draws a rows x cols grid whose colour depends on the column only, merging equal neighbours
// into one rectangle where no gap separates them (keeps the vertex count low for long sequences).
void draw_columns(ImDrawList* dl, ImVec2 origin, int cols, int rows, const Cells& c, const std::vector<ImU32>& col) {
    const int bands = c.gap ? rows : 1;
    const int band_h = c.gap ? c.h : rows * c.h;
    for (int r = 0; r < bands; r++) {
        const float y = origin.y + r * c.pitch_y();
        for (int x0 = 0; x0 < cols;) {
            int x1 = x0 + 1;
            if (!c.gap)
                while (x1 < cols && col[std::size_t(x1)] == col[std::size_t(x0)]) x1++;
            const float xa = origin.x + x0 * c.pitch_x();
            const float xb = origin.x + (x1 - 1) * c.pitch_x() + c.w;
            dl->AddRectFilled(ImVec2(xa, y), ImVec2(xb, y + band_h), col[std::size_t(x0)]);
            x0 = x1;
        }
    }
}

// H2O: one KV head's colour per column (a column of several positions: its first one's state, or
// "this step" if the step wrote any of them).
std::vector<ImU32> head_columns(const Step& s, int prompt_len, int lh, int pairs, int bin, int N) {
    const int cols = (N + bin - 1) / bin;
    std::vector<ImU32> col(std::size_t(std::max(0, cols)));  // [cols]
    for (int k = 0; k < cols; k++) {
        CellState st = state_of(k * bin, s, prompt_len, true, lh, pairs);
        for (int pos = k * bin; pos < std::min(N, (k + 1) * bin); pos++)
            if (state_of(pos, s, prompt_len, true, lh, pairs) == CellState::newest) st = CellState::newest;
        col[std::size_t(k)] = colour_of(st);
    }
    return col;
}

// Where the grids go: stacked (K above V) or side by side, whichever gives larger cells.
struct Layout {
    bool side_by_side = false;
    bool fits = false;
    Cells cells;
    int bin = 1;        // positions per column: more than 1 only when N exceeds the pixels available
    int cols = 0;       // ceil(N / bin)
    float row_h = 0;    // one grid's band: max(grid height, a text line)
    float layer_h = 0;  // one layer's K and V
};

}  // namespace

void draw_growth(const Frame& f) {
    if (!begin_panel("Cache growth", f)) return;
    const SessionInfo& info = *f.info;
    const Config& cfg = info.config;
    const Step& s = f.step();
    const SeqView* a = seq_a(s);
    const int n_layers = std::max(1, cfg.n_layers);
    const int n_kv_heads = std::max(1, cfg.n_kv_heads);
    const int prompt_len = int(info.prompt.size());
    const bool window = evicts(info.settings.variant);
    // Columns for the final length, so the grids do not rescale as they fill.
    const int N = final_length(info, s);

    // Header: what the step wrote and what the cache holds.
    if (s.n_new > 1)
        ImGui::Text("step %d (%s): wrote positions %d-%d at once", s.index, s.label.c_str(), s.first_pos,
                    s.first_pos + s.n_new - 1);
    else if (s.n_new == 1)
        ImGui::Text("step %d (%s): wrote position %d", s.index, s.label.c_str(), s.first_pos);
    else
        ImGui::Text("step %d (%s): A wrote nothing", s.index, s.label.c_str());
    ImGui::SameLine();
    help_marker(
        "One cell is one cached row: head_size floats of K (or V) for one layer, one KV head and one "
        "position. Every layer and every KV head caches a K row and a V row for every position, so all "
        "grids grow together: 2 x 4 B x n_layers x n_kv_heads x head_size bytes per position.\n\n"
        "The prefill runs the whole prompt through the model as one matrix pass, so it writes every "
        "prompt position's rows at once: many columns in one step. A decode step runs one new token, "
        "writes one column, and reads the earlier columns instead of recomputing them.\n\n"
        "Window variant: positions that are neither attention sinks nor in the sliding window are "
        "evicted; their slots hold newer positions. FIFO: a window without sinks.\n\n"
        "H2O: each layer's KV head keeps the recent positions plus the heavy ones that received the most "
        "attention so far, so every row of the grid evicts its own positions.");
    // Bytes of one stored row (fp32: 4 B x head_size; an integer format's group scales included).
    const std::int64_t row_bytes = kv_row_bytes(int(f.info->kv_format), cfg.head_size());
    const std::int64_t per_pos = 2LL * row_bytes * cfg.n_layers * cfg.n_kv_heads;
    ImGui::PushTextWrapPos(0.0f);
    ImGui::Text("T = %d of %d positions; A's K and V: %s = T x %lld B", s.length, N,
                bytes_text(per_pos * s.length).c_str(), static_cast<long long>(per_pos));
    ImGui::TextDisabled(
        "per position: 2 (K, V) x %d layers x %d KV heads x %lld B (a row of %d head_size in %s); all caches: %s "
        "used, %s reserved",
        cfg.n_layers, cfg.n_kv_heads, static_cast<long long>(row_bytes), cfg.head_size(),
        kv_format_name(f.info->kv_format), bytes_text(s.kv_used_bytes).c_str(),
        bytes_text(s.kv_reserved_bytes).c_str());
    ImGui::PopTextWrapPos();
    legend_item(palette::prefill, "prefill");
    legend_item(palette::decode, "decode");
    legend_item(palette::newest, "this step");
    legend_item(palette::empty, "not written");
    if (window) legend_item(palette::evicted, "evicted");
    ImGui::NewLine();

    // Fit the cells into what is left of the window.
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    const float line_h = ImGui::GetTextLineHeight();
    char buf[32];
    std::snprintf(buf, sizeof buf, "layer %d", n_layers - 1);
    const float label_w = std::ceil(ImGui::CalcTextSize(buf).x) + 8;
    const float kv_w = std::ceil(ImGui::CalcTextSize("V").x) + 6;
    const float side_gap = 16, inner_gap = 3, layer_gap = 7;
    const float axis_h = line_h + 5;
    auto try_layout = [&](bool side) {
        Layout lay;
        lay.side_by_side = side;
        const int n_grids = side ? 2 : 1;
        const int grid_w = std::max(1, int((avail.x - label_w - n_grids * kv_w - (side ? side_gap : 0)) / n_grids));
        lay.bin = (N + grid_w - 1) / grid_w;
        lay.cols = (N + lay.bin - 1) / lay.bin;
        const int px = std::clamp(grid_w / lay.cols, 1, kMaxPitch);
        const float note_h = lay.bin > 1 ? line_h + ImGui::GetStyle().ItemSpacing.y : 0;
        for (int py = std::min(kMaxPitch, std::max(px, 6)); py >= 1; py--) {
            lay.cells = cells_for_pitch(px, py);
            lay.row_h = std::max(float(n_kv_heads * py - lay.cells.gap), line_h);
            lay.layer_h = side ? lay.row_h : 2 * lay.row_h + inner_gap;
            lay.fits = n_layers * lay.layer_h + (n_layers - 1) * layer_gap + axis_h + note_h <= avail.y;
            if (lay.fits) break;
        }
        return lay;
    };
    const Layout stacked = try_layout(false), side = try_layout(true);
    auto score = [](const Layout& l) {
        return (l.fits ? 1e9 : 0) - 1e6 * l.bin + 1e4 * std::min(l.cells.w, l.cells.h) + l.cells.w * l.cells.h;
    };
    const Layout lay = score(side) > score(stacked) ? side : stacked;
    const Cells& c = lay.cells;
    const int bin = lay.bin, cols = lay.cols;
    const int grid_w = cols * c.pitch_x() - c.gap, grid_h = n_kv_heads * c.pitch_y() - c.gap;

    // One colour per column, shared by every grid. A column of several positions shows its first
    // position's state, or "this step" if the step wrote any of them.
    std::vector<ImU32> col(static_cast<std::size_t>(cols));
    for (int k = 0; k < cols; k++) {
        CellState st = state_of(k * bin, s, prompt_len, window);
        for (int pos = k * bin; pos < std::min(N, (k + 1) * bin); pos++)
            if (state_of(pos, s, prompt_len, window) == CellState::newest) st = CellState::newest;
        // The planted bug the pixel tests must catch: the newest cells are left unpainted.
        if (st == CellState::newest && f.plant == "growth-skips-newest") st = CellState::empty;
        col[std::size_t(k)] = colour_of(st);
    }

    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImU32 text_col = ImGui::GetColorU32(ImGuiCol_Text);
    const ImU32 dim_col = ImGui::GetColorU32(ImGuiCol_TextDisabled);
    const ImVec2 origin = floored(ImGui::GetCursorScreenPos());
    const bool hovered_window = ImGui::IsWindowHovered();
    const ImVec2 mouse = ImGui::GetIO().MousePos;
    int hover_col = -1, hover_layer = -1, hover_head = -1;
    const char* hover_tensor = "K";
    float grids_x[2] = {origin.x + label_w + kv_w, 0};
    grids_x[1] = lay.side_by_side ? grids_x[0] + grid_w + side_gap + kv_w : grids_x[0];
    for (int l = 0; l < n_layers; l++) {
        const float y = origin.y + l * (lay.layer_h + layer_gap);
        std::snprintf(buf, sizeof buf, "layer %d", l);
        dl->AddText(ImVec2(origin.x, y + std::floor((lay.row_h - line_h) / 2)), text_col, buf);
        for (int kv = 0; kv < 2; kv++) {
            const ImVec2 g(grids_x[kv], lay.side_by_side || kv == 0 ? y : y + lay.row_h + inner_gap);
            dl->AddText(ImVec2(g.x - kv_w, g.y + std::floor((lay.row_h - line_h) / 2)), dim_col, kv ? "V" : "K");
            if (s.kept.empty()) {
                draw_columns(dl, g, cols, n_kv_heads, c, col);
            } else {  // H2O: each KV head of each layer keeps its own positions
                for (int h = 0; h < n_kv_heads; h++)
                    draw_columns(dl, ImVec2(g.x, g.y + h * c.pitch_y()), cols, 1, c,
                                 head_columns(s, prompt_len, l * n_kv_heads + h, n_layers * n_kv_heads, bin, N));
            }
            const ImVec2 g_max(g.x + grid_w, g.y + grid_h);
            std::snprintf(buf, sizeof buf, "growth.l%d.%s", l, kv ? "V" : "K");
            report_grid(f, buf, g, g_max, c);
            if (hovered_window && ImGui::IsMouseHoveringRect(g, g_max, false)) {
                hover_col = std::min(cols - 1, int((mouse.x - g.x) / c.pitch_x()));
                hover_head = std::min(n_kv_heads - 1, int((mouse.y - g.y) / c.pitch_y()));
                hover_layer = l;
                hover_tensor = kv ? "V" : "K";
            }
        }
    }

    // Position axis under the last layer: ticks at round positions far enough apart for their labels.
    const float axis_y = origin.y + n_layers * lay.layer_h + (n_layers - 1) * layer_gap + 2;
    std::snprintf(buf, sizeof buf, "%d", N);
    const float tick_label_w = ImGui::CalcTextSize(buf).x + 8;
    const int every = tick_every(c.pitch_x(), tick_label_w, bin);
    for (int g = 0; g < (lay.side_by_side ? 2 : 1); g++) {
        for (int pos = 0; pos < N; pos += every) {
            const float x = grids_x[g] + pos / bin * c.pitch_x();
            std::snprintf(buf, sizeof buf, "%d", pos);
            tick(dl, x, axis_y, dim_col, buf);
        }
        if (hover_col >= 0) {  // a caret under the hovered column
            const float x = grids_x[g] + hover_col * c.pitch_x() + c.w * 0.5f;
            dl->AddTriangleFilled(ImVec2(x, axis_y - 1), ImVec2(x - 4, axis_y + 5), ImVec2(x + 4, axis_y + 5),
                                  text_col);
        }
    }
    const float total_w = grids_x[1] + grid_w - origin.x;
    ImGui::Dummy(ImVec2(total_w, axis_y + axis_h - origin.y));
    if (bin > 1) ImGui::TextDisabled("%d positions per column: too many for one pixel each", bin);

    if (hover_col >= 0) {
        const int pos = hover_col * bin;
        ImGui::BeginTooltip();
        if (bin > 1)
            ImGui::Text("pos %d-%d (one column); pos %d:", pos, std::min(N, pos + bin) - 1, pos);
        else
            ImGui::Text("pos %d", pos);
        token_line(info, a, pos);
        const CellState st =
            state_of(pos, s, prompt_len, window, hover_layer * n_kv_heads + hover_head, n_layers * n_kv_heads);
        const int decode_step = pos - prompt_len + 1;  // decode step k writes position prompt_len + k - 1
        if (st == CellState::empty) {
            ImGui::TextUnformatted("not written yet");
        } else {
            if (pos < prompt_len)
                ImGui::TextUnformatted("written by the prefill");
            else
                ImGui::Text("written by decode step %d", decode_step);
            if (st == CellState::newest) ImGui::TextUnformatted("(by the step shown)");
            if (st == CellState::evicted)
                ImGui::TextUnformatted(s.kept.empty() ? "evicted: out of the window, its slot reused"
                                                      : "evicted by this layer's KV head: the lightest of its older "
                                                        "positions by accumulated attention");
        }
        ImGui::TextDisabled("layer %d %s, KV head %d: %d floats", hover_layer, hover_tensor, hover_head,
                            cfg.head_size());
        ImGui::EndTooltip();
    }
    ImGui::End();
}

}  // namespace kvlab::viz
