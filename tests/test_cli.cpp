// The kvlab program end to end: every command runs, and bad input gets one clear line on
// stderr and a non-zero exit, never a crash, a hang or a silent truncation.
#include <rapidcheck.h>
#include <rapidcheck/catch.h>
#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cache_factory.h"
#include "checkpoint.h"
#include "cli_util.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

// A small random model written as a llama2.c checkpoint by `kvlab export`.
fs::path exported_model(const std::string& name, const std::string& shape) {
    const fs::path p = scratch() / name;
    const Run r = run_kvlab("export --shape " + shape + " --seed 3 " + p.string());
    REQUIRE(r.exit_code == 0);
    return p;
}

const char* const kTiny = "dim=16,hidden_dim=24,n_layers=2,n_heads=4,n_kv_heads=2,vocab_size=40,max_seq=32";

void write_ints(const fs::path& p, std::initializer_list<std::int32_t> header, std::size_t extra_bytes) {
    std::ofstream f(p, std::ios::binary);
    for (std::int32_t v : header) f.write(reinterpret_cast<const char*>(&v), 4);
    const std::string zeros(extra_bytes, '\0');
    f.write(zeros.data(), std::streamsize(zeros.size()));
}

}  // namespace

TEST_CASE("kvlab --help and each command's --help succeed", "[cli]") {
    for (const char* args : {"--help", "demo --help", "generate --help", "speculate --help", "bench --help",
                             "export --help", "verify --help", "memory --help", "pool --help"}) {
        const Run r = run_kvlab(args);
        INFO(args);
        CHECK(r.exit_code == 0);
        CHECK(r.out.find("Usage") != std::string::npos);
    }
}

TEST_CASE("unknown commands and options are one-line errors", "[cli][errors]") {
    check_refused("", "subcommand");
    check_refused("frobnicate", "frobnicate");
    check_refused("demo --bogus", "--bogus");
    check_refused("demo --steps 0", "steps");
    check_refused("demo --steps many", "steps");
    check_refused("generate --top-p 1.5", "top-p");
    check_refused("generate --seed 0", "seed");
    check_refused("export", "out");
    check_refused("export --shape dim=16,bogus=3 x.bin", "unknown field 'bogus'");
    check_refused("export --shape dim=sixteen x.bin", "'sixteen' is not an integer");
    check_refused("export --shape dim=16,n_heads=3 x.bin", "n_heads (3) must divide dim (16)");
}

TEST_CASE("messages quote user text on one printable line, and name the option that was wrong", "[cli][errors]") {
    // one_line: controls escaped (ESC as \x1b, C1 controls too), whole UTF-8 characters kept.
    CHECK(kvlab::one_line("a\nb\tc\x1b[2J\x7f") == "a\\nb\\tc\\x1b[2J\\x7f");
    CHECK(kvlab::one_line("caf\xC3\xA9 \xC2\x9B \xC3") == "caf\xC3\xA9 \\xc2\\x9b \\xc3");
    // The shell's printf makes the control characters (std::system runs sh, which has no $'...').
    const auto refused_printable = [](const std::string& args, const std::string& needle) {
        check_refused(args, needle);
        const Run r = run_kvlab(args);
        INFO(args << "\nstderr: " << r.err);
        CHECK(std::all_of(r.err.begin(), r.err.end(), [](char ch) { return ch == '\n' || (ch >= 0x20 && ch < 0x7f); }));
    };
    refused_printable(R"x(export --shape "$(printf 'dim=6\n4')" x.bin)x", R"x('6\n4' is not an integer for dim)x");
    refused_printable(R"x("$(printf 'fro\nb')")x", R"x(unknown command 'fro\nb')x");
    refused_printable(R"x(pool --script "$(printf 'new a 1,2; bogus\033[2J')")x", R"x('bogus\x1b[2J')x");
    refused_printable(R"x(demo --steps "$(printf '\033[31m')")x", R"x(\x1b[31m)x");
    check_refused("generate --seed -1", "--seed: -1 is negative");
    check_refused("demo --model-seed -1", "--model-seed: -1 is negative");
    check_refused("view --speed nan", "--speed: nan is not a finite number");
    check_refused("generate --top-p -nan", "--top-p: -nan is not a finite number");
    // The figure past int64 is the requests' reservation, and nothing is printed before the refusal.
    const Run r = run_kvlab("memory --requests 1048576 --context 16777216");
    CHECK(r.out.empty());
    check_refused("memory --requests 1048576 --context 16777216", "--requests 1048576 x --context 16777216");
    check_refused("memory --batch 1048576 --context 16777216 --model gpt3-175b",
                  "--context 16777216 x --batch 1048576");
}

// What fuzz_options checks, as a property: any --shape text either parses or is refused with one
// line of printable text, whatever bytes its field names and values hold.
TEST_CASE("shape specs: any --shape text parses or is refused in one printable line", "[cli][errors]") {
    rc::prop("Config::parse of arbitrary field names and values", [] {
        const std::vector<std::string> pieces = {"dim", "n_heads", "max_seq", "=",    ",",    "7", "-1",
                                                 "x",   "\n",      "\x1b",    "\x7f", "\xff", " ", "99999999999"};
        std::string spec;
        for (int i = *kvlab::test::full_range(0, 12); i > 0; i--) {
            const std::string& p = pieces[std::size_t(*kvlab::test::full_range(0, int(pieces.size()) - 1))];
            spec += p;
        }
        try {
            (void)kvlab::Config::parse(spec, kvlab::stories260k_shape());
        } catch (const kvlab::Error& e) {
            const std::string m = e.what();
            for (unsigned char ch : m)
                if (ch < 0x20 || ch == 0x7f || ch >= 0x80)
                    RC_FAIL(
                        fmt::format("the refusal of shape '{}' holds byte {:#04x}", kvlab::one_line(spec), int(ch)));
        }
    });
}

TEST_CASE("bad checkpoints are one-line errors: missing, truncated, oversized, nonsensical headers", "[cli][errors]") {
    check_refused("demo --model /nonexistent/model.bin", "/nonexistent/model.bin");
    const fs::path good = exported_model("good.bin", kTiny);
    const std::string bytes = slurp(good);

    const fs::path truncated = scratch() / "truncated.bin";
    std::ofstream(truncated, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size() - 1));
    check_refused("demo --model " + truncated.string(), "truncated");

    const fs::path oversized = scratch() / "oversized.bin";
    std::ofstream(oversized, std::ios::binary).write((bytes + "xyz").data(), std::streamsize(bytes.size() + 3));
    check_refused("demo --model " + oversized.string(), "trailing");

    const fs::path empty = scratch() / "empty.bin";
    std::ofstream(empty, std::ios::binary).flush();
    check_refused("demo --model " + empty.string(), "empty.bin");

    const fs::path bad = scratch() / "bad_header.bin";
    write_ints(bad, {64, 172, 0, 8, 4, 512, 512}, 1024);
    check_refused("demo --model " + bad.string(), "n_layers");
    write_ints(bad, {64, 172, 5, 3, 1, 512, 512}, 1024);
    check_refused("demo --model " + bad.string(), "n_heads");
    write_ints(bad, {64, 172, 5, 8, 3, 512, 512}, 1024);
    check_refused("demo --model " + bad.string(), "n_kv_heads");
    write_ints(bad, {1 << 30, 1 << 30, 1 << 30, 1, 1, 1 << 30, 1 << 30}, 1024);
    check_refused("demo --model " + bad.string(), "too large");
}

