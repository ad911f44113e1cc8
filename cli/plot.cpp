#include "plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "config.h"
#include "file_writer.h"

#if KVLAB_HAVE_STB
#include <stb_easy_font.h>
#include <stb_image_write.h>
#endif

namespace kvlab::cli {

namespace {

constexpr int kChartW = 900, kChartH = 460;                       // pixels per chart
constexpr int kLeft = 90, kRight = 250, kTop = 52, kBottom = 64;  // the plot area's margins; the legend is right
constexpr Rgb kInk{40, 40, 40}, kGrid{225, 225, 225}, kPaper{255, 255, 255};

// An RGB image, row-major, top row first.
class Canvas {
public:
    Canvas(int w, int h) : w_(w), h_(h), px_(std::size_t(w) * h * 3, 255) {}  // [h, w, 3]
    int width() const { return w_; }
    int height() const { return h_; }
    const unsigned char* data() const { return px_.data(); }
    void dot(int x, int y, Rgb c) {
        if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
        unsigned char* p = &px_[(std::size_t(y) * w_ + x) * 3];
        p[0] = c.r, p[1] = c.g, p[2] = c.b;
    }
    void fill(int x0, int y0, int x1, int y1, Rgb c) {  // [x0, x1) x [y0, y1)
        for (int y = std::max(y0, 0); y < std::min(y1, h_); y++)
            for (int x = std::max(x0, 0); x < std::min(x1, w_); x++) dot(x, y, c);
    }
    // A line `width` pixels wide; dashed: 8 pixels on, 6 off, along its longer axis.
    void line(double x0, double y0, double x1, double y1, Rgb c, int width = 2, bool dashed = false) {
        const double n = std::max(std::fabs(x1 - x0), std::fabs(y1 - y0));
        const int steps = std::max(1, int(std::ceil(n)));
        for (int i = 0; i <= steps; i++) {
            if (dashed && i % 14 >= 8) continue;
            const double t = double(i) / steps;
            const int x = int(std::lround(x0 + t * (x1 - x0))), y = int(std::lround(y0 + t * (y1 - y0)));
            fill(x - width / 2, y - width / 2, x - width / 2 + width, y - width / 2 + width, c);
        }
    }
    // Text with its top-left corner at (x, y), each font pixel `scale` pixels wide.
    void text(int x, int y, const std::string& s, Rgb c, int scale = 2) {
#if KVLAB_HAVE_STB
        std::vector<char> buf(s.size() * 1024 + 64);  // room for the busiest glyph: up to 16 quads of 64 bytes
        std::string copy = s;
        const int quads = stb_easy_font_print(0, 0, copy.data(), nullptr, buf.data(), int(buf.size()));
        for (int q = 0; q < quads; q++) {
            float v[4][4];  // 4 vertices of x, y, z and a packed colour
            std::memcpy(v, buf.data() + std::size_t(q) * sizeof v, sizeof v);
            fill(x + int(v[0][0] * scale), y + int(v[0][1] * scale), x + int(v[2][0] * scale), y + int(v[2][1] * scale),
                 c);
        }
#else
        (void)x, (void)y, (void)s, (void)c, (void)scale;
#endif
    }
    static int text_width(const std::string& s, int scale = 2) {
#if KVLAB_HAVE_STB
        std::string copy = s;
        return stb_easy_font_width(copy.data()) * scale;
#else
        return int(s.size()) * 6 * scale;
#endif
    }

private:
    int w_, h_;
    std::vector<unsigned char> px_;
};

// "1", "10", "100", "1k", "10k", "1M", "1G" (y ticks are powers of ten).
std::string short_number(double v) {
    const char* units[] = {"", "k", "M", "G", "T"};
    int u = 0;
    while (v >= 1000 && u < 4) v /= 1000, u++;
    return fmt::format("{:g}{}", v, units[u]);
}

// A y as drawn: below the chart's floor (0 included) at the floor.
double shown_y(const Chart& chart, double y) { return chart.y_floor > 0 && y < chart.y_floor ? chart.y_floor : y; }

void draw_marker(Canvas& cv, double cx, double cy, Marker m, Rgb c) {
    const int x = int(cx), y = int(cy);  // truncated, as bench's squares always were
    switch (m) {
        case Marker::square: cv.fill(x - 3, y - 3, x + 4, y + 4, c); break;
        case Marker::circle:
            for (int dy = -4; dy <= 4; dy++)
                for (int dx = -4; dx <= 4; dx++)
                    if (dx * dx + dy * dy <= 17) cv.dot(x + dx, y + dy, c);
            break;
        case Marker::diamond:
            for (int dy = -5; dy <= 5; dy++)
                for (int dx = -5; dx <= 5; dx++)
                    if (std::abs(dx) + std::abs(dy) <= 5) cv.dot(x + dx, y + dy, c);
            break;
        case Marker::triangle:
            for (int dy = -4; dy <= 4; dy++)
                for (int dx = -5; dx <= 5; dx++)
                    if (2 * std::abs(dx) <= dy + 5) cv.dot(x + dx, y + dy, c);
            break;
        case Marker::cross: cv.line(x - 4, y - 4, x + 4, y + 4, c, 3), cv.line(x - 4, y + 4, x + 4, y - 4, c, 3); break;
        case Marker::none: break;
    }
}

// Where a chart's pixels go: its plot area and its logarithmic axes.
struct Frame {
    int px0 = 0, px1 = 0, py0 = 0, py1 = 0;
    double lx0 = 0, lx1 = 0, ly0 = 0, ly1 = 0;  // log2 of the x range, log10 of the y range
    double X(double x) const { return px0 + (std::log2(x) - lx0) / (lx1 - lx0) * (px1 - px0); }
    double Y(double y) const { return py1 - (std::log10(y) - ly0) / (ly1 - ly0) * (py1 - py0); }
};

// The frame around every point drawn (and the floor); false when there is none.
bool chart_frame(int ox, const Chart& chart, int w, int h, Frame& f) {
    double x_min = 1e300, x_max = 0, y_min = 1e300, y_max = 0;
    for (const PlotSeries& s : chart.series)
        for (const auto& [x, y0] : s.points)
            if (const double y = shown_y(chart, y0); x > 0 && y > 0 && std::isfinite(x) && std::isfinite(y)) {
                x_min = std::min(x_min, x), x_max = std::max(x_max, x);
                y_min = std::min(y_min, y), y_max = std::max(y_max, y);
            }
    if (x_max <= 0) return false;
    if (chart.y_floor > 0) y_min = std::min(y_min, chart.y_floor);
    f.lx0 = std::floor(std::log2(x_min)), f.lx1 = std::max(f.lx0 + 1, std::ceil(std::log2(x_max)));
    f.ly0 = std::floor(std::log10(y_min)), f.ly1 = std::max(f.ly0 + 1, std::ceil(std::log10(y_max)));
    f.px0 = ox + kLeft, f.px1 = ox + w - kRight, f.py0 = kTop, f.py1 = h - kBottom;
    return true;
}

void draw_axes(Canvas& cv, int ox, const Chart& chart, const Frame& f) {
    for (double e = f.lx0; e <= f.lx1; e++) {
        const double x = f.X(std::exp2(e));
        cv.line(x, f.py0, x, f.py1, kGrid, 1);
        const std::string label = fmt::format("{:.0f}", std::exp2(e));  // lengths and bytes, written out
        cv.text(int(x) - Canvas::text_width(label) / 2, f.py1 + 8, label, kInk);
    }
    for (double e = f.ly0; e <= f.ly1; e++) {
        const double y = f.Y(std::pow(10.0, e));
        cv.line(f.px0, y, f.px1, y, kGrid, 1);
        const std::string label = short_number(std::pow(10.0, e));
        cv.text(f.px0 - 8 - Canvas::text_width(label), int(y) - 6, label, kInk);
    }
    cv.line(f.px0, f.py1, f.px1, f.py1, kInk, 1), cv.line(f.px0, f.py0, f.px0, f.py1, kInk, 1);
    cv.text(ox + kLeft, 8, chart.title, kInk);
    cv.text((f.px0 + f.px1 - Canvas::text_width(chart.x_label)) / 2, f.py1 + 34, chart.x_label, kInk);
    cv.text(ox + 8, f.py0 - 20, chart.y_label, kInk);
    if (chart.marker_x > 0 && chart.marker_x >= std::exp2(f.lx0) && chart.marker_x <= std::exp2(f.lx1)) {
        const double x = f.X(chart.marker_x);
        cv.line(x, f.py0, x, f.py1, kInk, 1, true);
        const int w = Canvas::text_width(chart.marker_label);
        cv.text(int(x) + 6 + w <= f.px1 ? int(x) + 6 : int(x) - 6 - w, f.py1 - 22, chart.marker_label, kInk);
    }
    if (chart.y_floor > 0) {
        const double y = f.Y(chart.y_floor);
        cv.line(f.px0, y, f.px1, y, kInk, 1, true);
        cv.text(f.px0 + 6, int(y) - 16, chart.y_floor_label, kInk);
    }
}

// Each series in turn: a line's segments with a marker after each (as bench has always drawn
// them), a scatter's markers, the labels; the legend on the right.
void draw_series(Canvas& cv, const Chart& chart, const Frame& f) {
    const auto drawn = [&](double x, double y) { return x > 0 && y > 0 && std::isfinite(x) && std::isfinite(y); };
    int legend_y = f.py0 + 8;
    for (const PlotSeries& s : chart.series) {
        bool have = false;
        double x_prev = 0, y_prev = 0;
        for (std::size_t i = 0; i < s.points.size(); i++) {
            const double x = s.points[i].first, y = shown_y(chart, s.points[i].second);
            if (!drawn(x, y)) continue;
            if (s.line && have) cv.line(f.X(x_prev), f.Y(y_prev), f.X(x), f.Y(y), s.colour, 2, s.dashed);
            draw_marker(cv, f.X(x), f.Y(y), s.marker, s.colour);
            x_prev = x, y_prev = y, have = true;
        }
        for (std::size_t i = 0; i < std::min(s.labels.size(), s.points.size()); i++) {
            const double x = s.points[i].first, y = shown_y(chart, s.points[i].second);
            // Above and below the point in turn, so that close neighbours' labels do not overlap.
            if (drawn(x, y) && !s.labels[i].empty())
                cv.text(int(f.X(x)) + 7, int(f.Y(y)) + (i % 2 ? 4 : -11), s.labels[i], kInk, 1);
        }
        if (s.line)
            cv.line(f.px1 + 16, legend_y + 6, f.px1 + 44, legend_y + 6, s.colour, 3, s.dashed);
        else
            draw_marker(cv, f.px1 + 30, legend_y + 6, s.marker, s.colour);
        cv.text(f.px1 + 52, legend_y, s.name, kInk);
        legend_y += 20;
    }
}

void draw_chart(Canvas& cv, int ox, const Chart& chart, int w, int h) {
    Frame f;
    if (!chart_frame(ox, chart, w, h, f)) return;  // nothing to draw
    draw_axes(cv, ox, chart, f);
    draw_series(cv, chart, f);
}

}  // namespace

bool can_plot() { return KVLAB_HAVE_STB != 0; }

void check_plot_path(const std::string& option, const std::string& path) {
    if (!can_plot()) throw Error(fmt::format("{} needs a kvlab built with stb (libstb-dev), which writes PNG", option));
    output_target(path, fmt::format("{} '{}'", option, one_line(path)));
}

void write_charts_png(const std::string& path, const std::vector<Chart>& charts) {
#if KVLAB_HAVE_STB
    const auto width = [](const Chart& c) { return c.width > 0 ? c.width : kChartW; };
    int w = 0, h = 0;
    for (const Chart& c : charts) w += width(c), h = std::max(h, c.height > 0 ? c.height : kChartH);
    Canvas cv(std::max(w, kChartW), std::max(h, kChartH));
    cv.fill(0, 0, cv.width(), cv.height(), kPaper);
    for (int i = 0, ox = 0; i < int(charts.size()); ox += width(charts[i]), i++)
        draw_chart(cv, ox, charts[i], width(charts[i]), charts[i].height > 0 ? charts[i].height : kChartH);
    std::vector<unsigned char> png;
    auto append = [](void* context, void* data, int n) {
        auto* out = static_cast<std::vector<unsigned char>*>(context);
        out->insert(out->end(), static_cast<unsigned char*>(data), static_cast<unsigned char*>(data) + n);
    };
    if (!stbi_write_png_to_func(append, &png, cv.width(), cv.height(), 3, cv.data(), cv.width() * 3))
        throw Error(fmt::format("--plot '{}': the PNG could not be encoded", one_line(path)));
    write_file(path, fmt::format("--plot '{}'", one_line(path)),
               std::string_view(reinterpret_cast<const char*>(png.data()), png.size()));
#else
    (void)charts;
    throw Error(
        fmt::format("--plot '{}': this kvlab was built without stb (libstb-dev), which writes PNG", one_line(path)));
#endif
}

}  // namespace kvlab::cli
