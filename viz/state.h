// kvlab viewer: the snapshots the panels draw.
//
// The session (session.h) runs the real decoders on a worker thread and, after every step,
// freezes what the panels need into one Step: the sequences' tokens and block tables, the pool,
// the step's cache events, the attention weights of the newest row, naive and cached logits
// compared, timings and FLOPs. A Step never changes once published, so panels read it without
// locks, and stepping back in time is only a smaller index.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend.h"
#include "cache.h"
#include "cache_factory.h"
#include "config.h"
#include "model.h"

namespace kvlab::viz {

// The variants the viewer runs, in the registry's order: those whose registry entry says what
// the viewer runs with them (core/cache_factory.h: VariantInfo::viewer).
inline const std::vector<Variant> kVariants = viewer_variants();

// What a session runs; the controls edit a copy and restart the session with it.
struct Settings {
    Variant variant = Variant::contiguous_head;
    std::string device = "cpu";  // where the decoders run: cpu, gpu or gpu-host (gpu/device.h)
    std::string model_path;      // llama2.c checkpoint; "" = the shared stories260K if present
    std::string tokenizer_path;  // "" = tok512.bin beside the shared model
    std::string panel_cache = "auto";  // auto, on, off or a folder (core/panel_cache.h)
    bool random_model = false;   // a random model of `shape` even when a checkpoint exists
    Config shape;                // the random model's shape (n_layers, n_heads, n_kv_heads editable)
    std::uint64_t seed = 7;      // the random model's weights
    std::string prompt = "Once upon a time";
    int steps = 48;        // decode steps after the prefill
    int block_size = 4;    // paged, prefix_shared
    int n_blocks = 0;      // paged, prefix_shared: pool size; 0 = enough for every sequence
    int quant_bits = 8;    // quantized: 8 or 4
    int sinks = 2;         // window
    int window = 16;       // window, fifo
    int recent = 8;        // h2o: latest positions always kept
    int heavy = 8;         // h2o: older positions kept by accumulated attention
    KVFormat kv_format = KVFormat::fp32;  // what the caches store K and V in (variants that take one)
    AttentionSpec attention;              // what the cached and naive decoders run (--attention)
    int n_threads = 1;                    // the kernels' threads, every decoder's (never changes a bit)
    int fork_at = 8;       // prefix_shared: decode step after which A forks into C
    int free_fork_at = 0;  // prefix_shared: decode step after which C is freed (0 = never)
    // The serving view (serving.h): a workload of serve_requests requests through the
    // continuous-batching scheduler, shown instead of the single-sequence panels.
    bool serve = false;
    int serve_requests = 24;
    int beam_width = 0;  // > 0: the same view of beam search with this many beams over the prompt
    // > 0: a random MLA model (core/mla.h) of the model's shape, with this latent rank, follows A's
    // tokens; the Layouts panel draws its latent cache beside the K rows.
    int mla_rank = 0;
    // Builds the device's backend; empty: make_backend (gpu/device.h). Tests plant a wrong
    // kernel behind a device name with it, to show the CPU comparison catches it.
    std::function<std::unique_ptr<Backend>(std::string_view device, const Model& model)> make_backend = nullptr;
};

// One sequence after a step.
struct SeqView {
    int id = 0;               // the cache's seq_id; 0 is A, the sequence the panels follow
    std::string name;         // "A", "B", "C"
    bool alive = true;        // false once freed
    std::vector<int> tokens;  // [length] what the cache holds
    std::vector<int> table;   // paged: [ceil(length / block_size)] physical block per logical block
};

// The block pool after a step (paged variants).
struct PoolView {
    enum class State { free, used, cached };  // cached: unreferenced but published (reclaimable)
    int block_size = 0, n_blocks = 0;
    std::vector<State> state;              // [n_blocks]
    std::vector<int> refcount;             // [n_blocks]
    std::vector<char> published;           // [n_blocks]
    std::vector<std::vector<int>> owners;  // [n_blocks] seq ids whose tables hold the block
    int n_free = 0, n_cached = 0, n_used = 0;
    std::int64_t prefix_hit_positions = 0;
};

struct TopToken {
    int id = 0;
    float logit = 0;
    std::string text;  // the tokenizer's piece, or "<id>"
};

// Naive against cached logits for one sequence at one step.
struct Exactness {
    int seq = 0;
    bool bitwise_equal = false;
    std::int64_t max_ulp = 0;                     // largest ULP distance over the vocabulary (0 when equal)
    int n_differ = 0;                             // logits whose bits differ (of vocab_size)
    double max_abs = 0;                           // largest |naive - cached|
    int next_token = 0;                           // what the sequence appends next (greedy for A)
    std::vector<TopToken> top_cached, top_naive;  // the five largest logits of each
    // Decoders on a device other than the CPU: the CPU's naive decode of the same sequence is
    // the reference that this device's naive and cached logits must equal, bit for bit.
    bool cross_device = false;
    bool naive_equals_cpu = false, cached_equals_cpu = false;
    std::int64_t max_ulp_cpu = 0;  // the larger ULP distance of the two from the CPU's (0 when equal)
    bool equal() const { return bitwise_equal && (!cross_device || (naive_equals_cpu && cached_equals_cpu)); }
};

struct Step {
    enum class Phase { prefill, decode };
    int index = 0;  // 0 is the first prefill
    Phase phase = Phase::prefill;
    std::string label;  // "prefill A", "prefill B (prefix hit 8)", "decode"
    int first_pos = 0;  // A's positions written this step: first_pos .. first_pos + n_new - 1
    int n_new = 0;
    int length = 0;  // A's length after the step
    std::vector<SeqView> seqs;
    std::optional<PoolView> pool;
    std::vector<CacheEvent> events;  // what the caches did during this step