TEST_CASE("bad prompts are one-line errors: ids outside the vocabulary, too long for max_seq", "[cli][errors]") {
    const fs::path model = exported_model("prompt.bin", kTiny);
    check_refused("demo --model " + model.string() + " --tokens 1,40", "outside the vocabulary");
    check_refused("demo --model " + model.string() + " --tokens 1,-3", "outside the vocabulary");
    check_refused("demo --model " + model.string() + " --tokens 1,x", "--tokens: 'x' is not an integer");
    check_refused("bench --lengths 8,,16", "--lengths");
    check_refused("demo --model " + model.string() + " --tokens 1,2 --steps 31", "max_seq");
    check_refused("generate --model " + model.string() + " --tokens 1,2 --steps 32", "max_seq");
    check_refused("demo --model " + model.string() + " --prompt hello", "tokenizer");
    check_refused("bench --shape " + std::string(kTiny) + " --lengths 8,33", "max_seq");
}

TEST_CASE("a tokenizer that does not fit the model's vocabulary is a one-line error", "[cli][errors]") {
    const fs::path model = exported_model("vocab.bin", kTiny);
    const fs::path tok = scratch() / "tok_small.bin";
    {
        // Ten entries for a model of vocab_size 40.
        std::ofstream f(tok, std::ios::binary);
        const std::int32_t max_len = 1;
        f.write(reinterpret_cast<const char*>(&max_len), 4);
        for (int i = 0; i < 10; i++) {
            const float score = 0.0f;
            const std::int32_t len = 1;
            const char piece = char('a' + i);
            f.write(reinterpret_cast<const char*>(&score), 4);
            f.write(reinterpret_cast<const char*>(&len), 4);
            f.write(&piece, 1);
        }
    }
    check_refused("demo --model " + model.string() + " --tokenizer " + tok.string(), "tok_small.bin");
    check_refused("demo --model " + model.string() + " --tokenizer /nonexistent/tok.bin", "/nonexistent/tok.bin");
}

TEST_CASE("kvlab demo on an exported model: every step bitwise equal, FLOPs counted", "[cli][demo]") {
    const fs::path model = exported_model("demo.bin", kTiny);
    const Run r = run_kvlab("demo --model " + model.string() + " --tokens 1,5,7 --steps 12 --json");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["summary"]["all_bitwise_equal"] == true);
    CHECK(j["steps"].size() == 13);
    CHECK(j["summary"]["kv_positions"] == 15);
    CHECK(j["summary"]["kv_bytes"] == 2 * 4 * 2 * 15 * 2 * 4);
    // Naive recomputes the prefix: its FLOPs per step grow with T, the cached path's stay flat.
    const auto& steps = j["steps"];
    CHECK(steps[12]["naive_flops"].get<double>() > 4 * steps[1]["naive_flops"].get<double>() / 1.5);
    CHECK(steps[12]["naive_flops"].get<double>() > 10 * steps[12]["cached_flops"].get<double>());
}

TEST_CASE("kvlab demo, generate, speculate and verify with --attention tiled: bitwise equal at every step",
          "[cli][tiled]") {
    const fs::path model = exported_model("demo.bin", kTiny);
    for (const char* device : {"cpu", "cpu,gpu-host"})
        for (const char* tile : {"1", "3", "256"}) {
            const Run r = run_kvlab("demo --model " + model.string() + " --tokens 1,5,7 --steps 12 --json --device " +
                                    device + " --attention tiled --tile " + tile + " --kv-format int8");
            INFO(r.err);
            REQUIRE(r.exit_code == 0);
            const auto j = nlohmann::json::parse(r.out);
            CHECK(j["summary"]["all_bitwise_equal"] == true);
            CHECK(j["attention"]["kind"] == "tiled");
            CHECK(j["attention"]["tile"] == std::stoi(tile));
        }
    const Run g =
        run_kvlab("generate --model " + model.string() + " --tokens 1,5 --steps 8 --attention tiled --tile 2");
    CHECK(g.exit_code == 0);
    const Run sp = run_kvlab("speculate --model " + model.string() +
                             " --tokens 1,5 --steps 8 --reps 1 --draft self --attention tiled --tile 2 --json");
    INFO(sp.err);
    CHECK(sp.exit_code == 0);
    const Run p = run_kvlab("pool --model " + model.string() +
                            " --block-size 2 --attention tiled --tile 2 --script \"new a 1,2,3,4,5; new b 1,2,3,4,9; "
                            "fork a c; append c 7; show\"");
    INFO(p.out << p.err);
    CHECK(p.exit_code == 0);
    CHECK(p.out.find("3 of 3 prefills bitwise equal to naive decode") != std::string::npos);
    const Run b = run_kvlab(
        "bench --shape stories260K --attention simple,tiled --tile 8 --kv-format fp32,int8 "
        "--lengths 40,64 --reps 1 --json");
    INFO(b.err);
    REQUIRE(b.exit_code == 0);
    const auto jb = nlohmann::json::parse(b.out);
    CHECK(jb["formats"].size() == 8);  // 2 lengths x 2 formats x 2 attentions
    CHECK(jb["formats"][1]["attention"] == "tiled");
    CHECK(jb["formats"][1]["tile"] == 8);
    const Run v = run_kvlab("verify tiled-attention --cases 20 --attention tiled --tile 5 --json");
    CHECK(v.exit_code == 0);
    CHECK(nlohmann::json::parse(v.out)["attention"]["tile"] == 5);
    for (const char* command : {"demo", "generate", "speculate", "verify", "pool --script show", "bench"}) {
        check_refused(fmt::format("{} --attention flash", command), "unknown attention 'flash' (simple, tiled)");
        for (const char* tile : {"0", "300"})
            check_refused(fmt::format("{} --attention tiled --tile {}", command, tile),
                          fmt::format("attention tile {} is out of range", tile));
    }
}

