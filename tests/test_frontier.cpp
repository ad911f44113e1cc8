// kvlab frontier: the Pareto front against brute force (and a planted wrong front caught), the
// mean-pooled GQA conversion bitwise exact where the pooled heads are equal, a small run end to end
// on a random model, and its bad options refused in one line.
#include <fmt/format.h>
#include <rapidcheck.h>
#include <rapidcheck/catch.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.h"
#include "compare.h"
#include "decode.h"
#include "frontier.h"
#include "model.h"
#include "plot.h"

using kvlab::cli::ParetoPoint;

namespace {

bool finite(const ParetoPoint& p) { return std::isfinite(p.bytes) && std::isfinite(p.kl); }

// q dominates p: bytes and KL both at most p's, one of them strictly less.
bool dominates(const ParetoPoint& q, const ParetoPoint& p) {
    return finite(q) && q.bytes <= p.bytes && q.kl <= p.kl && (q.bytes < p.bytes || q.kl < p.kl);
}

// "" when `front` is the Pareto front of `points` by brute force, else the first point it has wrong.
std::string front_violation(const std::vector<ParetoPoint>& points, const std::vector<bool>& front) {
    if (front.size() != points.size()) return "the front has another size than the points";
    for (std::size_t i = 0; i < points.size(); i++) {
        std::ptrdiff_t by = -1;  // a point that dominates point i
        for (std::size_t j = 0; j < points.size() && by < 0; j++)
            if (j != i && dominates(points[j], points[i])) by = std::ptrdiff_t(j);
        const auto at = [&](std::size_t k) { return fmt::format("({}, {})", points[k].bytes, points[k].kl); };
        if (front[i] && !finite(points[i])) return fmt::format("point {} {} is on the front, not finite", i, at(i));
        if (front[i] && by >= 0)
            return fmt::format("point {} {} is on the front, dominated by {} {}", i, at(i), by, at(std::size_t(by)));
        if (!front[i] && finite(points[i]) && by < 0)
            return fmt::format("point {} {} is off the front, dominated by none", i, at(i));
    }
    return "";
}

// Points on a small grid, so that equal bytes, equal KL and equal points are common; now and then a
// KL of 0 (an exact setting) or a NaN (a broken one).
rc::Gen<std::vector<ParetoPoint>> gen_points() {
    const auto coordinate = rc::gen::weightedOneOf<double>(
        {{8, rc::gen::map(rc::gen::inRange(0, 6), [](int v) { return std::exp2(double(v)); })},
         {1, rc::gen::just(0.0)},
         {1, rc::gen::just(std::numeric_limits<double>::quiet_NaN())}});
    return rc::gen::container<std::vector<ParetoPoint>>(rc::gen::apply(
        [](double b, double kl) {
            return ParetoPoint{b, kl};
        },
        coordinate, coordinate));
}

}  // namespace

TEST_CASE("frontier: the Pareto front is every undominated point and no other", "[frontier]") {
    const std::vector<ParetoPoint> hand = {{1, 5}, {2, 3}, {2, 4}, {3, 3}, {4, 0}, {4, 0}, {5, 0}};
    CHECK(kvlab::cli::pareto_front(hand) == std::vector<bool>{true, true, false, false, true, true, false});
    rc::prop("pareto_front equals brute force", [] {
        const std::vector<ParetoPoint> points = *gen_points();
        const std::vector<bool> front = kvlab::cli::pareto_front(points);
        RC_ASSERT(front_violation(points, front) == "");
    });
}

TEST_CASE("frontier counter-test: a planted wrong front is caught", "[frontier]") {
    // A front with one point moved on or off: the brute-force check names it.
    CHECK(front_violation({{1, 1}, {2, 2}}, {true, true}) != "");
    CHECK(front_violation({{1, 2}, {2, 1}}, {true, false}) != "");
    rc::prop("flipping any one point of the front is caught", [] {
        const std::vector<ParetoPoint> points = *gen_points().as("points");
        RC_PRE(!points.empty());
        std::vector<bool> front = kvlab::cli::pareto_front(points);
        const std::size_t i = *rc::gen::inRange<std::size_t>(0, points.size()).as("flipped");
        front[i] = !front[i];
        RC_ASSERT(front_violation(points, front) != "");
    });
}

