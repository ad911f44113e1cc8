// kvlab proofs: a prefix store that lies, as a store outside kvlab may (block_store.h): host
// memory whose records come back damaged one way. The store tests and `kvlab verify store` run the
// pool over it: every damaged record must be refused and recomputed, never used.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "block_store.h"

namespace kvlab {

enum class StoreDamage {
    none,
    flip,          // one bit of the record flipped anywhere
    flip_rows,     // one bit of the rows flipped (a checksum is all that can tell)
    truncate,      // cut short at a random length
    other_model,   // the model's identity changed, the checksum made to hold again
    other_format,  // the KV format's identity changed, the checksum made to hold again
    other_block,   // the first token changed, the checksum made to hold again
    swapped,       // another key's record (another block's rows, whole and checksummed)
    gone,          // missing: evicted, or the store restarted
};
std::string_view to_string(StoreDamage damage);

class HostileStore final : public BlockStore {
public:
    // Each get damages its record with probability `rate`.
    HostileStore(StoreDamage damage, double rate, std::uint64_t seed) : damage_(damage), rate_(rate), rng_(seed) {}
    HostStore inner;
    std::string describe() const override;
    bool contains(const std::string& key) override { return inner.contains(key); }
    bool put(const std::string& key, std::span<const std::uint8_t> record) override;
    void erase(const std::string& key) override { inner.erase(key); }
    std::optional<std::vector<std::uint8_t>> get(const std::string& key) override;
    std::int64_t damaged() const { return damaged_; }  // records handed out damaged (gone ones too)
    std::int64_t clean() const { return clean_; }      // records handed out whole

private:
    StoreDamage damage_;
    double rate_;
    std::mt19937_64 rng_;
    std::int64_t damaged_ = 0, clean_ = 0;
    std::vector<std::string> keys_;  // every key put, for `swapped`
};

// A record's checksum made to hold again after an edit (the layout of block_store.h).
void reseal_block_record(std::vector<std::uint8_t>& record);

}  // namespace kvlab