TEST_CASE("kvlab generate and demo --logprobs: each token's log-probability, rescored bit for bit by one prefill",
          "[cli][logprobs]") {
    const fs::path model = exported_model("demo.bin", kTiny);
    for (const char* extra : {"", " --attention tiled --tile 2", " --kv-format fp8-e4m3"}) {
        const Run g =
            run_kvlab("generate --model " + model.string() + " --tokens 1,5 --steps 9 --logprobs --json" + extra);
        INFO(g.err);
        REQUIRE(g.exit_code == 0);
        const auto j = nlohmann::json::parse(g.out);
        CHECK(j["rescored_logprobs_bitwise_equal"] == true);
        REQUIRE(j["logprobs"].size() == j["generated_tokens"].size());
        for (const auto& lp : j["logprobs"]) CHECK(lp.get<double>() <= 0.0);
        const Run d = run_kvlab("demo --model " + model.string() + " --tokens 1,5 --steps 9 --logprobs --json" + extra);
        REQUIRE(d.exit_code == 0);
        const auto jd = nlohmann::json::parse(d.out);
        CHECK(jd["summary"]["rescored_logprobs_bitwise_equal"] == true);
        CHECK(jd["logprobs"].size() == 9);
    }
    // Greedy decode: the demo and generate choose the same tokens, with the same log-probabilities.
    const auto g = nlohmann::json::parse(
        run_kvlab("generate --model " + model.string() + " --tokens 1,5 --steps 9 --logprobs --json").out);
    const auto d = nlohmann::json::parse(
        run_kvlab("demo --model " + model.string() + " --tokens 1,5 --steps 9 --logprobs --json").out);
    for (std::size_t i = 0; i < g["logprobs"].size(); i++) CHECK(g["logprobs"][i] == d["logprobs"][i]);
    const Run text = run_kvlab("generate --model " + model.string() + " --tokens 1,5 --steps 4 --logprobs");
    CHECK(text.out.find("one prefill of the text rescored every one bit for bit") != std::string::npos);
}

TEST_CASE("kvlab demo --kv-format: cached equals the format-aware naive decode, and the drift from fp32 is reported",
          "[cli][demo]") {
    const fs::path model = exported_model("demo.bin", kTiny);
    for (const char* format : {"bf16", "fp16", "fp8-e5m2", "fp8-e4m3", "int8", "int4"}) {
        const Run r =
            run_kvlab("demo --model " + model.string() + " --tokens 1,5,7 --steps 12 --json --kv-format " + format);
        INFO(format << ": " << r.err);
        REQUIRE(r.exit_code == 0);
        const auto j = nlohmann::json::parse(r.out);
        CHECK(j["kv_format"] == format);
        CHECK(j["summary"]["all_bitwise_equal"] == true);
        // The format moves the logits away from fp32 naive decode's, by a measured amount.
        double drift = 0;
        for (const auto& step : j["steps"]) drift = std::max(drift, step["drift_from_fp32"].get<double>());
        CHECK(drift == j["summary"]["max_drift_from_fp32"].get<double>());
        CHECK(drift > 0);
    }
    const Run fp32 = run_kvlab("demo --model " + model.string() + " --tokens 1,5,7 --steps 4 --json");
    REQUIRE(fp32.exit_code == 0);
    CHECK(!nlohmann::json::parse(fp32.out)["summary"].contains("max_drift_from_fp32"));
    const Run bad = run_kvlab("demo --model " + model.string() + " --steps 2 --kv-format fp9");
    CHECK(bad.exit_code != 0);
    CHECK(bad.err == "kvlab: error: unknown KV format 'fp9' (fp32, bf16, fp16, fp8-e5m2, fp8-e4m3, int8, int4)\n");
}

TEST_CASE("kvlab demo and generate --kv-calibrate: fp8 scales from a prompt, still bitwise equal to the naive decode",
          "[cli][demo]") {
    const std::string args =
        "--tokens 1,403,407,261 --steps 40 --json --kv-format fp8-e4m3 --kv-calibrate \"Once upon a time\"";
    const Run demo = run_kvlab("demo " + args), gen = run_kvlab("generate " + args);
    INFO(demo.err << gen.err);
    REQUIRE(demo.exit_code == 0);
    REQUIRE(gen.exit_code == 0);
    const auto d = nlohmann::json::parse(demo.out), g = nlohmann::json::parse(gen.out);
    CHECK(d["summary"]["all_bitwise_equal"] == true);
    const auto& scales = d["summary"]["kv_scales"];
    REQUIRE(scales.size() == 2 * 5);  // the default model's 5 layers, K and V
    for (const auto& x : scales) CHECK(x.get<double>() > 0);
    CHECK(scales != nlohmann::json(std::vector<double>(10, 1.0)));
    CHECK(g["generated_tokens"] == d["generated_tokens"]);
    // Without the scales the text is another: generate must have used them.
    const Run plain = run_kvlab("generate --tokens 1,403,407,261 --steps 40 --json --kv-format fp8-e4m3");
    REQUIRE(plain.exit_code == 0);
    CHECK(nlohmann::json::parse(plain.out)["generated_tokens"] != g["generated_tokens"]);
    check_refused("demo --kv-format bf16 --kv-calibrate hello", "bf16 takes none");
}

TEST_CASE("kvlab generate --kv-format decodes greedily as the demo's format-aware runs do", "[cli][demo]") {
    // The demo checks every step against the format-aware naive decode; generate's greedy tokens
    // in the same format must be the demo's. On the default model (stories260K, or the random
    // model of its shape) fp8-e5m2 changes the greedy text within 64 steps, so a generate that
    // ignored the format would not pass.
    std::map<std::string, nlohmann::json> tokens;
    for (const char* format : {"fp32", "bf16", "fp8-e5m2"}) {
        const std::string args = std::string("--tokens 1,403,407,261 --steps 64 --json --kv-format ") + format;
        const Run demo = run_kvlab("demo " + args), gen = run_kvlab("generate " + args);
        INFO(format << ": " << demo.err << gen.err);
        REQUIRE(demo.exit_code == 0);
        REQUIRE(gen.exit_code == 0);
        const auto d = nlohmann::json::parse(demo.out), g = nlohmann::json::parse(gen.out);
        CHECK(g["kv_format"] == format);
        CHECK(g["generated_tokens"] == d["generated_tokens"]);
        tokens[format] = g["generated_tokens"];
    }
    CHECK(tokens["fp8-e5m2"] != tokens["fp32"]);
    const Run bad = run_kvlab("generate --steps 2 --kv-format int3");
    CHECK(bad.exit_code != 0);
    CHECK(bad.err == "kvlab: error: unknown KV format 'int3' (fp32, bf16, fp16, fp8-e5m2, fp8-e4m3, int8, int4)\n");
}

