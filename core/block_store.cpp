#include "block_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "config.h"
#include "file_writer.h"
#include "npy.h"
#include "paged.h"

namespace kvlab {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'L', 'B', 'L', 'K', '0', '1'};
constexpr std::size_t kHeader = 64;    // magic, model, format, 4 x u32 shape, row_bytes, parent, hash
constexpr std::size_t kChecksum = 64;  // SHA-256 in hex

void put_u64(std::vector<std::uint8_t>& out, std::uint64_t x) {
    for (int i = 0; i < 8; i++) out.push_back(std::uint8_t(x >> (8 * i)));
}
void put_u32(std::vector<std::uint8_t>& out, std::uint32_t x) {
    for (int i = 0; i < 4; i++) out.push_back(std::uint8_t(x >> (8 * i)));
}
std::uint64_t get_u64(std::span<const std::uint8_t> in, std::size_t at) {
    std::uint64_t x = 0;
    for (int i = 0; i < 8; i++) x |= std::uint64_t(in[at + std::size_t(i)]) << (8 * i);
    return x;
}
std::uint32_t get_u32(std::span<const std::uint8_t> in, std::size_t at) {
    std::uint32_t x = 0;
    for (int i = 0; i < 4; i++) x |= std::uint32_t(in[at + std::size_t(i)]) << (8 * i);
    return x;
}
std::string checksum(std::span<const std::uint8_t> bytes) {
    return sha256_hex(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace

std::size_t block_record_bytes(const BlockShape& s) {
    return kHeader + 4 * std::size_t(s.block_size) + 2 * std::size_t(s.half_bytes()) + kChecksum;
}

std::string store_key(const BlockKey& key, const BlockShape& shape) {
    return fmt::format("kvlab/{:016x}/{:016x}/{}/{:016x}", key.model, shape.format_id, shape.block_size, key.hash());
}

std::vector<std::uint8_t> encode_block_record(const BlockKey& key, const BlockShape& shape,
                                              std::span<const std::uint8_t> k, std::span<const std::uint8_t> v) {
    assert(k.size() == std::size_t(shape.half_bytes()) && v.size() == k.size());
    assert(key.tokens.size() == std::size_t(shape.block_size));
    std::vector<std::uint8_t> out(kMagic, kMagic + 8);
    out.reserve(block_record_bytes(shape));
    put_u64(out, key.model);
    put_u64(out, shape.format_id);
    for (int x : {shape.block_size, shape.n_layers, shape.n_kv_heads, shape.head_size}) put_u32(out, std::uint32_t(x));
    put_u64(out, std::uint64_t(shape.row_bytes));
    put_u64(out, key.parent);
    put_u64(out, key.hash());
    for (int t : key.tokens) put_u32(out, std::uint32_t(t));
    out.insert(out.end(), k.begin(), k.end());
    out.insert(out.end(), v.begin(), v.end());
    const std::string sum = checksum(out);
    out.insert(out.end(), sum.begin(), sum.end());
    assert(out.size() == block_record_bytes(shape));
    return out;
}

std::string check_block_record(std::span<const std::uint8_t> record, const BlockKey& key, const BlockShape& shape) {
    if (record.size() < kHeader || std::memcmp(record.data(), kMagic, 8) != 0) return "not a block record";
    const int fields[4] = {shape.block_size, shape.n_layers, shape.n_kv_heads, shape.head_size};
    for (int i = 0; i < 4; i++)
        if (get_u32(record, 24 + 4 * std::size_t(i)) != std::uint32_t(fields[i])) return "other shape";
    if (get_u64(record, 40) != std::uint64_t(shape.row_bytes)) return "other shape";
    const std::size_t n = block_record_bytes(shape);
    if (record.size() < n) return "truncated";
    if (record.size() > n) return "corrupt";
    const std::string sum(reinterpret_cast<const char*>(record.data()) + n - kChecksum, kChecksum);
    if (sum != checksum(record.first(n - kChecksum))) return "corrupt";
    if (get_u64(record, 8) != key.model) return "other model";
    if (get_u64(record, 16) != shape.format_id) return "other KV format";
    bool same = get_u64(record, 48) == key.parent && key.tokens.size() == std::size_t(shape.block_size);
    for (std::size_t i = 0; same && i < key.tokens.size(); i++)
        same = get_u32(record, kHeader + 4 * i) == std::uint32_t(key.tokens[i]);
    return same ? "" : "other block";
}

std::span<const std::uint8_t> record_rows(std::span<const std::uint8_t> record, const BlockShape& shape) {
    assert(record.size() == block_record_bytes(shape));
    return record.subspan(kHeader + 4 * std::size_t(shape.block_size), 2 * std::size_t(shape.half_bytes()));
}

// ----------------------------------------------------------------------------------------------
// Host memory

HostStore::HostStore(std::int64_t capacity) : capacity_(capacity) {}

HostStore::HostStore(const HostStore& other) : capacity_(other.capacity_), bytes_(other.bytes_), lru_(other.lru_) {
    for (auto it = lru_.begin(); it != lru_.end(); ++it) map_[it->first] = it;
}

HostStore& HostStore::operator=(HostStore other) {
    std::swap(capacity_, other.capacity_);
    std::swap(bytes_, other.bytes_);
    lru_.swap(other.lru_);  // list iterators stay valid across a swap: the index moves with them
    map_.swap(other.map_);
    return *this;
}

std::string HostStore::describe() const { return fmt::format("host memory, {} bytes", capacity_); }

bool HostStore::put(const std::string& key, std::span<const std::uint8_t> record) {
    if (std::int64_t(record.size()) > capacity_) return false;
    erase(key);
    while (bytes_ + std::int64_t(record.size()) > capacity_)
        erase(std::string(lru_.back().first));  // a copy: erase frees it
    lru_.emplace_front(key, std::vector<std::uint8_t>(record.begin(), record.end()));
    map_[key] = lru_.begin();
    bytes_ += std::int64_t(record.size());
    return true;
}

std::vector<std::uint8_t>* HostStore::find(const std::string& key) {
    const auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);  // used: most recent now
    return &it->second->second;
}

std::optional<std::vector<std::uint8_t>> HostStore::get(const std::string& key) {
    if (const auto* record = find(key)) return *record;
    return std::nullopt;
}

void HostStore::erase(const std::string& key) {
    const auto it = map_.find(key);
    if (it == map_.end()) return;
    bytes_ -= std::int64_t(it->second->second.size());
    lru_.erase(it->second);
    map_.erase(it);
}

// ----------------------------------------------------------------------------------------------
// A directory

DirStore::DirStore(std::string dir) : dir_(std::move(dir)) {
    std::error_code ec;
    std::filesystem::create_directory(dir_, ec);
    if (!std::filesystem::is_directory(dir_))
        throw Error(fmt::format("store dir:'{}': not a directory, and it cannot be made ({})", one_line(dir_),
                                ec ? ec.message() : "a file is in the way"));
}

std::string DirStore::describe() const { return fmt::format("directory '{}'", one_line(dir_)); }

std::string DirStore::path(const std::string& key) const {
    std::string name = key;
    std::replace(name.begin(), name.end(), '/', '_');
    return dir_ + "/" + name + ".kvblock";
}

bool DirStore::contains(const std::string& key) {
    std::error_code ec;
    return std::filesystem::is_regular_file(path(key), ec);
}

bool DirStore::put(const std::string& key, std::span<const std::uint8_t> record) {
    try {
        FileWriter out(path(key), "store file");
        out.bytes(record.data(), std::int64_t(record.size()));
        out.close();
        return true;
    } catch (const Error&) {
        errors_++;
        return false;
    }
}

std::optional<std::vector<std::uint8_t>> DirStore::get(const std::string& key) {
    if (!contains(key)) return std::nullopt;
    try {
        // A record is tens of kilobytes; a bigger file is not one (and is not read whole).
        const std::string bytes = read_file_bytes(path(key), std::int64_t(64) << 20);
        return std::vector<std::uint8_t>(bytes.begin(), bytes.end());
    } catch (const Error&) {
        errors_++;
        return std::nullopt;
    }
}

void DirStore::erase(const std::string& key) {
    std::error_code ec;
    std::filesystem::remove(path(key), ec);
}

// ----------------------------------------------------------------------------------------------

std::unique_ptr<BlockStore> open_redis_store(const std::string& address);  // redis_store.cpp

std::unique_ptr<BlockStore> open_block_store(const std::string& spec) {
    if (spec == "host") return std::make_unique<HostStore>();
    if (spec.rfind("host:", 0) == 0) return std::make_unique<HostStore>(parse_bytes("--store host", spec.substr(5)));
    if (spec.rfind("dir:", 0) == 0 && spec.size() > 4) return std::make_unique<DirStore>(spec.substr(4));
    if (spec.rfind("redis:", 0) == 0 && spec.size() > 6) return open_redis_store(spec.substr(6));
    throw Error(
        fmt::format("--store '{}': give host[:SIZE], dir:PATH, redis:HOST:PORT or redis:unix:PATH", one_line(spec)));
}

}  // namespace kvlab
