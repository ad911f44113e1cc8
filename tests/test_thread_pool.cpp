// The pool behind the kernels' parallel loops (core/thread_pool.h): every item runs exactly once,
// on a thread index below the count asked for, whatever the count, the size, nesting, several
// callers at once or a fork; a loop too small to pay for threads goes to the caller alone; and
// --threads auto reads the affinity mask and the cgroup quota. That threads never change a bit
// is P3 (test_decode.cpp) and the kernels' own tests.
#include <rapidcheck/catch.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "config.h"
#include "loop_judge.h"
#include "test_util.h"
#include "thread_pool.h"

using namespace kvlab;
namespace fs = std::filesystem;

namespace {

// What one loop did: how often each item ran, and whether any ran on a thread index outside
// [0, n_threads).
struct Coverage {
    std::vector<std::atomic<int>> runs;
    std::atomic<int> bad_thread{0};
    explicit Coverage(std::int64_t n) : runs(std::size_t(n)) {}
};

// The first item that did not run exactly once, or a bad thread index; nullopt when the loop was right.
std::optional<std::string> coverage_error(const Coverage& c) {
    if (c.bad_thread.load() != 0) return "an item ran on a thread index outside [0, n_threads)";
    for (std::size_t i = 0; i < c.runs.size(); i++)
        if (c.runs[i].load() != 1) return fmt::format("item {} ran {} times", i, c.runs[i].load());
    return std::nullopt;
}

void cover(Coverage& c, int n_threads, std::int64_t n) {
    parallel_for(n_threads, n, [&](std::int64_t i, int thread) {
        c.runs[std::size_t(i)].fetch_add(1);
        if (thread < 0 || thread >= std::max(1, n_threads)) c.bad_thread.store(1);
    });
}

fs::path scratch_folder(const std::string& name) {
    const fs::path dir = fs::temp_directory_path() / fmt::format("kvlab-pool-{}-{}", getpid(), name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

void write(const fs::path& file, const std::string& text) { std::ofstream(file) << text; }

}  // namespace

TEST_CASE("parallel_for runs every item exactly once on a thread index below the count", "[pool]") {
    rc::prop("any thread count and size", [] {
        const int n_threads = *rc::gen::inRange(1, 9);
        const std::int64_t n =
            *rc::gen::oneOf(rc::gen::inRange<std::int64_t>(0, 70), rc::gen::inRange<std::int64_t>(0, 200000));
        Coverage c(n);
        cover(c, n_threads, n);
        const auto error = coverage_error(c);
        RC_ASSERT_FALSE(error.has_value());
    });
}

TEST_CASE("parallel_for counter-test: a loop that drops its last item or runs one twice is caught", "[pool][counter]") {
    Coverage dropped(100), doubled(100);
    parallel_for(2, 99, [&](std::int64_t i, int) { dropped.runs[std::size_t(i)].fetch_add(1); });
    parallel_for(2, 100, [&](std::int64_t i, int) { doubled.runs[std::size_t(i)].fetch_add(i == 50 ? 2 : 1); });
    REQUIRE(coverage_error(dropped) == "item 99 ran 0 times");
    REQUIRE(coverage_error(doubled) == "item 50 ran 2 times");
}

TEST_CASE("a loop inside a loop, and loops from several threads at once, each run every item once", "[pool]") {
    // Nested: the inner loop finds the pool busy and runs on its caller alone. (The outer loop is
    // sent to the threads: had the pool judged its site not worth them, it would run alone
    // without holding the pool, and the inner loops would take it.)
    Coverage outer(64), inner(64 * 50);
    pool_always_threads(true);
    parallel_for(4, 64, [&](std::int64_t i, int) {
        outer.runs[std::size_t(i)].fetch_add(1);
        parallel_for(4, 50, [&](std::int64_t j, int t) {
            inner.runs[std::size_t(i * 50 + j)].fetch_add(1);
            if (t != 0) inner.bad_thread.store(1);  // a loop that found the pool busy runs as thread 0
        });
    });
    pool_always_threads(false);
    CHECK(coverage_error(outer).value_or("") == "");
    CHECK(coverage_error(inner).value_or("") == "");
    // Four callers at once, each with many loops: one holds the pool, the others run alone.
    std::vector<std::unique_ptr<Coverage>> each;
    for (int k = 0; k < 4; k++) each.push_back(std::make_unique<Coverage>(300 * 97));
    std::vector<std::thread> callers;
    for (int k = 0; k < 4; k++)
        callers.emplace_back([&, k] {
            for (int rep = 0; rep < 300; rep++)
                parallel_for(3, 97, [&](std::int64_t i, int t) {
                    each[std::size_t(k)]->runs[std::size_t(rep * 97 + i)].fetch_add(1);
                    if (t < 0 || t >= 3) each[std::size_t(k)]->bad_thread.store(1);
                });
        });
    for (std::thread& t : callers) t.join();
    for (const auto& c : each) CHECK_FALSE(coverage_error(*c).has_value());
}

TEST_CASE("a forked child runs parallel loops with workers of its own", "[pool]") {
    Coverage before(1000);
    cover(before, 4, 1000);  // the parent's workers exist now
    REQUIRE_FALSE(coverage_error(before).has_value());
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        Coverage c(5000);
        for (int rep = 0; rep < 20; rep++) {
            for (auto& r : c.runs) r.store(0);
            cover(c, 4, 5000);
            if (coverage_error(c)) _exit(1);
        }
        _exit(0);
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
}

TEST_CASE("a loop too small to pay for threads soon runs on the caller alone", "[pool]") {
    // Two items that cost nothing: whatever a worker takes, posting the loop and waiting cost more.
    // The pool judges a site over 16 loops, then leaves it to the caller for 64, 128, 256, ...
    auto run = [](int reps) {
        const PoolCounters before = pool_counters();
        std::atomic<int> sum{0};
        for (int rep = 0; rep < reps; rep++)
            parallel_for(2, 2, [&](std::int64_t i, int) { sum.fetch_add(int(i) + 1); });
        REQUIRE(sum.load() == reps * 3);
        return pool_counters().serial_loops - before.serial_loops;
    };
    const std::uint64_t alone = run(400);
    INFO("of 400 loops, " << alone << " ran on the caller alone");
    REQUIRE(alone >= 200);
    // The tests' switch: every loop goes to the threads.
    pool_always_threads(true);
    const std::uint64_t forced = run(400);
    pool_always_threads(false);
    REQUIRE(forced == 0);
}

TEST_CASE("a worker stalled while it holds a chunk soon sends the loops to the caller alone", "[pool]") {
    // As on a machine whose cores are taken: an item takes 20 us, and a chunk on a worker 5 ms
    // more (the OS descheduled it for a time slice). After the first loop that waits on such a
    // chunk, the pool runs the loops alone. Judged only by its window of 16 loops, a site would
    // run 16 first. (A loop lasts longer than a sleeping worker takes to wake on a virtual
    // machine, a millisecond or two, so that the worker does take chunks.)
    const PoolCounters before = pool_counters();
    std::atomic<int> sum{0};
    for (int rep = 0; rep < 60; rep++)
        parallel_for(2, 64, [&](std::int64_t i, int thread) {
            const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
            while (std::chrono::steady_clock::now() < end) {
            }
            if (thread != 0 && i % 4 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
            sum.fetch_add(int(i));
        });
    REQUIRE(sum.load() == 60 * (63 * 64 / 2));
    const std::uint64_t alone = pool_counters().serial_loops - before.serial_loops;
    INFO("of 60 loops, " << alone << " ran on the caller alone; stalls " << pool_counters().stalls - before.stalls);
    REQUIRE(alone >= 52);
}

namespace {

void spin_for(std::chrono::microseconds us) {
    const auto end = std::chrono::steady_clock::now() + us;
    while (std::chrono::steady_clock::now() < end) {
    }
}

// How many chunks (calls of the range body) one loop of n items, each taking item_us, was cut into.
std::int64_t chunks_of(std::int64_t n, int item_us) {
    struct Ctx {
        int item_us;
        std::atomic<std::int64_t> calls{0};
    } ctx{item_us};
    parallel_for(
        2, n,
        [](void* c, std::int64_t begin, std::int64_t end, int) {
            auto& x = *static_cast<Ctx*>(c);
            x.calls.fetch_add(1);
            if (x.item_us > 0)
                for (std::int64_t i = begin; i < end; i++) spin_for(std::chrono::microseconds(x.item_us));
        },
        &ctx);
    return ctx.calls.load();
}

}  // namespace

TEST_CASE("workers above the thread count of the loops now posted park instead of waking for each", "[pool]") {
    // A process that once ran 8 threads and now runs 2 must not have 6 workers spinning on its
    // cores (they took the CPU from the worker holding a chunk: stalls) or waking for every loop.
    pool_always_threads(true);
    std::atomic<std::int64_t> sum{0};
    for (int rep = 0; rep < 20; rep++)  // starts 7 workers, and gives them time to start
        parallel_for(8, 800, [&](std::int64_t i, int) {
            spin_for(std::chrono::microseconds(1));
            sum.fetch_add(i);
        });
    const PoolCounters before = pool_counters();
    for (int rep = 0; rep < 1000; rep++)
        parallel_for(2, 64, [&](std::int64_t i, int) {
            spin_for(std::chrono::microseconds(1));
            sum.fetch_add(i);
        });
    const std::uint64_t rounds = pool_counters().idle_rounds - before.idle_rounds;
    pool_always_threads(false);
    REQUIRE(sum.load() == 20 * (800 * 799 / 2) + 1000 * (64 * 63 / 2));
    INFO(rounds << " rounds of workers 2..7 in 1000 loops of 2 threads");
    CHECK(rounds <= 12);  // each may look once or twice before it parks
}

TEST_CASE("a long loop is cut into chunks of about 10 us, a short one into eight a thread", "[pool]") {
    // A worker that takes the last chunk of a long loop keeps the caller waiting up to that chunk's
    // time: the classifier's product (1000 tiles of about 1.3 us) would wait tens of microseconds.
    // Once the pool knows a site's time per item, it sizes chunks by time.
    pool_always_threads(true);
    pool_forget();
    for (int rep = 0; rep < 3; rep++) chunks_of(400, 2);  // the site learns its time per item
    const std::int64_t costly = chunks_of(400, 2);        // 800 us: 80 chunks at 10 us
    for (int rep = 0; rep < 3; rep++) chunks_of(4000, 0);
    const std::int64_t cheap = chunks_of(4000, 0);  // next to nothing: 16 chunks
    pool_always_threads(false);
    INFO("400 items of 2 us: " << costly << " chunks; 4000 of none: " << cheap);
    CHECK(costly >= 40);
    CHECK(costly <= 400);
    CHECK(cheap == 16);
}

namespace {

// How many loops in a row the judge now sends to the caller alone at `site` (at most `limit`).
int alone_run(LoopJudge& judge, LoopJudge::Site& site, int limit = 1 << 20) {
    int n = 0;
    while (n < limit && judge.alone(site, 2)) n++;
    return n;
}

// A loop of 64 items whose worker's half paid: 32 us saved for 2 us of posting and waiting.
constexpr LoopCost kPaid{32, 32e3, 32, 2e3};
// A loop whose caller waited 1 ms on a worker's chunk: a stall.
constexpr LoopCost kStall{32, 32e3, 32, 1e6};

}  // namespace

TEST_CASE(
    "the judge: a stall after 100 ms of threaded loops without one costs 128 loops alone, a sooner one the "
    "pool's long backoff",
    "[pool][judge]") {
    // Both outcomes are asserted over generated histories: a judge that took every stall as
    // isolated fails the sooner ones, and one that took none as isolated fails the later ones.
    rc::prop("threaded time between two stalls decides", [] {
        LoopJudge judge;
        LoopJudge::Site& site = judge.site(&judge, 64);
        RC_ASSERT(judge.judge(site, kStall, 2));                            // a new process: isolated
        RC_ASSERT(alone_run(judge, site) == 2 * LoopJudge::kFirstBackoff);  // the pool's 64, then the site's
        const int loop_us = *rc::gen::inRange(20, 2000);
        const int loops = *rc::gen::inRange(1, 250'000 / loop_us);  // up to 250 ms of threaded loops
        const LoopCost paid{kPaid.caller_items, loop_us * 1e3 - kPaid.overhead_ns, kPaid.worker_items,
                            kPaid.overhead_ns};
        for (int i = 0; i < loops; i++) {
            RC_ASSERT(!judge.alone(site, 2));  // workers that pay keep the loops
            RC_ASSERT(!judge.judge(site, paid, 2));
        }
        RC_ASSERT(judge.judge(site, kStall, 2));
        const int alone = alone_run(judge, site);
        RC_LOG() << loops << " loops of " << loop_us << " us, then " << alone << " alone";
        if (double(loops) * loop_us * 1e3 >= LoopJudge::kIsolatedNs)
            RC_ASSERT(alone == 2 * LoopJudge::kFirstBackoff);
        else
            RC_ASSERT(alone >= LoopJudge::kAllFirstBackoff);
    });
}

TEST_CASE(
    "the judge: a site whose workers cost more than they save runs alone for 64, then 128, 256 and 512 loops, and one "
    "that pays "
    "never does",
    "[pool][judge]") {
    LoopJudge judge;
    LoopJudge::Site& small = judge.site(&judge, 2);
    const LoopCost costly{1, 1, 1, 3e3};  // two items: 1 ns saved, 3 us spent posting and waiting
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < LoopJudge::kWindow; i++) {
            REQUIRE_FALSE(judge.alone(small, 2));
            judge.judge(small, costly, 2);
        }
        const int alone = alone_run(judge, small);
        INFO("round " << round << ": " << alone << " alone");
        CHECK(alone >= LoopJudge::kFirstBackoff << round);  // the site's backoff doubles (the pool's adds on)
    }
    LoopJudge fresh;
    LoopJudge::Site& paying = fresh.site(&fresh, 64);
    for (int i = 0; i < 10 * LoopJudge::kAllWindow; i++) {
        REQUIRE_FALSE(fresh.alone(paying, 2));
        fresh.judge(paying, kPaid, 2);
    }
}

namespace {
bool fake_cores_taken = false;
}  // namespace

TEST_CASE(
    "the judge: after a loss the pool stays alone while other programs keep the cores busy and tries threads "
    "once they stop",
    "[pool][judge]") {
    for (const bool asks : {true, false}) {
        fake_cores_taken = false;
        LoopJudge judge;
        if (asks) judge.cores_taken = [](int) { return fake_cores_taken; };
        LoopJudge::Site& site = judge.site(&judge, 64);
        CHECK_FALSE(judge.alone(site, 2));  // the cores are free at the start
        judge.judge(site, kStall, 2);       // isolated: 128 alone
        CHECK(alone_run(judge, site) == 2 * LoopJudge::kFirstBackoff);
        fake_cores_taken = true;
        judge.judge(site, kStall, 2);  // a second one soon after: the pool's stretch, 1024 loops
        // Asked, the judge runs alone on, 1024 loops at a time, for as long as the cores are taken;
        // never asked, it tries threads after its stretch (and the site's): the counter-case.
        const int alone = alone_run(judge, site, 20'000);
        INFO((asks ? "asking" : "not asking") << ": " << alone << " alone");
        CHECK(alone == (asks ? 20'000 : LoopJudge::kAllFirstBackoff + LoopJudge::kFirstBackoff));
        fake_cores_taken = false;
        if (asks) CHECK(alone_run(judge, site) <= LoopJudge::kAllFirstBackoff + LoopJudge::kFirstBackoff);
        CHECK_FALSE(judge.alone(site, 2));  // the cores are free: threads again
    }
}

TEST_CASE(
    "the judge: a process started beside busy programs starts alone, and a stall while they run is no "
    "isolated one",
    "[pool][judge]") {
    fake_cores_taken = true;
    LoopJudge started;
    started.cores_taken = [](int) { return fake_cores_taken; };
    LoopJudge::Site& site = started.site(&started, 64);
    CHECK(alone_run(started, site, 5000) == 5000);
    fake_cores_taken = false;
    CHECK(alone_run(started, site) <= LoopJudge::kAllFirstBackoff);
    CHECK_FALSE(started.alone(site, 2));

    LoopJudge later;
    later.cores_taken = [](int) { return fake_cores_taken; };
    LoopJudge::Site& s = later.site(&later, 64);
    CHECK_FALSE(later.alone(s, 2));
    fake_cores_taken = true;
    later.judge(s, kStall, 2);  // a first stall, isolated were the cores free
    CHECK(alone_run(later, s, 5000) == 5000);
    fake_cores_taken = false;
}

TEST_CASE("threads auto counts the affinity mask, not the machine", "[pool][auto]") {
    unsetenv("KVLAB_THREADS");  // ctest sets it; here the mask decides
    const CpuBudget all = usable_cpus();
    REQUIRE(all.affinity >= 1);
    REQUIRE(all.threads >= 1);
    REQUIRE(all.threads <= std::min(all.affinity, CpuBudget::kMaxAutoThreads));
    // A thread pinned to one CPU sees a mask of one, and auto picks one thread.
    std::optional<CpuBudget> pinned;
    std::thread([&] {
        cpu_set_t one;
        CPU_ZERO(&one);
        cpu_set_t mine;
        REQUIRE(sched_getaffinity(0, sizeof mine, &mine) == 0);
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
            if (CPU_ISSET(cpu, &mine)) {
                CPU_SET(cpu, &one);
                break;
            }
        if (sched_setaffinity(0, sizeof one, &one) == 0) pinned = usable_cpus();
    }).join();
    REQUIRE(pinned.has_value());
    CHECK(pinned->affinity == 1);
    CHECK(pinned->threads == 1);
}

TEST_CASE("KVLAB_THREADS overrides the pick with a count 1..256 and refuses anything else", "[pool][auto]") {
    setenv("KVLAB_THREADS", "3", 1);
    CHECK(usable_cpus().threads == 3);
    CHECK(usable_cpus().from_env == 3);
    for (const char* bad : {"0", "257", "x", "2 ", "", "-1", "99999999999"}) {
        setenv("KVLAB_THREADS", bad, 1);
        INFO("KVLAB_THREADS=" << bad);
        CHECK_THROWS_AS(usable_cpus(), kvlab::Error);
    }
    unsetenv("KVLAB_THREADS");
    CHECK(usable_cpus().from_env == 0);
}

TEST_CASE("cgroup quotas: v2 cpu.max and v1 cfs files in CPUs, none for max, -1 or garbage", "[pool][auto]") {
    const fs::path v2 = scratch_folder("v2"), v1 = scratch_folder("v1"), bad = scratch_folder("bad");
    write(v2 / "cpu.max", "150000 100000\n");
    CHECK(cgroup_folder_quota(v2.string()) == 1.5);
    write(v2 / "cpu.max", "max 100000\n");
    CHECK(cgroup_folder_quota(v2.string()) == 0.0);
    write(v1 / "cpu.cfs_quota_us", "250000\n");
    write(v1 / "cpu.cfs_period_us", "100000\n");
    CHECK(cgroup_folder_quota(v1.string()) == 2.5);
    write(v1 / "cpu.cfs_quota_us", "-1\n");
    CHECK(cgroup_folder_quota(v1.string()) == 0.0);
    for (const char* text : {"12x 100000", "nan 100000", "100000 0", "100000 -5", "", "inf 1"}) {
        write(bad / "cpu.max", text);
        INFO(text);
        CHECK(cgroup_folder_quota(bad.string()) == 0.0);
    }
    CHECK(cgroup_folder_quota((bad / "missing").string()) == 0.0);
    for (const fs::path& dir : {v2, v1, bad}) fs::remove_all(dir);
}
