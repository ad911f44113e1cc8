#include "panel_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "file_writer.h"
#include "mapped_file.h"

namespace kvlab {

namespace {

constexpr char kMagic[8] = {'k', 'v', 'p', 'a', 'n', 'e', 'l', 's'};
constexpr std::uint32_t kVersion = 1;
constexpr std::int64_t kHeaderBytes = 4096;  // the panels start on a page

// The file's first bytes (little-endian, as every kvlab file).
struct Header {
    char magic[8];
    std::uint32_t version;
    std::uint32_t panel;     // PackedMatrix::kPanel of the build that wrote it
    std::int32_t config[7];  // dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq
    std::uint32_t shared;    // 1: the classifier is the token embedding
    FileStamp stamp;         // the checkpoint's, when the panels were built
    std::uint64_t checksum;  // checksum64 of the checkpoint's bytes
    std::uint64_t floats;    // panel floats after the header
};
static_assert(sizeof(Header) <= std::size_t(kHeaderBytes));

Header expected_header(const Model& model, std::int64_t floats) {
    const Config& c = model.config();
    Header h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.version = kVersion;
    h.panel = std::uint32_t(PackedMatrix::kPanel);
    const std::int32_t fields[7] = {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.max_seq};
    std::memcpy(h.config, fields, sizeof fields);
    h.shared = model.w.shared_classifier ? 1 : 0;
    h.floats = std::uint64_t(floats);
    return h;
}

// Points every PackedMatrix of p at consecutive panels from `base` (nullptr: only counts them);
// returns the floats they take. The order: layer by layer wq, wk, wv, wo, w1, w2, w3, then wcls.
std::int64_t place_panels(PackedWeights& p, const Config& c, const float* base) {
    std::int64_t at = 0;
    auto take = [&](PackedMatrix& m, int n_in, int n_out) {
        m.n_in = n_in, m.n_out = n_out;
        m.panels = base ? base + at : nullptr;
        at += PackedMatrix::floats(n_in, n_out);
    };
    p.layers.assign(std::size_t(c.n_layers), {});
    for (PackedWeights::Layer& l : p.layers) {
        take(l.wq, c.dim, c.dim);
        take(l.wk, c.dim, c.kv_dim());
        take(l.wv, c.dim, c.kv_dim());
        take(l.wo, c.dim, c.dim);
        take(l.w1, c.dim, c.hidden_dim);
        take(l.w2, c.hidden_dim, c.dim);
        take(l.w3, c.dim, c.hidden_dim);
    }
    take(p.wcls, c.dim, c.vocab_size);
    return at;
}

std::int64_t panel_floats(const Config& c) {
    PackedWeights counting;
    return place_panels(counting, c, nullptr);
}

// Packs every matrix of w into dst[panel_floats(config)].
void pack_all(const Weights& w, float* dst) {
    const Config& c = w.config;
    PackedWeights p;
    place_panels(p, c, dst);
    const std::int64_t dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
    for (std::int64_t l = 0; l < c.n_layers; l++) {
        const PackedWeights::Layer& m = p.layers[std::size_t(l)];
        auto pack = [dst](const PackedMatrix& pm, const float* src) {
            PackedMatrix::pack(src, pm.n_in, pm.n_out, dst + (pm.panels - dst));
        };
        pack(m.wq, w.wq.data() + l * dim * dim);
        pack(m.wk, w.wk.data() + l * kv_dim * dim);
        pack(m.wv, w.wv.data() + l * kv_dim * dim);
        pack(m.wo, w.wo.data() + l * dim * dim);
        pack(m.w1, w.w1.data() + l * hidden * dim);
        pack(m.w2, w.w2.data() + l * dim * hidden);
        pack(m.w3, w.w3.data() + l * hidden * dim);
    }
    PackedMatrix::pack(w.wcls.data(), c.dim, c.vocab_size, dst + (p.wcls.panels - dst));
}

// The panels packed into floats of their own; `floats`, when given, gets their start.
std::shared_ptr<PackedWeights> in_memory(const Model& model, std::string source, const float** floats = nullptr) {
    const std::int64_t n = panel_floats(model.config());
    struct Charged {  // [panel_floats] floats, charged on the memory budget first
        MemoryCharge charge;
        std::unique_ptr<float[]> floats;
    };
    auto held = std::make_shared<Charged>(Charged{
        MemoryCharge(fmt::format("the CPU backend's packed weights ({} floats)", n), n * std::int64_t(sizeof(float))),
        nullptr});
    held->floats.reset(new float[std::size_t(n)]);
    pack_all(model.w, held->floats.get());
    auto p = std::make_shared<PackedWeights>();
    place_panels(*p, model.config(), held->floats.get());
    if (floats) *floats = held->floats.get();
    p->storage = std::move(held);
    p->built_from = model.w.wq.data();
    p->source = std::move(source);
    return p;
}

// The cache at `path` if it is one for this model and checkpoint; null otherwise (missing,
// foreign, truncated or stale: the caller rebuilds it).
std::shared_ptr<PackedWeights> mapped(const Model& model, const MappedFile& checkpoint, const std::string& path) {
    std::shared_ptr<const MappedFile> file;
    try {
        file = std::make_shared<MappedFile>(path, "panel cache");
    } catch (const Error&) {
        return nullptr;
    }
    const std::int64_t n = panel_floats(model.config());
    if (file->size() != kHeaderBytes + 4 * n) return nullptr;
    Header have;
    std::memcpy(&have, file->data(), sizeof have);
    Header want = expected_header(model, n);
    want.stamp = have.stamp, want.checksum = have.checksum;
    if (std::memcmp(&have, &want, sizeof have) != 0) return nullptr;  // another version, width or model
    if (!(have.stamp == checkpoint.stamp())) {
        // The checkpoint was touched, copied or replaced: the same bytes still key the same panels.
        if (checksum64(checkpoint.data(), checkpoint.size()) != have.checksum) return nullptr;
        have.stamp = checkpoint.stamp();
        const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);  // best effort: the next start skips the sum
        if (fd >= 0) {
            (void)!::pwrite(fd, &have, sizeof have, 0);
            ::close(fd);
        }
    }
    auto p = std::make_shared<PackedWeights>();
    place_panels(*p, model.config(), reinterpret_cast<const float*>(file->data() + kHeaderBytes));
    p->storage = std::move(file);
    p->built_from = model.w.wq.data();
    p->source = fmt::format("mapped from {}", path);
    return p;
}

// Writes p's panels (packed from `checkpoint`) to path through a temporary file; "" or why not.
std::string write_cache(const Model& model, const MappedFile& checkpoint, const float* panels,
                        const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path dir = fs::path(path).parent_path();
    if (!dir.empty()) fs::create_directories(dir, ec);
    // A folder marked read-only (a shared models folder) is left alone even by root, who could write it.
    const fs::perms perms = fs::status(dir.empty() ? fs::path(".") : dir, ec).permissions();
    if (!ec && (perms & fs::perms::owner_write) == fs::perms::none) return "the folder is read-only";
    const std::int64_t n = panel_floats(model.config());
    Header h = expected_header(model, n);
    h.stamp = checkpoint.stamp();
    h.checksum = checksum64(checkpoint.data(), checkpoint.size());
    std::vector<char> head(std::size_t(kHeaderBytes), 0);
    std::memcpy(head.data(), &h, sizeof h);
    try {
        FileWriter out(path, "panel cache");
        out.bytes(head.data(), kHeaderBytes);
        out.bytes(panels, 4 * n);
        out.close();
    } catch (const Error& e) {
        const std::string why = e.what();
        return why.substr(std::string_view("panel cache: ").size());
    }
    return "";
}

}  // namespace