namespace {

// Logits [steps][vocab_size] of exact decode of `tokens`: a prefill of the first 3, then a token a step.
std::vector<std::vector<float>> exact_logits(const kvlab::Model& model, const std::vector<int>& tokens) {
    kvlab::CachedDecoder dec(model);
    std::vector<std::vector<float>> out{dec.prefill(std::span<const int>(tokens).first(3))};
    for (std::size_t i = 3; i < tokens.size(); i++) out.push_back(dec.decode(tokens[i]));
    return out;
}

}  // namespace

TEST_CASE("frontier: mean-pooled GQA is bitwise exact when a group's KV heads are equal", "[frontier]") {
    for (const bool shared : {true, false})
        for (const int n_kv_heads : {4, 2}) {
            kvlab::Config c = kvlab::Config::parse("dim=32,hidden_dim=48,n_layers=2,n_heads=4,vocab_size=64,max_seq=24",
                                                   kvlab::stories260k_shape());
            c.n_kv_heads = n_kv_heads;
            kvlab::Model model = kvlab::random_model(c, 11, shared);
            std::vector<int> tokens = {1};
            kvlab::SplitMix64 rng(5);
            while (tokens.size() < 20) tokens.push_back(int(rng.next() % 64));
            const std::vector<std::vector<float>> before = exact_logits(model, tokens);
            for (const int pooled_heads : {n_kv_heads / 2, 1}) {
                // Pooling heads that differ changes the logits: the check below is not vacuous.
                CHECK(exact_logits(kvlab::cli::pool_kv_heads(model, pooled_heads), tokens) != before);
            }
            // Every head of a group of two made a copy of the group's first: wk and wv rows
            // [n_layers, kv_dim, dim], head h's rows h * head_size .. + head_size - 1.
            const std::size_t hs = std::size_t(c.head_size()), dim = std::size_t(c.dim);
            for (std::span<float> w : {model.w.wk, model.w.wv}) {
                REQUIRE(w.size() == std::size_t(c.n_layers * c.kv_dim()) * dim);
                for (std::size_t l = 0; l < std::size_t(c.n_layers); l++)
                    for (std::size_t h = 1; h < std::size_t(n_kv_heads); h += 2) {
                        float* row = w.data() + (l * std::size_t(c.kv_dim()) + h * hs) * dim;
                        std::copy(row - hs * dim, row, row);
                    }
            }
            model.cpu_panels.reset();  // packed from the weights before the copy: pack them again
            const std::vector<std::vector<float>> equal_heads = exact_logits(model, tokens);
            CHECK(equal_heads != before);
            const kvlab::Model pooled = kvlab::cli::pool_kv_heads(model, n_kv_heads / 2);
            REQUIRE(pooled.config().n_kv_heads == n_kv_heads / 2);
            const std::vector<std::vector<float>> after = exact_logits(pooled, tokens);
            REQUIRE(after.size() == equal_heads.size());
            for (std::size_t s = 0; s < after.size(); s++) {
                INFO("shared " << shared << ", n_kv_heads " << n_kv_heads << ", step " << s);
                CHECK(kvlab::first_difference(equal_heads[s], after[s]) == std::nullopt);
            }
        }
    CHECK_THROWS_AS(kvlab::cli::pool_kv_heads(kvlab::random_model(kvlab::stories260k_shape(), 1), 3), kvlab::Error);
}

namespace {

// A random model with 2 KV heads and max_seq 32, written by `kvlab export`.
const fs::path& tiny_model() {
    static const fs::path p = [] {
        const fs::path m = scratch() / "frontier_tiny.bin";
        const Run r = run_kvlab(
            "export --shape dim=16,hidden_dim=24,n_layers=2,n_heads=4,n_kv_heads=2,vocab_size=40,"
            "max_seq=32 --seed 3 " +
            m.string());
        REQUIRE(r.exit_code == 0);
        return m;
    }();
    return p;
}

// Whether a setting keeps every position of a text of `length` tokens: window and fifo with window
// (plus sinks) >= length, h2o with recent + heavy >= length.
bool keeps_all(const nlohmann::json& s, int length) {
    const nlohmann::json& p = s["params"];
    if (s["variant"] == "window" || s["variant"] == "fifo") return p["window"].get<int>() >= length;
    if (s["variant"] == "h2o") return p["recent"].get<int>() + p["heavy"].get<int>() >= length;
    return false;
}

}  // namespace

