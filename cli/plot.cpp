#include "plot.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "config.h"

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

void draw_chart(Canvas& cv, int ox, const Chart& chart) {
    double x_min = 1e300, x_max = 0, y_min = 1e300, y_max = 0;
    for (const PlotSeries& s : chart.series)
        for (const auto& [x, y] : s.points)
            if (x > 0 && y > 0) {
                x_min = std::min(x_min, x), x_max = std::max(x_max, x);
                y_min = std::min(y_min, y), y_max = std::max(y_max, y);
            }
    if (x_max <= 0) return;  // nothing to draw
    const double lx0 = std::floor(std::log2(x_min)), lx1 = std::max(lx0 + 1, std::ceil(std::log2(x_max)));
    const double ly0 = std::floor(std::log10(y_min)), ly1 = std::max(ly0 + 1, std::ceil(std::log10(y_max)));
    const int px0 = ox + kLeft, px1 = ox + kChartW - kRight, py0 = kTop, py1 = kChartH - kBottom;
    auto X = [&](double x) { return px0 + (std::log2(x) - lx0) / (lx1 - lx0) * (px1 - px0); };
    auto Y = [&](double y) { return py1 - (std::log10(y) - ly0) / (ly1 - ly0) * (py1 - py0); };
    for (double e = lx0; e <= lx1; e++) {
        const double x = X(std::exp2(e));
        cv.line(x, py0, x, py1, kGrid, 1);
        const std::string label = fmt::format("{:.0f}", std::exp2(e));  // context lengths, written out
        cv.text(int(x) - Canvas::text_width(label) / 2, py1 + 8, label, kInk);
    }
    for (double e = ly0; e <= ly1; e++) {
        const double y = Y(std::pow(10.0, e));
        cv.line(px0, y, px1, y, kGrid, 1);
        const std::string label = short_number(std::pow(10.0, e));
        cv.text(px0 - 8 - Canvas::text_width(label), int(y) - 6, label, kInk);
    }
    cv.line(px0, py1, px1, py1, kInk, 1), cv.line(px0, py0, px0, py1, kInk, 1);
    cv.text(ox + kLeft, 8, chart.title, kInk);
    cv.text((px0 + px1 - Canvas::text_width(chart.x_label)) / 2, py1 + 34, chart.x_label, kInk);
    cv.text(ox + 8, py0 - 20, chart.y_label, kInk);
    if (chart.marker_x > 0 && chart.marker_x >= std::exp2(lx0) && chart.marker_x <= std::exp2(lx1)) {
        const double x = X(chart.marker_x);
        cv.line(x, py0, x, py1, kInk, 1, true);
        const int w = Canvas::text_width(chart.marker_label);
        cv.text(int(x) + 6 + w <= px1 ? int(x) + 6 : int(x) - 6 - w, py1 - 22, chart.marker_label, kInk);
    }
    int legend_y = py0 + 8;
    for (const PlotSeries& s : chart.series) {
        bool have = false;
        double x_prev = 0, y_prev = 0;
        for (const auto& [x, y] : s.points) {
            if (!(x > 0 && y > 0)) continue;
            if (have) cv.line(X(x_prev), Y(y_prev), X(x), Y(y), s.colour, 2, s.dashed);
            cv.fill(int(X(x)) - 3, int(Y(y)) - 3, int(X(x)) + 4, int(Y(y)) + 4, s.colour);
            x_prev = x, y_prev = y, have = true;
        }
        cv.line(px1 + 16, legend_y + 6, px1 + 44, legend_y + 6, s.colour, 3, s.dashed);
        cv.text(px1 + 52, legend_y, s.name, kInk);
        legend_y += 20;
    }
}

}  // namespace

bool can_plot() { return KVLAB_HAVE_STB != 0; }

void write_charts_png(const std::string& path, const std::vector<Chart>& charts) {
#if KVLAB_HAVE_STB
    Canvas cv(kChartW * int(std::max<std::size_t>(charts.size(), 1)), kChartH);
    cv.fill(0, 0, cv.width(), cv.height(), kPaper);
    for (std::size_t i = 0; i < charts.size(); i++) draw_chart(cv, int(i) * kChartW, charts[i]);
    std::vector<unsigned char> png;
    auto append = [](void* context, void* data, int n) {
        auto* out = static_cast<std::vector<unsigned char>*>(context);
        out->insert(out->end(), static_cast<unsigned char*>(data), static_cast<unsigned char*>(data) + n);
    };
    if (!stbi_write_png_to_func(append, &png, cv.width(), cv.height(), 3, cv.data(), cv.width() * 3))
        throw Error(fmt::format("--plot '{}': the PNG could not be encoded", one_line(path)));
    namespace fs = std::filesystem;
    const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
        throw Error(fmt::format("--plot '{}': cannot open for writing: {}", one_line(path), std::strerror(errno)));
    out.write(reinterpret_cast<const char*>(png.data()), std::streamsize(png.size()));
    out.close();
    std::error_code ec;
    if (!out) {
        const std::string why = std::strerror(errno);
        fs::remove(tmp, ec);
        throw Error(fmt::format("--plot '{}': write failed: {}", one_line(path), why));
    }
    fs::rename(tmp, path, ec);
    if (ec) {
        std::error_code ignored;
        fs::remove(tmp, ignored);
        throw Error(fmt::format("--plot '{}': cannot rename into place: {}", one_line(path), ec.message()));
    }
#else
    (void)charts;
    throw Error(
        fmt::format("--plot '{}': this kvlab was built without stb (libstb-dev), which writes PNG", one_line(path)));
#endif
}

}  // namespace kvlab::cli
