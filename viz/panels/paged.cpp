// kvlab viewer: the paged memory panel. The physical block pool as a grid, each block filled
// with the colours of the sequences whose block tables map it; the tables themselves; and what
// the caches did this step (allocations, sharing, copy-on-write, evictions).
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "draw.h"
#include "panels.h"

namespace kvlab::viz {
namespace {

constexpr ImU32 kCowRing = palette::newest;  // the private copy a copy-on-write made
// A cached block reclaimed this step; brighter than palette::evicted, too dark for a 2 px ring.
constexpr ImU32 kEvictedRing = palette::rgb(235, 110, 110);
constexpr ImU32 kEvictedText = kEvictedRing;
constexpr ImU32 kChipText = IM_COL32(12, 14, 20, 255);
constexpr ImU32 kUsedNoOwner = palette::formula;  // refcount > 0 but in no live table: should not happen

// A legend item; as_ring draws the colour as the grid draws its rings, around a free block.
void swatch(ImU32 colour, const char* text, bool as_ring = false) {
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const float h = ImGui::GetTextLineHeight();
    const ImVec2 p = ImGui::GetCursorScreenPos();
    const float s = std::floor(h * 0.7f), x = std::floor(p.x) + 2, y = std::floor(p.y + (h - s) / 2);
    if (as_ring) {
        fill(dl, x + 2, y + 2, x + s - 2, y + s - 2, palette::block_free);
        ring(dl, x + 2, y + 2, x + s - 2, y + s - 2, 2, colour);
    } else {
        fill(dl, x, y, x + s, y + s, colour);
    }
    ImGui::Dummy(ImVec2(s + 4, h));
    ImGui::SameLine(0, 4);
    ImGui::TextUnformatted(text);
}

// Where a sequence keeps a physical block: its logical block index, or -1.
int logical_index(const SeqView& s, int block) {
    for (size_t i = 0; i < s.table.size(); ++i)
        if (s.table[i] == block) return int(i);
    return -1;
}

void block_tooltip(const Frame& f, const PoolView& pool, int b) {
    const Step& st = f.step();
    ImGui::BeginTooltip();
    ImGui::Text("physical block %d", b);
    const auto state = pool.state[size_t(b)];
    const char* what = state == PoolView::State::used     ? "in use"
                       : state == PoolView::State::cached ? "cached: unreferenced but published, reclaimable"
                                                          : "free";
    ImGui::Text("state: %s", what);
    ImGui::Text("refcount %d, published %s", pool.refcount[size_t(b)], pool.published[size_t(b)] ? "yes" : "no");
    for (int id : pool.owners[size_t(b)]) {
        for (const SeqView& s : st.seqs) {
            if (s.id != id) continue;
            const int i = logical_index(s, b);
            if (i < 0) continue;
            const int first = i * pool.block_size;
            const int last = std::min(first + pool.block_size, int(s.tokens.size())) - 1;
            std::string text;
            for (int t = first; t <= last; ++t) text += token_text(*f.info, s.tokens[size_t(t)]);
            ImGui::TextColored(colour4(palette::owner(id)), "%s", s.name.c_str());
            ImGui::SameLine();
            if (last >= first)
                ImGui::Text("logical block %d: positions %d..%d \"%s\"", i, first, last, text.c_str());
            else
                ImGui::Text("logical block %d: no positions written yet", i);
        }
    }
    for (const CacheEvent& e : st.events) {
        if (e.kind == EventKind::copy_on_write && e.block == b)
            ImGui::TextColored(colour4(kCowRing), "this step: copy-on-write copy of block %d", e.from);
        if (e.kind == EventKind::copy_on_write && e.from == b)
            ImGui::TextColored(colour4(kCowRing), "this step: copied to block %d", e.block);
        if (e.kind == EventKind::evicted && e.block == b)
            ImGui::TextColored(colour4(kEvictedText), "this step: evicted from the prefix cache");
    }
    ImGui::EndTooltip();
}

constexpr const char* kHelp =
    "Paging: the pool is one array of n_blocks physical blocks, each holding K and V for "
    "block_size positions in every layer. A sequence's block table maps its logical block i "
    "(positions i*block_size .. i*block_size + block_size - 1) to a physical block anywhere in the "
    "pool. A request of T positions holds ceil(T / block_size) blocks, allocated as it grows, "
    "instead of a max_seq reservation made up front; at most block_size - 1 slots are wasted.\n\n"
    "Prefix sharing: when a block fills up it is published under a hash of (the parent block's "
    "hash, its tokens, the model). A later request whose prompt starts with the same tokens finds "
    "the same chain of hashes and maps those blocks instead of computing them again (refcount > 1, "
    "white outline). Unreferenced published blocks stay cached until the pool needs them "
    "(eviction, least recently used first).\n\n"
    "Copy-on-write: a fork shares all of its parent's blocks. The first time either sequence "
    "writes into a shared block that is only partly full, it gets a private copy of that block "
    "first, so the other sequence's rows never change.";

void draw_no_pool(const Frame& f) {
    const SessionInfo& info = *f.info;
    const Step& st = f.step();
    ImGui::TextWrapped("The %s variant has no block pool: its cache is one allocation per tensor, not blocks.",
                       std::string(to_string(info.settings.variant)).c_str());
    ImGui::SameLine();
    help_marker(kHelp);
    ImGui::Text("cache: %s", info.cache_name.c_str());
    ImGui::Text("reserved %s, used %s (fp32 K and V of %d positions)", bytes(double(st.kv_reserved_bytes)).c_str(),
                bytes(double(st.kv_used_bytes)).c_str(), st.length);

    // Two bars on one scale: what the cache holds, and what fp32 K and V of the valid rows need.
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const double top = double(std::max<std::int64_t>({st.kv_reserved_bytes, st.kv_used_bytes, 1}));
    const float label_w = ImGui::CalcTextSize("reserved ").x;
    const float w = std::max(40.0f, std::floor(ImGui::GetContentRegionAvail().x - label_w - 8));
    const float h = std::floor(ImGui::GetTextLineHeight());
    const struct {
        const char* label;
        std::int64_t value;
        ImU32 colour;
    } bars[] = {{"reserved", st.kv_reserved_bytes, palette::block_cached},
                {"used", st.kv_used_bytes, palette::owner(0)}};
    for (const auto& bar : bars) {
        ImGui::TextUnformatted(bar.label);
        ImGui::SameLine(label_w + ImGui::GetStyle().WindowPadding.x);
        const ImVec2 p = ImGui::GetCursorScreenPos();
        const float x = std::floor(p.x), y = std::floor(p.y);
        fill(dl, x, y, x + w, y + h, palette::block_free);
        fill(dl, x, y, x + std::floor(w * float(double(bar.value) / top)), y + h, bar.colour);
        ImGui::Dummy(ImVec2(w, h));
    }
    switch (info.settings.variant) {
        case Variant::contiguous_head:
            ImGui::TextWrapped(
                "A contiguous cache reserves all max_seq = %d positions up front, so every position's "
                "address is fixed by a formula; the price is memory held for positions that may never come.",
                info.config.max_seq);
            break;
        case Variant::quantized:
            ImGui::TextWrapped(
                "The quantized cache stores %d-bit codes plus a scale and zero point per group, so it "
                "holds less than fp32 K and V would need.",
                info.settings.quant_bits);
            break;
        case Variant::window:
            ImGui::TextWrapped(
                "The window keeps %d sink positions plus the last %d in a ring: memory stops growing "
                "once the ring is full, and older rows are overwritten.",
                info.settings.sinks, info.settings.window);
            break;
        case Variant::fifo:
            ImGui::TextWrapped(
                "FIFO keeps the last %d positions in a ring and nothing else: memory stops growing once the ring "
                "is full, and the oldest row is overwritten.",
                info.settings.window);
            break;
        case Variant::h2o:
            ImGui::TextWrapped(
                "H2O keeps, per layer and KV head, the last %d positions plus %d heavy hitters by accumulated "
                "attention, compacted in increasing position: an eviction moves the later rows down one slot.",
                info.settings.recent, info.settings.heavy);
            break;
        default: break;
    }
    ImGui::TextDisabled("Choose the paged or prefix_shared variant to see a block pool.");
}

}  // namespace

void draw_paged(const Frame& f) {
    if (!begin_panel("Paged memory", f)) return;
    const Step& st = f.step();
    if (!st.pool || st.pool->n_blocks <= 0) {
        draw_no_pool(f);
        ImGui::End();
        return;
    }
    const PoolView& pool = *st.pool;
    const int n = pool.n_blocks;

    ImGui::Text("Block pool: %d blocks of block_size %d positions", n, pool.block_size);
    ImGui::SameLine();
    help_marker(kHelp);
    ImGui::Text("used %d   cached %d   free %d   prefix-hit positions %" PRId64, pool.n_used, pool.n_cached,
                pool.n_free, pool.prefix_hit_positions);

    // A ring in the gap around a cell: shared (refcount > 1), overridden by this step's
    // copy-on-write copies and evictions.
    std::vector<ImU32> ring_colour(static_cast<size_t>(n), 0);
    for (int b = 0; b < n; ++b)
        if (b < int(pool.refcount.size()) && pool.refcount[size_t(b)] > 1)
            ring_colour[size_t(b)] = palette::block_shared;
    for (const CacheEvent& e : st.events) {
        if (e.block < 0 || e.block >= n) continue;
        if (e.kind == EventKind::copy_on_write) ring_colour[size_t(e.block)] = kCowRing;
    }
    for (const CacheEvent& e : st.events)
        if (e.kind == EventKind::evicted && e.block >= 0 && e.block < n) ring_colour[size_t(e.block)] = kEvictedRing;

    const ImVec2 avail = ImGui::GetContentRegionAvail();
    const float row_label_w = ImGui::CalcTextSize(std::to_string(n).c_str()).x + 6;
    const float grid_w = std::max(0.0f, std::floor(avail.x - row_label_w - 2));
    // The largest integer cell (36 down to 6 px) whose grid fits the width and leaves about half the
    // height to the tables and events; else one that fits the whole height, so the reported grid is
    // never clipped.
    int cell = 6, gap = 2, cols = 1, rows = n;
    auto layout = [&](int c) {
        gap = c >= 12 ? 4 : 2;
        cols = std::min(n, std::max(1, int(grid_w) / (c + gap)));
        if (cols < n && cols >= 8) cols -= cols % 4;  // row starts at multiples of 4 read more easily
        rows = (n + cols - 1) / cols;
        cell = c;
        return float(rows * (c + gap));
    };
    const float preferred = std::min(avail.y, std::max(120.0f, avail.y * 0.5f));
    bool placed = false;
    for (float limit : {preferred, avail.y}) {
        for (int c = 36; c >= 6 && !placed; --c) placed = layout(c) <= limit;
        if (placed) break;
    }
    if (!placed) layout(6);
    const int pitch = cell + gap, inset = gap / 2;

    ImDrawList* dl = ImGui::GetWindowDrawList();
    const bool hide_shared = f.plant == "pool-hides-shared";
    const ImVec2 origin = ImGui::GetCursorScreenPos();
    const float gx = std::floor(origin.x + row_label_w), gy = std::floor(origin.y);
    const bool labels = cell >= 10;
    for (int r = 0; r < rows && labels; ++r) {
        const std::string id = std::to_string(r * cols);
        const float tw = ImGui::CalcTextSize(id.c_str()).x;
        dl->AddText(ImVec2(gx - tw - 4, gy + float(r * pitch) + (float(pitch) - ImGui::GetFontSize()) / 2),
                    IM_COL32(150, 150, 160, 255), id.c_str());
    }
    for (int b = 0; b < n; ++b) {
        const float x0 = gx + float((b % cols) * pitch + inset), y0 = gy + float((b / cols) * pitch + inset);
        const float x1 = x0 + float(cell), y1 = y0 + float(cell);
        const auto state = b < int(pool.state.size()) ? pool.state[size_t(b)] : PoolView::State::free;
        const std::vector<int>* owners = b < int(pool.owners.size()) ? &pool.owners[size_t(b)] : nullptr;
        const bool hide = hide_shared && b < int(pool.refcount.size()) && pool.refcount[size_t(b)] > 1;
        if (hide) {
            fill(dl, x0, y0, x1, y1, palette::block_free);  // the planted bug the pixel tests must catch
        } else if (state == PoolView::State::used && owners && !owners->empty()) {
            // Vertical stripes whose integer widths add up to exactly one cell.
            const int k = int(owners->size()), base = cell / k, extra = cell % k;
            float x = x0;
            for (int i = 0; i < k; ++i) {
                const float w = float(base + (i < extra ? 1 : 0));
                fill(dl, x, y0, x + w, y1, palette::owner((*owners)[size_t(i)]));
                x += w;
            }
        } else {
            fill(dl, x0, y0, x1, y1,
                 state == PoolView::State::used     ? kUsedNoOwner
                 : state == PoolView::State::cached ? palette::block_cached
                                                    : palette::block_free);
        }
        if (ring_colour[size_t(b)]) ring(dl, x0, y0, x1, y1, float(inset), ring_colour[size_t(b)]);
    }
    const ImVec2 grid_min(gx, gy), grid_max(gx + float(cols * pitch), gy + float(rows * pitch));
    const ImVec2 scale = framebuffer_scale();
    report(f, "paged.pool", grid_min, grid_max, int(float(cell) * scale.x), int(float(cell) * scale.y));
    ImGui::Dummy(ImVec2(grid_max.x - origin.x, grid_max.y - origin.y));
    if (ImGui::IsItemHovered()) {
        const ImVec2 m = ImGui::GetIO().MousePos;
        const int c = int(std::floor((m.x - gx) / float(pitch))), r = int(std::floor((m.y - gy) / float(pitch)));
        const int b = r * cols + c;
        if (c >= 0 && c < cols && r >= 0 && b < n && b < int(pool.state.size())) block_tooltip(f, pool, b);
    }

    // Legend: the owners present, then the states and rings.
    ImGui::Spacing();
    for (const SeqView& s : st.seqs) {
        if (!s.alive) continue;
        swatch(palette::owner(s.id), s.name.c_str());
        ImGui::SameLine(0, 12);
    }
    swatch(palette::block_free, "free");
    ImGui::SameLine(0, 12);
    swatch(palette::block_cached, "cached");
    ImGui::SameLine(0, 12);
    swatch(palette::block_shared, "shared", true);
    ImGui::SameLine(0, 12);
    swatch(kCowRing, "copy-on-write", true);
    ImGui::SameLine(0, 12);
    swatch(kEvictedRing, "evicted", true);

    // Block tables: one row of chips per sequence, "logical -> physical", refcount when shared.
    ImGui::Separator();
    ImGui::TextUnformatted("Block tables (logical block -> physical block, xN = refcount)");
    const float line_h = ImGui::GetTextLineHeight();
    for (const SeqView& s : st.seqs) {
        if (!s.alive) {
            ImGui::TextDisabled("%s: freed", s.name.c_str());
            continue;
        }
        const int n_blocks_held = int(s.table.size());
        ImGui::TextColored(colour4(palette::owner(s.id)), "%s", s.name.c_str());
        ImGui::SameLine();
        ImGui::Text("T = %d, %d blocks:", int(s.tokens.size()), n_blocks_held);
        const float right = ImGui::GetWindowPos().x + ImGui::GetWindowContentRegionMax().x;
        for (int i = 0; i < n_blocks_held; ++i) {
            const int b = s.table[size_t(i)];
            const int ref = b >= 0 && b < int(pool.refcount.size()) ? pool.refcount[size_t(b)] : 0;
            char text[48];
            if (ref > 1)
                std::snprintf(text, sizeof text, "%d->%d x%d", i, b, ref);
            else
                std::snprintf(text, sizeof text, "%d->%d", i, b);
            const ImVec2 ts = ImGui::CalcTextSize(text);
            const float w = std::floor(ts.x + 8), h = std::floor(line_h + 2);
            ImGui::SameLine(0, 4);
            if (ImGui::GetCursorScreenPos().x + w > right) ImGui::NewLine();
            const ImVec2 p = ImGui::GetCursorScreenPos();
            const float x = std::floor(p.x), y = std::floor(p.y);
            fill(dl, x, y, x + w, y + h, palette::owner(s.id));
            if (ref > 1)
                dl->AddRect(ImVec2(x + 0.5f, y + 0.5f), ImVec2(x + w - 0.5f, y + h - 0.5f), palette::block_shared);
            dl->AddText(ImVec2(x + 4, y + 1), kChipText, text);
            ImGui::Dummy(ImVec2(w, h));
            if (ImGui::IsItemHovered()) {
                const int first = i * pool.block_size;
                const int last = std::min(first + pool.block_size, int(s.tokens.size())) - 1;
                ImGui::SetTooltip("%s logical block %d = positions %d..%d\nphysical block %d, refcount %d",
                                  s.name.c_str(), i, first, last, b, ref);
            }
        }
    }

    // This step's events, coloured like the rings in the grid.
    ImGui::Separator();
    ImGui::Text("Events of step %d (%d)", f.cursor, int(st.events.size()));
    if (!st.note.empty()) ImGui::TextColored(colour4(palette::differ), "%s", st.note.c_str());
    const float events_h = std::max(ImGui::GetContentRegionAvail().y, 6 * line_h);
    if (ImGui::BeginChild("events", ImVec2(0, events_h), true)) {
        if (st.events.empty()) ImGui::TextDisabled("no cache events this step");
        for (const CacheEvent& e : st.events) {
            const std::string text = describe(e, seq_name(st, e.seq));
            if (e.kind == EventKind::copy_on_write)
                ImGui::TextColored(colour4(kCowRing), "%s", text.c_str());
            else if (e.kind == EventKind::evicted)
                ImGui::TextColored(colour4(kEvictedText), "%s", text.c_str());
            else if (e.kind == EventKind::block_shared || e.kind == EventKind::prefix_hit)
                ImGui::TextColored(colour4(palette::block_shared), "%s", text.c_str());
            else if (e.kind == EventKind::append)
                ImGui::TextDisabled("%s", text.c_str());
            else
                ImGui::TextUnformatted(text.c_str());
        }
    }
    ImGui::EndChild();
    ImGui::End();
}

}  // namespace kvlab::viz
