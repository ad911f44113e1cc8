// kvlab viewer: what every panel shares: the "(?)" help marker, the sequences' colours and the
// drawing helpers of draw.h.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "draw.h"
#include "panels.h"

namespace kvlab::viz {

void help_marker(const char* text) {
    ImGui::TextDisabled("(?)");
    if (!ImGui::IsItemHovered()) return;
    ImGui::BeginTooltip();
    // Wrap at a width that reads like a paragraph, whatever the window's width.
    ImGui::PushTextWrapPos(ImGui::GetFontSize() * 38.0f);
    ImGui::TextUnformatted(text);
    ImGui::PopTextWrapPos();
    ImGui::EndTooltip();
}

bool begin_panel(const char* title, const Frame& f) {
    if (!ImGui::Begin(title)) {
        ImGui::End();
        return false;
    }
    if (f.empty() || !f.info) {
        ImGui::TextUnformatted("waiting for the first step");
        ImGui::End();
        return false;
    }
    return true;
}

void report(const Frame& f, std::string name, ImVec2 min, ImVec2 max, int cell_w, int cell_h) {
    if (!f.report) return;
    const ImVec2 s = framebuffer_scale();
    f.report->add(std::move(name), ImVec2(min.x * s.x, min.y * s.y), ImVec2(max.x * s.x, max.y * s.y), cell_w, cell_h);
}

void report_grid(const Frame& f, std::string name, ImVec2 min, ImVec2 max, const Cells& c) {
    const ImVec2 s = framebuffer_scale();
    report(f, std::move(name), min, max, int(std::lround(c.w * s.x)), int(std::lround(c.h * s.y)));
}

void legend_item(ImU32 colour, const char* text) {
    const float sz = ImGui::GetTextLineHeight();
    if (ImGui::GetContentRegionAvail().x < sz + 2 + ImGui::CalcTextSize(text).x) ImGui::NewLine();
    const ImVec2 p = floored(ImGui::GetCursorScreenPos());
    ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + 2), ImVec2(p.x + sz - 4, p.y + sz - 2), colour);
    ImGui::Dummy(ImVec2(sz - 2, sz));
    ImGui::SameLine(0, 4);
    ImGui::TextUnformatted(text);
    ImGui::SameLine(0, 14);
}

void tick(ImDrawList* dl, float x, float axis_y, ImU32 colour, const char* label) {
    dl->AddLine(ImVec2(x + 0.5f, axis_y), ImVec2(x + 0.5f, axis_y + 3), colour);
    dl->AddText(ImVec2(x, axis_y + 3), colour, label);
}

int tick_every(int pitch, float label_w, int bin) {
    int every = 1;
    for (int e : {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}) {
        every = e;
        if (e * pitch >= label_w * bin) break;
    }
    return every;
}

const SeqView* seq_a(const Step& s) {
    for (const SeqView& q : s.seqs)
        if (q.id == 0) return &q;
    return s.seqs.empty() ? nullptr : &s.seqs.front();
}

// A dark-to-bright ramp (close to matplotlib's magma) for v in [0, 1]. Zero stays visibly above the
// window's background so an unattended-looking cell still reads as a cell.
ImU32 heat(float v) {
    static constexpr float stops[][3] = {{28, 16, 58},   {90, 24, 120},   {180, 54, 120},
                                         {245, 120, 80}, {252, 220, 150}, {252, 253, 191}};
    constexpr int n = int(std::size(stops)) - 1;
    const float x = std::clamp(v, 0.0f, 1.0f) * n;
    const int i = std::min(n - 1, int(x));
    const float u = x - i;
    auto mix = [&](int ch) { return unsigned(std::lround(stops[i][ch] + (stops[i + 1][ch] - stops[i][ch]) * u)); };
    return palette::rgb(mix(0), mix(1), mix(2));
}

bool evicts(Variant v) { return v == Variant::window || v == Variant::fifo || v == Variant::h2o; }

