// kvlab viewer: what the panels draw alike: the empty-frame prologue, integer cell geometry,
// regions reported in framebuffer pixels, legend items, axis ticks and small text helpers.
// Definitions in common.cpp, or here when tiny.
#pragma once

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "panels.h"

namespace kvlab::viz {

// Begins the panel's window. False when it is collapsed or no step exists yet (it then says
// "waiting for the first step"): the window is already ended and the panel returns.
bool begin_panel(const char* title, const Frame& f);

// Snaps to whole pixels, so integer-sized cells drawn from there cover whole pixels: the pixel tests
// count cells by exact colour.
inline ImVec2 floored(ImVec2 p) { return ImVec2(std::floor(p.x), std::floor(p.y)); }

// A grid's integer cell size; a 1 px gap separates cells only when they are at least 4 px wide and
// tall: thinner cells would lose most of their colour to the gaps.
struct Cells {
    int w = 1, h = 1, gap = 0;
    int pitch_x() const { return w + gap; }
    int pitch_y() const { return h + gap; }
};

// Cells for a pitch (px per cell, gap included) of px across and py down.
inline Cells cells_for_pitch(int px, int py) {
    Cells c;
    c.gap = px >= 5 && py >= 5 ? 1 : 0;
    c.w = std::max(1, px - c.gap);
    c.h = std::max(1, py - c.gap);
    return c;
}

// Regions are in framebuffer pixels; ImGui coordinates differ from them only on scaled displays.
inline ImVec2 framebuffer_scale() { return ImGui::GetIO().DisplayFramebufferScale; }

// Adds [min, max) in ImGui coordinates to the frame's report, if it has one; cell_w and cell_h are
// already in framebuffer pixels.
void report(const Frame& f, std::string name, ImVec2 min, ImVec2 max, int cell_w = 0, int cell_h = 0);

// A grid of cells c: the cell size is rounded to whole framebuffer pixels.
void report_grid(const Frame& f, std::string name, ImVec2 min, ImVec2 max, const Cells& c);

// A colour square and its meaning; items continue on the same line while they fit.
void legend_item(ImU32 colour, const char* text);

// An axis tick at x, with its label under it.
void tick(ImDrawList* dl, float x, float axis_y, ImU32 colour, const char* label);

// Positions between labelled ticks: the smallest of 1, 2, 5, 10, ... 1000 whose labels, label_w
// wide, do not overlap when a column of pitch px holds bin positions.
int tick_every(int pitch, float label_w, int bin);

// [x0, x1) x [y0, y1), square corners.
inline void fill(ImDrawList* dl, float x0, float y0, float x1, float y1, ImU32 colour) {
    dl->AddRectFilled(ImVec2(x0, y0), ImVec2(x1, y1), colour, 0.0f);
}

// A ring of width w just outside [x0, x1) x [y0, y1): it lies in the gap, never on the cell.
inline void ring(ImDrawList* dl, float x0, float y0, float x1, float y1, float w, ImU32 colour) {
    fill(dl, x0 - w, y0 - w, x1 + w, y0, colour);
    fill(dl, x0 - w, y1, x1 + w, y1 + w, colour);
    fill(dl, x0 - w, y0, x0, y1, colour);
    fill(dl, x1, y0, x1 + w, y1, colour);
}
inline ImVec4 colour4(ImU32 c) { return ImGui::ColorConvertU32ToFloat4(c); }

// Sequence A (id 0): the sequence the growth, layouts and attention panels follow. Else the first
// sequence, or null when there is none.
const SeqView* seq_a(const Step& s);

// What position pos of sequence A holds after step s. Every layer and KV head has the same state
// (a step writes a position's rows in all of them), except what H2O evicts: with lh >= 0, layer
// and KV head lh (of `pairs`, n_layers * n_kv_heads) says whether it still keeps pos.
enum class CellState { empty, prefill, decode, newest, evicted };
CellState state_of(int pos, const Step& s, int prompt_len, bool window, int lh = -1, int pairs = 1);
// A dark-to-bright ramp (close to matplotlib's magma) for v in [0, 1]: attention weights, and the
// magnitudes of the MLA latent's newest row.
ImU32 heat(float v);
// The variants that evict rows (window, fifo, h2o): their panels show evicted cells.
bool evicts(Variant v);
ImU32 colour_of(CellState c);

// A's length when the session ends (at least its length now), at most max_seq: grids sized for it
// do not rescale as they fill.
int final_length(const SessionInfo& info, const Step& s);

// A sequence's name: its own, else A, B, ... by id.
std::string seq_name(const Step& s, int id);

// A tooltip line naming the token at position pos of sequence a; none where a holds no token.
void token_line(const SessionInfo& info, const SeqView* a, int pos);

// "512 B", "1.5 KiB", "2.00 MiB".
std::string bytes(double n);

}  // namespace kvlab::viz
