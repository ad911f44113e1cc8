// kvlab core: the two decoders.
//
//   NaiveDecoder   every step runs the whole prefix of T tokens through the model as matrices:
//                  Q, K, V, O and the feed-forward are [T, *] products, attention builds a
//                  T x T score matrix per head under a causal mask. Nothing survives a step.
//   CachedDecoder  prefill(prompt) runs the prompt as matrices once and writes every layer's
//                  K and V rows into the KV cache; each decode(token) then runs one row,
//                  writes its K and V at pos, and attends over positions 0..pos.
//
// They are different algorithms built from the same kernels (kernels.h), which is why their
// logits agree bit for bit (NUMERICS.md). Both return the logits of the last position.
//
// A cached step runs in two halves, as nano-vllm's prepare_decode and run_model: plan_step asks
// the caches where every row's K and V go and which slots each row reads (a StepPlan, host
// integers only), then CachedDecoder::execute runs the plan as one layer loop.
// The layer code (embed, rmsnorm, q/k/v products, RoPE, cache write, attention, output product,
// feed-forward, classifier) is written once, against a Backend (backend.h): the same code
// drives the CPU and a GPU. Buffers live in the backend's memory; only tokens go in and logits
// come out.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "backend.h"
#include "cache.h"
#include "model.h"
#include "quantized_cache.h"

namespace kvlab {

// Work buffers for `rows` rows of the residual stream in a backend's memory; the forward of one
// layer, minus attention, is the same code for both decoders. Buffers grow, never shrink, so a
// captured step keeps its pointers.
struct Activations {
    int rows = 0;
    int capacity = 0;
    Buffer<float> x;    // [rows, dim]        residual stream
    Buffer<float> xb;   // [rows, dim]        normalized input of a sublayer
    Buffer<float> q;    // [rows, dim]        queries, all heads
    Buffer<float> k;    // [rows, kv_dim]
    Buffer<float> v;    // [rows, kv_dim]
    Buffer<float> att;  // [rows, dim]        attention output, all heads
    Buffer<float> out;  // [rows, dim]        output of a sublayer before the residual add
    Buffer<float> h1;   // [rows, hidden_dim]
    Buffer<float> h3;   // [rows, hidden_dim]
    MemoryCharge charge;  // the buffers above on the memory budget
    void resize(Memory& memory, const Config& c, int rows);
    void check(const Config& c) const;  // asserts every shape above
};

// One cached step, planned on the host before any float moves. Row i runs token tokens[i] at
// logical position positions[i]; kv[i] names its sequence's cache storage, the slot its own K
// and V go to (write_slot) and how many slots it attends (n): slots[i * max_n + j], j < n, in
// increasing logical position. A slot of -1 reads as NaN.
struct StepPlan {
    struct Sequence {
        Cache* cache = nullptr;
        int first_row = 0;  // its rows are first_row .. first_row + n_rows - 1
        int n_rows = 0;
        int start = 0;  // the logical position of its first row
    };
    std::vector<Sequence> seqs;       // [n_seqs]
    std::vector<int> tokens;          // [rows]
    std::vector<int> positions;       // [rows] the RoPE position of each row
    std::vector<RowKV> kv;            // [rows]
    int max_n = 1;                    // the row stride of slots
    std::vector<std::int64_t> slots;  // [rows, max_n]
    std::vector<int> kv_head;         // [n_heads] the KV head each query head reads
    std::vector<int> out_rows;        // [n_out] the rows whose logits the step returns, in order
    int rows() const { return int(tokens.size()); }
    void check(const Config& c) const;  // asserts every shape above
};

// The plan of a step whose caches already hold its positions (Cache::append done): sequence s's
// rows are tokens[s] at positions start[s], start[s] + 1, ... With all_rows (one sequence) every
// row's logits are returned, else each sequence's last. Slots are padded to at least min_n per
// row (max_seq for a step a backend captures, so that every step has the same shapes).
StepPlan plan_step(const Config& c, std::span<Cache* const> caches, std::span<const std::vector<int>> tokens,
                   std::span<const int> start, bool all_rows, int min_n = 1);

// Watches cached steps from outside the decoder: after each layer's attention, the softmax
// weights of one row of the step. Watching changes no logit (the weights are copied after the
// kernel is done with them); a watched step is not captured as a graph.
class StepObserver {
public:
    virtual ~StepObserver() = default;
    // The row of `plan` to watch, or -1 for none.
    virtual int watch(const StepPlan& plan) = 0;
    // Layer l's weights of the watched row: [n_heads, n], head h's n weights from h * n.
    virtual void attention_weights(int l, int n, std::span<const float> weights) = 0;
};

// The viewer's observer: the weights of the first sequence's last row, every layer.
class AttentionProbe final : public StepObserver {
public:
    int n = 0;                   // positions that row attended
    std::vector<float> weights;  // [n_layers, n_heads, max_seq]: the first n of each run are set
    int watch(const StepPlan& plan) override;
    void attention_weights(int l, int n, std::span<const float> w) override;

private:
    int n_heads_ = 0, max_seq_ = 0;
};

class NaiveDecoder {
public:
    // Runs on `backend` (it must outlive the decoder).
    explicit NaiveDecoder(Backend& backend);
    // Runs on a CPU backend of its own.
    explicit NaiveDecoder(const Model& model, int n_threads = 1);
    ~NaiveDecoder();
    // Logits [vocab_size] after the full forward over tokens[0..T).
    const std::vector<float>& forward(std::span<const int> tokens);

