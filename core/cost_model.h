// kvlab core: the cost model. What one step of naive or cached decode computes and moves, counted
// from the shape (FLOPs exactly as the CPU kernels count them, bytes as the CPU reads them), and the
// time that predicts on a machine whose rates a short probe measured.
//
// A step is two kinds of work. The weight products read every matrix once (the CPU's panels,
// padding included) and do 2 * rows * n_in * n_out FLOPs: one row is bound by how fast the panels
// stream from memory, many rows by arithmetic. Attention reads each KV head's K and V rows once
// (a decode step) and does O(T) FLOPs per head (O(T^2) for naive decode). Each kind takes the
// longer of its bytes over the probed bandwidth and its FLOPs over the probed rate (a roofline per
// kind), and the step is their sum plus the small kernels (norms, RoPE, SiLU, residual adds).
#pragma once

#include <cstdint>

#include "config.h"
#include "model.h"
#include "tiled_attention.h"

namespace kvlab {

struct StepCost {
    int rows = 0;                        // query rows the step computes (T for naive decode, 1 cached)
    std::uint64_t product_flops = 0;     // the layers' weight products, every row
    std::uint64_t classifier_flops = 0;  // the classifier, the last row only
    std::uint64_t attention_flops = 0;   // attention, every head and layer
    std::uint64_t other_flops = 0;       // rmsnorm, RoPE, SiLU, residual adds
    double weight_bytes = 0;             // the layers' weights as the CPU reads them (panels)
    double classifier_bytes = 0;         // the classifier's panels
    double kv_read_bytes = 0;            // K and V rows attention reads from the cache
    double kv_write_bytes = 0;           // K and V rows the step stores
    std::uint64_t flops() const { return product_flops + classifier_flops + attention_flops + other_flops; }
    double bytes() const { return weight_bytes + classifier_bytes + kv_read_bytes + kv_write_bytes; }
};

// A cached decode step at context length T: one row at position T - 1 reading T keys, K and V held
// in rows of kv_row_bytes (kv_row_bytes(format, head_size); fp32: 4 * head_size).
StepCost cached_step_cost(const Config& c, int T, std::int64_t kv_row_bytes, const AttentionSpec& a);
// A naive decode step at context length T: a forward over T rows, logits of the last.
StepCost naive_step_cost(const Config& c, int T, const AttentionSpec& a);

// The bytes of the weight products' panels, the classifier's included: what a one-row step streams.
double panel_bytes(const Config& c);

// The first T at which a cached step reads more KV bytes than weight bytes (0: never, up to 2^30).
int kv_passes_weights_T(const Config& c, std::int64_t kv_row_bytes);

// The machine's rates for kvlab's kernels, measured by probe_machine on n_threads threads.
struct MachineRates {
    int n_threads = 1;
    double stream_bytes_per_s = 0;     // one-row products over every panel of the model, in a step's order
    double product_flops_per_s = 0;    // a 64-row product by the model's w1 (layer 0), its panels in cache
    double kv_bytes_per_s = 0;         // one-row attention over K and V far bigger than the caches
    double attention_flops_per_s = 0;  // naive attention over 512 rows, which stay in cache
    double other_flops_per_s = 0;      // rmsnorm, RoPE, silu_mul and add over 64 rows in cache
    double seconds = 0;                // what the probe took
};

// Runs each kernel a few times, keeping the fastest (under a second in all): the products on the
// model's own panels, attention and the small kernels on synthetic data of its heads and widths.
MachineRates probe_machine(const Model& model, int n_threads, const AttentionSpec& attention);

// The cost model's time for a step: for the layers' products, the classifier and attention each,
// the longer of bytes / bandwidth and FLOPs / rate; plus the small kernels' FLOPs / rate.
double predicted_seconds(const StepCost& s, const MachineRates& m);

}  // namespace kvlab
