// kvlab completions and kvlab man: the CLI::App tree read once into CommandInfo, then written as
// a bash script, a zsh script and roff pages (completions.h).
#include "completions.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "build_info.h"
#include "config.h"
#include "file_writer.h"

namespace kvlab::cli {

namespace {

// An option or positional as the generators see it: what they need of CLI11's Option, read once.
struct OptionInfo {
    std::vector<std::string> names;    // "-h", "--help": short names, then long ones; none for a positional
    std::string positional;            // a positional's name ("out"), "" for an option
    std::string type;                  // CLI11's value type (TEXT, INT, UINT, FLOAT, ...), "" for a flag
    std::string checks;                // what its checks say ("INT in [1 - 1048576]"), or ""
    std::vector<std::string> choices;  // the values a CLI::IsMember check allows, or none
    std::string description;
    bool required = false;
    bool repeated = false;  // takes several values (several words, or the option given again)
    bool ends = false;      // --help (or a version flag): it ends the command line's meaning
};

// A command, or the top level (named kvlab).
struct CommandInfo {
    std::string name, description;
    std::vector<OptionInfo> options;  // as the app defines them (--help first), positionals included
};

// The pieces of `text` between the separators (one empty piece for empty text): CLI11 hands over
// an option's checks and choices as one string.
std::vector<std::string> split(const std::string& text, char sep) {
    std::vector<std::string> pieces(1);
    for (char c : text) {
        if (c == sep)
            pieces.emplace_back();
        else
            pieces.back().push_back(c);
    }
    return pieces;
}

// The words joined by `sep`: word lists, `case` patterns and exclusion lists are all joins.
std::string join(const std::vector<std::string>& words, const std::string& sep) {
    std::string out;
    for (const std::string& w : words) out += (out.empty() ? "" : sep) + w;
    return out;
}

// A CLI::IsMember check's values: CLI11 describes the check as "{a,b}", one piece of the type name.
std::vector<std::string> choices_of(const std::string& checks) {
    for (const std::string& piece : split(checks, ':'))
        if (piece.size() > 2 && piece.front() == '{' && piece.back() == '}')
            return split(piece.substr(1, piece.size() - 2), ',');
    return {};
}

// What the generators need of one CLI11 option of `cmd`, read in one place so that the three
// outputs cannot disagree on it.
OptionInfo describe_option(const CLI::Option& opt, const CLI::App& cmd) {
    OptionInfo o;
    for (const std::string& s : opt.get_snames()) o.names.push_back("-" + s);
    for (const std::string& l : opt.get_lnames()) o.names.push_back("--" + l);
    if (!opt.nonpositional()) o.positional = opt.get_name();
    if (opt.get_type_size_max() > 0 && opt.get_expected_max() > 0) {  // a flag takes no value
        const std::string full = opt.get_type_name();                 // "INT:INT in [1 - 1048576]"
        const std::size_t colon = full.find(':');
        o.type = full.substr(0, colon);
        if (o.type.empty()) o.type = "VALUE";
        if (colon != std::string::npos) o.checks = full.substr(colon + 1);
        o.choices = choices_of(o.checks);
        o.repeated = opt.get_items_expected_max() > 1;
    }
    o.description = opt.get_description();
    o.required = opt.get_required();
    o.ends = &opt == cmd.get_help_ptr() || &opt == cmd.get_help_all_ptr() || &opt == cmd.get_version_ptr();
    return o;
}

// A command (or the top level) with every option --help shows, in the app's order (an option in
// the group "" is hidden from --help, and so from these too).
CommandInfo describe_command(const CLI::App& cmd, const std::string& name) {
    CommandInfo c{name, cmd.get_description(), {}};
    for (const CLI::Option* opt : cmd.get_options())
        if (!opt->get_group().empty()) c.options.push_back(describe_option(*opt, cmd));
    return c;
}

// The commands of the top-level app that --help shows, in the order it defines them (option
// groups, unnamed sub-apps, are no commands; a command in the group "" is hidden).
std::vector<CommandInfo> describe_commands(const CLI::App& app) {
    std::vector<CommandInfo> out;
    for (const CLI::App* sub : app.get_subcommands({}))
        if (!sub->get_name().empty() && !sub->get_group().empty())
            out.push_back(describe_command(*sub, sub->get_name()));
    return out;
}

// CLI11's names of number types: a value of one has nothing to complete.
bool numeric(const std::string& type) {
    return type == "INT" || type == "UINT" || type == "FLOAT" || type == "NUMBER" || type == "BOOLEAN";
}

// Single-quoted for the shell: it's -> 'it'\''s'.
std::string shell_quote(const std::string& text) {
    std::string out = "'";
    for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

// Every option name of a command: bash offers all of them after the command.
std::vector<std::string> option_names(const CommandInfo& c) {
    std::vector<std::string> names;
    for (const OptionInfo& o : c.options) names.insert(names.end(), o.names.begin(), o.names.end());
    return names;
}

// Names of options of `c` that take a value, for a `case` pattern: those `keep` selects.
template <typename Keep>
std::string value_options(const CommandInfo& c, Keep keep) {
    std::vector<std::string> names;
    for (const OptionInfo& o : c.options)
        if (!o.type.empty() && o.positional.empty() && keep(o))
            names.insert(names.end(), o.names.begin(), o.names.end());
    return join(names, "|");
}

constexpr const char* kBashHead =
    "# bash completion for kvlab. Generated by `kvlab completions --shell bash` from the program's own\n"
    "# definition of its commands and options: regenerate it rather than edit it.\n"
    "\n"
    "# COMPREPLY: the words of $1 that start with $2, the word being typed.\n"
    "_kvlab_words() {\n"
    "    mapfile -t COMPREPLY < <(compgen -W \"$1\" -- \"$2\")\n"
    "}\n"
    "\n"
    "# COMPREPLY: the file names that start with $1, the word being typed.\n"
    "_kvlab_files() {\n"
    "    compopt -o filenames 2>/dev/null || true\n"
    "    mapfile -t COMPREPLY < <(compgen -f -- \"$1\")\n"
    "}\n"
    "\n"
    "_kvlab() {\n"
    "    local cur=${COMP_WORDS[COMP_CWORD]} prev=\"\" cmd=\"\" i\n"
    "    COMPREPLY=()\n"
    "    if ((COMP_CWORD > 0)); then prev=${COMP_WORDS[COMP_CWORD - 1]}; fi\n"
    "    # --option=value: bash makes the \"=\" a word of its own.\n"
    "    if [[ $cur == = ]]; then cur=\"\"; fi\n"
    "    if [[ $prev == = ]] && ((COMP_CWORD > 1)); then prev=${COMP_WORDS[COMP_CWORD - 2]}; fi\n"
    "    # The command: the first word after kvlab that is neither an option nor an option's value.\n"
    "    for ((i = 1; i < COMP_CWORD; i++)); do\n"
    "        case ${COMP_WORDS[i]} in\n";

// The bash `case` branch of one command ("" for the top level): the value of the option just
// typed (file names, choices, or nothing for a number), else options, then commands or file names.
std::string bash_branch(const CommandInfo& c, const std::string& label, const std::string& others) {
    std::string values;
    const std::string files =
        value_options(c, [](const OptionInfo& o) { return o.choices.empty() && !numeric(o.type); });
    const std::string numbers =
        value_options(c, [](const OptionInfo& o) { return o.choices.empty() && numeric(o.type); });
    if (!files.empty()) values += fmt::format("        {}) _kvlab_files \"$cur\"; return ;;\n", files);
    if (!numbers.empty()) values += fmt::format("        {}) return ;;\n", numbers);
    for (const OptionInfo& o : c.options)
        if (!o.choices.empty() && o.positional.empty())
            values += fmt::format("        {}) _kvlab_words {} \"$cur\"; return ;;\n", join(o.names, "|"),
                                  shell_quote(join(o.choices, " ")));
    std::string out = fmt::format("    {})\n", label);
    if (!values.empty()) out += "        case $prev in\n" + values + "        esac\n";
    const std::string options = shell_quote(join(option_names(c), " "));
    if (others.empty())
        out += fmt::format("        _kvlab_words {} \"$cur\" ;;\n", options);
    else
        out += fmt::format("        if [[ $cur == -* ]]; then _kvlab_words {} \"$cur\"; else {}; fi ;;\n", options,
                           others);
    return out;
}

// Whether the command takes positionals: bash then completes file names, options after a "-".
bool has_positionals(const CommandInfo& c) {
    for (const OptionInfo& o : c.options)
        if (!o.positional.empty()) return true;
    return false;
}

// The zsh function of one command ("_kvlab_cmd_diff_trace" for diff-trace): a name safe in any zsh.
std::string zsh_function(const std::string& command) {
    std::string name = "_kvlab_cmd_" + command;
    for (char& ch : name)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return name;
}

// Help text inside a zsh single-quoted _arguments or _describe item: the quote closed and
// reopened, and \ [ ] : $ ` escaped with a backslash (the _arguments syntax, and no expansion).
std::string zsh_escape(const std::string& text) {
    std::string out;
    for (char c : text) {
        if (c == '\'')
            out += "'\\''";
        else if (c == '\n')
            out += ' ';
        else if (std::string_view("\\[]:$`").find(c) != std::string_view::npos)
            out += {'\\', c};
        else
            out += c;
    }
    return out;
}

// What zsh offers for a value: the choices, nothing (a space: the type shown alone), or files.
std::string zsh_action(const OptionInfo& o) {
    if (!o.choices.empty()) {
        std::vector<std::string> words;
        for (const std::string& w : o.choices) words.push_back(zsh_escape(w));
        return "(" + join(words, " ") + ")";
    }
    return numeric(o.type) ? " " : "_files";
}

// One _arguments spec: '(-h --help)'{-h,--help}'[help]', '--model=[help]:TEXT:_files', '1:out:_files'.
std::string zsh_spec(const OptionInfo& o, int& position) {
    if (!o.positional.empty()) {
        const std::string where = o.repeated ? "*" : std::to_string(++position);
        return fmt::format("'{}{}{}:{}'", where, o.required ? ":" : "::", zsh_escape(o.positional), zsh_action(o));
    }
    std::string exclude = o.ends ? "(- *)" : o.names.size() > 1 ? "(" + join(o.names, " ") + ")" : "";
    if (o.repeated) exclude += "*";
    std::string spec = "[" + zsh_escape(o.description) + "]";
    if (!o.type.empty()) spec = "=" + spec + ":" + zsh_escape(o.type) + ":" + zsh_action(o);
    if (o.names.size() == 1) return "'" + exclude + o.names[0] + spec + "'";
    return "'" + exclude + "'{" + join(o.names, ",") + "}'" + spec + "'";
}

// The specs of a command's options, one a line, for an _arguments call (so a diff shows one option).
std::string zsh_specs(const CommandInfo& c) {
    std::string out;
    int position = 0;
    for (const OptionInfo& o : c.options) out += " \\\n        " + zsh_spec(o, position);
    return out;
}

constexpr const char* kZshHead =
    "#compdef kvlab\n"
    "# zsh completion for kvlab. Generated by `kvlab completions --shell zsh` from the program's own\n"
    "# definition of its commands and options: regenerate it rather than edit it.\n";

// The top-level function: the command, then the command's own function for the words after it.
std::string zsh_main(const CommandInfo& top, const std::vector<CommandInfo>& commands) {
    std::string out = "\n_kvlab() {\n    local curcontext=$curcontext state line\n    typeset -A opt_args\n";
    out += "    _arguments -C" + zsh_specs(top) + " \\\n        '1: :->command' \\\n        '*:: :->argument'\n";
    out += "    case $state in\n    command)\n        local -a commands\n        commands=(\n";
    for (const CommandInfo& c : commands)
        out += fmt::format("            '{}:{}'\n", zsh_escape(c.name), zsh_escape(c.description));
    out += "        )\n        _describe -t commands 'kvlab command' commands\n        ;;\n";
    out += "    argument)\n        curcontext=${curcontext%:*:*}:kvlab-$words[1]:\n        case $words[1] in\n";
    for (const CommandInfo& c : commands) out += fmt::format("        {}) {} ;;\n", c.name, zsh_function(c.name));
    out += "        esac\n        ;;\n    esac\n}\n\n";
    // Autoloaded from $fpath the file is _kvlab's body; sourced, it registers the function.
    out += "if [[ $funcstack[1] == _kvlab ]]; then\n    _kvlab \"$@\"\nelse\n    compdef _kvlab kvlab\nfi\n";
    return out;
}

// Text for roff: \ as \e, a "-" that starts a word as \- (a minus sign, so that an option copied
// from the page works), and \& before a "." or "'" that would start a line (a request).
std::string roff_text(const std::string& text) {
    std::string out;
    bool line_start = true, dash_run = false;
    for (char c : text) {
        if (line_start && (c == '.' || c == '\'')) out += "\\&";
        const bool word_start = out.empty() || !std::isalnum(static_cast<unsigned char>(out.back()));
        if (c == '\\')
            out += "\\e";
        else if (c == '-' && (dash_run || word_start))
            out += "\\-";
        else
            out += c;
        dash_run = c == '-' && (dash_run || word_start);
        line_start = c == '\n';
    }
    return out;
}

// A name for roff (an option, a command): every "-" as \-.
std::string roff_name(const std::string& name) {
    std::string out;
    for (char c : name) out += c == '-' ? std::string("\\-") : c == '\\' ? std::string("\\e") : std::string(1, c);
    return out;
}

// The first lines of a page: a fixed header naming the version (no date or commit, so the pages
// change only with the program's commands and version).
std::string man_head(const std::string& page, const std::string& summary) {
    std::string upper = page;
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    return fmt::format(
        ".\\\" Generated by `kvlab man` from the program's own definition of its commands: regenerate, do not "
        "edit.\n.TH {} 1 \"\" \"kvlab {}\" \"kvlab manual\"\n.SH NAME\n{} \\- {}\n",
        roff_name(upper), roff_text(build_info().version), roff_name(page), roff_text(summary));
}

// What a value must be: the choices, or what CLI11's checks say, and whether it is required.
std::string value_note(const OptionInfo& o) {
    std::vector<std::string> notes;
    if (!o.choices.empty())
        notes.push_back("One of: " + join(o.choices, ", ") + ".");
    else if (!o.checks.empty())
        notes.push_back("Values: " + o.checks + ".");
    if (o.required) notes.push_back("Required.");
    return notes.empty() ? "" : ".br\n" + roff_text(join(notes, " ")) + "\n";
}

// One .TP entry per option (positional ones as ARGUMENTS), in the app's order, as --help lists them.
std::string man_options(const std::vector<OptionInfo>& options, bool positional) {
    std::string out;
    for (const OptionInfo& o : options) {
        if (o.positional.empty() == positional) continue;
        std::vector<std::string> names;
        for (const std::string& n : o.names) names.push_back("\\fB" + roff_name(n) + "\\fR");
        std::string tag = positional ? "\\fI" + roff_name(o.positional) + "\\fR" : join(names, ", ");
        if (!positional && !o.type.empty()) tag += " \\fI" + roff_text(o.type) + "\\fR";
        out += ".TP\n" + tag + "\n" + roff_text(o.description) + "\n" + value_note(o);
    }
    return out;
}

// kvlab-<command>.1: what the command does, its arguments and every option.
std::string man_command(const CommandInfo& c) {
    std::string out = man_head("kvlab-" + c.name, c.description);
    out += fmt::format(".SH SYNOPSIS\n.B kvlab {}\n.RI [ options ]\n", roff_name(c.name));
    for (const OptionInfo& o : c.options) {
        if (o.positional.empty()) continue;
        const std::string name = roff_name(o.positional) + (o.repeated ? " ..." : "");
        out += o.required ? ".I " + name + "\n" : ".RI [ " + name + " ]\n";
    }
    out += fmt::format(".SH DESCRIPTION\n{}\n", roff_text(c.description));
    out += fmt::format(".PP\n\\fBkvlab {} \\-\\-help\\fR prints the same options.\n", roff_name(c.name));
    if (has_positionals(c)) out += ".SH ARGUMENTS\n" + man_options(c.options, true);
    out += ".SH OPTIONS\n" + man_options(c.options, false);
    out += ".SH SEE ALSO\n.BR kvlab (1)\n";
    return out;
}

// kvlab.1: the program, every command with what it does, the top-level options, the other pages.
std::string man_main(const CommandInfo& top, const std::vector<CommandInfo>& commands) {
    std::string summary = top.description;
    if (summary.starts_with("kvlab: ")) summary = summary.substr(7);
    std::string out = man_head("kvlab", summary);
    out += ".SH SYNOPSIS\n.B kvlab\n.I command\n.RI [ options ]\n";
    for (const OptionInfo& o : top.options)
        if (!o.names.empty()) out += ".br\n.B kvlab " + roff_name(o.names.back()) + "\n";
    out += fmt::format(".SH DESCRIPTION\n{}\n", roff_text(summary));
    out += ".PP\nEach command has a page of its own, \\fBkvlab\\-\\fIcommand\\fR(1), and its own \\fB\\-\\-help\\fR.\n";
    out += ".SH COMMANDS\n";
    for (const CommandInfo& c : commands)
        out += ".TP\n.B " + roff_name(c.name) + "\n" + roff_text(c.description) + "\n";
    out += ".SH OPTIONS\n" + man_options(top.options, false);
    out += ".SH SEE ALSO\n";
    for (std::size_t i = 0; i < commands.size(); ++i)
        out += ".BR kvlab\\-" + roff_name(commands[i].name) + " (1)" + (i + 1 < commands.size() ? ",\n" : "\n");
    return out;
}

}  // namespace

// `kvlab completions`: its one option, checked by CLI11 (a bad shell is a parse error, exit 2).
CLI::App* add_completions(CLI::App& app, CompletionsOptions& o) {
    auto* cmd = app.add_subcommand(
        "completions",
        "print a completion script for every command and option of kvlab: bash (source it, or install it as "
        "share/bash-completion/completions/kvlab) or zsh (install it as _kvlab in a folder on $fpath)");
    cmd->add_option("--shell", o.shell, "the shell: bash or zsh")->required()->check(CLI::IsMember({"bash", "zsh"}));
    return cmd;
}

// `kvlab man`: the folder the pages go to (required: the pages are several files).
CLI::App* add_man(CLI::App& app, ManOptions& o) {
    auto* cmd = app.add_subcommand("man", "write the man pages: kvlab.1, and kvlab-COMMAND.1 for every command");
    cmd->add_option("--out", o.out, "the folder to write them into (made if missing; pages there are replaced)")
        ->required();
    return cmd;
}

// The bash script: one `case` branch per command, each with its options and their values' kinds.
std::string bash_completion(const CLI::App& app) {
    const CommandInfo top = describe_command(app, "kvlab");
    const std::vector<CommandInfo> commands = describe_commands(app);
    std::string out = kBashHead;
    const std::string valued = value_options(top, [](const OptionInfo&) { return true; });
    if (!valued.empty()) out += fmt::format("        {}) ((i++)) ;;\n", valued);
    out += "        -*) ;;\n        *) cmd=${COMP_WORDS[i]}; break ;;\n        esac\n    done\n    case $cmd in\n";
    std::vector<std::string> names;
    for (const CommandInfo& c : commands) names.push_back(c.name);
    out += bash_branch(top, "\"\"", "_kvlab_words " + shell_quote(join(names, " ")) + " \"$cur\"");
    for (const CommandInfo& c : commands)
        out += bash_branch(c, c.name, has_positionals(c) ? "_kvlab_files \"$cur\"" : "");
    out += "    esac\n}\n\ncomplete -F _kvlab kvlab\n";
    return out;
}

// The zsh script: a function per command with its _arguments specs, and _kvlab to pick the command.
std::string zsh_completion(const CLI::App& app) {
    const CommandInfo top = describe_command(app, "kvlab");
    const std::vector<CommandInfo> commands = describe_commands(app);
    std::string out = kZshHead;
    for (const CommandInfo& c : commands)
        out +=
            fmt::format("\n# kvlab {}\n{}() {{\n    _arguments -S{}\n}}\n", c.name, zsh_function(c.name), zsh_specs(c));
    return out + zsh_main(top, commands);
}

// kvlab.1 first, then the commands' pages in the app's order: the same files on every run.
std::vector<std::pair<std::string, std::string>> man_pages(const CLI::App& app) {
    const CommandInfo top = describe_command(app, "kvlab");
    const std::vector<CommandInfo> commands = describe_commands(app);
    std::vector<std::pair<std::string, std::string>> pages{{"kvlab.1", man_main(top, commands)}};
    for (const CommandInfo& c : commands) pages.emplace_back("kvlab-" + c.name + ".1", man_command(c));
    return pages;
}

// Prints the script on stdout, for a redirect or `source <(...)`; CLI::IsMember checked the shell.
int run_completions(const CLI::App& app, const CompletionsOptions& o) {
    fmt::print("{}", o.shell == "zsh" ? zsh_completion(app) : bash_completion(app));
    return 0;
}

// Makes the folder, then writes each page whole (core/file_writer.h); a one-line Error otherwise.
int run_man(const CLI::App& app, const ManOptions& o) {
    std::error_code ec;
    std::filesystem::create_directories(o.out, ec);
    if (ec || !std::filesystem::is_directory(o.out, ec))
        throw Error(fmt::format("cannot make the folder '{}': {}", one_line(o.out),
                                ec ? ec.message() : std::string("a file is in the way")));
    const auto pages = man_pages(app);
    for (const auto& [name, text] : pages) {
        const std::string path = (std::filesystem::path(o.out) / name).string();
        write_file(path, fmt::format("man page '{}'", one_line(path)), text);
    }
    fmt::print("wrote {} man pages into {}\n", pages.size(), one_line(o.out));
    return 0;
}

}  // namespace kvlab::cli