std::string panel_cache_path(const std::string& checkpoint, const PanelCacheOption& option) {
    namespace fs = std::filesystem;
    if (option.dir.empty()) return checkpoint + ".kvlab-panels";
    std::error_code ec;
    const std::string absolute = fs::absolute(checkpoint, ec).lexically_normal().string();
    const auto* bytes = reinterpret_cast<const unsigned char*>(absolute.data());
    return (fs::path(option.dir) / fmt::format("{}-{:016x}.kvlab-panels", fs::path(checkpoint).filename().string(),
                                               checksum64(bytes, std::int64_t(absolute.size()))))
        .string();
}

std::shared_ptr<const PackedWeights> packed_weights(const Model& model) {
    using Mode = PanelCacheOption::Mode;
    const PanelCacheOption& option = model.panel_cache;
    const MappedFile* checkpoint = model.w.mapped();
    const std::int64_t bytes = 4 * panel_floats(model.config());
    if (option.mode == Mode::on && !checkpoint)
        throw Error(
            "--panel-cache on needs a checkpoint (--model): a model made in memory has no file to cache beside");
    if (!checkpoint || option.mode == Mode::off || (option.mode == Mode::automatic && bytes < kPanelCacheMinBytes))
        return in_memory(model, "packed in memory");
    const std::string path = panel_cache_path(checkpoint->path(), option);
    if (auto p = mapped(model, *checkpoint, path)) return p;
    const float* floats = nullptr;
    std::shared_ptr<PackedWeights> p = in_memory(model, fmt::format("packed, and cached in {}", path), &floats);
    const std::string why = write_cache(model, *checkpoint, floats, path);
    if (why.empty()) return p;
    const std::string problem = fmt::format("panel cache '{}': cannot write: {}", one_line(path), why);
    if (option.mode == Mode::on)
        throw Error(fmt::format("{} (--panel-cache DIR puts it elsewhere; off packs in memory)", problem));
    static bool noted = false;  // once per process: every backend of the model would say the same
    if (!noted)
        fmt::print(stderr, "kvlab: note: {}; packing in memory at every start (--panel-cache DIR or off)\n", problem);
    noted = true;
    p->source = "packed in memory";
    return p;
}

}  // namespace kvlab
