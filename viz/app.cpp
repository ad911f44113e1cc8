#include "app.h"

#include <fmt/format.h>
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <iterator>

#include "models_dir.h"

namespace kvlab::viz {

namespace {

// The cursor after dt seconds at `speed` steps per second, inside [0, last] whatever the speed:
// a NaN (which every comparison lets through, std::clamp's too, and int(NaN) is undefined) keeps
// the cursor where it was, an infinity takes it to an end.
float advanced(float cursor, float speed, float dt, int last) {
    const float hi = float(std::max(0, last));
    if (std::isnan(cursor)) cursor = 0;
    const float next = cursor + speed * dt;
    return std::clamp(std::isnan(next) ? cursor : next, 0.0f, hi);
}

// The variant combo's help: each variant's registry summary and what the viewer runs with it.
const std::string& variants_help() {
    static const std::string help = [] {
        std::string s;
        for (Variant v : kVariants) {
            const VariantInfo& info = variant_info(v);
            s += fmt::format("{}{} ({}): {}. Here: {}.", s.empty() ? "" : "\n", info.name,
                             info.exact ? "exact" : "approximate", info.summary, info.viewer);
        }
        return s;
    }();
    return help;
}

}  // namespace

App::App(const Settings& settings) : session_(std::make_unique<Session>(settings)), edited_(settings) {
    if (!edited_.shape.dim) edited_.shape = session_->info().config;
    edited_.prompt.copy(prompt_.data(), prompt_.size() - 1);
}

int App::total_steps() const {
    const ServeRun* serving = session_->serving();
    return serving ? int(serving->steps.size()) : session_->info().total_steps;
}

int App::published() const {
    const ServeRun* serving = session_->serving();
    return serving ? int(serving->steps.size()) : session_->n_steps();
}

void App::seek(int step) {
    playing_ = false;
    const int last = std::max(0, published() - 1);
    cursor_ = float(std::clamp(step, 0, last));
}

int App::upcoming(float dt) const {
    // The serving view's steps are all there: a scripted run waits for the session's first only.
    if (session_->serving()) return 0;
    return int(advanced(cursor_, playing_ ? speed_ : 0.0f, dt, session_->info().total_steps - 1));
}

bool App::restart(const Settings& settings) {
    try {
        auto fresh = std::make_unique<Session>(settings);
        session_ = std::move(fresh);
        error_.clear();
        cursor_ = 0;
        playing_ = true;
        return true;
    } catch (const std::exception& e) {
        error_ = e.what();
        return false;
    }
}

void App::frame(float dt, int width, int height, Report* report) {
    // Restart between frames: the panels of the frame that asked still read the old session.
    if (restart_requested_) {
        restart_requested_ = false;
        restart(edited_);
    }
    frame_.info = &session_->info();
    frame_.steps = session_->steps();
    frame_.serving = session_->serving();
    const int n = published();
    // Playback never runs ahead of the decoder; at the end it stops on the last step.
    cursor_ = advanced(cursor_, playing_ ? speed_ : 0.0f, dt, n - 1);
    if (playing_ && (session_->done() || frame_.serving) && int(cursor_) >= n - 1) cursor_ = float(std::max(0, n - 1));
    frame_.cursor = int(cursor_);
    frame_.progress = cursor_ - std::floor(cursor_);
    if (!playing_ || frame_.cursor == n - 1) frame_.progress = 1.0f;  // a still picture shows every read
    frame_.report = report;
    frame_.layer = std::clamp(layer_, 0, frame_.info->config.n_layers - 1);

    // Fixed places: controls and exactness on the left, the timeline across the top, then the
    // cache's growth beside its paged memory, and layouts, attention and cost along the bottom.
    if (frame_.serving) return layout_serving(float(width), float(height));
    const float W = float(width), H = float(height), left = std::floor(W * 0.21f);
    const float right_w = W - left, top_h = std::floor(H * 0.17f), mid_h = std::floor(H * 0.44f);
    auto place = [](float x, float y, float w, float h) {
        ImGui::SetNextWindowPos(ImVec2(x, y), ImGuiCond_Always);
        ImGui::SetNextWindowSize(ImVec2(w, h), ImGuiCond_Always);
    };
    place(0, 0, left, std::floor(H * 0.40f));
    draw_controls();
    place(0, std::floor(H * 0.40f), left, std::floor(H * 0.30f));
    draw_exactness(frame_);
    place(0, std::floor(H * 0.70f), left, H - std::floor(H * 0.70f));
    draw_bits(frame_);
    place(left, 0, right_w, top_h);
    draw_phases(frame_);
    place(left, top_h, std::floor(right_w * 0.5f), mid_h);
    draw_growth(frame_);
    place(left + std::floor(right_w * 0.5f), top_h, right_w - std::floor(right_w * 0.5f), mid_h);
    draw_paged(frame_);
    const float bottom_y = top_h + mid_h, bottom_h = H - bottom_y;
    const float w1 = std::floor(right_w * 0.38f), w2 = std::floor(right_w * 0.28f);
    place(left, bottom_y, w1, bottom_h);
    draw_layouts(frame_);
    place(left + w1, bottom_y, w2, bottom_h);
    draw_attention(frame_);
    place(left + w1 + w2, bottom_y, right_w - w1 - w2, bottom_h);
    draw_cost(frame_);
}

// The serving view: the controls on the left, the serving panel over the rest.
void App::layout_serving(float W, float H) {
    const float left = std::floor(W * 0.21f);
    ImGui::SetNextWindowPos(ImVec2(0, 0), ImGuiCond_Always);
    ImGui::SetNextWindowSize(ImVec2(left, H), ImGuiCond_Always);
    draw_controls();
    ImGui::SetNextWindowPos(ImVec2(left, 0), ImGuiCond_Always);
    ImGui::SetNextWindowSize(ImVec2(W - left, H), ImGuiCond_Always);
    draw_serving(frame_);
}

void App::draw_controls() {
    ImGui::Begin("kvlab", nullptr, ImGuiWindowFlags_NoCollapse);
    const SessionInfo& info = session_->info();
    const int n = published();

    // Playback.
    if (ImGui::Button(playing_ ? "Pause" : "Play")) playing_ = !playing_;
    ImGui::SameLine();
    if (ImGui::ArrowButton("##back", ImGuiDir_Left)) seek(int(cursor_) - 1);
    ImGui::SameLine();
    if (ImGui::ArrowButton("##forward", ImGuiDir_Right)) seek(int(cursor_) + 1);
    ImGui::SameLine();
    if (ImGui::Button("Reset")) {
        cursor_ = 0;
        playing_ = true;
    }
    ImGui::SameLine();
    help_marker(
        "Play runs through the steps the decoders have published; the arrows step back and forward "
        "one step. Every step is kept, so going back shows exactly what the cache held then.");
    ImGui::SetNextItemWidth(-80);
    ImGui::SliderFloat("speed", &speed_, 0.5f, 60.0f, "%.1f steps/s", ImGuiSliderFlags_Logarithmic);
    int shown = int(cursor_);
    ImGui::SetNextItemWidth(-80);
    if (ImGui::SliderInt("step", &shown, 0, std::max(0, n - 1))) seek(shown);
    ImGui::Text("computed %d of %d steps%s", n, total_steps(),
                session_->done() || frame_.serving ? "" : " (decoding...)");
    if (const std::string f = session_->failure(); !f.empty())
        ImGui::TextColored(ImVec4(1, .4f, .4f, 1), "%s", f.c_str());
    ImGui::SetNextItemWidth(-80);
    ImGui::SliderInt("layer", &layer_, 0, info.config.n_layers - 1);
    ImGui::SameLine();
    help_marker("The layer the Layouts and Attention panels show.");

    // The session: model, variant, prompt. Changes apply on Restart.
    ImGui::Separator();
    ImGui::TextDisabled("session (changes apply on restart)");
    ImGui::TextWrapped("model: %s", info.model_source.c_str());
    ImGui::TextWrapped("cache: %s", info.cache_name.c_str());
    ImGui::Text("%s", info.config.describe().c_str());

    // Where the decoders run: gpu appears only where this build and machine have one.
    static const std::vector<std::string> devices = viewer_devices();
    int device = 0;
    for (std::size_t i = 0; i < devices.size(); i++)
        if (devices[i] == edited_.device) device = int(i);
    std::vector<const char*> device_names;
    for (const std::string& d : devices) device_names.push_back(d.c_str());
    ImGui::SetNextItemWidth(-80);
    ImGui::Combo("device", &device, device_names.data(), int(device_names.size()));
    edited_.device = devices[std::size_t(device)];
    ImGui::SameLine();
    help_marker(
        "Where the decoders run. gpu: the CUDA kernels on this machine's GPU. gpu-host: the very same "
        "per-thread kernel source run on the CPU, thread by thread (how the GPU's arithmetic is checked "
        "without one). Off the CPU, the Exactness panel also compares every step with the CPU's naive "
        "decode.");

    // The combo lists kVariants by their names; `variant` is an index into it.
    std::vector<const char*> names(kVariants.size());
    int variant = 0;
    for (std::size_t i = 0; i < std::size(kVariants); i++) {
        names[i] = to_string(kVariants[i]).data();  // the names are string literals: NUL-terminated
        if (kVariants[i] == edited_.variant) variant = int(i);
    }
    ImGui::SetNextItemWidth(-80);
    ImGui::Combo("variant", &variant, names.data(), int(names.size()));
    edited_.variant = kVariants[std::size_t(variant)];
    ImGui::SameLine();
    help_marker(variants_help().c_str());
    switch (edited_.variant) {
        case Variant::paged:
        case Variant::prefix_shared:
            ImGui::SetNextItemWidth(-80);
            ImGui::SliderInt("block_size", &edited_.block_size, 1, 32);
            ImGui::SetNextItemWidth(-80);
            ImGui::InputInt("n_blocks", &edited_.n_blocks);
            ImGui::SameLine();
            help_marker(
                "Blocks in the pool; 0 sizes it for every sequence. A small pool shows evictions of "
                "cached prefix blocks, and a step that does not fit stops the session.");
            edited_.n_blocks = std::max(0, edited_.n_blocks);
            if (edited_.variant == Variant::prefix_shared) {
                ImGui::SetNextItemWidth(-80);
                ImGui::SliderInt("fork at", &edited_.fork_at, 0, edited_.steps);
                ImGui::SetNextItemWidth(-80);
                ImGui::SliderInt("free C at", &edited_.free_fork_at, 0, edited_.steps);
            }
            break;
        case Variant::quantized: {
            ImGui::RadioButton("int8", &edited_.quant_bits, 8);
            ImGui::SameLine();
            ImGui::RadioButton("int4", &edited_.quant_bits, 4);
            break;
        }
        case Variant::window:
            ImGui::SetNextItemWidth(-80);
            ImGui::SliderInt("sinks", &edited_.sinks, 0, 8);
            ImGui::SetNextItemWidth(-80);
            ImGui::SliderInt("window", &edited_.window, 1, 64);
            break;
        case Variant::fifo:
            ImGui::SetNextItemWidth(-80);
            ImGui::SliderInt("window", &edited_.window, 1, 64);
            break;
        case Variant::h2o:
            ImGui::SetNextItemWidth(-80);
            ImGui::SliderInt("recent", &edited_.recent, 1, 64);
            ImGui::SetNextItemWidth(-80);
            ImGui::SliderInt("heavy", &edited_.heavy, 0, 64);
            break;
        default: break;
    }

    const bool have_checkpoint = !edited_.model_path.empty() || !models_dir().empty();
    if (have_checkpoint) {
        int random = edited_.random_model ? 1 : 0;
        ImGui::RadioButton("stories260K", &random, 0);
        ImGui::SameLine();
        ImGui::RadioButton("random model", &random, 1);
        edited_.random_model = random == 1;
    }
    if (edited_.random_model || !have_checkpoint) {
        // dim stays 64: heads must divide it, KV heads must divide heads.
        ImGui::SetNextItemWidth(-80);
        ImGui::SliderInt("n_layers", &edited_.shape.n_layers, 1, 8);
        int heads_log = int(std::log2(float(std::max(1, edited_.shape.n_heads))));
        int kv_log = int(std::log2(float(std::max(1, edited_.shape.n_kv_heads))));
        ImGui::SetNextItemWidth(-80);
        ImGui::SliderInt("n_heads", &heads_log, 0, 4, std::to_string(1 << heads_log).c_str());
        kv_log = std::min(kv_log, heads_log);
        ImGui::SetNextItemWidth(-80);
        ImGui::SliderInt("n_kv_heads", &kv_log, 0, heads_log, std::to_string(1 << kv_log).c_str());
        edited_.shape.n_heads = 1 << heads_log;
        edited_.shape.n_kv_heads = 1 << kv_log;
        ImGui::SameLine();
        help_marker(
            "Grouped-query attention: n_heads query heads share n_kv_heads KV heads, so the cache "
            "holds n_kv_heads rows per position and layer, not n_heads.");
    }
    ImGui::SetNextItemWidth(-80);
    if (ImGui::InputText("prompt", prompt_.data(), prompt_.size())) edited_.prompt = prompt_.data();
    ImGui::SetNextItemWidth(-80);
    ImGui::SliderInt("steps", &edited_.steps, 1, 480);
    if (ImGui::Button("Restart with these settings")) restart_requested_ = true;
    if (!error_.empty()) ImGui::TextColored(ImVec4(1, .4f, .4f, 1), "%s", error_.c_str());
    if (frame_.report)
        frame_.report->add("controls", ImGui::GetWindowPos(),
                           ImVec2(ImGui::GetWindowPos().x + ImGui::GetWindowWidth(),
                                  ImGui::GetWindowPos().y + ImGui::GetWindowHeight()));
    ImGui::End();
}

}  // namespace kvlab::viz
