// kvlab completions and kvlab man on a small app of their own, whose help texts hold what kvlab's
// do not yet: the characters zsh's _arguments and roff give a meaning to (brackets, colons,
// quotes, $, backslashes, a leading "." or "'"), a hidden option, a choice list, a positional.
// tests/completions_test.sh checks the real program's files end to end.
#include <CLI/CLI.hpp>
#include <catch2/catch.hpp>
#include <string>

#include "completions.h"

namespace {

// An app shaped like kvlab's: two commands, --version, and hard help texts.
struct Fixture {
    CLI::App app{"kvlab: a test program"};
    std::string text, shell, hidden, out;
    int number = 0;
    bool flag = false;
    Fixture() {
        app.set_version_flag("--version", "1.0");
        auto* one = app.add_subcommand("one-cmd", "first: it's [not] \"quoted\" $HOME `x` back\\slash");
        one->add_option("--path", text, "a file [default: none]: it's here");
        one->add_option("--count", number, "how many (--path must be set); fp8-e4m3 stays a word")
            ->check(CLI::Range(1, 9));
        one->add_option("--shell", shell, "a shell")->check(CLI::IsMember({"bash", "zsh"}));
        one->add_flag("-f,--flag", flag, ".starts with a dot");
        one->add_option("--hidden", hidden, "not in --help")->group("");
        auto* two = app.add_subcommand("two", "'starts with a quote");
        two->add_option("out", out, "the output \\ file")->required();
    }
};

// The page named `name` among man_pages.
std::string page(const CLI::App& app, const std::string& name) {
    for (const auto& [file, text] : kvlab::cli::man_pages(app))
        if (file == name) return text;
    return "";
}

}  // namespace

TEST_CASE("completions: zsh help texts escape brackets, colons, quotes, $ and backquotes") {
    Fixture f;
    const std::string zsh = kvlab::cli::zsh_completion(f.app);
    CHECK(zsh.starts_with("#compdef kvlab\n"));
    CHECK(zsh.find(R"('--path=[a file \[default\: none\]\: it'\''s here]:TEXT:_files')") != std::string::npos);
    CHECK(zsh.find(R"('--count=[how many (--path must be set); fp8-e4m3 stays a word]:INT: ')") != std::string::npos);
    CHECK(zsh.find(R"('--shell=[a shell]:TEXT:(bash zsh)')") != std::string::npos);
    CHECK(zsh.find(R"('(-f --flag)'{-f,--flag}'[.starts with a dot]')") != std::string::npos);
    CHECK(zsh.find(R"('1:out:_files')") != std::string::npos);
    CHECK(zsh.find(R"('one-cmd:first\: it'\''s \[not\] "quoted" \$HOME \`x\` back\\slash')") != std::string::npos);
    CHECK(zsh.find(R"('(- *)--version[)") != std::string::npos);
    CHECK(zsh.find("--hidden") == std::string::npos);
}

TEST_CASE("completions: bash completes choices, file names for text, nothing for numbers") {
    Fixture f;
    const std::string bash = kvlab::cli::bash_completion(f.app);
    CHECK(bash.find("complete -F _kvlab kvlab\n") != std::string::npos);
    CHECK(bash.find("_kvlab_words 'one-cmd two' \"$cur\"") != std::string::npos);
    CHECK(bash.find("_kvlab_words '-h --help --version' \"$cur\"") != std::string::npos);
    CHECK(bash.find("        --path) _kvlab_files \"$cur\"; return ;;\n") != std::string::npos);
    CHECK(bash.find("        --count) return ;;\n") != std::string::npos);
    CHECK(bash.find("        --shell) _kvlab_words 'bash zsh' \"$cur\"; return ;;\n") != std::string::npos);
    CHECK(bash.find("_kvlab_words '-h --help --path --count --shell -f --flag' \"$cur\" ;;") != std::string::npos);
    // two takes a file name as its positional; an option only after a "-".
    CHECK(bash.find("then _kvlab_words '-h --help' \"$cur\"; else _kvlab_files \"$cur\"; fi ;;") != std::string::npos);
    CHECK(bash.find("--hidden") == std::string::npos);
}

TEST_CASE("completions: man pages escape roff and list every command and option") {
    Fixture f;
    const auto pages = kvlab::cli::man_pages(f.app);
    REQUIRE(pages.size() == 3);
    CHECK(pages[0].first == "kvlab.1");
    CHECK(pages[1].first == "kvlab-one-cmd.1");
    CHECK(pages[2].first == "kvlab-two.1");
    const std::string top = page(f.app, "kvlab.1");
    CHECK(top.find(".SH NAME\nkvlab \\- a test program\n") != std::string::npos);
    CHECK(top.find(".TP\n.B one\\-cmd\nfirst: it's [not] \"quoted\" $HOME `x` back\\eslash\n") != std::string::npos);
    CHECK(top.find(".TP\n.B two\n\\&'starts with a quote\n") != std::string::npos);
    CHECK(top.find("\\fB\\-\\-version\\fR\n") != std::string::npos);
    const std::string one = page(f.app, "kvlab-one-cmd.1");
    CHECK(one.find(".TH KVLAB\\-ONE\\-CMD 1 ") != std::string::npos);
    CHECK(one.find("\\fB\\-f\\fR, \\fB\\-\\-flag\\fR\n\\&.starts with a dot\n") != std::string::npos);
    CHECK(one.find("\\fB\\-\\-count\\fR \\fIINT\\fR\nhow many (\\-\\-path must be set); fp8-e4m3 stays a word\n"
                   ".br\nValues: INT in [1 \\- 9].\n") != std::string::npos);
    CHECK(one.find("One of: bash, zsh.") != std::string::npos);
    CHECK(one.find("hidden") == std::string::npos);
    const std::string two = page(f.app, "kvlab-two.1");
    CHECK(two.find(".SH ARGUMENTS\n.TP\n\\fIout\\fR\nthe output \\e file\n.br\nRequired.\n") != std::string::npos);
    CHECK(two.find(".B kvlab two\n.RI [ options ]\n.I out\n") != std::string::npos);
}
