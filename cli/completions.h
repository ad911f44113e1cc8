// kvlab completions and kvlab man: bash and zsh completion scripts and roff man pages, written
// from the CLI::App tree itself (every command, option, value type and help text), so that they
// cannot fall behind the program. The build runs both into share/ (cli/CMakeLists.txt), and
// tests/completions_test.sh checks the files against `kvlab --help` and against a fresh run.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace CLI {
class App;
}

namespace kvlab::cli {

struct CompletionsOptions {
    std::string shell;  // bash or zsh
};

struct ManOptions {
    std::string out;  // the folder the pages go to (made if missing)
};

// `kvlab completions --shell bash|zsh` and `kvlab man --out DIR`, added to `app`.
CLI::App* add_completions(CLI::App& app, CompletionsOptions& o);
CLI::App* add_man(CLI::App& app, ManOptions& o);

// The scripts and pages for the whole of `app` (the top-level kvlab app, every command added).
// Commands and options come in the order the app defines them; nothing depends on time or place.
std::string bash_completion(const CLI::App& app);
std::string zsh_completion(const CLI::App& app);
// kvlab.1 and one kvlab-<command>.1 per command: {file name, roff text}, kvlab.1 first.
std::vector<std::pair<std::string, std::string>> man_pages(const CLI::App& app);

// The commands: print the script for o.shell; write every page into o.out. Errors are kvlab::Error.
int run_completions(const CLI::App& app, const CompletionsOptions& o);
int run_man(const CLI::App& app, const ManOptions& o);

}  // namespace kvlab::cli
