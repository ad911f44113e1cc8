// --threads on serve-sim, beam, pool, trace, golden and view: one thread, three and auto give the
// same tokens, logits and digests (the kernels split only independent outputs, core/NUMERICS.md),
// the JSON names the count asked for, and a count outside 1..256 is refused. The scheduler and beam
// search, whose decoders core makes, are checked to hand their config's count to the kernels.
// These runs use three threads: tests/CMakeLists.txt declares THREADS 3, and auto obeys it.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "beam.h"
#include "cli_util.h"
#include "cpu_backend.h"
#include "scheduler.h"
#include "thread_pool.h"

using nlohmann::json;

namespace {

// The stories260K shape (the default model's, or a random one of it when the file is missing):
// its classifier product is large enough for the kernels to split it across threads.
const std::vector<std::string> kThreads = {"1", "3", ""};  // "": the default, auto

// `kvlab <args> [--threads t] --json`, parsed.
json run_json(const std::string& args, const std::string& threads) {
    const std::string cmd = args + (threads.empty() ? "" : " --threads " + threads) + " --json";
    const Run r = run_kvlab(cmd);
    INFO("kvlab " << cmd << "\nexit " << r.exit_code << "\nstderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    return json::parse(r.out);
}

// What auto picks under this test: KVLAB_THREADS when ctest sets it, else whatever is usable.
void check_auto(const json& j) {
    CHECK(j["threads_choice"]["auto"] == true);
    CHECK(j["threads"] == j["threads_choice"]["picked"]);
    if (const char* env = std::getenv("KVLAB_THREADS")) CHECK(j["threads"] == std::atoi(env));
}

// Runs `args_for(t)` on each of kThreads; `same` picks what must agree bit for bit with one thread.
void check_threads(const std::function<std::string(const std::string&)>& args_for,
                   const std::function<json(const json&)>& same) {
    std::vector<json> runs;
    for (const std::string& t : kThreads) runs.push_back(run_json(args_for(t), t));
    CHECK(runs[0]["threads"] == 1);
    CHECK(runs[1]["threads"] == 3);
    CHECK(runs[1]["threads_choice"]["auto"] == false);
    check_auto(runs[2]);
    const json want = same(runs[0]);
    REQUIRE(!want.is_null());
    for (std::size_t i = 1; i < runs.size(); i++) {
        INFO("--threads '" << kThreads[i] << "'");
        CHECK(same(runs[i]) == want);
    }
    for (const char* bad : {"0", "x"}) check_refused(args_for("bad") + " --threads " + bad, "--threads");
}

json without_threads(json j) {
    j.erase("threads");
    j.erase("threads_choice");
    return j;
}

}  // namespace

TEST_CASE("serve-sim --threads: every count gives the same logits digest, each request exact", "[cli][threads]") {
    const std::string args =
        "serve-sim --requests 6 --prompt-len 4-12 --output-len 3-6 --arrival-rate 2 --num-blocks 4 --block-size 8 "
        "--max-model-len 24";
    check_threads([&](const std::string&) { return args; },
                  [](const json& j) {
                      CHECK(j["ok"] == true);
                      CHECK(j["check"]["bitwise_equal_alone"] == 6);
                      return json{j["logits_sha256"], j["generated_tokens"], j["steps"], j["preemptions"]};
                  });
}

TEST_CASE("beam --threads: every count gives the same beams, each step equal to naive decode", "[cli][threads]") {
    check_threads([](const std::string&) { return std::string("beam --tokens 1,5,9 --width 3 --steps 5"); },
                  [](const json& j) {
                      CHECK(j["beam_steps_bitwise_equal_naive"] == j["beam_steps_checked"]);
                      return json{j["beams"], j["beam_steps_checked"], j["peak_blocks"]};
                  });
}

TEST_CASE("pool --threads: every count gives the same session, each prefill equal to naive decode", "[cli][threads]") {
    const std::string script =
        "pool --block-size 4 --script 'new a 1,2,3,4,5,6,7,8,9; fork a b; append b 10,11,12; new c 1,2,3,4,5; "
        "rollback a 6; append a 40,41; show'";
    check_threads([&](const std::string&) { return script; },
                  [](const json& j) {
                      CHECK(j["summary"]["prefills_bitwise_equal"] == j["summary"]["prefills"]);
                      return without_threads(j);
                  });
}

TEST_CASE("trace --threads: every count writes the same trace, and diff-trace finds them equal", "[cli][threads]") {
    const auto dir = [](const std::string& t) { return (scratch() / ("trace_threads_" + t)).string(); };
    check_threads([&](const std::string& t) { return "trace --steps 6 --attention-weights --out " + dir(t); },
                  [](const json& j) { return j["manifest"]; });  // every array's SHA-256; the threads are not in it
    const Run d = run_kvlab("diff-trace " + dir("1") + " " + dir("3"));
    INFO(d.out << d.err);
    CHECK(d.exit_code == 0);
}

TEST_CASE("golden --check --threads 3 reproduces the golden traces bit for bit, and says so", "[cli][threads]") {
    const Run r = run_kvlab("golden --check " KVLAB_GOLDEN_DIR " --device cpu --threads 3");
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("golden runs reproduced bit for bit (3 threads)") != std::string::npos);
    CHECK(r.out.find("DIFFERS") == std::string::npos);
    check_refused("golden --check " KVLAB_GOLDEN_DIR " --threads 0", "--threads");
}

