// kvlab viewer: the exactness panel. Naive and cached logits compared at every step: bitwise
// equal for the exact variants, or how far apart (ULPs, absolute) for the approximate ones. On a
// device other than the CPU, both are also compared with the CPU's naive decode.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "draw.h"
#include "panels.h"

namespace kvlab::viz {
namespace {

bool step_equal(const Step& s) {
    for (const Exactness& e : s.exact)
        if (!e.equal()) return false;
    return true;
}

std::uint32_t bits(float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
}

// Short enough for a narrow column: values of opposite sign are ~2^31 ULPs apart.
std::string ulps(std::int64_t n) {
    char buf[32];
    if (n < 100000)
        std::snprintf(buf, sizeof buf, "%" PRId64, n);
    else
        std::snprintf(buf, sizeof buf, "%.1e", double(n));
    return buf;
}

constexpr const char* kHelp =
    "Why bitwise equality holds: naive and cached decoding are different algorithms, but every "
    "float they produce comes from the same few kernels, and each kernel adds up an output "
    "element's terms in an order that depends only on that element's indices (not on how many "
    "rows the matrix has, nor on the thread count). The cached path reads K and V rows that the "
    "same kernels computed earlier, so each logit is the same sequence of roundings in both: the "
    "results agree in every bit, not just approximately.\n\n"
    "A ULP (unit in the last place) is the gap between a float and the next representable one. "
    "The ULP distance between two floats counts how many representable floats lie between them: "
    "0 means identical bits, 1 means neighbours. It measures error relative to the size of the "
    "numbers, which a fixed |difference| does not. Across zero it explodes (a small positive and a "
    "small negative float are about 2^31 ULPs apart), so |naive - cached| is shown beside it.\n\n"
    "Approximate variants (quantized codes, a sliding window) change what attention reads, so "
    "their logits differ and the table shows by how much.\n\n"
    "On the GPU (or gpu-host: the GPU's kernel source run on the CPU), each thread computes one "
    "output element and adds its terms in the CPU kernel's order, with no fused multiply-add and "
    "the same exp. So the GPU's naive and cached logits also equal the CPU's naive decode, bit for "
    "bit; the panel checks that at every step.";

// Decoders on another device: how their logits compare with the CPU's naive decode so far.
void cross_device_line(const Frame& f, int n) {
    const char* device = f.info->device.c_str();
    int first_diff = -1;
    std::int64_t max_ulp = 0;
    for (int i = 0; i < n; ++i)
        for (const Exactness& e : f.steps[size_t(i)]->exact) {
            if (first_diff < 0 && !(e.naive_equals_cpu && e.cached_equals_cpu)) first_diff = i;
            max_ulp = std::max(max_ulp, e.max_ulp_cpu);
        }
    if (first_diff < 0)
        ImGui::TextColored(colour4(palette::equal), "%s vs cpu: naive and cached on %s equal the CPU's naive, bitwise",
                           device, device);
    else
        ImGui::TextColored(colour4(palette::differ), "%s vs cpu: first difference at step %d, up to %s ULP", device,
                           first_diff, ulps(max_ulp).c_str());
}

void headline(const Frame& f) {
    const SessionInfo& info = *f.info;
    const int n = std::min(f.cursor + 1, int(f.steps.size()));
    int first_diff = -1, n_equal = 0;
    std::int64_t max_ulp = 0;
    double max_abs = 0;
    for (int i = 0; i < n; ++i) {
        const Step& s = *f.steps[size_t(i)];
        if (step_equal(s))
            ++n_equal;
        else if (first_diff < 0)
            first_diff = i;
        for (const Exactness& e : s.exact)
            max_ulp = std::max(max_ulp, e.max_ulp), max_abs = std::max(max_abs, e.max_abs);
    }
    if (info.exact) {
        if (first_diff < 0)
            ImGui::TextColored(colour4(palette::equal), "all %d steps bitwise equal", n);
        else
            ImGui::TextColored(colour4(palette::differ), "first difference at step %d (%d of %d steps equal)",
                               first_diff, n_equal, n);
    } else {
        ImGui::TextColored(colour4(palette::naive), "approximate variant: differences are expected");
    }
    ImGui::SameLine();
    help_marker(kHelp);
    ImGui::PushTextWrapPos(0.0f);  // narrow windows wrap instead of cutting the sentence
    if (info.exact && first_diff < 0) {
        ImGui::TextDisabled("every logit of every live sequence, %d floats per vector", info.config.vocab_size);
    } else {
        ImGui::Text("largest ULP distance so far: %s, largest |naive - cached| %.3g", ulps(max_ulp).c_str(), max_abs);
        if (!info.exact) {
            if (first_diff < 0)
                ImGui::Text("still bitwise equal at all %d steps", n);
            else
                ImGui::Text("%d of %d steps bitwise equal; first difference at step %d", n_equal, n, first_diff);
        }
    }
    if (info.device != "cpu") cross_device_line(f, n);
    ImGui::PopTextWrapPos();
}

void steps_table(const Frame& f, float height) {
    const int n = std::min(f.cursor + 1, int(f.steps.size()));
    // Columns: one per sequence that ever ran so far, in id order.
    std::vector<int> ids;
    for (int i = 0; i < n; ++i)
        for (const Exactness& e : f.steps[size_t(i)]->exact)
            if (std::find(ids.begin(), ids.end(), e.seq) == ids.end()) ids.push_back(e.seq);
    std::sort(ids.begin(), ids.end());
    const Step& cur = f.step();

    const ImGuiTableFlags flags = ImGuiTableFlags_ScrollY | ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersOuter |
                                  ImGuiTableFlags_BordersV | ImGuiTableFlags_SizingStretchProp;
    char table_id[32];
    std::snprintf(table_id, sizeof table_id, "exact_steps_%zu", ids.size());  // a new table when columns change
    if (!ImGui::BeginTable(table_id, 2 + int(ids.size()), flags, ImVec2(0, height))) return;
    ImGui::TableSetupScrollFreeze(0, 1);
    ImGui::TableSetupColumn("step", ImGuiTableColumnFlags_WidthFixed, ImGui::CalcTextSize("00000").x);
    ImGui::TableSetupColumn("phase", ImGuiTableColumnFlags_WidthStretch, 1.0f);
    for (int id : ids) ImGui::TableSetupColumn(seq_name(cur, id).c_str(), ImGuiTableColumnFlags_WidthStretch, 1.4f);
    ImGui::TableHeadersRow();

    // Newest first: the step shown is always the top row.
    ImGuiListClipper clipper;
    clipper.Begin(n);
    while (clipper.Step()) {
        for (int row = clipper.DisplayStart; row < clipper.DisplayEnd; ++row) {
            const int i = n - 1 - row;
            const Step& s = *f.steps[size_t(i)];
            ImGui::TableNextRow();
            if (i == f.cursor) ImGui::TableSetBgColor(ImGuiTableBgTarget_RowBg1, IM_COL32(255, 255, 255, 28));
            ImGui::TableNextColumn();
            ImGui::Text("%d", i);
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(s.label.empty() ? (s.phase == Step::Phase::prefill ? "prefill" : "decode")
                                                   : s.label.c_str());
            for (int id : ids) {
                ImGui::TableNextColumn();
                const Exactness* e = nullptr;
                for (const Exactness& x : s.exact)
                    if (x.seq == id) e = &x;
                if (!e)
                    ImGui::TextDisabled("-");
                else if (e->equal()) {
                    ImGui::TextColored(colour4(palette::equal), "equal");
                    if (e->cross_device && ImGui::IsItemHovered())
                        ImGui::SetTooltip("naive == cached on %s, and both == naive on cpu", f.info->device.c_str());
                } else if (e->bitwise_equal) {  // naive == cached on the device, but not the CPU's bits
                    ImGui::TextColored(colour4(palette::differ), "!= cpu, %s ULP", ulps(e->max_ulp_cpu).c_str());
                }
                else
                    ImGui::TextColored(colour4(palette::differ), "%d differ, |d| %.2g, %s ULP", e->n_differ, e->max_abs,
                                       ulps(e->max_ulp).c_str());
            }
        }
    }
    ImGui::EndTable();
}

void top_tokens(const Frame& f, const Exactness& e) {
    const SessionInfo& info = *f.info;
    ImGui::Text("next token: \"%s\" (%d)", token_text(info, e.next_token).c_str(), e.next_token);
    const ImGuiTableFlags flags = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_BordersOuter |
                                  ImGuiTableFlags_SizingStretchProp;
    if (!ImGui::BeginTable("top5", 6, flags)) return;
    ImGui::TableSetupColumn("#", ImGuiTableColumnFlags_WidthFixed, ImGui::CalcTextSize("0").x);
    ImGui::TableSetupColumn("cached");
    ImGui::TableSetupColumn("logit");
    ImGui::TableSetupColumn("naive");
    ImGui::TableSetupColumn("logit");
    ImGui::TableSetupColumn("bits");
    ImGui::TableHeadersRow();
    const size_t rows = std::max(e.top_cached.size(), e.top_naive.size());
    for (size_t r = 0; r < rows; ++r) {
        const TopToken* c = r < e.top_cached.size() ? &e.top_cached[r] : nullptr;
        const TopToken* n = r < e.top_naive.size() ? &e.top_naive[r] : nullptr;
        ImGui::TableNextRow();
        ImGui::TableNextColumn();
        ImGui::Text("%zu", r + 1);
        for (const TopToken* t : {c, n}) {
            ImGui::TableNextColumn();
            if (t) {
                ImGui::Text("\"%s\"", t->text.c_str());
                if (ImGui::IsItemHovered()) ImGui::SetTooltip("token %d", t->id);
            }
            ImGui::TableNextColumn();
            if (!t) continue;
            ImGui::Text("%.6f", double(t->logit));
            if (ImGui::IsItemHovered()) ImGui::SetTooltip("bits 0x%08X", unsigned(bits(t->logit)));
        }
        ImGui::TableNextColumn();
        if (c && n && c->id == n->id && bits(c->logit) == bits(n->logit))
            ImGui::TextColored(colour4(palette::equal), "same");
        else if (c && n && c->id == n->id)
            ImGui::TextColored(colour4(palette::differ), "%+.2g", double(n->logit) - double(c->logit));
        else
            ImGui::TextColored(colour4(palette::differ), "other token");
    }
    ImGui::EndTable();
}

}  // namespace

void draw_exactness(const Frame& f) {
    if (!begin_panel("Exactness", f)) return;
    const Step& cur = f.step();
    headline(f);

    // The table takes what the top-5 block below leaves.
    const float line = ImGui::GetFrameHeightWithSpacing();
    const float below = line * (cur.exact.size() > 1 ? 10.5f : 9.5f);
    const float table_h = std::max(line * 5, ImGui::GetContentRegionAvail().y - below);
    steps_table(f, table_h);

    ImGui::TextUnformatted("Top 5 logits, cached beside naive");
    if (cur.exact.empty()) {
        ImGui::TextDisabled("no sequence ran this step");
    } else if (cur.exact.size() == 1) {
        top_tokens(f, cur.exact.front());
    } else if (ImGui::BeginTabBar("seqs")) {
        for (const Exactness& e : cur.exact) {
            const std::string name = seq_name(cur, e.seq);
            if (ImGui::BeginTabItem(name.c_str())) {
                top_tokens(f, e);
                ImGui::EndTabItem();
            }
        }
        ImGui::EndTabBar();
    }
    ImGui::End();
}

}  // namespace kvlab::viz
