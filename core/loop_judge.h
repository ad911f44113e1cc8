// kvlab core: whether the thread pool's workers pay off, loop site by loop site (thread_pool.h).
//
// The pool asks the judge before each loop whether to run it on the caller alone, and tells it
// afterwards what a threaded loop cost. It judges from those costs only, never a clock of its
// own, so tests can play it any history of costs (tests/test_thread_pool.cpp).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

namespace kvlab {

// What one threaded loop cost its caller: the items it ran itself and the time they took, the
// items the workers ran, and the time spent posting the loop and waiting for the workers.
struct LoopCost {
    double caller_items = 0, caller_ns = 0, worker_items = 0, overhead_ns = 0;
};

// Whether threads have paid off at a loop site (a kernel's loop, at sizes within a factor of two)
// lately. Its loops are judged in windows of kWindow: the workers saved the items they ran at the
// caller's own time per item, and cost the caller its time posting and waiting. The caller's
// time per item is the window's least, so that a caller the OS descheduled mid-loop does not make
// the workers look worth more. After a window in which they cost more than they saved (another
// program holds the cores, or the loop is too small), the site runs on the caller alone for a
// while, twice as long each time in a row, then tries threads again.
//
// The same judgement runs over every site's threaded loops together, kAllWindow at a time: when
// they cost more than they saved in all, every loop runs on the caller alone for a while (four
// times as long each time, up to about a second of decoding; a window they win shortens the next
// stretch four times, so that under lasting load one lucky window does not bring back the
// shortest), and the workers sleep through it instead of waking for the probes of site after
// site: on a machine whose cores are taken, a worker awake takes a share of a core from the
// caller, and a worker descheduled holding a chunk stalls it.
//
// A loop whose caller waited on the workers over kStallNs, and longer than it ran chunks itself,
// met a worker the OS descheduled while it held a chunk (on an idle machine the wait is at most
// about one chunk, and the caller runs several): the cores are taken, and both windows close at
// once, a loss, rather than meet more such stalls. Unless it is the first stall in kIsolatedNs of
// threaded loops and no other program keeps the cores busy (cores_taken): a virtual machine's
// host, or a moment's other work, stalls an idle machine a few times a second, and that costs
// kFirstBackoff loops alone, not the pool's long backoff (under load, a stall comes every few
// milliseconds of threaded loops).
class LoopJudge {
public:
    static constexpr int kWindow = 16, kFirstBackoff = 64, kMaxBackoff = 1 << 13;
    static constexpr int kAllWindow = 32, kAllFirstBackoff = 1024, kAllMaxBackoff = 1 << 14;
    static constexpr double kStallNs = 500e3, kIsolatedNs = 100e6;

    struct Site {
        const void* key = nullptr;
        int size_class = -1;
        int loops = 0, serial_left = 0, backoff = 0;
        // This window's: the items workers ran and the caller's least time per item (a site's),
        // the time they saved (the pool's), and the caller's time posting and waiting (both).
        double worker_items = 0, ns_per_item = 0, saved_ns = 0, overhead_ns = 0;
    };

    // The site of loops of `key` (the pool passes the body's function) over n items.
    Site& site(const void* key, std::int64_t n) {
        const int size_class = std::bit_width(std::uint64_t(n));
        std::size_t i = (reinterpret_cast<std::uintptr_t>(key) / 16 + std::size_t(size_class) * 31) % sites_.size();
        for (std::size_t probes = 0; probes < sites_.size(); probes++, i = (i + 1) % sites_.size()) {
            Site& s = sites_[i];
            if (s.key == key && s.size_class == size_class) return s;
            if (s.key == nullptr) {
                s.key = key, s.size_class = size_class, s.backoff = kFirstBackoff;
                return s;
            }
        }
        Site& s = sites_[i];  // the table is full (it holds kernels' loops times sizes): reuse a slot
        s = Site{.key = key, .size_class = size_class, .backoff = kFirstBackoff};
        return s;
    }

