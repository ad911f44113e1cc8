// kvlab view: the Dear ImGui viewer as a command. The CLI reaches the viewer only through its
// entry point (viz/view.h: ViewOptions, run_view); a build without the viewer (KVLAB_VIEWER
// off) still has the command, which says in one line that the viewer is missing.
#pragma once

#include <memory>

namespace CLI {
class App;
}

namespace kvlab::cli {

class ViewCommand {
public:
    // Adds `view` and its options (model, session, playback, capture) to `app`.
    explicit ViewCommand(CLI::App& app);
    ~ViewCommand();
    // The subcommand: true after parsing when it was chosen.
    CLI::App& command() const { return *cmd_; }
    // Runs the viewer with the parsed options; the exit code. Bad options are Errors.
    int run();

private:
    struct Options;  // the viewer's options when it is built in; nothing otherwise
    std::unique_ptr<Options> o_;
    CLI::App* cmd_;
};

}  // namespace kvlab::cli
