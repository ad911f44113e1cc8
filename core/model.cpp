#include "model.h"

#include <fmt/format.h>

#include <cassert>
#include <cmath>
#include <cstring>

namespace kvlab {

Weights::Weights(const Config& c, bool shared) : config(c), shared_classifier(shared) {
    c.validate();
    check_size(fmt::format("a model of {} parameters ({})", c.n_params(shared), c.describe()), c.n_params(shared),
               sizeof(float));
    const std::size_t L = c.n_layers, dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim, vocab = c.vocab_size;
    token_embedding.assign(vocab * dim, 0.0f);
    rms_att.assign(L * dim, 0.0f);
    wq.assign(L * dim * dim, 0.0f);
    wk.assign(L * dim * kv_dim, 0.0f);
    wv.assign(L * dim * kv_dim, 0.0f);
    wo.assign(L * dim * dim, 0.0f);
    rms_ffn.assign(L * dim, 0.0f);
    w1.assign(L * dim * hidden, 0.0f);
    w2.assign(L * hidden * dim, 0.0f);
    w3.assign(L * dim * hidden, 0.0f);
    rms_final.assign(dim, 0.0f);
    wcls.assign(dim * vocab, 0.0f);
}

void Weights::check_shapes() const {
    const Config& c = config;
    const std::size_t L = c.n_layers, dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim, vocab = c.vocab_size;
    assert(token_embedding.size() == vocab * dim);
    assert(rms_att.size() == L * dim && rms_ffn.size() == L * dim);
    assert(wq.size() == L * dim * dim && wo.size() == L * dim * dim);
    assert(wk.size() == L * dim * kv_dim && wv.size() == L * dim * kv_dim);
    assert(w1.size() == L * dim * hidden && w3.size() == L * dim * hidden && w2.size() == L * hidden * dim);
    assert(rms_final.size() == dim && wcls.size() == dim * vocab);
    (void)L, (void)dim, (void)kv_dim, (void)hidden, (void)vocab, (void)c;
}

void Weights::tie_classifier() {
    const int dim = config.dim, vocab = config.vocab_size;
    for (int v = 0; v < vocab; v++)
        for (int i = 0; i < dim; i++) wcls[std::size_t(i) * vocab + v] = token_embedding[std::size_t(v) * dim + i];
}

std::uint64_t Weights::fingerprint() const {
    std::uint64_t h = 1469598103934665603ull;
    auto mix_bytes = [&h](const void* p, std::size_t n) {
        const auto* b = static_cast<const unsigned char*>(p);
        for (std::size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    };
    const int fields[] = {config.dim,        config.hidden_dim, config.n_layers, config.n_heads,
                          config.n_kv_heads, config.vocab_size, config.max_seq,  shared_classifier ? 1 : 0};
    mix_bytes(fields, sizeof fields);
    for (const auto* t : {&token_embedding, &rms_att, &wq, &wk, &wv, &wo, &rms_ffn, &w1, &w2, &w3, &rms_final, &wcls})
        mix_bytes(t->data(), t->size() * sizeof(float));
    return h;
}

RopeTable::RopeTable(int max_seq_, int head_size, float theta) : max_seq(max_seq_), n_pairs(head_size / 2) {
    cos.assign(std::size_t(max_seq) * n_pairs, 0.0f);
    sin.assign(std::size_t(max_seq) * n_pairs, 0.0f);
    for (int j = 0; j < n_pairs; j++) {
        // llama2.c: freq = 1 / 10000^(head_dim / head_size) with head_dim = 2j, angle = pos * freq in float.
        const float freq = 1.0f / std::pow(theta, float(2 * j) / float(head_size));
        for (int pos = 0; pos < max_seq; pos++) {
            const float angle = float(pos) * freq;
            // Rounded from double: glibc's double cos/sin are accurate to well under an ulp of float,
            // and the table is computed once, here, then shared by every path (GPU included).
            cos[std::size_t(pos) * n_pairs + j] = float(std::cos(double(angle)));
            sin[std::size_t(pos) * n_pairs + j] = float(std::sin(double(angle)));
        }
    }
}

Model::Model(Weights weights) : w(std::move(weights)) {
    w.check_shapes();
    const Config& c = w.config;
    rope = RopeTable(c.max_seq, c.head_size());
}

std::uint64_t SplitMix64::next() { return splitmix64_finalize(state += 0x9e3779b97f4a7c15ull); }

double SplitMix64::uniform() { return double(next() >> 11) * 0x1.0p-53; }

double SplitMix64::gaussian() {
    double s = 0.0;
    for (int i = 0; i < 12; i++) s += uniform();
    return s - 6.0;
}

Model random_model(const Config& c, std::uint64_t seed, bool shared_classifier) {
    Weights w(c, shared_classifier);
    SplitMix64 rng(seed);
    // Linear maps get standard deviation 1/sqrt(fan_in) so activations keep unit scale through
    // the layers; sqrt is correctly rounded by IEEE 754, so this stays machine-independent.
    auto fill = [&rng](std::vector<float>& t, double stddev) {
        for (float& x : t) x = float(rng.gaussian() * stddev);
    };
    auto fill_norm = [&rng](std::vector<float>& t) {
        for (float& x : t) x = float(1.0 + 0.1 * rng.gaussian());
    };
    // Embedding rows of unit norm on average: with the classifier tied to the embedding, larger
    // rows would make every random model predict its current token with probability ~1.
    fill(w.token_embedding, 1.0 / std::sqrt(double(c.dim)));
    fill_norm(w.rms_att);
    fill(w.wq, 1.0 / std::sqrt(double(c.dim)));
    fill(w.wk, 1.0 / std::sqrt(double(c.dim)));
    fill(w.wv, 1.0 / std::sqrt(double(c.dim)));
    fill(w.wo, 1.0 / std::sqrt(double(c.dim)));
    fill_norm(w.rms_ffn);
    fill(w.w1, 1.0 / std::sqrt(double(c.dim)));
    fill(w.w2, 1.0 / std::sqrt(double(c.hidden_dim)));
    fill(w.w3, 1.0 / std::sqrt(double(c.dim)));
    fill_norm(w.rms_final);
    if (shared_classifier)
        w.tie_classifier();
    else
        fill(w.wcls, 1.0 / std::sqrt(double(c.dim)));
    return Model(std::move(w));
}

}  // namespace kvlab
