// kvlab core: a tier below the block pool for prefix blocks, as LMCache, Mooncake and vLLM's KV
// connectors keep one. Published blocks the pool evicts go to a store (host memory, a directory,
// Redis) and come back from it when a later request's prefix names them, in this process or in
// another one (disaggregated prefill: one process prefills, another decodes).
//
// A block travels as one record:
//   header   magic "KVLBLK01", the model's identity, the KV format's identity (format, integer
//            group, scales), the shape (block_size, n_layers, n_kv_heads, head_size, row_bytes),
//            the block's parent hash and its block_size token ids
//   rows     K then V, each [n_layers, n_kv_heads, block_size, row_bytes]: the pool's own bytes
//            (codes in the pool's format), so a restored block is the computed one, bit for bit
//   checksum SHA-256 of everything before it
// The store's key names the same identity, but a store lies outside kvlab: a record is used only
// when it is whole, its checksum holds and its header names exactly the block asked for. Anything
// else (flipped bytes, a truncated value, another model's or format's block, a key that is gone
// because the store restarted or evicted it) is a miss, and the pool recomputes the block.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvlab {

struct BlockKey;

// What produced a block's rows, beside its key: every field must match for a record to be used.
struct BlockShape {
    std::uint64_t format_id = 0;  // BlockPool::block_shape(): the format, its integer group and its scales
    int block_size = 0, n_layers = 0, n_kv_heads = 0, head_size = 0;
    std::int64_t row_bytes = 0;
    // Bytes of one block's K rows (as many again for V): [n_layers, n_kv_heads, block_size, row_bytes].
    std::int64_t half_bytes() const { return std::int64_t(n_layers) * n_kv_heads * block_size * row_bytes; }
};

// The store's name for a block: "kvlab/<model>/<format>/<block_size>/<hash>", in hex.
std::string store_key(const BlockKey& key, const BlockShape& shape);
// The bytes of a whole record of a block of this shape.
std::size_t block_record_bytes(const BlockShape& shape);
// The record of a block: header, rows (k and v, each shape.half_bytes()), checksum.
std::vector<std::uint8_t> encode_block_record(const BlockKey& key, const BlockShape& shape,
                                              std::span<const std::uint8_t> k, std::span<const std::uint8_t> v);
// Empty when `record` is whole, checksummed and the block asked for; otherwise why not, one of:
// "not a block record", "truncated", "corrupt" (checksum), "other model", "other KV format",
// "other shape", "other block" (another parent or other tokens under this key).
std::string check_block_record(std::span<const std::uint8_t> record, const BlockKey& key, const BlockShape& shape);
// Where a checked record's K rows start (its V rows follow them).
std::span<const std::uint8_t> record_rows(std::span<const std::uint8_t> record, const BlockShape& shape);

// A key-value store of records. Every call is best effort: a store that is full, unreachable or
// restarted answers put() false and get() nothing, and kvlab recomputes.
class BlockStore {
public:
    virtual ~BlockStore() = default;
    virtual std::string describe() const = 0;  // "host memory, 64 MiB", "directory 'kv'", "redis unix:/tmp/r.sock"
    virtual bool contains(const std::string& key) = 0;
    virtual bool put(const std::string& key, std::span<const std::uint8_t> record) = 0;
    virtual std::optional<std::vector<std::uint8_t>> get(const std::string& key) = 0;
    virtual void erase(const std::string& key) = 0;  // a rejected record goes, so it is not fetched again
    // Calls that failed for a reason other than a missing key (I/O, connection): the report shows them.
    std::int64_t errors() const { return errors_; }

protected:
    std::int64_t errors_ = 0;
};

// Host memory up to `capacity` bytes of records, least recently used first out.
class HostStore final : public BlockStore {
public:
    explicit HostStore(std::int64_t capacity = std::int64_t(1) << 30);
    HostStore(const HostStore& other);  // its own index, into its own list
    HostStore& operator=(HostStore other);
    std::string describe() const override;
    bool contains(const std::string& key) override { return map_.count(key) != 0; }
    bool put(const std::string& key, std::span<const std::uint8_t> record) override;
    std::optional<std::vector<std::uint8_t>> get(const std::string& key) override;
    void erase(const std::string& key) override;
    std::int64_t bytes() const { return bytes_; }
    std::size_t size() const { return map_.size(); }
    // The record under key, to damage in tests (null when absent).
    std::vector<std::uint8_t>* find(const std::string& key);

private:
    using Entry = std::pair<std::string, std::vector<std::uint8_t>>;
    std::int64_t capacity_, bytes_ = 0;
    std::list<Entry> lru_;  // most recently used first
    std::unordered_map<std::string, std::list<Entry>::iterator> map_;
};

// One file per record in a directory (created when missing, its parent must exist), written to a
// temporary file and renamed into place, so a reader in another process never sees half a record.
class DirStore final : public BlockStore {
public:
    explicit DirStore(std::string dir);
    std::string describe() const override;
    bool contains(const std::string& key) override;
    bool put(const std::string& key, std::span<const std::uint8_t> record) override;
    std::optional<std::vector<std::uint8_t>> get(const std::string& key) override;
    void erase(const std::string& key) override;
    std::string path(const std::string& key) const;  // the file of a key

private:
    std::string dir_;
};

// Opens a store from its description (one line Error otherwise):
//   host[:SIZE]           host memory, SIZE bytes (KiB, MiB, GiB; default 1 GiB)
//   dir:PATH              a directory
//   redis:HOST:PORT       Redis over TCP (hiredis)
//   redis:unix:PATH       Redis over a Unix socket
std::unique_ptr<BlockStore> open_block_store(const std::string& spec);
// Whether this kvlab was built with hiredis (redis: stores).
bool have_redis();

}  // namespace kvlab
