// KV traces (cli/trace.h): .npy arrays and a JSON manifest written by `kvlab trace`, read back
// and compared by `kvlab diff-trace`. Round trips are bitwise; one flipped bit anywhere is found
// at its coordinates with its distance in ULPs; a damaged or foreign trace is one line of error.
#include <fmt/format.h>

#include <bit>
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "cli_util.h"
#include "config.h"
#include "npy.h"

using namespace kvlab;
using nlohmann::json;

namespace {

// A trace of a random model of a drawn shape (kvlab trace --shape ...), in a fresh folder.
struct Drawn {
    std::string shape, tokens;
    int steps;
};
Drawn draw(std::mt19937& rng) {
    const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    const int n_kv = pick(1, 2), n_heads = n_kv * pick(1, 2), head_size = 2 * pick(1, 8), vocab = pick(4, 40);
    const int max_seq = pick(3, 24), prompt = pick(1, max_seq - 1);
    std::string tokens;
    for (int i = 0; i < prompt; i++) {
        if (i) tokens += ',';
        tokens += std::to_string(pick(0, vocab - 1));
    }
    return {fmt::format("dim={},hidden_dim={},n_layers={},n_heads={},n_kv_heads={},vocab_size={},max_seq={}",
                        n_heads * head_size, pick(1, 20), pick(1, 3), n_heads, n_kv, vocab, max_seq),
            tokens, pick(0, max_seq - prompt)};
}

std::string trace(const Drawn& d, const std::string& name, const std::string& more = "") {
    const fs::path dir = scratch() / name;
    fs::remove_all(dir);
    const Run r = run_kvlab(fmt::format("trace --shape {} --model-seed 3 --tokens {} --steps {} --out {} {}", d.shape,
                                        d.tokens, d.steps, dir.string(), more));
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    return dir.string();
}

void copy_trace(const std::string& from, const std::string& to) {
    fs::remove_all(to);
    fs::copy(from, to, fs::copy_options::recursive);
}

// Flips bit `bit` of element i of array `name` and rewrites its SHA-256 in the manifest.
void flip(const std::string& dir, const std::string& name, std::int64_t i, int bit) {
    const fs::path file = fs::path(dir) / (name + ".npy");
    NpyArray a = parse_npy(slurp(file), name);
    a.f32[std::size_t(i)] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(a.f32[std::size_t(i)]) ^ (1u << bit));
    const std::string bytes = npy_bytes(a);
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    json m = json::parse(slurp(fs::path(dir) / "manifest.json"));
    m["arrays"][name]["sha256"] = sha256_hex(bytes);
    std::ofstream(fs::path(dir) / "manifest.json", std::ios::trunc) << m.dump();
}

}  // namespace

TEST_CASE("trace round trip: the same run on three cache layouts is bitwise equal", "[trace]") {
    std::mt19937 rng(11);
    for (int c = 0; c < 4; c++) {
        const Drawn d = draw(rng);
        const std::string a = trace(d, "rt_a", "--attention-weights");
        for (const char* cache : {"paged", "growing", "contiguous-seq"}) {
            const std::string b = trace(d, "rt_b", std::string("--attention-weights --cache ") + cache);
            const Run r = run_kvlab("diff-trace " + a + " " + b + " --json");
            INFO(d.shape << " " << cache << "\n" << r.out << r.err);
            REQUIRE(r.exit_code == 0);
            const json j = json::parse(r.out);
            CHECK(j["equal"] == true);
            CHECK(j["counts"]["k"]["differing"] == 0);
            CHECK(j["counts"]["k"]["elements"].get<std::int64_t>() > 0);
        }
    }
}

