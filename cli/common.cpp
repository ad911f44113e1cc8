#include "common.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>

namespace kvlab::cli {

void add_model_options(CLI::App* cmd, std::string& model, std::string& tokenizer, std::uint64_t& seed) {
    cmd->add_option("--model", model,
                    "llama2.c checkpoint (default: ../shared/models/stories260K.bin if present, "
                    "else a random model of its shape)");
    cmd->add_option("--tokenizer", tokenizer, "llama2.c tokenizer.bin (default: tok512.bin beside the shared model)");
    cmd->add_option("--model-seed", seed, "seed of the random model (used when there is no checkpoint)");
}

std::string escape(const std::string& s) {
    std::string out;
    for (char ch : s) {
        if (ch == '\n')
            out += "\\n";
        else if (ch == '\t')
            out += "\\t";
        else if (static_cast<unsigned char>(ch) < 0x20)
            out += fmt::format("\\x{:02x}", static_cast<unsigned char>(ch));
        else
            out += ch;
    }
    return out;
}

}  // namespace kvlab::cli
