// kvlab core: which kvlab this is. A result quoted in a bug report names the version and commit
// that produced it: `kvlab --version` prints this, and every JSON output and trace carries it.
#pragma once

#include <string>

namespace kvlab {

struct BuildInfo {
    std::string version;     // semantic version, set once in CMakeLists.txt's project()
    std::string commit;      // 12 hex digits, "-dirty" when tracked files differed; "" outside a git checkout
    std::string compiler;    // e.g. "GNU 12.2.0"
    std::string build_type;  // CMake's build type, e.g. "Release"
    std::string sanitizers;  // "address,undefined" in a sanitized build, else ""
    bool native = false;     // compiled for the build machine's vector units (-march=native)
};

const BuildInfo& build_info();

// "kvlab 0.1.0 (commit 88c5e27a1b2c, GNU 12.2.0, Release)": one line, for --version and reports.
std::string version_line();

}  // namespace kvlab
