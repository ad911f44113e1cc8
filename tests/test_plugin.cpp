// Caches kvlab did not write: C plugins' bookkeeping (include/kvlab/cache_plugin.h) under the
// exact property, in process (verify_plugin) and from the command line, where a plugin that
// crashes, hangs, refuses, answers out of range or breaks a rule of the ABI gets a verdict
// naming the call, and kvlab never crashes.
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <string>
#include <tuple>

#include "cli_util.h"
#include "decode.h"
#include "model.h"
#include "plugin_cache.h"
#include "plugin_replay.h"
#include "test_util.h"
#include "verify.h"

using namespace kvlab;

namespace {

// dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq
const Config kConfig{16, 8, 2, 4, 2, 32, 12};

std::string plugin_path(const std::string& name) { return std::string(KVLAB_PLUGIN_DIR) + "/libkvlab_" + name + ".so"; }

VerifyRow verify_named(const std::string& name, std::uint64_t seed = 1, const std::string& profile = "fast",
                       int cases = 100) {
    VerifyOptions o;
    o.seed = seed;
    o.profile = profile;
    o.cases = cases;
    return verify_plugin(plugin_path(name), o);
}

}  // namespace

TEST_CASE("cache plugins: free_list and block_manager are exact over pools, forks, batches and rollbacks", "[plugin]") {
    for (const char* name : {"free_list", "block_manager", "block_manager_dedup"}) {
        const VerifyRow r = verify_named(name);
        INFO(name << ": " << r.counterexample);
        CHECK(r.ok);
        CHECK(r.cases == 100);
        CHECK(r.name == std::string("plugin ") + name);
        CHECK_THAT(r.parameters, Catch::Contains("forks") && Catch::Contains("speculative"));
    }
    CHECK_THAT(verify_named("block_manager").parameters, Catch::Contains("prefix reuse"));
}

TEST_CASE("block_manager: a second request with the same prompt maps the first's blocks, bit for bit", "[plugin]") {
    const Config c = kConfig;
    const Model m = random_model(c, 7);
    const CachePlugin plugin(plugin_path("block_manager"));
    PluginPool pool(c, plugin, host_memory(), 0, 2, 2);
    PluginCache a(pool, 0), b(pool, 1);
    CachedDecoder da(m, a), db(m, b);
    NaiveDecoder naive(m);
    const std::vector<int> prompt = {1, 2, 3, 4, 5, 6, 7};
    const std::vector<float> first = da.extend(prompt);
    CHECK(da.prefix_hit() == 0);
    const std::vector<float> second = db.extend(prompt);
    CHECK(db.prefix_hit() == 6);  // three full blocks of 2; the last token always runs
    CHECK(first == second);
    CHECK(second == naive.forward(prompt));
    CHECK(pool.bookkeeping_bytes() > 0);
}

TEST_CASE("cache plugin counter-tests: each planted bookkeeping bug is caught, shrunk, naming the call",
          "[plugin][counter]") {
    // Across seeds, so that each catch is the property's and not one lucky draw's.
    for (std::uint64_t seed : {1, 2, 3}) {
        const VerifyRow off = verify_named("free_list_off_by_one", seed);
        INFO(off.counterexample);
        CHECK_FALSE(off.ok);
        CHECK_THAT(off.counterexample, Catch::Contains("rolls back to") && Catch::Contains("which is still held") &&
                                           Catch::Contains("reserve(length="));
        CHECK(off.counterexample_T > 0);  // the case's longest sequence, first in the counterexample
        CHECK(off.counterexample_sequences > 0);
        const VerifyRow no_cow = verify_named("block_manager_no_cow", seed);
        INFO(no_cow.counterexample);
        CHECK_FALSE(no_cow.ok);
        CHECK_THAT(no_cow.counterexample,
                   Catch::Contains("fork of sequence") && Catch::Contains("which is still held"));
        const VerifyRow unchained = verify_named("block_manager_unchained", seed);
        INFO(unchained.counterexample);
        CHECK_FALSE(unchained.ok);
        CHECK_THAT(unchained.counterexample, Catch::Contains("attach_prefix(n="));
    }
}

