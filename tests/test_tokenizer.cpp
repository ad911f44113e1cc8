// Tests for core/tokenizer (llama2.c tokenizer.bin + run.c's BPE) and core/sampler (run.c's sampler).
#include <fcntl.h>
#include <rapidcheck/catch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "config.h"
#include "sampler.h"
#include "test_util.h"
#include "tokenizer.h"

namespace fs = std::filesystem;
using kvlab::Sampler;
using kvlab::Tokenizer;

namespace {

// ---------------------------------------------------------------------------------------------
// Helpers

// The what() of the kvlab::Error that f throws; fails the test if it throws nothing (or
// something else). Every message must be one line.
std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const kvlab::Error& e) {
        const std::string msg = e.what();
        INFO("message: " << msg);
        CHECK(msg.find('\n') == std::string::npos);
        CHECK(!msg.empty());
        return msg;
    }
    FAIL("expected a kvlab::Error");
    return {};
}

bool contains(const std::string& haystack, const std::string& needle) {
    return haystack.find(needle) != std::string::npos;
}

// One tokenizer.bin entry: (score, piece).
using Entry = std::pair<float, std::string>;

void put_i32(std::string& out, std::int32_t v) {
    const auto u = static_cast<std::uint32_t>(v);
    for (int k = 0; k < 4; k++) out.push_back(static_cast<char>((u >> (8 * k)) & 0xFF));
}
void put_f32(std::string& out, float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    put_i32(out, static_cast<std::int32_t>(u));
}

// The bytes of a tokenizer.bin: int32 max_token_length, then (float32 score, int32 len, bytes)*.
std::string tokenizer_bytes(const std::vector<Entry>& entries, int max_token_length = -1) {
    if (max_token_length < 0) {
        max_token_length = 0;
        for (const auto& e : entries) max_token_length = std::max(max_token_length, static_cast<int>(e.second.size()));
    }
    std::string out;
    put_i32(out, max_token_length);
    for (const auto& [score, piece] : entries) {
        put_f32(out, score);
        put_i32(out, static_cast<std::int32_t>(piece.size()));
        out += piece;
    }
    return out;
}

using kvlab::test::TempFile;

std::string byte_piece(int b) {
    static const char* hex = "0123456789ABCDEF";
    return std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
}

// llama2.c's layout: <unk>, BOS, EOS, the 256 byte tokens at ids 3..258, then `merges` in order.
std::vector<Entry> llama_layout(const std::vector<Entry>& merges) {
    std::vector<Entry> v = {{0.0f, "<unk>"}, {0.0f, "\n<s>\n"}, {0.0f, "\n</s>\n"}};
    for (int b = 0; b < 256; b++) v.push_back({0.0f, byte_piece(b)});
    v.insert(v.end(), merges.begin(), merges.end());
    return v;
}

Tokenizer load_entries(const std::vector<Entry>& entries) {
    TempFile file(tokenizer_bytes(entries));
    return Tokenizer::load(file.path(), static_cast<int>(entries.size()));
}

// A small English-ish vocabulary: single characters, then merges with decreasing scores
// (a few equal scores so ties are exercised too).
const std::vector<Entry>& small_merges() {
    static const std::vector<Entry> merges = [] {
        std::vector<Entry> m;
        for (const char* s : {" ", "a", "d", "e", "h", "i", "l", "n", "o", "s", "t", "T", "g", "r"})
            m.push_back({-1000.0f, s});
        const char* pieces[] = {" t", "he", " a", "in", "th",  " the", "nd", " and", "ing", "on", " o",
                                "ll", " s", "er", "an", "the", " th",  "ng", "it",   "is",  " is"};
        float score = 0.0f;
        int k = 0;
        for (const char* p : pieces) {
            m.push_back({score, p});
            if (++k % 3 != 0) score -= 1.0f;  // every third piece ties with the previous one
        }
        return m;
    }();
    return merges;
}

const Tokenizer& small_tokenizer() {
    static const Tokenizer t = load_entries(llama_layout(small_merges()));
    return t;
}

// Text as llama2.c prints it: decode each token after the first, each relative to the previous.
std::string decode_all(const Tokenizer& t, const std::vector<int>& tokens) {
    std::string out;
    for (std::size_t i = 1; i < tokens.size(); i++) out += t.decode(tokens[i - 1], tokens[i]);
    return out;
}

std::vector<std::string> pieces_of(const Tokenizer& t, const std::vector<int>& tokens) {
    std::vector<std::string> out;
    for (int id : tokens) out.push_back(t.piece(id));
    return out;
}