CellState state_of(int pos, const Step& s, int prompt_len, bool window, int lh, int pairs) {
    if (pos >= s.first_pos && pos < s.first_pos + s.n_new) return CellState::newest;
    if (pos >= s.length) return CellState::empty;
    if (window && lh >= 0 && !s.kept.empty()) {  // H2O: [pairs, held] positions, increasing
        const std::size_t held = s.kept.size() / std::size_t(std::max(1, pairs));
        const auto first = s.kept.begin() + std::ptrdiff_t(std::size_t(lh) * held);
        if (!std::binary_search(first, first + std::ptrdiff_t(held), pos)) return CellState::evicted;
        return pos < prompt_len ? CellState::prefill : CellState::decode;
    }
    // The window cache reuses the slots of positions that left the window.
    if (window && !s.resident.empty() && !s.resident[std::size_t(pos)]) return CellState::evicted;
    return pos < prompt_len ? CellState::prefill : CellState::decode;
}

ImU32 colour_of(CellState c) {
    switch (c) {
        case CellState::empty: return palette::empty;
        case CellState::prefill: return palette::prefill;
        case CellState::decode: return palette::decode;
        case CellState::newest: return palette::newest;
        case CellState::evicted: return palette::evicted;
    }
    return palette::empty;
}

int final_length(const SessionInfo& info, const Step& s) {
    const int planned = int(info.prompt.size()) + info.settings.steps;
    return std::max(1, std::min(std::max(planned, s.length), info.config.max_seq));
}

std::string seq_name(const Step& s, int id) {
    for (const SeqView& q : s.seqs)
        if (q.id == id && !q.name.empty()) return q.name;
    if (id >= 0 && id < 26) return std::string(1, char('A' + id));
    char buf[16];  // not "#" + to_string: GCC 12 warns falsely (-Wrestrict) on that at -O2
    std::snprintf(buf, sizeof buf, "#%d", id);
    return buf;
}

void token_line(const SessionInfo& info, const SeqView* a, int pos) {
    if (!a || pos < 0 || pos >= int(a->tokens.size())) return;
    const int id = a->tokens[std::size_t(pos)];
    ImGui::Text("token \"%s\" (id %d)", token_text(info, id).c_str(), id);
}

std::string bytes(double n) {
    char buf[48];
    if (n >= 1 << 20)
        std::snprintf(buf, sizeof buf, "%.2f MiB", n / (1 << 20));
    else if (n >= 1024)
        std::snprintf(buf, sizeof buf, "%.1f KiB", n / 1024);
    else
        std::snprintf(buf, sizeof buf, "%.0f B", n);
    return buf;
}

namespace palette {
namespace {

// A blue, B orange, C purple first: the prefix_shared variant runs three sequences, and these
// three stay apart for colour-blind readers too.
constexpr std::array<ImU32, 8> kOwners = {
    rgb(66, 135, 245),  // A
    rgb(245, 150, 40),  // B
    rgb(170, 90, 230),  // C
    rgb(40, 170, 80),   // D
    rgb(235, 60, 160),  // E
    rgb(60, 215, 215),  // F
    rgb(200, 230, 60),  // G
    rgb(150, 105, 70),  // H
};

constexpr ImU32 kOthers[] = {empty,  prefill, decode,     newest,       evicted,      read,  marker, naive,
                             cached, formula, block_free, block_cached, block_shared, equal, differ};

// The pixel tests count blocks by exact colour, so an owner colour must never equal another one.
constexpr bool owners_distinct() {
    for (std::size_t i = 0; i < kOwners.size(); ++i) {
        if ((kOwners[i] >> IM_COL32_A_SHIFT & 0xFF) != 0xFF) return false;
        for (std::size_t j = i + 1; j < kOwners.size(); ++j)
            if (kOwners[i] == kOwners[j]) return false;
        for (ImU32 other : kOthers)
            if (kOwners[i] == other) return false;
    }
    return true;
}
static_assert(owners_distinct(), "owner colours must be opaque and distinct from every palette colour");

}  // namespace

ImU32 owner(int seq) { return kOwners[std::size_t(((seq % 8) + 8) % 8)]; }

}  // namespace palette
}  // namespace kvlab::viz
