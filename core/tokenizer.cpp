#include "tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <queue>

#include "config.h"

namespace kvlab {

namespace {

// Longest piece we accept: llama's longest is 16 bytes; a bigger length means a wrong file,
// not a reason to allocate.
constexpr std::int32_t kMaxPieceBytes = 1 << 20;

struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
};

// Reads exactly n bytes, or returns how many it got (short only at end of file or on an error).
std::size_t read_bytes(std::FILE* f, void* dst, std::size_t n) { return std::fread(dst, 1, n, f); }

// The file is little-endian whatever the host is.
std::uint32_t le32(const std::array<unsigned char, 4>& b) {
    return std::uint32_t{b[0]} | std::uint32_t{b[1]} << 8 | std::uint32_t{b[2]} << 16 | std::uint32_t{b[3]} << 24;
}

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
int hex_value(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

}  // namespace

Tokenizer Tokenizer::load(const std::string& path, int vocab_size) {
    const std::string where = one_line(path);
    if (vocab_size <= 0)
        throw Error(fmt::format("tokenizer: vocab_size must be positive to load {}, got {}", where, vocab_size));

    // Look before opening, as load_checkpoint does: opening a FIFO blocks until a writer comes.
    std::error_code ec;
    if (const auto type = std::filesystem::status(path, ec).type();
        !ec && type != std::filesystem::file_type::regular && type != std::filesystem::file_type::not_found)
        throw Error(fmt::format("tokenizer: {} is not a regular file", where));
    std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
    if (!file) throw Error(fmt::format("tokenizer: cannot open {}: {}", where, std::strerror(errno)));
    std::FILE* f = file.get();

    // Every short read lands here: an I/O error (e.g. a directory) or the end of the file.
    auto short_read = [&](const std::string& what) -> Error {
        if (std::ferror(f)) return Error(fmt::format("tokenizer: cannot read {}: {}", where, std::strerror(errno)));
        return Error(fmt::format("tokenizer: {} is truncated {}", where, what));
    };

    std::array<unsigned char, 4> word{};
    if (read_bytes(f, word.data(), 4) != 4) throw short_read("in its header (int32 max_token_length)");
    const auto max_len = static_cast<std::int32_t>(le32(word));
    if (max_len < 0 || max_len > kMaxPieceBytes)
        throw Error(fmt::format("tokenizer: {} has max_token_length={} (expected 0..{}): not a tokenizer.bin?", where,
                                max_len, kMaxPieceBytes));

    Tokenizer t;
    t.max_token_length_ = max_len;
    // vocab_size comes from a model header that may be wrong: let the file, not it, size memory.
    const auto guess = static_cast<std::size_t>(std::min(vocab_size, 1 << 16));
    t.pieces_.reserve(guess);
    t.scores_.reserve(guess);
    for (int i = 0; i < vocab_size; i++) {
        const auto at = [&](const char* detail) {
            return fmt::format("at entry {} of {} ({})", i, vocab_size, detail);
        };
        if (read_bytes(f, word.data(), 4) != 4) throw short_read(at("no score"));
        const float score = std::bit_cast<float>(le32(word));
        if (read_bytes(f, word.data(), 4) != 4) throw short_read(at("no length"));
        const auto len = static_cast<std::int32_t>(le32(word));
        if (len < 0)
            throw Error(fmt::format("tokenizer: {} entry {} of {} has negative length {}", where, i, vocab_size, len));
        if (len > max_len)
            throw Error(fmt::format("tokenizer: {} entry {} of {} has length {} > max_token_length={}", where, i,
                                    vocab_size, len, max_len));
        std::string piece(static_cast<std::size_t>(len), '\0');
        const std::size_t got = read_bytes(f, piece.data(), piece.size());
        if (got != piece.size()) throw short_read(at(fmt::format("piece cut short: {} of {} bytes", got, len).c_str()));
        t.pieces_.push_back(std::move(piece));
        t.scores_.push_back(score);
    }
    // Trailing bytes mean the file was made for a bigger vocabulary: refuse rather than truncate it.
    unsigned char extra = 0;
    if (read_bytes(f, &extra, 1) == 1)
        throw Error(fmt::format("tokenizer: {} has more than vocab_size={} entries: it does not fit this model", where,
                                vocab_size));
    if (std::ferror(f)) throw Error(fmt::format("tokenizer: cannot read {}: {}", where, std::strerror(errno)));

    t.build_index();
    return t;
}

std::uint64_t Tokenizer::piece_hash(std::string_view piece) {
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (const char ch : piece) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
    return h;
}

void Tokenizer::build_index() {
    std::size_t n = 2;
    while (n < 2 * pieces_.size()) n *= 2;
    index_.assign(n, -1);
    // Ids go in in increasing order and a piece already present is skipped, so a duplicated piece
    // finds its lowest id: deterministic, unlike run.c's qsort + bsearch, which may return either.
    for (int id = 0; id < vocab_size(); id++) {
        const std::string& piece = pieces_[static_cast<std::size_t>(id)];
        for (std::size_t s = piece_hash(piece) & (n - 1);; s = (s + 1) & (n - 1)) {
            if (index_[s] < 0) {
                index_[s] = id;
                break;
            }
            if (pieces_[static_cast<std::size_t>(index_[s])] == piece) break;
        }
    }
}

int Tokenizer::lookup(const std::string& text) const {
    const std::size_t n = index_.size();
    if (n == 0) return -1;  // no vocabulary
    for (std::size_t s = piece_hash(text) & (n - 1);; s = (s + 1) & (n - 1)) {
        const int id = index_[s];
        if (id < 0 || pieces_[static_cast<std::size_t>(id)] == text) return id;
    }
}

void Tokenizer::check_id(int id) const {
    if (id < 0 || id >= vocab_size())
        throw Error(fmt::format("token id {} is outside the vocabulary [0, {})", id, vocab_size()));
}

const std::string& Tokenizer::piece(int id) const {
    check_id(id);
    return pieces_[static_cast<std::size_t>(id)];
}

float Tokenizer::score(int id) const {
    check_id(id);
    return scores_[static_cast<std::size_t>(id)];
}

std::vector<int> Tokenizer::initial_tokens(const std::string& text, bool bos) const {
    // run.c writes these ids unchecked; a vocabulary too small for them is an error here.
    const auto need = [&](int id, const char* what) {
        if (id >= vocab_size())
            throw Error(fmt::format("tokenizer: {} (id {}) is outside the vocabulary [0, {})", what, id, vocab_size()));
        return id;
    };
    // Token ids for bytes with no piece of their own: byte b is token b + 3.
    const auto push_bytes = [&](std::vector<int>& out, const std::string& bytes) {
        for (unsigned char b : bytes) out.push_back(need(b + kByteOffset, "a byte-fallback token"));
    };

    std::vector<int> tokens;  // [n_tokens], at most 2 + 1 + text.size()
    tokens.reserve(text.size() + 3);
    if (bos) tokens.push_back(need(kBos, "BOS"));

    // sentencepiece's add_dummy_prefix: the text is encoded as if it began with a space.
    // (run.c stores whatever lookup(" ") returns, -1 included; we fall back to the byte instead.)
    if (!text.empty()) {
        const int dummy_prefix = lookup(" ");
        if (dummy_prefix >= 0)
            tokens.push_back(dummy_prefix);
        else
            push_bytes(tokens, " ");
    }

    // One token per UTF-8 codepoint: a lead (or stray) byte plus up to 3 continuation bytes
    // (10xxxxxx), capped at 4 bytes as run.c does; no validation of the sequence itself.
    std::string codepoint;  // [1..4] bytes
    for (std::size_t i = 0; i < text.size();) {
        std::size_t end = i + 1;
        while (end < text.size() && end - i < 4 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) end++;
        codepoint.assign(text, i, end - i);
        const int id = lookup(codepoint);
        if (id >= 0)
            tokens.push_back(id);
        else
            push_bytes(tokens, codepoint);
        i = end;
    }
    return tokens;
}

std::vector<int> Tokenizer::encode(const std::string& text, bool bos, bool eos) const {
    std::vector<int> tokens = initial_tokens(text, bos);
    merge(tokens);
    if (eos) {
        if (kEos >= vocab_size())
            throw Error(fmt::format("tokenizer: EOS (id {}) is outside the vocabulary [0, {})", kEos, vocab_size()));
        tokens.push_back(kEos);
    }
    return tokens;
}

// run.c's merge loop rescans every adjacent pair for each merge: O(n^2) lookups, minutes for a
// 100 kB prompt. Here every candidate pair waits in a heap ordered as run.c chooses, and a merge
// only adds the (at most two) pairs it creates, so the same merges happen in the same order in
// O(n log n). A merged-away or changed token makes its old pairs stale; they are skipped when
// they come up. The tests keep run.c's loop as the oracle this must equal.
void Tokenizer::merge(std::vector<int>& tokens) const {
    const std::size_t n = tokens.size();
    if (n < 2) return;
    constexpr std::size_t kNone = std::size_t(-1);
    // A linked list over the initial positions: a merge keeps its left node and unlinks the right,
    // so list order is text order and the lower node index is the leftmost pair.
    std::vector<std::size_t> prev(n), next(n);  // [n] neighbours, kNone at the ends
    std::vector<std::uint32_t> version(n, 0);   // [n] bumped when a node's token changes or it leaves
    for (std::size_t i = 0; i < n; i++) {
        prev[i] = i == 0 ? kNone : i - 1;
        next[i] = i + 1 == n ? kNone : i + 1;
    }
    struct Pair {
        float score;
        std::size_t left, right;
        std::uint32_t left_version, right_version;
        int id;  // the merged piece's
    };
    // run.c's choice: the highest score, then the leftmost pair. (NaN never enters: see below.)
    const auto after = [](const Pair& a, const Pair& b) {
        return a.score < b.score || (a.score == b.score && a.left > b.left);
    };
    std::priority_queue<Pair, std::vector<Pair>, decltype(after)> heap(after);
    std::string pair;  // [<= 2 * max_token_length] bytes
    const auto consider = [&](std::size_t l, std::size_t r) {
        pair.assign(pieces_[static_cast<std::size_t>(tokens[l])]);
        pair.append(pieces_[static_cast<std::size_t>(tokens[r])]);
        const int id = lookup(pair);
        // run.c's sentinel and strict '>': a piece scored <= -1e10 (or NaN) never merges.
        if (id >= 0 && scores_[static_cast<std::size_t>(id)] > -1e10f)
            heap.push(Pair{scores_[static_cast<std::size_t>(id)], l, r, version[l], version[r], id});
    };
    for (std::size_t i = 0; i + 1 < n; i++) consider(i, i + 1);
    while (!heap.empty()) {
        const Pair p = heap.top();
        heap.pop();
        if (version[p.left] != p.left_version || version[p.right] != p.right_version || next[p.left] != p.right)
            continue;  // stale: one of its tokens changed or left since it was pushed
        tokens[p.left] = p.id;
        version[p.left]++;
        version[p.right]++;
        next[p.left] = next[p.right];
        if (next[p.right] != kNone) prev[next[p.right]] = p.left;
        if (prev[p.left] != kNone) consider(prev[p.left], p.left);
        if (next[p.left] != kNone) consider(p.left, next[p.left]);
    }
    // Node 0 is never a right node, so the list starts there.
    std::size_t kept = 0;
    for (std::size_t i = 0; i != kNone; i = next[i]) tokens[kept++] = tokens[i];
    tokens.resize(kept);
}

std::size_t Tokenizer::min_tokens(const std::string& text, bool bos, bool eos) const {
    const std::vector<int> tokens = initial_tokens(text, bos);
    std::size_t bytes = 0;
    for (int id : tokens) bytes += pieces_[static_cast<std::size_t>(id)].size();
    // A merge keeps the sum of the pieces' bytes (the merged piece is the two joined), and no
    // piece is longer than max_token_length; every token left holds at least one of them.
    std::size_t n = 0;
    if (!tokens.empty())
        n = max_token_length_ > 0 ? std::max<std::size_t>(1, (bytes + max_token_length_ - 1) / max_token_length_) : 1;
    return n + (eos ? 1 : 0);
}

std::string Tokenizer::decode(int prev_token, int token) const {
    std::string_view p = piece(token);
    // After BOS, sentencepiece's dummy-prefix space is not part of the text.
    if (prev_token == kBos && !p.empty() && p.front() == ' ') p.remove_prefix(1);
    // Byte tokens print as the raw byte. run.c's sscanf("<0x%02hhX>") is laxer (it ignores
    // what follows the digits); we take only the exact six-byte form.
    if (p.size() == 6 && p.starts_with("<0x") && is_hex(p[3]) && is_hex(p[4]) && p[5] == '>')
        return std::string(1, static_cast<char>(hex_value(p[3]) * 16 + hex_value(p[4])));
    return std::string(p);
}

std::string Tokenizer::printable(const std::string& piece) {
    if (piece.size() == 1) {
        // The C locale's isprint || isspace, spelled out so the host locale cannot change it.
        const auto b = static_cast<unsigned char>(piece[0]);
        const bool print = b >= 0x20 && b <= 0x7E;
        const bool space = b == ' ' || (b >= '\t' && b <= '\r');
        if (!print && !space) return "";
    }
    return piece;
}

}  // namespace kvlab