TEST_CASE("cache plugins that break one rule of the ABI each get a verdict naming it", "[plugin][counter]") {
    const std::vector<std::pair<std::string, std::string>> verdicts = {
        {"hostile_range", "slot(pos=2) returned"},
        {"hostile_refuse", "reserve(length=0, n=1) refused: no room"},
        {"hostile_v2_move", "still held"},  // position 0's slot, moved onto a later position's
        {"hostile_v2_copy", "asked for a copy of slots"},
        {"hostile_v2_fork", "fork(): the child's slot(pos=0)"},
        {"hostile_v2_window", "without position 0: an exact cache attends all of"},
        {"hostile_v2_prefix", "which holds no rows"},
    };
    for (const auto& [name, verdict] : verdicts) {
        const VerifyRow r = verify_named(name);
        INFO(name << ": " << r.counterexample);
        CHECK_FALSE(r.ok);
        CHECK_THAT(r.counterexample, Catch::Contains(verdict));
    }
}

TEST_CASE("cache plugin ABI version 1 is still read: one sequence per pool", "[plugin]") {
    const CachePlugin v1(plugin_path("hostile_range"));
    CHECK(v1.abi_version() == 1);
    CHECK_FALSE(v1.can_fork());
    const Config c = kConfig;
    PluginPool pool(c, v1);
    PluginCache first(pool, 0);
    CHECK_THROWS_WITH(PluginCache(pool, 1), Catch::Contains("one sequence per pool"));
    CHECK(CachePlugin(plugin_path("free_list")).abi_version() == 2);  // version 2 too
    CHECK(CachePlugin(plugin_path("block_manager")).abi_version() == 3);
}

// Version 3's declarations (cache_plugin.h): what a plugin does not do is never drawn, and the
// report says what was left out; everything else is still checked.
TEST_CASE(
    "block_manager_whole: a nano-vllm-style manager that frees only whole sequences and takes block size 16 "
    "is checked with no rollback code",
    "[plugin]") {
    const CachePlugin plugin(plugin_path("block_manager_whole"));
    CHECK_FALSE(plugin.releases_part());
    CHECK(plugin.block_sizes() == std::vector<int>{16});
    CHECK(plugin.max_sequences() == 32);
    for (std::uint64_t seed : {test::run_seed(), std::uint64_t{2}}) {
        const VerifyRow r = verify_named("block_manager_whole", seed);
        INFO("seed " << seed << ": " << r.counterexample << "\n" << r.figures);
        CHECK(r.ok);
        CHECK_THAT(r.parameters, Catch::Contains("block sizes 16 (the plugin's)") &&
                                     Catch::Contains("left out: forks (no fork), rollbacks and speculative decoding "
                                                     "(release is NULL") &&
                                     Catch::Contains("preemption and recompute"));
        // Preemption stands in for rollback: some cases preempt (and recompute) sequences.
        const std::size_t at = r.figures.find("; ");
        REQUIRE(at != std::string::npos);
        CHECK_THAT(r.figures, !Catch::Contains("; 0 preemptions"));
    }
}

TEST_CASE("plugin pools: a block size or a sequence count the plugin does not accept is refused in one line",
          "[plugin]") {
    const CachePlugin whole(plugin_path("block_manager_whole"));
    CHECK_THROWS_WITH(PluginPool(kConfig, whole, host_memory(), 64, 2, 8),
                      Catch::Contains("block size 8") && Catch::Contains("(16)"));
    CHECK_THROWS_WITH(PluginPool(kConfig, whole, host_memory(), 64 * 16, 33, 16), Catch::Contains("33 sequences"));
    PluginPool fine(kConfig, whole, host_memory(), 64, 32, 16);
    CHECK(fine.block_size() == 16);
    // A table whose declarations are out of range does not load.
    kvlab_cache_plugin_abi3 t = whole.table();
    const std::int32_t zero[] = {0};
    t.block_sizes = zero;
    const auto make = [&](const kvlab_cache_config& c, char* err, std::size_t n) {
        return whole.create_pool(c, err, n);
    };
    CHECK_THROWS_WITH(CachePlugin("zero", t, make), Catch::Contains("block_sizes[0] is 0, not in 1..1024"));
    t.block_sizes = nullptr;
    CHECK_THROWS_WITH(CachePlugin("null", t, make), Catch::Contains("n_block_sizes is 1 with block_sizes NULL"));
    t.n_block_sizes = 0;
    t.max_sequences = -1;
    CHECK_THROWS_WITH(CachePlugin("negative", t, make), Catch::Contains("max_sequences is -1"));
}

