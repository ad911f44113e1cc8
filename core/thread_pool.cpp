#include "thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cassert>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "config.h"
#include "loop_judge.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvlab {

namespace {

int affinity_cpus();

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

// Spins until ready() or `budget` has passed; true when ready. The clock is read every 64 spins
// (a few microseconds); a longer gap between two reads means the OS ran something else here: the
// cores are taken, and spinning on would only take a share of them from the threads doing the
// work, so it stops at once.
template <class Ready>
bool spin_until(Ready ready, std::chrono::microseconds budget) {
    using Clock = std::chrono::steady_clock;
    constexpr std::chrono::microseconds kDescheduled{100};
    auto last = Clock::now();
    const auto end = last + budget;
    for (int i = 1;; i++) {
        if (ready()) return true;
        cpu_relax();
        if (i % 64 != 0) continue;
        const auto now = Clock::now();
        if (now >= end || now - last > kDescheduled) return ready();
        last = now;
    }
}

// How long a worker polls for the next loop before it sleeps, and how long the caller polls for
// a chunk in progress. A token's loops follow each other within microseconds, so polling this
// long keeps a worker awake through a decode; a worker the OS has descheduled is not waited for
// at all (its chunks go to the caller), and one that sleeps costs a futex wake per loop.
constexpr std::chrono::microseconds kWorkerSpin{200};
constexpr std::chrono::microseconds kCallerSpin{50};

// One loop at a time. The claim word packs [limit:16][n_chunks:24][next:24]: a thread claims
// chunk `next` by a compare-exchange that adds 1, and only threads below `limit` claim. A
// successful claim is of the loop now posted (whatever an earlier load saw), and that loop's
// caller waits until every claimed chunk is done, so the job fields read after a claim are live.
class Pool {
public:
    static Pool& get() {
        static Pool* pool = new Pool;  // never destroyed: workers may still be asleep at exit
        return *pool;
    }

    bool try_acquire() { return !busy_.exchange(true, std::memory_order_acquire); }
    void release() { busy_.store(false, std::memory_order_release); }

    // A chunk's target time. Eight chunks a thread balance a small loop; a long one (the
    // classifier's product) is cut finer, or the caller waits up to a whole chunk's time at the
    // end for the worker's last one. A claim costs about 0.1 us, so 10 us chunks cost 1%.
    static constexpr double kChunkNs = 10e3;

