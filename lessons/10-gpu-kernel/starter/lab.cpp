// Lab 10: the cached attention kernel, one GPU thread's work. Fill in the TODO; `lessons/grade 10`
// grades this file. It is compiled by g++ for the host launcher and, where there is a GPU, by
// nvcc for the device: include only lab.h, and call only KVLAB_HD functions (exp_f32, sqrtf).
//
// One thread owns one (query row i, head h) and computes its head_size outputs whole. Nothing is
// shared between threads, and every sum runs in increasing index from +0.0f: that is what makes
// the GPU's bits the CPU's (core/NUMERICS.md). Where row i's positions live:
//   s = slots[i * max_n + t]                                       t = 0 .. rows[i].n - 1
//   K row: static_cast<const float*>(rows[i].k)
//          + (l * rows[i].layer_rows + kv_head[h] * rows[i].head_rows + s) * head_size (fp32 rows)
//   V row: the same offset into rows[i].v
// q and att are [rows, dim]; head h is the head_size floats from h * head_size.
#include "lab.h"

namespace kvlab::lab10 {

// TODO: kernels.h attention_row, without a scores buffer (a GPU thread has none to spare):
//   1. score(t) = (q . k_t) / sqrt(float(head_size)), the dot summed over d ascending from +0.
//      Recompute it whenever you need it: the same operations give the same bits every time.
//   2. max = score(0), then the larger of it and score(1), score(2), ... in order.
//   3. sum = 0 + exp_f32(score(0) - max) + exp_f32(score(1) - max) + ... in order.
//   4. att[i][h * head_size + d] = 0, then for t = 0 .. n-1 in order:
//      p = exp_f32(score(t) - max) / sum; att[..d] = att[..d] + p * v_t[d]
//      (and probe[h * max_n + t] = p when probe is not null and i == probe_row).
//   With n = rows[i].n == 0, att is zeros.
KVLAB_HD void attention_head(float* att, const float* q, const RowKV* rows, int l, const std::int64_t* slots, int max_n,
                             const int* kv_head, int dim, int head_size, int probe_row, float* probe, int i, int h) {
    (void)att, (void)q, (void)rows, (void)l, (void)slots, (void)max_n, (void)kv_head, (void)dim, (void)head_size;
    (void)probe_row, (void)probe, (void)i, (void)h;
    not_implemented("attention_head");  // throws lessons::NotImplemented("attention_head")
}

}  // namespace kvlab::lab10
