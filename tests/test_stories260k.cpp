// The real model: stories260K (llama2.c's TinyStories checkpoint, MIT) with its tokenizer.
// Skipped (exit 77) when ../shared/models is absent.
#include <catch2/catch.hpp>

#include "checkpoint.h"
#include "decode.h"
#include "sampler.h"
#include "test_util.h"
#include "tokenizer.h"

using namespace kvlab;
using kvlab::first_difference;

TEST_CASE("stories260K: 200 greedy steps from BOS reproduce llama2.c's recorded output, naive = cached bitwise",
          "[stories260k]") {
    KVLAB_MODEL_FILE_OR_SKIP(model_path, "stories260K.bin");
    KVLAB_MODEL_FILE_OR_SKIP(tok_path, "tok512.bin");
    const Model m = load_checkpoint(model_path);
    const Tokenizer tok = Tokenizer::load(tok_path, m.config().vocab_size);
    NaiveDecoder naive(m);
    CachedDecoder cached(m);
    std::vector<int> tokens = {Tokenizer::kBos};
    std::vector<float> logits = cached.prefill(tokens);
    std::string text;
    int equal_steps = 0;
    for (int step = 0; step < 200; step++) {
        const std::vector<float>& ln = naive.forward(tokens);
        const auto diff = first_difference(ln, logits);
        INFO("step " << step << ", T = " << tokens.size() << ": " << diff.value_or("equal"));
        REQUIRE(!diff);
        equal_steps++;
        const int next = argmax(logits);
        if (next == Tokenizer::kBos) break;
        text += Tokenizer::printable(tok.decode(tokens.back(), next));
        tokens.push_back(next);
        if (step + 1 < 200) logits = cached.decode(next);
    }
    CHECK(equal_steps == 200);
    CHECK(text == kvlab::test::kLlama2cExpected);
}

TEST_CASE("stories260K: the cache after the prompt holds 2 * 4 B * 5 * T * 4 * 8 bytes", "[stories260k]") {
    KVLAB_MODEL_FILE_OR_SKIP(model_path, "stories260K.bin");
    KVLAB_MODEL_FILE_OR_SKIP(tok_path, "tok512.bin");
    const Model m = load_checkpoint(model_path);
    const Tokenizer tok = Tokenizer::load(tok_path, m.config().vocab_size);
    CachedDecoder cached(m);
    const std::vector<int> prompt = tok.encode("Once upon a time", true, false);
    cached.prefill(prompt);
    CHECK(cached.cache().memory().used_bytes == 2 * 4 * 5 * std::int64_t(prompt.size()) * 4 * 8);
}