TEST_CASE(
    "a plugin without release: a refused batched step leaves the sequence it rolled back stale, "
    "to be destroyed",
    "[plugin]") {
    const Config c = kConfig;
    const Model m = random_model(c, 3);
    const CachePlugin whole(plugin_path("block_manager_whole"));
    PluginPool pool(c, whole, host_memory(), 16, 2, 16);  // one block: room for one sequence
    auto a = std::make_unique<PluginCache>(pool, 0);
    auto b = std::make_unique<PluginCache>(pool, 1);
    CachedDecoder decoder(m, *a);
    std::vector<Cache*> caches{a.get(), b.get()};
    const std::vector<std::vector<int>> rows{{1, 2}, {3}};
    CHECK_THROWS_AS(decoder.step(caches, rows), PoolFull);
    CHECK(a->stale());
    CHECK_FALSE(b->stale());
    CHECK(a->length() == 0);
    CHECK_THROWS_WITH(a->append(std::vector<int>{4}), Catch::Contains("may only be destroyed"));
    a.reset();  // the plugin frees it whole: the pool's one block is free again
    CHECK(pool.blocks_in_use() == 0);
    CachedDecoder db(m, *b);
    CHECK(db.extend(std::vector<int>{3}) == NaiveDecoder(m).forward(std::vector<int>{3}));
}

TEST_CASE("step_done's deduplicating moves: accepted onto identical rows, caught onto rows of another prefix",
          "[plugin][counter]") {
    for (std::uint64_t seed : {test::run_seed(), std::uint64_t{1}, std::uint64_t{2}}) {
        const VerifyRow clean = verify_named("block_manager_dedup", seed);
        INFO("seed " << seed << ": " << clean.counterexample << "\n" << clean.figures);
        CHECK(clean.ok);
        CHECK_THAT(clean.figures, !Catch::Contains(" 0 positions moved by step_done"));
        const VerifyRow bug = verify_named("block_manager_dedup_tokens", seed);
        INFO(bug.counterexample);
        CHECK_FALSE(bug.ok);
        CHECK_THAT(bug.counterexample,
                   Catch::Contains("step_done() moved positions") && Catch::Contains("not this sequence's position"));
    }
}

TEST_CASE("cache plugin: a file that is not a plugin is refused in one line", "[plugin]") {
    CHECK_THROWS_WITH(CachePlugin(plugin_path("no_such_plugin")), Catch::Contains("does not load"));
    CHECK_THROWS_WITH(CachePlugin(std::string(KVLAB_BINARY)), Catch::Contains("does not load"));
    check_refused("verify --plugin " + plugin_path("no_such_plugin"), "does not load");
    check_refused("verify exact --plugin " + plugin_path("free_list"), "excludes --plugin");
}

