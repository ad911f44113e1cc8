// kvlab viewer: `kvlab view`, the entry point the CLI calls.
#pragma once

#include <string>

#include "state.h"

namespace kvlab::viz {

struct ViewOptions {
    Settings settings;
    bool headless = false;  // render offscreen (starting Xvfb when there is no display)
    int frames = 0;         // stop after this many frames (0: run until the window closes)
    int width = 1600, height = 1000;
    float speed = 6;         // playback, steps per second
    int step = -2;           // show this step, paused (-1: the last one; -2: play from the start)
    std::string screenshot;  // PNG of the last frame
    std::string layout;      // JSON beside the screenshot: panel regions, palette, state (tests)
    std::string record;      // a folder for frame_0000.png, ... (and animation.gif when possible)
    int record_every = 1;    // keep every n-th frame
    bool fps = false;        // report frames per second (playback in real time, never waiting)
    std::string plant;       // a planted viewer bug, for the tests that must catch it
};

// Runs the viewer; returns the exit code. Bad options and missing displays are one-line errors.
int run_view(const ViewOptions& o);

}  // namespace kvlab::viz
