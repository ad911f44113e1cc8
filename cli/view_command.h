// kvlab view: the Dear ImGui viewer (viz/), as a command.
#pragma once

#include <string>

#include "view.h"

namespace CLI {
class App;
}

namespace kvlab::cli {

struct ViewCommandOptions {
    viz::ViewOptions view;
    std::string variant = "contiguous";
    std::string shape;  // random model's shape: "n_layers=2,n_heads=4,n_kv_heads=2" over stories260K's
    std::string size = "1600x1000";
    std::string step;  // a step number, or "end"
};

int run_view(ViewCommandOptions& o);

// Adds the model, session, playback and capture options to `cmd`.
void add_view_options(CLI::App* cmd, ViewCommandOptions& o);

}  // namespace kvlab::cli
