#include "memory.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common.h"
#include "json_text.h"
#include "memory_model.h"

namespace kvlab::cli {

namespace {

// 3 significant figures in binary units ("512 KiB", "68.6 KiB", "2.00 GiB"); exact bytes are in --json.
std::string human_bytes(std::int64_t bytes) {
    static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) return fmt::format("{} B", bytes);
    double v = double(bytes);
    int u = 0;
    // 999.5 rather than 1024: "1000 KiB" would be a fourth significant figure.
    while (v >= 999.5 && u < 6) {
        v /= 1024.0;
        u++;
    }
    if (v >= 99.95) return fmt::format("{:.0f} {}", v, units[u]);
    if (v >= 9.995) return fmt::format("{:.1f} {}", v, units[u]);
    return fmt::format("{:.2f} {}", v, units[u]);
}

std::string cached_shape(const PublishedShape& s) {
    if (s.mla_latent > 0) return fmt::format("MLA {}+{}", s.mla_latent, s.mla_rope);
    return fmt::format("{} x {}", s.n_kv_heads, s.head_size);
}

// KV bytes of `tokens` positions; zero positions (no waste at all) are zero bytes, not an error.
std::int64_t bytes_for(const PublishedShape& s, int bits, std::int64_t tokens) {
    return tokens == 0 ? 0 : kv_bytes(s, bits, tokens, 1);
}

// Every figure run_memory prints: computed before any line is printed, so that a figure past
// int64 stops the run with one line that names the options that made it, not half a table.
struct Figures {
    std::vector<PublishedShape> models;
    std::vector<Precision> precs;
    // The waste figures need one model and one precision: the chosen ones, else Llama 2 7B at fp16.
    PublishedShape wmodel;
    Precision wprec;
    bool spread = false;  // lengths drawn uniformly, not given by --lengths
    ReservationWaste w;
    std::vector<std::vector<std::int64_t>> totals;  // [models, precisions] bytes
    std::int64_t contiguous_wasted = 0, paged_wasted = 0;
    std::int64_t used_bytes = 0, contiguous_bytes = 0, contiguous_wasted_bytes = 0, paged_bytes = 0,
                 paged_wasted_bytes = 0;
};

// --lengths, checked against --context, or a uniform spread of --requests lengths.
std::vector<int> request_lengths(const MemoryOptions& o) {
    if (o.lengths.empty()) return spread_lengths(o.requests, 1, o.context, o.seed);
    std::vector<int> lengths = parse_int_list("--lengths", o.lengths);
    for (int len : lengths)
        if (len < 1 || len > o.context)
            throw Error(fmt::format("--lengths: {} is outside [1, --context = {}]", len, o.context));
    return lengths;
}

// figure(), or an Error saying `message` when it is past int64 (an Error of its own).
template <class Figure>
std::int64_t named(Figure&& figure, const std::string& message) {
    try {
        return figure();
    } catch (const Error&) {
        throw Error(message);
    }
}

// The KV bytes of every model at every precision, for --context tokens x --batch sequences.
void total_bytes(const MemoryOptions& o, Figures& f) {
    f.totals.resize(f.models.size());
    for (std::size_t m = 0; m < f.models.size(); m++)
        for (const auto& p : f.precs)
            f.totals[m].push_back(named([&] { return kv_bytes(f.models[m], p.bits, o.context, o.batch); },
                                        fmt::format("--context {} x --batch {}: the KV bytes of {} at {} do not fit "
                                                    "in a 64-bit count (lower either)",
                                                    o.context, o.batch, f.models[m].name, p.name)));
}

// The bytes of the waste figures' tokens.
void waste_bytes(const MemoryOptions& o, Figures& f) {
    // The contiguous reservation is the largest waste figure (used and wasted are parts of it; a
    // paged one is at most a block per request more): the requests times --context make it.
    const std::string requests = f.spread ? fmt::format("--requests {}", f.w.n_requests)
                                          : fmt::format("{} request lengths in --lengths", f.w.n_requests);
    const auto bytes = [&](std::int64_t tokens) {
        return named([&] { return bytes_for(f.wmodel, f.wprec.bits, tokens); },
                     fmt::format("{} x --context {} reserve {} positions: their KV bytes at {} do not fit in a 64-bit "
                                 "count (lower either)",
                                 requests, o.context, f.w.contiguous_reserved, f.wprec.name));
    };
    f.used_bytes = bytes(f.w.used);
    f.contiguous_bytes = bytes(f.w.contiguous_reserved);
    f.contiguous_wasted_bytes = bytes(f.contiguous_wasted);
    f.paged_bytes = bytes(f.w.paged_reserved);
    f.paged_wasted_bytes = bytes(f.paged_wasted);
}

Figures figures(const MemoryOptions& o) {
    if (o.context < 1) throw Error(fmt::format("--context must be at least 1, got {}", o.context));
    if (o.batch < 1) throw Error(fmt::format("--batch must be at least 1, got {}", o.batch));
    Figures f;
    if (o.model == "all")
        f.models = published_shapes();
    else
        f.models = {find_shape(o.model)};
    if (o.precision == "all")
        f.precs = precisions();
    else
        f.precs = {parse_precision(o.precision)};
    f.wmodel = o.model == "all" ? find_shape("Llama 2 7B") : f.models[0];
    f.wprec = o.precision == "all" ? parse_precision("fp16") : f.precs[0];

    f.spread = o.lengths.empty();
    f.w = reservation_waste(request_lengths(o), o.context, o.block_size);
    f.contiguous_wasted = f.w.contiguous_reserved - f.w.used;
    f.paged_wasted = f.w.paged_reserved - f.w.used;
    total_bytes(o, f);
    waste_bytes(o, f);
    return f;
}

void print_json(const MemoryOptions& o, const Figures& f) {
    const ReservationWaste& w = f.w;
    nlohmann::json j;
    j["context"] = o.context;
    j["batch"] = o.batch;
    for (const auto& p : f.precs) j["precisions"].push_back({{"name", p.name}, {"bits", p.bits}});
    for (std::size_t mi = 0; mi < f.models.size(); mi++) {
        const PublishedShape& s = f.models[mi];
        nlohmann::json m = {{"name", s.name},           {"n_layers", s.n_layers},
                            {"n_heads", s.n_heads},     {"n_kv_heads", s.n_kv_heads},
                            {"head_size", s.head_size}, {"mla_latent", s.mla_latent},
                            {"mla_rope", s.mla_rope},   {"source", s.source}};
        for (std::size_t pi = 0; pi < f.precs.size(); pi++) {
            const Precision& p = f.precs[pi];
            m["bits_per_token"][p.name] = kv_bits_per_token(s, p.bits);
            m["bytes_per_token"][p.name] = kv_bytes_per_token(s, p.bits);
            m["total_bytes"][p.name] = f.totals[mi][pi];
        }
        j["models"].push_back(m);
    }
    nlohmann::json lj = {{"count", w.n_requests}, {"min", w.min_len}, {"max", w.max_len}, {"sum", w.used}};
    lj["source"] = f.spread ? "spread" : "given";
    if (f.spread) lj["seed"] = o.seed;
    j["waste"] = {
        {"model", f.wmodel.name},
        {"precision", f.wprec.name},
        {"bits", f.wprec.bits},
        {"max_seq", o.context},
        {"block_size", o.block_size},
        {"lengths", lj},
        {"used_tokens", w.used},
        {"used_bytes", f.used_bytes},
        {"contiguous",
         {{"reserved_tokens", w.contiguous_reserved},
          {"wasted_tokens", f.contiguous_wasted},
          {"reserved_bytes", f.contiguous_bytes},
          {"wasted_bytes", f.contiguous_wasted_bytes},
          {"waste_fraction", w.contiguous_waste_fraction}}},
        {"paged",
         {{"reserved_tokens", w.paged_reserved},
          {"wasted_tokens", f.paged_wasted},
          {"reserved_bytes", f.paged_bytes},
          {"wasted_bytes", f.paged_wasted_bytes},
          {"waste_fraction", w.paged_waste_fraction}}},
    };
    fmt::print("{}\n", json_document(j));
}

// The two tables (bytes per token, and for --context x --batch) and their sources.
void print_sizes(const MemoryOptions& o, const Figures& f) {
    fmt::print(
        "kvlab memory: KV cache of published model shapes (payload only: int8/int4/int2 group scales excluded)\n");
    const auto header = [&](const std::string& title) {
        fmt::print("\n{}\n{:<12} {:>6}  {:<22}", title, "model", "layers", "n_kv_heads x head_size");
        for (const auto& p : f.precs) fmt::print(" {:>9}", p.name);
        fmt::print("\n");
    };
    const auto row_start = [](const PublishedShape& s) {
        fmt::print("{:<12} {:>6}  {:<22}", s.name, s.n_layers, cached_shape(s));
    };
    header("bytes per token (K and V of every layer; MLA: one latent + one RoPE key per layer):");
    for (const auto& s : f.models) {
        row_start(s);
        for (const auto& p : f.precs) fmt::print(" {:>9}", human_bytes(kv_bytes_per_token(s, p.bits)));
        fmt::print("\n");
    }
    header(fmt::format("total for --context {} tokens x --batch {}:", o.context, o.batch));
    for (std::size_t m = 0; m < f.models.size(); m++) {
        row_start(f.models[m]);
        for (std::int64_t bytes : f.totals[m]) fmt::print(" {:>9}", human_bytes(bytes));
        fmt::print("\n");
    }
    fmt::print("\nsources:\n");
    for (const auto& s : f.models) fmt::print("  {:<12} {}\n", s.name, s.source);
}

// The reservation waste of a contiguous cache against a paged one.
void print_waste(const MemoryOptions& o, const Figures& f) {
    const ReservationWaste& w = f.w;
    fmt::print("\nreservation waste: {} requests, ", w.n_requests);
    if (f.spread)
        fmt::print("lengths uniform in [1, {}] (seed {})", o.context, o.seed);
    else
        fmt::print("lengths from --lengths");
    fmt::print(": min {}, mean {:.1f}, max {}; {} tokens used\n", w.min_len, w.mean_len(), w.max_len, w.used);
    fmt::print("KV bytes for {} at {} ({} per token)\n\n", f.wmodel.name, f.wprec.name,
               human_bytes(kv_bytes_per_token(f.wmodel, f.wprec.bits)));
    fmt::print("{:<30} {:>16} {:>14} {:>7} {:>12} {:>12}\n", "reservation", "reserved tokens", "wasted tokens", "waste",
               "reserved KV", "wasted KV");
    const auto waste_row = [&](const std::string& name, std::int64_t reserved, std::int64_t wasted, double fraction,
                               std::int64_t reserved_bytes, std::int64_t wasted_bytes) {
        fmt::print("{:<30} {:>16} {:>14} {:>6.1f}% {:>12} {:>12}\n", name, reserved, wasted, 100.0 * fraction,
                   human_bytes(reserved_bytes), human_bytes(wasted_bytes));
    };
    waste_row(fmt::format("contiguous (max_seq {})", o.context), w.contiguous_reserved, f.contiguous_wasted,
              w.contiguous_waste_fraction, f.contiguous_bytes, f.contiguous_wasted_bytes);
    waste_row(fmt::format("paged (block_size {})", o.block_size), w.paged_reserved, f.paged_wasted,
              w.paged_waste_fraction, f.paged_bytes, f.paged_wasted_bytes);
    fmt::print(
        "\ncontiguous: every request reserves max_seq = --context positions up front.\n"
        "paged: a request holds ceil(length / block_size) blocks; only its last block is partly empty.\n");
}

}  // namespace

