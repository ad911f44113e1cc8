// expect: the weights are right
// A plausible mistake: the P.V product summed in two halves and the halves added, as a split-K
// or two-thread reduction would. In real numbers the same; in floats it rounds differently.
#include "lab.h"

namespace kvlab::lab10 {

KVLAB_HD void attention_head(float* att, const float* q, const RowKV* rows, int l, const std::int64_t* slots, int max_n,
                             const int* kv_head, int dim, int head_size, int probe_row, float* probe, int i, int h) {
    const RowKV& r = rows[i];
    const std::int64_t* s = slots + std::int64_t(i) * max_n;
    const std::int64_t base = l * r.layer_rows + kv_head[h] * r.head_rows;
    const float* qi = q + std::int64_t(i) * dim + h * head_size;
    const float scale = sqrtf(float(head_size));
    auto k_row = [&](int t) { return r.k + (base + s[t]) * head_size; };
    auto v_row = [&](int t) { return r.v + (base + s[t]) * head_size; };
    auto score = [&](int t) {
        const float* k = k_row(t);
        float x = 0.0f;
        for (int d = 0; d < head_size; d++) x = x + qi[d] * k[d];
        return x / scale;
    };
    float* out = att + std::int64_t(i) * dim + h * head_size;
    for (int d = 0; d < head_size; d++) out[d] = 0.0f;
    const int n = r.n;
    if (n <= 0) return;
    float max = score(0);
    for (int t = 1; t < n; t++)
        if (score(t) > max) max = score(t);
    float sum = 0.0f;
    for (int t = 0; t < n; t++) sum = sum + exp_f32(score(t) - max);
    auto p = [&](int t) { return exp_f32(score(t) - max) / sum; };
    if (probe != nullptr && i == probe_row)
        for (int t = 0; t < n; t++) probe[std::int64_t(h) * max_n + t] = p(t);
    // The mistake: two partial sums, as two threads (or a split-K launch) would make, then added.
    const int half = n / 2;
    for (int d = 0; d < head_size; d++) {
        float first = 0.0f, second = 0.0f;
        for (int t = 0; t < half; t++) first = first + p(t) * v_row(t)[d];
        for (int t = half; t < n; t++) second = second + p(t) * v_row(t)[d];
        out[d] = first + second;
    }
}

}  // namespace kvlab::lab10
