#define GL_GLEXT_PROTOTYPES
#include "capture.h"

#include <GL/gl.h>
#include <GL/glext.h>
#include <fmt/format.h>
#include <stb_image_write.h>

#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "config.h"
#include "file_writer.h"
#include "json_text.h"

namespace kvlab::viz {

Offscreen::Offscreen(int width, int height) {
    glGenFramebuffers(1, &fbo_);
    glBindFramebuffer(GL_FRAMEBUFFER, fbo_);
    glGenRenderbuffers(1, &color_);
    glBindRenderbuffer(GL_RENDERBUFFER, color_);
    glRenderbufferStorage(GL_RENDERBUFFER, GL_RGBA8, width, height);
    glFramebufferRenderbuffer(GL_FRAMEBUFFER, GL_COLOR_ATTACHMENT0, GL_RENDERBUFFER, color_);
    if (glCheckFramebufferStatus(GL_FRAMEBUFFER) != GL_FRAMEBUFFER_COMPLETE)
        throw Error(fmt::format("cannot render offscreen: a {}x{} framebuffer is incomplete", width, height));
}

Offscreen::~Offscreen() {
    glBindFramebuffer(GL_FRAMEBUFFER, 0);
    glDeleteRenderbuffers(1, &color_);
    glDeleteFramebuffers(1, &fbo_);
}

std::vector<std::uint8_t> read_pixels(int width, int height) {
    std::vector<std::uint8_t> bottom_up(std::size_t(width) * height * 3);  // [height, width, 3], bottom row first
    glPixelStorei(GL_PACK_ALIGNMENT, 1);
    glReadPixels(0, 0, width, height, GL_RGB, GL_UNSIGNED_BYTE, bottom_up.data());
    std::vector<std::uint8_t> rgb(bottom_up.size());  // [height, width, 3], top row first
    const std::size_t row = std::size_t(width) * 3;
    for (int y = 0; y < height; y++)
        std::copy_n(bottom_up.data() + std::size_t(height - 1 - y) * row, row, rgb.data() + std::size_t(y) * row);
    return rgb;
}

void write_png(const std::string& path, const std::vector<std::uint8_t>& rgb, int width, int height) {
    assert(rgb.size() == std::size_t(width) * height * 3);
    std::string png;
    auto append = [](void* context, void* data, int n) {
        static_cast<std::string*>(context)->append(static_cast<char*>(data), std::size_t(n));
    };
    if (!stbi_write_png_to_func(append, &png, width, height, 3, rgb.data(), width * 3))
        throw Error(fmt::format("'{}': the PNG could not be encoded", one_line(path)));
    write_file(path, fmt::format("picture '{}'", one_line(path)), png);
}

namespace {

nlohmann::json color(ImU32 c) {
    return {int(c >> IM_COL32_R_SHIFT & 255), int(c >> IM_COL32_G_SHIFT & 255), int(c >> IM_COL32_B_SHIFT & 255)};
}

}  // namespace

void write_layout(const std::string& path, const std::string& screenshot, int width, int height, const Report& report,
                  const Frame& f) {
    using nlohmann::json;
    json j;
    j["screenshot"] = screenshot;
    j["width"] = width, j["height"] = height;
    for (const Region& r : report.regions)
        j["regions"][r.name] = {{"x0", int(r.min.x)}, {"y0", int(r.min.y)}, {"x1", int(r.max.x)},
                                {"y1", int(r.max.y)}, {"cell_w", r.cell_w}, {"cell_h", r.cell_h}};
    json& p = j["palette"];
    p["empty"] = color(palette::empty), p["prefill"] = color(palette::prefill), p["decode"] = color(palette::decode);
    p["newest"] = color(palette::newest), p["evicted"] = color(palette::evicted), p["read"] = color(palette::read);
    p["marker"] = color(palette::marker), p["block_free"] = color(palette::block_free);
    p["block_cached"] = color(palette::block_cached);
    p["tile_even"] = color(palette::tile_even), p["tile_odd"] = color(palette::tile_odd);
    p["bit_sign_on"] = color(palette::bit_sign_on), p["bit_sign_off"] = color(palette::bit_sign_off);
    p["bit_exp_on"] = color(palette::bit_exp_on), p["bit_exp_off"] = color(palette::bit_exp_off);
    p["bit_man_on"] = color(palette::bit_man_on), p["bit_man_off"] = color(palette::bit_man_off);
    for (int s = 0; s < 8; s++) p["owners"].push_back(color(palette::owner(s)));

    // What the session's state says, for the tests to compare with the pixels.
    const SessionInfo& info = *f.info;
    const Config& c = info.config;
    json& st = j["state"];
    st["variant"] = std::string(to_string(info.settings.variant));
    st["kv_format"] = kv_format_name(info.kv_format);
    st["device"] = info.device;
    st["attention_tile"] = info.settings.attention.tiled() ? info.settings.attention.tile : 0;  // 0: simple
    st["threads"] = info.settings.n_threads;
    st["n_layers"] = c.n_layers, st["n_heads"] = c.n_heads, st["n_kv_heads"] = c.n_kv_heads;
    st["max_seq"] = c.max_seq;
    st["prompt_len"] = int(info.prompt.size());
    st["total_steps"] = info.total_steps;
    st["cursor"] = f.cursor;
    if (!f.empty()) {
        const Step& s = f.step();
        st["phase"] = s.phase == Step::Phase::prefill ? "prefill" : "decode";
        st["length"] = s.length;
        st["n_new"] = s.n_new;
        int decoded = 0;
        for (int i = 0; i <= f.cursor; i++) decoded += f.steps[std::size_t(i)]->phase == Step::Phase::decode;
        st["decode_steps"] = decoded;
        bool all_equal = true;
        for (int i = 0; i <= f.cursor; i++)
            for (const Exactness& e : f.steps[std::size_t(i)]->exact) all_equal = all_equal && e.equal();
        st["all_equal"] = all_equal;
        // A's tokens and its cached decode's largest logits at the step shown: what threads must not change.
        for (const SeqView& q : s.seqs)
            if (q.id == 0) st["tokens"] = q.tokens;
        for (const Exactness& e : s.exact)
            if (e.seq == 0)
                for (const TopToken& t : e.top_cached) st["top_cached"].push_back({t.id, t.logit});
        if (f.serving) {
            const ServeSnapshot& sv = f.serving->steps.at(std::size_t(f.cursor));
            int shared = 0;
            for (char c : sv.shared) shared += c;
            st["serving"] = {{"step", sv.step},
                             {"steps", f.serving->steps.size()},
                             {"n_blocks", f.serving->n_blocks},
                             {"blocks_used", sv.blocks_used},
                             {"shared", shared},
                             {"preempted", sv.preempted},
                             {"exact", f.serving->exact},
                             {"requests", f.serving->n_requests}};
            if (f.serving->beams)
                st["serving"]["unshared"] = f.serving->unshared.at(std::size_t(f.cursor)),
                st["serving"]["checked"] = f.serving->checked;
        }
        if (s.pool)
            st["pool"] = {{"n_blocks", s.pool->n_blocks},
                          {"n_used", s.pool->n_used},
                          {"n_free", s.pool->n_free},
                          {"n_cached", s.pool->n_cached}};
    }
    write_file(path, fmt::format("--layout '{}'", one_line(path)), json_document(j) + "\n");
}

std::string make_gif(const std::string& dir, int delay_centiseconds) {
    namespace fs = std::filesystem;
    const std::string gif = (fs::path(dir) / "animation.gif").string();
    // ImageMagick's convert, checked to be the real one (it prints its name with -version).
    if (std::system("convert -version 2>/dev/null | grep -q ImageMagick") == 0) {
        const std::string cmd = fmt::format("convert -delay {} -loop 0 '{}'/frame_*.png -layers Optimize '{}'",
                                            delay_centiseconds, dir, gif);
        if (std::system(cmd.c_str()) == 0) return "wrote " + gif;
        return "ImageMagick failed to make " + gif;
    }
    if (std::system("ffmpeg -version >/dev/null 2>&1") == 0) {
        const std::string cmd = fmt::format(
            "ffmpeg -loglevel error -y -framerate {} -i '{}'/frame_%04d.png -vf "
            "'split[a][b];[a]palettegen[p];[b][p]paletteuse' '{}'",
            100.0 / delay_centiseconds, dir, gif);
        if (std::system(cmd.c_str()) == 0) return "wrote " + gif;
        return "ffmpeg failed to make " + gif;
    }
    return "no GIF: install imagemagick (or ffmpeg) to turn the frames into one";
}

}  // namespace kvlab::viz
