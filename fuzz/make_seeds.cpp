// make_seeds: the fuzz targets' seed corpora, written by the build (fuzz/CMakeLists.txt), never
// committed. Usage: make_seeds SEEDS_DIR MODELS_DIR
//
// SEEDS_DIR/checkpoint/ already holds checkpoints that `kvlab export` wrote (the build runs it
// first); from them this program writes, into SEEDS_DIR/<target>/:
//   checkpoint   each export again in the ak42 version-1 layout
//   decode       each export behind fuzz_decode's header (variant, block size, P, D, tokens)
//   tokenizer    small vocabularies with merges, and MODELS_DIR/tok512.bin when present, each with
//                a few prompts, behind fuzz_tokenizer's header
//   pool_script  the README's scripts and a few more, behind fuzz_pool_script's header
//   options      one seed per parser of fuzz_options, and one per cache variant in the registry
// Each seed is one file, named by what it is.
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "cache_factory.h"
#include "checkpoint.h"
#include "cpu_backend.h"
#include "fuzz_util.h"
#include "panel_cache.h"
#include "tokenizer.h"
#include "trace.h"

namespace fs = std::filesystem;
using namespace kvlab;

namespace {

std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

void write(const fs::path& p, const std::string& bytes) {
    fs::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    if (!out) throw std::runtime_error("make_seeds: cannot write " + p.string());
}

void put32(std::string& s, std::uint32_t v) {
    for (int i = 0; i < 4; i++) s += char((v >> (8 * i)) & 0xff);
}
void put16(std::string& s, std::uint16_t v) {
    s += char(v & 0xff);
    s += char(v >> 8);
}

// A legacy checkpoint's bytes re-laid as ak42 version 1: the same tensors, each [out][in] as the
// legacy file has them, in version 1's order, after a 256-byte header; no RoPE tables.
std::string to_v1(const std::string& legacy) {
    std::int32_t h[7];
    std::memcpy(h, legacy.data(), sizeof h);
    const bool shared = h[5] > 0;
    const std::int64_t dim = h[0], hid = h[1], L = h[2], nh = h[3], nkv = h[4], voc = std::abs(h[5]), seq = h[6];
    const std::int64_t hs = dim / nh, kv = nkv * hs;
    // The legacy order, in floats.
    const std::int64_t sizes[] = {voc * dim,     L * dim,        L * dim * dim, L * kv * dim,  L * kv * dim,
                                  L * dim * dim, L * dim,        L * hid * dim, L * dim * hid, L * hid * dim,
                                  dim,           seq * (hs / 2), seq * (hs / 2)};
    std::vector<std::string> t;  // emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, cos, sin
    std::size_t at = 28;
    for (std::int64_t n : sizes) {
        t.push_back(legacy.substr(at, std::size_t(n) * 4));
        at += std::size_t(n) * 4;
    }
    std::string out;
    put32(out, 0x616b3432);
    put32(out, 1);
    for (int i = 0; i < 7; i++) put32(out, std::uint32_t(i == 5 ? std::int32_t(voc) : h[i]));
    out += char(shared ? 1 : 0);
    out.resize(256, '\0');
    for (int i : {1, 6, 10, 0, 2, 3, 4, 5, 7, 8, 9}) out += t[std::size_t(i)];
    if (!shared) out += legacy.substr(at);  // the classifier
    return out;
}

struct Entry {
    float score;
    std::string piece;
};

// tokenizer.bin: int32 max_token_length, then per entry float32 score, int32 length, the bytes.
std::string tokenizer_bytes(const std::vector<Entry>& entries) {
    std::size_t longest = 0;
    for (const auto& e : entries) longest = std::max(longest, e.piece.size());
    std::string out;
    put32(out, std::uint32_t(longest));
    for (const auto& e : entries) {
        put32(out, std::bit_cast<std::uint32_t>(e.score));
        put32(out, std::uint32_t(e.piece.size()));
        out += e.piece;
    }
    return out;
}

// llama2.c's conventions: <unk>, <s>, </s>, the 256 byte tokens, then merged pieces.
std::vector<Entry> small_vocab(const std::vector<std::string>& merges) {
    std::vector<Entry> v = {{0, "<unk>"}, {0, "\n<s>\n"}, {0, "\n</s>\n"}};
    char hex[8];
    for (int b = 0; b < 256; b++) {
        std::snprintf(hex, sizeof hex, "<0x%02X>", b);
        v.push_back({0, hex});
    }
    float score = -1;
    for (const auto& m : merges) v.push_back({score--, m});
    return v;
}

std::string tokenizer_seed(int vocab_size, bool bos, bool eos, const std::string& text, const std::string& file) {
    std::string s;
    put16(s, std::uint16_t(vocab_size));
    s += char((bos ? 1 : 0) | (eos ? 2 : 0));
    put16(s, std::uint16_t(text.size()));
    return s + text + file;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::cerr << "usage: make_seeds SEEDS_DIR MODELS_DIR\n";
        return 2;
    }
    const fs::path seeds = argv[1], models = argv[2];

