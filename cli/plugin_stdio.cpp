#include "plugin_stdio.h"

#include <fmt/format.h>

#include <cassert>
#include <cstring>
#include <string>
#include <vector>

#include "json_text.h"

namespace kvlab {

namespace {

using nlohmann::json;

constexpr std::size_t kMaxLine = std::size_t(1) << 24;  // an answer longer than 16 MiB is refused
constexpr std::size_t kMaxText = 300;                   // a server's message, as quoted in a verdict

// The channel to the server: one per process. Once an answer breaks the protocol, the channel is
// broken: every later call fails at once, and the run ends with that message, not a verdict.
struct Channel {
    std::FILE* in = nullptr;
    std::FILE* out = nullptr;
    std::string broken;
};
Channel channel;

[[noreturn]] void broken(const std::string& why) {
    if (channel.broken.empty()) channel.broken = why;
    throw Error(why);
}

// A server's text, as one line of at most kMaxText bytes, anything but printable ASCII as \xNN
// (a verdict is printed, and written as JSON, whatever the server sent).
std::string quoted(const std::string& s) {
    std::string t;
    for (std::size_t i = 0; i < s.size() && s[i] != '\n' && s[i] != '\r' && t.size() < kMaxText; i++) {
        const auto b = static_cast<unsigned char>(s[i]);
        t += b >= 0x20 && b < 0x7f ? std::string(1, char(b)) : fmt::format("\\x{:02x}", b);
    }
    if (t.size() >= kMaxText) t += "...";
    return t.empty() ? "(no message)" : t;
}

std::string read_line(const std::string& call) {
    std::string line;
    for (int ch; (ch = std::fgetc(channel.in)) != EOF && ch != '\n';) {
        if (line.size() == kMaxLine)
            broken(fmt::format("the plugin server's answer to {} is longer than {} bytes", call, kMaxLine));
        line.push_back(char(ch));
    }
    if (line.empty() && std::feof(channel.in))
        broken(fmt::format("the plugin server closed the pipe instead of answering {}", call));
    return line;
}

// Sends a request and returns the answer, checked to be an object (an {"error"} is an Error,
// unless `errors` asks for it as an answer).
json ask(const json& request, const std::string& call, bool errors = false) {
    if (!channel.broken.empty()) throw Error(channel.broken);
    const std::string line = json_text(request) + "\n";
    if (std::fwrite(line.data(), 1, line.size(), channel.out) != line.size() || std::fflush(channel.out) != 0)
        broken(fmt::format("the plugin server's pipe is closed: {} was not sent", call));
    const std::string answer = read_line(call);
    try {
        return stdio_parse_answer(answer, call, errors);
    } catch (const StdioProtocolError& e) {
        broken(e.what());
    }
}

// A field of an answer: present and of the kind asked, else an Error showing the answer.
const json& field(const json& answer, const char* name, bool integer, const std::string& call) {
    const auto it = answer.find(name);
    const bool ok = it != answer.end() && (integer ? it->is_number_integer() : it->is_array());
    if (!ok)
        broken(fmt::format("the plugin server answered {} with {}, which has no {} \"{}\"", call,
                           quoted(json_text(answer)), integer ? "integer" : "list", name));
    return *it;
}
std::int64_t integer(const json& answer, const char* name, const std::string& call) {
    return field(answer, name, true, call).get<std::int64_t>();
}
// A list of integers, each in [lo, hi].
std::vector<std::int64_t> integers(const json& list, std::int64_t lo, std::int64_t hi, const std::string& call) {
    std::vector<std::int64_t> out;
    for (const json& x : list) {
        if (!x.is_number_integer() || x.get<std::int64_t>() < lo || x.get<std::int64_t>() > hi)
            broken(fmt::format("the plugin server answered {} with {}, not an integer in [{}, {}]", call,
                               quoted(json_text(x)), lo, hi));
        out.push_back(x.get<std::int64_t>());
    }
    return out;
}

// Handles: the server's ids, boxed. A sequence's box also keeps, for a server that answers
// "slots", its length (from the calls that change it) and the slots of its held positions as last
// answered, good until the next call that may change any mapping (every one but slot, slots,
// attended and memory): then one round trip a sequence a step asks all of them, not one a
// position, and kvlab's per-step check of each answer (plugin_cache.h) is unchanged.
struct Handle {
    std::int64_t id;
    std::int32_t length = 0;
    std::vector<std::int64_t> slots;  // [length] while `epoch` is the channel's
    std::uint64_t epoch = 0;
};
std::uint64_t epoch = 1;  // the channel's: a call that may change a mapping moves it on
bool batched_slots = false;
std::int64_t id(const void* h) { return static_cast<const Handle*>(h)->id; }
Handle* handle(const void* h) { return static_cast<Handle*>(const_cast<void*>(h)); }
template <class T>
T* box(std::int64_t id, std::int32_t length = 0) {
    return reinterpret_cast<T*>(new Handle{id, length, {}, 0});
}
void unbox(void* h) { delete static_cast<Handle*>(h); }

// An answer {"refused": why}: its text into err (true), else false.
bool refusal(const json& answer, char* err, std::size_t err_len) {
    const auto r = answer.find("refused");
    if (r == answer.end()) return false;
    std::snprintf(err, err_len, "%s", quoted(r->is_string() ? r->get<std::string>() : r->dump()).c_str());
    return true;
}

// A refusal's text into err, or the id the answer names (a sequence of `length` positions).
template <class T>
T* made(const json& answer, const char* name, const std::string& call, char* err, std::size_t err_len,
        std::int32_t length = 0) {
    epoch++;
    if (refusal(answer, err, err_len)) return nullptr;
    return box<T>(integer(answer, name, call), length);
}

void s_destroy_pool(kvlab_cache_pool* p) {
    try {
        ask({{"op", "destroy_pool"}, {"pool", id(p)}}, "destroy_pool()");
    } catch (const Error&) {
    }
    unbox(p);
}

kvlab_cache* s_create(kvlab_cache_pool* p, char* err, std::size_t err_len) {
    return made<kvlab_cache>(ask({{"op", "create"}, {"pool", id(p)}}, "create()"), "seq", "create()", err, err_len);
}

kvlab_cache* s_fork(kvlab_cache* parent, char* err, std::size_t err_len) {
    return made<kvlab_cache>(ask({{"op", "fork"}, {"seq", id(parent)}}, "fork()"), "seq", "fork()", err, err_len,
                             handle(parent)->length);
}

std::int32_t s_attach_prefix(kvlab_cache* c, const std::int32_t* tokens, std::int32_t n) {
    const std::string call = fmt::format("attach_prefix(n={})", n);
    epoch++;
    const json a =
        ask({{"op", "attach_prefix"}, {"seq", id(c)}, {"tokens", std::vector<int>(tokens, tokens + n)}}, call);
    const auto hit = std::int32_t(std::clamp<std::int64_t>(integer(a, "n", call), INT32_MIN, INT32_MAX));
    handle(c)->length = std::clamp(hit, 0, n);  // kvlab refuses any other answer before a slot is asked
    return hit;
}

int s_reserve(kvlab_cache* c, std::int32_t length, std::int32_t n, const std::int32_t* tokens, kvlab_slot_copy* copies,
              std::int32_t max_copies, std::int32_t* n_copies, char* err, std::size_t err_len) {
    const std::string call = fmt::format("reserve(length={}, n={})", length, n);
    epoch++;
    const json a =
        ask({{"op", "reserve"}, {"seq", id(c)}, {"length", length}, {"tokens", std::vector<int>(tokens, tokens + n)}},
            call);
    if (refusal(a, err, err_len)) return 1;
    const json& list = field(a, "copies", false, call);
    *n_copies = std::int32_t(std::min<std::size_t>(list.size(), std::size_t(max_copies) + 1));
    for (std::size_t i = 0; i < list.size() && i < std::size_t(max_copies); i++) {
        const std::vector<std::int64_t> t =
            list[i].is_array() ? integers(list[i], INT64_MIN, INT64_MAX, call) : std::vector<std::int64_t>{};
        if (t.size() != 3)
            broken(fmt::format("the plugin server answered {} with a copy {}, not [from, to, count]", call,
                               quoted(json_text(list[i]))));
        copies[i] = {t[0], t[1], std::int32_t(std::clamp<std::int64_t>(t[2], INT32_MIN, INT32_MAX))};
    }
    handle(c)->length = length + n;
    return 0;
}

// Every held position's slot in one answer (a server that says "slots"), kept until the epoch
// moves. An exception in one slot answers {"error": text, "pos": p}: the verdict names slot(pos=p).
const std::vector<std::int64_t>& held_slots(const kvlab_cache* c) {
    Handle* h = handle(c);
    if (h->epoch == epoch) return h->slots;
    const std::string call = fmt::format("slots(n={})", h->length);
    const json a = ask({{"op", "slots"}, {"seq", h->id}, {"n", h->length}}, call, true);
    if (const auto e = a.find("error"); e != a.end()) {
        const auto at = a.find("pos");
        const std::string where =
            at != a.end() && at->is_number_integer() ? fmt::format("slot(pos={})", at->get<std::int64_t>()) : call;
        throw Error(fmt::format("{} raised {}", where, quoted(e->is_string() ? e->get<std::string>() : e->dump())));
    }
    const json& list = field(a, "slots", false, call);
    if (list.size() != std::size_t(h->length))
        broken(fmt::format("the plugin server answered {} with {} slots, not {}", call, list.size(), h->length));
    h->slots = integers(list, INT64_MIN, INT64_MAX, call);
    h->epoch = epoch;
    return h->slots;
}

std::int64_t s_slot(const kvlab_cache* c, std::int32_t pos) {
    if (batched_slots && pos >= 0 && pos < handle(c)->length) return held_slots(c)[std::size_t(pos)];
    const std::string call = fmt::format("slot(pos={})", pos);
    return integer(ask({{"op", "slot"}, {"seq", id(c)}, {"pos", pos}}, call), "slot", call);
}

std::int32_t s_attended(const kvlab_cache* c, std::int32_t pos, std::int32_t* positions, std::int32_t max) {
    const std::string call = fmt::format("attended(pos={})", pos);
    const json a = ask({{"op", "attended"}, {"seq", id(c)}, {"pos", pos}}, call);
    const std::vector<std::int64_t> got = integers(field(a, "positions", false, call), INT32_MIN, INT32_MAX, call);
    for (std::size_t i = 0; i < got.size() && i < std::size_t(max); i++) positions[i] = std::int32_t(got[i]);
    return std::int32_t(std::min<std::size_t>(got.size(), std::size_t(INT32_MAX)));
}

void s_release(kvlab_cache* c, std::int32_t n) {
    epoch++;
    handle(c)->length = std::min(handle(c)->length, n);
    ask({{"op", "release"}, {"seq", id(c)}, {"n", n}}, fmt::format("release(n={})", n));
}

// The server's moves, as [[pos, count, slot], ...]: kvlab checks each against its books.
int s_step_done(kvlab_cache* c, kvlab_slot_move* moves, std::int32_t max_moves, std::int32_t* n_moves, char* err,
                std::size_t err_len) {
    const std::string call = "step_done()";
    epoch++;
    const json a = ask({{"op", "step_done"}, {"seq", id(c)}}, call);
    if (refusal(a, err, err_len)) return 1;
    const auto list = a.find("moves");
    if (list == a.end()) return 0;  // {}: nothing moved
    if (!list->is_array())
        broken(fmt::format("the plugin server answered {} with {}, whose \"moves\" is not a list", call,
                           quoted(json_text(a))));
    *n_moves = std::int32_t(std::min<std::size_t>(list->size(), std::size_t(max_moves) + 1));
    const auto narrow = [](std::int64_t x) { return std::int32_t(std::clamp<std::int64_t>(x, INT32_MIN, INT32_MAX)); };
    for (std::size_t i = 0; i < list->size() && i < std::size_t(max_moves); i++) {
        const json& m = (*list)[i];
        const std::vector<std::int64_t> t =
            m.is_array() ? integers(m, INT64_MIN, INT64_MAX, call) : std::vector<std::int64_t>{};
        if (t.size() != 3)
            broken(fmt::format("the plugin server answered {} with a move {}, not [pos, count, slot]", call,
                               quoted(json_text(m))));
        moves[i] = {narrow(t[0]), narrow(t[1]), t[2]};
    }
    return 0;
}

std::int64_t s_memory(const kvlab_cache_pool* p) {
    return integer(ask({{"op", "memory"}, {"pool", id(p)}}, "memory()"), "bytes", "memory()");
}

// Called from a destructor: nothing escapes.
void s_destroy(kvlab_cache* c) {
    epoch++;
    try {
        ask({{"op", "destroy"}, {"seq", id(c)}}, "destroy()");
    } catch (const Error&) {
    }
    unbox(c);
}

kvlab_cache_pool* s_create_pool(const kvlab_cache_config& c, char* err, std::size_t err_len) {
    const json config = {{"max_seq", c.max_seq},       {"n_slots", c.n_slots},     {"n_layers", c.n_layers},
                         {"n_kv_heads", c.n_kv_heads}, {"head_size", c.head_size}, {"max_sequences", c.max_sequences},
                         {"block_size", c.block_size}};
    return made<kvlab_cache_pool>(ask({{"op", "create_pool"}, {"config", config}}, "create_pool()"), "pool",
                                  "create_pool()", err, err_len);
}

}  // namespace

json stdio_parse_answer(const std::string& line, const std::string& call, bool errors) {
    json a = json::parse(line, nullptr, false);
    if (a.is_discarded() || !a.is_object())
        throw StdioProtocolError(
            fmt::format("the plugin server answered {} with {}, not a JSON object", call, quoted(line)));
    if (const auto e = a.find("error"); e != a.end() && !errors)
        throw Error(fmt::format("{} raised {}", call, quoted(e->is_string() ? e->get<std::string>() : e->dump())));
    return a;
}

const std::string& stdio_broken() { return channel.broken; }

std::unique_ptr<CachePlugin> stdio_plugin(std::FILE* in, std::FILE* out) {
    channel = {in, out, ""};
    epoch = 1;
    const json hello = ask({{"op", "hello"}, {"abi", 3}}, "hello");
    const auto name = hello.find("name");
    const auto methods = hello.find("methods");
    if (name == hello.end() || !name->is_string() || methods == hello.end() || !methods->is_array())
        broken(fmt::format("the plugin server answered hello with {}, not {{\"name\": ..., \"methods\": [...]}}",
                           quoted(json_text(hello))));
    const auto has = [&](const char* m) { return std::find(methods->begin(), methods->end(), m) != methods->end(); };
    // A server of version 3 says so, and lists release among its methods when it has one; an
    // older server always has it. Its block sizes and most sequences, when it names them.
    const auto abi = hello.find("abi");
    const bool v3 = abi != hello.end() && abi->is_number_integer() && abi->get<std::int64_t>() >= 3;
    static std::vector<std::int32_t> block_sizes;  // the table points at them while the run lasts
    block_sizes.clear();
    if (const auto b = hello.find("block_sizes"); b != hello.end() && !b->is_null()) {
        if (!b->is_array() || b->empty() || b->size() > 1024)
            broken(fmt::format("the plugin server answered hello with block_sizes {}, not a list of 1..1024 sizes",
                               quoted(json_text(*b))));
        for (std::int64_t x : integers(*b, 1, 1024, "hello")) block_sizes.push_back(std::int32_t(x));
    }
    std::int64_t most = 0;
    if (const auto m = hello.find("max_sequences"); m != hello.end() && !m->is_null())
        most = integers(json::array({*m}), 0, INT32_MAX, "hello").front();
    kvlab_cache_plugin_abi3 t{};
    t.abi_version = 3;
    t.destroy_pool = s_destroy_pool;
    t.create = s_create;
    t.attach_prefix = has("attach_prefix") ? s_attach_prefix : nullptr;
    t.fork = has("fork") ? s_fork : nullptr;
    t.reserve = s_reserve;
    t.slot = s_slot;
    t.attended = has("attended") ? s_attended : nullptr;
    batched_slots = has("slots");
    t.release = !v3 || has("release") ? s_release : nullptr;
    t.memory = s_memory;
    t.destroy = s_destroy;
    t.block_sizes = block_sizes.empty() ? nullptr : block_sizes.data();
    t.n_block_sizes = std::int32_t(block_sizes.size());
    t.max_sequences = std::int32_t(most);
    t.step_done = v3 && has("step_done") ? s_step_done : nullptr;
    std::string n = quoted(name->get<std::string>());
    if (n.size() > 64) n.resize(64);
    return std::make_unique<CachePlugin>(n, t, s_create_pool);
}

void stdio_send_result(const nlohmann::json& result, const char* key) {
    const std::string line = json_text(json{{"op", "result"}, {key, result}}) + "\n";
    std::fwrite(line.data(), 1, line.size(), channel.out);
    std::fflush(channel.out);
}

}  // namespace kvlab
