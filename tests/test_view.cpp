// The viewer end to end: `kvlab view --headless` renders the real UI offscreen, and these tests
// check that the pictures show what the decoders' state says, by counting pixels of the
// panels' colours inside the regions the panels report (--layout). Each check has a planted
// viewer bug (--plant) that it must catch.
#include <stb_image.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.h"

using nlohmann::json;

namespace {

// The default test model: random, 2 layers, 4 query heads over 2 KV heads. Its prompt is BOS and
// the four bytes of "abcd", so P = 5 without asking the program.
const std::string kModel = "--shape n_layers=2,n_heads=4,n_kv_heads=2 --prompt abcd --steps 8";
constexpr int kP = 5, kLayers = 2, kKvHeads = 2;

bool can_render() {
    const char* d = std::getenv("DISPLAY");
    return (d && *d) || std::system("command -v Xvfb >/dev/null 2>&1") == 0;
}

// Skips (exit 77 under ctest) where no picture can be made: no display and no Xvfb.
#define SKIP_WITHOUT_DISPLAY()                                                       \
    if (!can_render()) {                                                             \
        std::printf("SKIPPED: no display and no Xvfb (apt-get install xvfb)\n");     \
        if (Catch::getCurrentContext().getConfig()->hasTestFilters()) std::exit(77); \
        return;                                                                      \
    }

struct Rgb {
    int r, g, b;
};

struct Shot {
    int w = 0, h = 0;
    std::vector<unsigned char> rgb;  // [h, w, 3]
    json layout;

