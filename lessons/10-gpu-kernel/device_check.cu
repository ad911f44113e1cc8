// Lab 10's GPU check: your kernel compiled by nvcc and launched on the device, one CUDA thread
// per (query row, head), against gpu::attention_head run on the host (which the other checks and
// kvlab's tests hold equal to the CPU bit for bit). The grader builds this file at run time, only
// where there is nvcc and a CUDA device:
//   nvcc <the numeric contract's flags> -I core -I lessons/10-gpu-kernel
//        -DLAB10_FILE='"<your lab.cpp>"' -DKVLAB_GPU_KERNELS='"<gpu/kernels.h>"' device_check.cu
//   ./device_check SEED        exit 0: every launch equal; 1: a difference (printed); 2: a CUDA error
// Plain printf, no fmt: its compile-time checks are not constant expressions for nvcc.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include LAB10_FILE         // your attention_head (it includes lab.h)
#include KVLAB_GPU_KERNELS  // gpu::attention_head, the reference

namespace kvlab::lab10 {
void throw_not_implemented(const char* what) {
    std::printf("not implemented: %s (the TODO in your lab file)\n", what);
    std::exit(1);
}
}  // namespace kvlab::lab10

namespace {

using kvlab::RowKV;

void check(cudaError_t e, const char* call) {
    if (e == cudaSuccess) return;
    std::printf("CUDA: %s failed: %s (%s)%s\n", call, cudaGetErrorString(e), cudaGetErrorName(e),
                e == cudaErrorLaunchFailure || e == cudaErrorAssert || e == cudaErrorIllegalAddress
                    ? "; your kernel stopped on the device (the starter's stub traps; a read outside the cache "
                      "faults)"
                    : "");
    std::exit(2);
}

__global__ void attention_kernel(float* att, const float* q, const RowKV* rows, int n_rows, int l,
                                 const std::int64_t* slots, int max_n, const int* kv_head, int n_heads, int dim,
                                 int head_size, int probe_row, float* probe) {
    const std::int64_t id = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id >= std::int64_t(n_rows) * n_heads) return;
    const int i = int(id / n_heads), h = int(id % n_heads);
    kvlab::lab10::attention_head(att, q, rows, l, slots, max_n, kv_head, dim, head_size, probe_row, probe, i, h);
}

std::uint64_t state = 0;
std::uint64_t next_u64() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
int uniform(int lo, int hi) { return lo + int(next_u64() % std::uint64_t(hi - lo + 1)); }  // [lo, hi]

std::uint32_t bits(float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
}