    // Cost of this step (all sequences it ran) for each decoder.
    double cached_seconds = 0, naive_seconds = 0;
    std::uint64_t cached_flops = 0, naive_flops = 0;
    std::int64_t kv_reserved_bytes = 0;  // what the caches hold (MemoryStats, summed)
    std::int64_t kv_used_bytes = 0;      // K and V of the valid positions, in the cache's format

    // A's newest row: attention weights per layer and head over the positions it attended.
    std::vector<int> attended;     // [n_attended] logical positions, increasing
    std::vector<char> resident;    // window, fifo: [length] whether t's rows are still in the ring (empty: all are);
                                   // h2o: whether layer 0's KV head 0 keeps them
    std::vector<int> kept;         // h2o: [n_layers, n_kv_heads, n_attended] the positions each layer's KV head
                                   // keeps, increasing: those its query heads attended (empty: `attended`)
    std::vector<float> weights;    // [n_layers, n_heads, n_attended]
    // A's newest position, layer 0, KV head 0: the K row as computed (fp32, before it is stored),
    // each element's code in the cache's format, and what the cache holds for it (read back from
    // host-visible storage: empty when the rows live on a device).
    std::vector<float> k_fp32;           // [head_size]
    std::vector<std::uint32_t> k_codes;  // [head_size]
    std::vector<float> k_held;           // [head_size] or empty
    // The MLA model's latent cache (settings.mla_rank > 0): positions held, bytes, and the newest
    // position's cached row [c ; k_R] in every layer.
    int mla_length = 0;
    std::int64_t mla_bytes = 0;
    std::vector<float> mla_newest;       // [n_layers, rank + rope_dim]
    float k_scale = 1;                   // layer 0's K scale (fp8; 1 otherwise)
    // Integer formats: each element's group's scale and minimum (its value: code * scale + min).
    std::vector<QuantRange> k_groups;  // [head_size] or empty
    std::vector<Exactness> exact;  // one per live sequence that ran this step
    std::string note;              // a message for this step ("pool exhausted: C stopped")
};

// Fixed for a session.
struct SessionInfo {
    Settings settings;
    Config config;                        // the model's shape
    std::string model_source;             // "stories260K.bin" or "random (seed 7)"
    std::string device;                   // the backend the decoders run on ("cpu", "gpu", "gpu-host")
    std::string cache_name;               // Cache::name() of A's cache
    bool exact = true;                    // the variant promises bitwise equality
    std::vector<int> prompt;              // [prompt_len] token ids
    int total_steps = 0;                  // steps the session will run: prefills + decode steps
    std::int64_t kv_bytes_per_token = 0;  // 2 * n_layers * kv_dim * bytes per element: the formula's slope
    KVFormat kv_format = KVFormat::fp32;  // what the caches store K and V in
    std::string error;                    // non-empty when the settings could not start a session
    std::vector<std::string> pieces;      // [vocab_size] the tokenizer's pieces, or empty
    int mla_rank = 0, mla_rope_dim = 0;   // the MLA model's latent (settings.mla_rank; 0: none)
};

// The devices the viewer offers here: cpu, gpu-host (the GPU's kernels launched on the host), and
// gpu where this build and machine have one.
std::vector<std::string> viewer_devices();

// A token as text for the panels: its piece made printable, or "<id>" without a tokenizer.
std::string token_text(const SessionInfo& info, int id);

}  // namespace kvlab::viz