    // checkpoint and decode: from the exports.
    std::vector<fs::path> exports;
    for (const auto& e : fs::directory_iterator(seeds / "checkpoint"))
        if (e.path().filename().string().starts_with("export")) exports.push_back(e.path());
    if (exports.empty()) {
        std::cerr << "make_seeds: no kvlab export checkpoints in " << (seeds / "checkpoint") << "\n";
        return 1;
    }
    for (const auto& p : exports) {
        const std::string legacy = read(p);
        (void)load_checkpoint(p.string());  // the exports themselves must load
        const std::string name = p.stem().string();
        write(seeds / "checkpoint" / (name + "-ak42.bin"), to_v1(legacy));
        // variant, block size, P, D, then P + D tokens
        const unsigned char headers[][4] = {{0, 0, 3, 4}, {3, 1, 1, 7}, {4, 3, 7, 2}, {2, 0, 0, 7}, {1, 7, 5, 5}};
        int k = 0;
        for (const auto& h : headers) {
            std::string s(reinterpret_cast<const char*>(h), 4);
            const int n = 1 + h[2] % 8 + h[3] % 8;
            for (int i = 0; i < n; i++) s += char(1 + 5 * i + k);
            write(seeds / "decode" / (name + "-" + std::to_string(k++)), s + legacy);
        }
    }

    // panel_cache: fuzz_panel_cache's checkpoint's cache as kvlab writes it, cut short, and its header alone.
    {
        const fs::path dir = seeds / "panel_cache-work";
        fs::create_directories(dir);
        const std::string model = (dir / "model.bin").string();
        save_checkpoint(model, random_model(fuzz::panel_fuzz_shape(), 11));
        Model m = load_checkpoint(model);
        m.panel_cache = {PanelCacheOption::Mode::on, (dir / "cache").string()};
        const CpuBackend backend(m);  // writes the cache
        const std::string bytes = read(panel_cache_path(model, m.panel_cache));
        write(seeds / "panel_cache" / "valid", bytes);
        write(seeds / "panel_cache" / "cut", bytes.substr(0, bytes.size() / 2));
        write(seeds / "panel_cache" / "header", bytes.substr(0, 4096));
        fs::remove_all(dir);
    }

    // plugin_stdio: answers that fit every request (hello, a pool, sequences, no copies, a
    // prefix hit of 0, every position attended), slots ascending, descending and repeating.
    {
        const auto answer = [](int seq, int slot) {
            return "{\"name\": \"seed\", \"methods\": [\"fork\", \"attach_prefix\"], \"pool\": 1, \"seq\": " +
                   std::to_string(seq) + ", \"copies\": [], \"slot\": " + std::to_string(slot) +
                   ", \"n\": 0, \"positions\": [0], \"bytes\": 0}\n";
        };
        std::string up, down, same;
        for (int i = 0; i < 64; i++) up += answer(1 + i % 3, i), down += answer(1, 63 - i), same += answer(1, 0);
        write(seeds / "plugin_stdio" / "ascending", up);
        write(seeds / "plugin_stdio" / "descending", down);
        write(seeds / "plugin_stdio" / "same", same);
        // Version 3: declared block sizes and most sequences, no release, step_done's moves.
        std::string v3;
        for (int i = 0; i < 64; i++)
            v3 +=
                "{\"name\": \"seed\", \"abi\": 3, \"methods\": [\"step_done\", \"slots\"], \"block_sizes\": "
                "[1, 2], \"max_sequences\": 2, \"pool\": 1, \"seq\": 1, \"copies\": [], \"slots\": [0], \"slot\": " +
                std::to_string(i) + ", \"moves\": [[0, 1, " + std::to_string(i) + "]], \"bytes\": 0}\n";
        write(seeds / "plugin_stdio" / "v3", v3);
        write(seeds / "plugin_stdio" / "refusals", "{\"name\": \"seed\", \"methods\": []}\n{\"refused\": \"no\"}\n");
        write(seeds / "plugin_stdio" / "errors",
              "{\"name\": \"seed\", \"methods\": []}\n{\"pool\": 1}\n{\"error\": \"x\"}\n");
    }