    // Whether the next loop at `site`, on n_threads threads, runs on the caller alone (counted down).
    bool alone(Site& site, int n_threads) {
        if (!asked_) {  // a process started beside busy programs starts alone
            asked_ = true;
            if (cores_taken && cores_taken(n_threads)) all_.serial_left = kAllFirstBackoff, ask_at_end_ = true;
        }
        if (all_.serial_left > 0) {
            // The pool's stretch alone after a loss ends: while other programs keep the cores busy,
            // trying threads again would only meet stalls, so a short stretch follows (asking
            // costs a file read, a probe under load a stall or more: the pool asks often instead,
            // and takes the threads back within kAllFirstBackoff loops of the load's end).
            if (--all_.serial_left == 0 && ask_at_end_ && cores_taken && cores_taken(n_threads))
                all_.serial_left = kAllFirstBackoff;
            return true;
        }
        if (site.serial_left > 0) return site.serial_left--, true;
        return false;
    }

    // Takes in a threaded loop's cost; true when it was a stall.
    bool judge(Site& site, const LoopCost& c, int n_threads) {
        if (c.overhead_ns > kStallNs && c.overhead_ns > c.caller_ns) {
            const bool isolated = threaded_ns_since_stall_ >= kIsolatedNs && !(cores_taken && cores_taken(n_threads));
            threaded_ns_since_stall_ = 0;
            ask_at_end_ = !isolated;
            if (isolated) {
                site.serial_left = all_.serial_left = kFirstBackoff;
                open_window(site), open_window(all_);
            } else {
                close_window(site, -1.0, kFirstBackoff, kMaxBackoff, 2);
                close_window(all_, -1.0, kAllFirstBackoff, kAllMaxBackoff, 4);
            }
            return true;
        }
        threaded_ns_since_stall_ += c.caller_ns + c.overhead_ns;
        if (c.caller_items > 0) {
            const double per_item = c.caller_ns / c.caller_items;
            if (site.loops == 0 || per_item < site.ns_per_item) site.ns_per_item = per_item;
        }
        site.worker_items += c.worker_items, site.overhead_ns += c.overhead_ns;
        all_.saved_ns += c.worker_items * site.ns_per_item, all_.overhead_ns += c.overhead_ns;
        if (++site.loops == kWindow)
            close_window(site, site.worker_items * site.ns_per_item - site.overhead_ns, kFirstBackoff, kMaxBackoff, 2);
        if (++all_.loops == kAllWindow) {
            ask_at_end_ = true;
            close_window(all_, all_.saved_ns - all_.overhead_ns, kAllFirstBackoff, kAllMaxBackoff, 4, true);
        }
        return false;
    }

    // Everything judged so far forgotten, as in a new process.
    void forget() {
        bool (*keep)(int) = cores_taken;
        *this = LoopJudge();
        cores_taken = keep;
    }

    // Whether other programs keep busy the cores n_threads threads would need. Asked before the
    // first loop, at a stall (then never isolated), and as the pool's stretch alone after a loss
    // ends, before it tries threads again (then it runs alone on). Null: never asked.
    bool (*cores_taken)(int n_threads) = nullptr;

private:
    static void open_window(Site& s) { s.loops = 0, s.worker_items = 0, s.saved_ns = 0, s.overhead_ns = 0; }

    // A window's verdict: the site (or the pool) runs alone for its backoff when the workers
    // cost more than they saved.
    static void close_window(Site& s, double gain_ns, int first_backoff, int max_backoff, int growth,
                             bool decay = false) {
        if (gain_ns < 0) {
            s.serial_left = s.backoff;
            s.backoff = std::min(growth * s.backoff, max_backoff);
        } else {
            s.backoff = decay ? std::max(first_backoff, s.backoff / growth) : first_backoff;
        }
        open_window(s);
    }

    std::array<Site, 256> sites_{};
    Site all_{.backoff = kAllFirstBackoff};
    double threaded_ns_since_stall_ = kIsolatedNs;  // threaded loops' time since the last stall
    bool ask_at_end_ = false;                       // the pool's stretch alone follows a loss
    bool asked_ = false;                            // cores_taken asked before the first loop
};

}  // namespace kvlab
