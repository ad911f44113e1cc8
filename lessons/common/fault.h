// Wrong solutions made by program: faults planted, at run time, into a copy of a lab's reference
// solution. lessons/plant_faults.pl rewrites solution/lab.cpp so that every function it defines
// opens with KVLAB_FAULT_ENTRY(id) and every value it returns passes through
// KVLAB_FAULT_VALUE(id, value); the labNN_faulty grader is built from that copy with this header.
// Nothing happens unless the environment arms one site:
//
//   KVLAB_LAB_FAULT="ID KIND"   the site and what it does there
//     at a function's entry:    segv (a segmentation fault), abort, hang (an endless loop)
//     at a returned integer:    plus1, plus_block (+64: a block or a stride too far),
//                               far (out of range: +2^20, less for narrow types), negative (~x)
//     at a returned vector:     empty, oversized (7 more elements)
//   KVLAB_LAB_FAULT_HIT=FILE    created when the armed fault fires (a kind that does not fit the
//                               site's type, or a site never reached, leaves it absent)
//
// lessons/fault_test.sh draws the sites and kinds and wants each fault that fired to end in a
// whole table with a FAIL and status 1, never a signal or a hang of the grader itself.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

namespace kvlab::lessons::fault {

struct Armed {
    long id = -1;
    std::string kind;
};

inline const Armed& armed() {
    static const Armed a = [] {
        Armed r;
        if (const char* env = std::getenv("KVLAB_LAB_FAULT")) {
            char* end = nullptr;
            r.id = std::strtol(env, &end, 10);
            while (end && *end == ' ') end++;
            r.kind = end ? end : "";
        }
        return r;
    }();
    return a;
}

inline void fired() {
    if (const char* file = std::getenv("KVLAB_LAB_FAULT_HIT")) {
        const int fd = ::open(file, O_CREAT | O_WRONLY, 0644);
        if (fd >= 0) ::close(fd);
    }
}

inline void entry(long id) {
    const Armed& a = armed();
    if (a.id != id) return;
    if (a.kind == "segv") fired(), std::raise(SIGSEGV);
    if (a.kind == "abort") fired(), std::abort();
    if (a.kind == "hang") {
        fired();
        for (volatile bool spin = true; spin;) {
        }
    }
}

template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};

template <class T>
T value(long id, T x) {
    const Armed& a = armed();
    if (a.id != id) return x;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        constexpr int far_bits = sizeof(T) * 8 - 2 < 20 ? int(sizeof(T) * 8 - 2) : 20;
        if (a.kind == "plus1") return fired(), T(x + 1);
        if (a.kind == "plus_block") return fired(), T(x + 64);
        if (a.kind == "far") return fired(), T(x + (T(1) << far_bits) + 64);  // + 64: still off when narrowed to 8 bits
        if (a.kind == "negative") return fired(), T(~x);
    } else if constexpr (is_vector<T>::value) {
        if (a.kind == "empty") return fired(), T{};
        if (a.kind == "oversized") {
            fired();
            x.resize(x.size() + 7);
            return x;
        }
    }
    return x;
}

}  // namespace kvlab::lessons::fault

#define KVLAB_FAULT_ENTRY(id) ::kvlab::lessons::fault::entry(id)
#define KVLAB_FAULT_VALUE(id, ...) ::kvlab::lessons::fault::value(id, __VA_ARGS__)
