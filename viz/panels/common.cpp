// kvlab viewer: what every panel shares: the "(?)" help marker and the sequences' colours.
#include <array>

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
