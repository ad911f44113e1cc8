// The continuous-batching scheduler (core/scheduler.h): its budgets and queues, preemption by
// recompute and by swap, prefix hits, and its refusals. Exactness over generated workloads is
// `kvlab verify serve` (tests/test_verify.cpp); here each case also checks every request against
// greedy decode of it alone.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "cpu_backend.h"
#include "model.h"
#include "scheduler.h"
#include "speculative.h"

using namespace kvlab;

namespace {

// dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq
const Config kConfig{16, 24, 2, 4, 2, 32, 24};

// Runs the requests to the end; each request's tokens and logits must equal it decoded alone.
void run_checked(Scheduler& s, const Model& m, const std::vector<ServeRequest>& requests) {
    for (const ServeRequest& r : requests) s.add(r);
    while (s.step()) REQUIRE(s.steps() < 10000);
    CachedDecoder alone(m);
    for (std::size_t i = 0; i < requests.size(); i++) {
        const DecodeRun want = greedy_decode(alone, requests[i].prompt, requests[i].max_new_tokens);
        INFO("request " << i);
        CHECK(s.result(int(i)).output == want.tokens);
        CHECK(s.result(int(i)).logits == want.logits);
        CHECK(s.result(int(i)).finish_step >= s.result(int(i)).first_token_step);
    }
    for (const ServeStep& st : s.history()) {
        CHECK(st.decode_rows + st.prefill_rows <= s.config().max_batch_tokens);
        CHECK(st.blocks_used <= s.config().n_blocks);
    }
}

int total(const Scheduler& s, int ServeResult::*field, int n) {
    int sum = 0;
    for (int i = 0; i < n; i++) sum += s.result(i).*field;
    return sum;
}

}  // namespace

TEST_CASE("scheduler: a pool of one request's blocks preempts by recompute and by swap, every request exact",
          "[scheduler]") {
    const Model m = random_model(kConfig, 3);
    const std::vector<ServeRequest> requests{{{1, 2, 3, 4}, 12, 0}, {{5, 6, 7}, 14, 0}, {{8, 9}, 16, 1}};
    for (const Preemption p : {Preemption::recompute, Preemption::swap}) {
        CpuBackend backend(m);
        SchedulerConfig sc;
        sc.block_size = 4, sc.n_blocks = 6, sc.max_batch_tokens = 8, sc.preemption = p;
        Scheduler s(backend, m, sc);
        run_checked(s, m, requests);
        INFO((p == Preemption::swap ? "swap" : "recompute"));
        CHECK(total(s, &ServeResult::preemptions, 3) > 0);
    }
}

TEST_CASE("scheduler: a later request sharing a prompt maps its blocks with prefix caching on, not off",
          "[scheduler]") {
    const Model m = random_model(kConfig, 5);
    const std::vector<int> prompt{3, 1, 4, 1, 5, 9, 2, 6, 5};
    for (const bool caching : {true, false}) {
        CpuBackend backend(m);
        SchedulerConfig sc;
        sc.block_size = 2, sc.n_blocks = 40, sc.prefix_caching = caching;
        Scheduler s(backend, m, sc);
        run_checked(s, m, {{prompt, 3, 0}, {prompt, 5, 4}});
        CHECK(s.result(1).prefix_hit == (caching ? 8 : 0));
    }
}

TEST_CASE("scheduler: the step budget splits prompts into chunks and mixes them with decode rows", "[scheduler]") {
    const Model m = random_model(kConfig, 7);
    CpuBackend backend(m);
    SchedulerConfig sc;
    sc.block_size = 3, sc.n_blocks = 40, sc.max_batch_tokens = 5;
    Scheduler s(backend, m, sc);
    run_checked(s, m, {{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 4, 0}, {{2, 4}, 6, 0}, {{7, 7, 7, 7, 7, 7, 7}, 2, 2}});
    bool mixed = false;
    for (const ServeStep& st : s.history()) mixed = mixed || (st.decode_rows > 0 && st.prefill_rows > 0);
    CHECK(mixed);
    CHECK(s.history().front().prefill_rows == 5);  // the first prompt, in chunks of the budget
}

