// Lab 9's grader: your quantizer on generated blocks (every value within half a step of its own
// group; codes packed, one scale and minimum per group), then inside kvlab's QuantizedCache (KIVI:
// keys per channel, values per token) where the logits must stay within verify's stated bounds
// and the bytes must be what the cache promises; your window inside kvlab's WindowCache, which
// must be bitwise exact while T <= S + W and must differ from naive decode for some T > S + W;
// your H2O eviction rule on generated lists with ties, then inside kvlab's H2OCache, which must
// keep the positions and give the logits kvlab's own rule does.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "approx_metrics.h"
#include "cpu_backend.h"
#include "decode.h"
#include "format_oracle.h"
#include "grader.h"
#include "h2o_cache.h"
#include "lab.h"
#include "window_cache.h"

using namespace kvlab;
using lab09::Axis;

namespace {

const char* axis_name(Axis a) { return a == Axis::per_token ? "per-token" : "per-channel"; }

// A generated block: rows x cols with `group` dividing the grouped axis, and columns of two
// magnitudes (KIVI's observation: key outliers live in a few fixed channels).
struct Block {
    int rows, cols, group, bits;
    Axis axis;
    std::vector<float> x;  // [rows, cols]
    std::string describe() const {
        return fmt::format("a {}x{} block, {} groups of {}, int{}", rows, cols, axis_name(axis), group, bits);
    }
    int n_groups() const { return axis == Axis::per_token ? rows * (cols / group) : (rows / group) * cols; }
    // The flat indices of group gi's elements (lab.h's order of groups).
    std::vector<int> members(int gi) const {
        std::vector<int> out;
        for (int j = 0; j < group; j++) {
            if (axis == Axis::per_token) {
                const int per_row = cols / group;
                out.push_back((gi / per_row) * cols + (gi % per_row) * group + j);
            } else {
                out.push_back(((gi / cols) * group + j) * cols + gi % cols);
            }
        }
        return out;
    }
};

Block draw_block() {
    Block b;
    b.axis = draw(0, 1) == 0 ? Axis::per_token : Axis::per_channel;
    b.bits = *rc::gen::elementOf(std::vector<int>{8, 4});
    b.group = draw(1, 8);
    b.rows = b.axis == Axis::per_token ? draw(1, 4) : b.group * draw(1, 3);
    b.cols = b.axis == Axis::per_token ? b.group * draw(1, 4) : draw(1, 8);
    std::vector<float> magnitude(std::size_t(b.cols));
    for (float& m : magnitude) m = *rc::gen::elementOf(std::vector<float>{1.0f, 100.0f});
    b.x.resize(std::size_t(b.rows) * b.cols);
    for (int i = 0; i < b.rows * b.cols; i++) {
        const float v = float(draw(0, 1000)) / 1000.0f * magnitude[std::size_t(i % b.cols)];
        b.x[std::size_t(i)] = draw(0, 1) == 0 ? v : -v;
    }
    return b;
}

// The sizes lab.h promises, checked before anything indexes the block.
std::string storage_problem(const lab09::QuantBlock& q, int rows, int cols, int n_groups, int bits) {
    const std::size_t want = (std::size_t(rows) * cols * bits + 7) / 8;
    if (q.codes.size() != want)
        return fmt::format("your codes take {} bytes; {} codes of {} bits pack into {}", q.codes.size(), rows * cols,
                           bits, want);
    if (q.scales.size() != std::size_t(n_groups) || q.mins.size() != std::size_t(n_groups))
        return fmt::format("your block has {} scales and {} mins; it has {} groups, one scale and one min each",
                           q.scales.size(), q.mins.size(), n_groups);
    return "";
}

// Your quantize of b, its sizes checked, and your dequantize of it.
struct RoundTrip {
    lab09::QuantBlock q;
    std::vector<float> x_hat;  // [rows, cols]
};
RoundTrip round_trip(const Block& b) {
    lessons::log_case(fmt::format("quantize(x, rows {}, cols {}, {}, group {}, bits {})", b.rows, b.cols,
                                  axis_name(b.axis), b.group, b.bits));
    RoundTrip r{lab09::quantize(b.x, b.rows, b.cols, b.axis, b.group, b.bits), {}};
    if (const std::string p = storage_problem(r.q, b.rows, b.cols, b.n_groups(), b.bits); !p.empty())
        fail(fmt::format("{}: {}", b.describe(), p));
    r.x_hat.assign(b.x.size(), std::numeric_limits<float>::quiet_NaN());  // NaN: what dequantize leaves unwritten
    lessons::log_case(fmt::format("dequantize(your quantize's block, rows {}, cols {}, {}, group {}, bits {})", b.rows,
                                  b.cols, axis_name(b.axis), b.group, b.bits));
    lab09::dequantize(r.q, b.rows, b.cols, b.axis, b.group, b.bits, r.x_hat);
    return r;
}

void check_round_trip() {
    const Block b = draw_block();
    const std::vector<float> x_hat = round_trip(b).x_hat;
    const int levels = (1 << b.bits) - 1;
    for (int gi = 0; gi < b.n_groups(); gi++) {
        const std::vector<int> m = b.members(gi);
        float lo = b.x[std::size_t(m[0])], hi = lo;
        for (int i : m) lo = std::min(lo, b.x[std::size_t(i)]), hi = std::max(hi, b.x[std::size_t(i)]);
        const double step = (double(hi) - double(lo)) / levels;
        // Half a step, plus float rounding in computing the scale, the code and code * scale + min.
        const double bound = 0.5 * step + 1e-5 * (std::fabs(double(lo)) + std::fabs(double(hi)));
        for (int i : m) {
            const double err = std::fabs(double(b.x[std::size_t(i)]) - double(x_hat[std::size_t(i)]));
            if (!(err <= bound))
                fail(fmt::format("{}: element (row {}, col {}) = {} came back as {}: an error of {:.3g}, more than half "
                                 "a step of its own group (group {}: min {}, max {}, step {:.3g})",
                                 b.describe(), i / b.cols, i % b.cols, b.x[std::size_t(i)], x_hat[std::size_t(i)], err,
                                 gi, lo, hi, step));
        }
    }
}

void check_storage() {
    const Block b = draw_block();
    const auto [q, x_hat] = round_trip(b);
    for (int gi = 0; gi < b.n_groups(); gi++)
        for (int i : b.members(gi)) {
            const unsigned code = QuantizedCache::get_code(q.codes.data(), i, b.bits);
            const float want = float(code) * q.scales[std::size_t(gi)] + q.mins[std::size_t(gi)];
            if (std::memcmp(&want, &x_hat[std::size_t(i)], sizeof want) != 0)
                fail(fmt::format("{}: element (row {}, col {}): your dequantize gives {}, but its stored code {} x scale "
                                 "{} + min {} (group {}) is {}: x_hat comes from the stored codes alone, "
                                 "code * scale + min in float",
                                 b.describe(), i / b.cols, i % b.cols, x_hat[std::size_t(i)], code,
                                 q.scales[std::size_t(gi)], q.mins[std::size_t(gi)], gi, want));
        }
}

// A KIVI cache with the student's quantizer making what attention reads: a head-major fp32 cache
// whose rows are replaced, once stored, by the student's round trip of the same floats (values
// and per-token keys at once; per-channel keys a group at a time, when its last row is stored,
// the earlier rows staying fp32 until then: KIVI's residual). kvlab's own QuantizedCache keeps
// codes only; this one keeps the floats its codes stand for, so that any student block layout
// plugs in, and reports the student's blocks as its memory.
class LabQuantizedCache final : public ContiguousCache {
public:
    LabQuantizedCache(const Config& c, QuantSpec spec) : ContiguousCache(c), spec_(spec), reference_(c, spec) {}

