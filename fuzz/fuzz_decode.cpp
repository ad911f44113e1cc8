// fuzz_decode: cached decode against naive decode on fuzzed small checkpoints (P1 and P2 of the
// README, on weights nobody chose).
//
// Input: u8 cache variant (one of the registry's exact ones, core/cache_factory.h, at its defaults),
// u8 block size and KV format (1 + b % 8, for the variants with a block size; the format
// kKVFormats[b / 8 % 7], for those that take one, else fp32), u8 prompt length P (1 + b % 8), u8 decode
// steps D (b % 8), P + D token bytes (each taken mod vocab_size), then a llama2.c checkpoint.
// Seeds: tiny `kvlab export` checkpoints behind a few headers (fuzz/make_seeds.cpp).
// Checks, after the prefill and after every decode step:
//   - the cached decoder's logits equal naive decode of the whole sequence bit for bit (the
//     format-aware naive decode, storing K and V in the cache's format);
//   - they equal a second cached decoder fed one token at a time (prefill == stepwise decode).
// Non-finite values: NUMERICS.md's argument needs finite activations. Naive decode's masked
// entries add 0 * v for rows the cached path never reads, and 0 * inf is NaN, so a model whose
// activations overflow may legitimately give naive != cached. Such a model's logits are never all
// finite, though: an inf or NaN in any V row that row T-1 attends to, or in a row of an earlier
// layer, reaches row T-1 and every logit. So: when the reference's logits are all finite, the
// other's must match them bit for bit; when they are not, the other's must not be all finite
// either (which NaN payloads and where are not compared). Checkpoints that fail to load, or whose
// cache does not fit the parameters (a block larger than max_seq), are refusals and fine.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cache_factory.h"
#include "checkpoint.h"
#include "compare.h"
#include "decode.h"
#include "fuzz_util.h"

using namespace kvlab;

namespace {

bool all_finite(const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// `got` against `want` (the reference) under the rule above.
void expect_same(const std::vector<float>& want, const std::vector<float>& got, const char* what, int T) {
    if (!all_finite(want)) {
        FUZZ_CHECK(!all_finite(got), "%s at T=%d: the reference's logits are not all finite, these are", what, T);
        return;
    }
    const auto diff = first_difference(want, got);
    FUZZ_CHECK(!diff, "%s at T=%d: logits differ from the reference: %s", what, T, diff ? diff->c_str() : "");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static fuzz::MemFile file("decode-model");
    static const std::vector<Variant> exact = exact_variants();
    fuzz::Input in(data, size);
    const Variant variant = exact[in.u8() % exact.size()];
    const int block_and_format = in.u8(), block_size = 1 + block_and_format % 8;
    const KVFormat format = variant_info(variant).kv_formats
                                ? kKVFormats[std::size_t(block_and_format / 8) % std::size(kKVFormats)]
                                : KVFormat::fp32;
    const int P = 1 + in.u8() % 8, D = in.u8() % 8;
    std::vector<int> tokens(std::size_t(P + D));
    for (int& t : tokens) t = in.u8();

    try {
        const Model m = load_checkpoint(file.write(in.rest()));
        const Config& c = m.config();
        // Small models only: the RoPE table and a contiguous cache are sized by max_seq.
        if (std::int64_t{c.max_seq} * c.head_size() > (std::int64_t{1} << 16) || c.max_seq < P) return 0;
        tokens.resize(std::size_t(std::min(P + D, c.max_seq)));
        for (int& t : tokens) t %= c.vocab_size;
        CacheSpec spec = default_spec(variant, c);
        if (const VariantParam* p = find_param(variant_info(variant), "block_size")) p->set(spec, block_size);
        spec.model_identity = m.w.fingerprint();
        spec.kv_format = format;

        NaiveDecoder naive(m, 1);
        naive.kv_format = format;
        CacheAndPool cp = make_cache(c, spec);
        CachedDecoder cached(m, *cp.cache, 1);
        CachedDecoder stepwise(m, 1);  // contiguous-head, one token per call
        stepwise.cache().set_kv_format(format);

        std::vector<float> want, got, step;
        for (int T = 1; T <= int(tokens.size()); T++) {
            step = stepwise.decode(tokens[std::size_t(T - 1)]);
            if (T < P) continue;
            const std::span<const int> seq(tokens.data(), std::size_t(T));
            got = T == P ? cached.prefill(seq) : cached.decode(tokens[std::size_t(T - 1)]);
            want = naive.forward(seq);
            expect_same(want, got, "cached decode against naive decode", T);
            expect_same(got, step, "token-at-a-time decode against the prefill", T);
        }
    } catch (const Error&) {
        // A checkpoint that does not load, or a cache that does not fit its parameters.
    }
    return 0;
}
