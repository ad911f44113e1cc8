#include "config.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>
#include <variant>

namespace kvlab {

namespace {

// a * b, or an Error when the product leaves [0, kMaxElements].
std::int64_t checked_mul(std::int64_t a, std::int64_t b, const char* what) {
    if (a < 0 || b < 0 || (a != 0 && b > kMaxElements / a))
        throw Error(fmt::format("config: {} is too large (more than {} elements)", what, kMaxElements));
    return a * b;
}

// The length of the well-formed UTF-8 sequence of two or more bytes at text[i] (RFC 3629's table:
// no overlong forms, no surrogates, nothing past U+10FFFF), or 0 when there is none.
std::size_t utf8_sequence(const std::string& text, std::size_t i) {
    const auto byte = [&](std::size_t k) { return k < text.size() ? static_cast<unsigned char>(text[k]) : 0; };
    const unsigned char b = byte(i);
    const std::size_t len = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
    if (len == 0 || i + len > text.size()) return 0;
    // The second byte's range narrows after E0 (no overlong), ED (no surrogate), F0 and F4.
    const unsigned char lo = b == 0xE0 ? 0xA0 : b == 0xF0 ? 0x90 : 0x80;
    const unsigned char hi = b == 0xED ? 0x9F : b == 0xF4 ? 0x8F : 0xBF;
    if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
    for (std::size_t k = 2; k < len; k++)
        if ((byte(i + k) & 0xC0) != 0x80) return 0;
    return len;
}

std::string escaped_byte(unsigned char b) { return fmt::format("\\x{:02x}", b); }

}  // namespace

std::string one_line(const std::string& text) {
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size();) {
        const unsigned char b = static_cast<unsigned char>(text[i]);
        if (b >= 0x20 && b < 0x7f) {
            out += char(b), i++;
            continue;
        }
        // A whole UTF-8 sequence passes, except C1 controls (U+0080..U+009F: C2 80..C2 9F), which
        // terminals obey as escapes; a stray or cut-short byte is escaped like a control.
        const std::size_t len = utf8_sequence(text, i);
        if (len > 0 && !(b == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0)) {
            out.append(text, i, len), i += len;
            continue;
        }
        out += b == '\n' ? "\\n" : b == '\t' ? "\\t" : b == '\r' ? "\\r" : escaped_byte(b);
        i++;
    }
    return out;
}

std::string valid_utf8(const std::string& text) {
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size();) {
        const unsigned char b = static_cast<unsigned char>(text[i]);
        const std::size_t len = b < 0x80 ? 1 : utf8_sequence(text, i);
        if (len == 0)
            out += escaped_byte(b), i++;
        else
            out.append(text, i, len), i += len;
    }
    return out;
}

void check_size(const std::string& what, std::int64_t count, std::int64_t bytes_each) {
    if (count >= 0 && bytes_each >= 0 && (bytes_each == 0 || count <= kMaxBytes / bytes_each)) return;
    throw Error(fmt::format("{} would take {:.0f} B, over the limit of {} B (1 GiB) for one model, pool or cache", what,
                            double(count) * double(bytes_each), kMaxBytes));
}