    Backend& backend() { return *backend_; }
    Exec exec;  // threads, and the FLOPs counted so far
    // The format-aware naive decode: every position's K and V are stored in this format with
    // these scales ([n_layers, 2], empty: all 1), through the backend's store_kv as a cache
    // stores them, and read back through load_kv, decoded as cached attention decodes them,
    // before the causal attention reads them.
    KVFormat kv_format = KVFormat::fp32;
    std::vector<float> kv_scales;
    // The quantized cache's naive decode (quantized_cache.h): K and V rounded through the same
    // groups as a QuantizedCache with this spec holds them. Values, and keys per token, round
    // every position; keys per channel round a group of positions once it is complete, and a
    // query at p reads a key quantized exactly when the key's group ends at or before p (KIVI's
    // fp32 residual is the rest). Needs host-visible memory; exclusive with kv_format.
    std::optional<QuantSpec> quant;

private:
    std::unique_ptr<Backend> own_;
    Backend* backend_;
    Activations act_;
    Buffer<RowKV> store_rows_;                // [T] position t's K and V go to row t of k_codes_, v_codes_
    Buffer<std::uint8_t> k_codes_, v_codes_;  // [T, kv_dim] elements of kv_format
    Buffer<float> scales_;                    // [n_layers, 2] kv_scales, or all 1
    Buffer<float> k_stored_, v_stored_;       // [T, kv_dim] K and V as stored, read back
    Buffer<float> k_mix_, att_mix_;           // quant, keys per channel: [T, kv_dim] and [T, dim] scratch
    Buffer<int> tokens_;     // [T]
    Buffer<int> positions_;  // [T] 0..T-1
    Buffer<int> kv_head_;    // [n_heads]
    Buffer<float> logits_dev_;   // [vocab_size]
    std::vector<float> logits_;  // [vocab_size]
};

class CachedDecoder {
public:
    // Runs on `backend` with a contiguous head-major cache of its own in the backend's memory.
    explicit CachedDecoder(Backend& backend);
    // Runs on `backend` and `cache` (any variant in the backend's memory, of the model's shape;
    // both must outlive the decoder: a cache destroyed first cannot be detected). The decoder
    // keeps no position of its own, so another owner may roll the cache back between calls.
    CachedDecoder(Backend& backend, Cache& cache);
    // Runs on `backend` with no cache yet: step() brings its own caches, and prefill, decode and
    // extend run on the one set_cache() names (sequence_engine.h switches it per call).
    CachedDecoder(Backend& backend, std::nullptr_t);
    // The same on a CPU backend of its own.
    explicit CachedDecoder(const Model& model, int n_threads = 1);
    CachedDecoder(const Model& model, Cache& cache, int n_threads = 1);
    ~CachedDecoder();

    // Runs tokens as rows at positions pos()..pos()+n-1, appending their K and V to the cache;
    // returns the logits of the last one. decode(t) is prefill of one token.
    const std::vector<float>& prefill(std::span<const int> tokens);
    const std::vector<float>& decode(int token) { return prefill(std::span<const int>(&token, 1)); }
    // prefill, returning the logits of every row: [tokens.size(), vocab_size], row i those of
    // position pos()+i. Each row equals decode's at that position bit for bit (the classifier is
    // row-wise, its order independent of the row count), so one step can verify k drafts.
    const std::vector<float>& prefill_rows(std::span<const int> tokens);
    // Continues the cache with `sequence`, of which it must hold a prefix: an edited prompt is a
    // stale-cache error, never silent garbage. An empty cache first maps what the prefix cache
    // has of it (prefix_hit() positions); then the rest runs as a prefill.
    const std::vector<float>& extend(std::span<const int> sequence);
    int prefix_hit() const { return prefix_hit_; }

