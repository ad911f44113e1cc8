// fuzz_plugin_stdio: a cache plugin served over a pipe (cli/plugin_stdio.h) whose server answers
// with arbitrary bytes.
//
// Input: the server's side of the conversation, one answer a line (the first answers hello).
// Seeds: answers that fit every request, with slots in a few orders (fuzz/make_seeds.cpp).
// Checks: whatever the answers, kvlab ends in a kvlab::Error or a run whose every logit equals
// naive decode bit for bit; it never crashes, hangs or reads a slot it did not check (the
// sanitizers watch every row read).
#include <cstdint>
#include <cstdio>
#include <vector>

#include "decode.h"
#include "fuzz_util.h"
#include "model.h"
#include "plugin_stdio.h"

using namespace kvlab;

namespace {

// dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq
const Config kShape{8, 8, 2, 2, 1, 16, 8};

void expect_naive(const Model& m, const std::vector<int>& tokens, const std::vector<float>& logits) {
    NaiveDecoder naive(m);
    FUZZ_CHECK(naive.forward(tokens) == logits, "plugin over stdio: logits differ from naive decode at T = %zu",
               tokens.size());
}

// The scenario: a prompt (with prefix reuse when offered), decode, a rollback, a fork when
// offered, a second request sharing the prompt.
void run(const CachePlugin& plugin, const Model& m) {
    PluginPool pool(kShape, plugin, host_memory(), 0, 3, 2);
    PluginCache a(pool, 0);
    CachedDecoder da(m, a);
    std::vector<int> t{1, 2, 3, 4};
    expect_naive(m, t, da.extend(t));
    t.push_back(5);
    expect_naive(m, t, da.decode(5));
    a.truncate(3);
    t = {1, 2, 3, 6};
    expect_naive(m, t, da.decode(6));
    if (plugin.can_fork()) {
        const auto b = a.fork(1);
        CachedDecoder db(m, *b);
        expect_naive(m, {1, 2, 3, 6, 7}, db.decode(7));
    }
    PluginCache c(pool, 2);
    CachedDecoder dc(m, c);
    expect_naive(m, {1, 2, 3, 6, 8}, dc.extend(std::vector<int>{1, 2, 3, 6, 8}));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const Model m = random_model(kShape, 5);
    std::vector<std::uint8_t> bytes(data, data + size);
    bytes.push_back('\n');  // fmemopen needs a non-empty buffer
    std::FILE* in = fmemopen(bytes.data(), bytes.size(), "r");
    std::FILE* out = std::fopen("/dev/null", "w");
    FUZZ_CHECK(in && out, "fuzz_plugin_stdio: no stream");
    try {
        const std::unique_ptr<CachePlugin> plugin = stdio_plugin(in, out);
        run(*plugin, m);
    } catch (const Error&) {
    }
    std::fclose(in);
    std::fclose(out);
    return 0;
}
