// kvlab CLI: line charts as a PNG, drawn on the CPU: `kvlab bench --plot`. Axes are logarithmic
// (x in powers of two, as context lengths are chosen; y in powers of ten); text is stb's pixel font.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace kvlab::cli {

struct Rgb {
    unsigned char r, g, b;
};

struct PlotSeries {
    std::string name;
    Rgb colour;
    std::vector<std::pair<double, double>> points;  // (x, y), x ascending; y <= 0 is left out
    bool dashed = false;
};

struct Chart {
    std::string title, x_label, y_label;
    std::vector<PlotSeries> series;
    double marker_x = 0;  // a vertical line at this x when inside the x range (0: none)
    std::string marker_label;
};

// Whether this build can write PNG files (it needs stb).
bool can_plot();

// The charts side by side in one PNG at path, written to a temporary file and renamed into place.
// Throws Error (one line) when the file cannot be written or the build has no stb.
void write_charts_png(const std::string& path, const std::vector<Chart>& charts);

}  // namespace kvlab::cli
