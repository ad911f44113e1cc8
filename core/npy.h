// kvlab core: arrays as .npy files (numpy's format, version 1.0 written, 1.0 to 3.0 read), and
// SHA-256, for KV traces and golden vectors that numpy, PyTorch and other engines read.
//
// Only what a trace holds: little-endian float32 ('<f4') and int32 ('<i4'), C order, any shape.
// Every other header is refused with an Error naming what it has, and a file whose data is not
// exactly shape's product of elements is refused too: a reader never trusts a count it did not
// check against the bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

struct NpyArray {
    std::string dtype;                // "<f4" or "<i4"
    std::vector<std::int64_t> shape;  // C order
    std::vector<float> f32;           // [product(shape)] when dtype is "<f4"
    std::vector<std::int32_t> i32;    // [product(shape)] when dtype is "<i4"
    std::int64_t size() const;        // product(shape)
};

// The bytes of a .npy file (version 1.0) holding `a`.
std::string npy_bytes(const NpyArray& a);
// Parses .npy bytes; throws Error naming the file (`what`) and the problem.
NpyArray parse_npy(std::string_view bytes, const std::string& what);

// The whole file; throws Error naming it. At most max_bytes (larger: Error).
std::string read_file_bytes(const std::string& path, std::int64_t max_bytes);

// SHA-256 (FIPS 180-4) of bytes, as 64 lowercase hex digits.
std::string sha256_hex(std::string_view bytes);

}  // namespace kvlab