    const QuantSpec& spec() const { return spec_; }
    std::string name() const override { return reference_.name(); }
    int max_step() const override { return reference_.max_step(); }
    MemoryStats memory() const override {
        MemoryStats m = ContiguousCache::memory();
        m.payload_bytes = code_bytes_;
        m.metadata_bytes = meta_bytes_;
        m.reserved_bytes = m.allocated_bytes = code_bytes_ + meta_bytes_;
        return m;
    }

protected:
    void on_stored(int l, int pos) override {
        const Config& c = config();
        const int hs = c.head_size(), g = spec().group;
        const bool kivi = spec().key_axis == Axis::per_channel;
        const bool completes = kivi && pos % g == g - 1;  // the last row of a key group: it is quantized now
        const int k_first = kivi ? pos - g + 1 : pos, k_rows = kivi ? g : 1;
        float* k = storage().k_f32();
        float* v = storage().v_f32();
        for (int h = 0; h < c.n_kv_heads; h++) {
            std::vector<float> v_raw(row(v, l, h, pos), row(v, l, h, pos) + hs);  // [head_size]
            round_trip(v_raw.data(), 1, hs, Axis::per_token, row(v, l, h, pos));
            if (!kivi || completes) {
                // The key rows [k_rows, head_size] are consecutive: head-major storage.
                std::vector<float> k_raw(row(k, l, h, k_first), row(k, l, h, k_first) + std::size_t(k_rows) * hs);
                round_trip(k_raw.data(), k_rows, hs, spec().key_axis, row(k, l, h, k_first));
            }
        }
    }

private:
    // Row (l, h, t) of the fp32 storage: [n_layers, n_kv_heads, max_seq, head_size].
    float* row(float* b, int l, int h, int t) const { return b + storage().row(l, h, t) * config().head_size(); }
    // out[rows, head_size] (consecutive rows) = dequantize(quantize(x)).
    void round_trip(const float* x, int rows, int cols, Axis axis, float* out) {
        const int g = spec().group, bits = spec().bits;
        const int n_groups = axis == Axis::per_token ? rows * (cols / g) : (rows / g) * cols;
        const std::size_t n = std::size_t(rows) * cols;
        const lab09::QuantBlock q = lab09::quantize(std::span<const float>(x, n), rows, cols, axis, g, bits);
        if (const std::string p = storage_problem(q, rows, cols, n_groups, bits); !p.empty())
            throw Error(fmt::format("in the cache, a {}x{} {} block: {}", rows, cols, axis_name(axis), p));
        lab09::dequantize(q, rows, cols, axis, g, bits, std::span<float>(out, n));
        code_bytes_ += std::int64_t(q.codes.size());
        meta_bytes_ += std::int64_t(sizeof(float) * (q.scales.size() + q.mins.size()));
    }
    QuantSpec spec_;
    QuantizedCache reference_;  // kvlab's: its name, its step rule, and (check_cache_memory) its promise
    std::int64_t code_bytes_ = 0, meta_bytes_ = 0;  // the student's blocks so far
};

// Runs `body`, a decode through a cache with the student's code plugged in; what that code makes
// the cache throw (a block of the wrong size, a position the ring no longer holds) fails the case
// in its own words.
template <class Body>
void plugged(const std::string& what, Body body) {
    try {
        body();
    } catch (const lessons::NotImplemented&) {
        throw;
    } catch (const Error& e) {
        fail(fmt::format("{}: {}", what, e.what()));
    }
}

struct Bound {
    double max_abs, kl;
};
// proofs/verify.cpp's stated bounds for random models of stories260K's shape, context 32.
Bound bound_for(int bits) { return bits == 8 ? Bound{0.2, 1e-3} : Bound{2.5, 0.15}; }

QuantSpec draw_kivi() {
    QuantSpec spec;
    spec.bits = *rc::gen::elementOf(std::vector<int>{8, 4});
    spec.key_axis = Axis::per_channel;
    spec.group = *rc::gen::elementOf(std::vector<int>{2, 4, 8});
    return spec;
}

Config quant_shape() {
    Config c = stories260k_shape();
    c.max_seq = 32;
    return c;
}

void check_cache_bounds() {
    const Config c = quant_shape();
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const QuantSpec spec = draw_kivi();
    LabQuantizedCache cache(c, spec);
    CpuBackend backend(m);
    CachedDecoder exact(backend), quant(backend, cache);
    const std::vector<int> tokens = draw_tokens(c, draw(1, c.max_seq));
    const int prompt = draw(1, int(tokens.size()));
    const std::span<const int> all(tokens);
    const Bound b = bound_for(spec.bits);
    const std::string what = fmt::format("{} with your quantizer, stories260K shape, {} tokens, prompt {}",
                                         cache.name(), tokens.size(), prompt);
    for (int T = prompt; T <= int(tokens.size()); T++) {
        const std::vector<float> want = T == prompt ? exact.prefill(all.first(T)) : exact.decode(tokens[T - 1]);
        lessons::log_case(fmt::format("{}: {} at T = {}", what, T == prompt ? "the prefill" : "a decode step", T));
        std::vector<float> got;
        plugged(what, [&] { got = T == prompt ? quant.prefill(all.first(T)) : quant.decode(tokens[T - 1]); });
        const LogitError e = compare_logits(want, got);
        if (!(e.max_abs <= b.max_abs && e.kl <= b.kl))
            fail(fmt::format("{}: at T = {} max |logit error| {:.3g} (bound {}), KL {:.3g} (bound {})", what, T,
                             e.max_abs, b.max_abs, e.kl, b.kl));
    }
}

void check_cache_memory() {
    const Config c = quant_shape();
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const QuantSpec spec = draw_kivi();
    LabQuantizedCache cache(c, spec);
    CachedDecoder quant(m, cache);
    const int T = spec.group * draw(1, c.max_seq / spec.group);  // whole key groups: no fp32 residual
    lessons::log_case(
        fmt::format("{} with your quantizer, stories260K shape: a prefill of {} tokens", cache.name(), T));
    plugged(cache.name(), [&] { quant.prefill(draw_tokens(c, T)); });
    const MemoryStats got = cache.memory();
    const double promised = QuantizedCache(c, spec).bytes_per_token() * T;
    if (double(got.payload_bytes + got.metadata_bytes) != promised)
        fail(fmt::format("{}, T = {}: your blocks hold {} bytes of codes and {} of scales and mins, {} in all; the "
                         "cache promises {} ({} per token: codes of {} bits, one scale and one min per group)",
                         cache.name(), T, got.payload_bytes, got.metadata_bytes,
                         got.payload_bytes + got.metadata_bytes, promised, promised / T, spec.bits));
}

// The rule of lab.h, stated by the grader.
std::vector<int> window_rule(int pos, int sinks, int window) {
    std::vector<int> out;
    for (int t = 0; t < std::min(sinks, pos + 1); t++) out.push_back(t);
    for (int t = std::max(sinks, pos - window + 1); t <= pos; t++) out.push_back(t);
    return out;
}

std::string listed(std::span<const int> v) {
    std::string s;
    for (int x : v) {
        if (!s.empty()) s += ", ";
        s += std::to_string(x);
    }
    return "[" + s + "]";
}
std::string listed(std::span<const float> v) {
    std::string s;
    for (float x : v) {
        if (!s.empty()) s += ", ";
        s += fmt::format("{}", x);
    }
    return "[" + s + "]";
}

// The student's positions for a query at pos, checked to be a list the caller can index.
std::vector<int> student_positions(int pos, int sinks, int window) {
    std::vector<int> buf(std::size_t(pos) + 1 + 64, -1);  // room past pos + 1, so an overlong answer is seen
    const int n = lab09::window_positions(pos, sinks, window, buf.data());
    if (n < 0 || n > pos + 1)
        throw Error(fmt::format("a query at pos {} with S = {}, W = {}: your window returns {} positions; at most {}",
                                pos, sinks, window, n, pos + 1));
    buf.resize(std::size_t(n));
    return buf;
}

void check_window_positions() {
    const int pos = draw(0, 40), sinks = draw(0, 6), window = draw(1, 10);
    lessons::log_case(fmt::format("window_positions(pos {}, sinks {}, window {})", pos, sinks, window));
    const std::vector<int> got = student_positions(pos, sinks, window), want = window_rule(pos, sinks, window);
    if (got == want) return;
    std::string hint;
    for (int t = 0; t < std::min(sinks, pos + 1) && hint.empty(); t++)
        if (std::find(got.begin(), got.end(), t) == got.end())
            hint = fmt::format(": the attention sinks 0..{} are missing", sinks - 1);
    fail(fmt::format("a query at pos {} with S = {}, W = {} reads {}; it must read {}{}", pos, sinks, window,
                     listed(got), listed(want), hint));
}

// kvlab's window cache (its ring, its evictions), reading the positions the student's rule lists.
class LabWindowCache final : public WindowCache {
public:
    using WindowCache::WindowCache;
    int attended(int pos, std::int64_t* slots, int* positions) const override {
        const std::vector<int> mine = student_positions(pos, sinks(), window());
        for (std::size_t i = 0; i < mine.size(); i++) {
            const int t = mine[i];
            if (t < 0 || t > pos || !resident(t))
                throw Error(fmt::format("a query at pos {} reads position {}, which the ring does not hold "
                                        "(evicted, or not yet written)",
                                        pos, t));
            slots[i] = slot(t);
            if (positions) positions[i] = t;
        }
        return int(mine.size());
    }
};

// Decode a generated sequence through the student's window; compare(T, logits) at every T.
template <class Compare>
void window_run(Compare compare) {
    const Config c = draw_config();
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const int sinks = draw(0, 3), window = draw(1, 4), chunk = draw(0, 3);
    LabWindowCache cache(c, sinks, window, chunk);
    CachedDecoder cached(m, cache);
    NaiveDecoder naive(m);
    const std::vector<int> tokens = draw_tokens(c, draw(1, c.max_seq));
    const int prompt = draw(1, int(tokens.size()));
    const std::span<const int> all(tokens);
    const std::string what =
        fmt::format("window S = {}, W = {} (chunk {}), {}, prompt {}", sinks, window, chunk, c.describe(), prompt);
    for (int T = prompt; T <= int(tokens.size()); T++) {
        lessons::log_case(fmt::format("{}, {} tokens: {} at T = {}", what, tokens.size(),
                                      T == prompt ? "the prefill" : "a decode step", T));
        std::vector<float> got;
        plugged(what, [&] { got = T == prompt ? cached.prefill(all.first(T)) : cached.decode(tokens[T - 1]); });
        compare(what, T, T - sinks - window, naive, all.first(T), got);
    }
}

void check_window_exact() {
    window_run([](const std::string& what, int T, int beyond, NaiveDecoder& naive, std::span<const int> seq,
                  const std::vector<float>& got) {
        if (beyond > 0) return;
        const std::string diff = lessons::describe_difference(naive.forward(seq), got);
        if (!diff.empty())
            fail(fmt::format("{}: at T = {} <= S + W the window holds every position, yet it differs from naive "
                             "decode: {}",
                             what, T, diff));
    });
}

void check_window_differs() {
    window_run([](const std::string& what, int T, int beyond, NaiveDecoder& naive, std::span<const int> seq,
                  const std::vector<float>& got) {
        if (beyond <= 0) return;
        const std::string diff = lessons::describe_difference(naive.forward(seq), got);
        if (!diff.empty())
            fail(fmt::format("{}: at T = {} = S + W + {} the window differs from naive decode beyond S + W: {}", what,
                             T, beyond, diff));
    });
}

// ----------------------------------------------------------------------------------------------
// H2O: the student's eviction rule on generated lists, then inside kvlab's H2O cache.

// The index H2O evicts (core/h2o_cache.h), written as a search over the candidates.
int h2o_rule(std::span<const int> kept, std::span<const float> scores, int pos, int recent) {
    int best = -1;
    for (std::size_t j = 0; j < kept.size(); j++) {
        if (kept[j] > pos - recent) break;
        if (best < 0 || scores[j] < scores[std::size_t(best)]) best = int(j);
    }
    return best;
}

// The student's index, checked to be a candidate before anything uses it.
int student_victim(std::span<const int> kept, std::span<const float> scores, int pos, int recent) {
    const int j = lab09::h2o_victim(kept, scores, pos, recent);
    if (j < 0 || j >= int(kept.size()))
        throw Error(fmt::format("h2o_victim(pos={}, recent={}, {} kept) returned index {}, outside 0..{}", pos, recent,
                                kept.size(), j, kept.size() - 1));
    if (kept[std::size_t(j)] > pos - recent)
        throw Error(
            fmt::format("h2o_victim(pos={}, recent={}) returned index {}, position {}: inside the recent "
                        "window {}..{}, which H2O always keeps",
                        pos, recent, j, kept[std::size_t(j)], pos - recent + 1, pos));
    return j;
}

void check_h2o_victim() {
    const int recent = draw(1, 6), heavy = draw(1, 8), pos = draw(recent + heavy, 60);
    // recent - 1 latest positions, and heavy + 1 older ones (distinct, increasing).
    std::vector<int> older;
    for (int t = 0; t <= pos - recent; t++) older.push_back(t);
    std::vector<int> kept;
    for (int i = 0; i < heavy + 1; i++) {
        const std::size_t at = std::size_t(draw(0, int(older.size()) - 1));
        kept.push_back(older[at]);
        older.erase(older.begin() + std::ptrdiff_t(at));
    }
    std::sort(kept.begin(), kept.end());
    for (int t = pos - recent + 1; t < pos; t++) kept.push_back(t);
    std::vector<float> scores;
    for (std::size_t j = 0; j < kept.size(); j++) scores.push_back(float(draw(0, 4)) / 4.0f);  // ties happen
    int got = -1;
    lessons::log_case(
        fmt::format("h2o_victim(kept {}, scores {}, pos {}, recent {})", listed(kept), listed(scores), pos, recent));
    plugged("h2o", [&] { got = student_victim(kept, scores, pos, recent); });
    const int want = h2o_rule(kept, scores, pos, recent);
    if (got == want) return;
    std::string listed_scores;
    for (std::size_t j = 0; j < kept.size(); j++)
        listed_scores += fmt::format("{}{}: {}", j ? ", " : "", kept[j], scores[j]);
    fail(
        fmt::format("position {} arrives, recent {}; kept (position: score) [{}]: you evict index {} (position "
                    "{}), H2O evicts index {} (position {}): the lowest score older than the recent window, the "
                    "oldest on a tie",
                    pos, recent, listed_scores, got, kept[std::size_t(got)], want, kept[std::size_t(want)]));
}

// kvlab's H2O cache, evicting what the student's rule says.
class LabH2OCache final : public H2OCache {
public:
    using H2OCache::H2OCache;

protected:
    int victim(int lh, int pos) const override {
        const int l = lh / config().n_kv_heads, h = lh % config().n_kv_heads;
        return student_victim(kept(l, h), scores(l, h), pos, recent());
    }
};

// Decodes a generated sequence through the student's H2O and kvlab's: the same logits, and every
// layer and KV head keeps the same positions, at every step.
void check_h2o_cache() {
    const Config c = draw_config(2);
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const int recent = draw(1, 4), heavy = draw(0, 4);
    LabH2OCache mine(c, recent, heavy);
    H2OCache theirs(c, recent, heavy);
    CachedDecoder a(m, mine), b(m, theirs);
    const std::vector<int> tokens = draw_tokens(c, draw(1, c.max_seq));
    const std::string what = fmt::format("h2o recent {}, heavy {}, {}", recent, heavy, c.describe());
    for (std::size_t T = 1; T <= tokens.size(); T++) {
        lessons::log_case(fmt::format("{}, {} tokens: decode at T = {}", what, tokens.size(), T));
        std::vector<float> got;
        plugged(what, [&] { got = a.decode(tokens[T - 1]); });
        const std::vector<float>& want = b.decode(tokens[T - 1]);
        for (int l = 0; l < c.n_layers; l++)
            for (int h = 0; h < c.n_kv_heads; h++)
                if (!std::ranges::equal(mine.kept(l, h), theirs.kept(l, h)))
                    fail(fmt::format("{}: at T = {} layer {}'s KV head {} keeps {}; H2O keeps {}", what, T, l, h,
                                     listed(mine.kept(l, h)), listed(theirs.kept(l, h))));
        const std::string diff = lessons::describe_difference(want, got);
        if (!diff.empty()) fail(fmt::format("{}: at T = {} the logits differ from kvlab's H2O: {}", what, T, diff));
    }
}

// Not graded: what the approximations buy and cost on a bigger run, for the README's questions.
void measure() {
    Config c = stories260k_shape();
    c.max_seq = 256;
    const Model m = random_model(c, 1);
    const std::vector<int> tokens = [&] {
        SplitMix64 rng(7);
        std::vector<int> t(std::size_t(c.max_seq));
        for (int& x : t) x = int(rng.next() % std::uint64_t(c.vocab_size));
        return t;
    }();
    CpuBackend backend(m);
    auto run = [&](Cache& cache, const char* label) {
        CachedDecoder exact(backend), approx(backend, cache);
        ErrorSummary s;
        s.add(compare_logits(exact.prefill(std::span(tokens).first(1)), approx.prefill(std::span(tokens).first(1))));
        for (std::size_t i = 1; i < tokens.size(); i++)
            s.add(compare_logits(exact.decode(tokens[i]), approx.decode(tokens[i])));
        const MemoryStats mem = cache.memory();
        const std::int64_t fp32 = kv_bytes(c, cache.length()), held = mem.payload_bytes + mem.metadata_bytes;
        fmt::print("{:<40} {:>8} {:>8} {:>6.2f}x {:>11.3g} {:>9.3g} {:>6.1f}%\n", label, fp32, held,
                   double(fp32) / double(held), s.max_abs, s.mean_kl(), 100.0 * s.top1_rate());
    };
    fmt::print("\nmeasured, not graded: stories260K shape, random weights (seed 1), T = {} tokens\n", c.max_seq);
    fmt::print("{:<40} {:>8} {:>8} {:>7} {:>11} {:>9} {:>7}\n", "cache", "fp32 B", "held B", "saved", "max|dlogit|",
               "mean KL", "top-1");
    for (int bits : {8, 4}) {
        QuantSpec spec;
        spec.bits = bits;
        spec.group = 8;
        LabQuantizedCache q(c, spec);
        run(q, fmt::format("yours: int{} KIVI, group 8", bits).c_str());
    }
    LabWindowCache w(c, 4, 16);
    run(w, "yours: window S = 4, W = 16 (held: ring)");
    FifoCache fifo(c, 20);
    run(fifo, "kvlab's fifo W = 20 (S + W positions)");
    LabH2OCache h2o(c, 10, 10);
    run(h2o, "yours: h2o recent 10 + heavy 10");
}

// ----------------------------------------------------------------------------------------------
// Float formats: each conversion against the oracle, on inputs around the format's own values
// (midpoints and their neighbours, the overflow edge, subnormals, infinities, NaN) and random
// fp32 bit patterns.

template <class Convert>
void check_format(const FloatFormat& f, const char* name, Convert convert) {
    static const proofs::FormatTable table = proofs::format_table(f);
    static const std::vector<float> edges = proofs::format_edge_inputs(table);
    for (int i = 0; i < 32; i++) {
        const float x = draw(0, 1) ? edges[std::size_t(draw(0, int(edges.size()) - 1))]
                                   : std::bit_cast<float>(*rc::gen::arbitrary<std::uint32_t>());
        lessons::log_case(fmt::format("{}({} = fp32 0x{:08x})", name, x, std::bit_cast<std::uint32_t>(x)));
        const std::uint32_t got = convert(x), want = proofs::oracle_encode(f, table, x);
        if (got == want) continue;
        fail(fmt::format("{}({} = fp32 0x{:08x}) gave 0x{:x}, which is {}; expected 0x{:x}, which is {}{}", name, x,
                         std::bit_cast<std::uint32_t>(x), got, decode_float(f, got), want, decode_float(f, want),
                         std::isfinite(x) && std::fabs(x) > decode_float(f, f.max_finite())
                             ? " (past the largest finite value: saturate)"
                             : ""));
    }
}

void check_bf16() { check_format(kBf16, "to_bf16", [](float x) { return std::uint32_t(lab09::to_bf16(x)); }); }
void check_fp8() {
    check_format(kFp8E4M3, "to_fp8_e4m3", [](float x) { return std::uint32_t(lab09::to_fp8_e4m3(x)); });
}

}  // namespace