// run.c's encode as it was written (and as kvlab's was before its heap-based encoder, which a
// 100 kB prompt made necessary): after the per-codepoint tokens, rescan every adjacent pair for
// each merge and take the best score, the first pair on ties. O(n^2), kept here as the oracle the
// heap-based encoder must equal token for token.
std::vector<int> encode_run_c(const Tokenizer& t, const std::string& text, bool bos, bool eos) {
    std::vector<int> tokens;
    if (bos) tokens.push_back(Tokenizer::kBos);
    const auto push_bytes = [&](const std::string& bytes) {
        for (unsigned char b : bytes) tokens.push_back(b + Tokenizer::kByteOffset);
    };
    if (!text.empty()) {
        const int dummy_prefix = t.lookup(" ");
        if (dummy_prefix >= 0)
            tokens.push_back(dummy_prefix);
        else
            push_bytes(" ");
    }
    for (std::size_t i = 0; i < text.size();) {
        std::size_t end = i + 1;
        while (end < text.size() && end - i < 4 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) end++;
        const std::string codepoint = text.substr(i, end - i);
        const int id = t.lookup(codepoint);
        if (id >= 0)
            tokens.push_back(id);
        else
            push_bytes(codepoint);
        i = end;
    }
    for (;;) {
        float best_score = -1e10f;
        int best_id = -1;
        std::size_t best_idx = 0;
        for (std::size_t i = 0; i + 1 < tokens.size(); i++) {
            const int id = t.lookup(t.piece(tokens[i]) + t.piece(tokens[i + 1]));
            if (id >= 0 && t.score(id) > best_score) {
                best_score = t.score(id);
                best_id = id;
                best_idx = i;
            }
        }
        if (best_id < 0) break;
        tokens[best_idx] = best_id;
        tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best_idx) + 1);
    }
    if (eos) tokens.push_back(Tokenizer::kEos);
    return tokens;
}

}  // namespace

// =============================================================================================
// Tokenizer: loading

TEST_CASE("tokenizer loads pieces, scores and max_token_length", "[tokenizer]") {
    const std::vector<Entry> entries = {{0.0f, "<unk>"}, {-1.5f, "ab"}, {2.25f, "xyz"}, {0.0f, ""}};
    TempFile file(tokenizer_bytes(entries, 9));
    const Tokenizer t = Tokenizer::load(file.path(), 4);
    CHECK(t.vocab_size() == 4);
    CHECK(t.max_token_length() == 9);
    CHECK(t.piece(1) == "ab");
    CHECK(t.score(1) == -1.5f);
    CHECK(t.piece(2) == "xyz");
    CHECK(t.score(2) == 2.25f);
    CHECK(t.piece(3).empty());
    CHECK(t.lookup("xyz") == 2);
    CHECK(t.lookup("xy") == -1);
}

TEST_CASE("tokenizer load errors are kvlab::Error with one-line messages", "[tokenizer]") {
    const std::vector<Entry> entries = {{0.0f, "<unk>"}, {0.0f, "\n<s>\n"}, {0.0f, "\n</s>\n"}, {-1.0f, "abc"}};
    const std::string good = tokenizer_bytes(entries);
    const int n = static_cast<int>(entries.size());
    {
        TempFile ok(good);
        REQUIRE_NOTHROW(Tokenizer::load(ok.path(), n));
    }

    SECTION("missing file") {
        const std::string path = (fs::temp_directory_path() / "kvlab_test_tokenizer_does_not_exist.bin").string();
        const auto msg = error_of([&] { Tokenizer::load(path, n); });
        CHECK(contains(msg, "cannot open"));
        CHECK(contains(msg, path));
    }
    SECTION("a directory is unreadable") {
        const auto msg = error_of([&] { Tokenizer::load(fs::temp_directory_path().string(), n); });
        CHECK(contains(msg, "tokenizer"));
    }
    SECTION("a FIFO is refused without being opened (opening it would wait for a writer)") {
        TempFile fifo;
        REQUIRE(::mkfifo(fifo.path().c_str(), 0600) == 0);
        // Should load() open it after all, this writer lets it go after a second, so the test
        // fails on the message instead of hanging.
        std::thread writer([&] {
            std::this_thread::sleep_for(std::chrono::seconds(1));
            const int fd = ::open(fifo.path().c_str(), O_WRONLY | O_NONBLOCK);  // ENXIO when no one reads
            if (fd >= 0) ::close(fd);
        });
        const auto msg = error_of([&] { Tokenizer::load(fifo.path(), n); });
        writer.join();
        CHECK(contains(msg, "not a regular file"));
    }
    SECTION("empty file") {
        TempFile f("");
        CHECK(contains(error_of([&] { Tokenizer::load(f.path(), n); }), "truncated"));
    }
    SECTION("truncated mid-piece") {
        TempFile f(good.substr(0, good.size() - 1));
        const auto msg = error_of([&] { Tokenizer::load(f.path(), n); });
        CHECK(contains(msg, "truncated at entry 3 of 4"));
        CHECK(contains(msg, "2 of 3 bytes"));
    }
    SECTION("truncated mid-length") {
        // Cut inside entry 3's int32 length: 4 header + entries 0..2 + the score + 2 bytes.
        const std::size_t cut = 4 + (8 + 5) + (8 + 5) + (8 + 6) + 4 + 2;
        TempFile f(good.substr(0, cut));
        CHECK(contains(error_of([&] { Tokenizer::load(f.path(), n); }), "truncated at entry 3 of 4"));
    }
    SECTION("fewer entries than vocab_size") {
        TempFile f(good);
        const auto msg = error_of([&] { Tokenizer::load(f.path(), n + 1); });
        CHECK(contains(msg, "truncated at entry 4 of 5"));
    }
    SECTION("more entries than vocab_size") {
        TempFile f(good);
        const auto msg = error_of([&] { Tokenizer::load(f.path(), n - 1); });
        CHECK(contains(msg, "has more than vocab_size=3 entries: it does not fit this model"));
    }
    SECTION("negative length") {
        std::string bad = tokenizer_bytes({{0.0f, "<unk>"}});
        put_f32(bad, 0.0f);
        put_i32(bad, -7);
        TempFile f(bad);
        CHECK(contains(error_of([&] { Tokenizer::load(f.path(), 2); }), "negative length -7"));
    }
    SECTION("length above max_token_length") {
        TempFile f(tokenizer_bytes({{0.0f, "<unk>"}, {0.0f, "abcdef"}}, 5));
        CHECK(contains(error_of([&] { Tokenizer::load(f.path(), 2); }), "length 6 > max_token_length=5"));
    }
    SECTION("absurd max_token_length") {
        std::string bad;
        put_i32(bad, 1 << 30);
        bad += good.substr(4);
        TempFile f(bad);
        CHECK(contains(error_of([&] { Tokenizer::load(f.path(), n); }), "max_token_length=1073741824"));
    }
    SECTION("vocab_size <= 0") {
        TempFile f(good);
        CHECK(contains(error_of([&] { Tokenizer::load(f.path(), 0); }), "vocab_size must be positive"));
        CHECK(contains(error_of([&] { Tokenizer::load(f.path(), -3); }), "vocab_size must be positive"));
    }
    SECTION("a newline in the path does not break the one-line rule") {
        error_of([&] { Tokenizer::load("/nonexistent/dir\nwith newline/tok.bin", n); });
    }
}

