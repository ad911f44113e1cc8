// kvlab core: llama2.c's BPE tokenizer (tokenizer.bin), with exactly run.c's encode/decode.
//
// tokenizer.bin (little-endian, no header beyond the first field; vocab_size comes from the model):
//   int32 max_token_length
//   vocab_size times: float32 score, int32 len, len bytes (the piece, not NUL-terminated)
//
// Conventions of llama2.c's vocabularies: id 0 <unk>, id 1 BOS, id 2 EOS, ids 3..258 the byte
// tokens "<0x00>".."<0xFF>" (byte fallback: byte b is token b + 3), then the merged pieces.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

class Tokenizer {
public:
    static constexpr int kBos = 1;
    static constexpr int kEos = 2;
    static constexpr int kByteOffset = 3;  // byte b falls back to token b + kByteOffset

    // Reads tokenizer.bin; throws kvlab::Error (one line) when the file is missing, unreadable,
    // truncated, has an impossible length, or has more (or fewer) than vocab_size entries.
    static Tokenizer load(const std::string& path, int vocab_size);
    // run.c's encode: [BOS] + dummy " " prefix (non-empty text only) + one token per UTF-8
    // codepoint (byte fallback when the codepoint is not a piece), then greedy merges of the
    // adjacent pair whose concatenation is the best-scoring piece (first pair on ties) + [EOS].
    // Throws kvlab::Error if a needed special or byte-fallback id is outside the vocabulary.
    // O(n log n) in the text's length (run.c's loop is O(n^2)), with exactly run.c's merges.
    std::vector<int> encode(const std::string& text, bool bos, bool eos) const;
    // A lower bound on encode(text, bos, eos).size() found in one pass, without merging: merges
    // keep the sum of the pieces' bytes, and no piece is longer than max_token_length. Lets a
    // caller refuse a prompt that cannot fit before spending time encoding it.
    std::size_t min_tokens(const std::string& text, bool bos, bool eos) const;

    // run.c's decode: the bytes to print for `token` following `prev_token`. After BOS a leading
    // space (the dummy prefix) is dropped; a piece "<0xXX>" is the single raw byte 0xXX.
    // prev_token is only compared with BOS, so any value (e.g. -1 at the start) is accepted.
    std::string decode(int prev_token, int token) const;

    // run.c's safe_printf filter: a single-byte piece that is neither printable ASCII nor
    // whitespace becomes "" so raw control bytes never reach a terminal; others pass unchanged.
    static std::string printable(const std::string& piece);

    int vocab_size() const { return static_cast<int>(pieces_.size()); }
    int max_token_length() const { return max_token_length_; }
    // Both throw kvlab::Error("token id X is outside the vocabulary [0, N)") for a bad id.
    const std::string& piece(int id) const;
    float score(int id) const;
    // The id whose piece is exactly `text`, or -1. With duplicate pieces, the lowest id.
    int lookup(const std::string& text) const;

private:
    Tokenizer() = default;
    void build_index();
    // BOS, the dummy prefix and one token per codepoint (or its bytes): encode before merging.
    std::vector<int> initial_tokens(const std::string& text, bool bos) const;
    // Merges the best pair until none merges (encode's loop); `tokens` shrinks in place.
    void merge(std::vector<int>& tokens) const;
    void check_id(int id) const;

    std::vector<std::string> pieces_;             // [vocab_size]
    std::vector<float> scores_;                   // [vocab_size]; merge priority, higher first
    // piece -> lowest id with that piece: open addressing over ids (-1: empty), a power of two at
    // least twice the vocabulary; 4 bytes a slot where a node-based map takes tens per piece.
    std::vector<int> index_;
    static std::uint64_t piece_hash(std::string_view piece);
    int max_token_length_ = 0;
};

}  // namespace kvlab
