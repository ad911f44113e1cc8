#include "device.h"

#include <fmt/format.h>

#include "cpu_backend.h"

namespace kvlab {

bool gpu_built() { return false; }

std::string gpu_unavailable() { return "this build of kvlab has no GPU support (CUDA was not found when it was built)"; }

std::unique_ptr<Backend> make_backend(std::string_view device, const Model& model, const BackendOptions&) {
    if (device == "cpu") return std::make_unique<CpuBackend>(model);
    if (device == "gpu") throw Error(gpu_unavailable());
    throw Error(fmt::format("unknown device '{}': use cpu or gpu", one_line(std::string(device))));
}

}  // namespace kvlab