    // Runs [0, n) in chunks on this thread and up to n_threads - 1 workers; holds busy_.
    // ns_per_item: the site's time per item so far (0: not known yet).
    LoopCost run(int n_threads, std::int64_t n, RangeFn body, void* ctx, double ns_per_item) {
        using Clock = std::chrono::steady_clock;
        const auto t0 = Clock::now();
        ensure_workers(n_threads - 1);
        const auto by_time = std::int64_t(std::min(double(kMaxChunks), double(n) * ns_per_item / kChunkNs));
        const std::int64_t n_chunks =
            std::min<std::int64_t>({n, std::max(std::int64_t(n_threads) * 8, by_time), kMaxChunks});
        if (limit_.load(std::memory_order_relaxed) != std::uint32_t(n_threads)) {
            {
                const std::lock_guard<std::mutex> lock(park_mutex_);
                limit_.store(std::uint32_t(n_threads), std::memory_order_release);
            }
            park_.notify_all();
        }
        body_ = body, ctx_ = ctx, n_ = n, n_chunks_ = n_chunks;
        done_.store(0, std::memory_order_relaxed);
        claim_.store(pack(std::uint64_t(n_threads), std::uint64_t(n_chunks), 0), std::memory_order_release);
        wake_.fetch_add(1, std::memory_order_seq_cst);
        if (sleepers_.load(std::memory_order_seq_cst) > 0) wake_.notify_all();
        const auto t_posted = Clock::now();
        loops_.fetch_add(1, std::memory_order_relaxed);
        const std::int64_t items = run_claims(0);
        const auto t_ran = Clock::now();
        wait_done(std::uint32_t(n_chunks));
        const auto t_done = Clock::now();
        auto ns = [](Clock::duration d) {
            return double(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
        };
        return {double(items), ns(t_ran - t_posted), double(n - items), ns(t_done - t_ran) + ns(t_posted - t0)};
    }

    // Whether this loop runs on the caller alone, by the pool's judgement (loop_judge.h).
    bool alone(LoopJudge::Site& site, int n_threads) {
        return !always_threads_.load(std::memory_order_relaxed) && judge_.alone(site, n_threads);
    }
    LoopJudge judge_;  // guarded by busy_
    std::atomic<bool> always_threads_{false};

    void count_serial() { serial_loops_.fetch_add(1, std::memory_order_relaxed); }
    void count_stall() { stalls_.fetch_add(1, std::memory_order_relaxed); }

    PoolCounters counters() const {
        PoolCounters c;
        c.loops = loops_.load(), c.serial_loops = serial_loops_.load();
        c.stalls = stalls_.load(), c.idle_rounds = idle_rounds_.load();
        return c;
    }

private:
    static constexpr std::int64_t kMaxChunks = (std::int64_t{1} << 24) - 1;

    static std::uint64_t pack(std::uint64_t limit, std::uint64_t n_chunks, std::uint64_t next) {
        return limit << 48 | n_chunks << 24 | next;
    }

    // Whether other programs take cores the loops' threads would need: the programs running now
    // (/proc/loadavg's count, less this thread; the workers sleep through a stretch alone)
    // outnumber the CPUs this process may use that its threads leave free.
    static bool cores_taken(int n_threads) {
        std::ifstream loadavg("/proc/loadavg");
        double avg1 = 0, avg5 = 0, avg15 = 0;
        int running = 0;
        char slash = 0;
        if (!(loadavg >> avg1 >> avg5 >> avg15 >> running >> slash) || slash != '/') return false;
        const int others = std::max(0, running - 1);
        static const int cpus = affinity_cpus();
        return others > cpus - std::min(n_threads, cpus);
    }

    Pool() {
        judge_.cores_taken = &Pool::cores_taken;
        // A forked child has none of its parent's workers: it starts its own when it first needs
        // them. (Until then the caller claims every chunk, which is also correct.)
        pthread_atfork(nullptr, nullptr, [] {
            Pool& p = get();
            p.n_workers_ = 0, p.sleepers_ = 0, p.limit_ = 0;
            p.busy_ = false;  // a parent thread inside a loop at the fork does not exist here
            // A parent's worker may have held the mutex at the fork: the child's start unlocked.
            new (&p.park_mutex_) std::mutex;
            new (&p.park_) std::condition_variable;
        });
    }

    // Starts workers up to `wanted`. When the system refuses a thread, the pool keeps those it has
    // (the caller takes the chunks of workers that do not exist) and stops asking.
    void ensure_workers(int wanted) {
        wanted = std::min(wanted, max_workers_);
        for (; n_workers_ < wanted; n_workers_++) {
            try {
                std::thread([this, id = n_workers_ + 1] { work(id); }).detach();
            } catch (const std::system_error&) {
                max_workers_ = n_workers_;
                return;
            }
        }
    }

    // Claims and runs chunks of the posted loop while there are any for thread `id`, then counts
    // them done at once (one write to the shared counter per thread, not per chunk); the items run.
    std::int64_t run_claims(int id) {
        std::uint32_t ran = 0;
        std::int64_t items = 0;
        std::uint64_t s = claim_.load(std::memory_order_acquire), n_chunks = 0;
        for (;;) {
            const std::uint64_t limit = s >> 48, next = s & 0xffffff;
            n_chunks = (s >> 24) & 0xffffff;
            if (std::uint64_t(id) >= limit || next >= n_chunks) break;
            if (!claim_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
            const std::int64_t begin = n_ * std::int64_t(next) / n_chunks_,
                               end = n_ * std::int64_t(next + 1) / n_chunks_;
            body_(ctx_, begin, end, id);
            ran++;
            items += end - begin;
            s = claim_.load(std::memory_order_acquire);
        }
        if (ran > 0 && done_.fetch_add(ran, std::memory_order_seq_cst) + ran == n_chunks &&
            caller_waiting_.load(std::memory_order_seq_cst))
            done_.notify_one();
        return items;
    }

    void wait_done(std::uint32_t n_chunks) {
        auto finished = [&] { return done_.load(std::memory_order_acquire) == n_chunks; };
        if (finished()) return;
        if (spin_until(finished, kCallerSpin)) return;
        caller_waiting_.store(true, std::memory_order_seq_cst);
        for (std::uint32_t d; (d = done_.load(std::memory_order_seq_cst)) != n_chunks;) done_.wait(d);
        caller_waiting_.store(false, std::memory_order_relaxed);
    }

    // A worker numbered at or above the thread count of the loops now posted (limit_) parks on
    // park_ instead: spinning, it would take a share of the cores from the threads doing the work (a
    // process that once ran 8 threads and now runs 2), and asleep on wake_ it would be woken by
    // every loop for nothing.
    [[noreturn]] void work(int id) {
        std::uint32_t seen = wake_.load(std::memory_order_acquire);
        for (;;) {
            if (std::uint32_t(id) >= limit_.load(std::memory_order_acquire)) {
                std::unique_lock<std::mutex> lock(park_mutex_);
                park_.wait(lock, [&] { return std::uint32_t(id) < limit_.load(std::memory_order_acquire); });
                seen = wake_.load(std::memory_order_acquire);
                continue;
            }
            if (std::uint64_t(id) >= claim_.load(std::memory_order_relaxed) >> 48)
                idle_rounds_.fetch_add(1, std::memory_order_relaxed);
            run_claims(id);
            auto posted = [&] { return wake_.load(std::memory_order_acquire) != seen; };
            if (!spin_until(posted, kWorkerSpin)) {
                sleepers_.fetch_add(1, std::memory_order_seq_cst);
                wake_.wait(seen, std::memory_order_seq_cst);
                sleepers_.fetch_sub(1, std::memory_order_relaxed);
            }
            seen = wake_.load(std::memory_order_acquire);
        }
    }

    std::atomic<bool> busy_{false};
    int n_workers_ = 0;                // started, guarded by busy_
    int max_workers_ = (1 << 16) - 2;  // the claim word's limit, or where the system refused a thread
    // The posted loop: written by its caller before claim_ is stored, read after a claim.
    RangeFn body_ = nullptr;
    void* ctx_ = nullptr;
    std::int64_t n_ = 0, n_chunks_ = 0;
    alignas(64) std::atomic<std::uint64_t> claim_{0};
    alignas(64) std::atomic<std::uint32_t> done_{0};
    std::atomic<bool> caller_waiting_{false};
    alignas(64) std::atomic<std::uint32_t> wake_{0};
    // The thread count of the loops posted lately; workers at or above it wait on park_. (A
    // condition variable: changes are rare, and a missed wake-up here would park a worker for good.)
    std::atomic<std::uint32_t> limit_{0};
    std::mutex park_mutex_;
    std::condition_variable park_;
    std::atomic<int> sleepers_{0};
    alignas(64) std::atomic<std::uint64_t> loops_{0}, serial_loops_{0}, stalls_{0};
    alignas(64) std::atomic<std::uint64_t> idle_rounds_{0};
};

}  // namespace

void pool_always_threads(bool on) { Pool::get().always_threads_.store(on); }

void pool_forget() {
    Pool& pool = Pool::get();
    while (!pool.try_acquire()) std::this_thread::yield();
    pool.judge_.forget();
    pool.release();
}

void parallel_for(int n_threads, std::int64_t n, RangeFn body, void* ctx) {
    assert(n >= 0);
    if (n <= 0) return;
    if (n_threads <= 1 || n == 1) return body(ctx, 0, n, 0);
    Pool& pool = Pool::get();
    if (!pool.try_acquire()) {
        pool.count_serial();
        return body(ctx, 0, n, 0);
    }
    LoopJudge::Site& site = pool.judge_.site(reinterpret_cast<const void*>(body), n);
    if (pool.alone(site, n_threads)) {
        pool.release();
        pool.count_serial();
        return body(ctx, 0, n, 0);
    }
    if (pool.judge_.judge(site, pool.run(n_threads, n, body, ctx, site.ns_per_item), n_threads)) pool.count_stall();
    pool.release();
}

PoolCounters pool_counters() { return Pool::get().counters(); }

double cgroup_folder_quota(const std::string& dir) {
    std::ifstream max(dir + "/cpu.max");
    std::string quota;
    double period = 0;
    if (max >> quota >> period) {  // "max 100000" or "QUOTA PERIOD", in microseconds
        char* end = nullptr;
        const double q = std::strtod(quota.c_str(), &end);
        return *end == '\0' && std::isfinite(q) && q > 0 && std::isfinite(period) && period > 0 ? q / period : 0.0;
    }
    double q = 0;
    std::ifstream v1q(dir + "/cpu.cfs_quota_us"), v1p(dir + "/cpu.cfs_period_us");  // quota -1: none
    if (v1q >> q && v1p >> period && std::isfinite(q) && q > 0 && std::isfinite(period) && period > 0)
        return q / period;
    return 0.0;
}

namespace {

int affinity_cpus() {
    for (int n = 1024; n <= 1 << 16; n *= 4) {
        cpu_set_t* set = CPU_ALLOC(n);
        const std::size_t size = CPU_ALLOC_SIZE(n);
        const int ok = sched_getaffinity(0, size, set);
        const int count = ok == 0 ? CPU_COUNT_S(size, set) : 0;
        CPU_FREE(set);
        if (ok == 0) return std::max(1, count);
        if (errno != EINVAL) break;  // EINVAL: the mask is wider than n CPUs
    }
    return std::max(1, int(std::thread::hardware_concurrency()));
}

// The tightest quota on the way from this process's cgroup up to the hierarchy's root.
double cgroup_quota() {
    std::ifstream cgroups("/proc/self/cgroup");
    std::vector<std::string> dirs;
    for (std::string line; std::getline(cgroups, line);) {
        const auto a = line.find(':'), b = line.find(':', a + 1);
        if (a == std::string::npos || b == std::string::npos) continue;
        const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
        if (controllers.empty()) {  // cgroup v2's one hierarchy
            dirs.push_back("/sys/fs/cgroup" + path);
            continue;
        }
        std::stringstream list(controllers);
        for (std::string c; std::getline(list, c, ',');)
            if (c == "cpu")
                for (const char* mount :
                     {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpuacct,cpu"})
                    dirs.push_back(mount + path);
    }
    double tightest = 0.0;
    for (std::string dir : dirs) {
        for (int depth = 0; depth < 64; depth++) {
            const double q = cgroup_folder_quota(dir);
            if (q > 0 && (tightest == 0 || q < tightest)) tightest = q;
            const auto slash = dir.find_last_of('/');
            if (slash == std::string::npos || dir.compare(0, 15, "/sys/fs/cgroup/") != 0 || slash < 15) break;
            dir.resize(slash);
        }
    }
    return tightest;
}

}  // namespace

CpuBudget usable_cpus() {
    CpuBudget b;
    b.affinity = affinity_cpus();
    b.quota = cgroup_quota();
    int threads = b.affinity;
    if (b.quota > 0) threads = std::min(threads, std::max(1, int(std::ceil(b.quota))));
    b.threads = std::clamp(threads, 1, CpuBudget::kMaxAutoThreads);
    if (const char* env = std::getenv("KVLAB_THREADS")) {
        const std::string text = env;
        int n = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
        if (ec != std::errc() || end != text.data() + text.size() || n < 1 || n > 256)
            throw Error("KVLAB_THREADS: a count 1..256, not '" + one_line(text) + "'");
        b.from_env = b.threads = n;
    }
    return b;
}

}  // namespace kvlab
