// Lab 5: prefill. Fill in the two TODOs; `lessons/grade 5` grades this file.
//
// You run n rows (tokens at positions p0..p0+n-1, p0 = cache.length()) through the model in one
// step, against the Backend interface (core/backend.h), the way kvlab's plan_step and
// CachedDecoder::execute (core/decode.cpp) do for any batch; write yours without CachedDecoder.
// One step is:
//
//   on the host     cache.append(tokens); for each row i, where its K and V go
//                   (cache.write_slot(p0 + i)) and the slots it reads (cache.attended(p0 + i, ..)),
//                   as a RowKV per row and a slot table; then upload what the kernels read
//   embed           the n tokens' embeddings into x
//   per layer l     layer_inputs   rmsnorm, q, k, v, RoPE at each row's position  (given below)
//                   store_kv       each row's K and V into its write slot         | write first,
//                   cache.stored   the cache's hook (a quantized cache quantizes)  | then read:
//                   attention      each row over the slots it reads               | row i sees itself
//                   layer_outputs  output product, residual, feed-forward          (given below)
//   the logits      final rmsnorm and classifier of the prompt's last row only
//
// Buffers the kernels read live in backend.memory() (on_device below); the cache's rows already do.
#include "grader.h"
#include "lab.h"

#include "decode.h"  // Activations: the [rows, *] work buffers of one step

namespace kvlab::lab05 {

// ----------------------------------------------------------------------------------------------
// Given: the parts of a layer that act row by row, the same for 1 row (decode) as for n rows
// (prefill), and the same as core/decode.cpp's.

// xb = rmsnorm(x); q, k, v = xb · (wq, wk, wv); RoPE on q and k, row i at positions[i].
void layer_inputs(Backend& b, Exec& ex, int l, Activations& a, const int* positions) {
    const Config& c = b.config();
    const int n = a.rows;
    a.check(c);
    b.rmsnorm(ex, a.xb.data(), a.x.data(), Norm::att, l, n);
    b.matmul(ex, a.q.data(), c.dim, a.xb.data(), c.dim, Matrix::wq, l, n);
    b.matmul(ex, a.k.data(), c.kv_dim(), a.xb.data(), c.dim, Matrix::wk, l, n);
    b.matmul(ex, a.v.data(), c.kv_dim(), a.xb.data(), c.dim, Matrix::wv, l, n);
    b.rope(ex, a.q.data(), n, c.n_heads, positions);
    b.rope(ex, a.k.data(), n, c.n_kv_heads, positions);
}

// x += att · wo;  x += w2 · (silu(xb · w1) * (xb · w3)) with xb = rmsnorm(x).
void layer_outputs(Backend& b, Exec& ex, int l, Activations& a) {
    const Config& c = b.config();
    const int n = a.rows;
    a.check(c);
    b.matmul(ex, a.out.data(), c.dim, a.att.data(), c.dim, Matrix::wo, l, n);
    b.add(ex, a.x.data(), a.out.data(), std::int64_t(n) * c.dim);
    b.rmsnorm(ex, a.xb.data(), a.x.data(), Norm::ffn, l, n);
    b.matmul(ex, a.h1.data(), c.hidden_dim, a.xb.data(), c.dim, Matrix::w1, l, n);
    b.matmul(ex, a.h3.data(), c.hidden_dim, a.xb.data(), c.dim, Matrix::w3, l, n);
    b.silu_mul(ex, a.h1.data(), a.h3.data(), std::int64_t(n) * c.hidden_dim);
    b.matmul(ex, a.out.data(), c.dim, a.h1.data(), c.hidden_dim, Matrix::w2, l, n);
    b.add(ex, a.x.data(), a.out.data(), std::int64_t(n) * c.dim);
}

// A copy of host data in the backend's memory.
template <class T>
Buffer<T> on_device(Memory& memory, std::span<const T> host) {
    Buffer<T> b(memory, std::int64_t(host.size()));
    if (!host.empty()) b.upload(host);
    return b;
}

// ----------------------------------------------------------------------------------------------

// TODO 1 (one step): run `tokens` as rows at positions cache.length().. through every layer,
// storing their K and V in the cache; return the logits [vocab_size] of the last row.
// - slots: attended() writes at most pos + 1 slots per row; one table of [n, max_n] with
//   max_n = the last row's pos + 1 fits every row (Backend::attention reads row i's from
//   slots + i * max_n). RowKV::n is how many row i reads.
// - the KV head of each query head: kv_head_map(config) (core/backend.h), uploaded.
// - Activations a; a.resize(memory, config, n) gives x, xb, q, k, v, att, out, h1, h3 as [n, *].
// - the classifier: backend.rmsnorm(.., Norm::final, 0, 1) and backend.matmul(.., Matrix::wcls,
//   0, 1) on one row; then memory.download the logits to the host.
std::vector<float> run_step(Backend& backend, Cache& cache, std::span<const int> tokens, Exec& exec) {
    (void)backend, (void)cache, (void)tokens, (void)exec;
    throw lessons::NotImplemented("run_step");
}

// TODO 2 (the prefill): the prompt in steps of at most `chunk` rows (and at most
// cache.max_append(): a window's ring can take no more at once), each step continuing where the
// cache ends; the logits of the prompt's last position.
std::vector<float> prefill(Backend& backend, Cache& cache, std::span<const int> prompt, int chunk, Exec& exec) {
    (void)backend, (void)cache, (void)prompt, (void)chunk, (void)exec;
    throw lessons::NotImplemented("prefill");
}

}  // namespace kvlab::lab05