    // replay_log: a log with every call, as `kvlab verify --plugin` writes one.
    write(
        seeds / "replay_log" / "every_call",
        "{\"kvlab_replay\": 1, \"plugin\": \"seed\", \"config\": {\"dim\": 4, \"hidden_dim\": 2, \"n_layers\": 1, "
        "\"n_heads\": 1, \"n_kv_heads\": 1, \"vocab_size\": 8, \"max_seq\": 6}, \"n_slots\": 12, \"max_sequences\": 2, "
        "\"block_size\": 2}\n"
        "{\"call\": \"create\", \"seq\": 0}\n"
        "{\"call\": \"attach_prefix\", \"seq\": 0, \"tokens\": [1, 2], \"hit\": 0}\n"
        "{\"call\": \"reserve\", \"seq\": 0, \"length\": 0, \"tokens\": [1, 2, 3], \"copies\": [], \"slots\": [11, 10, "
        "9]}\n"
        "{\"call\": \"write\", \"seq\": 0, \"from\": 0, \"to\": 2}\n"
        "{\"call\": \"read\", \"seq\": 0, \"from\": 0, \"to\": 2}\n"
        "{\"call\": \"step_done\", \"seq\": 0, \"moves\": []}\n"
        "{\"call\": \"release\", \"seq\": 0, \"n\": 1}\n"
        "{\"call\": \"fork\", \"seq\": 0, \"child\": 1}\n"
        "{\"call\": \"destroy\", \"seq\": 0}\n"
        "{\"verdict\": \"\", \"books\": true}\n");

    // trace: each file of fuzz_trace's trace, behind the byte that chooses it.
    {
        const fs::path dir = seeds / "trace-work";
        cli::TraceRun run;
        run.random = true, run.shape = fuzz::trace_fuzz_shape(), run.seed = 3, run.tokens = "1,2,3", run.steps = 2;
        cli::record_trace(run, dir.string());
        const char* files[] = {"manifest.json", "tokens.npy", "logits.npy", "k.npy", "v.npy"};
        for (int i = 0; i < 5; i++) write(seeds / "trace" / files[i], std::string(1, char(i)) + read(dir / files[i]));
        fs::remove_all(dir);
    }

    // serve_trace: requests sharing a prompt, arriving late, and one the scheduler refuses.
    write(seeds / "serve_trace" / "requests",
          "{\"tokens\": [1, 2, 3], \"max_new_tokens\": 3, \"arrival\": 0}\n"
          "{\"tokens\": [1, 2, 3, 4, 5], \"max_new_tokens\": 2, \"arrival\": 1}\n\n"
          "{\"tokens\": [9], \"max_new_tokens\": 4, \"arrival\": 5}\n");
    write(seeds / "serve_trace" / "refused", "{\"tokens\": [99], \"max_new_tokens\": 1}\n{\"prompt\": \"hi\"}\n");

    // block_store: the valid record (nothing XOR-ed onto it), one byte of it changed, and raw bytes.
    write(seeds / "block_store" / "valid", std::string(1, '\0'));
    write(seeds / "block_store" / "one-byte", std::string("\0\0\0\0\0\0\0\0\0\x01", 10));
    write(seeds / "block_store" / "raw", std::string("\x01KVLBLK01", 9));

    // output: each fixed kind of path with text, and names and texts of bytes that are not UTF-8.
    for (int kind = 0; kind < 6; kind++)
        write(seeds / "output" / ("kind-" + std::to_string(kind)), std::string(1, char(kind)) + "Once upon a time");
    write(seeds / "output" / "name-bytes", std::string("\x06\xff\xfe\xc0\xaf\xed\xa0\x80\x1b[31m\n", 14));
    write(seeds / "output" / "utf8", std::string("\x07"
                                                 "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
                                                 15));

