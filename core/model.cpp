#include "model.h"

#include <fmt/format.h>

#include <cassert>
#include <cmath>
#include <cstring>

#include "mapped_file.h"

namespace kvlab {

namespace {

// Places w's tensors in `floats`, in the legacy file's order (shared: wcls is the embedding).
void place_tensors(Weights& w, float* floats) {
    const Config& c = w.config;
    const std::size_t L = c.n_layers, dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim, vocab = c.vocab_size;
    auto take = [&floats](std::size_t n) {
        const std::span<float> t(floats, n);
        floats += n;
        return t;
    };
    w.token_embedding = take(vocab * dim);
    w.rms_att = take(L * dim);
    w.wq = take(L * dim * dim);
    w.wk = take(L * kv_dim * dim);
    w.wv = take(L * kv_dim * dim);
    w.wo = take(L * dim * dim);
    w.rms_ffn = take(L * dim);
    w.w1 = take(L * hidden * dim);
    w.w2 = take(L * dim * hidden);
    w.w3 = take(L * hidden * dim);
    w.rms_final = take(dim);
    w.wcls = w.shared_classifier ? w.token_embedding : take(vocab * dim);
}

}  // namespace

namespace {

// A model's floats [n_params], zero-filled, with their charge on the memory budget.
struct ChargedFloats {
    MemoryCharge charge;
    std::unique_ptr<float[]> floats;
    ChargedFloats(const Config& c, std::int64_t n)
        : charge(fmt::format("a model of {} parameters ({})", n, c.describe()), n * std::int64_t(sizeof(float))),
          floats(new float[std::size_t(n)]()) {}
};

}  // namespace

Weights::Weights(const Config& c, bool shared) : config(c), shared_classifier(shared) {
    c.validate();
    const std::int64_t n = c.n_params(shared);
    check_size(fmt::format("a model of {} parameters ({})", n, c.describe()), n, sizeof(float));
    auto held = std::make_shared<ChargedFloats>(c, n);
    place_tensors(*this, held->floats.get());
    storage_ = std::move(held);
}

Weights::Weights(const Config& c, bool shared, std::shared_ptr<const MappedFile> file)
    : config(c), shared_classifier(shared), mapped_(file.get()) {
    storage_ = std::move(file);
}

Weights::Weights(const Weights& other) : config(other.config), shared_classifier(other.shared_classifier) {
    if (!other.storage_) return;  // a default-constructed Weights
    auto held = std::make_shared<ChargedFloats>(config, config.n_params(shared_classifier));
    place_tensors(*this, held->floats.get());
    const std::vector<std::span<float>> from = other.tensors(), to = tensors();
    for (std::size_t i = 0; i < from.size(); i++) std::copy(from[i].begin(), from[i].end(), to[i].begin());
    storage_ = std::move(held);
}

Weights& Weights::operator=(const Weights& other) {
    if (this != &other) *this = Weights(other);
    return *this;
}

std::vector<std::span<float>> Weights::tensors() const {
    std::vector<std::span<float>> t = {token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final};
    if (!shared_classifier) t.push_back(wcls);
    return t;
}

void Weights::check_shapes() const {
    const Config& c = config;
    const std::size_t L = c.n_layers, dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim, vocab = c.vocab_size;
    assert(token_embedding.size() == vocab * dim);
    assert(rms_att.size() == L * dim && rms_ffn.size() == L * dim);
    assert(wq.size() == L * dim * dim && wo.size() == L * dim * dim);
    assert(wk.size() == L * kv_dim * dim && wv.size() == L * kv_dim * dim);
    assert(w1.size() == L * hidden * dim && w3.size() == L * hidden * dim && w2.size() == L * dim * hidden);
    assert(rms_final.size() == dim && wcls.size() == vocab * dim);
    assert(!shared_classifier || wcls.data() == token_embedding.data());
    (void)L, (void)dim, (void)kv_dim, (void)hidden, (void)vocab, (void)c;
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
    for (const std::span<float> t : tensors()) mix_bytes(t.data(), t.size() * sizeof(float));
    return h;
}

std::vector<float> in_out_copy(std::span<const float> w, int layers, int n_out, int n_in) {
    assert(w.size() == std::size_t(layers) * n_out * n_in);
    std::vector<float> t(w.size());  // [layers, n_in, n_out]
    for (std::size_t l = 0; l < std::size_t(layers); l++)
        for (std::size_t o = 0; o < std::size_t(n_out); o++)
            for (std::size_t k = 0; k < std::size_t(n_in); k++)
                t[(l * n_in + k) * n_out + o] = w[(l * n_out + o) * n_in + k];
    return t;
}

RopeTable::RopeTable(int max_seq_, int head_size, float theta) : max_seq(max_seq_), n_pairs(head_size / 2) {
    // Charged before they are filled: a small model with a long max_seq can have large tables.
    charge = MemoryCharge(fmt::format("the RoPE tables ({} positions x {} pairs, cos and sin)", max_seq, n_pairs),
                          2 * std::int64_t(max_seq) * n_pairs * std::int64_t(sizeof(float)));
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
    auto fill = [&rng](std::span<float> t, double stddev) {
        for (float& x : t) x = float(rng.gaussian() * stddev);
    };
    // Matrices are drawn in (in, out) order, element W[l][o][k] at draw l*n_in*n_out + k*n_out + o:
    // the order kvlab drew them in before it kept llama2.c's layout, so a seed names the same model.
    auto fill_matrix = [&rng](std::span<float> t, int layers, int n_out, int n_in, double stddev) {
        for (std::size_t l = 0; l < std::size_t(layers); l++)
            for (std::size_t k = 0; k < std::size_t(n_in); k++)
                for (std::size_t o = 0; o < std::size_t(n_out); o++)
                    t[(l * n_out + o) * n_in + k] = float(rng.gaussian() * stddev);
    };
    auto fill_norm = [&rng](std::span<float> t) {
        for (float& x : t) x = float(1.0 + 0.1 * rng.gaussian());
    };
    const int L = c.n_layers, dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
    // Embedding rows of unit norm on average: with the classifier tied to the embedding, larger
    // rows would make every random model predict its current token with probability ~1.
    fill(w.token_embedding, 1.0 / std::sqrt(double(c.dim)));
    fill_norm(w.rms_att);
    fill_matrix(w.wq, L, dim, dim, 1.0 / std::sqrt(double(c.dim)));
    fill_matrix(w.wk, L, kv_dim, dim, 1.0 / std::sqrt(double(c.dim)));
    fill_matrix(w.wv, L, kv_dim, dim, 1.0 / std::sqrt(double(c.dim)));
    fill_matrix(w.wo, L, dim, dim, 1.0 / std::sqrt(double(c.dim)));
    fill_norm(w.rms_ffn);
    fill_matrix(w.w1, L, hidden, dim, 1.0 / std::sqrt(double(c.dim)));
    fill_matrix(w.w2, L, dim, hidden, 1.0 / std::sqrt(double(c.hidden_dim)));
    fill_matrix(w.w3, L, hidden, dim, 1.0 / std::sqrt(double(c.dim)));
    fill_norm(w.rms_final);
    if (!shared_classifier) fill_matrix(w.wcls, 1, c.vocab_size, dim, 1.0 / std::sqrt(double(c.dim)));
    return Model(std::move(w));
}

}  // namespace kvlab
