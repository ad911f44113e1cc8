// kvlab viewer: finding a display. A window needs an X display; a headless run starts its own
// Xvfb (a virtual X server with Mesa's software OpenGL) when there is none.
#pragma once

#include <string>

namespace kvlab::viz {

bool have_display();  // $DISPLAY is set

// A private Xvfb for the lifetime of this object; sets $DISPLAY to it. Throws kvlab::Error with
// a one-line message when Xvfb is not installed or does not start.
class VirtualDisplay {
public:
    VirtualDisplay(int width, int height);
    ~VirtualDisplay();
    VirtualDisplay(const VirtualDisplay&) = delete;
    VirtualDisplay& operator=(const VirtualDisplay&) = delete;
    const std::string& name() const { return name_; }

private:
    int pid_ = -1;
    std::string name_;  // ":99"
};

}  // namespace kvlab::viz
