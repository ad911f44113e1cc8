// kvlab view: the viewer's main loop, as plain as Dear ImGui's GLFW + OpenGL3 example.
//   1. find a display (headless runs start their own Xvfb when there is none)
//   2. open a GLFW window with an OpenGL 3.3 core context (hidden when headless)
//   3. set up Dear ImGui with its GLFW and OpenGL3 backends
//   4. loop: poll events, start a frame, let the App draw its panels, render, capture, swap
//   5. report frames per second, write the GIF, clean up
#define GL_GLEXT_PROTOTYPES
#include <GL/gl.h>
#include <GLFW/glfw3.h>
#include <fmt/format.h>
#include <imgui.h>
#include <imgui_impl_glfw.h>
#include <imgui_impl_opengl3.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "app.h"
#include "capture.h"
#include "display.h"
#include "file_writer.h"
#include "view.h"

namespace kvlab::viz {

namespace {

// GLFW's latest complaint, folded into our one-line error instead of printed beside it.
std::string glfw_message;
void glfw_error(int code, const char* text) { glfw_message = fmt::format("GLFW error {}: {}", code, one_line(text)); }

void check_options(const ViewOptions& o) {
    if (!o.plant.empty() && o.plant != "growth-skips-newest" && o.plant != "marker-stuck" &&
        o.plant != "pool-hides-shared" && o.plant != "bits-fp32-fields" && o.plant != "tiles-follow-rows" &&
        o.plant != "serving-hides-shared")
        throw Error(fmt::format("unknown planted bug '{}'", one_line(o.plant)));
    // Below 1280x800 the panels' grids no longer fit their windows (the viewer tests check it).
    if (o.width < 1280 || o.height < 800 || o.width > 8192 || o.height > 8192)
        throw Error(fmt::format("--size must be between 1280x800 and 8192x8192, not {}x{}", o.width, o.height));
    if (o.headless && o.frames < 1) throw Error("--headless needs --frames N (N >= 1): how many frames to render");
    if ((!o.screenshot.empty() || !o.layout.empty()) && o.frames < 1)
        throw Error("--screenshot and --layout need --frames N: the picture is of the last frame");
    // Refused before any frame is drawn (a folder, a FIFO, a missing folder), not after.
    if (!o.screenshot.empty()) output_target(o.screenshot, fmt::format("--screenshot '{}'", one_line(o.screenshot)));
    if (!o.layout.empty()) output_target(o.layout, fmt::format("--layout '{}'", one_line(o.layout)));
    if (!o.record.empty()) {
        if (o.record.find('\'') != std::string::npos) throw Error("--record: the folder's name may not contain '");
        std::error_code ec;
        std::filesystem::create_directories(o.record, ec);
        if (ec) throw Error(fmt::format("--record: cannot create {}: {}", one_line(o.record), ec.message()));
    }
}

}  // namespace

int run_view(const ViewOptions& o) {
    check_options(o);
    // The session first: bad settings are errors before any window opens.
    App app(o.settings);
    app.set_speed(o.speed);
    app.set_plant(o.plant);
    if (o.step >= 0 || o.step == -1) {
        const int target = o.step == -1 ? app.total_steps() - 1 : o.step;
        if (target >= app.total_steps())
            throw Error(fmt::format("--step {} is past the session's last step {}", target, app.total_steps() - 1));
        if (!app.session().serving()) app.session().wait_for(target);
        app.seek(target);
    }

    // 1. A display.
    std::optional<VirtualDisplay> xvfb;
    if (!have_display()) {
        if (!o.headless)
            throw Error("no display (DISPLAY is not set): use --headless to render offscreen, or run under xvfb-run");
        xvfb.emplace(o.width, o.height);
    }

    // 2. A window with an OpenGL 3.3 core context.
    glfwSetErrorCallback(glfw_error);
    if (!glfwInit()) throw Error(fmt::format("cannot initialize GLFW, is the display reachable? ({})", glfw_message));
    glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
    glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 3);
    glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
    glfwWindowHint(GLFW_VISIBLE, o.headless ? GLFW_FALSE : GLFW_TRUE);
    GLFWwindow* window = glfwCreateWindow(o.width, o.height, "kvlab view", nullptr, nullptr);
    if (!window) {
        glfwTerminate();
        throw Error(fmt::format("cannot open an OpenGL 3.3 core window ({}); with Mesa, install libgl1-mesa-dri",
                                glfw_message));
    }
    glfwMakeContextCurrent(window);
    glfwSwapInterval(o.headless || o.fps ? 0 : 1);  // measured frame rates are not capped by vsync

