// The viewer's panels without a window: Dear ImGui builds its draw lists with no renderer, so
// every panel can draw every step of every variant here, where a bad index trips an assert
// (asserts stay on in every build). Restart keeps the old session on bad settings.
#include <imgui.h>

#include <catch2/catch.hpp>
#include <limits>

#include "app.h"

using namespace kvlab;
using namespace kvlab::viz;

namespace {

// An ImGui context with a built font atlas: enough for NewFrame, Render and every widget.
struct Context {
    Context() {
        ImGui::CreateContext();
        ImGuiIO& io = ImGui::GetIO();
        io.IniFilename = nullptr;
        unsigned char* pixels = nullptr;
        int w = 0, h = 0;
        io.Fonts->GetTexDataAsRGBA32(&pixels, &w, &h);
    }
    ~Context() { ImGui::DestroyContext(); }
};

Settings small(Variant v) {
    Settings s;
    s.variant = v;
    s.random_model = true;
    s.shape = Config::parse("n_layers=2,n_heads=4,n_kv_heads=2", stories260k_shape());
    s.prompt = "abcdefgh";
    s.steps = 14;
    s.block_size = 2;
    s.fork_at = 3;
    s.free_fork_at = 9;
    s.n_blocks = 20;  // small enough that C's freed blocks get evicted
    s.window = 4;
    return s;
}

// One frame of `width` x `height`; returns the regions the panels reported.
Report draw(App& app, int width, int height) {
    ImGuiIO& io = ImGui::GetIO();
    io.DisplaySize = ImVec2(float(width), float(height));
    io.DeltaTime = 1.0f / 30;
    ImGui::NewFrame();
    Report report;
    app.frame(io.DeltaTime, width, height, &report);
    ImGui::Render();
    return report;
}

}  // namespace

TEST_CASE("viewer: every panel draws every step of every variant, at several window sizes") {
    const Context ctx;
    for (Variant v : kVariants) {
        INFO(to_string(v));
        App app(small(v));
        const int total = app.session().info().total_steps;
        REQUIRE(app.session().wait_for(total - 1));
        for (int step = 0; step < total; step++) {
            app.seek(step);
            for (auto [w, h] : {std::pair{1600, 1000}, std::pair{1280, 800}, std::pair{2400, 1400}}) {
                const Report r = draw(app, w, h);
                CHECK(app.shown() == step);
                // Every reported region lies inside the window.
                for (const Region& g : r.regions) {
                    INFO(g.name << " at step " << step << " in " << w << "x" << h);
                    CHECK(g.min.x >= 0);
                    CHECK(g.min.y >= 0);
                    CHECK(g.max.x <= w);
                    CHECK(g.max.y <= h);
                }
            }
        }
    }
}

TEST_CASE("viewer: playback stays on a published step at any speed, NaN and infinities included") {
    // A NaN speed once made the cursor NaN, and int(NaN) an index far outside the steps.
    const Context ctx;
    App app(small(Variant::paged));
    const int total = app.session().info().total_steps;
    REQUIRE(app.session().wait_for(total - 1));
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    for (float speed : {nan, inf, -inf, -5.0f, 1e30f, 0.0f, 6.0f, nan}) {
        INFO("speed " << speed);
        app.set_speed(speed);
        for (int frame = 0; frame < 3; frame++) {
            const int next = app.upcoming(1.0f / 30);
            CHECK((next >= 0 && next < total));
            draw(app, 1600, 1000);
            CHECK((app.shown() >= 0 && app.shown() < total));
            CHECK((app.last_frame().cursor >= 0 && app.last_frame().cursor < total));
        }
    }
}

TEST_CASE("viewer: restart swaps in a new session, and bad settings keep the old one with a message") {
    const Context ctx;
    App app(small(Variant::contiguous_head));
    draw(app, 1600, 1000);
    REQUIRE(app.restart(small(Variant::paged)));
    CHECK(app.session().info().settings.variant == Variant::paged);
    CHECK(app.error().empty());
    draw(app, 1600, 1000);

    Settings bad = small(Variant::window);
    bad.steps = 1000;  // longer than max_seq
    CHECK_FALSE(app.restart(bad));
    CHECK(app.error().find("max_seq") != std::string::npos);
    CHECK(app.session().info().settings.variant == Variant::paged);
    draw(app, 1600, 1000);
}

TEST_CASE("viewer, counter-test: below the minimum size (1280x800) the region check finds clipped grids") {
    const Context ctx;
    App app(small(Variant::contiguous_head));
    REQUIRE(app.session().wait_for(app.session().info().total_steps - 1));
    app.seek(app.session().info().total_steps - 1);
    bool clipped = false;
    for (const Region& g : draw(app, 800, 600).regions) clipped = clipped || g.max.y > 600 || g.max.x > 800;
    CHECK(clipped);
}
