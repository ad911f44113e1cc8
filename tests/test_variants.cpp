// The cache variant registry (core/cache_factory.h): adding a variant is one entry plus its code.
// Every entry builds for several shapes at its defaults and presets, is exact where it says, keeps
// its parameters' stated bounds, has `kvlab verify` rows that pass, and has its row in docs/variants.md's
// variant table. Nothing here names a variant: a new entry is checked as soon as it is in the table.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "cache_factory.h"
#include "compare.h"
#include "decode.h"
#include "model.h"
#include "verify.h"

using namespace kvlab;

namespace {

// dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq: GQA, head_size 1 with
// max_seq 1, head_size 8 over 4 positions (a per-channel group longer than max_seq), and more.
const Config kConfigs[] = {
    {16, 24, 2, 4, 2, 40, 32},
    {3, 5, 1, 3, 1, 7, 1},
    {16, 8, 1, 2, 2, 11, 4},
    {12, 16, 2, 2, 1, 9, 20},
};

std::string read_file(const std::string& path) {
    std::ifstream f(path);
    REQUIRE(f.good());
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
}

// ------------------------------------------------------------------------------------------------
// The variant table of docs/variants.md, generated from the registry and compared row by row.

std::string table_row(const VariantInfo& v) {
    std::string params;
    for (const VariantParam& p : v.params)
        params += fmt::format("{}`{}`: {}; default {}; valid {}", params.empty() ? "" : "<br>", p.name, p.meaning,
                              p.default_text, p.valid_text);
    if (!v.presets.empty()) {
        params += "<br>presets";
        for (std::size_t i = 0; i < v.presets.size(); i++)
            params += fmt::format("{} `{}`", i ? "," : "", v.presets[i].label);
    }
    // Which KV formats it stores (core/kv_format.h): any, by --kv-format, or its own codes only.
    std::string formats;
    for (KVFormat f : kKVFormats) formats += fmt::format("{}{}", formats.empty() ? "" : ", ", kv_format_name(f));
    formats = v.kv_formats ? formats + " (`--kv-format`)" : "its own (no `--kv-format`)";
    return fmt::format("| `{}` | {} | {} | {} | {} |", v.name, v.summary, v.regime, formats,
                       params.empty() ? "none" : params);
}

const char* const kTableHeader = "| variant | what it is | exact? | KV formats | parameters |";

// "contiguous-head" from "| `contiguous-head` | ...".
std::string row_name(const std::string& row) {
    const std::size_t open = row.find('`'), close = row.find('`', open + 1);
    return open == std::string::npos || close == std::string::npos ? row : row.substr(open + 1, close - open - 1);
}

// What is wrong with the variant table in `markdown` (the lines after kTableHeader and its
// separator): a row missing, differing, extra or out of order. Empty: it is the registry's.
std::vector<std::string> table_problems(const std::string& markdown) {
    std::vector<std::string> rows, problems;
    std::istringstream in(markdown.substr(std::min(markdown.size(), markdown.find(kTableHeader))));
    std::string line;
    std::getline(in, line);
    if (line != kTableHeader) return {fmt::format("no table headed '{}'", kTableHeader)};
    std::getline(in, line);  // |---|...
    while (std::getline(in, line) && line.starts_with("|")) rows.push_back(line);
    std::vector<std::string> names;
    for (const std::string& row : rows) names.push_back(row_name(row));
    std::size_t last = 0;
    for (const VariantInfo& v : variant_table()) {
        const std::string want = table_row(v);
        const auto at = std::find(names.begin(), names.end(), v.name);
        if (at == names.end()) {
            problems.push_back(fmt::format("no row for `{}`; it should read\n{}", v.name, want));
            continue;
        }
        const std::size_t i = std::size_t(at - names.begin());
        if (rows[i] != want) problems.push_back(fmt::format("the row for `{}` should read\n{}", v.name, want));
        if (i < last) problems.push_back(fmt::format("the row for `{}` is out of the registry's order", v.name));
        last = i;
    }
    for (const std::string& name : names)
        if (!parse_variant(name) || to_string(*parse_variant(name)) != name)
            problems.push_back(fmt::format("a row for a variant the registry lacks: `{}`", name));
    return problems;
}

std::string without_line(std::string text, const std::string& starting) {
    const std::size_t at = text.find("\n" + starting);
    REQUIRE(at != std::string::npos);
    text.erase(at, text.find('\n', at + 1) - at);
    return text;
}

}  // namespace