    Rgb at(int x, int y) const {
        const unsigned char* p = rgb.data() + (std::size_t(y) * w + x) * 3;
        return {p[0], p[1], p[2]};
    }
    Rgb colour(const std::string& name) const {
        const json& c = layout["palette"][name];
        return {c[0], c[1], c[2]};
    }
    const json& region(const std::string& name) const {
        INFO("region " << name);
        REQUIRE(layout["regions"].contains(name));
        return layout["regions"][name];
    }
    // Pixels inside the region whose colour is one of `colours`.
    long count(const std::string& name, const std::vector<Rgb>& colours) const {
        const json& r = region(name);
        long n = 0;
        for (int y = r["y0"]; y < int(r["y1"]); y++)
            for (int x = r["x0"]; x < int(r["x1"]); x++) {
                const Rgb c = at(x, y);
                for (const Rgb& k : colours) n += c.r == k.r && c.g == k.g && c.b == k.b;
            }
        return n;
    }
    // Whole cells of those colours: the pixel count over one cell's area, which must divide it.
    long cells(const std::string& name, const std::vector<Rgb>& colours) const {
        const json& r = region(name);
        const long area = long(r["cell_w"]) * long(r["cell_h"]);
        REQUIRE(area > 0);
        const long px = count(name, colours);
        INFO("region " << name << ": " << px << " pixels, cells of " << area);
        CHECK(px % area == 0);
        return px / area;
    }
    // The leftmost and rightmost x of pixels of a colour in a region (-1, -1 if none).
    std::pair<int, int> x_extent(const std::string& name, Rgb k) const {
        const json& r = region(name);
        int lo = -1, hi = -1;
        for (int y = r["y0"]; y < int(r["y1"]); y++)
            for (int x = r["x0"]; x < int(r["x1"]); x++) {
                const Rgb c = at(x, y);
                if (c.r == k.r && c.g == k.g && c.b == k.b) {
                    if (lo < 0 || x < lo) lo = x;
                    hi = std::max(hi, x);
                }
            }
        return {lo, hi};
    }
};

// Runs the viewer headless and loads its screenshot and layout file. `launcher` runs the
// program some other way (xvfb-run, for a real window).
Shot view(const std::string& args, const std::string& name, const std::string& launcher = "") {
    const fs::path png = scratch() / (name + ".png"), lay = scratch() / (name + ".json");
    const std::string cmd = "view " + args + " --screenshot " + png.string() + " --layout " + lay.string();
    const Run r = launcher.empty() ? run_kvlab(cmd) : run_kvlab(cmd, launcher);
    INFO("kvlab " << cmd << "\nexit " << r.exit_code << "\nstderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    Shot s;
    int n = 0;
    unsigned char* data = stbi_load(png.string().c_str(), &s.w, &s.h, &n, 3);
    REQUIRE(data != nullptr);
    s.rgb.assign(data, data + std::size_t(s.w) * s.h * 3);
    stbi_image_free(data);
    s.layout = json::parse(slurp(lay));
    CHECK(s.layout["width"] == s.w);
    CHECK(s.layout["height"] == s.h);
    return s;
}

Shot headless(const std::string& args, const std::string& name) { return view("--headless --frames 2 " + args, name); }

// Cells of layer l's K and V grids: written (any phase), written by the step shown, by the prefill.
struct GrowthCount {
    long filled, newest, prefill;
};
GrowthCount growth(const Shot& s, int l, const char* kv) {
    const std::string name = "growth.l" + std::to_string(l) + "." + kv;
    return {s.cells(name, {s.colour("prefill"), s.colour("decode"), s.colour("newest")}),
            s.cells(name, {s.colour("newest")}), s.cells(name, {s.colour("prefill")})};
}

}  // namespace

TEST_CASE(
    "cache growth panel: after a prefill of P tokens and D decode steps, (P + D) x n_kv_heads cells "
    "are filled per layer, in K and in V") {
    SKIP_WITHOUT_DISPLAY();
    struct Case {
        std::string variant;
        int d;  // decode steps shown
    };
    for (const Case& c : {Case{"contiguous", 0}, Case{"contiguous", 5}, Case{"paged", 3}, Case{"quantized", 8}}) {
        const Shot s = headless(kModel + " --variant " + c.variant + " --step " + std::to_string(c.d),
                                "growth_" + c.variant + std::to_string(c.d));
        INFO(c.variant << " after " << c.d << " decode steps");
        CHECK(s.layout["state"]["length"] == kP + c.d);
        CHECK(s.layout["state"]["phase"] == (c.d == 0 ? "prefill" : "decode"));
        for (int l = 0; l < kLayers; l++)
            for (const char* kv : {"K", "V"}) {
                INFO("layer " << l << " " << kv);
                const GrowthCount g = growth(s, l, kv);
                CHECK(g.filled == (kP + c.d) * kKvHeads);
                // The prefill writes P columns at once, a decode step one.
                CHECK(g.newest == (c.d == 0 ? kP : 1) * kKvHeads);
                CHECK(g.prefill == (c.d == 0 ? 0 : kP) * kKvHeads);
            }
    }
}

TEST_CASE(
    "cache growth panel, window variant: every written cell is resident or evicted, and the sinks plus the "
    "window stay resident") {
    SKIP_WITHOUT_DISPLAY();
    const int d = 8, sinks = 1, window = 4;
    const Shot s = headless(kModel + " --variant window --sinks 1 --window 4 --step " + std::to_string(d), "window");
    for (int l = 0; l < kLayers; l++) {
        INFO("layer " << l);
        const std::string name = "growth.l" + std::to_string(l) + ".K";
        const long evicted = s.cells(name, {s.colour("evicted")});
        const long filled = growth(s, l, "K").filled;
        CHECK(filled + evicted == (kP + d) * kKvHeads);
        CHECK(evicted > 0);  // T = 13 > sinks + window
        CHECK(filled >= (sinks + window) * kKvHeads);
    }
}

TEST_CASE("cache growth panel, planted bug: a panel that leaves the newest column unpainted is caught") {
    SKIP_WITHOUT_DISPLAY();
    const Shot s = headless(kModel + " --step 4 --plant growth-skips-newest", "growth_planted");
    const GrowthCount g = growth(s, 0, "K");
    CHECK(g.filled != (kP + 4) * kKvHeads);
}

// The bits panel's rows for element 0: fp32's, and the code's in the cache's format. Cells of each
// field's colours (set or clear): sign, exponent, mantissa.
struct FieldCells {
    long sign, exp, man;
};
FieldCells field_cells(const Shot& s, const std::string& region) {
    return {s.cells(region, {s.colour("bit_sign_on"), s.colour("bit_sign_off")}),
            s.cells(region, {s.colour("bit_exp_on"), s.colour("bit_exp_off")}),
            s.cells(region, {s.colour("bit_man_on"), s.colour("bit_man_off")})};
}

TEST_CASE("bits panel: a K element in fp32 and as each format's code, with the format's sign, exponent and mantissa") {
    SKIP_WITHOUT_DISPLAY();
    struct Case {
        const char* format;
        long exp, man;
    };
    for (const Case& c : {Case{"bf16", 8, 7}, Case{"fp16", 5, 10}, Case{"fp8-e5m2", 5, 2}, Case{"fp8-e4m3", 4, 3}}) {
        INFO(c.format);
        const Shot s = headless(kModel + " --step 3 --kv-format " + c.format, std::string("bits_") + c.format);
        CHECK(s.layout["state"]["kv_format"] == c.format);
        const FieldCells fp32 = field_cells(s, "bits.fp32.d0"), code = field_cells(s, "bits.code.d0");
        CHECK((fp32.sign == 1 && fp32.exp == 8 && fp32.man == 23));
        CHECK(code.sign == 1);
        CHECK(code.exp == c.exp);
        CHECK(code.man == c.man);
    }
    const Shot s = headless(kModel + " --step 3", "bits_fp32");
    CHECK(!s.layout["regions"].contains("bits.code.d0"));  // fp32 is stored as it is
    CHECK(field_cells(s, "bits.fp32.d0").man == 23);
}

TEST_CASE("bits panel, planted bug: a code drawn with fp32's field widths is caught") {
    SKIP_WITHOUT_DISPLAY();
    const Shot s = headless(kModel + " --step 3 --kv-format bf16 --plant bits-fp32-fields", "bits_planted");
    CHECK(field_cells(s, "bits.code.d0").man != 7);
}

TEST_CASE("phases timeline: the marker sits on the prefill block at step 0 and to its right on decode") {
    SKIP_WITHOUT_DISPLAY();
    for (int d : {0, 3}) {
        const Shot s = headless(kModel + " --step " + std::to_string(d), "phases" + std::to_string(d));
        const auto prefill = s.x_extent("phases.timeline", s.colour("prefill"));
        const auto marker = s.x_extent("phases.timeline", s.colour("marker"));
        INFO("step " << d << ": prefill x " << prefill.first << ".." << prefill.second << ", marker x " << marker.first
                     << ".." << marker.second);
        REQUIRE(prefill.first >= 0);
        REQUIRE(marker.first >= 0);
        if (d == 0) {
            CHECK(s.layout["state"]["phase"] == "prefill");
            CHECK(marker.first <= prefill.second);  // the marker frames the prefill block
            CHECK(marker.second >= prefill.first);
        } else {
            CHECK(s.layout["state"]["phase"] == "decode");
            CHECK(marker.first > prefill.second);
        }
    }
    SECTION("planted bug: a marker stuck on the first step is caught") {
        const Shot s = headless(kModel + " --step 3 --plant marker-stuck", "phases_planted");
        const auto prefill = s.x_extent("phases.timeline", s.colour("prefill"));
        const auto marker = s.x_extent("phases.timeline", s.colour("marker"));
        CHECK_FALSE(marker.first > prefill.second);
    }
}

// Runs of the two key-tile colours along the middle row of the phases panel's tile strip: one per tile.
int tile_runs(const Shot& s) {
    const json& r = s.region("phases.tiles");
    const int y = (int(r["y0"]) + int(r["y1"])) / 2;
    const Rgb even = s.colour("tile_even"), odd = s.colour("tile_odd");
    int runs = 0, last = -1;  // last: 0 even, 1 odd, -1 neither
    for (int x = r["x0"]; x < int(r["x1"]); x++) {
        const Rgb c = s.at(x, y);
        const int k = c.r == even.r && c.g == even.g && c.b == even.b ? 0
                      : c.r == odd.r && c.g == odd.g && c.b == odd.b  ? 1
                                                                      : -1;
        if (k >= 0 && k != last) runs++;
        if (k >= 0) last = k;
    }
    return runs;
}

TEST_CASE("phases panel, tiled attention: the key tile strip shows ceil(T / tile) tiles at every step") {
    SKIP_WITHOUT_DISPLAY();
    for (const int step : {0, 4}) {
        const Shot s = headless(kModel + " --attention tiled --tile 2 --step " + std::to_string(step),
                                "tiles" + std::to_string(step));
        const int T = s.layout["state"]["length"], tile = s.layout["state"]["attention_tile"];
        INFO("step " << step << ", T = " << T);
        CHECK(tile == 2);
        CHECK(tile_runs(s) == (T + tile - 1) / tile);
    }
    SECTION("planted bug: a prefill drawn with tiles twice as wide is caught") {
        const Shot s =
            headless(kModel + " --attention tiled --tile 2 --step 0 --plant tiles-follow-rows", "tiles_planted");
        CHECK(tile_runs(s) != (kP + 1) / 2);
    }
}

std::vector<Rgb> owner_colours(const Shot& s) {
    std::vector<Rgb> out;
    for (const json& c : s.layout["palette"]["owners"]) out.push_back({c[0], c[1], c[2]});
    return out;
}

TEST_CASE("paged panel: it shows as many owned blocks as the pool reports in use") {
    SKIP_WITHOUT_DISPLAY();
    SECTION("one sequence: ceil(T / block_size) blocks") {
        const Shot s = headless(kModel + " --variant paged --block-size 4 --step 6", "paged_one");
        const long owned = s.cells("paged.pool", owner_colours(s));
        CHECK(owned == (kP + 6 + 3) / 4);
        CHECK(owned == s.layout["state"]["pool"]["n_used"]);
    }
    SECTION("prefix sharing and a fork: shared blocks count once") {
        const Shot s =
            headless(kModel + " --variant prefix-shared --block-size 2 --fork-at 2 --step 5", "paged_shared");
        const long owned = s.cells("paged.pool", owner_colours(s));
        CHECK(owned > 0);
        CHECK(owned == s.layout["state"]["pool"]["n_used"]);
    }
    SECTION("planted bug: a panel that draws shared blocks as free is caught") {
        const Shot s = headless(kModel +
                                    " --variant prefix-shared --block-size 2 --fork-at 2 --step 5 "
                                    "--plant pool-hides-shared",
                                "paged_planted");
        CHECK(s.cells("paged.pool", owner_colours(s)) != s.layout["state"]["pool"]["n_used"]);
    }
}

TEST_CASE("serving panel: at every step the pool shows as many request-owned blocks as the scheduler has in use") {
    SKIP_WITHOUT_DISPLAY();
    const std::string serve = "--shape n_layers=2,n_heads=4,n_kv_heads=2 --serve --requests 16 --block-size 4";
    const Shot first = headless(serve + " --step 0", "serving_0");
    const json& st = first.layout["state"]["serving"];
    CHECK(st["exact"] == st["requests"]);  // every request bitwise equal to decoding it alone
    const int steps = st["steps"];
    REQUIRE(steps > 4);
    int shared_step = -1, busiest = 0;
    for (int k = 0; k < steps; k++) {
        const Shot s = headless(serve + " --step " + std::to_string(k), "serving");
        const json& sk = s.layout["state"]["serving"];
        INFO("step " << k);
        CHECK(sk["step"] == k);
        CHECK(s.cells("serving.pool", owner_colours(s)) == sk["blocks_used"]);
        CHECK(s.count("serving.timeline", {s.colour("marker")}) > 0);  // the step shown is marked
        if (sk["shared"] > 0 && shared_step < 0) shared_step = k;
        busiest = std::max(busiest, int(sk["blocks_used"]));
    }
    CHECK(busiest > 0);
    REQUIRE(shared_step >= 0);  // the workload's system prompt is a prefix hit at some step
    const Shot planted =
        headless(serve + " --step " + std::to_string(shared_step) + " --plant serving-hides-shared", "serving_planted");
    CHECK(planted.cells("serving.pool", owner_colours(planted)) != planted.layout["state"]["serving"]["blocks_used"]);
}

TEST_CASE("beam view: the beams' blocks are drawn once however many beams share them, fewer than caches of their own") {
    SKIP_WITHOUT_DISPLAY();
    const std::string beam =
        "--shape n_layers=2,n_heads=4,n_kv_heads=2 --prompt abcdefg --beam 4 --steps 10 --block-size 2";
    int saved_somewhere = 0;
    for (int k = 0; k <= 10; k += 2) {
        const Shot s = headless(beam + " --step " + std::to_string(k), "beam");
        const json& st = s.layout["state"]["serving"];
        INFO("step " << k);
        CHECK(st["exact"] == st["checked"]);  // every beam step equal to naive decode of its tokens
        CHECK(s.cells("serving.pool", owner_colours(s)) == st["blocks_used"]);
        CHECK(st["blocks_used"] <= st["unshared"]);
        saved_somewhere += st["blocks_used"] < st["unshared"];
    }
    CHECK(saved_somewhere > 0);
    check_refused("view --serve --beam 2 --headless --frames 1", "two views");
}

TEST_CASE("the viewer's decoders: every exact variant is bitwise equal to naive decode at every step") {
    SKIP_WITHOUT_DISPLAY();
    for (const std::string v : {"contiguous", "paged", "prefix-shared"}) {
        const Shot s = headless(kModel + " --variant " + v + " --step end", "exact_" + v);
        INFO(v);
        CHECK(s.layout["state"]["all_equal"] == true);
        CHECK(s.layout["state"]["cursor"] == int(s.layout["state"]["total_steps"]) - 1);
    }
    // On the GPU's kernels run by the host, every step also equals the CPU's naive decode.
    const Shot g = headless(kModel + " --variant paged --device gpu-host --step end", "exact_gpu_host");
    CHECK(g.layout["state"]["device"] == "gpu-host");
    CHECK(g.layout["state"]["all_equal"] == true);
    // The counter-case: int4 codes change the logits, and the panel must not claim equality.
    const Shot q = headless(kModel + " --variant quantized --bits 4 --step end", "exact_int4");
    CHECK(q.layout["state"]["all_equal"] == false);
}

TEST_CASE("a real window: kvlab view under xvfb-run shows the same cells as the headless run") {
    SKIP_WITHOUT_DISPLAY();
    if (std::system("command -v xvfb-run >/dev/null 2>&1") != 0) {
        std::printf("SKIPPED: xvfb-run not installed\n");
        if (Catch::getCurrentContext().getConfig()->hasTestFilters()) std::exit(77);
        return;
    }
    const Shot s = view(kModel + " --frames 3 --step 2", "window", "xvfb-run -a -s '-screen 0 1600x1000x24'");
    for (int l = 0; l < kLayers; l++) CHECK(growth(s, l, "V").filled == (kP + 2) * kKvHeads);
}

TEST_CASE("recording: --record writes a numbered frame per kept frame, and playback fills the cache over time") {
    SKIP_WITHOUT_DISPLAY();
    const fs::path dir = scratch() / "frames";
    const Run r = run_kvlab("view --headless " + kModel +
                            " --size 1280x800 --frames 9 --speed 30 --record-every 4 "
                            "--record " +
                            dir.string());
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find("wrote 3 frames") != std::string::npos);
    std::vector<std::string> frames;
    for (int i = 0; i < 3; i++) {
        const fs::path p = dir / ("frame_000" + std::to_string(i) + ".png");
        REQUIRE(fs::exists(p));
        int w = 0, h = 0, n = 0;
        unsigned char* data = stbi_load(p.string().c_str(), &w, &h, &n, 3);
        REQUIRE(data != nullptr);
        CHECK(w == 1280);
        CHECK(h == 800);
        frames.emplace_back(reinterpret_cast<char*>(data), std::size_t(w) * h * 3);
        stbi_image_free(data);
    }
    CHECK(frames[0] != frames[2]);  // one step per frame at 30 steps/s: the picture moves
}

