// expect: the weights are right
// A plausible mistake: the P.V product summed in two halves and the halves added, as a split-K
// or two-thread reduction would. In real numbers the same; in floats it rounds differently.
// (Not a sed of the solution, which only calls gpu::attention_head: the scores and weights here
// are gpu/kernels.h's, only the last sum is split.)
#include "lab.h"

#include "../gpu/kernels.h"  // by path (from core/ or gpu/): core/ has a kernels.h too

namespace kvlab::lab10 {

KVLAB_HD void attention_head(float* att, const float* q, const RowKV* rows, int l, const std::int64_t* slots, int max_n,
                             const int* kv_head, int dim, int head_size, int probe_row, float* probe, int i, int h) {
    const RowKV& r = rows[i];
    const std::int64_t base = l * r.layer_rows + kv_head[h] * r.head_rows;
    const float* qi = q + std::int64_t(i) * dim + h * head_size;
    const std::int64_t* s = slots + std::int64_t(i) * max_n;
    auto row = [&](const void* storage, int t) {
        return static_cast<const float*>(storage) + (base + s[t]) * head_size;
    };
    auto score = [&](int t) {
        float x = 0.0f;
        for (int d = 0; d < head_size; d++) x = x + qi[d] * row(r.k, t)[d];
        return x / gpu::attention_scale(head_size);
    };
    float* out = att + std::int64_t(i) * dim + h * head_size;
    for (int d = 0; d < head_size; d++) out[d] = 0.0f;
    if (r.n <= 0) return;
    const gpu::SoftmaxStats st = gpu::softmax_stats(r.n, score);
    auto p = [&](int t) { return gpu::softmax_weight(score(t), st); };
    if (probe != nullptr && i == probe_row)
        for (int t = 0; t < r.n; t++) probe[std::int64_t(h) * max_n + t] = p(t);
    const int half = r.n / 2;  // the mistake: two partial sums, as two threads would make, then added
    for (int d = 0; d < head_size; d++) {
        float first = 0.0f, second = 0.0f;
        for (int t = 0; t < half; t++) first = first + p(t) * row(r.v, t)[d];
        for (int t = half; t < r.n; t++) second = second + p(t) * row(r.v, t)[d];
        out[d] = first + second;
    }
}

}  // namespace kvlab::lab10
