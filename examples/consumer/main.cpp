// A program built against an installed kvlab (find_package or pkg-config, see README.md): it
// decodes a random model naively and with every exact cache variant, and checks that each
// cached step's logits equal the naive ones bit for bit. Exit 0 when all do, 1 otherwise.
//   usage: decode_both [seed] [steps] [variant]
// A variant named on the command line is checked alone: an approximate one (window, quantized)
// must be caught differing once the decode is long enough.
#include <kvlab/build_info.h>
#include <kvlab/cache_factory.h>
#include <kvlab/compare.h>
#include <kvlab/decode.h>
#include <kvlab/model.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// Greedy decode of `steps` tokens after `prompt`, naive and on `spec`'s cache side by side. Returns
// the first step whose logits differ in any bit, or -1.
int first_differing_step(const kvlab::Model& model, const kvlab::CacheSpec& spec, std::vector<int> tokens, int steps) {
    kvlab::NaiveDecoder naive(model);
    kvlab::CacheAndPool cache = kvlab::make_cache(model.config(), spec);
    kvlab::CachedDecoder cached(model, *cache.cache);
    std::vector<float> logits = cached.prefill(tokens);  // [vocab_size]
    for (int step = 0; step < steps; ++step) {
        const std::vector<float>& want = naive.forward(tokens);  // [vocab_size]: the whole prefix again
        if (kvlab::first_difference(want, logits)) return step;
        int next = 0;  // greedy: the largest logit
        for (int v = 1; v < int(logits.size()); ++v)
            if (logits[v] > logits[next]) next = v;
        tokens.push_back(next);
        logits = cached.decode(next);
    }
    return -1;
}

}  // namespace

int main(int argc, char** argv) try {
    const std::uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
    const int steps = argc > 2 ? std::atoi(argv[2]) : 12;
    std::vector<kvlab::Variant> variants = kvlab::exact_variants();
    if (argc > 3) {
        const std::optional<kvlab::Variant> v = kvlab::parse_variant(argv[3]);
        if (!v) throw std::runtime_error(std::string("no cache variant called ") + argv[3]);
        variants = {*v};
    }
    kvlab::Config config = kvlab::stories260k_shape();
    config.max_seq = 64;
    const kvlab::Model model = kvlab::random_model(config, seed);
    const std::vector<int> prompt{1, 403, 407, 261};
    std::printf("%s\n", kvlab::version_line().c_str());
    int failed = 0, checked = 0;
    for (const kvlab::Variant v : variants) {
        const int step = first_differing_step(model, kvlab::default_spec(v, config), prompt, steps);
        const std::string name(kvlab::to_string(v));
        if (step >= 0) std::printf("%-20s DIFFERS from naive decode at step %d\n", name.c_str(), step);
        failed += step >= 0, checked++;
    }
    std::printf("%d of %d cache variants equal naive decode bit for bit over %d steps (seed %llu)\n", checked - failed,
                checked, steps, static_cast<unsigned long long>(seed));
    return failed == 0 && checked > 0 ? 0 : 1;
} catch (const std::exception& e) {
    std::fprintf(stderr, "decode_both: error: %s\n", e.what());
    return 1;
}