TEST_CASE("a duplicated piece resolves to its lowest id", "[tokenizer]") {
    const Tokenizer t =
        load_entries(llama_layout({{0.0f, " "}, {0.0f, "a"}, {0.0f, "b"}, {-1.0f, "ab"}, {9.0f, "ab"}}));
    const int first = t.lookup("ab");
    CHECK(first == 3 + 256 + 3);
    CHECK(t.encode("ab", false, false) == std::vector<int>{t.lookup(" "), first});
}

TEST_CASE("token ids outside the vocabulary are errors", "[tokenizer]") {
    const Tokenizer& t = small_tokenizer();
    const int n = t.vocab_size();
    CHECK(error_of([&] { (void)t.piece(n); }) ==
          "token id " + std::to_string(n) + " is outside the vocabulary [0, " + std::to_string(n) + ")");
    CHECK(contains(error_of([&] { (void)t.piece(-1); }), "token id -1 is outside"));
    CHECK(contains(error_of([&] { (void)t.score(n); }), "outside the vocabulary"));
    CHECK(contains(error_of([&] { (void)t.decode(1, n + 5); }), "outside the vocabulary"));
    CHECK(contains(error_of([&] { (void)t.decode(1, -2); }), "outside the vocabulary"));
}

// =============================================================================================
// Tokenizer: encode / decode

TEST_CASE("encode adds BOS, the dummy prefix and EOS as run.c does", "[tokenizer]") {
    const Tokenizer& t = small_tokenizer();
    CHECK(t.encode("", false, false).empty());
    CHECK(t.encode("", true, true) == std::vector<int>{1, 2});
    const auto toks = t.encode("the", true, true);
    CHECK(pieces_of(t, toks) == std::vector<std::string>{"\n<s>\n", " the", "\n</s>\n"});
}

TEST_CASE("encode merges the best-scoring pair first", "[tokenizer]") {
    // "abc": with ab scored above bc we get [" ", ab, c]; the other way round [" ", a, bc].
    const auto encode_abc = [](float ab, float bc) {
        const Tokenizer t = load_entries(
            llama_layout({{-100.0f, " "}, {-100.0f, "a"}, {-100.0f, "b"}, {-100.0f, "c"}, {ab, "ab"}, {bc, "bc"}}));
        return pieces_of(t, t.encode("abc", false, false));
    };
    CHECK(encode_abc(-1.0f, -2.0f) == std::vector<std::string>{" ", "ab", "c"});
    CHECK(encode_abc(-2.0f, -1.0f) == std::vector<std::string>{" ", "a", "bc"});

    // Score, not position, decides.
    const Tokenizer t = load_entries(llama_layout({{-100.0f, " "},
                                                   {-100.0f, "a"},
                                                   {-100.0f, "b"},
                                                   {-100.0f, "c"},
                                                   {-100.0f, "d"},
                                                   {-5.0f, "ab"},
                                                   {-1.0f, "cd"},
                                                   {-3.0f, "bc"},
                                                   {-4.0f, "abcd"}}));
    // "bcd": cd (-1) beats the leftmost pair bc (-3); "bcd" is not a piece, so it stops there.
    CHECK(pieces_of(t, t.encode("bcd", false, false)) == std::vector<std::string>{" ", "b", "cd"});
    // "abcd": cd (-1), then ab (-5), the only pair left that merges, then abcd (-4) appears.
    CHECK(pieces_of(t, t.encode("abcd", false, false)) == std::vector<std::string>{" ", "abcd"});
}