TEST_CASE("kvlab speculate --kv-format: speculative decoding in a format gives that format's greedy decode",
          "[cli][speculate]") {
    // Its tokens are generate's in the same format (checked against the format-aware naive decode
    // above), and bitwise equal to plain greedy decode in it, with the target as its own draft
    // (every draft accepted) and with a random draft (every draft rejected).
    for (const char* format : {"bf16", "fp8-e5m2"}) {
        const std::string args = std::string("--tokens 1,403,407,261 --steps 64 --json --kv-format ") + format;
        const Run gen = run_kvlab("generate " + args);
        REQUIRE(gen.exit_code == 0);
        const auto g = nlohmann::json::parse(gen.out);
        for (const char* draft : {"self", "random"}) {
            const Run spec = run_kvlab("speculate --draft " + std::string(draft) + " --reps 1 " + args);
            INFO(format << ", draft " << draft << ": " << spec.err);
            REQUIRE(spec.exit_code == 0);
            const auto j = nlohmann::json::parse(spec.out);
            CHECK(j["kv_format"] == format);
            CHECK(j["bitwise_equal"] == true);
            CHECK(j["generated_tokens"] == g["generated_tokens"]);
        }
    }
    check_refused("speculate --kv-format int3", "unknown KV format 'int3'");
}

TEST_CASE("kvlab demo with no arguments runs the main job", "[cli][demo]") {
    const Run r = run_kvlab("demo --steps 8");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find("9 of 9 steps bitwise equal") != std::string::npos);
}

TEST_CASE("kvlab bench on a tiny shape: all decoders bitwise equal", "[cli][bench]") {
    const Run r = run_kvlab("bench --shape " + std::string(kTiny) + " --lengths 1,8,32 --reps 1 --json");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["all_bitwise_equal"] == true);
    CHECK(j["rows"].size() == 3);
    // The variant table: a row per registry setting, in its order; every exact one equal to the
    // contiguous cache, bit for bit.
    const std::vector<kvlab::VariantSetting> settings = kvlab::variant_settings();
    REQUIRE(j["variants"].size() == settings.size());
    for (std::size_t i = 0; i < settings.size(); i++) {
        const auto& v = j["variants"][i];
        CHECK(v["variant"] == settings[i].name);
        CHECK(v["exact"] == kvlab::is_exact(settings[i].variant));
        if (v["exact"] == true) CHECK(v["bitwise_equal_contiguous"] == true);
    }
    // B shares 24 of its 32 tokens with A: whole blocks of 16 of them come from the cache.
    CHECK(j["prefix_cache"]["positions_not_recomputed"] == 16);
}

TEST_CASE(
    "kvlab bench --background-load gives a row per thread count and load with bitwise logits and leaves no load behind",
    "[cli][bench][threads]") {
    const Run r = run_kvlab("bench --shape " + std::string(kTiny) +
                            " --lengths 32 --reps 2 --threads 3 --background-load 2 --json");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["steps"] == 31);
    CHECK(j["threads_choice"]["auto"] == false);
    REQUIRE(j["rows"].size() == 6);  // threads 1, 2, 3, idle then beside 2 busy processes
    for (std::size_t i = 0; i < 6; i++) {
        const auto& row = j["rows"][i];
        CHECK(row["threads"] == int(i % 3) + 1);
        CHECK(row["background_load"] == (i < 3 ? 0 : 2));
        CHECK(row["bitwise_equal_naive"] == true);
        CHECK(row["decode_tokens_per_second"].get<double>() > 0);
        CHECK(row["weights_read_gb_per_second"].get<double>() ==
              Approx(j["weight_bytes"].get<double>() * row["decode_tokens_per_second"].get<double>() / 1e9));
    }
    REQUIRE(j["memory_read_gb_per_second_idle"].size() == 3);  // on 1, 2 and 3 threads
    for (const auto& rate : j["memory_read_gb_per_second_idle"]) CHECK(rate.get<double>() > 0);
    // The busy processes are kvlab's children, killed and reaped before it exits: run in a session
    // of its own, kvlab leaves no process in that session behind (pgrep -s finds none: status 1).
    const std::string in_session = "sh -c 'setsid " + std::string(KVLAB_BINARY) + " bench --shape " + kTiny +
                                   " --lengths 8 --reps 1 --background-load 2 >/dev/null & p=$!; wait $p || exit 3; "
                                   "sleep 0.2; pgrep -s $p >/dev/null && exit 4; exit 0'";
    CHECK(WEXITSTATUS(std::system(in_session.c_str())) == 0);
    const Run text = run_kvlab("bench --shape " + std::string(kTiny) + " --lengths 8 --reps 1 --background-load 1");
    REQUIRE(text.exit_code == 0);
    CHECK(text.out.find("loops on threads") != std::string::npos);
    check_refused("bench --background-load 65", "--background-load");
    check_refused("bench --background-load 1 --kv-format fp32", "--background-load measures");
}

TEST_CASE("kvlab bench --background-load catches a logit bit that differs by either of its checks",
          "[cli][bench][threads]") {
    const std::string bench =
        "bench --shape " + std::string(kTiny) + " --lengths 32 --reps 1 --threads 2 --background-load 1";
    // One step of the loaded 2-thread row, between checkpoints: only the reference's hashes see it.
    const Run step = run_kvlab(bench + " --json --plant step");
    INFO(step.err);
    CHECK(step.exit_code == 1);
    CHECK(step.err.find("not bitwise equal") != std::string::npos);
    const auto j = nlohmann::json::parse(step.out);
    REQUIRE(j["rows"].size() == 4);
    for (const auto& row : j["rows"]) {
        const bool planted = row["threads"] == 2 && row["background_load"] == 1;
        CHECK(row["steps_equal_reference"] == !planted);
        CHECK(row["checkpoints_equal_naive"] == true);
        CHECK(row["bitwise_equal_naive"] == !planted);
    }
    // Every run's last step, the reference's too: only naive decode sees it.
    const Run checkpoint = run_kvlab(bench + " --json --plant checkpoint");
    CHECK(checkpoint.exit_code == 1);
    const auto k = nlohmann::json::parse(checkpoint.out);
    for (const auto& row : k["rows"]) {
        CHECK(row["steps_equal_reference"] == true);
        CHECK(row["checkpoints_equal_naive"] == false);
    }
    const Run text = run_kvlab(bench + " --plant step");
    CHECK(text.exit_code == 1);
    CHECK(text.out.find("DIFFER") != std::string::npos);
}

