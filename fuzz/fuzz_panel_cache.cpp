// fuzz_panel_cache: the CPU's panel cache file (core/panel_cache.h) on arbitrary bytes.
//
// Input: the cache file of one fixed tiny checkpoint (fuzz::panel_fuzz_shape(), seed 11). Seeds: a
// valid cache for it, cut and header-only copies (fuzz/make_seeds.cpp).
// Checks: a backend of the checkpoint with --panel-cache on maps the file or rebuilds it, never
// crashes; a rebuilt cache decodes bit for bit as panels packed in memory, and maps on the next
// load. (A mapped file's panels are trusted, as any build cache's are: no property on its values.)
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "checkpoint.h"
#include "cpu_backend.h"
#include "decode.h"
#include "fuzz_util.h"
#include "panel_cache.h"

using namespace kvlab;

namespace {

struct Setup {
    std::filesystem::path dir;
    std::string model, cache;
    PanelCacheOption option;
    std::vector<float> want;  // [vocab_size] the logits of token 1, panels packed in memory
    Setup() {
        char tmpl[] = "/tmp/kvlab_fuzz_panels_XXXXXX";
        dir = ::mkdtemp(tmpl);
        model = (dir / "model.bin").string();
        const Model m = random_model(fuzz::panel_fuzz_shape(), 11);
        save_checkpoint(model, m);
        option = {PanelCacheOption::Mode::on, (dir / "cache").string()};
        cache = panel_cache_path(model, option);
        CachedDecoder d(m);
        want = d.decode(1);
    }
    ~Setup() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
};

// The model's panels' source, and its logits for token 1.
std::string run(const Setup& s, std::vector<float>& logits) {
    Model m = load_checkpoint(s.model);
    m.panel_cache = s.option;
    CpuBackend backend(m);
    ContiguousCache cache(m.config());
    CachedDecoder d(backend, cache);
    logits = d.decode(1);
    return m.cpu_panels->source;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const Setup s;
    std::filesystem::create_directories(std::filesystem::path(s.cache).parent_path());
    {
        std::ofstream out(s.cache, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
    }
    std::vector<float> logits;
    const std::string source = run(s, logits);
    if (source.starts_with("mapped from")) return 0;
    FUZZ_CHECK(source.starts_with("packed, and cached in"), "a cache was neither mapped nor rebuilt: %s",
               source.c_str());
    FUZZ_CHECK(
        logits.size() == s.want.size() && std::memcmp(logits.data(), s.want.data(), logits.size() * sizeof(float)) == 0,
        "a rebuilt cache decodes differently from panels packed in memory");
    FUZZ_CHECK(run(s, logits).starts_with("mapped from"), "a rebuilt cache does not map on the next load");
    return 0;
}
