// kvlab viewer: pictures out of the renderer. Headless runs draw into an offscreen framebuffer;
// either way a frame is read back as RGB rows, top row first, and written as PNG.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "panels.h"

namespace kvlab::viz {

// An RGBA framebuffer object of width x height pixels, bound while it exists.
class Offscreen {
public:
    Offscreen(int width, int height);
    ~Offscreen();
    Offscreen(const Offscreen&) = delete;
    Offscreen& operator=(const Offscreen&) = delete;

private:
    unsigned fbo_ = 0, color_ = 0;
};

// The bound framebuffer's pixels: [height, width, 3], top row first (as in the window).
std::vector<std::uint8_t> read_pixels(int width, int height);
// Throws kvlab::Error when the file cannot be written.
void write_png(const std::string& path, const std::vector<std::uint8_t>& rgb, int width, int height);
// The regions the panels reported, the palette and what the state says, as JSON for the tests.
void write_layout(const std::string& path, const std::string& screenshot, int width, int height, const Report& report,
                  const Frame& frame);
// Turns dir/frame_*.png into dir/animation.gif with ImageMagick or ffmpeg, if one is installed;
// returns what it did, for the user.
std::string make_gif(const std::string& dir, int delay_centiseconds);

}  // namespace kvlab::viz