    // One step of a batch: sequence s appends tokens[s] to *caches[s]; every row of every
    // sequence goes through each product together. Returns [n_seqs, vocab_size] logits, the last
    // row of each sequence; each equals that sequence's solo run bit for bit. A null or repeated
    // cache, a count of token lists that differs, or a sequence that does not fit (its tokens, its
    // cache's shape, max_seq, max_append, its pool's free blocks) throws Error naming it by index
    // and leaves every cache as it was. Nothing of the caches is kept between calls.
    const std::vector<float>& step(std::span<Cache* const> caches, std::span<const std::vector<int>> tokens);

    int pos() const { return cache().length(); }  // the next position to be written
    Cache& cache() { return const_cast<Cache&>(std::as_const(*this).cache()); }
    const Cache& cache() const;    // throws Error when no cache is set
    void set_cache(Cache& cache);  // checks its shape and memory, as the constructors do
    void reset() { cache().clear(); }
    Backend& backend() { return *backend_; }

    Exec exec;
    // Applied to every plan before it runs; empty in kvlab itself. The verification suite plants
    // bugs this way (proofs/planted.h), from outside the decoder.
    std::function<void(StepPlan&)> transform;

    // Sees every step's attention weights when set (the viewer's AttentionProbe); must outlive
    // the steps it watches.
    StepObserver* observer = nullptr;

private:
    void check_cache(const Cache& cache) const;
    // prefill and prefill_rows: tokens as steps of at most the cache's max_step() rows.
    void run_chunks(std::span<const int> tokens, bool all_rows);
    // Runs a plan: the layer loop, then the logits of its out_rows ([n_out, vocab_size]).
    const std::vector<float>& execute(const StepPlan& plan);
    // Hands layer l's weights of the watched row (n positions) to the observer, and to `fed`,
    // the cache that reads them (H2O), when there is one.
    void observe_layer(int l, int max_n, int n, Cache* fed);
    // The row of the step whose cache reads its attention weights, or -1; throws Error when such a
    // cache shares its step or steps several rows.
    static int fed_row(const StepPlan& p);
    std::unique_ptr<Backend> own_backend_;
    Backend* backend_;
    std::unique_ptr<Cache> own_cache_;  // the default cache, when none was given
    Cache* cache_;
    Activations act_;
    // The plan in the backend's memory, uploaded once per step.
    Buffer<int> tokens_;               // [rows]
    Buffer<int> positions_;            // [rows] RoPE positions
    Buffer<RowKV> kv_;                 // [rows] each row's cache, where its K and V go, how many slots it reads
    Buffer<std::int64_t> slots_;       // [rows, max_n] the slots each row attends
    Buffer<int> kv_head_;              // [n_heads]
    Buffer<float> out_x_;              // [n_out, dim] the residual rows of out_rows
    Buffer<float> normed_;             // [n_out, dim]
    Buffer<float> logits_dev_;         // [n_out, vocab_size]
    Buffer<float> probe_dev_;          // [n_heads, max_n] the watched row's weights, on the backend
    std::vector<float> probe_host_;    // [n_heads, n] the same, handed to the observer
    std::vector<float> logits_;        // [n_out, vocab_size]: each sequence's last row, or every row (all_rows_)
    std::vector<float> row_logits_;    // [tokens, vocab_size] prefill_rows' result, over its chunks
    bool all_rows_ = false;            // set by prefill_rows: classify every row of the step
    bool in_request_ = false;          // a chunk of a longer prefill: the caches commit at its end
    int prefix_hit_ = 0;
};

// Rescoring (as reinforcement learning rescores sampled text): the log-probabilities of
// sequence[from..] (1 <= from < size), each token's under the logits of the position before it,
// from one prefill_rows of sequence[0..size-1) on `dec`, whose cache must be empty. Each equals,
// bit for bit, token_logprob (kernels.h) of the logits decode produced at that position.
std::vector<float> rescore(CachedDecoder& dec, std::span<const int> sequence, int from);

// fp8 scales [n_layers, 2] calibrated once from a prompt, as engines calibrate k_scale and
// v_scale: an fp32 prefill of `tokens`, then for each layer the largest |K| (and |V|) over every
// position and KV head divided by the format's largest finite value, so that the largest value
// seen is stored unclipped; a layer whose K (or V) is all zero gets 1. Throws Error for a format
// that takes no scale.
std::vector<float> calibrate_kv_scales(const Model& model, std::span<const int> tokens, KVFormat format);

// Shared by both decoders and the baseline: one-line errors for tokens outside the
// vocabulary and sequences longer than max_seq (never truncated silently).
void check_tokens(const Config& c, std::span<const int> tokens, int start_pos);

}  // namespace kvlab
