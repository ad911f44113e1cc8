// kvlab viewer: the cost panel. Cumulative FLOPs and time against T for naive and cached
// decoding (naive grows like T^2, cached like T), and the KV cache's bytes against the formula.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "cost_model.h"
#include "draw.h"
#include "panels.h"

namespace kvlab::viz {
namespace {

// Series colours for bytes; naive and cached use the palette's.
constexpr ImU32 kReserved = palette::rgb(240, 190, 60);
constexpr ImU32 kUsed = palette::rgb(120, 220, 160);
constexpr ImU32 kWeights = palette::rgb(170, 140, 230);
constexpr ImU32 kAxis = IM_COL32(150, 150, 160, 255);
constexpr ImU32 kGrid = IM_COL32(255, 255, 255, 22);
constexpr ImU32 kLabel = IM_COL32(190, 190, 200, 255);

struct Series {
    const char* name;
    ImU32 colour;
    std::vector<ImVec2> points;  // in axis units, x not decreasing
    bool dashed = false;
};

// Ticks at 1, 2 or 5 times a power of ten, about `target` of them up to hi.
double nice_step(double hi, int target) {
    if (!(hi > 0)) return 1;
    const double raw = hi / target, mag = std::pow(10.0, std::floor(std::log10(raw))), norm = raw / mag;
    return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

std::string tick_label(double v) {
    char buf[32];
    if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3))
        std::snprintf(buf, sizeof buf, "%.0e", v);
    else
        std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

void dashed_line(ImDrawList* dl, ImVec2 a, ImVec2 b, ImU32 colour, float thickness) {
    const float dx = b.x - a.x, dy = b.y - a.y, len = std::sqrt(dx * dx + dy * dy);
    constexpr float kOn = 6, kOff = 4;
    for (float s = 0; s < len; s += kOn + kOff) {
        const float e = std::min(len, s + kOn);
        dl->AddLine(ImVec2(a.x + dx * s / len, a.y + dy * s / len), ImVec2(a.x + dx * e / len, a.y + dy * e / len),
                    colour, thickness);
    }
}

// A line plot on the window's draw list: title, axes with ticks and labels, several series, a
// legend, the newest point of each series marked, and the values under the mouse in a tooltip.
void line_plot(const char* title, const char* x_label, const char* y_label, const std::vector<Series>& series,
               double x_max, ImVec2 size) {
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 p = ImGui::GetCursorScreenPos();
    const float line = ImGui::GetTextLineHeight();
    double y_max = 0;
    for (const Series& s : series)
        for (const ImVec2& q : s.points) y_max = std::max(y_max, double(q.y));
    const double y_step = nice_step(y_max, 4), x_step = nice_step(x_max, 6);
    y_max = std::max(y_step, std::ceil(y_max / y_step - 1e-9) * y_step);
    x_max = std::max(x_step, x_max);

    float y_label_w = 0;
    for (double v = 0; v <= y_max * (1 + 1e-9); v += y_step)
        y_label_w = std::max(y_label_w, ImGui::CalcTextSize(tick_label(v).c_str()).x);
    const float x0 = std::floor(p.x + y_label_w + 8), x1 = std::floor(p.x + size.x - 8);
    const float y0 = std::floor(p.y + line + 4), y1 = std::floor(p.y + size.y - 2 * line - 8);
    auto sx = [&](double x) { return x0 + float(x / x_max) * (x1 - x0); };
    auto sy = [&](double y) { return y1 - float(y / y_max) * (y1 - y0); };

    const std::string heading = std::string(title) + " (" + y_label + ")";
    dl->AddText(ImVec2(x0, p.y), IM_COL32(230, 230, 235, 255), heading.c_str());
    dl->AddRectFilled(ImVec2(x0, y0), ImVec2(x1, y1), IM_COL32(24, 26, 32, 255));
    for (double v = 0; v <= y_max * (1 + 1e-9); v += y_step) {
        const float y = std::floor(sy(v)) + 0.5f;
        dl->AddLine(ImVec2(x0, y), ImVec2(x1, y), kGrid);
        const std::string t = tick_label(v);
        dl->AddText(ImVec2(x0 - 6 - ImGui::CalcTextSize(t.c_str()).x, y - line / 2), kLabel, t.c_str());
    }
    for (double v = 0; v <= x_max * (1 + 1e-9); v += x_step) {
        const float x = std::floor(sx(v)) + 0.5f;
        dl->AddLine(ImVec2(x, y1), ImVec2(x, y1 + 4), kAxis);
        const std::string t = tick_label(v);
        dl->AddText(ImVec2(x - ImGui::CalcTextSize(t.c_str()).x / 2, y1 + 4), kLabel, t.c_str());
    }
    dl->AddLine(ImVec2(x0 + 0.5f, y0), ImVec2(x0 + 0.5f, y1), kAxis);
    dl->AddLine(ImVec2(x0, y1 + 0.5f), ImVec2(x1, y1 + 0.5f), kAxis);
    dl->AddText(ImVec2(x1 - ImGui::CalcTextSize(x_label).x, y1 + 6 + line), kLabel, x_label);

    dl->PushClipRect(ImVec2(x0, y0 - 4), ImVec2(x1 + 4, y1 + 1), true);
    for (const Series& s : series) {
        std::vector<ImVec2> pts;
        pts.reserve(s.points.size());
        for (const ImVec2& q : s.points) pts.push_back(ImVec2(sx(q.x), sy(q.y)));
        if (s.dashed) {
            for (size_t i = 1; i < pts.size(); ++i) dashed_line(dl, pts[i - 1], pts[i], s.colour, 1.5f);
        } else {
            if (pts.size() > 1) dl->AddPolyline(pts.data(), int(pts.size()), s.colour, ImDrawFlags_None, 2.0f);
            if (!pts.empty()) dl->AddCircleFilled(pts.back(), 3.5f, s.colour);
        }
    }
    dl->PopClipRect();

    // Legend on the row under the tick labels, where no curve can hide it.
    float lx = x0;
    const float ly = std::floor(y1 + 6 + line);
    for (const Series& s : series) {
        const float y = ly + line / 2;
        if (s.dashed)
            dashed_line(dl, ImVec2(lx, y), ImVec2(lx + 18, y), s.colour, 1.5f);
        else
            dl->AddLine(ImVec2(lx, y), ImVec2(lx + 18, y), s.colour, 2.0f);
        dl->AddText(ImVec2(lx + 22, ly), kLabel, s.name);
        lx += 22 + ImGui::CalcTextSize(s.name).x + 14;
    }

    ImGui::Dummy(size);
    const ImVec2 m = ImGui::GetIO().MousePos;
    if (ImGui::IsItemHovered() && m.x >= x0 && m.x <= x1 && m.y >= y0 && m.y <= y1) {
        const double x = double(m.x - x0) / double(x1 - x0) * x_max;
        dl->AddLine(ImVec2(std::floor(m.x) + 0.5f, y0), ImVec2(std::floor(m.x) + 0.5f, y1), kAxis);
        ImGui::BeginTooltip();
        ImGui::Text("T = %.0f", x);
        for (const Series& s : series) {
            // The last point at or left of the mouse: the value the curve holds there.
            const ImVec2* hit = nullptr;
            for (const ImVec2& q : s.points)
                if (q.x <= x + 0.5) hit = &q;
            if (!hit) continue;
            ImGui::TextColored(colour4(s.colour), "%s: %.4g at T = %.0f", s.name, double(hit->y), double(hit->x));
        }
        ImGui::EndTooltip();
    }
}

struct Unit {
    const char* name;
    double size;
};

// Divides the series by the largest unit their top value still fills, so tick labels stay short.
const char* rescale(std::initializer_list<Series*> series, std::initializer_list<Unit> units) {
    double top = 0;
    for (const Series* s : series)
        for (const ImVec2& q : s->points) top = std::max(top, double(q.y));
    const Unit* pick = units.begin();
    for (const Unit& u : units)
        if (top >= u.size) pick = &u;
    for (Series* s : series)
        for (ImVec2& q : s->points) q.y = float(double(q.y) / pick->size);
    return pick->name;
}

constexpr const char* kHelp =
    "KV bytes per token = 2 (K and V) x n_layers x kv_dim x bytes per element (4 in fp32, 2 in bf16 or fp16, "
    "1 in fp8), with kv_dim = "
    "n_kv_heads x head_size. A cache of T positions holds that times T: memory grows linearly.\n\n"
    "Naive decoding recomputes the whole prefix every step: step t runs t rows through every "
    "matrix product and a t x t attention per head, so its cost is about that of a prefill of t "
    "positions. Over T steps that is 1 + 2 + ... + T ~ T^2/2 rows: the cumulative curve is a "
    "parabola.\n\n"
    "Cached decoding runs one row per step and reads the t cached rows in attention: the matrix "
    "products stay the same size, attention grows with t, so the cumulative curve is close to a "
    "straight line as long as the products dominate.";

}  // namespace

void draw_cost(const Frame& f) {
    if (!begin_panel("Cost", f)) return;
    const SessionInfo& info = *f.info;
    const Step& cur = f.step();

    // Series over steps 0..cursor against A's length after each step.
    Series flops_naive{"naive", palette::naive, {}}, flops_cached{"cached", palette::cached, {}};
    Series time_naive{"naive", palette::naive, {}}, time_cached{"cached", palette::cached, {}};
    Series reserved{"reserved", kReserved, {}}, used{"used (fp32 K,V)", kUsed, {}};
    double sum_fn = 0, sum_fc = 0, sum_tn = 0, sum_tc = 0, x_max = 1;
    std::int64_t res_min = INT64_MAX, res_max = 0;
    for (int i = 0; i <= f.cursor && i < int(f.steps.size()); ++i) {
        const Step& s = *f.steps[size_t(i)];
        const float x = float(s.length);
        sum_fn += double(s.naive_flops), sum_fc += double(s.cached_flops);
        sum_tn += s.naive_seconds, sum_tc += s.cached_seconds;
        flops_naive.points.push_back(ImVec2(x, float(sum_fn)));
        flops_cached.points.push_back(ImVec2(x, float(sum_fc)));
        time_naive.points.push_back(ImVec2(x, float(sum_tn)));
        time_cached.points.push_back(ImVec2(x, float(sum_tc)));
        reserved.points.push_back(ImVec2(x, float(s.kv_reserved_bytes)));
        used.points.push_back(ImVec2(x, float(s.kv_used_bytes)));
        res_min = std::min(res_min, s.kv_reserved_bytes), res_max = std::max(res_max, s.kv_reserved_bytes);
        x_max = std::max(x_max, double(s.length));
    }
    // Fixed x range: A's final length, so the curves grow into the plot as the session runs.
    const int final_T = std::min(info.config.max_seq > 0 ? info.config.max_seq : 1 << 30,
                                 int(info.prompt.size()) + info.settings.steps);
    x_max = std::max(x_max, double(final_T));
    // The formula is per sequence; prefix_shared's used bytes add up A, B and C.
    Series formula{info.settings.variant == Variant::prefix_shared ? "kv_bytes_per_token x T (one sequence)"
                                                                   : "kv_bytes_per_token x T",
                   palette::formula,
                   {},
                   true};
    formula.points = {ImVec2(0, 0), ImVec2(float(x_max), float(double(info.kv_bytes_per_token) * x_max))};
    // What a cached step reads besides K and V: every weight once (the CPU's panels). K and V pass it
    // at T = cross (core/cost_model.h); past it a decode step is bound by the cache, not the model.
    const std::int64_t row_bytes =
        info.config.n_heads > 0 ? kv_row_bytes(int(info.kv_format), info.config.head_size()) : std::int64_t(0);
    const double weight_bytes = info.config.n_heads > 0 ? panel_bytes(info.config) : 0.0;
    const int cross = info.config.n_heads > 0 ? kv_passes_weights_T(info.config, row_bytes) : 0;
    Series weights{"weights a step reads",
                   kWeights,
                   {ImVec2(0, float(weight_bytes)), ImVec2(float(x_max), float(weight_bytes))},
                   true};
    const char* flops_unit = rescale({&flops_naive, &flops_cached},
                                     {{"FLOP", 1}, {"kFLOP", 1e3}, {"MFLOP", 1e6}, {"GFLOP", 1e9}, {"TFLOP", 1e12}});
    const char* time_unit = rescale({&time_naive, &time_cached}, {{"us", 1e-6}, {"ms", 1e-3}, {"s", 1}});
    const char* bytes_unit =
        rescale({&reserved, &used, &formula, &weights}, {{"B", 1}, {"KiB", 1024}, {"MiB", 1 << 20}, {"GiB", 1 << 30}});

    // Totals so far.
    ImGui::Text("after step %d (T = %d):", f.cursor, cur.length);
    ImGui::SameLine();
    help_marker(kHelp);
    ImGui::TextColored(colour4(palette::naive), "naive  %10.2f MFLOP %9.2f ms", sum_fn / 1e6, sum_tn * 1e3);
    ImGui::TextColored(colour4(palette::cached), "cached %10.2f MFLOP %9.2f ms", sum_fc / 1e6, sum_tc * 1e3);
    if (sum_fc > 0 && sum_tc > 0)
        ImGui::Text("naive / cached: %.1fx the FLOPs, %.1fx the time", sum_fn / sum_fc, sum_tn / sum_tc);
    ImGui::TextWrapped("KV cache: reserved %s, used %s", bytes(double(cur.kv_reserved_bytes)).c_str(),
                       bytes(double(cur.kv_used_bytes)).c_str());
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextDisabled(
        "formula: %" PRId64 " B/token (2 x n_layers %d x n_kv_heads %d x %" PRId64
        " B a row of head_size %d, %s) x T %d = %s",
        info.kv_bytes_per_token, info.config.n_layers, info.config.n_kv_heads,
        info.config.n_heads > 0 ? kv_row_bytes(int(info.kv_format), info.config.head_size()) : std::int64_t(0),
        info.config.n_heads > 0 ? info.config.head_size() : 0, kv_format_name(info.kv_format), cur.length,
        bytes(double(info.kv_bytes_per_token) * cur.length).c_str());
    if (cross > 0) {
        const std::string past = cross > info.config.max_seq ? ", past max_seq" : "";
        ImGui::TextDisabled(
            "a cached step reads the weights (%s of panels) and T x %s of K and V: K and V pass the "
            "weights at T = %d%s",
            bytes(weight_bytes).c_str(),
            bytes(2.0 * info.config.n_layers * info.config.n_kv_heads * double(row_bytes)).c_str(), cross,
            past.c_str());
    }
    ImGui::PopTextWrapPos();

    // Why the reservation has the shape it has, per variant.
    char why[256] = "";
    switch (info.settings.variant) {
        case Variant::contiguous_head:
        case Variant::contiguous_seq:
            std::snprintf(why, sizeof why,
                          "Reserved is flat: a contiguous cache allocates all max_seq = %d positions (%s) before "
                          "the first token, so a position's address is just base + t x stride.",
                          info.config.max_seq, bytes(double(info.kv_bytes_per_token) * info.config.max_seq).c_str());
            break;
        case Variant::paged:
        case Variant::prefix_shared:
            std::snprintf(why, sizeof why,
                          "Paged: a sequence holds ceil(T / block_size) blocks of %d positions, so memory follows T in "
                          "steps of one block%s.",
                          info.settings.block_size, res_min == res_max ? " (here the pool is reserved up front)" : "");
            break;
        case Variant::quantized:
            std::snprintf(why, sizeof why,
                          "Quantized: %d-bit codes plus per-group scales, so reserved stays below the fp32 line.",
                          info.settings.quant_bits);
            break;
        case Variant::window:
            std::snprintf(why, sizeof why,
                          "Window: reserved stops growing at sinks + window = %d positions; older rows are "
                          "overwritten.",
                          info.settings.sinks + info.settings.window);
            break;
        case Variant::fifo:
            std::snprintf(why, sizeof why, "FIFO: reserved stops growing at window = %d positions.",
                          info.settings.window);
            break;
        case Variant::h2o:
            std::snprintf(why, sizeof why,
                          "H2O: reserved stops growing at recent + heavy = %d positions per layer and KV head.",
                          info.settings.recent + info.settings.heavy);
            break;
        case Variant::growing: break;  // not one the viewer runs
    }

    // Three plots: side by side when the window is wide, else stacked (the third full width), or
    // in tabs when the window is too short to stack them.
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    const float spacing = ImGui::GetStyle().ItemSpacing.x;
    const int cols = avail.x >= 3 * 300 ? 3 : avail.x >= 2 * 280 ? 2 : 1;
    const int rows = (3 + cols - 1) / cols;
    const float why_h = ImGui::GetTextLineHeightWithSpacing() * 2;
    const float row_h = (avail.y - why_h) / float(rows) - ImGui::GetStyle().ItemSpacing.y;
    if (row_h >= 150) {
        const float plot_h = std::min(row_h, 320.0f);
        const float plot_w = std::floor((avail.x - spacing * float(cols - 1)) / float(cols));
        line_plot("cumulative FLOPs", "T", flops_unit, {flops_naive, flops_cached}, x_max, ImVec2(plot_w, plot_h));
        if (cols > 1) ImGui::SameLine();
        line_plot("cumulative time", "T", time_unit, {time_naive, time_cached}, x_max, ImVec2(plot_w, plot_h));
        if (cols == 3) ImGui::SameLine();
        line_plot("KV cache bytes", "T", bytes_unit, {reserved, used, formula, weights}, x_max,
                  ImVec2(cols == 3 ? plot_w : avail.x, plot_h));
    } else if (ImGui::BeginTabBar("cost_plots")) {
        const float plot_h = std::clamp(avail.y - why_h - ImGui::GetFrameHeightWithSpacing() - 4, 120.0f, 320.0f);
        const ImVec2 size(avail.x, plot_h);
        if (ImGui::BeginTabItem("FLOPs")) {
            line_plot("cumulative FLOPs", "T", flops_unit, {flops_naive, flops_cached}, x_max, size);
            ImGui::EndTabItem();
        }
        if (ImGui::BeginTabItem("time")) {
            line_plot("cumulative time", "T", time_unit, {time_naive, time_cached}, x_max, size);
            ImGui::EndTabItem();
        }
        if (ImGui::BeginTabItem("KV bytes")) {
            line_plot("KV cache bytes", "T", bytes_unit, {reserved, used, formula, weights}, x_max, size);
            ImGui::EndTabItem();
        }
        ImGui::EndTabBar();
    }
    ImGui::TextWrapped("%s", why);
    ImGui::End();
}

}  // namespace kvlab::viz
