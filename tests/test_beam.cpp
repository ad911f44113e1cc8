// Beam search on forked caches (core/beam.h): width 1 is greedy decode, wider beams share blocks,
// and `kvlab beam` checks every beam against naive decode. Exactness over generated shapes and
// formats is `kvlab verify beam` (tests/test_verify.cpp), with its planted beam-wrong-parent.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "beam.h"
#include "cli_util.h"
#include "cpu_backend.h"
#include "model.h"
#include "speculative.h"

using namespace kvlab;

namespace {
// dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq
const Config kConfig{16, 24, 2, 4, 2, 32, 24};
}  // namespace

TEST_CASE("beam search of width 1 is greedy decode, and wider beams rank and share", "[beam]") {
    const Model m = random_model(kConfig, 4);
    CpuBackend backend(m);
    const std::vector<int> prompt{3, 1, 4};
    BeamConfig bc;
    bc.width = 1, bc.steps = 10, bc.block_size = 3;
    const BeamRun one = BeamSearch(backend, m, bc).run(prompt);
    CachedDecoder alone(m);
    const DecodeRun greedy = greedy_decode(alone, prompt, 10);
    const std::vector<int>& tokens = one.steps.back().front().tokens;
    CHECK(std::vector<int>(tokens.begin() + 3, tokens.end()) == greedy.tokens);
    bc.width = 5;
    const BeamRun five = BeamSearch(backend, m, bc).run(prompt);
    const std::vector<BeamState>& last = five.steps.back();
    REQUIRE(last.size() == 5);
    for (std::size_t b = 1; b < last.size(); b++) CHECK(last[b - 1].logprob >= last[b].logprob);
    CHECK(last.front().logprob >= one.steps.back().front().logprob);  // a wider search finds no worse
    CHECK(five.peak_blocks < five.peak_unshared_blocks);
    CHECK_THROWS_WITH(BeamSearch(backend, m, bc).run(std::vector<int>(15, 1)), Catch::Contains("positions"));
}

TEST_CASE("kvlab beam: every beam step bitwise equal to naive decode, memory shared", "[beam][cli]") {
    const Run r = run_kvlab("beam --width 3 --steps 8 --block-size 2 --kv-format fp8-e5m2 --json");
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    const nlohmann::json j = nlohmann::json::parse(r.out);
    CHECK(j["beam_steps_bitwise_equal_naive"] == j["beam_steps_checked"]);
    CHECK(j["beams"].size() == 3);
    CHECK(j["peak_blocks"].get<int>() < j["peak_unshared_blocks"].get<int>());
    check_refused("beam --width 0", "--width");
}
