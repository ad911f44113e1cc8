// Lab 6's grader: your memory formulas against `kvlab memory`'s (core/memory_model.h) for the
// published models and for generated shapes, against the bytes a real kvlab cache allocates, and
// your GQA head map inside kvlab's real cached attention (P1 with n_kv_heads < n_heads).
#include <memory>

#include "cpu_backend.h"
#include "decode.h"
#include "forwarding.h"
#include "grader.h"
#include "lab.h"

using namespace kvlab;

namespace {

const std::vector<int> kBits = {32, 16, 8, 4, 2};  // `kvlab memory`'s precisions

std::string kind_of(const PublishedShape& s) {
    if (s.mla_latent > 0) return "MLA";
    if (s.n_kv_heads == s.n_heads) return "MHA";
    return s.n_kv_heads == 1 ? "MQA" : "GQA";
}

std::string describe(const PublishedShape& s) {
    if (s.mla_latent > 0)
        return fmt::format("{} (n_layers {}, MLA: mla_latent {}, mla_rope {})", s.name, s.n_layers, s.mla_latent,
                           s.mla_rope);
    return fmt::format("{} (n_layers {}, n_heads {}, n_kv_heads {}, head_size {})", s.name, s.n_layers, s.n_heads,
                       s.n_kv_heads, s.head_size);
}

// A generated shape: standard attention with any divisor of n_heads as n_kv_heads, or MLA.
PublishedShape draw_shape(bool mla) {
    PublishedShape s;
    s.name = mla ? "a generated MLA shape" : "a generated shape";
    s.n_layers = draw(1, 128);
    s.n_kv_heads = draw(1, 64);
    s.n_heads = s.n_kv_heads * draw(1, 8);  // n_kv_heads divides n_heads
    s.head_size = draw(1, 256);
    if (mla) {
        s.mla_latent = draw(1, 1024);
        s.mla_rope = draw(0, 128);
    }
    return s;
}

// Yours against kvlab memory's for one shape and precision, with a hint for the usual slips.
void expect_bits(const PublishedShape& s, int bits) {
    lessons::log_case(fmt::format("bits_per_token({}, bits {})", describe(s), bits));
    const std::int64_t want = kv_bits_per_token(s, bits), got = lab06::bits_per_token(s, bits);
    if (got == want) return;
    std::string hint;
    if (2 * got == want)
        hint = ": yours is exactly half of it (what is cached beside each K row?)";
    else if (s.mla_latent > 0 && got == std::int64_t{s.n_layers} * s.mla_latent * bits)
        hint = ": you counted the latent only; MLA caches a decoupled RoPE key of mla_rope elements beside it";
    else if (s.mla_latent > 0)
        hint = ": MLA caches no per-head K or V (n_kv_heads and head_size say nothing), only what every head shares";
    fail(fmt::format("{} at {} bits per element: yours {} bits per token, kvlab memory's {}{}", describe(s), bits, got,
                     want, hint));
}

void check_kind() {
    for (const PublishedShape& s : published_shapes()) {
        lessons::log_case(fmt::format("attention_kind({})", describe(s)));
        if (lab06::attention_kind(s) != kind_of(s))
            fail(fmt::format("{}: yours \"{}\", it is {}", describe(s), lab06::attention_kind(s), kind_of(s)));
    }
    const PublishedShape s = draw_shape(draw(0, 1) == 1);
    lessons::log_case(fmt::format("attention_kind({})", describe(s)));
    if (lab06::attention_kind(s) != kind_of(s))
        fail(fmt::format("{}: yours \"{}\", it is {}", describe(s), lab06::attention_kind(s), kind_of(s)));
}

void check_standard_bits() {
    for (const PublishedShape& s : published_shapes())
        if (s.mla_latent == 0)
            for (int bits : kBits) expect_bits(s, bits);
    expect_bits(draw_shape(false), *rc::gen::elementOf(kBits));
}

void check_mla_bits() {
    for (const PublishedShape& s : published_shapes())
        if (s.mla_latent > 0)
            for (int bits : kBits) expect_bits(s, bits);
    expect_bits(draw_shape(true), *rc::gen::elementOf(kBits));
}

void expect_bytes(const PublishedShape& s, int bits, std::int64_t context, std::int64_t batch) {
    lessons::log_case(fmt::format("cache_bytes({}, bits {}, context {}, batch {})", describe(s), bits, context, batch));
    const std::int64_t want = kv_bytes(s, bits, context, batch), got = lab06::cache_bytes(s, bits, context, batch);
    if (got != want)
        fail(fmt::format("{} at {} bits, context {} x batch {}: yours {} bytes, kvlab memory's {} ({} bits in all{})",
                         describe(s), bits, context, batch, got, want, kv_bits_per_token(s, bits) * context * batch,
                         got + 1 == want ? ": round up to a whole byte" : ""));
}

void check_totals() {
    // `kvlab memory --context 8192 --batch 8`, then a generated shape, context and batch: odd
    // shapes at int2 and int4 end mid-byte.
    for (const PublishedShape& s : published_shapes())
        for (int bits : kBits) expect_bytes(s, bits, 8192, 8);
    const PublishedShape s = draw_shape(draw(0, 1) == 1);
    expect_bytes(s, *rc::gen::elementOf(kBits), draw(1, 1 << 20), draw(1, 64));
}

// The shape of a kvlab model, as `kvlab memory` would list it.
PublishedShape shape_of(const Config& c) {
    PublishedShape s;
    s.name = "kvlab model " + c.describe();
    s.n_layers = c.n_layers;
    s.n_heads = c.n_heads;
    s.n_kv_heads = c.n_kv_heads;
    s.head_size = c.head_size();
    return s;
}

void check_real_cache() {
    const Config c = draw_config();
    const ContiguousCache cache(c);
    const std::int64_t allocated = cache.memory().allocated_bytes;  // summed from the cache's buffers
    lessons::log_case(fmt::format("cache_bytes({}, bits 32, context {}, batch 1)", describe(shape_of(c)), c.max_seq));
    const std::int64_t got = lab06::cache_bytes(shape_of(c), 32, c.max_seq, 1);
    if (got != allocated)
        fail(fmt::format("{}: a kvlab cache of max_seq = {} fp32 positions allocates {} bytes; your formula says {}",
                         c.describe(), c.max_seq, allocated, got));
}

// The map is [n_heads], every entry a KV head: checked before anything reads through it.
std::string map_problem(const std::vector<int>& map, int n_heads, int n_kv_heads) {
    if (int(map.size()) != n_heads)
        return fmt::format("{} query heads over {} KV heads: your map has {} entries, not one per query head", n_heads,
                           n_kv_heads, map.size());
    for (int h = 0; h < n_heads; h++)
        if (map[std::size_t(h)] < 0 || map[std::size_t(h)] >= n_kv_heads)
            return fmt::format("{} query heads over {} KV heads: query head {} reads KV head {}, which does not exist",
                               n_heads, n_kv_heads, h, map[std::size_t(h)]);
    return "";
}

void check_head_map() {
    // Drawn as n_kv_heads and the group, so that a failure shrinks to the fewest heads that show it.
    const int n_kv_heads = draw(1, 16), group = draw(1, 8), n_heads = n_kv_heads * group;
    lessons::log_case(fmt::format("kv_head_map(n_heads {}, n_kv_heads {})", n_heads, n_kv_heads));
    const std::vector<int> map = lab06::kv_head_map(n_heads, n_kv_heads);
    if (const std::string p = map_problem(map, n_heads, n_kv_heads); !p.empty()) fail(p);
    for (int h = 0; h < n_heads; h++)
        if (map[std::size_t(h)] != h / group)
            fail(fmt::format("{} query heads over {} KV heads (groups of {} consecutive query heads): query head {} "
                             "reads KV head {}; it must read KV head {}",
                             n_heads, n_kv_heads, group, h, map[std::size_t(h)], h / group));
}

// The CPU backend, but cached attention reads through the student's head map instead of the one
// the decoder passes (core's kv_head_map). Everything else is forwarded as it is.
class HeadMapBackend final : public ForwardingBackend {
public:
    HeadMapBackend(CpuBackend& cpu, std::vector<int> map) : ForwardingBackend(cpu), map_(std::move(map)) {}
    std::string_view name() const override { return "cpu with your head map"; }
    void attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                   const std::int64_t* slots, int max_n, const int* kv_head, int probe_row, float* probe) override {
        (void)kv_head;  // the decoder's map; the student's is read instead
        inner().attention(ex, att, q, rows, n_rows, l, slots, max_n, map_.data(), probe_row, probe);
    }

private:
    std::vector<int> map_;  // [n_heads] host memory, as the CPU backend reads it
};

