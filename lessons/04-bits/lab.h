// Lab 4: why the bits agree, and how to break them. You write a fast matrix product that keeps
// every output's order of additions (so it equals the textbook loop bit for bit, whatever the
// shape, strides or threads), then plant a split-K product and watch the grader catch it.
//
// Both have the signature of kvlab's kernels (kernels.h, MatmulFn), so the grader can also run
// whole decoders on them (a CPU backend with every product on yours, proofs/planted.h's
// ProductBackend):
//   Y[rows, n_out] (row stride ldy) = X[rows, n_in] (row stride ldx) · W[n_in, n_out] (row stride ldw)
// Strides are in floats (ldy >= n_out, ldx >= n_in, ldw >= n_out); only Y's first n_out floats of
// each row may be written. ex.n_threads is the number of threads to use; each adds
// 2 · rows · n_in · n_out to ex.flops (a multiply and an add per term), once.
#pragma once

#include "kernels.h"

namespace kvlab::lab04 {

// Y[r][o] = (((0 + X[r][0]·W[0][o]) + X[r][1]·W[1][o]) + ...) in increasing k, for every r and o:
// bitwise equal to matmul_reference, faster (tiles, vectors across outputs, threads).
void fast_matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in,
                 int n_out);

// The same product in real arithmetic, split-K: k cut into ex.n_threads chunks (one per thread),
// each chunk summed from +0 on its own, the partial sums added at the end. With one thread it is
// the textbook loop; with more, the grader must catch it.
void planted_split_k(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows,
                     int n_in, int n_out);

}  // namespace kvlab::lab04