TEST_CASE("registry: one entry per Variant in its order, one name each, exact or with a regime bound", "[variants]") {
    const auto table = variant_table();
    REQUIRE(!table.empty());
    std::set<std::string_view> names;
    for (std::size_t i = 0; i < table.size(); i++) {
        const VariantInfo& v = table[i];
        INFO(v.name);
        CHECK(std::size_t(v.id) == i);
        CHECK(&variant_info(v.id) == &v);
        CHECK(names.insert(v.name).second);
        if (!v.alias.empty()) CHECK(names.insert(v.alias).second);
        CHECK(parse_variant(v.name) == v.id);
        CHECK(to_string(v.id) == v.name);
        CHECK(!v.summary.empty());
        CHECK(!v.regime.empty());
        CHECK(v.build != nullptr);
        // Exact everywhere, or exact up to a bound verify checks on both sides.
        CHECK(v.exact == (v.exact_up_to == nullptr));
        CHECK(v.exact == v.exact_limit.empty());
        std::set<std::string_view> params;
        for (const VariantParam& p : v.params) CHECK(params.insert(p.name).second);
    }
    CHECK(!parse_variant("prefix"));  // one vocabulary: the old name is gone
    // bench measures against the first.
    CHECK(table[0].id == Variant::contiguous_head);
}

TEST_CASE("every variant builds at its defaults and presets, and is exact where the registry says", "[variants]") {
    for (const Config& c : kConfigs) {
        const Model m = random_model(c, 11);
        std::vector<int> tokens;
        for (int t = 0; t < c.max_seq; t++) tokens.push_back((7 * t + 3) % c.vocab_size);
        NaiveDecoder naive(m);
        for (const VariantSetting& s : variant_settings()) {
            const CacheSpec spec = setting_spec(s, c);
            INFO(describe(spec) << " on " << c.describe());
            CacheAndPool cp = make_cache(c, spec);
            REQUIRE(cp.cache);
            CHECK(!cp.cache->name().empty());
            const VariantInfo& v = variant_info(s.variant);
            const std::int64_t exact_up_to = v.exact ? c.max_seq : v.exact_up_to(spec);
            CachedDecoder cached(m, *cp.cache);
            for (int T = 1; T <= c.max_seq; T++) {
                const std::vector<float> logits = cached.decode(tokens[std::size_t(T - 1)]);
                if (T > exact_up_to) continue;
                const auto diff = first_difference(naive.forward(std::span(tokens).first(std::size_t(T))), logits);
                INFO("T = " << T);
                CHECK(!diff);
            }
        }
    }
}

TEST_CASE("each parameter's stated bounds: builds at both, make_cache refuses outside in one line", "[variants]") {
    for (const Config& c : kConfigs)
        for (const VariantInfo& v : variant_table())
            for (const VariantParam& p : v.params) {
                CacheSpec spec = default_spec(v.id, c);
                const IntRange r = p.valid(c, spec);
                INFO(v.name << " " << p.name << " in [" << r.lo << ", " << r.hi << "] on " << c.describe());
                CHECK(r.lo <= p.default_value(c));
                CHECK(p.default_value(c) <= r.hi);
                for (int value : {r.lo, r.hi}) {
                    if (value == kUnbounded) continue;
                    p.set(spec, value);
                    CacheAndPool out;
                    CHECK_NOTHROW(v.build(c, spec, host_memory(), {}, out));  // the constructor agrees
                }
                for (int value : {r.lo - 1, r.hi == kUnbounded ? r.lo - 2 : r.hi + 1}) {
                    p.set(spec, value);
                    CHECK_THROWS_WITH(make_cache(c, spec), Catch::Contains(fmt::format("{}: {}", v.name, p.name)) &&
                                                               Catch::Contains(std::to_string(value)));
                }
            }
}

