#include "npy.h"

#include <fmt/format.h>

#include <cassert>
#include <cstring>
#include <fstream>
#include <limits>

#include "config.h"

namespace kvlab {

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";

// The header's dictionary, as numpy writes it: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
struct Header {
    std::string descr;
    bool fortran = false;
    std::vector<std::int64_t> shape;
};

class HeaderParser {
public:
    HeaderParser(std::string_view text, const std::string& what) : s_(text), what_(what) {}
    Header parse() {
        Header h;
        bool descr = false, fortran = false, shape = false;
        expect('{');
        while (!peek('}')) {
            const std::string key = quoted();
            expect(':');
            if (key == "descr" && !descr)
                h.descr = quoted(), descr = true;
            else if (key == "fortran_order" && !fortran)
                h.fortran = boolean(), fortran = true;
            else if (key == "shape" && !shape)
                h.shape = tuple(), shape = true;
            else
                fail(fmt::format("an unexpected key '{}'", key));
            if (!peek('}')) expect(',');
        }
        expect('}');
        if (!descr || !fortran || !shape) fail("a header without descr, fortran_order and shape");
        return h;
    }

private:
    [[noreturn]] void fail(const std::string& problem) const {
        throw Error(fmt::format("{}: not a .npy file kvlab reads: {} in its header", what_, problem));
    }
    void skip() {
        while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\t')) at_++;
    }
    bool peek(char c) {
        skip();
        return at_ < s_.size() && s_[at_] == c;
    }
    void expect(char c) {
        if (!peek(c)) fail(fmt::format("no '{}' where one belongs", c));
        at_++;
    }
    std::string quoted() {
        skip();
        if (at_ >= s_.size() || (s_[at_] != '\'' && s_[at_] != '"')) fail("a key or value that is not a string");
        const char q = s_[at_++];
        const std::size_t end = s_.find(q, at_);
        if (end == std::string_view::npos || end - at_ > 64) fail("an unterminated string");
        std::string v(s_.substr(at_, end - at_));
        at_ = end + 1;
        return v;
    }
    bool boolean() {
        skip();
        for (const auto& [word, value] : {std::pair{"False", false}, std::pair{"True", true}})
            if (s_.substr(at_, std::strlen(word)) == word) {
                at_ += std::strlen(word);
                return value;
            }
        fail("a fortran_order that is not True or False");
    }
    std::vector<std::int64_t> tuple() {
        std::vector<std::int64_t> dims;
        expect('(');
        while (!peek(')')) {
            skip();
            std::int64_t v = 0;
            const std::size_t start = at_;
            while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9') {
                if (v > (std::numeric_limits<std::int64_t>::max() - 9) / 10) fail("a dimension too large");
                v = v * 10 + (s_[at_++] - '0');
            }
            if (at_ == start) fail("a shape that is not a tuple of integers");
            if (dims.size() == 16) fail("more than 16 dimensions");
            dims.push_back(v);
            if (!peek(')')) expect(',');
        }
        expect(')');
        return dims;
    }
    std::string_view s_;
    std::size_t at_ = 0;
    const std::string& what_;
};

// ---- SHA-256 (FIPS 180-4)

constexpr std::uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

std::uint32_t rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void sha256_block(std::uint32_t h[8], const unsigned char* p) {
    std::uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = std::uint32_t(p[4 * i]) << 24 | std::uint32_t(p[4 * i + 1]) << 16 | std::uint32_t(p[4 * i + 2]) << 8 |
               std::uint32_t(p[4 * i + 3]);
    for (int i = 16; i < 64; i++) {
        const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        const std::uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
        const std::uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

}  // namespace

std::int64_t NpyArray::size() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
}

std::string npy_bytes(const NpyArray& a) {
    assert(a.dtype == "<f4" || a.dtype == "<i4");
    std::string shape;  // "3," for one dimension, "2, 3" for two, as Python writes tuples
    for (std::size_t i = 0; i < a.shape.size(); i++) shape += fmt::format("{}{}", i ? ", " : "", a.shape[i]);
    if (a.shape.size() == 1) shape += ',';
    std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", a.dtype, shape);
    // Magic, version 1.0, the header's length, then the header padded with spaces to a multiple of
    // 64 bytes in all (numpy's alignment), ending in a newline.
    const std::size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
    header.append(total - 10 - header.size() - 1, ' ');
    header += '\n';
    std::string out(kMagic);
    out += char(1), out += char(0);
    out += char(header.size() & 0xff), out += char(header.size() >> 8);
    out += header;
    const std::int64_t n = a.size();
    assert(std::size_t(n) == (a.dtype == "<f4" ? a.f32.size() : a.i32.size()));
    out.append(reinterpret_cast<const char*>(a.dtype == "<f4" ? static_cast<const void*>(a.f32.data())
                                                              : static_cast<const void*>(a.i32.data())),
               std::size_t(n) * 4);
    return out;
}