TEST_CASE("encode breaks score ties on the first (leftmost) pair", "[tokenizer]") {
    const Tokenizer t = load_entries(llama_layout({{-100.0f, " "}, {-100.0f, "a"}, {-1.0f, "aa"}}));
    CHECK(pieces_of(t, t.encode("aaa", false, false)) == std::vector<std::string>{" ", "aa", "a"});
    CHECK(pieces_of(t, t.encode("aaaaa", false, false)) == std::vector<std::string>{" ", "aa", "aa", "a"});
}

TEST_CASE("encode never merges pieces scored at or below run.c's -1e10 sentinel", "[tokenizer]") {
    const Tokenizer t = load_entries(llama_layout({{0.0f, " "}, {0.0f, "a"}, {0.0f, "b"}, {-1e10f, "ab"}}));
    CHECK(pieces_of(t, t.encode("ab", false, false)) == std::vector<std::string>{" ", "a", "b"});
}

TEST_CASE("encode merges across BOS exactly as run.c (BOS takes part in merging)", "[tokenizer]") {
    const Tokenizer t = load_entries(llama_layout({{0.0f, " "}, {0.0f, "x"}, {5.0f, "\n<s>\n "}}));
    const auto toks = t.encode("x", true, false);
    CHECK(pieces_of(t, toks) == std::vector<std::string>{"\n<s>\n ", "x"});
}

TEST_CASE("encode falls back to byte tokens (id = byte + 3) for unknown codepoints", "[tokenizer]") {
    const Tokenizer t = load_entries(
        llama_layout({{0.0f, " "}, {0.0f, "a"}, {0.0f, "\xE2\x82\xAC"} /* euro sign */, {0.0f, "\x80\x80\x80\x80"}}));
    const int space = t.lookup(" "), a = t.lookup("a"), euro = t.lookup("\xE2\x82\xAC");
    const int stray4 = t.lookup("\x80\x80\x80\x80");
    // ASCII not in the vocabulary.
    CHECK(t.encode("a?", false, false) == std::vector<int>{space, a, '?' + 3});
    // A 2-byte codepoint (e acute) that is not a piece: both of its bytes.
    CHECK(t.encode("\xC3\xA9", false, false) == std::vector<int>{space, 0xC3 + 3, 0xA9 + 3});
    // A 3-byte codepoint that is a piece: one token.
    CHECK(t.encode("a\xE2\x82\xAC", false, false) == std::vector<int>{space, a, euro});
    // A 4-byte codepoint (grinning face) that is not: four tokens.
    CHECK(t.encode("\xF0\x9F\x98\x80", false, false) ==
          std::vector<int>{space, 0xF0 + 3, 0x9F + 3, 0x98 + 3, 0x80 + 3});
    // Stray continuation bytes group in runs of at most 4, as run.c's str_len < 4 caps them.
    CHECK(t.encode("\x80\x80\x80\x80\x80", false, false) == std::vector<int>{space, stray4, 0x80 + 3});
    // A NUL inside the std::string is a byte like any other.
    CHECK(t.encode(std::string("a\0a", 3), false, false) == std::vector<int>{space, a, 0 + 3, a});
}

TEST_CASE("encode errors when a needed id is outside a too-small vocabulary", "[tokenizer]") {
    // No byte tokens and no " ": run.c would emit out-of-range ids; we refuse.
    const Tokenizer t = load_entries({{0.0f, "<unk>"}, {0.0f, "<s>"}, {0.0f, "</s>"}, {0.0f, "a"}});
    CHECK(contains(error_of([&] { (void)t.encode("a", false, false); }), "byte-fallback"));
    const Tokenizer one = load_entries({{0.0f, "x"}});
    CHECK(contains(error_of([&] { (void)one.encode("", true, false); }), "BOS"));
    CHECK(contains(error_of([&] { (void)one.encode("", false, true); }), "EOS"));
}

TEST_CASE("decode strips the dummy-prefix space only after BOS", "[tokenizer]") {
    const Tokenizer& t = small_tokenizer();
    const int the = t.lookup(" the");
    REQUIRE(the >= 0);
    CHECK(t.decode(Tokenizer::kBos, the) == "the");
    CHECK(t.decode(0, the) == " the");
    CHECK(t.decode(Tokenizer::kEos, the) == " the");
    CHECK(t.decode(-1, the) == " the");
    CHECK(t.decode(Tokenizer::kBos, t.lookup(" ")).empty());
    CHECK(t.decode(Tokenizer::kBos, t.lookup("he")) == "he");
}