TEST_CASE("frame rate: --fps reports one") {
    SKIP_WITHOUT_DISPLAY();
    const Run r = run_kvlab("view --headless " + kModel + " --size 1280x800 --frames 10 --fps");
    INFO(r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("frames per second") != std::string::npos);
}

TEST_CASE("kvlab view refuses bad input with one line and a non-zero exit") {
    // No display and no --headless: say what to do instead of failing inside GLFW.
    check_refused("view " + kModel, "--headless", "env -u DISPLAY");
    check_refused("view --frames 1 " + kModel, "Failed to open display", "env DISPLAY=:987");
    check_refused("view --headless --frames 1 --variant tiled", "unknown variant 'tiled'");
    check_refused("view --headless --frames 1 --device tpu", "'tpu'");
    check_refused("view --headless --frames 1 --shape n_heads=3", "n_heads");
    check_refused("view --headless --frames 1 --steps 1000", "max_seq");
    check_refused("view --headless " + kModel, "--frames");
    check_refused("view --headless --frames 1 --size 10x10", "--size");
    check_refused("view --headless --frames 1 --size wide", "--size");
    check_refused("view --headless --frames 1 " + kModel + " --step 99", "--step 99");
    check_refused("view --headless --frames 1 " + kModel + " --step -3", "--step must be");
    check_refused("view --headless --frames 1 " + kModel + " --step soon", "--step: 'soon' is not an integer");
    check_refused("view --headless --frames 1 --bits 5", "--bits");
    check_refused("view --headless --frames 1 --block-size 0", "--block-size");
    check_refused("view --headless --frames 1 --variant paged --n-blocks 1 " + kModel, "n_blocks");
}
