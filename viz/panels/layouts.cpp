// kvlab viewer: the layouts panel. One layer's K cache as linear memory in the two orders a
// contiguous cache can use, with the rows the shown step reads swept in attention's order:
//   head-major  [n_kv_heads][max_seq][head_size]  a head's rows are adjacent: one run per head
//   seq-major   [max_seq][n_kv_heads][head_size]  llama2.c's: a position's kv_dim floats are
//                                                 adjacent, so a head's rows are kv_dim apart
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

constexpr int kMaxPitch = 16;  // px per cell, gap included

// Contiguous runs in a sequence of row addresses: a new run starts wherever the next address is
// not the one right after the previous.
int count_runs(const std::vector<int>& rows) {
    int runs = 0;
    for (std::size_t i = 0; i < rows.size(); i++)
        if (i == 0 || rows[i] != rows[i - 1] + 1) runs++;
    return runs;
}

// One memory order: where the row of (KV head h, position t) lives, in rows from the start.
struct Order {
    const char* name;   // the region's name
    const char* title;  // what it is
    bool head_major;
    int row(int h, int t, int n_kv_heads, int N) const { return head_major ? h * N + t : t * n_kv_heads + h; }
};

// The MLA model's latent cache (--mla-rank): layer l's rows [N][rank + rope_dim], one per position
// and shared by every head, and the newest position's row as a heat strip. One line of cells, as
// large as the K grids' `pitch` or the width allows (up to 8 px).
void draw_mla_latent(const Frame& f, const Step& s, int l, int N, int prompt_len, int pitch) {
    const SessionInfo& info = *f.info;
    const Config& cfg = info.config;
    const int row = info.mla_rank + info.mla_rope_dim;
    const std::int64_t latent_bytes = 4LL * row, kv_bytes = 2LL * 4 * cfg.n_kv_heads * cfg.head_size();
    ImGui::PushTextWrapPos(0.0f);
    ImGui::Text("MLA latent cache, layer %d: [N][rank %d + rope_dim %d], one row per position for every head", l,
                info.mla_rank, info.mla_rope_dim);
    ImGui::TextDisabled(
        "a random MLA model of this shape follows A's tokens (core/mla.h): %lld B per position and layer against "
        "%lld B of K and V here; %d positions, %lld B in all layers",
        static_cast<long long>(latent_bytes), static_cast<long long>(kv_bytes), s.mla_length,
        static_cast<long long>(s.mla_bytes));
    ImGui::PopTextWrapPos();
    pitch = std::max(pitch, std::clamp(int(ImGui::GetContentRegionAvail().x) / std::max(1, N), 1, 8));
    const Cells c = cells_for_pitch(pitch, pitch);
    std::vector<ImU32> col(static_cast<std::size_t>(N));  // [N]: a position's row, coloured by its state
    for (int t = 0; t < N; t++)
        col[std::size_t(t)] = t < s.mla_length ? colour_of(state_of(t, s, prompt_len, false)) : palette::empty;
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 g = floored(ImGui::GetCursorScreenPos());
    for (int t = 0; t < N; t++)
        dl->AddRectFilled(ImVec2(g.x + t * c.pitch_x(), g.y), ImVec2(g.x + t * c.pitch_x() + c.w, g.y + c.h),
                          col[std::size_t(t)]);
    report_grid(f, "layouts.mla", g, ImVec2(g.x + N * c.pitch_x() - c.gap, g.y + c.h), c);
    ImGui::Dummy(ImVec2(float(N * c.pitch_x()), float(c.h)));
    // The newest row's floats, |x| scaled to the row's largest: the latent, then the RoPE key.
    if (s.mla_newest.size() != std::size_t(cfg.n_layers) * std::size_t(row) || row == 0) return;
    const float* r = s.mla_newest.data() + std::size_t(l) * std::size_t(row);
    float top = 0;
    for (int i = 0; i < row; i++) top = std::max(top, std::fabs(r[i]));
    const ImVec2 h = floored(ImGui::GetCursorScreenPos());
    const float w = std::max(2.0f, std::min(12.0f, ImGui::GetContentRegionAvail().x / float(row)));
    for (int i = 0; i < row; i++)
        dl->AddRectFilled(ImVec2(h.x + i * w, h.y), ImVec2(h.x + (i + 1) * w - 1, h.y + 10),
                          heat(top > 0 ? std::fabs(r[i]) / top : 0.0f));
    ImGui::Dummy(ImVec2(row * w, 10));
    ImGui::TextDisabled("position %d's row: %d latent floats, then %d of its RoPE key (|x|, row max = %.3g)",
                        s.mla_length - 1, info.mla_rank, info.mla_rope_dim, top);
}

}  // namespace