template <class T>
T* upload(const std::vector<T>& host) {
    T* p = nullptr;
    check(cudaMalloc(&p, sizeof(T) * (host.empty() ? 1 : host.size())), "cudaMalloc");
    if (!host.empty()) check(cudaMemcpy(p, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    return p;
}
template <class T>
std::vector<T> download(const T* p, std::size_t n) {
    std::vector<T> host(n);
    check(cudaMemcpy(host.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return host;
}

// One generated launch, as the grader's kernel check draws it: a paged layout (block_size 1-8,
// a random block table per row) with a NaN guard row after each (layer, KV head) run, GQA.
// Returns false after printing the first difference.
bool one_case(int index) {
    const int n_heads = uniform(1, 4);
    std::vector<int> divisors;
    for (int d = 1; d <= n_heads; d++)
        if (n_heads % d == 0) divisors.push_back(d);
    const int n_kv_heads = divisors[std::size_t(uniform(0, int(divisors.size()) - 1))];
    const int head_size = uniform(1, 8), dim = n_heads * head_size, n_layers = uniform(1, 3),
              l = uniform(0, n_layers - 1);
    const int n_rows = uniform(1, 3), max_n = uniform(1, 20), bs = uniform(1, 8);
    const int blocks = 2 * ((max_n + bs - 1) / bs) + 1;
    const float scale = std::ldexp(1.0f, uniform(-2, 3));
    auto value = [&] { return (float(next_u64() >> 40) / float(1 << 24) * 2 - 1) * scale; };
    std::vector<float> q(std::size_t(n_rows) * dim);
    for (float& x : q) x = value();
    // Each row's own cache and layout: [n_layers, n_kv_heads, head_rows, head_size], NaN where no
    // slot of the row points; the last row of each run is the guard the slots past n name.
    std::vector<std::vector<float>> k(static_cast<std::size_t>(n_rows)), v(static_cast<std::size_t>(n_rows));
    std::vector<std::int64_t> slots(std::size_t(n_rows) * max_n + 1, 0);
    std::vector<RowKV> rows(static_cast<std::size_t>(n_rows));
    for (int i = 0; i < n_rows; i++) {
        const std::int64_t head_rows = std::int64_t(blocks) * bs + uniform(1, 3), layer_rows = n_kv_heads * head_rows;
        k[std::size_t(i)].assign(std::size_t(n_layers * layer_rows * head_size), kvlab::kNaN);
        v[std::size_t(i)] = k[std::size_t(i)];
        for (int t = 0; t < max_n; t++) slots[std::size_t(i) * max_n + t] = head_rows - 1;
        slots.back() = head_rows - 1;
        const int n = uniform(1, max_n);
        std::vector<int> table(static_cast<std::size_t>(blocks));
        for (int b = 0; b < blocks; b++) table[std::size_t(b)] = b;
        for (int b = blocks - 1; b > 0; b--) std::swap(table[std::size_t(b)], table[std::size_t(uniform(0, b))]);
        for (int t = 0; t < n; t++) {
            const std::int64_t s = std::int64_t(table[std::size_t(t / bs)]) * bs + t % bs;
            slots[std::size_t(i) * max_n + t] = s;
            for (int kvh = 0; kvh < n_kv_heads; kvh++)
                for (int d = 0; d < head_size; d++) {
                    const std::size_t at = std::size_t((l * layer_rows + kvh * head_rows + s) * head_size + d);
                    k[std::size_t(i)][at] = value(), v[std::size_t(i)][at] = value();
                }
        }
        rows[std::size_t(i)].layer_rows = layer_rows;
        rows[std::size_t(i)].head_rows = head_rows;
        rows[std::size_t(i)].row_bytes = std::int64_t(sizeof(float)) * head_size;  // fp32
        rows[std::size_t(i)].n = n;
    }
    std::vector<int> kv_head(static_cast<std::size_t>(n_heads));
    for (int h = 0; h < n_heads; h++) kv_head[std::size_t(h)] = h / (n_heads / n_kv_heads);
    const int probe_row = uniform(0, n_rows - 1);

    // The reference on the host.
    std::vector<RowKV> host_rows = rows;
    for (std::size_t i = 0; i < rows.size(); i++) host_rows[i].k = k[i].data(), host_rows[i].v = v[i].data();
    std::vector<float> want(std::size_t(n_rows) * dim, 0.0f), want_probe(std::size_t(n_heads) * max_n, 0.0f);
    for (int i = 0; i < n_rows; i++)
        for (int h = 0; h < n_heads; h++)
            kvlab::gpu::attention_head(want.data(), q.data(), host_rows.data(), l, slots.data(), max_n, kv_head.data(),
                                       dim, head_size, probe_row, want_probe.data(), i, h);

    // Yours on the device.
    std::vector<void*> owned;  // device buffers, freed after the launch
    float* dq = upload(q);
    std::vector<RowKV> device_rows = rows;
    for (std::size_t i = 0; i < rows.size(); i++) {
        device_rows[i].k = upload(k[i]), device_rows[i].v = upload(v[i]);
        owned.push_back(device_rows[i].k), owned.push_back(device_rows[i].v);
    }
    RowKV* drows = upload(device_rows);
    std::int64_t* dslots = upload(slots);
    int* dkv = upload(kv_head);
    float* datt = upload(std::vector<float>(want.size(), 0.0f));
    float* dprobe = upload(std::vector<float>(want_probe.size(), 0.0f));
    const int threads = 128, grid = (n_rows * n_heads + threads - 1) / threads;
    attention_kernel<<<grid, threads>>>(datt, dq, drows, n_rows, l, dslots, max_n, dkv, n_heads, dim, head_size,
                                        probe_row, dprobe);
    check(cudaGetLastError(), "the kernel launch");
    check(cudaDeviceSynchronize(), "the kernel");
    const std::vector<float> got = download(datt, want.size()), got_probe = download(dprobe, want_probe.size());
    owned.insert(owned.end(), {(void*)dq, (void*)drows, (void*)dslots, (void*)dkv, (void*)datt, (void*)dprobe});
    for (void* p : owned) check(cudaFree(p), "cudaFree");

    auto report = [&](const char* what, std::size_t e, float g, float w) {
        std::printf(
            "launch %d (%d query rows, n_heads %d, n_kv_heads %d, head_size %d, layer %d of %d, block_size %d, "
            "probe_row %d): %s[%zu] is %.9g (bits 0x%08x) on the GPU, %.9g (bits 0x%08x) on the host\n",
            index, n_rows, n_heads, n_kv_heads, head_size, l, n_layers, bs, probe_row, what, e, double(g), bits(g),
            double(w), bits(w));
        return false;
    };
    for (std::size_t e = 0; e < want.size(); e++)
        if (bits(got[e]) != bits(want[e])) return report("att", e, got[e], want[e]);
    for (std::size_t e = 0; e < want_probe.size(); e++)
        if (bits(got_probe[e]) != bits(want_probe[e])) return report("probe", e, got_probe[e], want_probe[e]);
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    state = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
    constexpr int kLaunches = 200;
    for (int c = 0; c < kLaunches; c++)
        if (!one_case(c)) return 1;
    std::printf("%d launches bitwise equal\n", kLaunches);
    return 0;
}