NpyArray parse_npy(std::string_view bytes, const std::string& what) {
    if (bytes.size() < 10 || bytes.substr(0, 6) != kMagic)
        throw Error(fmt::format("{}: not a .npy file (no \\x93NUMPY magic)", what));
    const int major = static_cast<unsigned char>(bytes[6]);
    if (major < 1 || major > 3)
        throw Error(fmt::format("{}: .npy format version {} (kvlab reads 1.0 to 3.0)", what, major));
    const std::size_t len_bytes = major == 1 ? 2 : 4;
    if (bytes.size() < 8 + len_bytes) throw Error(fmt::format("{}: the .npy header is cut short", what));
    std::size_t header_len = 0;
    for (std::size_t i = 0; i < len_bytes; i++)
        header_len |= std::size_t(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    const std::size_t start = 8 + len_bytes;
    if (header_len > bytes.size() - start) throw Error(fmt::format("{}: the .npy header is cut short", what));
    const Header h = HeaderParser(bytes.substr(start, header_len), what).parse();
    if (h.descr != "<f4" && h.descr != "<i4")
        throw Error(fmt::format("{}: dtype '{}' (kvlab reads '<f4' and '<i4')", what, h.descr));
    if (h.fortran) throw Error(fmt::format("{}: Fortran order (kvlab reads C order)", what));
    const std::string_view data = bytes.substr(start + header_len);
    std::int64_t n = 1;
    for (std::int64_t d : h.shape) {
        if (d != 0 && n > std::int64_t(data.size() / 4) / d)
            throw Error(fmt::format("{}: its shape needs more than its {} data bytes", what, data.size()));
        n *= d;
    }
    if (std::size_t(n) * 4 != data.size())
        throw Error(
            fmt::format("{}: its shape holds {} elements, its data {} bytes (not {})", what, n, data.size(), n * 4));
    NpyArray a;
    a.dtype = h.descr;
    a.shape = h.shape;
    if (a.dtype == "<f4") {
        a.f32.resize(std::size_t(n));  // [product(shape)]
        std::memcpy(a.f32.data(), data.data(), data.size());
    } else {
        a.i32.resize(std::size_t(n));  // [product(shape)]
        std::memcpy(a.i32.data(), data.data(), data.size());
    }
    return a;
}

std::string read_file_bytes(const std::string& path, std::int64_t max_bytes) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) throw Error(fmt::format("'{}': cannot open for reading", path));
    const std::streamoff size = in.tellg();
    if (size < 0) throw Error(fmt::format("'{}': cannot read (not a regular file?)", path));
    if (size > max_bytes)
        throw Error(fmt::format("'{}': {} bytes, more than the {} kvlab reads", path, size, max_bytes));
    std::string bytes(std::size_t(size), '\0');
    in.seekg(0);
    if (!in.read(bytes.data(), size)) throw Error(fmt::format("'{}': read failed", path));
    return bytes;
}

std::string sha256_hex(std::string_view bytes) {
    std::uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                          0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    std::size_t i = 0;
    for (; i + 64 <= bytes.size(); i += 64) sha256_block(h, reinterpret_cast<const unsigned char*>(bytes.data() + i));
    // The last block(s): the rest, a 1 bit, zeros, and the length in bits (big-endian).
    unsigned char tail[128] = {};
    const std::size_t rest = bytes.size() - i;
    std::memcpy(tail, bytes.data() + i, rest);
    tail[rest] = 0x80;
    const std::size_t blocks = rest + 9 > 64 ? 2 : 1;
    const std::uint64_t bits = std::uint64_t(bytes.size()) * 8;
    for (int b = 0; b < 8; b++) tail[blocks * 64 - 1 - b] = static_cast<unsigned char>(bits >> (8 * b));
    for (std::size_t b = 0; b < blocks; b++) sha256_block(h, tail + 64 * b);
    std::string hex;
    for (std::uint32_t v : h) hex += fmt::format("{:08x}", v);
    return hex;
}

}  // namespace kvlab