void draw_layouts(const Frame& f) {
    if (!begin_panel("Layouts", f)) return;
    const SessionInfo& info = *f.info;
    const Config& cfg = info.config;
    const Step& s = f.step();
    const SeqView* a = seq_a(s);
    const int l = std::clamp(f.layer, 0, std::max(0, cfg.n_layers - 1));
    const int n_kv_heads = std::max(1, cfg.n_kv_heads);
    const int prompt_len = int(info.prompt.size());
    const bool window = evicts(info.settings.variant);
    // The final length stands in for max_seq: max_seq rows per head would not fit on screen.
    const int N = final_length(info, s);
    const std::int64_t row_bytes = 4LL * cfg.head_size();
    const int n_rows = n_kv_heads * N;

    // The reads in the order attention makes them: for each KV head, the attended positions.
    const int n_att = int(s.attended.size());
    const int n_reads = n_kv_heads * n_att;
    const float p = std::clamp(f.progress, 0.0f, 1.0f);
    const int shown = std::min(n_reads, int(std::ceil(p * n_reads)));
    std::vector<int> read_rank(std::size_t(n_rows), -1);  // [n_kv_heads, N] position in the read order
    for (int h = 0; h < n_kv_heads; h++)
        for (int i = 0; i < n_att; i++)
            if (s.attended[std::size_t(i)] < N)
                read_rank[std::size_t(h * N + s.attended[std::size_t(i)])] = h * n_att + i;

    ImGui::Text("layer %d, K as linear memory (V is laid out the same)", l);
    ImGui::SameLine();
    help_marker(
        "Attention for one new token reads every cached row of a KV head, one after another: that is "
        "most of a decode step's memory traffic.\n\n"
        "Head-major [n_kv_heads][max_seq][head_size] keeps a head's rows next to each other, so the "
        "step reads one contiguous run per head: prefetchers and wide loads (and GPU coalescing) work "
        "best on that.\n\n"
        "Sequence-major [max_seq][n_kv_heads][head_size] is llama2.c's layout: a position's kv_dim "
        "floats are adjacent, so writing the step's new K (or V) row is one contiguous write of kv_dim "
        "floats, but a head's reads jump n_kv_heads rows at a time.\n\n"
        "Both hold the same floats; only the addresses differ.");
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextDisabled(
        "one cell = one row (head_size = %d floats, %lld B); %d positions per head, not max_seq = %d, so it fits; "
        "addresses grow left to right, line by line",
        cfg.head_size(), static_cast<long long>(row_bytes), N, cfg.max_seq);
    if (n_reads > 0)
        ImGui::Text("read sweep: %d of %d rows (%d KV heads x %d positions)", shown, n_reads, n_kv_heads, n_att);
    else
        ImGui::TextUnformatted("this step read no rows of A");
    ImGui::PopTextWrapPos();
    legend_item(palette::prefill, "prefill");
    legend_item(palette::decode, "decode");
    legend_item(palette::newest, "written this step");
    legend_item(palette::read, "read this step");
    legend_item(palette::empty, "not written");
    if (window) legend_item(palette::evicted, "evicted");
    ImGui::NewLine();

    const Order orders[2] = {
        {"layouts.head_major", "head-major [n_kv_heads][N][head_size]", true},
        {"layouts.seq_major", "sequence-major [N][n_kv_heads][head_size] (llama2.c)", false},
    };
    // Per order: how many contiguous runs the step's reads and writes make, and a head's stride.
    std::string stats[2];
    for (int o = 0; o < 2; o++) {
        // Attention reads head by head, so a run never continues into the next head (in the real
        // array heads are max_seq rows apart, not N).
        int read_runs = 0;
        std::vector<int> reads, writes;
        for (int h = 0; h < n_kv_heads; h++) {
            reads.clear();
            for (int t : s.attended) reads.push_back(orders[o].row(h, t, n_kv_heads, N));
            read_runs += count_runs(reads);
        }
        for (int h = 0; h < n_kv_heads; h++)
            for (int t = s.first_pos; t < s.first_pos + s.n_new; t++)
                writes.push_back(orders[o].row(h, t, n_kv_heads, N));
        std::sort(writes.begin(), writes.end());
        char buf[256];
        int len = std::snprintf(buf, sizeof buf, "reads %d contiguous run%s", read_runs, read_runs == 1 ? "" : "s");
        if (n_att >= 2) {
            const std::int64_t stride = std::int64_t(reads[1] - reads[0]) * row_bytes;
            len += std::snprintf(buf + len, sizeof buf - std::size_t(len), "; a head's next row +%lld B%s",
                                 static_cast<long long>(stride), stride == row_bytes ? " (adjacent)" : " away");
        }
        if (!writes.empty())
            std::snprintf(buf + len, sizeof buf - std::size_t(len), "; writes %d run%s", count_runs(writes),
                          count_runs(writes) == 1 ? "" : "s");
        stats[o] = buf;
    }

    // Fit one square cell size for both orders: same addresses at the same place in both pictures.
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    const float line_h = ImGui::GetTextLineHeight();
    char buf[64];
    std::snprintf(buf, sizeof buf, "+%lld", static_cast<long long>(n_rows * row_bytes));
    const float addr_w = std::ceil(ImGui::CalcTextSize(buf).x) + 8;
    const float block_gap = 8;
    float text_h = 0;
    for (int o = 0; o < 2; o++)
        text_h += ImGui::CalcTextSize(orders[o].title, nullptr, false, avail.x).y +
                  ImGui::CalcTextSize(stats[o].c_str(), nullptr, false, avail.x).y +
                  2 * ImGui::GetStyle().ItemSpacing.y;
    if (info.mla_rank > 0) text_h += 5 * (line_h + ImGui::GetStyle().ItemSpacing.y) + 8 + 10;  // its block
    const float spacing = ImGui::GetStyle().ItemSpacing.y;
    auto fits = [&](int pitch, int lines) {
        return text_h + 2 * (lines * pitch - cells_for_pitch(pitch, pitch).gap + block_gap + spacing) <= avail.y;
    };
    // Prefer one line per KV head: head-major then reads like the growth grid, one run per line.
    int pitch = std::min(kMaxPitch, int(avail.x - addr_w) / N);
    while (pitch >= 4 && !fits(pitch, n_kv_heads)) pitch--;
    int per_line = N;
    if (pitch < 4) {
        // Otherwise wrap at whole positions of seq-major, with the largest cells that fit.
        for (pitch = kMaxPitch;; pitch--) {
            const int fit = std::max(1, int(avail.x - addr_w) / pitch);
            per_line = fit >= n_kv_heads ? fit / n_kv_heads * n_kv_heads : fit;
            if (pitch == 1 || fits(pitch, (n_rows + per_line - 1) / per_line)) break;
        }
    }
    const Cells c = cells_for_pitch(pitch, pitch);
    const int n_lines = (n_rows + per_line - 1) / per_line;
    const int grid_w = per_line * c.pitch_x() - c.gap, grid_h = n_lines * c.pitch_y() - c.gap;

    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImU32 dim_col = ImGui::GetColorU32(ImGuiCol_TextDisabled);
    const bool hovered_window = ImGui::IsWindowHovered();
    const ImVec2 mouse = ImGui::GetIO().MousePos;
    for (int o = 0; o < 2; o++) {
        const Order& ord = orders[o];
        ImGui::PushTextWrapPos(0.0f);
        ImGui::TextUnformatted(ord.title);
        ImGui::TextDisabled("%s", stats[o].c_str());
        ImGui::PopTextWrapPos();
        const ImVec2 origin = floored(ImGui::GetCursorScreenPos());
        const ImVec2 g(origin.x + addr_w, origin.y);
        std::vector<ImU32> colour(static_cast<std::size_t>(n_rows));
        for (int h = 0; h < n_kv_heads; h++) {
            for (int t = 0; t < N; t++) {
                const int rank = read_rank[std::size_t(h * N + t)];
                colour[std::size_t(ord.row(h, t, n_kv_heads, N))] =
                    rank >= 0 && rank < shown ? palette::read : colour_of(state_of(t, s, prompt_len, window));
            }
        }
        // Cells in address order, wrapping into lines; equal neighbours merge where no gap separates them.
        float last_label_y = -1e9f;
        for (int line = 0; line < n_lines; line++) {
            const float y = g.y + line * c.pitch_y();
            const int first = line * per_line, end = std::min(n_rows, first + per_line);
            for (int r = first; r < end;) {
                int r1 = r + 1;
                if (!c.gap)
                    while (r1 < end && colour[std::size_t(r1)] == colour[std::size_t(r)]) r1++;
                dl->AddRectFilled(ImVec2(g.x + (r - first) * c.pitch_x(), y),
                                  ImVec2(g.x + (r1 - 1 - first) * c.pitch_x() + c.w, y + c.h), colour[std::size_t(r)]);
                r = r1;
            }
            if (y - last_label_y >= line_h) {  // the line's byte offset, where there is room for it
                std::snprintf(buf, sizeof buf, "+%lld", static_cast<long long>(first * row_bytes));
                dl->AddText(ImVec2(origin.x, y + std::floor((c.h - line_h) / 2)), dim_col, buf);
                last_label_y = y;
            }
        }
        const ImVec2 g_max(g.x + grid_w, g.y + grid_h);
        report_grid(f, ord.name, g, g_max, c);
        ImGui::Dummy(ImVec2(addr_w + grid_w, grid_h + block_gap));

        if (hovered_window && ImGui::IsMouseHoveringRect(g, g_max, false)) {
            const int r = int((mouse.y - g.y) / c.pitch_y()) * per_line + int((mouse.x - g.x) / c.pitch_x());
            if (r >= 0 && r < n_rows) {
                const int h = ord.head_major ? r / N : r % n_kv_heads;
                const int t = ord.head_major ? r % N : r / n_kv_heads;
                ImGui::BeginTooltip();
                ImGui::Text("row at +%lld B: KV head %d, pos %d", static_cast<long long>(r * row_bytes), h, t);
                token_line(info, a, t);
                const int rank = read_rank[std::size_t(h * N + t)];
                if (rank >= 0) ImGui::Text("read #%d of %d by this step", rank + 1, n_reads);
                ImGui::EndTooltip();
            }
        }
    }
    if (info.mla_rank > 0) draw_mla_latent(f, s, l, N, prompt_len, pitch);
    ImGui::End();
}

}  // namespace kvlab::viz
