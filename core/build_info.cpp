// kvlab core: which kvlab this is (build_info.h). The version, compiler and build type come from
// CMake as definitions on this file; the commit from a source written at build time
// (cmake/commit.cmake), so that a new commit relinks but recompiles nothing else.
#include "build_info.h"

#include <fmt/format.h>

namespace kvlab {

extern const char* const kBuildCommit;

const BuildInfo& build_info() {
    static const BuildInfo info{
        KVLAB_VERSION, kBuildCommit, KVLAB_COMPILER, KVLAB_BUILD_TYPE, KVLAB_SANITIZERS, KVLAB_BUILD_NATIVE != 0,
    };
    return info;
}

std::string version_line() {
    const BuildInfo& b = build_info();
    std::string build = b.build_type;
    if (!b.sanitizers.empty()) build += ", sanitizers " + b.sanitizers;
    if (b.native) build += ", -march=native";
    return fmt::format("kvlab {} (commit {}, {}, {})", b.version,
                       b.commit.empty() ? "unknown: not built from a git checkout" : b.commit, b.compiler, build);
}

}  // namespace kvlab
