#include "plugin_replay.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "json_text.h"

namespace kvlab {

namespace {

using nlohmann::json;

// A log that is not one (kvlab's checks never raise it: it is never a verdict).
struct BadLog : Error {
    using Error::Error;
};

constexpr const char* kCalls[] = {"create",    "attach_prefix", "reserve", "write",  "read",
                                  "step_done", "release",       "fork",    "destroy"};
// A replay's pool holds at most this many floats of K, and as many of V (64 MiB each): a log's
// header cannot ask for more. The checks' pools are far smaller.
constexpr std::int64_t kMaxReplayFloats = std::int64_t{1} << 24;
// A log line nests no deeper than this (values deeper are dropped as it is read): what is compared
// and quoted stays shallow, whatever the bytes.
constexpr int kMaxDepth = 8;

json entry_json(const PluginLogEntry& e) {
    json j = {{"call", kCalls[e.call]}, {"seq", e.seq}};
    switch (e.call) {
        case PluginLogEntry::attach_prefix: j["tokens"] = e.tokens, j["hit"] = e.a; break;
        case PluginLogEntry::reserve: {
            j["length"] = e.a, j["tokens"] = e.tokens;
            if (!e.refused.empty()) {
                j["refused"] = e.refused;
                break;
            }
            json copies = json::array();
            for (const kvlab_slot_copy& c : e.copies) copies.push_back({c.from, c.to, c.count});
            j["copies"] = copies, j["slots"] = e.slots;
            break;
        }
        case PluginLogEntry::write:
        case PluginLogEntry::read: j["from"] = e.a, j["to"] = e.b; break;
        case PluginLogEntry::step_done: {
            json moves = json::array();
            for (const kvlab_slot_move& m : e.moves) moves.push_back({m.pos, m.count, m.slot});
            j["moves"] = moves;
            break;
        }
        case PluginLogEntry::release: j["n"] = e.a; break;
        case PluginLogEntry::fork: j["child"] = e.a; break;
        case PluginLogEntry::create:
        case PluginLogEntry::destroy: break;
    }
    return j;
}

// A text field of a log line, or "" when it is missing or not text (a log is untrusted bytes:
// json::value would throw a library error on another type).
std::string text_field(const json& j, const char* name) {
    const auto it = j.find(name);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// A field of a log line: an integer in [lo, hi], else an Error naming the line.
int field(const json& j, const char* name, int lo, int hi, int line) {
    const auto it = j.find(name);
    if (it == j.end() || !it->is_number_integer() || it->get<std::int64_t>() < lo || it->get<std::int64_t>() > hi)
        throw BadLog(fmt::format("replay log line {}: \"{}\" is not an integer in [{}, {}]", line, name, lo, hi));
    return int(it->get<std::int64_t>());
}

std::vector<int> token_list(const json& j, int vocab_size, int max_seq, int line) {
    const auto it = j.find("tokens");
    if (it == j.end() || !it->is_array() || it->empty() || int(it->size()) > max_seq)
        throw BadLog(fmt::format("replay log line {}: \"tokens\" is not a list of 1..{} tokens", line, max_seq));
    std::vector<int> tokens;
    for (const json& t : *it) {
        if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() >= vocab_size)
            throw BadLog(fmt::format("replay log line {}: a token is not an integer in [0, {})", line, vocab_size));
        tokens.push_back(int(t.get<std::int64_t>()));
    }
    return tokens;
}

ReplayHeader read_header(const json& h) {
    const auto version = h.find("kvlab_replay"), config = h.find("config");
    if (version == h.end() || !version->is_number_integer() || version->get<std::int64_t>() != 1 || config == h.end() ||
        !config->is_object())
        throw BadLog("replay log line 1: not a kvlab replay log's header ({\"kvlab_replay\": 1, \"config\": ...})");
    ReplayHeader r;
    r.plugin = text_field(h, "plugin");
    const json& c = *config;
    constexpr int kMax = 1 << 20;
    r.config = {field(c, "dim", 1, kMax, 1),     field(c, "hidden_dim", 1, kMax, 1), field(c, "n_layers", 1, 1024, 1),
                field(c, "n_heads", 1, 1024, 1), field(c, "n_kv_heads", 1, 1024, 1), field(c, "vocab_size", 1, kMax, 1),
                field(c, "max_seq", 1, kMax, 1)};
    r.config.validate();
    r.n_slots = field(h, "n_slots", 1, kMax, 1);
    r.max_sequences = field(h, "max_sequences", 1, 4096, 1);
    r.block_size = field(h, "block_size", 1, 1024, 1);
    const Config& k = r.config;
    if (std::int64_t(k.n_layers) * k.n_kv_heads * r.n_slots * k.head_size() > kMaxReplayFloats)
        throw BadLog(fmt::format("replay log line 1: a pool of {} slots of this shape is larger than a replay holds",
                                 r.n_slots));
    return r;
}

// The sequences a replay holds, by the log's ids.
class Replayer {
public:
    Replayer(const CachePlugin& plugin, const ReplayHeader& h)
        : h_(h), pool_(h.config, plugin, host_memory(), h.n_slots, h.max_sequences, h.block_size) {
        pool_.set_log(&log_);
    }
    ~Replayer() { seqs_.clear(); }  // before the pool
    Replayer(const Replayer&) = delete;
    Replayer& operator=(const Replayer&) = delete;

