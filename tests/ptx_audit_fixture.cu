// The PTX audit's counter-test: code that breaks the numeric contract as soon as nvcc is left to
// its defaults (a*b+c fused into an FMA, expf through ex2.approx) or told --use_fast_math
// (flushed denormals, approximate division and square root). ptx_audit.sh must reject it.
__global__ void fixture(float* out, const float* a, const float* b, const float* c, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[4 * i + 0] = a[i] * b[i] + c[i];
    out[4 * i + 1] = expf(a[i]);
    out[4 * i + 2] = a[i] / b[i];
    out[4 * i + 3] = sqrtf(c[i]);
}