TEST_CASE("kvlab verify --plugin: exact passes, a planted bug fails, and a crash or a hang is a verdict",
          "[plugin][cli]") {
    const Run good = run_kvlab("verify --plugin " + plugin_path("block_manager"));
    CHECK(good.exit_code == 0);
    CHECK_THAT(good.out, Catch::Contains("plugin block_manager") && Catch::Contains("bitwise equal"));
    const Run bug = run_kvlab("verify --plugin " + plugin_path("free_list_off_by_one") + " --json --replay-log " +
                              (scratch() / "off_by_one.jsonl").string());
    CHECK(bug.exit_code == 1);
    CHECK_THAT(bug.out, Catch::Contains("\"ok\": false") && Catch::Contains("which is still held"));
    // The child dies of the plugin's own null read (or, under AddressSanitizer, is ended by it):
    // kvlab reports it with the step it was on and exits 1.
    const std::string log = (scratch() / "crash.jsonl").string(), hung_log = (scratch() / "hang.jsonl").string();
    const Run crash = run_kvlab("verify --plugin " + plugin_path("hostile_crash") + " --replay-log " + log);
    INFO(crash.out << crash.err);
    CHECK(!crash.signaled);
    CHECK(crash.exit_code == 1);
    CHECK_THAT(crash.out, Catch::Contains("CRASHED") && Catch::Contains("the last step: plugin hostile"));
    // The call it died in: hostile_crash reads through a null pointer in slot() of position 3.
    CHECK_THAT(crash.out, Catch::Contains("inside the plugin's slot(pos=3) of sequence"));
    // The case's calls up to that one are its replay log, and replayed they die in the same call.
    CHECK_THAT(crash.out, Catch::Contains("the failing case's calls: " + log));
    const std::string text = slurp(log);
    CHECK_THAT(text, Catch::StartsWith("{\"block_size\"") && Catch::Contains("\"call\":\"reserve\"") &&
                         Catch::Contains("inside the plugin's slot(pos=3) of sequence"));
    const Run again = run_kvlab("replay " + log + " --plugin " + plugin_path("hostile_crash"));
    INFO(again.out << again.err);
    CHECK(again.exit_code == 1);
    CHECK_THAT(again.out, Catch::Contains("inside the plugin's slot(pos=3) of sequence") &&
                              Catch::Contains("before its first step; the log's verdict: "));
    const Run hang =
        run_kvlab("verify --plugin " + plugin_path("hostile_hang") + " --plugin-timeout 2 --replay-log " + hung_log);
    CHECK(hang.exit_code == 1);
    CHECK_THAT(hang.out,
               Catch::Contains("HUNG") && Catch::Contains("no answer in 2 s inside the plugin's slot(pos=2)"));
    CHECK_THAT(slurp(hung_log), Catch::Contains("\"verdict\":\"no answer in 2 s"));
}

TEST_CASE("kvlab verify --plugin-stdio: a server that does not answer ends the run in one line", "[plugin][cli]") {
    check_refused("verify --plugin-stdio", "closed the pipe instead of answering hello");
    check_refused("verify --plugin-stdio --plugin " + plugin_path("free_list"), "excludes");
}

// Bugs that show only at a size (plugins/threshold.c): the fast profile reaches positions 97 and
// 257, block 21 of a sequence, block ids past 256, slot ids past 1024 and pools 7/8 full; each is
// caught with a counterexample of that size, across seeds (each run draws its own, printed). The
// rarest, slot 1024, took 10 cases on average and at most 57 over 100 seeds: 300 cases leave a
// miss about one run in 10^13.
TEST_CASE("cache plugins: bugs planted at the sizes where caches break are caught in the fast profile",
          "[plugin][counter][sizes]") {
    const std::uint64_t seed = test::run_seed();
    const std::vector<std::tuple<std::string, std::string, int>> bugs = {
        // plugin, what its verdict names, the least T its counterexample can have
        {"threshold_pos_97", "slot(pos=97)", 98},
        {"threshold_pos_257", "slot(pos=257)", 258},
        {"threshold_block_21", "which is still held", 0},
        {"threshold_block_id_256", "which is still held", 0},
        {"threshold_slot_1024", "which is still held", 0},
        {"threshold_full_7_8", "which is still held", 0},
        {"threshold_leak", "blocks of", 0},
    };
    for (const auto& [name, verdict, least_T] : bugs) {
        const VerifyRow r = verify_named(name, seed, "fast", 300);
        INFO(name << " (seed " << seed << "): " << r.counterexample);
        CHECK_FALSE(r.ok);
        CHECK_THAT(r.counterexample, Catch::Contains(verdict) && Catch::StartsWith("plugin " + name + " (T = "));
        CHECK(r.counterexample_T >= least_T);
    }
}

TEST_CASE("cache plugins: the fast profile's report shows the sizes reached and full pools refused, not failed",
          "[plugin][sizes]") {
    const std::uint64_t seed = test::run_seed();
    for (const char* name : {"threshold_clean", "free_list", "block_manager"}) {
        const VerifyRow r = verify_named(name, seed);
        INFO(name << " (seed " << seed << "): " << r.counterexample << "\n" << r.figures);
        CHECK(r.ok);
        // Each mark is reached by some cases, and pools are filled to a refusal in some.
        for (const char* mark : {"position >= 97 held in ", ">= 257 in ", "or more, "}) {
            const std::size_t at = r.figures.find(mark);
            REQUIRE(at != std::string::npos);
            CHECK(std::atoi(r.figures.c_str() + at + std::strlen(mark)) > 0);
        }
        CHECK_THAT(r.figures, Catch::Contains("pool fill 100%"));
    }
}