TEST_CASE("frontier end to end on a random model: fields and exact settings bitwise", "[frontier][cli]") {
    const fs::path png = scratch() / "frontier.png";
    const bool plot = kvlab::cli::can_plot();
    const Run r = run_kvlab("frontier --model " + tiny_model().string() + " --length 24 --prompts 2 --json" +
                            (plot ? " --plot " + png.string() : ""));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["length"] == 24);
    CHECK(j["prefill"] == 6);
    CHECK(j["steps_per_prompt"] == 18);
    CHECK(j["probe"]["exact_logprob"].is_number());
    const auto& settings = j["settings"];
    REQUIRE(settings.size() >= 20);
    int exact_rows = 0, gqa_rows = 0, mla_rows = 0;
    std::vector<ParetoPoint> points;
    std::vector<bool> front;
    for (std::size_t i = 0; i < settings.size(); i++) {
        const auto& s = settings[i];
        INFO(s.dump());
        for (const char* field :
             {"name", "family", "variant", "params", "kv_format", "bytes_per_token", "bytes_per_position", "mean_kl",
              "max_kl", "max_abs", "top1_rate", "steps", "probe_logprob", "probe_delta", "pareto", "seconds"})
            CHECK(s.contains(field));
        CHECK(s["steps"] == 2 * 18);
        if (i > 0) CHECK(s["bytes_per_token"] >= settings[i - 1]["bytes_per_token"]);  // sorted
        // fp32 settings that keep every position are exact decode: every logit equal, KL exactly 0.
        // MLA ranks: a random MLA model (rank n_heads x head_size = 16, rope_dim 4) against its full
        // rank, off the checkpoint's front.
        if (s["family"] == "mla, random model") {
            mla_rows++;
            const int rank = s["mla_rank"].get<int>();
            CHECK(s["bytes_per_position"] == 2.0 * (rank + 4) * 4);  // n_layers x (rank + rope_dim) x 4 B
            CHECK(s["pareto"] == false);
            if (rank == 16) CHECK(s["mean_kl"] == 0.0);
            points.push_back({s["bytes_per_token"].get<double>(), std::numeric_limits<double>::quiet_NaN()});
            front.push_back(false);
            continue;
        }
        if (s["family"] == "exact" || (keeps_all(s, 24) && s["kv_format"] == "fp32")) {
            exact_rows++;
            CHECK(s["mean_kl"] == 0.0);
            CHECK(s["max_kl"] == 0.0);
            CHECK(s["max_abs"] == 0.0);
            CHECK(s["top1_rate"] == 1.0);
            CHECK(s["probe_delta"] == 0.0);
            CHECK(s["bytes_per_position"] == 128.0);  // 2 (K, V) x 4 B x 2 layers x 2 KV heads x 4 head_size
        }
        if (s["family"] == "gqa, mean-pooled") {
            gqa_rows++;
            CHECK(s["gqa_n_kv_heads"] == 1);
            CHECK(s["bytes_per_position"] == 64.0);  // one KV head of two
        }
        if (s["name"] == "bf16") CHECK(s["bytes_per_position"] == 64.0);
        points.push_back({s["bytes_per_token"].get<double>(), s["mean_kl"].get<double>()});
        front.push_back(s["pareto"].get<bool>());
    }
    CHECK(exact_rows >= 2);
    CHECK(gqa_rows == 1);
    CHECK(mla_rows == 5);  // ranks 1, 2, 4, 8 and 16
    CHECK(front_violation(points, front) == "");
    if (plot) CHECK(slurp(png).substr(1, 3) == "PNG");
    // The text table: a row per setting and the front marked.
    const Run t = run_kvlab("frontier --model " + tiny_model().string() + " --length 16 --prompts 1");
    INFO(t.err);
    REQUIRE(t.exit_code == 0);
    CHECK(t.out.find("fp32 (exact)") != std::string::npos);
    CHECK(t.out.find("pareto") != std::string::npos);
}

TEST_CASE("frontier refuses bad options in one line", "[frontier][cli][errors]") {
    const std::string model = " --model " + tiny_model().string();
    check_refused("frontier --model " + (scratch() / "no-such-model.bin").string(), "no-such-model.bin");
    check_refused("frontier" + model + " --length 1", "--length");
    check_refused("frontier" + model + " --length 33", "--length 33 is outside 2..max_seq = 32");
    check_refused("frontier" + model + " --prompts 0", "--prompts");
    check_refused("frontier" + model + " --length 8 --prefill 8", "--prefill 8 leaves nothing to decode");
    if (kvlab::cli::can_plot()) {
        check_refused("frontier" + model + " --plot " + (scratch() / "no-such-folder" / "f.png").string(),
                      "does not exist");
        check_refused("frontier" + model + " --plot " + scratch().string(), "is a folder");
    }
}
