#include "model_loader.h"

#include <fmt/format.h>

#include <filesystem>

#include "checkpoint.h"
#include "decode.h"
#include "models_dir.h"

namespace kvlab {

PanelCacheOption parse_panel_cache(const std::string& text) {
    using Mode = PanelCacheOption::Mode;
    if (text == "auto") return {Mode::automatic, ""};
    if (text == "on") return {Mode::on, ""};
    if (text == "off") return {Mode::off, ""};
    if (text.empty()) throw Error("--panel-cache: expected auto, on, off or a folder, got an empty value");
    return {Mode::on, text};
}

LoadedModel load_model(const std::string& model_path, const std::string& tokenizer_path, const Config& fallback,
                       std::uint64_t seed, const std::string& panel_cache) {
    namespace fs = std::filesystem;
    const PanelCacheOption cache = parse_panel_cache(panel_cache);
    std::string path = model_path, tok = tokenizer_path;
    if (path.empty()) {
        if (const std::string dir = models_dir(); !dir.empty()) {
            path = (fs::path(dir) / "stories260K.bin").string();
            if (tok.empty() && fs::exists(fs::path(dir) / "tok512.bin")) tok = (fs::path(dir) / "tok512.bin").string();
        }
    }
    if (path.empty()) {
        LoadedModel m{random_model(fallback, seed), std::nullopt, fmt::format("random (seed {})", seed)};
        m.model.panel_cache = cache;  // "on" is refused when a backend asks: there is no file to cache beside
        if (!tok.empty()) m.tokenizer = Tokenizer::load(tok, fallback.vocab_size);
        return m;
    }
    LoadedModel m{load_checkpoint(path), std::nullopt, path};
    m.model.panel_cache = cache;
    if (!tok.empty()) m.tokenizer = Tokenizer::load(tok, m.model.config().vocab_size);
    return m;
}

std::vector<int> prompt_tokens(const LoadedModel& m, const std::string& prompt, const std::string& tokens,
                               const std::string& default_text) {
    if (!tokens.empty()) return parse_int_list("--tokens", tokens);
    if (!prompt.empty()) {
        if (!m.tokenizer) throw Error("--prompt needs a tokenizer (give --tokenizer, or use --tokens 1,2,3)");
        return m.tokenizer->encode(prompt, true, false);
    }
    if (m.tokenizer) return m.tokenizer->encode(default_text, true, false);
    if (default_text.empty()) return {Tokenizer::kBos % m.model.config().vocab_size};
    // A random model has no text: a fixed handful of ids after BOS.
    std::vector<int> ids = {1};
    SplitMix64 rng(2024);
    for (int i = 0; i < 7 && i + 1 < m.model.config().max_seq; i++)
        ids.push_back(int(rng.next() % std::uint64_t(m.model.config().vocab_size)));
    for (int& id : ids) id %= m.model.config().vocab_size;
    return ids;
}

std::vector<int> encode_prompt(const Tokenizer& tokenizer, const std::string& text, int max_seq, int reserve,
                               const std::string& reserve_what) {
    const std::size_t at_least = tokenizer.min_tokens(text, true, false);
    if (std::int64_t(at_least) + reserve > max_seq)
        throw Error(fmt::format(
            "prompt of {} bytes (at least {} tokens: no piece is longer than {} bytes) plus {} needs at least {} "
            "positions, more than max_seq = {}",
            text.size(), at_least, tokenizer.max_token_length(), reserve_what, std::int64_t(at_least) + reserve,
            max_seq));
    std::vector<int> ids = tokenizer.encode(text, true, false);
    if (std::int64_t(ids.size()) + reserve > max_seq)
        throw Error(fmt::format("prompt ({} tokens) plus {} needs {} positions, more than max_seq = {}", ids.size(),
                                reserve_what, std::int64_t(ids.size()) + reserve, max_seq));
    return ids;
}

std::vector<int> checked_prompt(const LoadedModel& m, const std::string& prompt, const std::string& tokens,
                                const std::string& default_text, int steps, int extra) {
    const Config& c = m.model.config();
    // Text is checked as it is encoded (prompt_tokens' choice of text): one too long for max_seq
    // is refused before any merging.
    std::vector<int> ids = tokens.empty() && m.tokenizer
                               ? encode_prompt(*m.tokenizer, prompt.empty() ? default_text : prompt, c.max_seq,
                                               steps + extra, fmt::format("--steps {}", steps))
                               : prompt_tokens(m, prompt, tokens, default_text);
    check_tokens(c, ids, 0);
    const std::int64_t needed = std::int64_t(ids.size()) + steps + extra;
    if (needed > c.max_seq)
        throw Error(fmt::format("prompt ({} tokens) plus --steps {} needs {} positions, more than max_seq = {}",
                                ids.size(), steps, needed, c.max_seq));
    return ids;
}

std::string token_text(const LoadedModel& m, int prev, int token) {
    if (!m.tokenizer) return fmt::format("<{}>", token);
    return Tokenizer::printable(m.tokenizer->decode(prev, token));
}

}  // namespace kvlab
