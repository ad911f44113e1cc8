#include "pool.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cassert>
#include <cctype>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "common.h"
#include "compare.h"
#include "cost_model.h"
#include "cpu_backend.h"
#include "decode.h"
#include "json_text.h"
#include "paged.h"
#include "sequence_engine.h"

namespace kvlab::cli {

namespace {

// The script's commands, blank ones dropped, each with its words joined by single spaces: the
// table and the error messages quote it on one line whatever whitespace the script used.
std::vector<std::string> split_script(const std::string& script) {
    std::vector<std::string> commands;
    std::stringstream in(script);
    for (std::string part; std::getline(in, part, ';');) {
        std::stringstream words(part);
        std::string text;
        for (std::string w; words >> w;) text += (text.empty() ? "" : " ") + w;
        if (!text.empty()) commands.push_back(text);
    }
    return commands;
}

std::vector<std::string> split_words(const std::string& text) {
    std::stringstream in(text);
    std::vector<std::string> words;
    for (std::string w; in >> w;) words.push_back(w);
    return words;
}

void check_name(const std::string& name) {
    const auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0])) ||
        !std::all_of(name.begin(), name.end(), ident))
        throw Error(fmt::format("'{}' is not a sequence name (letters, digits and _, not starting with a digit)",
                                one_line(name)));
}

