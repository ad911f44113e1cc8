// Byte layouts (all little-endian; every matrix PyTorch-style [out][in], as Weights keeps them):
//
// legacy (llama2.c run.c / export.py legacy_export):
//   int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len   (28 bytes)
//     vocab_size < 0 means the classifier is stored separately (unshared); |vocab_size| is the vocab.
//   float32 token_embedding [vocab, dim], rms_att [L, dim], wq [L, dim, dim], wk [L, kv_dim, dim],
//           wv [L, kv_dim, dim], wo [L, dim, dim], rms_ffn [L, dim], w1 [L, hidden, dim],
//           w2 [L, dim, hidden], w3 [L, hidden, dim], rms_final [dim],
//           freq_cis_real [seq_len, head_size/2], freq_cis_imag [seq_len, head_size/2],
//           classifier [vocab, dim] (only when unshared)
//
// ak42 version 1 (export.py version1_export):
//   uint32 magic 0x616b3432, int32 version = 1, the same 7 int32 (vocab positive),
//   uint8 shared_classifier, zeros up to byte 256
//   float32 rms_att, rms_ffn, rms_final, token_embedding, wq, wk, wv, wo, w1, w2, w3,
//           classifier (only when unshared); no RoPE tables.
#include "checkpoint.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <vector>

#include "file_writer.h"
#include "mapped_file.h"

