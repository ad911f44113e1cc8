#include "device.h"

#include <fmt/format.h>

#include "cpu_backend.h"
#include "host_backend.h"
#ifdef KVLAB_HAVE_CUDA
#include "cuda_backend.h"
#endif

namespace kvlab {

#ifdef KVLAB_HAVE_CUDA
bool gpu_built() { return true; }
std::string gpu_unavailable() { return cuda_unavailable(); }
#else
bool gpu_built() { return false; }
std::string gpu_unavailable() {
    return "this build of kvlab has no GPU support (CUDA was not found when it was built); --device gpu-host runs "
           "the GPU kernels on the CPU";
}
#endif

std::unique_ptr<Backend> make_backend(std::string_view device, const Model& model, const BackendOptions& options) {
    if (device == "cpu") return std::make_unique<CpuBackend>(model);
    if (device == "gpu-host") return std::make_unique<GpuHostBackend>(model);
    if (device == "gpu") {
        if (const std::string why = gpu_unavailable(); !why.empty()) throw Error(why);
#ifdef KVLAB_HAVE_CUDA
        return std::make_unique<CudaBackend>(model, options.graphs);
#endif
    }
    (void)options;
    throw Error(fmt::format("unknown device '{}': use cpu, gpu or gpu-host", one_line(std::string(device))));
}

std::vector<std::string> parse_devices(std::string_view spec) {
    if (spec == "both") return {"cpu", "gpu"};
    std::vector<std::string> devices;
    std::size_t from = 0;
    while (true) {
        const std::size_t comma = spec.find(',', from);
        const std::string name(spec.substr(from, comma == std::string_view::npos ? spec.npos : comma - from));
        if (name != "cpu" && name != "gpu" && name != "gpu-host")
            throw Error(fmt::format("--device: '{}' is not a device (cpu, gpu, gpu-host, both, or two joined by a comma)",
                                    one_line(name)));
        for (const std::string& d : devices)
            if (d == name) throw Error(fmt::format("--device: '{}' is named twice", name));
        devices.push_back(name);
        if (comma == std::string_view::npos) break;
        from = comma + 1;
    }
    if (devices.size() > 2) throw Error("--device: at most two devices, to compare side by side");
    return devices;
}

}  // namespace kvlab