// "1 block", "2 blocks".
std::string plural(std::int64_t n, const char* noun) { return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s"); }

std::string join(const std::vector<int>& v, const char* sep) {
    std::string s;
    for (std::size_t i = 0; i < v.size(); i++) {
        if (i) s += sep;
        s += fmt::format("{}", v[i]);
    }
    return s;
}

// Blocks a command moved, counted from its slice of the trace.
struct Moves {
    int allocated = 0, shared = 0, copied = 0, freed = 0, evicted = 0;
};

// The script's sequences by name, run by a SequenceEngine over the pool; every prefill is checked
// against naive decode.
class Session {
public:
    Session(const LoadedModel& lm, BlockPool& pool, const PoolOptions& o)
        : model_(lm.model),
          source_(lm.source),
          pool_(pool),
          o_(o),
          backend_(lm.model),
          engine_(backend_, pool, lm.model.w.fingerprint()),
          naive_(lm.model, o.threads) {
        naive_.kv_format = pool.kv_format();  // the naive check stores K and V as the pool does
        naive_.exec.attention = engine_.decoder().exec.attention = attention_spec(o.attention);
        engine_.decoder().exec.n_threads = o.threads;
    }

    // Runs command `index` (1-based); an Error names it and nothing after it runs.
    void run(int index, const std::string& text, int width) {
        try {
            execute(index, text, width);
        } catch (const Error& e) {
            // A long token list is cut short: the message stays one readable line.
            const std::string quoted = text.size() <= 60 ? text : text.substr(0, 57) + "...";
            throw Error(fmt::format("pool script, command {} '{}': {}", index, one_line(quoted), e.what()));
        }
    }

    int finish(int n_commands);  // prints the summary; the exit status

private:
    // What one command did: its JSON record, its "what it did" text, its prefix hit, and for a
    // prefill whether it equals naive decode (nullopt inside: equal).
    struct Outcome {
        nlohmann::json record;
        std::string did;
        std::optional<int> hit;
        std::optional<std::optional<std::string>> verdict;
        bool unchecked = false;  // a prefill past --check-budget
    };
    void execute(int index, const std::string& text, int width);
    void apply(const std::vector<std::string>& w, Outcome& out);
    void add(const std::vector<std::string>& w, Outcome& out);
    void append(const std::vector<std::string>& w, Outcome& out);
    void fork(const std::vector<std::string>& w, Outcome& out);
    void rollback(const std::vector<std::string>& w, Outcome& out);
    void free(const std::vector<std::string>& w, Outcome& out);
    void report(int index, const std::string& text, int width, const std::string& op, std::size_t first_event,
                Outcome& out);
    int find(const std::string& name) const {
        const auto it = ids_.find(name);
        if (it == ids_.end()) throw Error(fmt::format("no sequence named '{}'", one_line(name)));
        return it->second;
    }
    void check_unused(const std::string& name) const {
        check_name(name);
        if (ids_.count(name)) throw Error(fmt::format("a sequence named '{}' already exists", name));
    }
    std::string name_of(int id) const {
        return id >= 0 && id < int(names_.size()) ? names_[id] : fmt::format("seq {}", id);
    }
    // Sequence id's latest logits against naive decode of its whole token list, while naive
    // decode's FLOPs (the cost model's count, as the kernels count them) stay within
    // --check-budget; from the first prefill past it on, none is checked.
    void check_against_naive(int id, Outcome& out) {
        prefills_++;
        const std::span<const int> tokens = engine_.cache(id).tokens();
        const double cost = double(naive_step_cost(model_.config(), int(tokens.size()), naive_.exec.attention).flops());
        if (unchecked_ > 0 || double(naive_.exec.flops) + cost > o_.check_gflop * 1e9) {
            unchecked_++, out.unchecked = true;
            return;
        }
        out.verdict = first_difference(naive_.forward(tokens), engine_.logits(id));
        if (*out.verdict) differing_++;
    }
    nlohmann::json event_json(const CacheEvent& e) const;
    std::vector<int> by_id() const { return engine_.live(); }
    std::string table_text(int id) const;
    nlohmann::json show_json() const;
    void print_show() const;
    MemoryStats memory() const;

    const Model& model_;
    std::string source_;  // the checkpoint's path, or "random (seed 7)"
    BlockPool& pool_;
    const PoolOptions& o_;
    CpuBackend backend_;
    SequenceEngine engine_;
    NaiveDecoder naive_;
    std::map<std::string, int> ids_;  // the live sequences by name
    std::vector<std::string> names_;  // [seq id] the name, for events (ids are never reused)
    nlohmann::json records_ = nlohmann::json::array();
    std::int64_t report_bytes_ = 0;  // records_ as charged on the memory budget
    MemoryCharge report_charge_;
    std::int64_t prefilled_ = 0;
    int copies_ = 0, prefills_ = 0, differing_ = 0, unchecked_ = 0;
};

nlohmann::json Session::event_json(const CacheEvent& e) const {
    nlohmann::json j = {{"kind", to_string(e.kind)}, {"sequence", name_of(e.seq)}};
    if (e.pos >= 0) j["pos"] = e.pos;
    if (e.count != 0) j["count"] = e.count;
    if (e.block >= 0) j["block"] = e.block;
    if (e.from >= 0) j["from"] = e.from;
    return j;
}

// "[0 1 3]": the physical block of each logical block.
std::string Session::table_text(int id) const {
    const std::span<const int> t = engine_.block_table(id);
    return "[" + join(std::vector<int>(t.begin(), t.end()), " ") + "]";
}

void Session::execute(int index, const std::string& text, int width) {
    const std::vector<std::string> w = split_words(text);
    const std::size_t first_event = engine_.events().size();
    Outcome out;
    out.record = {{"index", index}, {"command", text}, {"op", w[0]}};
    apply(w, out);  // throws before it changes anything
    report(index, text, width, w[0], first_event, out);
}

// Every check before any change: a failed command leaves the pool as it was.
void Session::apply(const std::vector<std::string>& w, Outcome& out) {
    const std::string& op = w[0];
    const auto usage = [&](std::size_t n_words, const char* form) {
        const bool list = op == "new" || op == "append";
        if (list ? w.size() < n_words : w.size() != n_words) throw Error(fmt::format("usage: {}", form));
    };
    if (op == "new") return usage(3, "new NAME t1,t2,..."), add(w, out);
    if (op == "append") return usage(3, "append NAME t1,t2,..."), append(w, out);
    if (op == "fork") return usage(3, "fork NAME NEWNAME"), fork(w, out);
    if (op == "rollback") return usage(3, "rollback NAME N"), rollback(w, out);
    if (op == "free") return usage(2, "free NAME"), free(w, out);
    if (op == "show") {
        usage(1, "show");
        out.did =
            fmt::format("{}, {}", plural(std::int64_t(ids_.size()), "sequence"), plural(pool_.n_blocks(), "block"));
        if (o_.json) out.record["pool"] = show_json();  // a copy of every block: only when JSON is asked for
        return;
    }
    throw Error(fmt::format("unknown command '{}' (commands: new, append, fork, rollback, free, show)", one_line(op)));
}

// The words after NAME as one list: "1, 2,3" is a list too.
std::vector<int> token_list(const std::vector<std::string>& w) {
    std::string joined;
    for (std::size_t i = 2; i < w.size(); i++) joined += w[i];
    return parse_int_list("tokens", joined);
}

void Session::add(const std::vector<std::string>& w, Outcome& out) {
    check_unused(w[1]);
    const std::vector<int> tokens = token_list(w);
    const int id = engine_.add(tokens);  // refused: the pool is as it was
    const int h = engine_.prefix_hit(id);
    check_against_naive(id, out);
    out.hit = h;
    prefilled_ += int(tokens.size()) - h;
    out.did = fmt::format("{} (seq {}): prefix hit {} of {}, prefilled {}; table {}", w[1], id, h, tokens.size(),
                          int(tokens.size()) - h, table_text(id));
    out.record["sequence"] = w[1];
    out.record["prefix_hit"] = h;
    out.record["prefilled"] = int(tokens.size()) - h;
    assert(id == int(names_.size()));
    names_.push_back(w[1]);
    ids_.emplace(w[1], id);
}

void Session::append(const std::vector<std::string>& w, Outcome& out) {
    const int id = find(w[1]);
    const std::vector<int> tokens = token_list(w);
    const int start = engine_.cache(id).length();
    engine_.append(id, tokens);  // throws with the cache unchanged
    check_against_naive(id, out);
    prefilled_ += int(tokens.size());
    out.did = fmt::format("{}: prefilled {} at {}, length {}; table {}", w[1], tokens.size(), start,
                          engine_.cache(id).length(), table_text(id));
    out.record["sequence"] = w[1];
    out.record["prefilled"] = tokens.size();
}

void Session::fork(const std::vector<std::string>& w, Outcome& out) {
    const int parent = find(w[1]);
    check_unused(w[2]);
    const int id = engine_.fork(parent);
    assert(id == int(names_.size()));
    names_.push_back(w[2]);
    ids_.emplace(w[2], id);
    out.did = fmt::format("{} (seq {}) maps {}'s {}, length {}; table {}", w[2], id, w[1],
                          plural(std::int64_t(engine_.block_table(parent).size()), "block"), engine_.cache(id).length(),
                          table_text(id));
    out.record["sequence"] = w[2];
    out.record["parent"] = w[1];
}

void Session::rollback(const std::vector<std::string>& w, Outcome& out) {
    const int id = find(w[1]);
    const int n = parse_int("rollback", w[2], " (a number of positions)"), len = engine_.cache(id).length();
    if (n < 0) throw Error(fmt::format("cannot roll back to {}: positions start at 0", n));
    if (n > len) throw Error(fmt::format("cannot roll back to {}: '{}' holds only {} positions", n, w[1], len));
    engine_.rollback(id, n);
    out.did = fmt::format("{}: length {} -> {}; table {}", w[1], len, n, table_text(id));
    out.record["sequence"] = w[1];
    out.record["from_length"] = len;
}

void Session::free(const std::vector<std::string>& w, Outcome& out) {
    const int id = find(w[1]);
    out.did = fmt::format("{}: released {} (published ones stay cached)", w[1],
                          plural(std::int64_t(engine_.block_table(id).size()), "block"));
    out.record["sequence"] = w[1];
    engine_.free(id);
    ids_.erase(w[1]);
}

// The command's row (or JSON record): the blocks its events moved, the pool after it, and
// whether its prefill equals naive decode.
void Session::report(int index, const std::string& text, int width, const std::string& op, std::size_t first_event,
                     Outcome& out) {
    const std::vector<CacheEvent>& trace = engine_.events();
    nlohmann::json& r = out.record;
    Moves m;
    for (std::size_t i = first_event; i < trace.size(); i++) {
        const EventKind k = trace[i].kind;
        m.allocated += k == EventKind::block_allocated;
        m.shared += k == EventKind::block_shared;
        m.copied += k == EventKind::copy_on_write;
        m.freed += k == EventKind::freed;
        m.evicted += k == EventKind::evicted;
    }
    copies_ += m.copied;
    if (r.contains("sequence") && ids_.count(r["sequence"].get<std::string>())) {
        const int id = ids_.at(r["sequence"].get<std::string>());
        const std::span<const int> table = engine_.block_table(id);
        r["length"] = engine_.cache(id).length();
        r["block_table"] = std::vector<int>(table.begin(), table.end());
    }
    r["blocks"] = {{"allocated", m.allocated},
                   {"shared", m.shared},
                   {"copied", m.copied},
                   {"freed", m.freed},
                   {"evicted", m.evicted}};
    r["pool_after"] = {{"free", pool_.n_free()}, {"cached", pool_.n_cached()}, {"used", pool_.n_used()}};
    const auto& verdict = out.verdict;
    if (verdict) {
        r["bitwise_equal"] = !*verdict;
        r["difference"] = *verdict ? nlohmann::json(**verdict) : nlohmann::json(nullptr);
    }
    if (verdict || out.unchecked) r["checked"] = !out.unchecked;
    if (out.unchecked) r["bitwise_equal"] = nullptr;
    if (o_.json) {
        if (o_.events) {
            r["events"] = nlohmann::json::array();
            for (std::size_t i = first_event; i < trace.size(); i++) r["events"].push_back(event_json(trace[i]));
        }
        // Every record stays until the end (a show copies the whole pool's table): the report is
        // charged on the memory budget as it grows, at 10x its text: a tree of small JSON objects.
        report_bytes_ += 10 * std::int64_t(json_text(r).size());
        report_charge_ = MemoryCharge();
        report_charge_ =
            MemoryCharge(fmt::format("pool --json's report ({} commands so far)", records_.size() + 1), report_bytes_);
        records_.push_back(r);
        return;
    }
    const std::string logits = out.unchecked ? "unchecked" : !verdict ? "" : *verdict ? "DIFFERS" : "= naive";
    // A long command is cut short to keep the columns.
    const std::string shown = int(text.size()) <= width ? text : text.substr(0, std::size_t(width) - 3) + "...";
    fmt::print("{:>3}  {:<{}} {:>4} {:>5} {:>5} {:>4} {:>5} {:>5} {:>5} {:>6} {:>4}  {:<7}  {}\n", index, shown, width,
               out.hit ? std::to_string(*out.hit) : "-", m.allocated, m.shared, m.copied, m.freed, m.evicted,
               pool_.n_free(), pool_.n_cached(), pool_.n_used(), logits, out.did);
    if (verdict && *verdict) fmt::print("     logits differ from naive decode: {}\n", **verdict);
    if (o_.events)
        for (std::size_t i = first_event; i < trace.size(); i++)
            fmt::print("       {}\n", describe(trace[i], name_of(trace[i].seq)));
    if (op == "show") print_show();
    flush_stdout();  // lines before a failing command come out before main's error; a closed pipe stops here
}

nlohmann::json Session::show_json() const {
    nlohmann::json j;
    j["sequences"] = nlohmann::json::array();
    for (int id : by_id()) {
        const auto t = engine_.cache(id).tokens();
        const auto table = engine_.block_table(id);
        j["sequences"].push_back({{"name", names_[id]},
                                  {"id", id},
                                  {"length", engine_.cache(id).length()},
                                  {"tokens", std::vector<int>(t.begin(), t.end())},
                                  {"block_table", std::vector<int>(table.begin(), table.end())}});
    }
    j["blocks"] = nlohmann::json::array();
    for (int b = 0; b < pool_.n_blocks(); b++) {
        const char* state = pool_.refcount(b) > 0 ? "used" : pool_.published(b) ? "cached" : "free";
        nlohmann::json mapped = nlohmann::json::array();
        for (int id : by_id())
            for (int x : engine_.block_table(id))
                if (x == b) mapped.push_back(names_[id]);
        j["blocks"].push_back({{"block", b},
                               {"refcount", pool_.refcount(b)},
                               {"published", pool_.published(b)},
                               {"state", state},
                               {"sequences", mapped}});
    }
    return j;
}

// Each sequence's logical blocks as physical block: tokens; then each block that is not free.
void Session::print_show() const {
    const int bs = pool_.block_size();
    fmt::print("     sequences (logical block -> physical block: its tokens)\n");
    if (ids_.empty()) fmt::print("       none\n");
    for (int id : by_id()) {
        const auto t = engine_.cache(id).tokens();
        const auto table = engine_.block_table(id);
        std::string blocks;
        for (std::size_t b = 0; b < table.size(); b++) {
            const std::size_t lo = b * bs, hi = std::min(t.size(), lo + bs);
            blocks += fmt::format("  {}:({})", table[b], join(std::vector<int>(t.begin() + lo, t.begin() + hi), ","));
        }
        fmt::print("       {:<8} seq {:<3} {:>4} tokens {}\n", names_[id], id, engine_.cache(id).length(), blocks);
    }
    fmt::print("     blocks (refcount, published, mapped by)\n");
    std::vector<int> free_blocks;
    for (int b = 0; b < pool_.n_blocks(); b++) {
        if (pool_.refcount(b) == 0 && !pool_.published(b)) {
            free_blocks.push_back(b);
            continue;
        }
        std::string mapped;
        for (int id : by_id())
            for (int x : engine_.block_table(id))
                if (x == b) mapped += " " + names_[id];
        fmt::print("       block {:<4} ref {}  {:<9} {}\n", b, pool_.refcount(b),
                   pool_.published(b) ? "published" : "private",
                   pool_.refcount(b) > 0 ? mapped : " cached (reclaimable)");
    }
    // Free blocks as ranges: a pool of hundreds would otherwise fill the screen.
    std::string ranges;
    for (std::size_t i = 0; i < free_blocks.size();) {
        std::size_t j = i;
        while (j + 1 < free_blocks.size() && free_blocks[j + 1] == free_blocks[j] + 1) j++;
        ranges += (ranges.empty() ? "" : " ") +
                  (i == j ? std::to_string(free_blocks[i]) : fmt::format("{}-{}", free_blocks[i], free_blocks[j]));
        i = j + 1;
    }
    fmt::print("       free: {}\n", free_blocks.empty() ? "none" : ranges);
}

// The pool's MemoryStats with used_bytes filled in: the distinct positions the live sequences'
// blocks hold (a shared block counts once, up to the longest of its sharers).
MemoryStats Session::memory() const {
    MemoryStats m = pool_.memory();
    const int bs = pool_.block_size();
    std::vector<int> rows(pool_.n_blocks(), 0);
    for (int id : by_id()) {
        const auto table = engine_.block_table(id);
        for (std::size_t b = 0; b < table.size(); b++)
            rows[table[b]] = std::max(rows[table[b]], std::min(bs, engine_.cache(id).length() - int(b) * bs));
    }
    std::int64_t n = 0;
    for (int r : rows) n += r;
    m.used_bytes = kv_bytes(pool_.config(), n);
    return m;
}

int Session::finish(int n_commands) {
    const MemoryStats m = memory();
    const std::int64_t held = std::int64_t(m.blocks_used) * pool_.block_bytes();
    std::int64_t logical = 0;  // what the live sequences would hold without sharing
    for (int id : by_id()) logical += kv_bytes(pool_.config(), engine_.cache(id).length());
    const std::int64_t saved = pool_.prefix_hit_positions();
    if (o_.json) {
        nlohmann::json j;
        j["model"] = source_;
        j["config"] = model_.config().describe();
        j["block_size"] = pool_.block_size();
        j["blocks"] = pool_.n_blocks();
        j["block_bytes"] = pool_.block_bytes();
        j["kv_format"] = kv_format_name(pool_.kv_format());
        j["prefix_cache"] = pool_.prefix_caching();
        j["threads"] = o_.threads;
        j["threads_choice"] = threads_json();
        j["commands"] = records_;
        j["summary"] = {{"commands", n_commands},
                        {"prefilled_positions", prefilled_},
                        {"prefix_hit_positions", saved},
                        {"copy_on_writes", copies_},
                        {"prefills", prefills_},
                        {"prefills_bitwise_equal", prefills_ - unchecked_ - differing_},
                        {"prefills_checked", prefills_ - unchecked_},
                        {"check_budget_gflop", o_.check_gflop},
                        {"naive_gflop", double(naive_.exec.flops) / 1e9},
                        {"shared_writes", pool_.shared_writes()},
                        {"memory",
                         {{"reserved_bytes", m.reserved_bytes},
                          {"allocated_bytes", m.allocated_bytes},
                          {"used_bytes", m.used_bytes},
                          {"held_bytes", held},
                          {"unshared_bytes", logical},
                          {"blocks_total", m.blocks_total},
                          {"blocks_used", m.blocks_used},
                          {"blocks_cached", m.blocks_cached},
                          {"blocks_free", m.blocks_free}}},
                        {"final", show_json()}};
        fmt::print("{}\n", json_document(j));
    } else {
        fmt::print("\nsummary\n");
        fmt::print("  prefill        {} positions run, {} served by prefix hits instead\n", prefilled_, saved);
        fmt::print("  copy-on-write  {} copied; {} into shared blocks (must be 0)\n", plural(copies_, "block"),
                   plural(pool_.shared_writes(), "write"));
        if (unchecked_ == 0)
            fmt::print("  logits         {} of {} prefills bitwise equal to naive decode\n", prefills_ - differing_,
                       prefills_);
        else
            fmt::print(
                "  logits         {} of {} prefills checked, {} of them bitwise equal to naive decode; the "
                "checks stopped at --check-budget {} GFLOP ({:.3g} spent)\n",
                prefills_ - unchecked_, prefills_, prefills_ - unchecked_ - differing_, o_.check_gflop,
                double(naive_.exec.flops) / 1e9);
        fmt::print("  pool memory    reserved {} B ({} blocks x {} B), used {} B by the live sequences' positions\n",
                   m.reserved_bytes, m.blocks_total, pool_.block_bytes(), m.used_bytes);
        fmt::print(
            "                 {} blocks held ({} B), {} cached, {} free; without sharing the sequences would use {} "
            "B\n",
            m.blocks_used, held, m.blocks_cached, m.blocks_free, logical);
    }
    if (differing_ > 0) {
        fmt::print(stderr, "kvlab: error: {} of {} prefills differ from naive decode\n", differing_, prefills_);
        return 1;
    }
    return 0;
}

}  // namespace