TEST_CASE("threads default to auto and say so in json and take a count or auto only", "[cli][threads]") {
    const fs::path model = exported_model("threads.bin", kTiny);
    const Run a = run_kvlab("generate --model " + model.string() + " --tokens 1,2 --steps 4 --json");
    INFO(a.err);
    REQUIRE(a.exit_code == 0);
    const auto j = nlohmann::json::parse(a.out);
    CHECK(j["threads_choice"]["auto"] == true);
    CHECK(j["threads"] == j["threads_choice"]["picked"]);
    CHECK(j["threads"].get<int>() >= 1);
    CHECK(j["threads"].get<int>() <= j["threads_choice"]["affinity"].get<int>());
    // Pinned to one CPU, auto picks one thread.
    const Run pinned =
        run_kvlab("generate --model " + model.string() + " --tokens 1,2 --steps 4 --json", "taskset -c 0");
    if (pinned.exit_code == 0) CHECK(nlohmann::json::parse(pinned.out)["threads"] == 1);
    const Run given = run_kvlab("generate --model " + model.string() + " --tokens 1,2 --steps 4 --threads 3 --json");
    REQUIRE(given.exit_code == 0);
    CHECK(nlohmann::json::parse(given.out)["threads"] == 3);
    CHECK(nlohmann::json::parse(given.out)["threads_choice"]["auto"] == false);
    for (const char* bad : {"0", "257", "two", "2x", "-1", ""})
        check_refused("demo --threads '" + std::string(bad) + "'", "--threads");
}

TEST_CASE("kvlab bench --naive-max: naive decode timed only up to it and the bits still checked above it",
          "[cli][bench]") {
    const Run r = run_kvlab("bench --shape " + std::string(kTiny) + " --lengths 4,9,32 --naive-max 9 --reps 1 --json");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["naive_max"] == 9);
    REQUIRE(j["rows"].size() == 3);
    for (const auto& row : j["rows"]) {
        const bool timed = row["T"].get<int>() <= 9;
        CHECK(row["naive_decode_tokens_per_second"].is_null() == !timed);
        CHECK(row["cached_bitwise_equal_naive"] == true);  // one untimed naive step above --naive-max
    }
    CHECK(j["variants"][0]["T"] == 9);  // the variants run at the longest length up to --naive-max
    // The stages' progress line is for a terminal only (tests/test_output.cpp): none in a log.
    CHECK(r.err.find("bench: T =") == std::string::npos);
    const Run text = run_kvlab("bench --shape " + std::string(kTiny) + " --lengths 4,32 --naive-max 4 --reps 1");
    REQUIRE(text.exit_code == 0);
    CHECK_THAT(text.out, Catch::Contains("not timed") && Catch::Contains("timed up to --naive-max 4"));
}

TEST_CASE("kvlab bench: the cost model's counts and times per row and a PNG of them", "[cli][bench]") {
    const fs::path png = scratch() / "bench-plot.png";
    fs::remove(png);
    const Run r =
        run_kvlab("bench --shape " + std::string(kTiny) + " --lengths 4,16 --reps 1 --json --plot " + png.string());
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const std::string out = r.out.substr(0, r.out.rfind("wrote"));  // the JSON, then the plot's line
    const auto j = nlohmann::json::parse(out);
    CHECK(j["machine"]["weights_stream_bytes_per_second"].get<double>() > 0);
    CHECK(j["kv_passes_weights_T"].get<int>() >= 1);
    for (const auto& row : j["rows"])
        for (const char* kind : {"cached", "naive"}) {
            const auto& cost = row["cost"][kind];
            CHECK(cost["flops"].get<double>() > 0);
            CHECK(cost["predicted_seconds"].get<double>() > 0);
            CHECK(cost["predicted_over_measured"].get<double>() > 0);
        }
    // A PNG: its signature, then the IHDR chunk's width and height (big-endian).
    const std::string bytes = slurp(png);
    REQUIRE(bytes.size() > 24);
    CHECK(bytes.substr(1, 3) == "PNG");
    auto be32 = [&](std::size_t at) {
        return (unsigned(std::uint8_t(bytes[at])) << 24) | (unsigned(std::uint8_t(bytes[at + 1])) << 16) |
               (unsigned(std::uint8_t(bytes[at + 2])) << 8) | unsigned(std::uint8_t(bytes[at + 3]));
    };
    CHECK(be32(16) == 1800);  // two charts side by side
    CHECK(be32(20) == 460);
    check_refused("bench --shape " + std::string(kTiny) + " --lengths 4 --reps 1 --plot " +
                      (scratch() / "no-such-folder" / "p.png").string(),
                  "--plot");
    check_refused("bench --kv-format fp32 --plot " + png.string(), "--plot draws the main table");
}

TEST_CASE("kvlab bench --startup: time to the first logits and resident memory against weights and KV",
          "[cli][bench]") {
    const fs::path model = exported_model("startup.bin", kTiny);
    fs::remove(model.string() + ".kvlab-panels");
    const Run first = run_kvlab("bench --startup " + model.string() + " --panel-cache on --json");
    INFO(first.err);
    REQUIRE(first.exit_code == 0);
    const auto j = nlohmann::json::parse(first.out);
    CHECK_THAT(j["panels"].get<std::string>(), Catch::StartsWith("packed, and cached in"));
    CHECK(j["startup_seconds"].get<double>() > 0);
    CHECK(j["decode_steps"] == 31);  // to max_seq
    CHECK(j["weights_bytes"].get<double>() == double(fs::file_size(model)));
    CHECK(j["kv_reserved_bytes"].get<double>() > 0);
    CHECK(j["peak_resident_bytes"].get<double>() >= j["program_resident_bytes"].get<double>());
    const Run second = run_kvlab("bench --startup " + model.string() + " --panel-cache on");
    REQUIRE(second.exit_code == 0);
    CHECK_THAT(second.out, Catch::Contains("panels mapped from") && Catch::Contains("start-up, load to first logits"));
    fs::remove(model.string() + ".kvlab-panels");
    check_refused("bench --startup " + model.string() + " --plot x.png", "bench --startup measures one checkpoint");
    check_refused("bench --startup " + (scratch() / "missing.bin").string(), "file not found");
}

TEST_CASE("a named shape takes changes and a length past max_seq is refused with the way out", "[cli][bench]") {
    const Run r = run_kvlab("bench --shape stories260K,max_seq=24,n_layers=1 --lengths 24 --reps 1 --json");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(nlohmann::json::parse(r.out)["shape"].get<std::string>(),
               Catch::Contains("dim=64") && Catch::Contains("n_layers=1") && Catch::Contains("max_seq=24"));
    check_refused("bench --shape stories260K,max_seq=24 --lengths 25", "--shape stories15M,max_seq=8192");
}