TEST_CASE("diff-trace counter-test: one flipped bit is found at its coordinates and nothing else differs",
          "[trace][counter]") {
    std::mt19937 rng(5);
    for (int c = 0; c < 6; c++) {
        const Drawn d = draw(rng);
        const std::string a = trace(d, "flip_a", "--attention-weights");
        const std::string b = (scratch() / "flip_b").string();
        copy_trace(a, b);
        const json m = json::parse(slurp(fs::path(a) / "manifest.json"));
        const char* names[] = {"k", "v", "logits", "attention"};
        const std::string name = names[c % 4];
        const std::vector<std::int64_t> shape = m["arrays"][name]["shape"];
        std::int64_t n = 1;
        for (std::int64_t s : shape) n *= s;
        const std::int64_t i = std::uniform_int_distribution<std::int64_t>(0, n - 1)(rng);
        flip(b, name, i, 0);  // the lowest mantissa bit: 1 ulp (unless the value was 0 or a NaN)
        const Run r = run_kvlab("diff-trace " + a + " " + b + " --json");
        INFO(d.shape << " " << name << "[" << i << "]\n" << r.out << r.err);
        REQUIRE(r.exit_code == 1);
        const json j = json::parse(r.out);
        CHECK(j["equal"] == false);
        CHECK(j["first"]["array"] == name);
        CHECK(j["counts"][name]["differing"] == 1);
        // The coordinates name element i back: its index in C order.
        const json& f = j["first"];
        std::int64_t at = 0;
        if (name == "k" || name == "v")
            at = ((f["layer"].get<std::int64_t>() * shape[1] + f["head"].get<int>()) * shape[2] +
                  f["position"].get<int>()) *
                     shape[3] +
                 f["channel"].get<int>();
        else if (name == "logits")
            at = f["step"].get<std::int64_t>() * shape[1] + f["index"].get<int>();
        else
            at =
                ((f["step"].get<std::int64_t>() * shape[1] + f["layer"].get<int>()) * shape[2] + f["head"].get<int>()) *
                    shape[3] +
                f["key"].get<int>();
        CHECK(at == i);
        const Run text = run_kvlab("diff-trace " + a + " " + b);
        CHECK_THAT(text.out,
                   Catch::Contains("first divergence: " + name) && Catch::Contains("the rest is bitwise equal"));
    }
}

TEST_CASE("diff-trace: the first divergence is the earliest computed, and ULPs are counted", "[trace]") {
    std::mt19937 rng(9);
    const Drawn d = draw(rng);
    const std::string a = trace(d, "order_a"), b = (scratch() / "order_b").string();
    copy_trace(a, b);
    flip(b, "logits", 0, 3);  // step 0's logits: 8 ulp
    const json m = json::parse(slurp(fs::path(a) / "manifest.json"));
    const std::vector<std::int64_t> k = m["arrays"]["k"]["shape"];
    flip(b, "k", k[2] * k[3] - 1, 0);  // layer 0, head 0, the last position's last channel: a later step when steps > 0
    const json j = json::parse(run_kvlab("diff-trace " + a + " " + b + " --json").out);
    const int last_step = int(m["run"]["steps"]);
    CHECK(j["first"]["array"] == (last_step == 0 ? "k" : "logits"));
    if (last_step > 0) CHECK(j["first"]["ulps"] == 8);
}

TEST_CASE("trace: a damaged, foreign or incomparable trace is refused in one line", "[trace]") {
    std::mt19937 rng(3);
    const Drawn d = draw(rng);
    const std::string a = trace(d, "bad_a"), b = (scratch() / "bad_b").string();
    copy_trace(a, b);
    {  // a changed file without a new SHA-256
        NpyArray k = parse_npy(slurp(fs::path(b) / "k.npy"), "k");
        k.f32[0] += 1.0f;
        std::ofstream(fs::path(b) / "k.npy", std::ios::binary | std::ios::trunc) << npy_bytes(k);
    }
    check_refused("diff-trace " + a + " " + b, "does not match the SHA-256");
    copy_trace(a, b);
    json m = json::parse(slurp(fs::path(b) / "manifest.json"));
    m["arrays"]["k"]["file"] = "../k.npy";
    std::ofstream(fs::path(b) / "manifest.json", std::ios::trunc) << m.dump();
    check_refused("diff-trace " + a + " " + b, "not a plain name");
    std::ofstream(fs::path(b) / "manifest.json", std::ios::trunc) << "{\"format\": \"something else\"}";
    check_refused("diff-trace " + a + " " + b, "not a kvlab trace");
    std::ofstream(fs::path(b) / "manifest.json", std::ios::trunc) << "\x93NUMPY not json";
    check_refused("diff-trace " + a + " " + b, "not a JSON object");
    check_refused("diff-trace " + a + " " + (scratch() / "no_such_trace").string(), "not a folder");
    Drawn other = d;
    other.shape += ",max_seq=30";
    check_refused("diff-trace " + a + " " + trace(other, "bad_c"), "cannot be compared");
    check_refused("trace --tokens 1 --out " + (scratch() / "t").string() + " --cache window", "not an exact variant");
}

