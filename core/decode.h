// kvlab core: the two decoders.
//
//   NaiveDecoder   every step runs the whole prefix of T tokens through the model as matrices:
//                  Q, K, V, O and the feed-forward are [T, *] products, attention builds a
//                  T x T score matrix per head under a causal mask. Nothing survives a step.
//   CachedDecoder  prefill(prompt) runs the prompt as matrices once and writes every layer's
//                  K and V rows into the KV cache; each decode(token) then runs one row,
//                  writes its K and V at pos, and attends over positions 0..pos.
//
// They are different algorithms built from the same kernels (kernels.h), which is why their
// logits agree bit for bit (NUMERICS.md). Both return the logits of the last position.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "cache.h"
#include "kernels.h"
#include "model.h"

namespace kvlab {

// Work buffers for `rows` rows of the residual stream; the forward of one layer, minus
// attention, is the same code for both decoders.
struct Activations {
    int rows = 0;
    std::vector<float> x;    // [rows, dim]        residual stream
    std::vector<float> xb;   // [rows, dim]        normalized input of a sublayer
    std::vector<float> q;    // [rows, dim]        queries, all heads
    std::vector<float> k;    // [rows, kv_dim]
    std::vector<float> v;    // [rows, kv_dim]
    std::vector<float> att;  // [rows, dim]        attention output, all heads
    std::vector<float> out;  // [rows, dim]        output of a sublayer before the residual add
    std::vector<float> h1;   // [rows, hidden_dim]
    std::vector<float> h3;   // [rows, hidden_dim]
    void resize(const Config& c, int rows);
    void check(const Config& c) const;  // asserts every shape above
};

class NaiveDecoder {
public:
    explicit NaiveDecoder(const Model& model, int n_threads = 1);
    // Logits [vocab_size] after the full forward over tokens[0..T).
    const std::vector<float>& forward(std::span<const int> tokens);

    Exec exec;  // threads, and the FLOPs counted so far
    // nullptr: the kernels. A test may plant an order-changing product here; it then replaces
    // every product the naive path computes (weights and attention alike).
    MatmulFn matmul = nullptr;
    Mutant mutant = Mutant::none;  // a planted bug (mutants.h): here only mask_off_by_one

private:
    void attention(int T);
    const Model& model_;
    Activations act_;
    std::vector<float> kt_;      // [head_size, T]  one KV head's keys, transposed
    std::vector<float> scores_;  // [T, T]          one head's scores, then probabilities
    std::vector<float> logits_;  // [vocab_size]
};

class CachedDecoder {
public:
    // Runs on a cache of its own: contiguous, head-major.
    explicit CachedDecoder(const Model& model, int n_threads = 1);
    // Runs on `cache` (any variant; it must outlive the decoder and fit the model's shape).
    CachedDecoder(const Model& model, Cache& cache, int n_threads = 1);

    // Runs tokens as rows at positions pos()..pos()+n-1, appending their K and V to the cache;
    // returns the logits of the last one. decode(t) is prefill of one token.
    const std::vector<float>& prefill(std::span<const int> tokens);
    const std::vector<float>& decode(int token) { return prefill(std::span<const int>(&token, 1)); }
    // Continues the cache with `sequence`, of which it must hold a prefix: an edited prompt is a
    // stale-cache error, never silent garbage. An empty cache first maps what the prefix cache
    // has of it (prefix_hit() positions); then the rest runs as a prefill.
    const std::vector<float>& extend(std::span<const int> sequence);
    int prefix_hit() const { return prefix_hit_; }

    // One step of a batch: sequence s appends tokens[s] to *caches[s]; every row of every
    // sequence goes through each product together. Returns [n_seqs, vocab_size] logits, the last
    // row of each sequence; each equals that sequence's solo run bit for bit. If any sequence does
    // not fit, throws and leaves every cache as it was.
    const std::vector<float>& step(std::span<Cache* const> caches, std::span<const std::vector<int>> tokens);

    int pos() const { return cache_->length(); }  // the next position to be written
    Cache& cache() { return *cache_; }
    const Cache& cache() const { return *cache_; }
    void reset() { cache_->clear(); }

    Exec exec;
    MatmulFn matmul = nullptr;     // as NaiveDecoder::matmul: nullptr is the kernels
    Mutant mutant = Mutant::none;  // a planted bug (mutants.h); none in normal use

    // For the viewer: when set, each call copies the attention weights (softmax output) of the
    // first sequence's last row here. Copying reads the scores after the kernel is done with
    // them, so the logits are the same with or without a probe.
    struct AttentionProbe {
        int n = 0;                   // positions that row attended
        std::vector<float> weights;  // [n_layers, n_heads, max_seq]: the first n of each run are set
    };
    AttentionProbe* probe = nullptr;

private:
    void check_cache(const Cache& cache) const;
    void attention(int l, std::span<Cache* const> caches, std::span<const int> seq_of_row,
                   std::span<const int> positions);
    const Model& model_;
    std::unique_ptr<Cache> own_;  // the default cache, when none was given
    Cache* cache_;
    Activations act_;
    std::vector<float> scores_;         // [n_threads, max_seq]  one attention row's scores per thread
    std::vector<const float*> keys_;    // [n_threads, max_seq]  the K rows it attends to
    std::vector<const float*> values_;  // [n_threads, max_seq]  the V rows
    std::vector<float> last_;           // [n_seqs, dim]         each sequence's last residual row
    std::vector<float> logits_;         // [n_seqs, vocab_size]
    int prefix_hit_ = 0;
};

// Shared by both decoders and the baseline: one-line errors for tokens outside the
// vocabulary and sequences longer than max_seq (never truncated silently).
void check_tokens(const Config& c, std::span<const int> tokens, int start_pos);

}  // namespace kvlab