// The long profile: position 4097 (a thin model, a pool filled in seconds), out of the fast
// profile's reach.
// (Named "verify --profile long ..." so that CI's sanitized run leaves it to the Release one.)
TEST_CASE("verify --profile long --plugin: a bug at position 4097 is caught, and the exact plugins pass",
          "[plugin][counter][sizes][long]") {
    const std::uint64_t seed = test::run_seed();
    // About one long case in ten holds position 4097 (an eighth of thin models run to 8192, and
    // most of the others stay shorter, as naive decode costs T^2): 100 cases miss it about once in
    // 40000 runs, and a run ends at its first failure.
    const VerifyRow bug = verify_named("threshold_pos_4097", seed, "long", 100);
    INFO("seed " << seed << ": " << bug.counterexample);
    CHECK_FALSE(bug.ok);
    CHECK_THAT(bug.counterexample, Catch::Contains("slot(pos=4097)"));
    CHECK(bug.counterexample_T >= 4098);
    for (const char* name : {"threshold_clean", "block_manager"}) {
        const VerifyRow r = verify_named(name, seed, "long", 5);
        INFO(name << ": " << r.counterexample << "\n" << r.figures);
        CHECK(r.ok);
        CHECK_THAT(r.parameters, Catch::Contains("position 8191"));
    }
}

// A failing case's calls as a log (proofs/plugin_replay.h) that runs again against the plugin
// alone: the same verdict on the plugin that failed, none on a fixed one (whose first differing
// answer is named), from the command line and in process.
TEST_CASE("kvlab replay: a counterexample's call log replays to the same verdict, and a fixed plugin passes it",
          "[plugin][cli][replay]") {
    const fs::path log = scratch() / "dedup_tokens.jsonl";
    const Run bug =
        run_kvlab("verify --plugin " + plugin_path("block_manager_dedup_tokens") + " --replay-log " + log.string());
    INFO(bug.out << bug.err);
    CHECK(bug.exit_code == 1);
    CHECK_THAT(bug.out, Catch::Contains("kvlab replay " + log.string() + " --plugin"));
    REQUIRE(fs::exists(log));
    const Run again = run_kvlab("replay " + log.string() + " --plugin " + plugin_path("block_manager_dedup_tokens"));
    INFO(again.out << again.err);
    CHECK(again.exit_code == 1);
    CHECK_THAT(again.out, Catch::Contains("ended in a verdict: plugin block_manager_dedup_tokens") &&
                              Catch::Contains("step_done() moved positions") && Catch::Contains("(the log's verdict)"));
    const Run fixed = run_kvlab("replay " + log.string() + " --plugin " + plugin_path("block_manager_dedup"));
    INFO(fixed.out << fixed.err);
    CHECK(fixed.exit_code == 0);
    CHECK_THAT(fixed.out, Catch::Contains("every answer passes kvlab's books") &&
                              Catch::Contains("the first answer that differs from the log's") &&
                              Catch::Contains("\"call\":\"step_done\""));
    // In process, on other planted bugs and seeds: each failing row's log replays to its verdict.
    for (const char* name : {"free_list_off_by_one", "block_manager_unchained", "threshold_pos_97", "threshold_leak"}) {
        const VerifyRow r = verify_named(name, test::run_seed(), "fast", 300);
        INFO(name << ": " << r.counterexample);
        REQUIRE_FALSE(r.ok);
        const CachePlugin plugin(plugin_path(name));
        const ReplayOutcome o = replay_plugin_log(plugin, r.replay_log);
        INFO(replay_report(o));
        CHECK(o.same());
        CHECK_FALSE(o.verdict.empty());
        CHECK(o.divergence.empty());
        CHECK_THAT(r.counterexample, Catch::Contains(o.verdict));
    }
}

