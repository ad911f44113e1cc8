// kvlab viewer: the serving panel (`kvlab view --serve`). The pool under a continuous-batching
// load: each block filled with the colour of the request whose table maps it (a white ring when
// several do: a prefix hit), cached blocks grey, free ones dark; the step's admissions,
// preemptions, rows and store traffic; and a timeline of the pool's occupancy, step by step,
// with the preemptions marked.
#include <algorithm>
#include <cmath>
#include <string>

#include "draw.h"
#include "panels.h"

namespace kvlab::viz {
namespace {

// The block grid: the largest cell (56 down to 6 px) whose rows fit `height`.
void draw_pool(const Frame& f, const ServeRun& run, const ServeSnapshot& snap, float height) {
    const int n = std::max(1, run.shown_blocks);  // [n] of the snapshot's n_blocks
    const float width = ImGui::GetContentRegionAvail().x;
    int cell = 6, gap = 2, cols = 1;
    for (int c = 56; c >= 6; c--) {
        gap = c >= 12 ? 4 : 2;
        cols = std::clamp(int(width) / (c + gap), 1, n);
        cell = c;
        if (float(((n + cols - 1) / cols) * (c + gap)) <= height) break;
    }
    const int rows = (n + cols - 1) / cols, pitch = cell + gap, inset = gap / 2;
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 origin = floored(ImGui::GetCursorScreenPos());
    for (int b = 0; b < n; b++) {
        const float x0 = origin.x + float((b % cols) * pitch + inset),
                    y0 = origin.y + float((b / cols) * pitch + inset);
        const float x1 = x0 + float(cell), y1 = y0 + float(cell);
        const int owner = snap.owner[std::size_t(b)];
        const bool shared = snap.shared[std::size_t(b)];
        ImU32 colour = owner >= 0 ? palette::owner(owner) : owner == -2 ? palette::block_cached : palette::block_free;
        if (shared && f.plant == "serving-hides-shared") colour = palette::block_free;  // the planted bug
        fill(dl, x0, y0, x1, y1, colour);
        if (shared) ring(dl, x0, y0, x1, y1, float(inset), palette::block_shared);
    }
    const ImVec2 grid_max(origin.x + float(cols * pitch), origin.y + float(rows * pitch));
    const ImVec2 scale = framebuffer_scale();
    report(f, "serving.pool", origin, grid_max, int(float(cell) * scale.x), int(float(cell) * scale.y));
    ImGui::Dummy(ImVec2(grid_max.x - origin.x, grid_max.y - origin.y));
}

// Blocks in use at every step as a column (the step shown in the marker's colour), and a tick
// under each step that preempted.
void draw_timeline(const Frame& f, const ServeRun& run, float height) {
    const int n = int(run.steps.size());
    const ImVec2 origin = floored(ImGui::GetCursorScreenPos());
    const float width = std::floor(ImGui::GetContentRegionAvail().x), plot_h = std::max(20.0f, height - 8);
    const float col_w = std::max(1.0f, std::floor(width / float(std::max(1, n))));
    ImDrawList* dl = ImGui::GetWindowDrawList();
    fill(dl, origin.x, origin.y, origin.x + col_w * float(n), origin.y + plot_h, palette::empty);
    for (int i = 0; i < n; i++) {
        const ServeSnapshot& s = run.steps[std::size_t(i)];
        const float x = origin.x + col_w * float(i);
        const float h = std::floor(plot_h * float(s.blocks_used) / float(std::max(1, run.shown_blocks)));
        fill(dl, x, origin.y + plot_h - h, x + col_w, origin.y + plot_h,
             i == f.cursor ? palette::marker : palette::decode);
        if (i == f.cursor)
            fill(dl, x, origin.y, x + col_w, origin.y + 3, palette::marker);  // shown when the column is empty too
        if (s.preempted > 0) fill(dl, x, origin.y + plot_h + 2, x + col_w, origin.y + plot_h + 8, palette::evicted);
    }
    report(f, "serving.timeline", origin, ImVec2(origin.x + col_w * float(n), origin.y + plot_h));
    ImGui::Dummy(ImVec2(col_w * float(n), plot_h + 8));
}

}  // namespace

void draw_serving(const Frame& f) {
    ImGui::Begin(f.serving->beams ? "Beams: forked caches over one block pool###serving"
                                  : "Serving: continuous batching over one block pool###serving",
                 nullptr, ImGuiWindowFlags_NoCollapse);
    const ServeRun& run = *f.serving;
    if (run.steps.empty()) {
        ImGui::TextUnformatted("no steps");
        return ImGui::End();
    }
    const int cursor = std::clamp(f.cursor, 0, int(run.steps.size()) - 1);
    const ServeSnapshot& s = run.steps[std::size_t(cursor)];
    if (run.beams) {
        const int unshared = run.unshared[std::size_t(cursor)];
        ImGui::Text(
            "beam search, %d beams over one pool of %d blocks of %d positions; %d of %d beam steps bitwise "
            "equal to naive decode of the beam's tokens",
            run.n_requests, run.n_blocks, run.block_size, run.exact, run.checked);
        ImGui::Text(
            "step %d of %d: %d beams hold %d blocks; caches of their own would hold %d (%.0f%% saved); "
            "blocks %d.. never used, not drawn",
            cursor, int(run.steps.size()), s.running, s.blocks_used, unshared,
            unshared ? 100.0 * (1.0 - double(s.blocks_used) / unshared) : 0.0, run.shown_blocks);
    } else {
        ImGui::Text(
            "%d requests, %d blocks of %d positions, %d rows a step; %d of %d requests bitwise equal to "
            "decoding them alone",
            run.n_requests, run.n_blocks, run.block_size, run.max_batch_tokens, run.exact, run.n_requests);
        ImGui::Text(
            "step %d of %d: %d running, %d waiting; this step admitted %d, preempted %d, finished %d; "
            "%d decode rows, %d prefill rows",
            cursor, int(run.steps.size()), s.running, s.waiting, s.admitted, s.preempted, s.finished, s.decode_rows,
            s.prefill_rows);
        ImGui::Text("so far: %lld positions from prefix hits; store: %lld blocks put, %lld fetched back",
                    static_cast<long long>(s.hit_positions), static_cast<long long>(s.stored),
                    static_cast<long long>(s.fetched));
    }
    legend_item(palette::owner(0), run.beams ? "a beam's blocks (0: the best)" : "a request's blocks");
    legend_item(palette::block_cached, "cached (published, reclaimable)");
    legend_item(palette::block_free, "free");
    legend_item(palette::block_shared,
                run.beams ? "ring: shared by several beams" : "ring: mapped by several requests");
    ImGui::NewLine();
    const float avail = ImGui::GetContentRegionAvail().y;
    draw_pool(f, run, s, std::floor(avail * 0.6f));
    ImGui::Spacing();
    ImGui::TextUnformatted("blocks in use, step by step (red: the step shown; under it, steps that preempted)");
    draw_timeline(f, run, std::min(ImGui::GetContentRegionAvail().y - 4, std::floor(avail * 0.4f)));
    ImGui::End();
}

}  // namespace kvlab::viz
