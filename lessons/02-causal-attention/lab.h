// Lab 2: causal attention, naively. You write the masked T x T attention of one head as
// matrices, the way naive decode computes it, bit for bit equal to kvlab's.
#pragma once

namespace kvlab::lab02 {

// One head's causal self-attention over positions 0..T-1 (T >= 1):
//   S = Q K^T / sqrt(head_size)        [T, T]; S[i][j] = -inf for j > i (the causal mask)
//   P = softmax(S), row by row         [T, T]
//   out = P V                          [T, head_size]
// q, k, v are T rows of head_size floats, row i starting at q + i * ldq (k: ldk, v: ldv); out
// row i starts at out + i * ldo, and only its head_size floats may be written. Strides are in
// floats, at least head_size: a head is a column block of the [T, dim] or [T, kv_dim] activations.
// Every output float must equal kvlab's naive attention (CpuBackend::causal_attention) bit for
// bit: README.md says in which order to add.
void causal_attention_head(float* out, int ldo, const float* q, int ldq, const float* k, int ldk, const float* v,
                           int ldv, int T, int head_size);

}  // namespace kvlab::lab02
