#include "mla_property.h"

#include <fmt/format.h>

#include "compare.h"
#include "property.h"

namespace kvlab {

MlaConfig draw_mla_config() {
    MlaConfig c;
    const int n_heads = draw(1, 4), head_size = draw(1, 8);
    c.base = Config{n_heads * head_size, draw(1, 16), draw(1, 3), n_heads, n_heads, draw(1, 32), draw(1, 20)};
    c.rank = draw(1, 8);
    c.rope_dim = 2 * draw(0, 2);
    return c;
}

void mla_property(MlaForm form, MlaForm naive_form, const std::function<void(int T)>& reached) {
    const MlaConfig c = draw_mla_config();
    const MlaModel m = random_mla_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const std::vector<int> tokens = draw_tokens(c.base, draw(1, c.base.max_seq));
    if (reached) reached(int(tokens.size()));
    MlaCache cache(c);
    MlaDecoder cached(m, cache, form);
    const std::string what =
        fmt::format("mla {} against naive {}, {}", to_string(form), to_string(naive_form), c.describe());
    for (int T = 0; T < int(tokens.size());) {
        const int n = draw(1, int(tokens.size()) - T);  // a chunk of any size, a decode step being 1
        const std::vector<float> got = cached.prefill(std::span(tokens).subspan(std::size_t(T), std::size_t(n)));
        T += n;
        const std::vector<float> want = mla_naive(m, std::span(tokens).first(std::size_t(T)), naive_form);
        if (auto diff = first_difference(want, got))
            fail(fmt::format("{}: logits differ from naive at T = {} (chunk of {}), {}", what, T, n, *diff));
    }
    if (cache.used_bytes() != std::int64_t(sizeof(float)) * c.base.n_layers * cache.length() * c.row())
        fail(fmt::format("{}: the cache holds {} B for {} positions", what, cache.used_bytes(), cache.length()));
}

}  // namespace kvlab