TEST_CASE("kvlab generate: sampling is reproducible from --seed", "[cli][generate]") {
    const fs::path model = exported_model("gen.bin", kTiny);
    const std::string args = "generate --model " + model.string() + " --tokens 1 --steps 20 --temperature 1 --json";
    const Run a = run_kvlab(args + " --seed 5"), b = run_kvlab(args + " --seed 5"), c = run_kvlab(args + " --seed 6");
    REQUIRE(a.exit_code == 0);
    const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out), jc = nlohmann::json::parse(c.out);
    CHECK(ja["generated_tokens"] == jb["generated_tokens"]);
    CHECK(ja["generated_tokens"] != jc["generated_tokens"]);
}

TEST_CASE("kvlab generate on stories260K prints llama2.c's recorded greedy output", "[cli][stories260k]") {
    KVLAB_MODEL_FILE_OR_SKIP(model, "stories260K.bin");
    KVLAB_MODEL_FILE_OR_SKIP(tok, "tok512.bin");
    const Run r = run_kvlab("generate --model " + model + " --tokenizer " + tok + " --steps 200");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out == std::string(kvlab::test::kLlama2cExpected) + "\n");
}

// The drift of each KV format from fp32 on the real model, 200 greedy steps (the demo's prompt): the figures
// in the README's format table, and the bounds it states (about twice what was measured).
TEST_CASE("kvlab demo --kv-format on stories260K: each format stays within the drift the README states",
          "[cli][stories260k]") {
    KVLAB_MODEL_FILE_OR_SKIP(model, "stories260K.bin");
    KVLAB_MODEL_FILE_OR_SKIP(tok, "tok512.bin");
    struct Bound {
        const char* format;
        double max_abs, kl;
        int same_top1;  // of 201 steps, at least
    };
    for (const Bound& b :
         {Bound{"bf16", 0.3, 1e-3, 201}, Bound{"fp16", 0.05, 1e-4, 201}, Bound{"fp8-e5m2", 15.0, 1.0, 170},
          Bound{"fp8-e4m3", 12.0, 0.3, 185}, Bound{"int8", 3.5, 0.2, 190}, Bound{"int4", 24.0, 10.0, 110}}) {
        const Run r =
            run_kvlab("demo --model " + model + " --tokenizer " + tok + " --steps 200 --json --kv-format " + b.format);
        INFO(b.format << ": " << r.err);
        REQUIRE(r.exit_code == 0);
        const auto s = nlohmann::json::parse(r.out)["summary"];
        CHECK(s["bitwise_equal_steps"] == 201);
        CHECK(s["max_drift_from_fp32"].get<double>() <= b.max_abs);
        CHECK(s["max_kl_from_fp32"].get<double>() <= b.kl);
        CHECK(s["same_top1_as_fp32_steps"].get<int>() >= b.same_top1);
        CHECK(s["max_drift_from_fp32"].get<double>() > 0);  // a format that stored fp32 would not move
    }
}

TEST_CASE("kvlab speculate: tokens and logits bitwise equal to plain greedy decode, for any draft",
          "[cli][speculate]") {
    const fs::path model = exported_model("spec.bin", kTiny);
    const std::string base = "speculate --model " + model.string() + " --tokens 1,5,7 --steps 20 --k 3 --reps 1";
    // The default draft: a random model of the target's shape, one layer deep.
    const Run r = run_kvlab(base + " --json");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["bitwise_equal"] == true);
    CHECK(j["tokens_equal"] == true);
    CHECK(j["logits_bitwise_equal"] == true);
    CHECK(j["generated_tokens"].size() == 20);
    CHECK(j["plain_steps"] == 20);
    CHECK(j["k"] == 3);
    CHECK(j["draft"].get<std::string>().find("random") == 0);
    CHECK(j["accepted"].get<int>() + j["target_steps"].get<int>() == 20);
    CHECK(j["accepted"].get<int>() <= j["proposed"].get<int>());
    CHECK(j["acceptance_rate"].get<double>() >= 0.0);
    CHECK(j["acceptance_rate"].get<double>() <= 1.0);
    CHECK(j["speedup"].get<double>() > 0.0);
    for (const char* key : {"mean_accepted_per_target_step", "tokens_per_target_step", "draft_steps", "plain_seconds",
                            "speculative_seconds", "text", "prompt_tokens", "model"})
        CHECK(j.contains(key));
    // The target as its own draft: every draft accepted, k + 1 tokens a target step.
    const Run self = run_kvlab(base + " --draft self --json");
    REQUIRE(self.exit_code == 0);
    const auto js = nlohmann::json::parse(self.out);
    CHECK(js["acceptance_rate"] == 1.0);
    CHECK(js["target_steps"] == 5);
    CHECK(js["generated_tokens"] == j["generated_tokens"]);
    // A checkpoint of another shape as draft, and the text report.
    const fs::path other = exported_model("spec_draft.bin",
                                          "dim=8,hidden_dim=12,n_layers=1,n_heads=2,n_kv_heads=1,"
                                          "vocab_size=40,max_seq=16");
    const Run text = run_kvlab(base + " --draft " + other.string());
    INFO(text.out << text.err);
    CHECK(text.exit_code == 0);
    CHECK(text.out.find("tokens and logits bitwise equal to plain greedy cached decode") != std::string::npos);
    CHECK(text.out.find("acceptance") != std::string::npos);
    CHECK(text.out.find("speedup") != std::string::npos);
}

TEST_CASE("kvlab speculate: bad k, another vocabulary, too many steps, an unreadable draft are one-line errors",
          "[cli][speculate][errors]") {
    const fs::path model = exported_model("spec_bad.bin", kTiny);
    const std::string base = "speculate --model " + model.string() + " --tokens 1,2";
    check_refused(base + " --steps 8 --k 0", "--k must be at least 1");
    check_refused(base + " --steps 8 --k -2", "--k must be at least 1");
    const fs::path vocab50 =
        exported_model("spec_vocab50.bin", "dim=16,n_layers=1,n_heads=4,n_kv_heads=2,vocab_size=50");
    check_refused(base + " --steps 8 --draft " + vocab50.string(), "vocab_size 50 differs from the target's 40");
    check_refused(base + " --steps 32", "max_seq");
    check_refused(base + " --steps 8 --draft /nonexistent/draft.bin", "/nonexistent/draft.bin");
    check_refused(base + " --steps 8 --device both", "one device");
}

TEST_CASE("kvlab speculate on stories260K: the target as draft accepts every draft, llama2.c's text",
          "[cli][stories260k]") {
    KVLAB_MODEL_FILE_OR_SKIP(model, "stories260K.bin");
    KVLAB_MODEL_FILE_OR_SKIP(tok, "tok512.bin");
    const Run r =
        run_kvlab("speculate --model " + model + " --tokenizer " + tok + " --draft self --k 4 --steps 100 --json");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["bitwise_equal"] == true);
    CHECK(j["acceptance_rate"] == 1.0);
    CHECK(j["target_steps"] == 20);
    const std::string text = j["text"];
    CHECK(text.size() > 100);
    CHECK(std::string(kvlab::test::kLlama2cExpected).rfind(text, 0) == 0);
}