int run_pool(const PoolOptions& options) {
    // Library callers (the fuzzers) pass the options' default, 0: auto, which main resolves for the CLI.
    PoolOptions o = options;
    resolve_threads(o.threads);
    const std::vector<std::string> commands = split_script(o.script);
    if (commands.empty()) throw Error("--script has no commands (e.g. \"new a 1,2,3; fork a b; show\")");
    const LoadedModel lm = load_model(o.m.model, o.m.tokenizer, stories260k_shape(), o.m.seed, o.m.panel_cache);
    const Config& c = lm.model.config();
    // Checks --block-size against max_seq, and --blocks x --block-size against kvlab's size limit.
    BlockPool pool(c, o.block_size, o.blocks, o.prefix_cache);
    pool.set_kv_format(parse_kv_format(o.kv_format));
    Session session(lm, pool, o);

    int width = 7;
    for (const auto& text : commands) width = std::max(width, std::min(int(text.size()), 40));
    if (!o.json) {
        fmt::print("kvlab pool: one paged block pool, scripted\n");
        fmt::print("model   {}  ({})\n", lm.source, c.describe());
        fmt::print("pool    {} blocks of {} positions, {} B each ({}); prefix caching {}\n", pool.n_blocks(),
                   pool.block_size(), pool.block_bytes(), kv_format_name(pool.kv_format()),
                   pool.prefix_caching() ? "on" : "off");
        fmt::print("threads {}\n\n", threads_text(o.threads));
        fmt::print("{:>3}  {:<{}} {:>4} {:>5} {:>5} {:>4} {:>5} {:>5} {:>5} {:>6} {:>4}  {:<7}  {}\n", "#", "command",
                   width, "hit", "alloc", "share", "cow", "freed", "evict", "free", "cached", "used", "logits",
                   "what it did");
    }
    {
        // The table shows each command as it runs; --json prints at the end, so a line shows progress.
        const Progress progress;
        for (std::size_t i = 0; i < commands.size(); i++) {
            if (o.json) progress(fmt::format("pool: command {} of {}", i + 1, commands.size()));
            session.run(int(i) + 1, commands[i], width);
        }
    }
    return session.finish(int(commands.size()));
}

