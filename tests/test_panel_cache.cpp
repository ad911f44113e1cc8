// The CPU's panel cache (core/panel_cache.h): a mapped cache decodes bit for bit as panels packed
// in memory, a stale or damaged one is rebuilt, and one that cannot be written is refused (on) or
// noted and packed in memory (auto).
#include <fcntl.h>
#include <fmt/format.h>
#include <rapidcheck/catch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "cpu_backend.h"
#include "decode.h"
#include "model_loader.h"
#include "panel_cache.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace kvlab;

namespace {

// A folder under the system temp folder, removed with everything in it when it goes out of scope.
class TempDir {
public:
    TempDir() {
        static int counter = 0;
        path_ = fs::temp_directory_path() / fmt::format("kvlab_panels_{}_{}", ::getpid(), counter++);
        fs::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
        fs::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string file(const std::string& name) const { return (path_ / name).string(); }
    const fs::path& path() const { return path_; }

private:
    fs::path path_;
};

std::vector<int> some_tokens(const Config& c, int n) {
    std::vector<int> t;
    for (int i = 0; i < n && i < c.max_seq; i++) t.push_back((7 * i + 1) % c.vocab_size);
    return t;
}

// Logits of a cached prefill then two decode steps (multi-row and one-row products both run).
std::vector<float> run(const Model& m) {
    const Config& c = m.config();
    const std::vector<int> t = some_tokens(c, std::max(1, c.max_seq - 2));
    CachedDecoder d(m);
    std::vector<float> out = d.prefill(t);
    for (int i = 0; i < 2 && int(t.size()) + i < c.max_seq; i++) {
        const std::vector<float>& l = d.decode(i % c.vocab_size);
        out.insert(out.end(), l.begin(), l.end());
    }
    return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

Model load_with(const std::string& path, PanelCacheOption option) {
    Model m = load_checkpoint(path);
    m.panel_cache = std::move(option);
    return m;
}

// The panels' source as the first backend of m reports it.
std::string source_of(const Model& m) {
    CpuBackend b(m);
    return m.cpu_panels->source;
}

const PanelCacheOption kOn{PanelCacheOption::Mode::on, ""};

}  // namespace

TEST_CASE("a mapped panel cache decodes bit for bit as panels packed in memory", "[panels]") {
    rc::prop("any model shape, shared or separate classifier", [] {
        const Config c = *test::gen_tiny_config();
        const bool shared = *rc::gen::arbitrary<bool>();
        const Model original = random_model(c, *rc::gen::arbitrary<std::uint64_t>(), shared);
        TempDir dir;
        const std::string path = dir.file("model.bin");
        save_checkpoint(path, original);
        const std::vector<float> want = run(original);  // packed in memory, from this process's floats
        const Model first = load_with(path, kOn);
        RC_ASSERT(source_of(first).starts_with("packed, and cached in"));
        RC_ASSERT(fs::exists(path + ".kvlab-panels"));
        RC_ASSERT(same_bits(run(first), want));
        const Model second = load_with(path, kOn);
        RC_ASSERT(source_of(second).starts_with("mapped from"));
        RC_ASSERT(same_bits(run(second), want));
    });
}

TEST_CASE("a damaged or foreign panel cache is rebuilt and never trusted or crashed on", "[panels]") {
    rc::prop("one header byte changed, or the file cut short", [] {
        const Config c = *test::gen_tiny_config();
        const Model original = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
        TempDir dir;
        const std::string path = dir.file("model.bin"), cache = path + ".kvlab-panels";
        save_checkpoint(path, original);
        (void)source_of(load_with(path, kOn));
        const auto size = std::int64_t(fs::file_size(cache));
        const bool cut = *rc::gen::arbitrary<bool>();
        const int at = *rc::gen::inRange(0, 128);  // magic .. panel count, and padding after
        if (cut) {
            fs::resize_file(cache, std::uintmax_t(*rc::gen::inRange<std::int64_t>(0, size)));
        } else {
            std::fstream f(cache, std::ios::in | std::ios::out | std::ios::binary);
            f.seekg(at);
            const char b = char(f.get() ^ (1 << *rc::gen::inRange(0, 8)));
            f.seekp(at);
            f.put(b);
        }
        const Model again = load_with(path, kOn);
        const std::string source = source_of(again);
        RC_TAG(cut ? "cut" : "flipped");
        // The header (panel_cache.cpp): magic 0-7, version 8, panel width 12, config 16-43, shared 44,
        // the checkpoint's stamp 48-79 and checksum 80-87, panel count 88-95, zeros to 4096. A changed
        // stamp sends the check to the checksum (which still matches); a changed checksum is not read
        // while the stamp matches; the zeros are not read.
        const bool keyed_only = !cut && at >= 48 && at < 88;
        const bool padding = !cut && at >= 96;
        RC_ASSERT(source.starts_with(keyed_only || padding ? "mapped from" : "packed, and cached in"));
        RC_ASSERT(same_bits(run(again), run(original)));
    });
}

TEST_CASE("the panel cache follows its checkpoint: rebuilt when the bytes change and kept when only the stamp does",
          "[panels]") {
    const Config c = stories260k_shape();
    TempDir dir;
    const std::string path = dir.file("model.bin");
    save_checkpoint(path, random_model(c, 1));
    (void)source_of(load_with(path, kOn));

    SECTION("another model of the same shape at the same path") {
        const Model other = random_model(c, 2);
        save_checkpoint(path, other);
        const Model m = load_with(path, kOn);
        CHECK(source_of(m).starts_with("packed, and cached in"));
        CHECK(same_bits(run(m), run(other)));
        CHECK(source_of(load_with(path, kOn)).starts_with("mapped from"));
    }
    SECTION("the same bytes copied over it (a new inode and time): the checksum keys the cache") {
        const std::string copy = dir.file("copy.bin");
        fs::copy_file(path, copy);
        fs::rename(copy, path);
        const Model m = load_with(path, kOn);
        CHECK(source_of(m).starts_with("mapped from"));
        CHECK(same_bits(run(m), run(random_model(c, 1))));
    }
}

TEST_CASE("a panel cache that cannot be written: on refuses in one line and auto notes it and packs in memory",
          "[panels]") {
    TempDir dir;
    const std::string path = dir.file("model.bin"), cache = path + ".kvlab-panels";
    const Model original = random_model(stories260k_shape(), 3);
    save_checkpoint(path, original);
    // A folder where the cache file would go: no rename replaces it, whoever runs the test.
    fs::create_directories(fs::path(cache) / "in-the-way");
    try {
        (void)source_of(load_with(path, kOn));
        FAIL("no error");
    } catch (const Error& e) {
        CHECK_THAT(e.what(), Catch::Contains("panel cache '" + cache + "': cannot write") &&
                                 Catch::Contains("--panel-cache DIR puts it elsewhere"));
    }
    const Model m = load_with(path, {PanelCacheOption::Mode::automatic, ""});
    CHECK(source_of(m) == "packed in memory");  // stories260K's shape is under kPanelCacheMinBytes
    // A folder marked read-only (as a shared models folder is) is not written, even by root.
    const fs::path ro = dir.path() / "read-only";
    fs::create_directories(ro);
    save_checkpoint((ro / "model.bin").string(), original);
    fs::permissions(ro, fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                    fs::perm_options::remove);
    CHECK_THROWS_WITH(source_of(load_with((ro / "model.bin").string(), kOn)),
                      Catch::Contains("cannot write: the folder is read-only"));
    fs::permissions(ro, fs::perms::owner_all, fs::perm_options::add);
    CHECK(!fs::exists(ro / "model.bin.kvlab-panels"));
    const Model forced = load_with(path, {PanelCacheOption::Mode::on, dir.file("elsewhere")});
    CHECK(source_of(forced).starts_with("packed, and cached in " + dir.file("elsewhere")));
    CHECK(same_bits(run(forced), run(original)));
    CHECK(source_of(load_with(path, {PanelCacheOption::Mode::on, dir.file("elsewhere")})).starts_with("mapped from"));
}

TEST_CASE("automatic caching is for big models: a small one packs in memory and writes nothing", "[panels]") {
    TempDir dir;
    const std::string path = dir.file("model.bin");
    save_checkpoint(path, random_model(stories260k_shape(), 4));
    CHECK(source_of(load_with(path, {PanelCacheOption::Mode::automatic, ""})) == "packed in memory");
    CHECK(!fs::exists(path + ".kvlab-panels"));
    CHECK(source_of(load_with(path, {PanelCacheOption::Mode::off, ""})) == "packed in memory");
    Model made = random_model(stories260k_shape(), 4);
    CHECK(source_of(made) == "packed in memory");
    made.panel_cache = kOn;
    made.cpu_panels = nullptr;
    CHECK_THROWS_WITH(source_of(made), Catch::Contains("--panel-cache on needs a checkpoint"));
}

TEST_CASE("the stamp is trusted: a checkpoint rewritten in place with its old time restored keeps a stale cache",
          "[panels]") {
    // The documented limit (panel_cache.h), shown so that it stays a choice: the same size, inode
    // and modification time are taken to mean the same bytes, as make and ccache take them.
    const Config c = stories260k_shape();
    TempDir dir;
    const std::string path = dir.file("model.bin");
    const Model first = random_model(c, 5), second = random_model(c, 6);
    save_checkpoint(path, first);
    (void)source_of(load_with(path, kOn));
    struct stat before {};
    REQUIRE(::stat(path.c_str(), &before) == 0);
    const std::string other = dir.file("other.bin");
    save_checkpoint(other, second);
    {
        std::ifstream in(other, std::ios::binary);
        std::fstream out(path, std::ios::in | std::ios::out | std::ios::binary);  // same inode, same size
        out << in.rdbuf();
    }
    const struct timespec times[2] = {before.st_atim, before.st_mtim};
    REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
    const Model stale = load_with(path, kOn);
    CHECK(source_of(stale).starts_with("mapped from"));
    // The old model's panels with the new file's norms: the output is neither model's.
    CHECK(!same_bits(run(stale), run(second)));
    CHECK(!same_bits(run(stale), run(first)));
    const Model fresh = load_with(path, {PanelCacheOption::Mode::off, ""});
    CHECK(same_bits(run(fresh), run(second)));  // --panel-cache off reads them
}
