// kvlab CLI: what the commands share (choosing a model, reading prompts, timing).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "model.h"
#include "tokenizer.h"

namespace kvlab::cli {

struct LoadedModel {
    Model model;
    std::optional<Tokenizer> tokenizer;
    std::string source;  // "stories260K.bin" or "random (seed 7)", for the report
};

// --model PATH (a llama2.c checkpoint), else stories260K from the shared models folder when
// present, else a random model of `fallback` shape. --tokenizer PATH, else tok512.bin when
// the model is the shared stories260K.
LoadedModel load_model(const std::string& model_path, const std::string& tokenizer_path, const Config& fallback,
                       std::uint64_t seed);

// The prompt as token ids: --tokens "1,2,3" wins, else --prompt text through the tokenizer
// (with BOS, as llama2.c does), else `default_text` (BOS alone when empty, as in llama2.c;
// a random model without a tokenizer gets a fixed handful of ids instead).
std::vector<int> prompt_tokens(const LoadedModel& m, const std::string& prompt, const std::string& tokens,
                               const std::string& default_text);

// prompt_tokens, checked: every id inside the vocabulary, and the prompt plus --steps needing
// P + steps + extra positions at most max_seq (an error, never a silent truncation).
std::vector<int> checked_prompt(const LoadedModel& m, const std::string& prompt, const std::string& tokens,
                                const std::string& default_text, int steps, int extra);

// "42" -> 42; anything else is an Error naming `option` (with `hint` after the message).
int parse_int(const std::string& option, const std::string& text, const std::string& hint = "");
// "1,2,3" -> {1, 2, 3}; anything else is an Error naming `option`.
std::vector<int> parse_int_list(const std::string& option, const std::string& text);

// Text of `token` after `prev` (with the tokenizer), or "<id>" without one.
std::string token_text(const LoadedModel& m, int prev, int token);

// The same text with control characters escaped, for one-line tables.
std::string escape(const std::string& s);

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace kvlab::cli