    // One log line: the call it names, through kvlab's books (a refusal of a full pool is an
    // answer, as in the check; any other Error is the verdict, and propagates).
    void run(const json& j, int line) {
        const std::string call = text_field(j, "call");
        if (std::find(std::begin(kCalls), std::end(kCalls), call) == std::end(kCalls))
            throw BadLog(fmt::format("replay log line {}: no call \"{}\"", line, one_line(call)));
        const int seq = field(j, "seq", 0, 1 << 30, line), max_seq = h_.config.max_seq;
        if (call == "create") {
            if (seqs_.count(seq)) throw BadLog(fmt::format("replay log line {}: sequence {} exists", line, seq));
            seqs_[seq] = std::make_unique<PluginCache>(pool_, seq);
            return;
        }
        PluginCache& s = at(seq, line);
        if (call == "attach_prefix") {
            if (s.length() != 0) throw BadLog(fmt::format("replay log line {}: sequence {} is not empty", line, seq));
            s.attach_prefix(token_list(j, h_.config.vocab_size, max_seq, line));
        } else if (call == "reserve") {
            const std::vector<int> tokens = token_list(j, h_.config.vocab_size, max_seq - s.length(), line);
            try {
                s.append(tokens);
            } catch (const PoolFull&) {  // an answer, as in the check: the full pool's refusal
            }
        } else if (call == "write" || call == "read") {
            const int from = field(j, "from", 0, max_seq - 1, line), to = field(j, "to", from, max_seq - 1, line);
            if (to >= s.length())
                throw BadLog(fmt::format("replay log line {}: position {} of sequence {}, which holds {}", line, to,
                                         seq, s.length()));
            std::vector<std::int64_t> slots(static_cast<std::size_t>(max_seq));  // [max_seq] a read's slots
            for (int pos = from; pos <= to; pos++)
                call == "write" ? void(s.write_slot(pos)) : void(s.attended(pos, slots.data()));
        } else if (call == "step_done") {
            s.committed();
        } else if (call == "release") {
            s.truncate(field(j, "n", 0, s.length(), line));
        } else if (call == "fork") {
            const int child = field(j, "child", 0, 1 << 30, line);
            if (seqs_.count(child)) throw BadLog(fmt::format("replay log line {}: sequence {} exists", line, child));
            seqs_[child] = s.fork(child);
        } else {  // destroy (the calls were checked above)
            seqs_.erase(seq);
        }
    }
    // The replay's own entries so far, as the log writes them.
    std::vector<json> answered() const {
        std::vector<json> out;
        for (const PluginLogEntry& e : log_) out.push_back(entry_json(e));
        return out;
    }

private:
    PluginCache& at(int seq, int line) {
        const auto it = seqs_.find(seq);
        if (it == seqs_.end())
            throw BadLog(fmt::format("replay log line {}: sequence {} was never created (or is destroyed)", line, seq));
        return *it->second;
    }