TEST_CASE("decode turns <0xXX> pieces into the raw byte", "[tokenizer]") {
    const Tokenizer t = load_entries(llama_layout({{0.0f, "<0xab>"}, {0.0f, "<0x4>"}, {0.0f, "<0x41>z"}}));
    CHECK(t.decode(0, 3 + 'A') == "A");
    CHECK(t.decode(0, 3 + '\n') == "\n");
    CHECK(t.decode(0, 3 + 0xFF) == "\xFF");
    CHECK(t.decode(0, 3 + 0x00) == std::string(1, '\0'));
    CHECK(t.decode(Tokenizer::kBos, 3 + ' ') == " ");  // a byte token is not a dummy prefix
    CHECK(t.decode(0, t.lookup("<0xab>")) == "\xAB");  // lower-case hex, as sscanf's %X accepts
    // Not of the exact form: printed as they are.
    CHECK(t.decode(0, t.lookup("<0x4>")) == "<0x4>");
    CHECK(t.decode(0, t.lookup("<0x41>z")) == "<0x41>z");
}

TEST_CASE("printable drops single non-printable bytes like run.c's safe_printf", "[tokenizer]") {
    CHECK(Tokenizer::printable("").empty());
    CHECK(Tokenizer::printable("a") == "a");
    CHECK(Tokenizer::printable(" ") == " ");
    CHECK(Tokenizer::printable("\n") == "\n");
    CHECK(Tokenizer::printable("\t") == "\t");
    CHECK(Tokenizer::printable("\r") == "\r");
    CHECK(Tokenizer::printable("~") == "~");
    CHECK(Tokenizer::printable("\x01").empty());
    CHECK(Tokenizer::printable("\x1b").empty());  // ESC: no terminal escape sequences
    CHECK(Tokenizer::printable("\x7f").empty());
    CHECK(Tokenizer::printable(std::string(1, '\0')).empty());
    CHECK(Tokenizer::printable("\xC3").empty());  // half a UTF-8 sequence
    CHECK(Tokenizer::printable("\xC3\xA9") == "\xC3\xA9");
    CHECK(Tokenizer::printable("\x01\x02") == "\x01\x02");  // only single bytes are filtered
}

TEST_CASE("encode/decode round trip on a handmade vocabulary", "[tokenizer]") {
    const Tokenizer& t = small_tokenizer();
    for (const std::string s : {"the", "The thing is an old song", "and then... hello, World!", "  two  spaces ",
                                "caf\xC3\xA9 \xE2\x82\xAC 5", "\n\ttabs\r\n"}) {
        INFO(s);
        const auto toks = t.encode(s, true, false);
        REQUIRE(!toks.empty());
        CHECK(toks.front() == Tokenizer::kBos);
        CHECK(decode_all(t, toks) == s);
    }
    // Merges happen: " the" and " and" each become one token.
    CHECK(pieces_of(t, t.encode("the and", false, false)) == std::vector<std::string>{" the", " and"});
}

TEST_CASE("property: decode(encode(s)) == s", "[tokenizer][property]") {
    const Tokenizer& t = small_tokenizer();

    rc::prop("printable ASCII round-trips after BOS", [&] {
        const auto s = *rc::gen::container<std::string>(rc::gen::inRange<char>(0x20, 0x7F));
        const auto toks = t.encode(s, true, false);
        RC_ASSERT(toks.front() == Tokenizer::kBos);
        RC_ASSERT(decode_all(t, toks) == s);
    });

    rc::prop("any bytes round-trip (byte fallback covers everything)", [&] {
        const auto s = *rc::gen::container<std::string>(rc::gen::arbitrary<char>());
        RC_ASSERT(decode_all(t, t.encode(s, true, false)) == s);
    });

    rc::prop("encode leaves no mergeable pair and only valid ids", [&] {
        const auto s = *rc::gen::container<std::string>(rc::gen::element('t', 'h', 'e', ' ', 'a', 'n', 'd', 'i', 'g'));
        const auto toks = t.encode(s, false, true);
        for (int id : toks) RC_ASSERT(id >= 0 && id < t.vocab_size());
        RC_ASSERT(toks.back() == Tokenizer::kEos);
        for (std::size_t i = 0; i + 2 < toks.size(); i++) {  // pairs before the EOS
            const int merged = t.lookup(t.piece(toks[i]) + t.piece(toks[i + 1]));
            // (computed first: RC_ASSERT decomposes its expression, so || would not short-circuit)
            const bool mergeable = merged >= 0 && t.score(merged) > -1e10f;
            RC_ASSERT(!mergeable);
        }
    });
}