namespace {

// The budget's ledger: every live charge by id, and their sum.
struct Ledger {
    std::mutex mutex;
    std::map<std::uint64_t, std::pair<std::string, std::int64_t>> held;
    std::int64_t total = 0;
    std::uint64_t next_id = 1;
};

// Never destroyed: a static object holding a charge may be destroyed after any other static.
Ledger& ledger() {
    static Ledger* const l = new Ledger;
    return *l;
}

std::string mib(std::int64_t bytes) { return fmt::format("{:.1f} MiB", double(bytes) / double(1 << 20)); }

// KVLAB_MEMORY_BUDGET's value in bytes, or an Error's text when it is not a size in range.
std::variant<std::int64_t, std::string> budget_from_environment() {
    const char* env = std::getenv("KVLAB_MEMORY_BUDGET");
    if (env == nullptr) return kMaxBytes;
    const std::string text = env;
    std::int64_t number = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
    const std::string unit(end, text.data() + text.size());
    const std::map<std::string, std::int64_t> units = {{"", 1}, {"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}};
    const auto scale = units.find(unit);
    if (ec == std::errc() && scale != units.end() && number >= 1 && number <= kMaxBytes / scale->second &&
        number * scale->second >= (1 << 20))
        return number * scale->second;
    return fmt::format(
        "KVLAB_MEMORY_BUDGET='{}' is not a size from 1MiB to 1GiB (bytes, or a whole number of "
        "KiB, MiB or GiB, e.g. 256MiB)",
        one_line(text));
}

}  // namespace

std::int64_t memory_budget() {
    static const std::variant<std::int64_t, std::string> budget = budget_from_environment();
    if (const auto* error = std::get_if<std::string>(&budget)) throw Error(*error);
    return std::get<std::int64_t>(budget);
}

MemoryCharge::MemoryCharge(std::string what, std::int64_t bytes) : what_(std::move(what)) {
    check_size(what_, bytes, 1);  // alone over the limit (or negative): the plain message
    if (bytes == 0) return;
    Ledger& l = ledger();
    const std::lock_guard lock(l.mutex);
    const std::int64_t budget = memory_budget();
    if (bytes > budget - l.total) {  // the refusal's words are built only when one is made
        const std::string name =
            budget == kMaxBytes ? "of 1 GiB (kMaxBytes)" : "of " + mib(budget) + " (KVLAB_MEMORY_BUDGET)";
        if (l.held.empty())
            throw Error(fmt::format("{} would take {}, over kvlab's memory budget {}", what_, mib(bytes), name));
        const auto biggest = std::max_element(l.held.begin(), l.held.end(), [](const auto& a, const auto& b) {
            return a.second.second < b.second.second;
        });
        throw Error(fmt::format(
            "{} would take {}, but kvlab's memory budget {} already holds {} in {} things, "
            "the biggest {} ({})",
            what_, mib(bytes), name, mib(l.total), l.held.size(), biggest->second.first, mib(biggest->second.second)));
    }
    id_ = l.next_id++, bytes_ = bytes;
    l.held.emplace(id_, std::pair{what_, bytes});
    l.total += bytes;
}

MemoryCharge::MemoryCharge(const MemoryCharge& other) : MemoryCharge() {
    if (other.id_ != 0) *this = MemoryCharge(other.what_, other.bytes_);
}

MemoryCharge& MemoryCharge::operator=(const MemoryCharge& other) {
    if (this != &other) *this = MemoryCharge(other);
    return *this;
}

MemoryCharge::MemoryCharge(MemoryCharge&& other) noexcept
    : id_(std::exchange(other.id_, 0)), bytes_(std::exchange(other.bytes_, 0)), what_(std::move(other.what_)) {}

MemoryCharge& MemoryCharge::operator=(MemoryCharge&& other) noexcept {
    if (this != &other) {
        release();
        id_ = std::exchange(other.id_, 0), bytes_ = std::exchange(other.bytes_, 0), what_ = std::move(other.what_);
    }
    return *this;
}

MemoryCharge::~MemoryCharge() { release(); }

void MemoryCharge::release() noexcept {
    if (id_ == 0) return;
    Ledger& l = ledger();
    const std::lock_guard lock(l.mutex);
    l.held.erase(id_);
    l.total -= bytes_;
    id_ = 0, bytes_ = 0;
}

std::int64_t memory_charged() {
    Ledger& l = ledger();
    const std::lock_guard lock(l.mutex);
    return l.total;
}

int parse_int(const std::string& option, const std::string& text, const std::string& hint) {
    int value = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc() || p != text.data() + text.size())
        throw Error(fmt::format("{}: '{}' is not an integer{}", option, one_line(text), hint));
    return value;
}

std::vector<int> parse_int_list(const std::string& option, const std::string& text) {
    std::vector<int> out;
    std::size_t start = 0;
    while (start <= text.size()) {
        const std::size_t end = std::min(text.find(',', start), text.size());
        out.push_back(parse_int(option, text.substr(start, end - start), " (expected a list like 1,2,3)"));
        start = end + 1;
    }
    return out;
}

std::int64_t parse_bytes(const std::string& option, const std::string& text) {
    std::size_t used = 0;
    double v = 0;
    try {
        v = std::stod(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    const std::string unit = text.substr(used);
    const double scale = unit.empty() || unit == "B" ? 1
                         : unit == "KiB"             ? 1024.0
                         : unit == "MiB"             ? 1048576.0
                         : unit == "GiB"             ? 1073741824.0
                                                     : -1;
    if (used == 0 || scale < 0 || !(v > 0) || v * scale > 1e15)
        throw Error(fmt::format("{} '{}': give bytes, or a number with KiB, MiB or GiB", option, one_line(text)));
    return std::int64_t(v * scale);
}

namespace {
// Every field by its glossary name, in llama2.c's header order.
constexpr std::pair<const char*, int Config::*> kFields[] = {
    {"dim", &Config::dim},         {"hidden_dim", &Config::hidden_dim}, {"n_layers", &Config::n_layers},
    {"n_heads", &Config::n_heads}, {"n_kv_heads", &Config::n_kv_heads}, {"vocab_size", &Config::vocab_size},
    {"max_seq", &Config::max_seq},
};
}  // namespace

void Config::validate() const {
    for (auto [name, field] : kFields)
        if (this->*field <= 0) throw Error(fmt::format("config: {} must be positive, got {}", name, this->*field));
    if (dim % n_heads != 0) throw Error(fmt::format("config: n_heads ({}) must divide dim ({})", n_heads, dim));
    if (n_heads % n_kv_heads != 0)
        throw Error(fmt::format("config: n_kv_heads ({}) must divide n_heads ({})", n_kv_heads, n_heads));
    // Every tensor, and the whole model, must have a size we can index and allocate.
    checked_mul(vocab_size, dim, "vocab_size * dim");
    checked_mul(checked_mul(n_layers, dim, "n_layers * dim"), hidden_dim, "n_layers * dim * hidden_dim");
    checked_mul(checked_mul(n_layers, max_seq, "n_layers * max_seq"), kv_dim(), "KV cache");
    checked_mul(max_seq, max_seq, "max_seq * max_seq");
    n_params(false);
}

std::int64_t Config::n_params(bool shared_classifier) const {
    const std::int64_t L = n_layers;
    std::int64_t per_layer = 0;
    per_layer += 2 * std::int64_t{dim};                                 // two RMSNorm weights
    per_layer += 2 * checked_mul(dim, dim, "dim * dim");                // wq, wo
    per_layer += 2 * checked_mul(dim, kv_dim(), "dim * kv_dim");        // wk, wv
    per_layer += 3 * checked_mul(dim, hidden_dim, "dim * hidden_dim");  // w1, w2, w3
    std::int64_t total = checked_mul(L, per_layer, "n_layers * layer size");
    const std::int64_t embed = checked_mul(vocab_size, dim, "vocab_size * dim");
    total += embed + dim + (shared_classifier ? 0 : embed);
    if (total > kMaxElements) throw Error(fmt::format("config: {} parameters is too many", total));
    return total;
}

std::string Config::describe() const {
    return fmt::format("dim={} hidden_dim={} n_layers={} n_heads={} n_kv_heads={} vocab_size={} max_seq={}", dim,
                       hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq);
}

Config Config::parse(const std::string& spec, Config c) {
    std::stringstream ss(spec);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (item.empty()) continue;
        const auto eq = item.find('=');
        if (eq == std::string::npos) throw Error(fmt::format("shape: expected name=value, got '{}'", one_line(item)));
        const std::string name = item.substr(0, eq), text = item.substr(eq + 1);
        // The field first: a value's message then names a known field, never raw user bytes.
        const auto* f = std::find_if(std::begin(kFields), std::end(kFields),
                                     [&](const auto& entry) { return name == entry.first; });
        if (f == std::end(kFields)) throw Error(fmt::format("shape: unknown field '{}'", one_line(name)));
        c.*(f->second) = parse_int("shape", text, fmt::format(" for {}", f->first));
    }
    return c;
}

Config stories260k_shape() { return Config{64, 172, 5, 8, 4, 512, 512}; }
Config stories15m_shape() { return Config{288, 768, 6, 6, 6, 32000, 256}; }

}  // namespace kvlab
