// kvlab core: JSON as text, whatever bytes its strings hold. nlohmann's dump() throws on a string
// that is not UTF-8 (a path or prompt of raw bytes, a byte-fallback token's piece); kvlab's JSON
// escapes such bytes as \xNN (valid_utf8) instead. For the programs that link nlohmann_json.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "build_info.h"
#include "config.h"

namespace kvlab {

// j's strings and keys, each made valid UTF-8.
inline nlohmann::json with_valid_utf8(const nlohmann::json& j) {
    if (j.is_string()) return valid_utf8(j.get_ref<const std::string&>());
    if (j.is_array()) {
        nlohmann::json out = nlohmann::json::array();
        for (const auto& v : j) out.push_back(with_valid_utf8(v));
        return out;
    }
    if (j.is_object()) {
        nlohmann::json out = nlohmann::json::object();
        for (const auto& [key, v] : j.items()) out[valid_utf8(key)] = with_valid_utf8(v);
        return out;
    }
    return j;
}

// j.dump(indent), never throwing on bytes: valid UTF-8 text is dumped as is, the rest after
// with_valid_utf8 (the walk costs nothing for JSON that was already valid).
inline std::string json_text(const nlohmann::json& j, int indent = -1) {
    try {
        return j.dump(indent);
    } catch (const nlohmann::json::type_error&) {
        return with_valid_utf8(j).dump(indent);
    }
}

// Which kvlab wrote a JSON document (build_info.h), as the "kvlab" member every top-level
// document carries: a result quoted in a bug report says what produced it.
inline nlohmann::json build_json() {
    const BuildInfo& b = build_info();
    return {{"version", b.version},       {"commit", b.commit},         {"compiler", b.compiler},
            {"build_type", b.build_type}, {"sanitizers", b.sanitizers}, {"native", b.native}};
}

// A top-level JSON document (a --json output, a trace manifest, a layout file) as text, with
// build_json() under "kvlab".
inline std::string json_document(nlohmann::json j, int indent = 2) {
    j["kvlab"] = build_json();
    return json_text(j, indent);
}

}  // namespace kvlab