TEST_CASE("property: the heap-based encoder makes run.c's merges, ties and sentinels included",
          "[tokenizer][property]") {
    rc::prop("encode equals run.c's rescanning loop on generated vocabularies and texts", [] {
        // Pieces over a tiny alphabet (so that many pairs merge) with scores from a small set (so
        // that ties are common), including -0.0 against +0.0, run.c's -1e10 sentinel and NaN, which
        // never merge; a 2-byte character and a control byte fall back to bytes or pieces.
        const std::vector<std::string> atoms = {"a", "b", "c", " ", "\xC3\xA9", "\x01"};
        const auto piece = rc::gen::map(rc::gen::container<std::vector<std::string>>(rc::gen::elementOf(atoms)),
                                        [](const std::vector<std::string>& parts) {
                                            std::string p;
                                            for (const auto& a : parts) p += a;
                                            return p;
                                        });
        const auto score = rc::gen::elementOf(std::vector<float>{-3.0f, -2.0f, -1.0f, -0.0f, 0.0f, 1.0f, -1e10f,
                                                                 std::numeric_limits<float>::quiet_NaN()});
        const auto n = *rc::gen::inRange(0, 30);
        std::vector<Entry> merges;
        for (const auto& a : {" ", "a", "b"}) merges.push_back({-100.0f, a});  // "c" and the rest: bytes
        for (int i = 0; i < n; i++)
            merges.push_back(
                {*score, *rc::gen::suchThat(piece, [](const std::string& p) { return !p.empty() && p.size() <= 8; })});
        const Tokenizer t = load_entries(llama_layout(merges));
        const std::string text = *rc::gen::map(rc::gen::container<std::vector<std::string>>(rc::gen::elementOf(atoms)),
                                               [](const std::vector<std::string>& parts) {
                                                   std::string s;
                                                   for (const auto& a : parts) s += a;
                                                   return s;
                                               });
        const bool bos = *rc::gen::arbitrary<bool>(), eos = *rc::gen::arbitrary<bool>();
        const std::vector<int> fast = t.encode(text, bos, eos);
        RC_ASSERT(fast == encode_run_c(t, text, bos, eos));
        // The early refusal's bound never exceeds the real count.
        RC_ASSERT(t.min_tokens(text, bos, eos) <= fast.size());
    });
}

TEST_CASE("min_tokens bounds the encoded length from the pieces' bytes, before any merge", "[tokenizer]") {
    const Tokenizer t = load_entries(llama_layout({{-100.0f, " "}, {-100.0f, "a"}, {-1.0f, "aa"}, {-2.0f, " aa"}}));
    // max_token_length is 6 ("<0x00>"); " aaaaaaa" + BOS ("\n<s>\n", 5 bytes) is 13 bytes: at least 3.
    CHECK(t.max_token_length() == 6);
    CHECK(t.min_tokens("aaaaaaa", true, false) == 3);
    CHECK(t.min_tokens("aaaaaaa", true, true) == 4);
    CHECK(t.min_tokens("", false, false) == 0);
    CHECK(t.min_tokens("", true, false) == 1);
    CHECK(t.encode("aaaaaaa", true, false).size() >= 3);
}

// =============================================================================================
// The real tokenizer (stories260K's tok512.bin); skipped when absent.

TEST_CASE("tok512.bin loads with vocab_size 512 and round-trips text", "[tok512]") {
    KVLAB_MODEL_FILE_OR_SKIP(path, "tok512.bin");
    const Tokenizer t = Tokenizer::load(path, 512);
    CHECK(t.vocab_size() == 512);
    CHECK(t.piece(Tokenizer::kBos) == "\n<s>\n");
    CHECK(t.piece(Tokenizer::kEos) == "\n</s>\n");
    CHECK(t.piece(3) == "<0x00>");
    CHECK(t.piece(258) == "<0xFF>");

    const std::string text = "Once upon a time";
    const auto toks = t.encode(text, true, false);
    REQUIRE(toks.size() >= 2);
    CHECK(toks.front() == Tokenizer::kBos);
    CHECK(toks.size() < text.size());        // merges happened
    CHECK(t.piece(toks[1]).front() == ' ');  // the dummy prefix merged into the first word
    CHECK(decode_all(t, toks) == text);

    const std::string story = "Lily and Tom went to the park. They saw a big, red ball!\nThe end.";
    CHECK(decode_all(t, t.encode(story, true, false)) == story);

    rc::prop("tok512: printable ASCII round-trips", [&] {
        const auto s = *rc::gen::container<std::string>(rc::gen::inRange<char>(0x20, 0x7F));
        RC_ASSERT(decode_all(t, t.encode(s, true, false)) == s);
    });
}

TEST_CASE("tok512.bin: the heap-based encoder equals run.c's loop on a few kB of text", "[tok512]") {
    KVLAB_MODEL_FILE_OR_SKIP(path, "tok512.bin");
    const Tokenizer t = Tokenizer::load(path, 512);
    std::string story;
    for (int i = 0; story.size() < 4000; i++)
        story += i % 3 ? "Lily and Tom went to the park. " : "They saw a big, red ball! \xE2\x9C\xA8 The end.\n";
    CHECK(t.encode(story, true, true) == encode_run_c(t, story, true, true));
}

TEST_CASE("tok512.bin refuses a vocab_size that is not the model's", "[tok512]") {
    KVLAB_MODEL_FILE_OR_SKIP(path, "tok512.bin");
    CHECK(contains(error_of([&] { Tokenizer::load(path, 511); }), "has more than vocab_size=511 entries"));
    CHECK(contains(error_of([&] { Tokenizer::load(path, 513); }), "truncated at entry 512 of 513"));
}

// =============================================================================================
// Sampler

