// kvlab gpu: choosing where a decoder runs.
//
//   cpu       CpuBackend (core): xsimd and OpenMP
//   gpu       the CUDA backend: the kernels of gpu/kernels.h launched on a device
//   gpu-host  the same per-thread source launched on the host over the whole grid: how the GPU's
//             arithmetic is checked bit for bit on machines without a GPU (CI)
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend.h"
#include "model.h"

namespace kvlab {

// CPU threads are not a backend's: each decoder's Exec carries them (Exec::n_threads).
struct BackendOptions {
    bool graphs = true;  // gpu: capture the cached decode step as a CUDA Graph and replay it
};

// Whether this build compiled the CUDA backend (nvcc was found).
bool gpu_built();
// Why `--device gpu` cannot run here ("" when it can): no CUDA in this build, or no device.
std::string gpu_unavailable();

// A --device value as the devices it names, in order: "cpu", "gpu", "gpu-host", "both" (cpu
// then gpu), or two of them joined by a comma. Throws Error naming the bad part.
std::vector<std::string> parse_devices(std::string_view spec);

// The backend for `device` ("cpu", "gpu" or "gpu-host") over `model` (which must outlive it).
// Throws Error, in one line, for an unknown device name and for a GPU this build or this machine
// does not have (the message is gpu_unavailable()).
std::unique_ptr<Backend> make_backend(std::string_view device, const Model& model, const BackendOptions& options = {});

}  // namespace kvlab