int main(int argc, char** argv) {
    lessons::Lab lab{9, "approximate caches: KIVI quantization, StreamingLLM window, H2O", LAB_SOURCE, {}};
    lab.checks = {
        {"quantize: every value within half a step of its group", 2, check_round_trip},
        {"storage: packed codes, a scale and a min per group", 1, check_storage},
        {"KIVI cache: logits within the stated bounds", 2, check_cache_bounds, 30},
        {"KIVI cache: holds the bytes it promises", 1, check_cache_memory, 30},
        {"window: sinks 0..S-1 and the last W positions", 1, check_window_positions},
        {"window: bitwise equal to naive while T <= S + W", 2, check_window_exact},
        {"window: differs from naive for some T > S + W", 1, check_window_differs, 100, "beyond S + W"},
        {"h2o: evicts the lightest position older than the recent window", 1, check_h2o_victim},
        {"h2o: in kvlab's H2O cache, the same positions and logits", 2, check_h2o_cache, 50},
        {"bf16: fp32 rounds to the nearest code, ties to even, as the oracle says", 1, check_bf16},
        {"fp8-e4m3: fp32 rounds to the nearest code, saturating at 448", 1, check_fp8},
    };
    const int status = lessons::grade(lab, argc, argv);
    if (status == 0) measure();
    return status;
}
