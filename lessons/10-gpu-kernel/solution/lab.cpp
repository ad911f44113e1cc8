// Lab 10, reference solution: kvlab's own GPU kernel (gpu/kernels.h, gpu::attention_head), the
// function the CUDA backend launches and gpu/host_backend.cpp runs over the grid on the host.
#include "lab.h"

#include "../gpu/kernels.h"  // by path (from core/ or gpu/): core/ has a kernels.h too

namespace kvlab::lab10 {

KVLAB_HD void attention_head(float* att, const float* q, const RowKV* rows, int l, const std::int64_t* slots, int max_n,
                             const int* kv_head, int dim, int head_size, int probe_row, float* probe, int i, int h) {
    gpu::attention_head(att, q, rows, l, slots, max_n, kv_head, dim, head_size, probe_row, probe, i, h);
}

}  // namespace kvlab::lab10