TEST_CASE("kvlab verify: exact variants pass, the window differs past sinks + window, every mutant is caught",
          "[cli][verify]") {
    const Run r = run_kvlab("verify --cases 40 --seed 3");
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("mutants caught 26 of 26 (kill rate 100%)") != std::string::npos);
    CHECK(r.out.find("bitwise equal while T <= sinks + window; differs beyond") != std::string::npos);
    const Run j = run_kvlab("verify prefix-shared --cases 20 --json");
    REQUIRE(j.exit_code == 0);
    const auto json = nlohmann::json::parse(j.out);
    CHECK(json["all_ok"] == true);
    CHECK(json["rows"][0]["variant"] == "prefix-shared");
    CHECK(json["rows"][0]["cases"] == 20);
    // One mutant alone: caught, so its row is as promised.
    CHECK(run_kvlab("verify cow-no-copy --cases 20").exit_code == 0);
}

// One vocabulary: every registry variant, and nothing else, by its registry name wherever the
// CLI lists variants.
TEST_CASE("kvlab verify --list, verify, bench and view --help list the registry's variants", "[cli][variants]") {
    const Run list = run_kvlab("verify --list");
    REQUIRE(list.exit_code == 0);
    for (const kvlab::VariantInfo& v : kvlab::variant_table()) {
        INFO(v.name);
        CHECK(list.out.find("\n" + std::string(v.name) + ": " + std::string(v.summary)) != std::string::npos);
        for (const kvlab::VariantParam& p : v.params)
            CHECK(list.out.find(std::string(p.name) + ": " + std::string(p.meaning)) != std::string::npos);
    }
    for (const kvlab::VariantSetting& s : kvlab::variant_settings())
        if (s.preset) CHECK(list.out.find("its row: " + s.name + "\n") != std::string::npos);
    for (const char* scenario : {"\nfork ", "\nrollback ", "\nbatch ", "\nstale ", "\nspeculate ", "\ncow-no-copy "})
        CHECK(list.out.find(scenario) != std::string::npos);
    // The old name of prefix-shared is no row.
    CHECK(list.out.find("\nprefix ") == std::string::npos);
    CHECK(list.out.find("\nprefix:") == std::string::npos);
    const Run verify = run_kvlab("verify --help");
    CHECK(verify.out.find(kvlab::variant_names(kvlab::all_variants())) != std::string::npos);
    const Run bench = run_kvlab("bench --help");
    CHECK(bench.out.find(kvlab::variant_names(kvlab::variants_with("block_size"))) != std::string::npos);
    // The viewer's list: the variants whose entry says what the viewer runs.
    const Run view = run_kvlab("view --help");
    if (view.exit_code == 0) {
        CHECK(view.out.find(kvlab::variant_names(kvlab::viewer_variants())) != std::string::npos);
    }
    check_refused("verify prefix --cases 1", "unknown variant 'prefix'");
}

TEST_CASE("kvlab memory: Llama 2 7B at fp16 holds 512 KiB per token, 2 GiB at 4096", "[cli][memory]") {
    const Run r = run_kvlab("memory --json --model llama2-7b --precision fp16");
    REQUIRE(r.exit_code == 0);
    const auto json = nlohmann::json::parse(r.out);
    CHECK(json["models"][0]["bytes_per_token"]["fp16"] == 2 * 32 * 32 * 128 * 2);
    CHECK(json["models"][0]["total_bytes"]["fp16"] == 2ll * 32 * 32 * 128 * 2 * 4096);
    // kvlab's own format names: --kv-format fp8-e4m3 is one byte per element.
    const Run f = run_kvlab("memory --json --model llama3-8b --kv-format fp8-e4m3");
    REQUIRE(f.exit_code == 0);
    CHECK(nlohmann::json::parse(f.out)["models"][0]["bytes_per_token"]["fp8-e4m3"] == 2 * 32 * 8 * 128);
    check_refused("memory --kv-format fp8-e4m3 --precision fp16", "excludes");
}

TEST_CASE("kvlab pool --kv-format: every block in the format, every prefill equal to the format-aware naive decode",
          "[cli][pool]") {
    const std::string script =
        " --json --script \"new a 1,2,3,4,5,6; fork a b; append b 7,8; new c 1,2,3,4,9; "
        "rollback c 2; append c 10,11; free a; show\"";
    std::map<std::string, std::int64_t> block_bytes;
    for (const char* format : {"fp32", "bf16", "fp8-e4m3"}) {
        const Run r = run_kvlab(std::string("pool --kv-format ") + format + script);
        INFO(format << ": " << r.err);
        REQUIRE(r.exit_code == 0);
        const auto j = nlohmann::json::parse(r.out);
        CHECK(j["kv_format"] == format);
        CHECK(j["summary"]["prefills"].get<int>() == 4);  // new a, append b, new c, append c
        CHECK(j["summary"]["prefills_bitwise_equal"] == j["summary"]["prefills"]);
        CHECK(j["summary"]["prefix_hit_positions"].get<int>() > 0);
        block_bytes[format] = j["block_bytes"].get<std::int64_t>();
    }
    CHECK(block_bytes["fp32"] == 2 * block_bytes["bf16"]);
    CHECK(block_bytes["fp32"] == 4 * block_bytes["fp8-e4m3"]);
    check_refused("pool --kv-format int3 --script \"new a 1\"", "unknown KV format 'int3'");
}

TEST_CASE("cache parameters and requests that cannot be met are one-line errors", "[cli][errors]") {
    check_refused("verify nosuch", "unknown variant 'nosuch'");
    check_refused("verify --cases 0", "cases");
    check_refused("memory --precision int3", "int3");
    check_refused("memory --model llama9", "llama9");
    check_refused("memory --lengths 10,0", "--lengths");
    check_refused(std::string("bench --shape ") + kTiny + " --lengths 8 --block-size 0", "--block-size");
    check_refused(std::string("bench --shape ") + kTiny + " --lengths 8 --block-size 33", "block_size 33");
    check_refused(std::string("bench --shape ") + kTiny + " --lengths 8 --group 3", "does not divide head_size");
    check_refused("pool --block-size 0 --script \"new a 1,2\"", "block_size 0");
    check_refused("pool --blocks 1 --block-size 2 --script \"new a 1,2,3\"", "more blocks");
    check_refused("pool --script \"new a 1,2; rollback a 5\"", "roll back");
    check_refused("pool --script \"new a 1,2; rollback a -1\"", "roll back");
    check_refused("pool --script \"fork x y\"", "no sequence named 'x'");
    check_refused("pool --script \"new a 1,999999\"", "outside the vocabulary");
}

