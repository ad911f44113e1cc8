// The continuous-batching scheduler (core/scheduler.h): its budgets and queues, preemption by
// recompute and by swap, prefix hits, and its refusals. Exactness over generated workloads is
// `kvlab verify serve` (tests/test_verify.cpp); here each case also checks every request against
// greedy decode of it alone.
#include <catch2/catch.hpp>

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
