// kvlab core: the model's shape.
//
// Glossary (used everywhere: code, CLI, tests, viewer):
//   dim         width of the residual stream
//   hidden_dim  width of the feed-forward layer
//   n_layers    transformer blocks
//   n_heads     query heads; head_size = dim / n_heads
//   n_kv_heads  key/value heads (grouped-query attention); kv_dim = n_kv_heads * head_size
//   vocab_size  tokens in the vocabulary
//   max_seq     the longest sequence the model (and a contiguous cache) accepts
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvlab {

// Every error kvlab reports for bad input is one of these; what() is one line.
struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// User text (a file name, an option's value) made safe to echo in a one-line message: control
// characters become \n, \t, \r or \xNN (ESC is \x1b), so nothing reaches a terminal raw;
// printable ASCII and whole UTF-8 characters pass unchanged.
std::string one_line(const std::string& text);

// Text that may hold any bytes (a path, a prompt, a generated token's piece) made valid UTF-8, for
// JSON: valid UTF-8 passes unchanged, newlines included; each byte outside a well-formed sequence
// (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF) becomes the four characters
// \xNN, as one_line writes it.
std::string valid_utf8(const std::string& text);

// Option text to numbers. They stay in core, not cli/: core's prompt_tokens (model_loader.h) reads
// --tokens with parse_int_list, and fuzz/fuzz_options.cpp calls both, and Config::parse, directly.
// "42" -> 42; anything else is an Error naming `option` (with `hint` after the message).
int parse_int(const std::string& option, const std::string& text, const std::string& hint = "");
// "1,2,3" -> {1, 2, 3}; anything else is an Error naming `option`.
std::vector<int> parse_int_list(const std::string& option, const std::string& text);
// "64MiB", "2GiB", "1000000": bytes (B, KiB, MiB, GiB; at most 10^15); anything else is an Error
// naming `option`.
std::int64_t parse_bytes(const std::string& option, const std::string& text);

struct Config {
    int dim = 0;
    int hidden_dim = 0;
    int n_layers = 0;
    int n_heads = 0;
    int n_kv_heads = 0;
    int vocab_size = 0;
    int max_seq = 0;

    int head_size() const { return dim / n_heads; }
    int kv_dim() const { return n_kv_heads * head_size(); }
    // Query heads per KV head: query head h reads KV head h / group().
    int group() const { return n_heads / n_kv_heads; }

    // Throws kvlab::Error naming the first field that makes no sense.
    void validate() const;
    // Number of float32 parameters (classifier counted when not shared).
    std::int64_t n_params(bool shared_classifier) const;
    // "dim=64 hidden_dim=172 n_layers=5 ..." for messages and logs.
    std::string describe() const;
    // Parses "dim=64,hidden_dim=172,..." (any subset; the rest keep their values).
    static Config parse(const std::string& spec, Config base);

    bool operator==(const Config&) const = default;
};

// Shapes used by the CLI and the benchmark.
Config stories260k_shape();  // dim 64, hidden 172, 5 layers, 8 heads, 4 KV heads, vocab 512, max_seq 512
Config stories15m_shape();   // dim 288, hidden 768, 6 layers, 6 heads, 6 KV heads, vocab 32000, max_seq 256

// Largest tensor size we accept anywhere: keeps every index product inside int64 and every
// allocation honest (a header claiming 10^18 parameters is an error, not an allocation attempt).
inline constexpr std::int64_t kMaxElements = std::int64_t{1} << 34;

// The one size limit: the most memory one model's weights, one block pool or one cache may take.
// A teaching model needs far less (stories15M is 58 MiB), and a typo in a shape or a pool size must
// be a one-line refusal, not an allocation that takes the machine's memory.
inline constexpr std::int64_t kMaxBytes = std::int64_t{1} << 30;
// Throws Error("<what> would take N B, over the limit of 1073741824 B (1 GiB) ...") when `count`
// things of `bytes_each` bytes are more than kMaxBytes (overflow included). Every constructor of a
// model (Weights), a pool (BlockPool) and a cache's rows (KVStorage) calls it before allocating.
void check_size(const std::string& what, std::int64_t count, std::int64_t bytes_each);

// The process's memory budget, kMaxBytes for everything kvlab holds at once: a model's weights and
// RoPE tables, the CPU's packed weights, every KV cache and block pool, and each decoder's
// activations are charged here before they are allocated, and released with them. A charge the
// budget cannot hold is an Error naming what asked, its size, and the biggest holder already
// charged, before any byte is allocated. Copying a charge charges its bytes again (the copy holds
// its own); moving it moves the charge.
class MemoryCharge {
public:
    MemoryCharge() = default;
    MemoryCharge(std::string what, std::int64_t bytes);
    MemoryCharge(const MemoryCharge& other);
    MemoryCharge& operator=(const MemoryCharge& other);
    MemoryCharge(MemoryCharge&& other) noexcept;
    MemoryCharge& operator=(MemoryCharge&& other) noexcept;
    ~MemoryCharge();
    std::int64_t bytes() const { return bytes_; }

private:
    void release() noexcept;
    std::uint64_t id_ = 0;  // 0: nothing charged
    std::int64_t bytes_ = 0;
    std::string what_;
};
// The bytes charged now, over the whole process.
std::int64_t memory_charged();
// The budget: kMaxBytes, or less where the environment's KVLAB_MEMORY_BUDGET says so (bytes, or a
// whole number of KiB, MiB or GiB, from 1 MiB to 1 GiB), for a smaller machine or a test that
// wants a refusal without allocating a GiB. A bad value is an Error at the first charge.
std::int64_t memory_budget();

}  // namespace kvlab