    // tokenizer: two small vocabularies, and the real one when it is there.
    const std::vector<std::string> prompts = {"", "hello world", "Once upon a time", "héllo ✓ \xff\xfe", "a  b\n\tc"};
    const auto small1 = tokenizer_bytes(small_vocab({"he", "ll", "llo", "hello", " w", "or", "ld", " world", "▁"}));
    const auto small2 = tokenizer_bytes(small_vocab({"aa", "aaa", "a", "", "ab", "ba"}));
    int k = 0;
    for (const auto& text : prompts) {
        write(seeds / "tokenizer" / ("small1-" + std::to_string(k)), tokenizer_seed(268, true, k % 2, text, small1));
        write(seeds / "tokenizer" / ("small2-" + std::to_string(k)), tokenizer_seed(265, k % 2, true, text, small2));
        k++;
    }
    // A vocabulary where BOS merges with the dummy prefix, as run.c lets it.
    write(seeds / "tokenizer" / "bos-merges",
          tokenizer_seed(262, true, false, "x", tokenizer_bytes(small_vocab({" ", "x", "\n<s>\n "}))));
    // Too small for byte fallback: encode must refuse, not index past the vocabulary.
    write(seeds / "tokenizer" / "tiny",
          tokenizer_seed(3, true, true, "xyz", tokenizer_bytes(small_vocab({})).substr(0, 4 + 3 * 8 + 5 + 5 + 6)));
    if (fs::exists(models / "tok512.bin")) {
        const std::string tok = read(models / "tok512.bin");
        write(seeds / "tokenizer" / "tok512-0", tokenizer_seed(512, true, false, "Once upon a time, there was", tok));
        write(seeds / "tokenizer" / "tok512-1", tokenizer_seed(512, true, true, "Lily said \"hi!\" 123", tok));
    }

    // pool_script: block size, blocks, flags, then the script.
    const std::vector<std::string> scripts = {
        "new a 1,2,3,4,5; new b 1,2,3,4,9; fork a c; append c 7; show",
        "new a 1,2,3,4,5,6,7,8; new b 1,2,3,4,5,6,7,8; free a; rollback b 3; append b 9,9; show",
        "new x 5; fork x y; fork y z; append z 1,2; append x 3; free y; rollback z 1; show",
        "new a 1,2,3,4; free a; new b 1,2,3,4; append b 5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20; show",
        "new a 31,0,1; rollback a 0; append a 2; show; free a; show",
    };
    k = 0;
    for (const auto& script : scripts) {
        const unsigned char h[3] = {std::uint8_t(k % 4), std::uint8_t(8 + 7 * k), std::uint8_t(k % 8)};
        write(seeds / "pool_script" / ("script-" + std::to_string(k++)),
              std::string(reinterpret_cast<const char*>(h), 3) + script);
    }

    // options: the parser's index, then its text (memory: its fixed fields first).
    std::vector<std::pair<int, std::string>> options = {
        {0, "dim=64,n_layers=2"},
        {0, "dim=16,hidden_dim=32,n_layers=1,n_heads=4,n_kv_heads=2,vocab_size=32,max_seq=16"},
        {1, "-2147483648"},
        {2, "1,403,407"},
        {4, "cpu,gpu-host"},
        {5, "bf16"},
        {5, "llama2-7b"},
    };
    // Every variant's name, from the registry (so no list of them is kept here or in the dictionary).
    for (const VariantInfo& v : variant_table()) options.emplace_back(3, std::string(v.name));
    k = 0;
    for (const auto& [which, text] : options)
        write(seeds / "options" / ("option-" + std::to_string(k++)), std::string(1, char(which)) + text);
    std::string mem(1, char(6));
    put32(mem, 8191);
    put32(mem, 7);
    put32(mem, 15);
    put16(mem, 63);
    mem += std::string("\x01\x01\x02", 3);
    write(seeds / "options" / "memory-0", mem + "100,2000,4096");
    write(seeds / "options" / "memory-1", mem);
    return 0;
}
