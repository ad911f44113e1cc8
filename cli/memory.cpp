#include "memory.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common.h"
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

}  // namespace

int run_memory(const MemoryOptions& o) {
    if (o.context < 1) throw Error(fmt::format("--context must be at least 1, got {}", o.context));
    if (o.batch < 1) throw Error(fmt::format("--batch must be at least 1, got {}", o.batch));

    std::vector<PublishedShape> models;
    if (o.model == "all")
        models = published_shapes();
    else
        models = {find_shape(o.model)};
    std::vector<Precision> precs;
    if (o.precision == "all")
        precs = precisions();
    else
        precs = {parse_precision(o.precision)};
    // The waste figures need one model and one precision: the chosen ones, else Llama 2 7B at fp16.
    const PublishedShape& wmodel = o.model == "all" ? find_shape("Llama 2 7B") : models[0];
    const Precision wprec = o.precision == "all" ? parse_precision("fp16") : precs[0];

    const bool spread = o.lengths.empty();
    std::vector<int> lengths;
    if (spread) {
        lengths = spread_lengths(o.requests, 1, o.context, o.seed);
    } else {
        lengths = parse_int_list("--lengths", o.lengths);
        for (int len : lengths)
            if (len < 1 || len > o.context)
                throw Error(fmt::format("--lengths: {} is outside [1, --context = {}]", len, o.context));
    }
    const ReservationWaste w = reservation_waste(lengths, o.context, o.block_size);
    const std::int64_t contiguous_wasted = w.contiguous_reserved - w.used, paged_wasted = w.paged_reserved - w.used;

    // Every figure before any line is printed: a figure past int64 stops the run with one line that
    // names the options that made it, not half a table.
    const auto named = [](auto&& figure, const std::string& message) {
        try {
            return figure();
        } catch (const Error&) {
            throw Error(message);
        }
    };
    std::vector<std::vector<std::int64_t>> totals(models.size());  // [models, precisions] bytes
    for (std::size_t m = 0; m < models.size(); m++)
        for (const auto& p : precs)
            totals[m].push_back(named([&] { return kv_bytes(models[m], p.bits, o.context, o.batch); },
                                      fmt::format("--context {} x --batch {}: the KV bytes of {} at {} do not fit in "
                                                  "a 64-bit count (lower either)",
                                                  o.context, o.batch, models[m].name, p.name)));
    // The contiguous reservation is the largest waste figure (used and wasted are parts of it; a
    // paged one is at most a block per request more): the requests times --context make it.
    const std::string requests = spread ? fmt::format("--requests {}", w.n_requests)
                                        : fmt::format("{} request lengths in --lengths", w.n_requests);
    const auto waste_bytes = [&](std::int64_t tokens) {
        return named([&] { return bytes_for(wmodel, wprec.bits, tokens); },
                     fmt::format("{} x --context {} reserve {} positions: their KV bytes at {} do not fit in a 64-bit "
                                 "count (lower either)",
                                 requests, o.context, w.contiguous_reserved, wprec.name));
    };
    const std::int64_t used_bytes = waste_bytes(w.used);
    const std::int64_t contiguous_bytes = waste_bytes(w.contiguous_reserved);
    const std::int64_t contiguous_wasted_bytes = waste_bytes(contiguous_wasted);
    const std::int64_t paged_bytes = waste_bytes(w.paged_reserved);
    const std::int64_t paged_wasted_bytes = waste_bytes(paged_wasted);

    if (o.json) {
        nlohmann::json j;
        j["context"] = o.context;
        j["batch"] = o.batch;
        for (const auto& p : precs) j["precisions"].push_back({{"name", p.name}, {"bits", p.bits}});
        for (std::size_t mi = 0; mi < models.size(); mi++) {
            const PublishedShape& s = models[mi];
            nlohmann::json m = {{"name", s.name},           {"n_layers", s.n_layers},
                                {"n_heads", s.n_heads},     {"n_kv_heads", s.n_kv_heads},
                                {"head_size", s.head_size}, {"mla_latent", s.mla_latent},
                                {"mla_rope", s.mla_rope},   {"source", s.source}};
            for (std::size_t pi = 0; pi < precs.size(); pi++) {
                const Precision& p = precs[pi];
                m["bits_per_token"][p.name] = kv_bits_per_token(s, p.bits);
                m["bytes_per_token"][p.name] = kv_bytes_per_token(s, p.bits);
                m["total_bytes"][p.name] = totals[mi][pi];
            }
            j["models"].push_back(m);
        }
        nlohmann::json lj = {{"count", w.n_requests}, {"min", w.min_len}, {"max", w.max_len}, {"sum", w.used}};
        lj["source"] = spread ? "spread" : "given";
        if (spread) lj["seed"] = o.seed;
        j["waste"] = {
            {"model", wmodel.name},
            {"precision", wprec.name},
            {"bits", wprec.bits},
            {"max_seq", o.context},
            {"block_size", o.block_size},
            {"lengths", lj},
            {"used_tokens", w.used},
            {"used_bytes", used_bytes},
            {"contiguous",
             {{"reserved_tokens", w.contiguous_reserved},
              {"wasted_tokens", contiguous_wasted},
              {"reserved_bytes", contiguous_bytes},
              {"wasted_bytes", contiguous_wasted_bytes},
              {"waste_fraction", w.contiguous_waste_fraction}}},
            {"paged",
             {{"reserved_tokens", w.paged_reserved},
              {"wasted_tokens", paged_wasted},
              {"reserved_bytes", paged_bytes},
              {"wasted_bytes", paged_wasted_bytes},
              {"waste_fraction", w.paged_waste_fraction}}},
        };
        fmt::print("{}\n", j.dump(2));
        return 0;
    }

    fmt::print("kvlab memory: KV cache of published model shapes (payload only: int4/int2 group scales excluded)\n");
    const auto header = [&](const std::string& title) {
        fmt::print("\n{}\n{:<12} {:>6}  {:<22}", title, "model", "layers", "n_kv_heads x head_size");
        for (const auto& p : precs) fmt::print(" {:>9}", p.name);
        fmt::print("\n");
    };
    const auto row_start = [](const PublishedShape& s) {
        fmt::print("{:<12} {:>6}  {:<22}", s.name, s.n_layers, cached_shape(s));
    };
    header("bytes per token (K and V of every layer; MLA: one latent + one RoPE key per layer):");
    for (const auto& s : models) {
        row_start(s);
        for (const auto& p : precs) fmt::print(" {:>9}", human_bytes(kv_bytes_per_token(s, p.bits)));
        fmt::print("\n");
    }
    header(fmt::format("total for --context {} tokens x --batch {}:", o.context, o.batch));
    for (std::size_t m = 0; m < models.size(); m++) {
        row_start(models[m]);
        for (std::int64_t bytes : totals[m]) fmt::print(" {:>9}", human_bytes(bytes));
        fmt::print("\n");
    }
    fmt::print("\nsources:\n");
    for (const auto& s : models) fmt::print("  {:<12} {}\n", s.name, s.source);

    fmt::print("\nreservation waste: {} requests, ", w.n_requests);
    if (spread)
        fmt::print("lengths uniform in [1, {}] (seed {})", o.context, o.seed);
    else
        fmt::print("lengths from --lengths");
    fmt::print(": min {}, mean {:.1f}, max {}; {} tokens used\n", w.min_len, w.mean_len(), w.max_len, w.used);
    fmt::print("KV bytes for {} at {} ({} per token)\n\n", wmodel.name, wprec.name,
               human_bytes(kv_bytes_per_token(wmodel, wprec.bits)));
    fmt::print("{:<30} {:>16} {:>14} {:>7} {:>12} {:>12}\n", "reservation", "reserved tokens", "wasted tokens", "waste",
               "reserved KV", "wasted KV");
    const auto waste_row = [&](const std::string& name, std::int64_t reserved, std::int64_t wasted, double fraction,
                               std::int64_t reserved_bytes, std::int64_t wasted_bytes) {
        fmt::print("{:<30} {:>16} {:>14} {:>6.1f}% {:>12} {:>12}\n", name, reserved, wasted, 100.0 * fraction,
                   human_bytes(reserved_bytes), human_bytes(wasted_bytes));
    };
    waste_row(fmt::format("contiguous (max_seq {})", o.context), w.contiguous_reserved, contiguous_wasted,
              w.contiguous_waste_fraction, contiguous_bytes, contiguous_wasted_bytes);
    waste_row(fmt::format("paged (block_size {})", o.block_size), w.paged_reserved, paged_wasted,
              w.paged_waste_fraction, paged_bytes, paged_wasted_bytes);
    fmt::print(
        "\ncontiguous: every request reserves max_seq = --context positions up front.\n"
        "paged: a request holds ceil(length / block_size) blocks; only its last block is partly empty.\n");
    return 0;
}

void add_memory_options(CLI::App* cmd, MemoryOptions& o) {
    cmd->add_option("--context", o.context, "tokens per sequence, and max_seq reserved per request (default 4096)")
        ->check(CLI::Range(1, 1 << 24));
    cmd->add_option("--batch", o.batch, "sequences held at once (default 1)")->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--precision", o.precision, "all (default), fp32, fp16, bf16, fp8, int4 or int2");
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
