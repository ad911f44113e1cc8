// Lab 10: the GPU decode kernel. You write the code one GPU thread runs for cached attention:
// one (query row, head) output, computed whole, in the CPU kernel's order of operations. The
// grader launches it over the whole grid on the host, as gpu/host_backend.cpp launches
// gpu/kernels.h, inside kvlab's cached decoder; where this machine has nvcc and a CUDA device,
// it also compiles your file with nvcc and launches it on the GPU.
//
// This header and your file must compile with nvcc too: include nothing else from kvlab than
// what is here (numerics.h gives KVLAB_HD and exp_f32; backend.h gives RowKV).
#pragma once

#include <cstdint>

#include "backend.h"
#include "numerics.h"

namespace kvlab::lab10 {

// Cached attention of query row i, head h, at layer l: the signature and contract of
// gpu::attention_head (gpu/kernels.h), for RowKV.
//   q, att: [rows, dim], head h at columns h * head_size ..; write att[i][h * head_size + d],
//           d < head_size, and nothing else of att
//   rows[i]: where row i's cache keeps K and V, and n = rows[i].n, the positions it attends
//   slots: [rows, max_n]; position t < n of row i is slot s = slots[i * max_n + t]; its K row
//          is static_cast<const float*>(rows[i].k) + (l * layer_rows + kv_head[h] * head_rows + s)
//          * head_size (V: .v). The grader's caches hold fp32; kvlab's own kernel also decodes
//          narrower formats (kv_load, kv_format.h), which this lab leaves out.
//   kv_head: [n_heads] the KV head each query head reads (grouped-query attention)
//   probe: when not null and i == probe_row, also write the softmax weights:
//          probe[h * max_n + t] = p_t for t < n
// Exactly kernels.h attention_row: scores (q . k_t) / sqrt(head_size) (the sum over d
// ascending from +0), max scanned from t = 0, e_t = exp_f32(score_t - max), sum over t
// ascending from +0, p_t = e_t / sum, and att = sum over t ascending of p_t * v_t from +0.
KVLAB_HD void attention_head(float* att, const float* q, const RowKV* rows, int l, const std::int64_t* slots, int max_n,
                             const int* kv_head, int dim, int head_size, int probe_row, float* probe, int i, int h);

// What the starter's stub calls: on the host it throws lessons::NotImplemented (grade.cpp
// defines throw_not_implemented); on a device, where nothing can be thrown, it stops the kernel.
[[noreturn]] void throw_not_implemented(const char* what);
KVLAB_HD inline void not_implemented(const char* what) {
#if defined(__CUDA_ARCH__)
    (void)what;
    __trap();
#else
    throw_not_implemented(what);
#endif
}

}  // namespace kvlab::lab10
