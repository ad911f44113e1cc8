// expect: check the rows you read
// A plausible mistake: an off-by-one in the slot index; position t reads the rows of slot
// slots[t + 1], and the last position reads past the row's slots.
#include "lab.h"

namespace kvlab::lab10 {

KVLAB_HD void attention_head(float* att, const float* q, const RowKV* rows, int l, const std::int64_t* slots, int max_n,
                             const int* kv_head, int dim, int head_size, int probe_row, float* probe, int i, int h) {
    const RowKV& r = rows[i];
    const std::int64_t* s = slots + std::int64_t(i) * max_n;
    const std::int64_t base = l * r.layer_rows + kv_head[h] * r.head_rows;
    const float* qi = q + std::int64_t(i) * dim + h * head_size;
    const float scale = sqrtf(float(head_size));
    auto k_row = [&](int t) { return r.k + (base + s[t + 1 /* the mistake */]) * head_size; };
    auto v_row = [&](int t) { return r.v + (base + s[t + 1 /* the mistake */]) * head_size; };
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
    for (int t = 0; t < n; t++) {
        const float p = exp_f32(score(t) - max) / sum;
        if (probe != nullptr && i == probe_row) probe[std::int64_t(h) * max_n + t] = p;
        const float* v = v_row(t);
        for (int d = 0; d < head_size; d++) out[d] = out[d] + p * v[d];
    }
}

}  // namespace kvlab::lab10