TEST_CASE("npy files: kvlab's round-trip, and every malformed header is an Error", "[trace]") {
    NpyArray a;
    a.dtype = "<f4", a.shape = {2, 3}, a.f32 = {1, 2, 3, 4, 5, 6};
    const std::string bytes = npy_bytes(a);
    CHECK(bytes.size() % 64 == 24);  // a 64-byte-aligned header, then 24 bytes of data
    const NpyArray b = parse_npy(bytes, "x");
    CHECK(b.shape == a.shape);
    CHECK(b.f32 == a.f32);
    NpyArray one;
    one.dtype = "<i4", one.shape = {3}, one.i32 = {7, 8, 9};
    CHECK(npy_bytes(one).find("'shape': (3,)") != std::string::npos);
    CHECK(parse_npy(npy_bytes(one), "y").i32 == one.i32);
    for (std::size_t cut : {0, 5, 9, 40, 127}) CHECK_THROWS_AS(parse_npy(bytes.substr(0, cut), "cut"), Error);
    std::string other = bytes;
    other.replace(other.find("<f4"), 3, "<f8");
    CHECK_THROWS_WITH(parse_npy(other, "f8"), Catch::Contains("dtype '<f8'"));
    other = bytes;
    other.replace(other.find("False"), 5, "True ");
    CHECK_THROWS_WITH(parse_npy(other, "f"), Catch::Contains("Fortran order"));
    CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(sha256_hex(std::string(56, 'a')) == "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
}

TEST_CASE("golden counter-test: a kept trace with one changed bit is reported, a damaged one refused",
          "[trace][counter]") {
    const fs::path golden = scratch() / "golden";
    fs::remove_all(golden);
    fs::copy(KVLAB_GOLDEN_DIR, golden, fs::copy_options::recursive);
    const Run same = run_kvlab("golden --check " + golden.string());
    INFO(same.out << same.err);
    CHECK(same.exit_code == 0);
    CHECK_THAT(same.out, Catch::Contains("random-gqa ") && Catch::Contains("bitwise equal"));
    // One bit of a kept K row, with every SHA-256 above it rewritten: the rerun differs there.
    flip((golden / "random-gqa").string(), "k", 5, 0);
    json index = json::parse(slurp(golden / "golden.json"));
    for (json& t : index["traces"])
        if (t["name"] == "random-gqa")
            t["manifest_sha256"] = sha256_hex(slurp(golden / "random-gqa" / "manifest.json"));
    std::ofstream(golden / "golden.json", std::ios::trunc) << index.dump(2);
    const Run changed = run_kvlab("golden --check " + golden.string());
    INFO(changed.out << changed.err);
    CHECK(changed.exit_code == 1);
    CHECK_THAT(changed.out,
               Catch::Contains("random-gqa               cpu       DIFFERS: first divergence: k at step 0, "
                               "layer 0, head 0, position 0, channel 5"));
    // The manifest changed but golden.json was not told: refused before anything runs.
    flip((golden / "random-wide-int8").string(), "v", 0, 1);
    check_refused("golden --check " + golden.string(), "does not match golden.json's SHA-256");
}
