#include "hostile_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

#include "npy.h"

namespace kvlab {

std::string_view to_string(StoreDamage damage) {
    switch (damage) {
        case StoreDamage::none: return "none";
        case StoreDamage::flip: return "a bit flipped";
        case StoreDamage::flip_rows: return "a bit of the rows flipped";
        case StoreDamage::truncate: return "truncated";
        case StoreDamage::other_model: return "another model's";
        case StoreDamage::other_format: return "another format's";
        case StoreDamage::other_block: return "another block's tokens";
        case StoreDamage::swapped: return "another key's record";
        case StoreDamage::gone: return "gone";
    }
    return "?";
}

void reseal_block_record(std::vector<std::uint8_t>& record) {
    const std::size_t body = record.size() - 64;  // the SHA-256 in hex ends the record
    const std::string sum = sha256_hex(std::string_view(reinterpret_cast<const char*>(record.data()), body));
    std::copy(sum.begin(), sum.end(), record.begin() + std::ptrdiff_t(body));
}

std::string HostileStore::describe() const {
    return fmt::format("{} ({} with probability {})", inner.describe(), to_string(damage_), rate_);
}

bool HostileStore::put(const std::string& key, std::span<const std::uint8_t> record) {
    if (std::find(keys_.begin(), keys_.end(), key) == keys_.end()) keys_.push_back(key);
    return inner.put(key, record);
}

std::optional<std::vector<std::uint8_t>> HostileStore::get(const std::string& key) {
    std::optional<std::vector<std::uint8_t>> r = inner.get(key);
    if (!r) return r;
    if (damage_ == StoreDamage::none || !std::bernoulli_distribution(rate_)(rng_)) {
        clean_++;
        return r;
    }
    std::vector<std::uint8_t>& b = *r;
    const auto pick = [&](std::size_t lo, std::size_t hi) {  // [lo, hi)
        return std::uniform_int_distribution<std::size_t>(lo, hi - 1)(rng_);
    };
    // Header: 64 bytes; then block_size tokens and the rows; then 64 of checksum (block_store.h).
    switch (damage_) {
        case StoreDamage::none: break;
        case StoreDamage::flip: b[pick(0, b.size())] ^= std::uint8_t(1u << pick(0, 8)); break;
        case StoreDamage::flip_rows: b[pick(b.size() / 2, b.size() - 64)] ^= std::uint8_t(1u << pick(0, 8)); break;
        case StoreDamage::truncate: b.resize(pick(0, b.size())); break;
        case StoreDamage::other_model: b[8] ^= 1, reseal_block_record(b); break;
        case StoreDamage::other_format: b[16] ^= 1, reseal_block_record(b); break;
        case StoreDamage::other_block: b[64] ^= 1, reseal_block_record(b); break;
        case StoreDamage::swapped: {
            std::erase_if(keys_, [&](const std::string& k) { return !inner.contains(k); });  // erased since
            if (keys_.size() < 2) {
                clean_++;
                return r;  // nothing else to hand out
            }
            std::string other = key;
            while (other == key) other = keys_[pick(0, keys_.size())];
            b = *inner.get(other);
            break;
        }
        case StoreDamage::gone: damaged_++; return std::nullopt;
    }
    damaged_++;
    return r;
}

}  // namespace kvlab