TEST_CASE("scheduler: what can never run is refused in one line", "[scheduler]") {
    const Model m = random_model(kConfig, 1);
    CpuBackend backend(m);
    SchedulerConfig sc;
    sc.block_size = 4, sc.n_blocks = 5;  // 20 positions, max_seq 24
    CHECK_THROWS_WITH(Scheduler(backend, m, sc), Catch::Contains("cannot hold one request of max model len 24"));
    sc.max_model_len = 20;
    Scheduler s(backend, m, sc);
    CHECK_THROWS_WITH(s.add({{}, 1, 0}), Catch::Contains("empty prompt"));
    CHECK_THROWS_WITH(s.add({{1, 32}, 1, 0}), Catch::Contains("outside the vocabulary"));
    CHECK_THROWS_WITH(s.add({std::vector<int>(15, 1), 6, 0}), Catch::Contains("pass max model len 20"));
    s.add({{1}, 1, 3});
    CHECK_THROWS_WITH(s.add({{1}, 1, 2}), Catch::Contains("before the request added before it"));
    while (s.step()) {
    }
    CHECK(s.result(0).first_token_step == 3);  // idle steps until it arrives
}

TEST_CASE("kvlab serve-sim: a generated workload and a trace file, every request bitwise equal alone",
          "[scheduler][cli]") {
    for (const char* knobs :
         {"--requests 40", "--requests 30 --preemption swap --kv-format bf16 --num-blocks 12 --max-model-len 120",
          "--requests 30 --prefix-caching off --max-batch-tokens 7 --block-size 5"}) {
        const Run r = run_kvlab(std::string("serve-sim --json ") + knobs);
        INFO(knobs << "\n" << r.out << r.err);
        REQUIRE(r.exit_code == 0);
        const nlohmann::json j = nlohmann::json::parse(r.out);
        CHECK(j["ok"] == true);
        CHECK(j["check"]["bitwise_equal_alone"] == j["requests"]);
        CHECK(j["generated_tokens"].get<int>() > 0);
    }
    const fs::path trace = scratch() / "requests.jsonl";
    std::ofstream(trace) << "{\"tokens\": [1, 2, 3], \"max_new_tokens\": 4, \"arrival\": 0}\n\n"
                         << "{\"tokens\": [1, 2, 3, 9], \"max_new_tokens\": 2, \"arrival\": 3}\n";
    const Run t = run_kvlab("serve-sim --trace " + trace.string());
    INFO(t.out << t.err);
    CHECK(t.exit_code == 0);
    CHECK_THAT(t.out, Catch::Contains("2 requests") && Catch::Contains("2 of 2 requests bitwise equal"));
}

TEST_CASE("kvlab serve-sim: bad knobs and bad trace lines are one-line errors", "[scheduler][cli]") {
    check_refused("serve-sim --prefix-caching maybe", "on or off");
    check_refused("serve-sim --preemption drop", "recompute or swap");
    check_refused("serve-sim --memory-utilization 0.3", "not one block");
    check_refused("serve-sim --device-memory 12XB", "--device-memory '12XB'");
    check_refused("serve-sim --prompt-len 9-3", "MIN-MAX");
    check_refused("serve-sim --num-blocks 3", "cannot hold one request");
    const fs::path trace = scratch() / "bad.jsonl";
    std::ofstream(trace) << "{\"tokens\": [1], \"max_new_tokens\": 1}\nnot json\n";
    check_refused("serve-sim --trace " + trace.string(), "line 2: not a JSON object");
    std::ofstream(trace, std::ios::trunc) << "{\"tokens\": [1, 99999], \"max_new_tokens\": 1}\n";
    check_refused("serve-sim --trace " + trace.string(), "outside the vocabulary");
}