void add_pool_options(CLI::App* cmd, PoolOptions& o) {
    add_model_options(cmd, o.m.model, o.m.tokenizer, o.m.seed, o.m.panel_cache);
    // No range here: the pool checks the block size against the model's max_seq, which CLI11 cannot know.
    cmd->add_option("--block-size", o.block_size, "positions per block (default 4; at most max_seq)");
    cmd->add_option("--blocks", o.blocks, "blocks in the pool (default 32)")->check(CLI::Range(1, 1 << 16));
    cmd->add_flag("--no-prefix-cache{false}", o.prefix_cache, "do not publish full blocks for later requests");
    cmd->add_option(
        "--kv-format", o.kv_format,
        "every block stores K and V in fp32, bf16, fp16, fp8-e5m2, fp8-e4m3, int8 or int4 (checked against a naive "
        "decode storing them so too)");
    cmd->add_option("--script", o.script,
                    "commands separated by ';': new NAME 1,2,3 / append NAME 4,5 / fork NAME NEWNAME / "
                    "rollback NAME N / free NAME / show")
        ->required();
    cmd->add_flag("--events", o.events, "print every cache event of every command");
    cmd->add_option("--check-budget", o.check_gflop,
                    "GFLOP of naive decode for the checks (each prefill re-runs its whole sequence); past it, "
                    "prefills are reported unchecked (default 50)")
        ->check(CLI::Range(0.0, 1e9));
    cmd->add_flag("--json", o.json, "machine-readable output");
    add_attention_options(cmd, o.attention);
    add_threads_option(cmd, o.threads);
}

}  // namespace kvlab::cli
