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
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "config.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvlab {

namespace {

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

    // What one threaded loop cost the caller: the items it ran itself and the time they took,
    // the items the workers ran, and the time spent posting the loop and waiting for them.
    struct LoopCost {
        double caller_items = 0, caller_ns = 0, worker_items = 0, overhead_ns = 0;
    };

    // Runs [0, n) in chunks on this thread and up to n_threads - 1 workers; holds busy_.
    LoopCost run(int n_threads, std::int64_t n, RangeFn body, void* ctx) {
        using Clock = std::chrono::steady_clock;
        const auto t0 = Clock::now();
        ensure_workers(n_threads - 1);
        // Eight chunks a thread: small enough that the last chunks balance, large enough that
        // claiming them costs nothing next to the work.
        const std::int64_t n_chunks = std::min<std::int64_t>({n, std::int64_t(n_threads) * 8, kMaxChunks});
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

    // Whether threads have paid off at a loop site (a kernel's loop, at sizes within a factor of
    // two) lately. Its loops are judged in windows of kWindow: the workers saved the items they
    // ran at the caller's own time per item, and cost the caller its time posting and waiting.
    // The caller's time per item is the window's least, so that a caller the OS descheduled
    // mid-loop does not make the workers look worth more. After a window in which they cost more
    // than they saved (another program holds the cores, or the loop is too small), the site runs
    // on the caller alone for a while, twice as long each time in a row, then tries threads again.
    struct Site {
        RangeFn body = nullptr;
        int size_class = -1;
        int loops = 0, serial_left = 0, backoff = 0;
        // This window's: the items workers ran and the caller's least time per item (a site's),
        // the time they saved (the pool's), and the caller's time posting and waiting (both).
        double worker_items = 0, ns_per_item = 0, saved_ns = 0, overhead_ns = 0;
    };
    static constexpr int kWindow = 16, kFirstBackoff = 64, kMaxBackoff = 1 << 13;
    // The same judgement over every site's threaded loops together, kAllWindow at a time: when they
    // cost more than they saved in all, every loop runs on the caller alone for a while (four
    // times as long each time in a row), and the workers sleep through it instead of waking for
    // the probes of site after site: on a machine whose cores are taken, a worker awake takes a
    // share of a core from the caller, and a worker descheduled holding a chunk stalls it.
    static constexpr int kAllWindow = 32, kAllFirstBackoff = 1024, kAllMaxBackoff = 1 << 17;
    Site all_{.backoff = kAllFirstBackoff};  // guarded by busy_

    Site& site(RangeFn body, std::int64_t n) {
        const int size_class = std::bit_width(std::uint64_t(n));
        std::size_t i = (reinterpret_cast<std::uintptr_t>(body) / 16 + std::size_t(size_class) * 31) % sites_.size();
        for (std::size_t probes = 0; probes < sites_.size(); probes++, i = (i + 1) % sites_.size()) {
            Site& s = sites_[i];
            if (s.body == body && s.size_class == size_class) return s;
            if (s.body == nullptr) {
                s.body = body, s.size_class = size_class, s.backoff = kFirstBackoff;
                return s;
            }
        }
        Site& s = sites_[i];  // the table is full (it holds kernels' loops times sizes): reuse a slot
        s = Site{.body = body, .size_class = size_class, .backoff = kFirstBackoff};
        return s;
    }

    // A window's verdict: the site (or the pool) runs alone for its backoff when the workers
    // cost more than they saved.
    static void close_window(Site& s, double gain_ns, int first_backoff, int max_backoff, int growth) {
        if (gain_ns < 0) {
            s.serial_left = s.backoff;
            s.backoff = std::min(growth * s.backoff, max_backoff);
        } else {
            s.backoff = first_backoff;
        }
        s.loops = 0, s.worker_items = 0, s.saved_ns = 0, s.overhead_ns = 0;
    }

    // A loop whose caller waited on the workers this long, and longer than it ran chunks itself,
    // met a worker the OS descheduled while it held a chunk (on an idle machine the wait is at
    // most about one chunk, and the caller runs several): the cores are taken, and the windows
    // close at once, a loss, rather than meeting more such stalls.
    static constexpr double kStallNs = 500e3;

    void judge(Site& site, const LoopCost& c) {
        if (c.overhead_ns > kStallNs && c.overhead_ns > c.caller_ns) {
            stalls_.fetch_add(1, std::memory_order_relaxed);
            close_window(site, -1.0, kFirstBackoff, kMaxBackoff, 2);
            close_window(all_, -1.0, kAllFirstBackoff, kAllMaxBackoff, 4);
            return;
        }
        if (c.caller_items > 0) {
            const double per_item = c.caller_ns / c.caller_items;
            if (site.loops == 0 || per_item < site.ns_per_item) site.ns_per_item = per_item;
        }
        site.worker_items += c.worker_items, site.overhead_ns += c.overhead_ns;
        all_.saved_ns += c.worker_items * site.ns_per_item, all_.overhead_ns += c.overhead_ns;
        if (++site.loops == kWindow)
            close_window(site, site.worker_items * site.ns_per_item - site.overhead_ns, kFirstBackoff, kMaxBackoff, 2);
        if (++all_.loops == kAllWindow)
            close_window(all_, all_.saved_ns - all_.overhead_ns, kAllFirstBackoff, kAllMaxBackoff, 4);
    }

    // Whether this loop runs on the caller alone, by the pool's judgement (counted down).
    bool alone(Site& site) {
        if (always_threads_.load(std::memory_order_relaxed)) return false;
        if (all_.serial_left > 0) return all_.serial_left--, true;
        if (site.serial_left > 0) return site.serial_left--, true;
        return false;
    }
    std::atomic<bool> always_threads_{false};

    void count_serial() { serial_loops_.fetch_add(1, std::memory_order_relaxed); }

    PoolCounters counters() const {
        PoolCounters c;
        c.loops = loops_.load(), c.serial_loops = serial_loops_.load();
        c.stalls = stalls_.load();
        return c;
    }

private:
    static constexpr std::int64_t kMaxChunks = (std::int64_t{1} << 24) - 1;

    static std::uint64_t pack(std::uint64_t limit, std::uint64_t n_chunks, std::uint64_t next) {
        return limit << 48 | n_chunks << 24 | next;
    }

    Pool() {
        // A forked child has none of its parent's workers: it starts its own when it first needs
        // them. (Until then the caller claims every chunk, which is also correct.)
        pthread_atfork(nullptr, nullptr, [] {
            Pool& p = get();
            p.n_workers_ = 0, p.sleepers_ = 0;
            p.busy_ = false;  // a parent thread inside a loop at the fork does not exist here
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

    [[noreturn]] void work(int id) {
        std::uint32_t seen = wake_.load(std::memory_order_acquire);
        for (;;) {
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
    std::array<Site, 256> sites_{};    // guarded by busy_
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
    std::atomic<int> sleepers_{0};
    alignas(64) std::atomic<std::uint64_t> loops_{0}, serial_loops_{0}, stalls_{0};
};

}  // namespace

void pool_always_threads(bool on) { Pool::get().always_threads_.store(on); }

void parallel_for(int n_threads, std::int64_t n, RangeFn body, void* ctx) {
    assert(n >= 0);
    if (n <= 0) return;
    if (n_threads <= 1 || n == 1) return body(ctx, 0, n, 0);
    Pool& pool = Pool::get();
    if (!pool.try_acquire()) {
        pool.count_serial();
        return body(ctx, 0, n, 0);
    }
    Pool::Site& site = pool.site(body, n);
    if (pool.alone(site)) {
        pool.release();
        pool.count_serial();
        return body(ctx, 0, n, 0);
    }
    pool.judge(site, pool.run(n_threads, n, body, ctx));
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
