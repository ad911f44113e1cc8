// kvlab viewer: the application state behind the window. It owns the live session, the
// playback (which step is shown, playing or paused, speed) and the settings the controls edit,
// and draws the controls and the seven panels at fixed places in the window.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "panels.h"
#include "session.h"

namespace kvlab::viz {

class App {
public:
    // Throws kvlab::Error when the settings cannot start a session.
    explicit App(const Settings& settings);

    // Advances playback by dt seconds and draws one frame into a window of width x height
    // pixels; regions the tests look for go into report when it is given.
    void frame(float dt, int width, int height, Report* report = nullptr);

    // Playback, for the controls and for scripted (headless) runs.
    void set_speed(float steps_per_second) { speed_ = steps_per_second; }
    void seek(int step);  // shows step `step` (clamped to what is published), paused
    // A planted viewer bug (panels.h: Frame::plant) for the tests that must catch it.
    void set_plant(const std::string& bug) { frame_.plant = bug; }
    // A new session with these settings (what the controls' Restart does). On bad settings the
    // old session keeps running, error() says why, and it returns false.
    bool restart(const Settings& settings);
    const std::string& error() const { return error_; }
    // The step playback will show after advancing dt seconds (headless runs wait for it).
    int upcoming(float dt) const;
    int shown() const { return int(cursor_); }
    // Steps playback runs through: the serving view's (all computed up front), or the session's.
    int total_steps() const;
    Session& session() { return *session_; }
    const Frame& last_frame() const { return frame_; }

private:
    void draw_controls();
    int published() const;  // steps ready to show
    void layout_serving(float W, float H);

    std::unique_ptr<Session> session_;
    Settings edited_;                 // what the controls show; applied by Restart
    std::array<char, 256> prompt_{};  // the prompt's text field
    std::string error_;               // why the last restart failed
    bool restart_requested_ = false;  // by the controls, carried out before the next frame
    float cursor_ = 0;                // the step shown, with the fraction through its animation
    bool playing_ = true;
    float speed_ = 6;  // steps per second
    int layer_ = 0;
    Frame frame_;
};

}  // namespace kvlab::viz
