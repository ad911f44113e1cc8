// kvlab core: a llama2.c-style decoder, kept as the benchmark's yardstick.
//
// It is what run.c does: weights stored [out][in], every matrix-vector product a plain
// sequential dot per output, one token per forward, a KV cache laid out [n_layers][max_seq][kv_dim].
// Each output element still sums in k order from +0, so its logits equal the other decoders'
// bit for bit; only the speed differs (kvlab bench shows both).
#pragma once

#include <span>
#include <vector>

#include "kernels.h"
#include "model.h"

namespace kvlab {

class SequentialDotDecoder {
public:
    explicit SequentialDotDecoder(const Model& model);
    // Logits [vocab_size] for `token` at position pos(); appends its K and V.
    const std::vector<float>& decode(int token);
    int pos() const { return pos_; }
    void truncate(int n);

    Exec exec;

private:
    const Model& model_;
    int pos_ = 0;
    // The model's own matrices, [out][in] as llama2.c keeps them.
    std::span<const float> wq_, wk_, wv_, wo_, w1_, w2_, w3_, wcls_;  // model.w's, [n_layers, out, in]
    std::vector<float> key_cache_, value_cache_;  // [n_layers, max_seq, kv_dim]
    std::vector<float> x_, xb_, q_, att_, out_, h1_, h3_, scores_, logits_;
};

}  // namespace kvlab