TEST_CASE("view --threads: every count shows the same tokens and logits, naive equal to cached", "[cli][threads]") {
    if (std::system("command -v Xvfb >/dev/null 2>&1") != 0 && !std::getenv("DISPLAY")) {
        std::printf("SKIPPED: no display and no Xvfb (apt-get install xvfb)\n");
        if (Catch::getCurrentContext().getConfig()->hasTestFilters()) std::exit(77);
        return;
    }
    std::vector<json> states;
    for (const std::string& t : kThreads) {
        const fs::path layout = scratch() / ("view_threads_" + t + ".json");
        const std::string cmd =
            "view --headless --frames 2 --shape n_layers=2,n_heads=4,n_kv_heads=2 --prompt abcd "
            "--steps 6 --step end --layout " +
            layout.string() + (t.empty() ? "" : " --threads " + t);
        const Run r = run_kvlab(cmd);
        INFO("kvlab " << cmd << "\nstderr: " << r.err);
        REQUIRE(r.exit_code == 0);
        states.push_back(json::parse(slurp(layout))["state"]);
    }
    CHECK(states[0]["threads"] == 1);
    CHECK(states[1]["threads"] == 3);
    if (const char* env = std::getenv("KVLAB_THREADS")) CHECK(states[2]["threads"] == std::atoi(env));
    CHECK(states[0]["all_equal"] == true);
    REQUIRE(states[0]["top_cached"].size() == 5);
    for (json& s : states) s.erase("threads");
    CHECK(states[1] == states[0]);
    CHECK(states[2] == states[0]);
    check_refused("view --headless --frames 1 --threads 0", "--threads");
}

// The scheduler's and beam search's decoders are core's own: their configs' n_threads must reach
// the kernels. The pool counts every loop handed more than one thread (run on the workers or, when
// judged not to pay, on the caller), so one thread counts none.
TEST_CASE("the scheduler and beam search run their kernels on their config's threads, with the same bits",
          "[threads]") {
    const kvlab::Model model = kvlab::random_model(kvlab::stories260k_shape(), 5);
    kvlab::CpuBackend backend(model);
    const auto threaded_loops = [](const kvlab::PoolCounters& a, const kvlab::PoolCounters& b) {
        return (b.loops + b.serial_loops) - (a.loops + a.serial_loops);
    };
    const auto serve = [&](int n_threads, std::uint64_t& loops) {
        kvlab::SchedulerConfig sc;
        sc.block_size = 8, sc.n_blocks = 6, sc.max_model_len = 24, sc.n_threads = n_threads;
        kvlab::Scheduler s(backend, model, sc);
        for (int i = 0; i < 3; i++) s.add({{1, 2 + i, 3, 4, 5 + i}, 4, i});
        const kvlab::PoolCounters before = kvlab::pool_counters();
        while (s.step()) {
        }
        loops = threaded_loops(before, kvlab::pool_counters());
        std::vector<float> logits;
        for (int i = 0; i < 3; i++) logits.insert(logits.end(), s.result(i).logits.begin(), s.result(i).logits.end());
        return logits;
    };
    const auto beam = [&](int n_threads, std::uint64_t& loops) {
        kvlab::BeamConfig bc;
        bc.width = 3, bc.steps = 4, bc.block_size = 4, bc.n_threads = n_threads;
        const kvlab::PoolCounters before = kvlab::pool_counters();
        const kvlab::BeamRun run = kvlab::BeamSearch(backend, model, bc).run({1, 7, 9});
        loops = threaded_loops(before, kvlab::pool_counters());
        std::vector<float> logits;
        for (const kvlab::BeamState& b : run.steps.back())
            logits.insert(logits.end(), b.logits.begin(), b.logits.end());
        return logits;
    };
    std::uint64_t one = 0, three = 0;
    const std::vector<float> serve_one = serve(1, one), serve_three = serve(3, three);
    CHECK(one == 0);
    CHECK(three > 0);
    CHECK(serve_one == serve_three);  // bit for bit: == on floats compares every element
    const std::vector<float> beam_one = beam(1, one), beam_three = beam(3, three);
    CHECK(one == 0);
    CHECK(three > 0);
    CHECK(beam_one == beam_three);
    kvlab::SchedulerConfig zero;
    zero.n_blocks = 64, zero.n_threads = 0;
    CHECK_THROWS_WITH(kvlab::Scheduler(backend, model, zero), Catch::Contains("threads"));
    kvlab::BeamConfig no_threads;
    no_threads.n_threads = 0;
    CHECK_THROWS_WITH(kvlab::BeamSearch(backend, model, no_threads), Catch::Contains("threads"));
}