TEST_CASE("every value a property draws is valid and builds, given those drawn before it", "[variants]") {
    for (const Config& c : kConfigs)
        for (const VariantInfo& v : variant_table()) {
            // Each parameter over its property values, the others at their defaults.
            for (std::size_t i = 0; i < v.params.size(); i++) {
                CacheSpec spec = default_spec(v.id, c);
                const std::vector<int> values = v.params[i].property(c, spec);
                REQUIRE(!values.empty());
                for (int value : values) {
                    v.params[i].set(spec, value);
                    INFO(describe(spec) << " on " << c.describe());
                    CHECK_NOTHROW(make_cache(c, spec));
                }
            }
        }
}

TEST_CASE("presets and settings: name=value by the registry's parameters, bad ones refused", "[variants]") {
    CacheSpec spec = default_spec(Variant::window, kConfigs[0]);
    apply_settings(spec, "sinks=1,window=2");
    CHECK(describe(spec) == "window(sinks=1,window=2,chunk=0)");
    CHECK_THROWS_WITH(apply_settings(spec, "bits=4"), Catch::Contains("window: 'bits=4' is not one of its parameters"));
    CHECK_THROWS_WITH(apply_settings(spec, "sinks"), Catch::Contains("'sinks'"));
    CHECK_THROWS_WITH(apply_settings(spec, "sinks=two"), Catch::Contains("'two' is not an integer"));
    for (const VariantSetting& s : variant_settings()) {
        INFO(s.name);
        CHECK(parse_variant(s.name) == (s.preset ? std::nullopt : std::optional(s.variant)));
        if (s.preset) CHECK(s.name == fmt::format("{}-{}", to_string(s.variant), s.preset->label));
    }
}

TEST_CASE("every variant and preset has kvlab verify rows that keep its promise", "[variants][verify]") {
    const std::vector<std::string> names = verify_names();
    for (const VariantInfo& v : variant_table()) {
        INFO(v.name);
        CHECK(std::find(names.begin(), names.end(), v.name) != names.end());
        const std::vector<VariantSetting> settings = variant_settings(v.id);
        const std::vector<VerifyRow> rows = verify(v.name, {40, 20261126});
        REQUIRE(rows.size() == settings.size());
        for (std::size_t i = 0; i < rows.size(); i++) {
            INFO(rows[i].name << ": " << rows[i].result << "; " << rows[i].counterexample);
            CHECK(rows[i].name == settings[i].name);
            CHECK(rows[i].kind == (v.exact ? "exact" : "approximate"));
            CHECK(rows[i].ok);
            if (v.exact) CHECK(rows[i].result == "bitwise equal");
        }
    }
}

TEST_CASE("the variant table of docs/variants.md is the registry's, row for row", "[variants][docs]") {
    const std::string readme = read_file(KVLAB_SOURCE_DIR "/docs/variants.md");
    const std::vector<std::string> problems = table_problems(readme);
    if (!problems.empty()) {
        // The whole table, unwrapped, to paste.
        std::ofstream out("variant-table.md");
        out << kTableHeader << "\n|---|---|---|---|---|\n";
        for (const VariantInfo& v : variant_table()) out << table_row(v) << "\n";
        UNSCOPED_INFO("the registry's table is in " << (std::filesystem::current_path() / "variant-table.md"));
    }
    for (const std::string& p : problems) UNSCOPED_INFO(p);
    CHECK(problems.empty());

    // Counter-tests: a row missing, a row that says otherwise, a row for no variant.
    const VariantInfo& last = variant_table().back();
    const std::string row = fmt::format("| `{}` |", last.name);
    const auto missing = table_problems(without_line(readme, row));
    REQUIRE(missing.size() == 1);
    CHECK(missing[0].starts_with(fmt::format("no row for `{}`", last.name)));
    std::string edited = readme;
    const std::size_t at = edited.find(std::string(last.regime), edited.find(row));
    REQUIRE(at != std::string::npos);
    edited.replace(at, last.regime.size(), "bitwise");
    CHECK(table_problems(edited).at(0).starts_with(fmt::format("the row for `{}` should read", last.name)));
    edited = readme;
    edited.insert(edited.find(row), "| `prefix` | paged with prefix caching | bitwise | none |\n");
    CHECK(table_problems(edited).at(0) == "a row for a variant the registry lacks: `prefix`");
    CHECK(!table_problems("no table here").empty());
}
