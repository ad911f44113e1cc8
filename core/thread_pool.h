// kvlab core: the threads behind the kernels' parallel loops.
//
// Kernels split only independent outputs across threads (NUMERICS.md), so which thread runs an
// item never changes a bit; what matters here is speed on a machine that others share. A loop's
// items are cut into chunks that threads claim as they arrive: the calling thread starts on them
// at once and takes every chunk a descheduled worker has not claimed, so it waits only for a
// chunk already in progress. Workers spin a bounded time for the next loop, then sleep on a futex
// (std::atomic::wait), so an idle or starved worker costs nobody a core. And the pool judges
// itself: where the workers have lately cost the caller more than they saved (another program
// holds the cores, or a loop is too small), loops run on the caller alone for a while, and
// while /proc/loadavg counts more programs running than there are free cores, on (loop_judge.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

namespace kvlab {

// How many threads `--threads auto` runs: the CPUs this process may run on (its affinity mask),
// within its cgroup's CPU quota (cgroup v2 cpu.max or v1 cpu.cfs_quota_us, the tightest of its
// cgroup and their parents, rounded up), at most kMaxAutoThreads: past that a tiny model's
// products have fewer column tiles than threads. Never the machine's core count as such. A
// KVLAB_THREADS of 1..256 in the environment overrides the pick (ctest sets it to the processors
// a test declares); anything else there throws Error.
struct CpuBudget {
    static constexpr int kMaxAutoThreads = 16;
    int affinity = 1;    // CPUs in the affinity mask
    double quota = 0.0;  // CPUs' worth of time the cgroup quota allows; 0: no quota
    int from_env = 0;    // KVLAB_THREADS, when set
    int threads = 1;     // what auto picks
};
CpuBudget usable_cpus();
// One cgroup folder's limit in CPUs (0: none, or nothing readable): v2's cpu.max, else v1's
// cpu.cfs_quota_us over cpu.cfs_period_us. usable_cpus takes the tightest on the way up.
double cgroup_folder_quota(const std::string& dir);

// What the pool has done, for tests and `kvlab bench`: loops run on threads, loops run on the
// caller alone (the pool busy, or threads judged not to pay), stalls: loops whose caller waited
// on a descheduled worker's chunk, and idle rounds: the times a worker numbered at or above the
// posted loop's thread count looked for chunks it may not take.
struct PoolCounters {
    std::uint64_t loops = 0, serial_loops = 0, stalls = 0, idle_rounds = 0;
};
PoolCounters pool_counters();

// body(begin, end, thread) for consecutive ranges covering [0, n) exactly once, on up to
// n_threads threads; thread is 0 for the caller and below n_threads for every call, so a
// kernel indexes its per-thread scratch [n_threads, ...] with it. Runs on the calling thread
// alone when n_threads <= 1, n <= 1, or another loop is using the pool (a nested loop, or a
// second decoder on another thread): the items and their results are the same either way.
// body must not throw.
using RangeFn = void (*)(void* ctx, std::int64_t begin, std::int64_t end, int thread);
void parallel_for(int n_threads, std::int64_t n, RangeFn body, void* ctx);

// For tests: on, every loop given more than one thread goes to the threads, never to the caller
// alone for not having paid off at its site, so that a thread-count bug cannot hide in a loop the
// pool judged too small. Off (the default) the pool judges.
void pool_always_threads(bool on);
// Tests: the pool forgets what it judged (every site and the pool open, no stall seen), as in a
// new process. Call it with no loop running.
void pool_forget();

template <class Body>  // body(std::int64_t item, int thread) for every item in [0, n)
void parallel_for(int n_threads, std::int64_t n, Body&& body) {
    auto range = [](void* ctx, std::int64_t begin, std::int64_t end, int thread) {
        auto& b = *static_cast<std::remove_reference_t<Body>*>(ctx);
        for (std::int64_t i = begin; i < end; i++) b(i, thread);
    };
    parallel_for(n_threads, n, range, const_cast<void*>(static_cast<const void*>(std::addressof(body))));
}

}  // namespace kvlab
