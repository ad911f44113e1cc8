// Lab 3's grader: your cache under kvlab's real decoders. The store (slot), the read path
// (attended), rollback (release), and P1: cached decode on your cache equals naive decode,
// bit for bit, at every step.
#include <cmath>

#include "decode.h"
#include "forwarding.h"
#include "grader.h"
#include "lab.h"

using namespace kvlab;

namespace {

// Your cache as the decoders see it, each slot it gives them checked before they use it: a slot
// whose rows (l * layer_rows + h * head_rows + slot, every layer and KV head) fall outside the
// storage fails the check in words instead of a write into memory that is not the cache's.
class CheckedCache final : public ForwardingCache {
public:
    using ForwardingCache::ForwardingCache;
    std::int64_t write_slot(int pos) override { return checked("write_slot", pos, ForwardingCache::write_slot(pos)); }
    std::int64_t slot(int t) const override { return checked("slot", t, ForwardingCache::slot(t)); }
    int attended(int pos, std::int64_t* slots, int* positions = nullptr) const override {
        const int n = ForwardingCache::attended(pos, slots, positions);
        if (n < 0 || n > pos + 1)
            fail(fmt::format("attended(pos {}) returned {}: a query at pos {} reads 0..{} rows", pos, n, pos, pos + 1));
        for (int i = 0; i < n; i++) checked("attended", pos, slots[i]);
        return n;
    }

private:
    std::int64_t checked(const char* call, int t, std::int64_t s) const {
        const KVStorage& st = storage();
        const Config& c = config();
        const std::int64_t last =
            std::int64_t(c.n_layers - 1) * st.layer_rows + std::int64_t(c.n_kv_heads - 1) * st.head_rows + s;
        if (s < 0 || last >= st.n_rows)
            fail(
                fmt::format("{}({}) gave slot {}, but the storage has {} rows: layer {}, KV head {} of that slot "
                            "would be row {}",
                            call, t, s, st.n_rows, c.n_layers - 1, c.n_kv_heads - 1, last));
        return s;
    }
};

// A cache holding `n` drawn tokens (appended, not yet written).
std::unique_ptr<Cache> filled_cache(const Config& c, int n) {
    std::unique_ptr<Cache> cache = lab03::make_lab_cache(c);
    if (n > 0) cache->append(draw_tokens(c, n));
    return cache;
}

void check_slots() {
    const Config c = draw_config();
    lessons::log_case(fmt::format("make_lab_cache({}), then append {} tokens", c.describe(), c.max_seq));
    const auto cache = filled_cache(c, c.max_seq);
    const KVStorage& st = cache->storage();
    const std::int64_t n_rows = st.n_rows;
    std::vector<char> used(std::size_t(n_rows), 0);
    for (int t = 0; t < c.max_seq; t++) {
        lessons::log_case(fmt::format("slot({}) on a cache holding {} positions, {}", t, c.max_seq, c.describe()));
        const std::int64_t s = cache->slot(t);
        for (int l = 0; l < c.n_layers; l++)
            for (int h = 0; h < c.n_kv_heads; h++) {
                const std::int64_t row = l * st.layer_rows + h * st.head_rows + s;
                if (s < 0 || row >= n_rows)
                    fail(fmt::format("{}: position {} (layer {}, KV head {}) maps to row {}, outside the storage's {} "
                                     "rows",
                                     c.describe(), t, l, h, row, n_rows));
                if (used[std::size_t(row)]++)
                    fail(fmt::format("{}: position {} (layer {}, KV head {}) shares row {} with another position: one "
                                     "would overwrite the other",
                                     c.describe(), t, l, h, row));
            }
    }
}

void check_read_path() {
    const Config c = draw_config();
    lessons::log_case(fmt::format("make_lab_cache({}), then append {} tokens", c.describe(), c.max_seq));
    const auto cache = filled_cache(c, c.max_seq);
    const int pos = draw(0, c.max_seq - 1);
    std::vector<std::int64_t> slots(std::size_t(c.max_seq), -7);
    std::vector<int> positions(std::size_t(c.max_seq), -7);
    lessons::log_case(
        fmt::format("attended(pos {}) on a cache holding {} positions, {}", pos, c.max_seq, c.describe()));
    const int n = cache->attended(pos, slots.data(), positions.data());
    if (n != pos + 1)
        fail(fmt::format("{}: a query at position {} reads {} rows; it must read positions 0..{} ({} rows), its own "
                         "included (write first, then read)",
                         c.describe(), pos, n, pos, pos + 1));
    for (int t = 0; t <= pos; t++) {
        lessons::log_case(fmt::format("slot({}) after attended(pos {}) on a cache holding {} positions, {}", t, pos,
                                      c.max_seq, c.describe()));
        if (positions[std::size_t(t)] != t)
            fail(fmt::format("{}: a query at position {}: entry {} names position {}, not {} (increasing order)",
                             c.describe(), pos, t, positions[std::size_t(t)], t));
        if (slots[std::size_t(t)] != cache->slot(t))
            fail(fmt::format("{}: a query at position {} reads slot {} for position {}, but slot({}) is {}",
                             c.describe(), pos, slots[std::size_t(t)], t, t, cache->slot(t)));
    }
}

// Prefill a prompt, decode the rest: naive decode agrees at every step.
void check_p1() {
    const Config c = draw_config();
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const std::vector<int> tokens = draw_tokens(c, draw(1, c.max_seq));
    const int prompt = draw(1, int(tokens.size()));
    lessons::log_case(fmt::format("make_lab_cache({}), for {} tokens, prompt {}", c.describe(), tokens.size(), prompt));
    const auto cache = lab03::make_lab_cache(c);
    CheckedCache checked(*cache);
    NaiveDecoder naive(m);
    CachedDecoder cached(m, checked);
    const std::span<const int> all(tokens);
    for (int T = prompt; T <= int(tokens.size()); T++) {
        lessons::log_case(fmt::format("{}, {} tokens, prompt {}: {} at T = {}", c.describe(), tokens.size(), prompt,
                                      T == prompt ? "the prefill" : "a decode step", T));
        const std::vector<float>& got = T == prompt ? cached.prefill(all.first(T)) : cached.decode(tokens[T - 1]);
        const std::string diff = lessons::describe_difference(naive.forward(all.first(T)), got);
        if (!diff.empty())
            fail(fmt::format("{}, prompt of {} tokens: at T = {} ({}) the cached logits differ from naive decode: {}",
                             c.describe(), prompt, T, T == prompt ? "the prefill" : "a decode step", diff));
    }
}

// Decode, roll back to n, check the forgotten rows read NaN, decode other tokens exactly.
void check_rollback() {
    const Config c = draw_config(2);
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const std::vector<int> first = draw_tokens(c, draw(1, c.max_seq));
    lessons::log_case(fmt::format("make_lab_cache({}), then prefill {} tokens", c.describe(), first.size()));
    const auto lab_cache = lab03::make_lab_cache(c);
    CheckedCache checked(*lab_cache);
    Cache* const cache = &checked;
    NaiveDecoder naive(m);
    CachedDecoder cached(m, checked);
    cached.prefill(first);
    const int n = draw(0, int(first.size()) - 1);
    lessons::log_case(fmt::format("{}: prefill {} tokens, then truncate({})", c.describe(), first.size(), n));
    std::vector<std::int64_t> forgotten;  // the slots of positions n.. before the rollback
    for (int t = n; t < int(first.size()); t++) forgotten.push_back(cache->slot(t));
    cache->truncate(n);
    const KVStorage& st = cache->storage();
    const int hs = c.head_size();
    for (std::size_t i = 0; i < forgotten.size(); i++)
        for (int l = 0; l < c.n_layers; l++)
            for (int h = 0; h < c.n_kv_heads; h++) {
                const std::int64_t row = l * st.layer_rows + h * st.head_rows + forgotten[i];
                for (const float* base : {st.k_f32(), st.v_f32()})
                    for (int j = 0; j < hs; j++)
                        if (!std::isnan(base[row * hs + j]))
                            fail(fmt::format(
                                "{}: after rolling back from {} to {} positions, position {}'s {} row "
                                "(layer {}, KV head {}) is not NaN: a forgotten row still holds numbers",
                                c.describe(), first.size(), n, n + int(i), base == st.k_f32() ? "K" : "V", l, h));
            }
    std::vector<int> kept(first.begin(), first.begin() + n);
    for (int t : draw_tokens(c, draw(1, c.max_seq - n))) {
        kept.push_back(t);
        lessons::log_case(fmt::format("{}: prefill {} tokens, truncate({}), then decode at T = {}", c.describe(),
                                      first.size(), n, kept.size()));
        const std::string diff = lessons::describe_difference(naive.forward(kept), cached.decode(t));
        if (!diff.empty())
            fail(fmt::format("{}: after rolling back to {} positions, at T = {} the logits differ from naive decode: {}",
                             c.describe(), n, kept.size(), diff));
    }
}

}  // namespace

int main(int argc, char** argv) {
    lessons::Lab lab{3, "the cache", LAB_SOURCE, {}};
    lab.checks = {
        {"store: each (layer, KV head, position) has its own row", 2, check_slots},
        {"read path: a query at pos reads 0..pos in order", 2, check_read_path},
        {"P1: cached decode on your cache == naive, bitwise", 4, check_p1},
        {"rollback: forgotten rows read NaN, decoding goes on exactly", 2, check_rollback},
    };
    return lessons::grade(lab, argc, argv);
}
