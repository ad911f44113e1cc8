// Lab 12: tiled attention, exact. You write the attention production engines run, FlashAttention's
// online softmax over key tiles, for one query row of one head, so that a row gives the same bits
// whether it runs in a prefill of many rows, a chunk of a chunked prefill or a one-row decode step.
// The grader runs your kernel as both of kvlab's decoders' attention and compares them bit for bit.
#pragma once

namespace kvlab::lab12 {

// One query row of one head, over its keys 0..n-1 (n >= 1): q [head_size], k and v [n, head_size]
// (row t of each is position t's). out [head_size] = sum_t softmax(q . k_t / sqrt(head_size))_t v_t,
// computed over key tiles of `tile` keys (tile >= 1). `rows` is how many query rows the step that
// asks runs (1 for a decode step, more for a prefill or a chunk): a real kernel knows it.
void tiled_attention(float* out, const float* q, const float* k, const float* v, int n, int head_size, int tile,
                     int rows);

}  // namespace kvlab::lab12