TEST_CASE("xorshift RNG matches run.c's values", "[sampler]") {
    // Golden values computed independently (Python big-int arithmetic) from run.c's formulas.
    std::uint64_t state = 42;
    const std::uint32_t expected[] = {1456360119u, 3359763283u, 3393612768u, 4054632243u, 3283045847u};
    for (std::uint32_t e : expected) CHECK(kvlab::random_u32(state) == e);
    CHECK(state == 6045135835962859838ull);

    state = 1234567;
    CHECK(kvlab::random_f32(state) == 0.8243660926818848f);
    CHECK(kvlab::random_f32(state) == 0.6404565572738647f);
    CHECK(kvlab::random_f32(state) == 0.940166175365448f);
}

TEST_CASE("temperature 0 is argmax (first index of the max)", "[sampler]") {
    Sampler s(5, 0.0f, 0.9f, 7);
    std::vector<float> logits = {1.0f, 5.0f, -2.0f, 5.0f, 4.99f};
    CHECK(s.sample(logits) == 1);
    logits = {-std::numeric_limits<float>::infinity(), -3.0f, -3.0f, -10.0f, -4.0f};
    CHECK(s.sample(logits) == 1);
    logits = {0.0f, 0.0f, 0.0f, 0.0f, 0.1f};
    CHECK(s.sample(logits) == 4);
}

TEST_CASE("same seed gives the same sequence", "[sampler]") {
    const auto run = [](std::uint64_t seed, float top_p) {
        Sampler s(16, 0.8f, top_p, seed);
        std::vector<int> out;
        for (int step = 0; step < 200; step++) {
            std::vector<float> logits(16);
            for (int i = 0; i < 16; i++)
                logits[static_cast<std::size_t>(i)] = std::sin(0.7f * static_cast<float>(i + step));
            out.push_back(s.sample(logits));
        }
        return out;
    };
    for (float top_p : {0.0f, 0.9f, 1.0f}) {
        INFO("top_p " << top_p);
        CHECK(run(1234, top_p) == run(1234, top_p));
        CHECK(run(1234, top_p) != run(1235, top_p));
    }
}

TEST_CASE("multinomial sampling draws exactly one coin per token and walks the CDF", "[sampler]") {
    // Uniform over 4 tokens: the CDF 0.25, 0.5, 0.75, 1 is exact, so token = floor(coin * 4).
    Sampler s(4, 1.0f, 1.0f, 99);
    std::uint64_t shadow = 99;
    for (int k = 0; k < 500; k++) {
        std::vector<float> logits(4, 0.5f);
        const float coin = kvlab::random_f32(shadow);
        CHECK(s.sample(logits) == static_cast<int>(coin * 4.0f));
    }
}

TEST_CASE("multinomial sampling at temperature 1 matches the distribution", "[sampler]") {
    const std::vector<double> p = {0.2, 0.3, 0.5};
    const int draws = 20000;
    Sampler s(3, 1.0f, 0.0f, 2024);
    std::vector<int> counts(3, 0);
    for (int k = 0; k < draws; k++) {
        std::vector<float> logits = {static_cast<float>(std::log(p[0])), static_cast<float>(std::log(p[1])),
                                     static_cast<float>(std::log(p[2]))};
        counts[static_cast<std::size_t>(s.sample(logits))]++;
    }
    // Each count is Binomial(draws, p_i): sigma = sqrt(draws p (1-p)) ~ 57..71. Five sigma is
    // ~1 in 1.7 million per count for a fair sampler (and the seed is fixed, so no flakiness),
    // while a sampler off by 0.02 in any probability (400 draws, 6-7 sigma) fails.
    for (std::size_t i = 0; i < 3; i++) {
        const double mean = draws * p[i], sigma = std::sqrt(draws * p[i] * (1 - p[i]));
        INFO("token " << i << " count " << counts[i] << " expected " << mean << " +- 5*" << sigma);
        CHECK(std::abs(counts[i] - mean) < 5 * sigma);
    }
}

TEST_CASE("top-p keeps to the nucleus", "[sampler]") {
    // probs 0.6, 0.3, 0.05, 0.05: with top_p 0.8 the nucleus is {0, 1}, renormalised to 2/3, 1/3.
    const int draws = 20000;
    std::vector<int> counts(4, 0);
    Sampler s(4, 1.0f, 0.8f, 5);
    for (int k = 0; k < draws; k++) {
        std::vector<float> logits = {std::log(0.6f), std::log(0.3f), std::log(0.05f), std::log(0.05f)};
        counts[static_cast<std::size_t>(s.sample(logits))]++;
    }
    CHECK(counts[2] == 0);
    CHECK(counts[3] == 0);
    // Binomial(20000, 1/3): sigma ~67, so 5 sigma ~333; a sampler that forgot to rescale the
    // coin to the nucleus mass would give 0.4 (+1333) instead.
    const double sigma = std::sqrt(draws * (1.0 / 3) * (2.0 / 3));
    INFO("token 1 drawn " << counts[1] << " times, expected " << draws / 3.0);
    CHECK(std::abs(counts[1] - draws / 3.0) < 5 * sigma);
    CHECK(counts[0] + counts[1] == draws);

    // Equal probs with a tiny top_p: every token is under run.c's cutoff (where run.c reads out
    // of bounds); the nucleus is the first token in index order.
    Sampler tiny(2, 1.0f, 0.1f, 5);
    for (int k = 0; k < 50; k++) {
        std::vector<float> logits = {0.0f, 0.0f};
        CHECK(tiny.sample(logits) == 0);
    }
    // vocab_size 1: the cutoff divides by zero; the only token is returned.
    Sampler one(1, 1.0f, 0.5f, 5);
    std::vector<float> logit = {3.0f};
    CHECK(one.sample(logit) == 0);
}

