#include "backend.h"

#include <fmt/format.h>

#include <cassert>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "numerics.h"

namespace kvlab {

namespace {

// memmove, for any byte count: memmove's pointers must be valid even for 0 bytes, and an empty
// buffer's is null (a growing cache's first reserve copies its 0 rows from one).
void move_bytes(void* dst, const void* src, std::int64_t bytes) {
    if (bytes > 0) std::memmove(dst, src, std::size_t(bytes));
}

class HostMemory final : public Memory {
public:
    std::string_view name() const override { return "host"; }
    bool host_visible() const override { return true; }
    void* allocate(std::int64_t bytes) override {
        // 64-byte alignment: a vector register's load never straddles a cache line.
        const std::size_t n = (std::size_t(bytes) + 63) / 64 * 64;
        void* p = std::aligned_alloc(64, n);
        if (!p) throw Error(fmt::format("host memory: cannot allocate {} bytes", bytes));
        return p;
    }
    void deallocate(void* p) override { std::free(p); }
    void upload(void* dst, const void* src, std::int64_t bytes) override { move_bytes(dst, src, bytes); }
    void download(void* dst, const void* src, std::int64_t bytes) override { move_bytes(dst, src, bytes); }
    void copy(void* dst, const void* src, std::int64_t bytes) override { move_bytes(dst, src, bytes); }
    void fill_nan(void* x, std::int64_t n, int format) override {
        assert(!kv_format_int(format));  // KVStorage fills those rows as fp32 words
        if (format == int(KVFormat::fp32)) {
            std::fill_n(static_cast<float*>(x), n, kNaN);
            return;
        }
        for (std::int64_t i = 0; i < n; i++) kv_store(format, x, i, kNaN, 1.0f);
    }
};

}  // namespace

Memory& host_memory() {
    static HostMemory memory;
    return memory;
}

std::vector<int> kv_head_map(const Config& c) {
    std::vector<int> map(std::size_t(c.n_heads));  // [n_heads]
    for (int h = 0; h < c.n_heads; h++) map[std::size_t(h)] = h / c.group();
    return map;
}

}  // namespace kvlab