TEST_CASE("kvlab replay: a file that is not a replay log, or a hang, ends in one line", "[plugin][cli][replay]") {
    const auto write = [](const std::string& name, const std::string& text) {
        const fs::path p = scratch() / name;
        std::ofstream(p) << text;
        return p.string();
    };
    const std::string header =
        R"({"kvlab_replay": 1, "plugin": "x", "config": {"dim": 4, "hidden_dim": 2, "n_layers": 1, "n_heads": 1, )"
        R"("n_kv_heads": 1, "vocab_size": 8, "max_seq": 6}, "n_slots": 6, "max_sequences": 1, "block_size": 1})"
        "\n";
    const std::string free_list = plugin_path("free_list");
    check_refused("replay " + write("not.jsonl", "hello\n") + " --plugin " + free_list, "line 1: not a JSON object");
    check_refused(
        "replay " + write("no_header.jsonl", "{\"call\": \"create\", \"seq\": 0}\n") + " --plugin " + free_list,
        "not a kvlab replay log's header");
    check_refused("replay " + write("never.jsonl", header + "{\"call\": \"reserve\", \"seq\": 3, \"tokens\": [1]}\n") +
                      " --plugin " + free_list,
                  "line 2: sequence 3 was never created");
    check_refused("replay " +
                      write("token.jsonl", header + "{\"call\": \"create\", \"seq\": 0}\n" +
                                               "{\"call\": \"reserve\", \"seq\": 0, \"tokens\": [9]}\n") +
                      " --plugin " + free_list,
                  "line 3: a token is not an integer in [0, 8)");
    check_refused("replay " +
                      write("far.jsonl", header + "{\"call\": \"create\", \"seq\": 0}\n" +
                                             "{\"call\": \"read\", \"seq\": 0, \"from\": 0, \"to\": 2}\n") +
                      " --plugin " + free_list,
                  "position 2 of sequence 0, which holds 0");
    // A field of another type (fuzz_replay_log found "call": 1) is the log's error, not a library's.
    check_refused("replay " + write("call.jsonl", header + "{\"call\": 1, \"seq\": 0}\n") + " --plugin " + free_list,
                  "line 2: no call \"\"");
    check_refused("replay " + write("x.jsonl", header) + " --plugin " + free_list + " --plugin-stdio", "excludes");
    // hostile_hang spins in slot(pos=2): the replay is a verdict, in one line, after the timeout.
    const std::string hang_log =
        write("hang.jsonl", header + "{\"call\": \"create\", \"seq\": 0}\n" +
                                "{\"call\": \"reserve\", \"seq\": 0, \"tokens\": [1, 2, 3]}\n");
    const Run hang =
        run_kvlab("replay " + hang_log + " --plugin " + plugin_path("hostile_hang") + " --plugin-timeout 2");
    CHECK(hang.exit_code == 1);
    CHECK_THAT(hang.out, Catch::Contains("no answer in 2 s inside the plugin's slot(pos=2)"));
}

TEST_CASE(
    "verify --plugin: --block-sizes, --max-sequences and --time-limit bound a plugin's check, and a bad one is "
    "one line",
    "[plugin][cli]") {
    const Run r = run_kvlab("verify --plugin " + plugin_path("block_manager") +
                            " --block-sizes 3,5 --max-sequences 2 --cases 30 --json");
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("1-2 sequences (--max-sequences), block sizes 3, 5 (--block-sizes)"));
    // Only the sizes the plugin accepts are drawn; none at all is refused.
    CHECK_THAT(run_kvlab("verify --plugin " + plugin_path("block_manager_whole") + " --block-sizes 8,16 --cases 5").out,
               Catch::Contains("block sizes 16 (--block-sizes)"));
    check_refused("verify --plugin " + plugin_path("block_manager_whole") + " --block-sizes 8",
                  "--block-sizes 8: plugin block_manager_whole accepts none of them (it takes 16)");
    check_refused("verify --plugin " + plugin_path("free_list") + " --block-sizes 2,x", "--block-sizes");
    check_refused("verify paged --max-sequences 3", "for a plugin's check (--plugin or --plugin-stdio)");
    // The time limit ends the run between rounds of 10 cases, and says so.
    const Run timed = run_kvlab("verify --plugin " + plugin_path("free_list") + " --cases 100000 --time-limit 0.001");
    INFO(timed.out << timed.err);
    CHECK(timed.exit_code == 0);
    CHECK_THAT(timed.out, Catch::Contains("the time limit (0.001 s) ended the run after 10 of 100000 cases"));
}