TEST_CASE("property: top-p never samples outside the nucleus", "[sampler][property]") {
    rc::prop("sampled token is in the smallest prefix with mass > top_p", [] {
        const int n = *rc::gen::inRange(2, 40);
        const auto ints = *rc::gen::container<std::vector<int>>(static_cast<std::size_t>(n), rc::gen::inRange(-60, 60));
        const float top_p = static_cast<float>(*rc::gen::inRange(1, 100)) / 100.0f;
        const float temperature = static_cast<float>(*rc::gen::inRange(1, 30)) / 10.0f;
        const auto seed = *rc::gen::inRange<std::uint64_t>(1, std::numeric_limits<std::uint64_t>::max());
        RC_PRE(top_p < 1.0f);

        std::vector<float> logits(static_cast<std::size_t>(n));
        for (std::size_t i = 0; i < logits.size(); i++) logits[i] = 0.1f * static_cast<float>(ints[i]);

        // Reference probabilities in double; the nucleus boundary gets a small slack so float
        // rounding in the sampler cannot make a correct answer look wrong.
        std::vector<double> probs(logits.size());
        const double mx = *std::max_element(logits.begin(), logits.end()) / double{temperature};
        double sum = 0;
        for (std::size_t i = 0; i < probs.size(); i++) sum += probs[i] = std::exp(logits[i] / double{temperature} - mx);
        for (double& q : probs) q /= sum;
        std::vector<double> sorted = probs;
        std::sort(sorted.rbegin(), sorted.rend());
        double cumulative = 0, threshold = sorted.back();
        for (double q : sorted) {
            cumulative += q;
            if (cumulative > top_p + 1e-4) {
                threshold = q;
                break;
            }
        }

        Sampler s(n, temperature, top_p, seed);
        for (int k = 0; k < 20; k++) {
            std::vector<float> work = logits;
            const int tok = s.sample(work);
            RC_ASSERT(tok >= 0 && tok < n);
            RC_ASSERT(probs[static_cast<std::size_t>(tok)] >= threshold - 1e-6);
        }
    });
}

TEST_CASE("sampler rejects bad arguments", "[sampler]") {
    const float nan = kvlab::kNaN;
    const float inf = std::numeric_limits<float>::infinity();
    CHECK(contains(error_of([] { Sampler(0, 1.0f, 0.9f, 1); }), "vocab_size"));
    CHECK(contains(error_of([] { Sampler(-5, 1.0f, 0.9f, 1); }), "vocab_size"));
    CHECK(contains(error_of([] { Sampler(10, -0.1f, 0.9f, 1); }), "temperature"));
    CHECK(contains(error_of([&] { Sampler(10, nan, 0.9f, 1); }), "temperature"));
    CHECK(contains(error_of([&] { Sampler(10, inf, 0.9f, 1); }), "temperature"));
    CHECK(contains(error_of([] { Sampler(10, 1.0f, -0.01f, 1); }), "top_p"));
    CHECK(contains(error_of([] { Sampler(10, 1.0f, 1.01f, 1); }), "top_p"));
    CHECK(contains(error_of([&] { Sampler(10, 1.0f, nan, 1); }), "top_p"));
    CHECK_NOTHROW(Sampler(10, 0.0f, 0.0f, 1));
    CHECK_NOTHROW(Sampler(10, 2.0f, 1.0f, 1));

    Sampler s(4, 1.0f, 0.9f, 1);
    std::vector<float> three(3, 0.0f), five(5, 0.0f);
    CHECK(contains(error_of([&] { s.sample(three); }), "got 3 logits for vocab_size=4"));
    CHECK(contains(error_of([&] { s.sample(five); }), "got 5 logits"));
    std::vector<float> with_nan = {0.0f, nan, 1.0f, 2.0f};
    CHECK(contains(error_of([&] { s.sample(with_nan); }), "logits[1] is NaN"));
    std::vector<float> with_inf = {0.0f, inf, 1.0f, 2.0f};
    CHECK(contains(error_of([&] { s.sample(with_inf); }), "temperature"));
    std::vector<float> all_masked(4, -inf);
    CHECK(contains(error_of([&] { s.sample(all_masked); }), "temperature"));
    // -inf (a masked token) alongside finite logits is fine and never sampled.
    for (int k = 0; k < 100; k++) {
        std::vector<float> masked = {-inf, 0.0f, 0.0f, -inf};
        const int tok = s.sample(masked);
        CHECK((tok == 1 || tok == 2));
    }
}