    // 3. Dear ImGui.
    IMGUI_CHECKVERSION();
    ImGui::CreateContext();
    ImGui::GetIO().IniFilename = nullptr;  // the layout is fixed; nothing to remember
    ImGui::StyleColorsDark();
    // Opaque windows: with software OpenGL every blended pixel costs, and the panels tile the window.
    ImGui::GetStyle().Colors[ImGuiCol_WindowBg].w = 1.0f;
    ImGui_ImplGlfw_InitForOpenGL(window, true);
    ImGui_ImplOpenGL3_Init("#version 330 core");
    std::optional<Offscreen> offscreen;
    if (o.headless) offscreen.emplace(o.width, o.height);

    // 4. The loop. Scripted runs advance playback by a fixed 1/30 s per frame and wait for the
    // decoder, so their pictures do not depend on the machine's speed; --fps runs in real time.
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    auto last = start;
    const bool scripted = o.frames > 0 && !o.fps;
    Report report;
    int frame = 0, recorded = 0;
    for (; !glfwWindowShouldClose(window) && (o.frames == 0 || frame < o.frames); frame++) {
        glfwPollEvents();
        const auto now = Clock::now();
        const float dt = scripted ? 1.0f / 30 : std::chrono::duration<float>(now - last).count();
        last = now;
        if (scripted) app.session().wait_for(app.upcoming(dt));

        int fb_w = o.width, fb_h = o.height;
        if (!o.headless) glfwGetFramebufferSize(window, &fb_w, &fb_h);
        ImGui_ImplOpenGL3_NewFrame();
        ImGui_ImplGlfw_NewFrame();
        ImGui::GetIO().DisplaySize = ImVec2(float(fb_w), float(fb_h));  // the offscreen target's size
        ImGui::NewFrame();
        const bool last_frame = o.frames > 0 && frame == o.frames - 1;
        report.regions.clear();
        app.frame(dt, fb_w, fb_h, &report);
        ImGui::Render();
        glViewport(0, 0, fb_w, fb_h);
        glClearColor(0.08f, 0.09f, 0.10f, 1.0f);
        glClear(GL_COLOR_BUFFER_BIT);
        ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());

        if (!o.record.empty() && frame % o.record_every == 0) {
            const auto path = std::filesystem::path(o.record) / fmt::format("frame_{:04d}.png", recorded++);
            write_png(path.string(), read_pixels(fb_w, fb_h), fb_w, fb_h);
        }
        if (last_frame && !o.screenshot.empty()) write_png(o.screenshot, read_pixels(fb_w, fb_h), fb_w, fb_h);
        if (last_frame && !o.layout.empty()) write_layout(o.layout, o.screenshot, fb_w, fb_h, report, app.last_frame());
        if (o.headless)
            glFinish();  // the frame is really drawn before the next one is counted
        else
            glfwSwapBuffers(window);
    }

    // 5. Report and clean up.
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (o.fps)
        fmt::print(
            "{} frames in {:.2f} s: {:.1f} frames per second ({}x{}, {}, {}; decoder published {} of {} steps)\n",
            frame, seconds, frame / seconds, o.width, o.height, o.headless ? "offscreen" : "window",
            reinterpret_cast<const char*>(glGetString(GL_RENDERER)), app.session().n_steps(),
            app.session().info().total_steps);
    if (!o.screenshot.empty()) fmt::print("wrote {}\n", o.screenshot);
    if (!o.record.empty()) {
        fmt::print("wrote {} frames to {}\n", recorded, o.record);
        fmt::print("{}\n", make_gif(o.record, std::max(2, int(100.0 / 30 * o.record_every))));
    }
    offscreen.reset();
    ImGui_ImplOpenGL3_Shutdown();
    ImGui_ImplGlfw_Shutdown();
    ImGui::DestroyContext();
    glfwDestroyWindow(window);
    glfwTerminate();
    return 0;
}

}  // namespace kvlab::viz