int run_memory(const MemoryOptions& o) {
    const Figures f = figures(o);
    if (o.json) {
        print_json(o, f);
        return 0;
    }
    print_sizes(o, f);
    print_waste(o, f);
    return 0;
}

void add_memory_options(CLI::App* cmd, MemoryOptions& o) {
    cmd->add_option("--context", o.context, "tokens per sequence, and max_seq reserved per request (default 4096)")
        ->check(CLI::Range(1, 1 << 24));
    cmd->add_option("--batch", o.batch, "sequences held at once (default 1)")->check(CLI::Range(1, 1 << 20));
    auto* precision = cmd->add_option("--precision", o.precision, "all (default), fp32, fp16, bf16, fp8, int4 or int2");
    cmd->add_option(
           "--kv-format", o.precision,
           "a KV format kvlab stores (fp32, bf16, fp16, fp8-e5m2, fp8-e4m3, int8, int4): --precision by its name")
        ->excludes(precision);
    cmd->add_option("--model", o.model,
                    "all (default) or one of: Llama 2 7B, Llama 3 8B, Llama 3 70B, Mistral 7B, GPT-3 175B, DeepSeek-V3 "
                    "(case, spaces and dashes ignored: llama2-7b)");
    cmd->add_option("--block-size", o.block_size, "positions per page of the paged cache (default 16)")
        ->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--lengths", o.lengths, "request lengths, e.g. 100,2000,4096 (default: a uniform spread)");
    cmd->add_option("--requests", o.requests, "requests in the uniform spread of lengths (default 64)")
        ->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--seed", o.seed, "seed of the uniform spread of lengths (default 1)");
    cmd->add_flag("--json", o.json, "machine-readable output, every size in exact bytes");
}

}  // namespace kvlab::cli