TEST_CASE("kvlab demo --device: two devices side by side, all four logit vectors bitwise equal", "[cli][device]") {
    // gpu-host runs the GPU's per-thread kernel source on the host, so this runs without a GPU.
    const Run r = run_kvlab("demo --device cpu,gpu-host --steps 6 --model-seed 3");
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("on cpu and gpu-host") != std::string::npos);
    CHECK(r.out.find("7 of 7 steps bitwise equal (naive and cached on cpu and gpu-host: four") != std::string::npos);
    const Run one = run_kvlab("generate --device gpu-host --steps 12 --json");
    CHECK(one.exit_code == 0);
}

TEST_CASE("kvlab verify --kv-format: the variant rows and scenarios in one format, every planted bug still caught",
          "[cli][verify]") {
    const Run r = run_kvlab("verify --kv-format fp8-e4m3 --cases 30 --seed 4 --json");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["all_ok"] == true);
    CHECK(j["kv_format"] == "fp8-e4m3");
    CHECK(j["kill_rate"] == 1.0);
    // The caches really are in the format: a planted paged bug's counterexample says so.
    bool named = false;
    for (const auto& row : j["rows"])
        if (row["variant"] == "slot-wrong-block")
            named = row["counterexample"].get<std::string>().find(" in fp8-e4m3") != std::string::npos;
    CHECK(named);
    check_refused("verify --kv-format fp9", "unknown KV format 'fp9'");
}

TEST_CASE("kvlab verify --device: the suite on the GPU's kernels, alone and checked against the CPU", "[cli][device]") {
    const Run one = run_kvlab("verify exact --device gpu-host --cases 20 --json");
    INFO(one.out << one.err);
    CHECK(one.exit_code == 0);
    const nlohmann::json j = nlohmann::json::parse(one.out);
    CHECK(j["device"] == "gpu-host");
    CHECK(j["all_ok"] == true);
    // 17 variants and scenarios, 6 KV formats, format-switch, quantized-exact, and the two MLA forms
    // (which run on the CPU's kernels whatever the device, and say so)
    CHECK(j["rows"].size() == 27);
    const Run two = run_kvlab("verify paged --device cpu,gpu-host --cases 20");
    INFO(two.out << two.err);
    CHECK(two.exit_code == 0);
    CHECK(two.out.find("naive decode on cpu is the reference; naive and cached on gpu-host must equal it") !=
          std::string::npos);
    check_refused("verify --device cpu,tpu", "'tpu' is not a device");
}

TEST_CASE("kvlab --device: unknown devices, a missing GPU and a GPU-less build are one-line errors", "[cli][errors]") {
    check_refused("demo --device tpu", "'tpu' is not a device");
    check_refused("demo --device cpu,cpu", "named twice");
    check_refused("demo --device cpu,gpu-host,gpu", "at most two");
    check_refused("generate --device both", "one device");
    const Run v = run_kvlab("verify paged --device gpu --cases 2");
    if (v.exit_code != 0) CHECK(std::count(v.err.begin(), v.err.end(), '\n') == 1);
    // Without a device (or without CUDA in the build) the reason comes in one line.
    const Run r = run_kvlab("demo --device gpu --steps 2");
    if (r.exit_code == 0) {  // this machine has a GPU: then the run must be exact
        CHECK(r.out.find("3 of 3 steps bitwise equal") != std::string::npos);
        return;
    }
    CHECK(r.err.find("kvlab: error:") == 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK((r.err.find("no CUDA device") != std::string::npos || r.err.find("no GPU support") != std::string::npos));
}

TEST_CASE("kvlab bench --kv-format: bytes per token and decode speed per format, every T", "[cli][bench]") {
    const Run r = run_kvlab("bench --kv-format all --shape " + std::string(kTiny) + " --lengths 8,32 --reps 1 --json");
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    REQUIRE(j["formats"].size() == 2 * std::size(kvlab::kKVFormats));
    const kvlab::Config c = kvlab::Config::parse(kTiny, kvlab::Config{});
    for (const auto& row : j["formats"]) {
        const kvlab::KVFormat f = kvlab::parse_kv_format(row["kv_format"].get<std::string>());
        // A row of head_size: float formats' elements; an integer format's groups (the largest divisor
        // of head_size up to 32), an fp32 scale and minimum each, then the codes padded to 4 bytes.
        std::int64_t row_bytes = 0;
        if (f == kvlab::KVFormat::int8 || f == kvlab::KVFormat::int4) {
            int group = std::min(32, c.head_size());
            while (c.head_size() % group) group--;
            const int code_bytes = f == kvlab::KVFormat::int8 ? c.head_size() : (c.head_size() + 1) / 2;
            row_bytes = std::int64_t(c.head_size() / group) * 8 + (code_bytes + 3) / 4 * 4;
        } else {
            row_bytes = std::int64_t(kvlab::kv_format_bytes(int(f))) * c.head_size();
        }
        const std::int64_t per_token = 2ll * row_bytes * c.n_layers * c.n_kv_heads;
        CHECK(row["bytes_per_token"] == per_token);
        CHECK(row["kv_bytes"] == per_token * row["T"].get<std::int64_t>());
        CHECK(row["decode_tokens_per_second"].get<double>() > 0);
    }
    CHECK(j["formats"][0]["T"] == 32);  // longest first
    const Run text =
        run_kvlab("bench --kv-format fp32,fp8-e4m3 --shape " + std::string(kTiny) + " --lengths 16 --reps 1");
    CHECK(text.exit_code == 0);
    CHECK(text.out.find("fp8-e4m3") != std::string::npos);
    CHECK(text.out.find("1.00x") != std::string::npos);
    check_refused("bench --kv-format fp9", "unknown KV format 'fp9'");
    check_refused("bench --kv-format bf16,bf16", "bf16 named twice");
    check_refused("bench --kv-format bf16 --device gpu-host", "--kv-format and --attention run on the cpu");
    check_refused("bench --kv-format bf16 --lengths 1", "too short");
}

TEST_CASE("kvlab bench --device gpu-host: the device table, with naive, graph and plain bitwise equal",
          "[cli][device]") {
    const Run r = run_kvlab("bench --device gpu-host --shape stories260K --lengths 8,24 --reps 1");
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("cached us graph") != std::string::npos);
    const auto lines = std::count(r.out.begin(), r.out.end(), '\n');
    CHECK(lines == 4);  // title, header, one row per T
    std::size_t equal = 0;
    for (std::size_t at = 0; (at = r.out.find("naive, graph and plain bitwise equal", at)) != std::string::npos; at++)
        equal++;
    CHECK(equal == 2);
    check_refused("bench --device gpu-host --lengths 1", "too short");
}