namespace kvlab {

namespace {

static_assert(std::endian::native == std::endian::little, "checkpoints are little-endian; add byte swapping");
static_assert(sizeof(float) == 4 && sizeof(int) == 4);

constexpr std::uint32_t kMagic = 0x616b3432;  // "ak42"
constexpr std::int64_t kLegacyHeaderBytes = 7 * 4;
constexpr std::int64_t kV1HeaderBytes = 256;

// One tensor as the file holds it: [layers][rows][cols], exactly Weights' layout.
struct Tensor {
    const char* name;
    std::span<float> Weights::*member;
    std::int64_t layers, rows, cols;
    std::int64_t count() const { return layers * rows * cols; }
};

struct Layout {
    Tensor emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, cls;
};

// Sizes come from a validated Config, so every product here is at most kMaxElements.
Layout layout(const Config& c) {
    const std::int64_t L = c.n_layers, dim = c.dim, kv = c.kv_dim(), hid = c.hidden_dim, voc = c.vocab_size;
    return Layout{
        .emb = {"token_embedding", &Weights::token_embedding, 1, voc, dim},
        .rms_att = {"rms_att", &Weights::rms_att, 1, L, dim},
        .wq = {"wq", &Weights::wq, L, dim, dim},
        .wk = {"wk", &Weights::wk, L, kv, dim},
        .wv = {"wv", &Weights::wv, L, kv, dim},
        .wo = {"wo", &Weights::wo, L, dim, dim},
        .rms_ffn = {"rms_ffn", &Weights::rms_ffn, 1, L, dim},
        .w1 = {"w1", &Weights::w1, L, hid, dim},
        .w2 = {"w2", &Weights::w2, L, dim, hid},
        .w3 = {"w3", &Weights::w3, L, hid, dim},
        .rms_final = {"rms_final", &Weights::rms_final, 1, 1, dim},
        .cls = {"classifier", &Weights::wcls, 1, voc, dim},
    };
}

// Builds the one-line errors for one file.
struct Where {
    std::string prefix;
    explicit Where(const std::string& path) : prefix(fmt::format("checkpoint '{}'", one_line(path))) {}
    Error operator()(std::string_view problem) const { return Error(fmt::format("{}: {}", prefix, problem)); }
};

// Config::validate() messages start with "config: "; the header is what is wrong here.
std::string header_problem(const Error& e) {
    std::string_view m = e.what();
    if (m.starts_with("config: ")) m.remove_prefix(8);
    return fmt::format("bad header: {}", m);
}

std::string plural_bytes(std::int64_t n) { return fmt::format("{} byte{}", n, n == 1 ? "" : "s"); }

// The file's first bytes, zero beyond its end: room for either header.
using HeadBytes = std::array<unsigned char, kV1HeaderBytes>;

std::int32_t int32_at(const HeadBytes& head, std::int64_t at) {
    std::int32_t v;
    std::memcpy(&v, head.data() + at, 4);
    return v;
}

// What the header says, in either format.
struct Header {
    bool v1 = false;             // ak42 version 1; else llama2.c's legacy header
    std::int64_t bytes = 0;      // the header's size: the first tensor starts here
    std::int64_t params_at = 0;  // where the seven int32 of the Config start
    bool shared = true;          // the classifier is the token embedding
    Config config;
};

// The format: ak42 version 1 (its version and shared_classifier flag checked), else legacy.
Header header_format(const HeadBytes& head, std::int64_t size, const Where& where) {
    std::uint32_t magic = 0;
    std::memcpy(&magic, head.data(), 4);
    Header h;
    h.v1 = size >= 4 && magic == kMagic;
    if (h.v1) {
        if (size < 8)
            throw where(
                fmt::format("is shorter than the {}-byte ak42 header ({})", kV1HeaderBytes, plural_bytes(size)));
        const std::int32_t version = int32_at(head, 4);
        if (version == 2) throw where("version 2 (int8) checkpoints are not supported");
        if (version != 1)
            throw where(fmt::format("ak42 version {} is not supported (only version 1, float32)", version));
        if (size < kV1HeaderBytes)
            throw where(
                fmt::format("is shorter than the {}-byte ak42 header ({})", kV1HeaderBytes, plural_bytes(size)));
        h.bytes = kV1HeaderBytes;
        h.params_at = 8;
        const unsigned flag = head[36];
        if (flag > 1) throw where(fmt::format("bad header: shared_classifier flag is {}, expected 0 or 1", flag));
        h.shared = flag == 1;
    } else {
        if (size < kLegacyHeaderBytes)
            throw where(fmt::format("is shorter than the {}-byte llama2.c header ({})", kLegacyHeaderBytes,
                                    plural_bytes(size)));
        h.bytes = kLegacyHeaderBytes;
        h.params_at = 0;
    }
    return h;
}

// The seven int32 of the Config, validated.
void header_config(const HeadBytes& head, Header& h, const Where& where) {
    Config& c = h.config;
    c.dim = int32_at(head, h.params_at + 0);
    c.hidden_dim = int32_at(head, h.params_at + 4);
    c.n_layers = int32_at(head, h.params_at + 8);
    c.n_heads = int32_at(head, h.params_at + 12);
    c.n_kv_heads = int32_at(head, h.params_at + 16);
    c.vocab_size = int32_at(head, h.params_at + 20);
    c.max_seq = int32_at(head, h.params_at + 24);
    if (!h.v1) {
        // The legacy format's only flag: a negative vocab_size means an unshared classifier.
        if (c.vocab_size == INT_MIN)
            throw where(fmt::format("bad header: vocab_size {} is out of range", c.vocab_size));
        h.shared = c.vocab_size > 0;
        c.vocab_size = std::abs(c.vocab_size);
    }
    try {
        c.validate();
    } catch (const Error& e) {
        throw where(header_problem(e));
    }
}

// Floats in one RoPE table of the legacy format. validate() bounds the parameter count by
// kMaxElements and max_seq^2 by it too, so max_seq <= 2^17 and head_size <= dim <= 2^17: nothing
// computed from a valid header can overflow int64.
std::int64_t rope_floats(const Config& c) { return std::int64_t{c.max_seq} * (c.head_size() / 2); }

// The file must be exactly as long as its header says.
void check_file_size(const Header& h, std::int64_t size, const Where& where) {
    const Config& c = h.config;
    const std::int64_t floats = c.n_params(h.shared) + (h.v1 ? 0 : 2 * rope_floats(c));
    const std::int64_t expected = h.bytes + 4 * floats;
    const std::string what = fmt::format("{} ({} classifier)", c.describe(), h.shared ? "shared" : "separate");
    if (size < expected)
        throw where(fmt::format("truncated: expected {} bytes, found {} (header says {})", expected, size, what));
    if (size > expected)
        throw where(fmt::format("has {} trailing byte{}: expected {} bytes, found {} (header says {})", size - expected,
                                size - expected == 1 ? "" : "s", expected, size, what));
}

// Every tensor, in the file's order for its format, as a view of the mapped file.
Weights place_weights(const std::shared_ptr<const MappedFile>& file, const Header& h) {
    Weights w(h.config, h.shared, file);
    const Layout t = layout(h.config);
    float* at = reinterpret_cast<float*>(file->data() + h.bytes);  // 4-byte aligned: the header is 28 or 256 bytes
    auto place = [&w, &at](const Tensor& x) {
        w.*x.member = std::span<float>(at, std::size_t(x.count()));
        at += x.count();
    };
    if (h.v1) {
        for (const Tensor* x :
             {&t.rms_att, &t.rms_ffn, &t.rms_final, &t.emb, &t.wq, &t.wk, &t.wv, &t.wo, &t.w1, &t.w2, &t.w3})
            place(*x);
    } else {
        for (const Tensor* x :
             {&t.emb, &t.rms_att, &t.wq, &t.wk, &t.wv, &t.wo, &t.rms_ffn, &t.w1, &t.w2, &t.w3, &t.rms_final})
            place(*x);
        // The RoPE tables are ours to compute (RopeTable), not to trust from the file.
        at += 2 * rope_floats(h.config);
    }
    if (h.shared)
        w.wcls = w.token_embedding;
    else
        place(t.cls);
    return w;
}

}  // namespace

Model load_checkpoint(const std::string& path) {
    const Where where(path);
    const std::shared_ptr<const MappedFile> file = std::make_shared<MappedFile>(path, "checkpoint");
    const std::int64_t size = file->size();
    HeadBytes head{};
    if (size > 0) std::memcpy(head.data(), file->data(), std::size_t(std::min(size, kV1HeaderBytes)));
    Header h = header_format(head, size, where);
    header_config(head, h, where);
    check_file_size(h, size, where);
    return Model(place_weights(file, h));
}

void save_checkpoint(const std::string& path, const Model& model) {
    const Where where(path);
    const Weights& w = model.w;
    const Config& c = w.config;
    try {
        c.validate();
    } catch (const Error& e) {
        throw where(fmt::format("cannot save: {}", e.what()));
    }

    // Sizes are checked here, not by assert: a mis-sized public span would otherwise be over-read.
    const Layout t = layout(c);
    for (const Tensor* x :
         {&t.emb, &t.rms_att, &t.wq, &t.wk, &t.wv, &t.wo, &t.rms_ffn, &t.w1, &t.w2, &t.w3, &t.rms_final, &t.cls}) {
        const std::size_t have = (w.*x->member).size();
        if (static_cast<std::int64_t>(have) != x->count())
            throw where(fmt::format("cannot save: {} has {} floats, its shape needs {}", x->name, have, x->count()));
    }
    const RopeTable& rope = model.rope;
    const std::int64_t rope_floats = std::int64_t{c.max_seq} * (c.head_size() / 2);
    if (rope.max_seq != c.max_seq || rope.n_pairs != c.head_size() / 2 ||
        static_cast<std::int64_t>(rope.cos.size()) != rope_floats ||
        static_cast<std::int64_t>(rope.sin.size()) != rope_floats)
        throw where(fmt::format("cannot save: RoPE table is [{}, {}], the config needs [{}, {}]", rope.max_seq,
                                rope.n_pairs, c.max_seq, c.head_size() / 2));
    // A shared model stores only the embedding; a classifier elsewhere would be lost.
    if (w.shared_classifier && w.wcls.data() != w.token_embedding.data())
        throw where("cannot save: the classifier of a shared model is not its token embedding");

    FileWriter out(path, where.prefix);
    const std::int32_t header[7] = {c.dim,     c.hidden_dim, c.n_layers,
                                    c.n_heads, c.n_kv_heads, w.shared_classifier ? c.vocab_size : -c.vocab_size,
                                    c.max_seq};
    out.bytes(header, sizeof header);
    for (const Tensor* x :
         {&t.emb, &t.rms_att, &t.wq, &t.wk, &t.wv, &t.wo, &t.rms_ffn, &t.w1, &t.w2, &t.w3, &t.rms_final})
        out.bytes((w.*x->member).data(), x->count() * 4);
    out.bytes(rope.cos.data(), rope_floats * 4);  // freq_cis_real [max_seq, head_size/2]
    out.bytes(rope.sin.data(), rope_floats * 4);  // freq_cis_imag [max_seq, head_size/2]
    if (!w.shared_classifier) out.bytes(w.wcls.data(), t.cls.count() * 4);
    out.close();
}

}  // namespace kvlab