    const ReplayHeader& h_;
    std::vector<PluginLogEntry> log_;
    PluginPool pool_;
    std::map<int, std::unique_ptr<PluginCache>> seqs_;
};

// The first entry whose answer differs between the log and the replay, in words ("" when none).
std::string first_difference(const std::vector<json>& logged, const std::vector<json>& replayed) {
    for (std::size_t i = 0; i < logged.size() && i < replayed.size(); i++)
        if (logged[i] != replayed[i])
            return fmt::format("call {}: the log has {}, the plugin now answers {}", i + 1, json_text(logged[i]),
                               json_text(replayed[i]));
    return "";
}

}  // namespace

std::string replay_log_header(const ReplayHeader& h) {
    const Config& c = h.config;
    const json header = {{"kvlab_replay", 1},
                         {"plugin", h.plugin},
                         {"config",
                          {{"dim", c.dim},
                           {"hidden_dim", c.hidden_dim},
                           {"n_layers", c.n_layers},
                           {"n_heads", c.n_heads},
                           {"n_kv_heads", c.n_kv_heads},
                           {"vocab_size", c.vocab_size},
                           {"max_seq", c.max_seq}}},
                         {"n_slots", h.n_slots},
                         {"max_sequences", h.max_sequences},
                         {"block_size", h.block_size},
                         {"kv_format", h.kv_format}};
    return json_text(header);
}

std::string replay_log_line(const PluginLogEntry& entry) { return json_text(entry_json(entry)); }

std::string replay_log_verdict(const std::string& verdict, bool books) {
    return json_text(json{{"verdict", verdict}, {"books", books}});
}

std::string replay_log_text(const ReplayHeader& h, std::span<const PluginLogEntry> entries, const std::string& verdict,
                            bool books) {
    std::string text = replay_log_header(h) + "\n";
    for (const PluginLogEntry& e : entries) text += replay_log_line(e) + "\n";
    return text + replay_log_verdict(verdict, books) + "\n";
}

ReplayOutcome replay_plugin_log(const CachePlugin& plugin, const std::string& log_text) {
    std::vector<json> lines;
    std::istringstream in(log_text);
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        json j = json::parse(
            line, [](int depth, json::parse_event_t, json&) { return depth <= kMaxDepth; }, false);
        if (j.is_discarded() || !j.is_object())
            throw BadLog(fmt::format("replay log line {}: not a JSON object", lines.size() + 1));
        lines.push_back(std::move(j));
    }
    if (lines.empty()) throw BadLog("replay log: empty");
    const ReplayHeader header = read_header(lines.front());
    ReplayOutcome out;
    std::vector<json> logged;  // the log's call lines, to compare with the replay's answers
    for (std::size_t i = 1; i < lines.size(); i++) {
        if (lines[i].contains("verdict")) {
            out.logged = text_field(lines[i], "verdict");
            const auto books = lines[i].find("books");
            out.logged_books = books == lines[i].end() || !books->is_boolean() || books->get<bool>();
            break;
        }
        logged.push_back(lines[i]);
    }
    Replayer replayer(plugin, header);
    try {
        for (std::size_t i = 0; i < logged.size(); i++, out.calls++) replayer.run(logged[i], int(i) + 2);
    } catch (const BadLog&) {
        throw;
    } catch (const Error& e) {
        out.verdict = e.what();
    }
    out.divergence = first_difference(logged, replayer.answered());
    return out;
}

std::string replay_report(const ReplayOutcome& o) {
    std::string text = fmt::format("{} calls replayed", o.calls);
    if (o.verdict.empty())
        text += ": every answer passes kvlab's books";
    else
        text += fmt::format(", and call {} ended in a verdict: {}", o.calls + 1, o.verdict);
    if (o.same())
        text += o.verdict.empty() ? " (the log has no verdict either)" : " (the log's verdict)";
    else if (o.logged.empty())
        text += " (the log has no verdict)";
    else if (!o.logged_books && o.verdict.empty())
        text += fmt::format(" (the log's verdict was on logits, which a replay without the model cannot show: {})",
                            o.logged);
    else
        text += fmt::format(" (the log's verdict differs: {})", o.logged);
    if (!o.divergence.empty()) text += fmt::format("; the first answer that differs from the log's: {}", o.divergence);
    return text;
}

}  // namespace kvlab
