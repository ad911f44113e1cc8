// fuzz_tokenizer: llama2.c's tokenizer (core/tokenizer.h): load, encode, decode, on arbitrary bytes.
//
// Input: u16 vocab_size (little-endian; 0 means 1), u8 flags (bit 0: BOS, bit 1: EOS),
// u16 text length, the text, then the tokenizer.bin bytes. Seeds: tok512.bin (when
// ../shared/models has it) and small vocabularies with merges (fuzz/make_seeds.cpp), each with a
// few prompts.
// Checks: load throws kvlab::Error or gives exactly vocab_size pieces; encode throws kvlab::Error
// or returns ids inside the vocabulary, with BOS (alone, or merged into the first piece as run.c
// does) and EOS where asked; decode and printable take every id encode produced, and
// piece/score/decode refuse an id outside the vocabulary with an Error.
#include <cstdint>
#include <optional>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer.h"

using namespace kvlab;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static fuzz::MemFile file("tokenizer");
    fuzz::Input in(data, size);
    const int vocab_size = std::max<int>(1, in.u16());
    const std::uint8_t flags = in.u8();
    const bool bos = flags & 1, eos = flags & 2;
    const std::string text(in.bytes(in.u16()));
    const std::string& path = file.write(in.rest());

    std::optional<Tokenizer> t;
    try {
        t.emplace(Tokenizer::load(path, vocab_size));
    } catch (const Error&) {
        return 0;  // a refusal
    }
    FUZZ_CHECK(t->vocab_size() == vocab_size, "loaded %d pieces, asked for %d", t->vocab_size(), vocab_size);

    std::vector<int> ids;
    try {
        ids = t->encode(text, bos, eos);
    } catch (const Error&) {
        // A vocabulary without the special or byte-fallback ids the text needs.
    }
    if (!ids.empty()) {
        // BOS takes part in merging, as in run.c: the first piece starts with BOS's, or is BOS.
        FUZZ_CHECK(!bos || t->piece(ids.front()).starts_with(t->piece(Tokenizer::kBos)),
                   "encode(bos) does not start with BOS's piece");
        FUZZ_CHECK(!eos || ids.back() == Tokenizer::kEos, "encode(eos) does not end with EOS");
    }
    int prev = -1;
    for (int id : ids) {
        FUZZ_CHECK(id >= 0 && id < vocab_size, "encode produced id %d outside [0, %d)", id, vocab_size);
        (void)Tokenizer::printable(t->decode(prev, id));
        (void)t->score(id);
        FUZZ_CHECK(t->lookup(t->piece(id)) >= 0, "piece %d is not found by lookup", id);
        prev = id;
    }
    // Ids just outside the vocabulary are refused, never read.
    for (int bad : {-1, vocab_size, vocab_size + 1}) {
        bool refused = false;
        try {
            (void)t->decode(0, bad);
        } catch (const Error&) {
            refused = true;
        }
        FUZZ_CHECK(refused, "decode accepted id %d outside [0, %d)", bad, vocab_size);
    }
    return 0;
}
