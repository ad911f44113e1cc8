// kvlab core: weights, RoPE tables and deterministic random models.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "config.h"

namespace kvlab {

class MappedFile;  // mapped_file.h

// Weights of a llama2.c-style model, in llama2.c's own layout: every matrix is [out][in], as the
// checkpoint stores it, so a loaded model's tensors are views of the mapped file (no copy at
// start-up). The CPU backend multiplies by register-width panels built from these (panel_cache.h),
// the GPU kernels read them as they are (gpu/kernels.h: a thread per output walks its row); each
// output element is summed in k order either way (NUMERICS.md).
//
// The tensors are spans into one block of floats that the Weights keep alive: this process's
// memory (random models, copies) or a checkpoint mapped privately (checkpoint.h), whose pages a
// write copies first, so nothing ever writes a checkpoint through a model.
struct Weights {
    Config config;
    bool shared_classifier = true;  // llama2.c: the classifier is the token embedding

    std::span<float> token_embedding;  // [vocab_size, dim]
    std::span<float> rms_att;          // [n_layers, dim]
    std::span<float> wq;               // [n_layers, dim, dim]          (out, in)
    std::span<float> wk;               // [n_layers, kv_dim, dim]       (out, in)
    std::span<float> wv;               // [n_layers, kv_dim, dim]       (out, in)
    std::span<float> wo;               // [n_layers, dim, dim]          (out, in)
    std::span<float> rms_ffn;          // [n_layers, dim]
    std::span<float> w1;               // [n_layers, hidden_dim, dim]   (out, in)
    std::span<float> w2;               // [n_layers, dim, hidden_dim]   (out, in)
    std::span<float> w3;               // [n_layers, hidden_dim, dim]   (out, in)
    std::span<float> rms_final;        // [dim]
    std::span<float> wcls;             // [vocab_size, dim]             (out, in); token_embedding itself when shared

    // Every tensor at its shape for `config` (validated), zero-filled, in this process's memory.
    explicit Weights(const Config& config, bool shared_classifier = true);
    // Tensors not yet placed: the checkpoint reader points them into the mapped `file`, which they keep alive.
    Weights(const Config& config, bool shared_classifier, std::shared_ptr<const MappedFile> file);
    Weights() = default;
    // A copy owns its floats (in this process's memory): changing it never changes the original.
    Weights(const Weights& other);
    Weights& operator=(const Weights& other);
    Weights(Weights&&) noexcept = default;
    Weights& operator=(Weights&&) noexcept = default;

    // Asserts every tensor has the size its shape comment claims (and wcls is the embedding when shared).
    void check_shapes() const;
    // A 64-bit FNV-1a hash of the config and every weight's bits: the model's identity.
    std::uint64_t fingerprint() const;
    // The tensors in the order of llama2.c's legacy file (the classifier only when unshared).
    std::vector<std::span<float>> tensors() const;
    // The checkpoint the tensors are views of; null when they live in this process's memory.
    const MappedFile* mapped() const { return mapped_; }

private:
    std::shared_ptr<const void> storage_;  // what the spans point into
    const MappedFile* mapped_ = nullptr;   // storage_, when it is a mapped checkpoint
};

// W[layers][n_out][n_in] as [layers][n_in][n_out]: the layout the GPU kernels read (one thread per
// output element, neighbouring threads reading neighbouring floats).
std::vector<float> in_out_copy(std::span<const float> w, int layers, int n_out, int n_in);

// RoPE rotation for (pos, pair j) with frequency theta^(-2j/head_size), computed once per model.
// Pairs are adjacent elements (2j, 2j+1) inside each head, as llama2.c rotates them. With an odd
// head_size the last element of each head has no partner and is left as it is.
struct RopeTable {
    int max_seq = 0;
    int n_pairs = 0;         // head_size / 2
    std::vector<float> cos;  // [max_seq, n_pairs]
    std::vector<float> sin;  // [max_seq, n_pairs]
    MemoryCharge charge;     // cos and sin on the memory budget
    RopeTable(int max_seq, int head_size, float theta = 10000.0f);
    RopeTable() = default;
};

// Whether the CPU backend keeps a mapped checkpoint's packed panels in a file between runs
// (cpu_backend.h, "The panel cache"): automatic uses one beside the checkpoint for a model big
// enough to gain from it and says once why when it cannot; on insists (an Error when it cannot);
// off always packs in memory. dir, when set, holds the cache files instead.
struct PanelCacheOption {
    enum class Mode { automatic, on, off } mode = Mode::automatic;
    std::string dir;
};

struct PackedWeights;  // the CPU backend's panels (cpu_backend.h)

// A model: its weights and its RoPE table. How a backend lays the weights out for its kernels
// (the CPU's register-width panels, a device copy) is the backend's business (backend.h).
struct Model {
    Weights w;
    RopeTable rope;
    PanelCacheOption panel_cache;
    // The CPU backend's panels: built (or mapped from the panel cache) by the first CpuBackend of
    // this model and shared by the later ones; they name the weights they were built from, so a
    // copied model builds its own.
    mutable std::shared_ptr<const PackedWeights> cpu_panels;
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
