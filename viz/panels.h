// kvlab viewer: the panels. Each is one function in its own file under panels/, drawing one
// ImGui window from a Frame; none of them changes the session.
//
//   phases     the prefill as one wide block over the prompt, then one box per decode step
//   growth     per layer, K and V grids (positions x KV heads) filling as the cache grows
//   layouts    one layer's cache as linear memory, head-major and sequence-major, with the
//              addresses a decode step reads
//   paged      the block pool coloured by owner, block tables, refcounts, copy-on-write, evictions
//   cost       cumulative FLOPs and time against T, naive and cached; KV bytes against T
//   attention  the newest row's attention weights per head over the positions it attended
//   exactness  naive against cached logits, every step: bitwise equal, or the ULP distance
//   bits       a K row's bits in fp32 and in the cache's KV format, and the cache's bytes per format
//   serving    (`--serve`, instead of the others) the pool under a continuous-batching load
//
// Panels report where they drew what the tests look for (Report): the pixel tests find the
// cache cells, the phase marker and the pool's blocks by colour inside those rectangles.
#pragma once

#include <imgui.h>

#include <memory>
#include <string>
#include <vector>

#include "serving.h"
#include "state.h"

namespace kvlab::viz {

// Rectangles in framebuffer pixels, with the size of one cell where a panel draws a grid.
struct Region {
    std::string name;  // "growth.l0.K", "phases.timeline", "paged.pool", ...
    ImVec2 min, max;   // pixels, min inclusive, max exclusive
    int cell_w = 0, cell_h = 0;
};

struct Report {
    std::vector<Region> regions;
    void add(std::string name, ImVec2 min, ImVec2 max, int cell_w = 0, int cell_h = 0) {
        regions.push_back({std::move(name), min, max, cell_w, cell_h});
    }
};

// What one frame shows.
struct Frame {
    const SessionInfo* info = nullptr;
    std::vector<std::shared_ptr<const Step>> steps;  // every step computed so far, in order
    int cursor = 0;                                  // the step shown: steps[cursor]
    float progress = 0;        // 0..1 through the shown step's animation (the layouts' read sweep)
    Report* report = nullptr;  // where the tests want regions; may be null
    int layer = 0;             // the layer the layouts and attention panels show (a control)
    // A planted viewer bug that the pixel tests must catch ("" in normal use):
    //   growth-skips-newest  the growth panel leaves the newest cells unpainted
    //   marker-stuck         the timeline's marker stays on the first step
    //   pool-hides-shared    the paged panel draws shared blocks as free
    //   bits-fp32-fields     the bits panel draws a format's code with fp32's field widths
    //   tiles-follow-rows    the key tiles of a prefill step are drawn twice as wide
    //   serving-hides-shared the serving panel draws blocks that several requests map as free
    std::string plant;
    const ServeRun* serving = nullptr;  // the serving view's run, or null: the cursor is its step then

    const Step& step() const { return *steps[cursor]; }
    bool empty() const { return steps.empty(); }
};

// One colour per meaning, shared by every panel and by the pixel tests (which read them from
// the layout file). Every cell colour is opaque and distinct from every other.
namespace palette {
inline constexpr ImU32 rgb(unsigned r, unsigned g, unsigned b) { return IM_COL32(r, g, b, 255); }
inline constexpr ImU32 empty = rgb(52, 56, 64);            // a cache cell not yet written
inline constexpr ImU32 prefill = rgb(70, 130, 220);        // written by the prefill
inline constexpr ImU32 decode = rgb(60, 190, 120);         // written by a decode step
inline constexpr ImU32 newest = rgb(250, 200, 40);         // written by the step shown
inline constexpr ImU32 evicted = rgb(120, 60, 60);         // out of a window: memory reused
inline constexpr ImU32 read = rgb(240, 90, 200);           // read by the step shown (layouts)
inline constexpr ImU32 marker = rgb(255, 64, 64);          // the current step on the timeline
inline constexpr ImU32 naive = rgb(230, 120, 50);          // naive decode's series and bars
inline constexpr ImU32 cached = rgb(80, 170, 240);         // cached decode's series and bars
inline constexpr ImU32 formula = rgb(200, 200, 200);       // a formula's line
inline constexpr ImU32 block_free = rgb(40, 44, 52);       // a pool block on the free list
inline constexpr ImU32 block_cached = rgb(96, 96, 110);    // unreferenced, published, reclaimable
inline constexpr ImU32 block_shared = rgb(255, 255, 255);  // outline of a block with refcount > 1
// Tiled attention's key tiles (the phases panel), alternating so that each tile shows.
inline constexpr ImU32 tile_even = rgb(150, 110, 230), tile_odd = rgb(230, 170, 90);
// A block owned by sequence s (A, B, C, ...) is filled with owner(s).
ImU32 owner(int seq);
// The bits panel: a bit of a float's sign, exponent or mantissa, set (bright) or clear.
inline constexpr ImU32 bit_sign_on = rgb(250, 110, 110), bit_sign_off = rgb(110, 50, 50);
inline constexpr ImU32 bit_exp_on = rgb(110, 200, 250), bit_exp_off = rgb(40, 80, 110);
inline constexpr ImU32 bit_man_on = rgb(170, 240, 120), bit_man_off = rgb(60, 100, 45);
inline constexpr ImU32 equal = rgb(70, 200, 90);   // bitwise equal
inline constexpr ImU32 differ = rgb(230, 70, 60);  // not equal
}  // namespace palette

// A "(?)" marker whose tooltip explains a concept in place, as ImGui's demo does.
void help_marker(const char* text);

void draw_phases(const Frame& f);
void draw_growth(const Frame& f);
void draw_layouts(const Frame& f);
void draw_paged(const Frame& f);
void draw_cost(const Frame& f);
void draw_attention(const Frame& f);
void draw_exactness(const Frame& f);
void draw_bits(const Frame& f);
void draw_serving(const Frame& f);  // f.serving must be set

}  // namespace kvlab::viz
