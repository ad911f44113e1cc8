// kvlab core: choosing and loading a model, and reading a prompt; what the commands (cli/) and
// the viewer (viz/) share.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model.h"
#include "tokenizer.h"

namespace kvlab {

struct LoadedModel {
    Model model;
    std::optional<Tokenizer> tokenizer;
    std::string source;  // "stories260K.bin" or "random (seed 7)", for the report
};

// model_path (a llama2.c checkpoint), else stories260K from the shared models folder when
// present, else a random model of `fallback` shape. tokenizer_path, else tok512.bin when the
// model is the shared stories260K.
// panel_cache is --panel-cache: auto, on, off or a folder (parse_panel_cache).
LoadedModel load_model(const std::string& model_path, const std::string& tokenizer_path, const Config& fallback,
                       std::uint64_t seed, const std::string& panel_cache = "auto");

// "auto", "on", "off", or a folder (on, with the cache files there); "" is an Error.
PanelCacheOption parse_panel_cache(const std::string& text);

// The prompt as token ids: `tokens` ("1,2,3", --tokens) wins, else `prompt` text through the
// tokenizer (with BOS, as llama2.c does), else `default_text` (BOS alone when empty, as in
// llama2.c; a random model without a tokenizer gets a fixed handful of ids instead).
std::vector<int> prompt_tokens(const LoadedModel& m, const std::string& prompt, const std::string& tokens,
                               const std::string& default_text);

// Text through the tokenizer with BOS, refused (an Error) when the prompt and `reserve` more
// positions (`reserve_what`, e.g. "--steps 5") need more than max_seq. A prompt whose bytes alone
// prove that (Tokenizer::min_tokens) is refused before it is encoded; any other is encoded, in
// O(n log n), and then checked. The CLI and the viewer both read their prompts through this.
std::vector<int> encode_prompt(const Tokenizer& tokenizer, const std::string& text, int max_seq, int reserve,
                               const std::string& reserve_what);

// prompt_tokens, checked: every id inside the vocabulary, and the prompt plus `steps` needing
// P + steps + extra positions at most max_seq (an error, never a silent truncation).
std::vector<int> checked_prompt(const LoadedModel& m, const std::string& prompt, const std::string& tokens,
                                const std::string& default_text, int steps, int extra);

// Text of `token` after `prev` (with the tokenizer), or "<id>" without one.
std::string token_text(const LoadedModel& m, int prev, int token);

}  // namespace kvlab