// draw_config's tiny models, but always grouped: 2-6 query heads over a proper divisor.
Config draw_gqa_config() {
    Config c;
    c.n_layers = draw(1, 3);
    c.n_heads = draw(2, 6);
    std::vector<int> proper;  // divisors of n_heads below n_heads
    for (int d = 1; d < c.n_heads; d++)
        if (c.n_heads % d == 0) proper.push_back(d);
    c.n_kv_heads = *rc::gen::elementOf(proper);
    c.dim = c.n_heads * draw(1, 8);
    c.hidden_dim = draw(1, 16);
    c.vocab_size = draw(1, 32);
    c.max_seq = draw(1, 20);
    return c;
}

std::string listed(const std::vector<int>& v) {
    std::string s;
    for (int x : v) {
        if (!s.empty()) s += ",";
        s += std::to_string(x);
    }
    return s;
}

void check_p1_gqa() {
    const Config c = draw_gqa_config();
    lessons::log_case(
        fmt::format("kv_head_map(n_heads {}, n_kv_heads {}) for {}", c.n_heads, c.n_kv_heads, c.describe()));
    std::vector<int> map = lab06::kv_head_map(c.n_heads, c.n_kv_heads);
    if (const std::string p = map_problem(map, c.n_heads, c.n_kv_heads); !p.empty()) fail(p);
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const std::vector<int> tokens = draw_tokens(c, draw(1, c.max_seq));
    const int prompt = draw(1, int(tokens.size()));
    CpuBackend cpu(m);
    HeadMapBackend backend(cpu, map);
    ContiguousCache cache(c);
    NaiveDecoder naive(m);  // kvlab's own head map
    CachedDecoder cached(backend, cache);
    const std::span<const int> all(tokens);
    for (int T = prompt; T <= int(tokens.size()); T++) {
        lessons::log_case(fmt::format("{}, your map [{}], {} tokens, prompt {}: cached decode at T = {}", c.describe(),
                                      listed(map), tokens.size(), prompt, T));
        const std::vector<float>& got = T == prompt ? cached.prefill(all.first(T)) : cached.decode(tokens[T - 1]);
        const std::string diff = lessons::describe_difference(naive.forward(all.first(T)), got);
        if (!diff.empty())
            fail(fmt::format("{} (groups of {}), your map [{}]: at T = {} cached attention through your map differs "
                             "from naive decode: {}",
                             c.describe(), c.group(), listed(map), T, diff));
    }
}

}  // namespace

int main(int argc, char** argv) {
    lessons::Lab lab{6, "memory: MHA, GQA, MQA, MLA", LAB_SOURCE, {}};
    lab.checks = {
        {"kind: MHA, GQA, MQA or MLA from the shape", 1, check_kind},
        {"MHA/GQA/MQA bits per token == kvlab memory's", 2, check_standard_bits},
        {"MLA bits per token == kvlab memory's", 1, check_mla_bits},
        {"totals: context x batch, rounded up to whole bytes", 1, check_totals},
        {"fp32: your bytes == what a kvlab cache allocates", 1, check_real_cache},
        {"GQA head map: groups of consecutive query heads", 2, check_head_map},
        {"P1 with n_kv_heads < n_heads through your map, bitwise", 2, check_p1_gqa},
    };
    return lessons::grade(lab, argc, argv);
}
