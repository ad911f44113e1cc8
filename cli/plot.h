// kvlab CLI: line and scatter charts as a PNG, drawn on the CPU: `kvlab bench --plot` and
// `kvlab frontier --plot`. Axes are logarithmic (x in powers of two, as context lengths and bytes
// are chosen; y in powers of ten); text is stb's pixel font.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace kvlab::cli {

struct Rgb {
    unsigned char r, g, b;
};

// The shape drawn at each point (none: the line alone).
enum class Marker { square, circle, diamond, triangle, cross, none };

struct PlotSeries {
    std::string name;
    Rgb colour;
    // (x, y), x ascending when joined by a line; y <= 0 is left out unless the chart has a y_floor
    std::vector<std::pair<double, double>> points;
    bool dashed = false;
    bool line = true;  // false: a scatter, its points not joined (the legend shows the marker)
    Marker marker = Marker::square;
    std::vector<std::string> labels = {};  // [points] or empty: small text beside each point ("" for none)
};

struct Chart {
    std::string title, x_label, y_label;
    std::vector<PlotSeries> series;
    double marker_x = 0;  // a vertical line at this x when inside the x range (0: none)
    std::string marker_label = {};
    // > 0: a y below it (0 included) is drawn at it, on a dashed line labelled y_floor_label, so
    // that a log axis still shows points with y = 0
    double y_floor = 0;
    std::string y_floor_label = {};
    int width = 0, height = 0;  // pixels; 0: 900 x 460
};

// Whether this build can write PNG files (it needs stb).
bool can_plot();

// The charts side by side in one PNG at path, written to a temporary file and renamed into place.
// Throws Error (one line) when the file cannot be written or the build has no stb.
void write_charts_png(const std::string& path, const std::vector<Chart>& charts);

// Refuses (Error, one line, naming `option`) a PNG path that cannot be written, before a long run
// spends its time: a build without stb, a folder, a folder that does not exist or is not writable.
void check_plot_path(const std::string& option, const std::string& path);

}  // namespace kvlab::cli
