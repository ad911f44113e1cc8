#include "kv_format.h"

#include <fmt/format.h>

#include "config.h"

namespace kvlab {

const char* kv_format_name(KVFormat format) {
    switch (format) {
        case KVFormat::fp32: return "fp32";
        case KVFormat::bf16: return "bf16";
        case KVFormat::fp16: return "fp16";
        case KVFormat::fp8_e5m2: return "fp8-e5m2";
        case KVFormat::fp8_e4m3: return "fp8-e4m3";
        case KVFormat::int8: return "int8";
        case KVFormat::int4: return "int4";
    }
    return "?";
}

KVFormat parse_kv_format(std::string_view name) {
    for (KVFormat f : kKVFormats)
        if (name == kv_format_name(f)) return f;
    throw Error(fmt::format("unknown KV format '{}' (fp32, bf16, fp16, fp8-e5m2, fp8-e4m3, int8, int4)", name));
}

}  // namespace kvlab
