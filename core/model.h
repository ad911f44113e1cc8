// kvlab core: weights, RoPE tables and deterministic random models.
#pragma once

#include <cstdint>
#include <vector>

#include "config.h"

namespace kvlab {

// Weights of a llama2.c-style model. Every matrix a kernel multiplies by is stored [in][out]
// (transposed from llama2.c's [out][in]) so the matrix-product kernel can accumulate many
// outputs at once, each in k order; see NUMERICS.md.
struct Weights {
    Config config;
    bool shared_classifier = true;  // llama2.c: the classifier is the token embedding

    std::vector<float> token_embedding;  // [vocab_size, dim]
    std::vector<float> rms_att;          // [n_layers, dim]
    std::vector<float> wq;               // [n_layers, dim, dim]          (in, out)
    std::vector<float> wk;               // [n_layers, dim, kv_dim]       (in, out)
    std::vector<float> wv;               // [n_layers, dim, kv_dim]       (in, out)
    std::vector<float> wo;               // [n_layers, dim, dim]          (in, out)
    std::vector<float> rms_ffn;          // [n_layers, dim]
    std::vector<float> w1;               // [n_layers, dim, hidden_dim]   (in, out)
    std::vector<float> w2;               // [n_layers, hidden_dim, dim]   (in, out)
    std::vector<float> w3;               // [n_layers, dim, hidden_dim]   (in, out)
    std::vector<float> rms_final;        // [dim]
    std::vector<float> wcls;  // [dim, vocab_size]             (in, out); the embedding transposed when shared

    // Allocates every tensor at its shape for `config` (validated), zero-filled.
    explicit Weights(const Config& config, bool shared_classifier = true);
    Weights() = default;

    // Asserts every tensor has the size its shape comment claims.
    void check_shapes() const;
    // wcls = token_embedding transposed (call after filling the embedding of a shared model).
    void tie_classifier();
    // A 64-bit FNV-1a hash of the config and every weight's bits: the model's identity.
    std::uint64_t fingerprint() const;
};

// RoPE rotation for (pos, pair j) with frequency theta^(-2j/head_size), computed once per model.
// Pairs are adjacent elements (2j, 2j+1) inside each head, as llama2.c rotates them. With an odd
// head_size the last element of each head has no partner and is left as it is.
struct RopeTable {
    int max_seq = 0;
    int n_pairs = 0;         // head_size / 2
    std::vector<float> cos;  // [max_seq, n_pairs]
    std::vector<float> sin;  // [max_seq, n_pairs]
    RopeTable(int max_seq, int head_size, float theta = 10000.0f);
    RopeTable() = default;
};

// A model: its weights and its RoPE table. How a backend lays the weights out for its kernels
// (the CPU's register-width panels, a device copy) is the backend's business (backend.h).
struct Model {
    Weights w;
    RopeTable rope;
    explicit Model(Weights weights);
    const Config& config() const { return w.config; }
};

// Deterministic on every machine: our own PRNG (splitmix64) and a Gaussian made only of IEEE
// adds (Irwin-Hall: the sum of 12 uniforms minus 6), so no libm function decides a weight.
Model random_model(const Config& config, std::uint64_t seed, bool shared_classifier = true);

// splitmix64's output function (Steele, Lea and Flood 2014): every input bit reaches every output
// bit. SplitMix64 applies it to a counter, the prefix cache (paged.cpp) to its chained block hash.
inline std::uint64_t splitmix64_finalize(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The PRNG behind random_model, also used by tests to draw prompts and by the memory model to
// spread request lengths (the same numbers from a seed on every machine and standard library).
struct SplitMix64 {
    std::uint64_t state;
    explicit SplitMix64(std::uint64_t seed) : state(seed) {}
    std::uint64_t next();
    double uniform();   // [0, 1), 53 random bits
    double gaussian();  // mean 0, variance 1 (Irwin-Hall, 12 terms)
};

}  // namespace kvlab
