// kvlab core: the CPU backend's weights, every matrix in register-width panels (kernels.h's
// PackedMatrix), and the panel cache that keeps them in a file between runs.
//
// The panel cache. Packing transposes every matrix (a checkpoint keeps them [out][in]), which for
// a 60 MB model costs more than a hundred milliseconds and a second copy of the weights in memory.
// For a checkpoint that is mapped (checkpoint.h) and big enough to gain from it, the panels are
// written once to `<checkpoint>.kvlab-panels` (or a file in PanelCacheOption::dir) and mapped by
// every later run: start-up reads a header, and the panels are paged in as the first step uses them.
// The file's header names what it was built from: the panel format's version, the panel width of
// this build, the model's shape, and the checkpoint's size, modification time, device, inode and
// 64-bit checksum. A cache whose stamp differs from the checkpoint's is used only if the checksum
// still matches; any other mismatch rebuilds it. It is written to a temporary file and renamed,
// so concurrent runs never see half of one. The panels themselves are trusted, as any build
// cache's outputs are: delete the file (or pass --panel-cache off) to rebuild them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels.h"
#include "model.h"

namespace kvlab {

struct PackedWeights {
    struct Layer {
        PackedMatrix wq, wk, wv, wo, w1, w2, w3;
    };
    std::vector<Layer> layers;  // [n_layers]
    PackedMatrix wcls;
    const float* built_from = nullptr;  // the wq floats of the Weights these were packed from
    std::string source;                 // "packed in memory", "mapped from <file>", ...
    std::shared_ptr<const void> storage;
};

// Models whose matrices take fewer bytes than this pack in memory even under automatic: packing
// them takes a few milliseconds.
inline constexpr std::int64_t kPanelCacheMinBytes = std::int64_t{8} << 20;

// The panels of `model`: mapped from its panel cache, or packed (and then cached) as
// model.panel_cache says. Throws Error when the mode is on and no cache can be used or written.
std::shared_ptr<const PackedWeights> packed_weights(const Model& model);

// Where the panel cache of a checkpoint lives under `option`.
std::string panel_cache_path(const std::string& checkpoint, const PanelCacheOption& option);

}  // namespace kvlab
