// kvlab core: where the shared model files live.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace kvlab {

// The folder that holds stories260K.bin and tok512.bin, or "" when none is found. Looked up, in
// order: $KVLAB_MODELS_DIR, ../shared/models from the working directory, and the path the build
// was configured with (KVLAB_MODELS_DIR, the checkout's ../shared/models).
inline std::string models_dir() {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (const char* env = std::getenv("KVLAB_MODELS_DIR"); env && *env)
        return fs::is_regular_file(fs::path(env) / "stories260K.bin", ec) ? env : "";
#ifdef KVLAB_MODELS_DIR
    const char* candidates[] = {"../shared/models", KVLAB_MODELS_DIR};
#else
    const char* candidates[] = {"../shared/models"};
#endif
    for (const char* dir : candidates)
        if (fs::is_regular_file(fs::path(dir) / "stories260K.bin", ec)) return dir;
    return "";
}

}  // namespace kvlab
