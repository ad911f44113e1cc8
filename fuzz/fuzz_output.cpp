// fuzz_output: every file kvlab writes goes through FileWriter (core/file_writer.h), and every
// text it echoes through one_line or valid_utf8 (core/config.h) and json_text (core/json_text.h).
//
// Input: one byte choosing a file name among fixed kinds (a folder, a FIFO, a symbolic link to a
// file, a dangling link, a link to a FIFO, /dev/null) or one made of the next bytes; then the
// bytes to write, which are also the text to escape.
// Checks: a write ends in a kvlab::Error or leaves the file holding exactly the bytes (through a
// link: the link's file, the link kept), and never a temporary; a FIFO never blocks. one_line's
// text is valid UTF-8 without control bytes; valid_utf8 is valid, idempotent and leaves valid
// UTF-8 alone; json_text never throws and parses back to valid_utf8's strings.
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "file_writer.h"
#include "fuzz_util.h"
#include "json_text.h"

using namespace kvlab;
namespace fs = std::filesystem;

namespace {

struct Scratch {
    fs::path dir;
    Scratch() {
        char tmpl[] = "/tmp/kvlab_fuzz_output_XXXXXX";
        dir = ::mkdtemp(tmpl);
        fs::create_directories(dir / "folder");
        ::mkfifo((dir / "fifo").c_str(), 0600);
        std::ofstream(dir / "target") << "old";
        fs::create_symlink("target", dir / "link");
        fs::create_symlink("nowhere", dir / "dangling");
        fs::create_symlink("fifo", dir / "link-to-fifo");
    }
    ~Scratch() { fs::remove_all(dir); }
    // The fixed entries and whatever the last run left: no name with ".tmp-" may stay.
    bool has_temporaries() const {
        for (const auto& e : fs::directory_iterator(dir))
            if (e.path().filename().string().find(".tmp-") != std::string::npos) return true;
        return false;
    }
};

std::string slurp(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

bool is_utf8(const std::string& s) { return valid_utf8(s) == s; }

void check_text(const std::string& text) {
    const std::string line = one_line(text), valid = valid_utf8(text);
    FUZZ_CHECK(is_utf8(line), "one_line left bytes that are not UTF-8");
    for (char ch : line) FUZZ_CHECK(static_cast<unsigned char>(ch) >= 0x20 && ch != 0x7f, "one_line left a control");
    FUZZ_CHECK(valid_utf8(valid) == valid, "valid_utf8 is not idempotent");
    const nlohmann::json j = {{"k:" + text, text}, {"list", {text, 1}}};
    const nlohmann::json back = nlohmann::json::parse(json_text(j, 2));
    FUZZ_CHECK(back["list"][0] == valid && back.at("k:" + valid) == valid, "json_text changed more than bad bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const Scratch scratch;
    if (size < 1) return 0;
    const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
    check_text(rest);

    static const char* const kFixed[] = {"folder", "fifo", "link", "dangling", "link-to-fifo", "/dev/null"};
    std::string name;
    if (data[0] < 6) {
        name = kFixed[data[0]];
    } else {          // one file name of up to 32 of the bytes: no '/', no NUL, not "." or ".."
        name = "n-";  // never one of the fixed entries
        for (std::size_t i = 0; i < rest.size() && name.size() < 34; i++)
            if (rest[i] != '/' && rest[i] != '\0') name += rest[i];
    }
    const std::string path = name[0] == '/' ? name : (scratch.dir / name).string();
    try {
        write_file(path, "fuzz", rest);
        if (name != "/dev/null") {
            const fs::path written = name == "link"       ? scratch.dir / "target"
                                     : name == "dangling" ? scratch.dir / "nowhere"
                                                          : fs::path(path);
            FUZZ_CHECK(slurp(written) == rest, "the file does not hold the bytes written");
            if (name == "link" || name == "dangling") FUZZ_CHECK(fs::is_symlink(path), "the link was replaced");
        }
    } catch (const Error&) {
        FUZZ_CHECK(name == "folder" || name == "fifo" || name == "link-to-fifo", "a regular file was refused");
    }
    // What a run created goes (its name may hold ".tmp-" too), so the folder stays the fixed kinds.
    std::error_code ec;
    if (data[0] >= 6) fs::remove(path, ec);
    if (name == "dangling") fs::remove(scratch.dir / "nowhere", ec);
    FUZZ_CHECK(!scratch.has_temporaries(), "a temporary file was left");
    return 0;
}
