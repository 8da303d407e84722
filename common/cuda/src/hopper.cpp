// Whether the GPU runs sm_90a code.
#include "fa/cuda/hopper.hpp"

#include <cuda_runtime.h>

#include "fa/cuda/device.hpp"

namespace fa::cuda {

std::string hopper_unavailable_reason() {
    const std::string no_gpu = gpu_unavailable_reason();
    if (!no_gpu.empty()) return no_gpu;
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        return "the device's compute capability cannot be read";
    }
    if (major == 9 && minor == 0) return "";
    cudaDeviceProp prop{};
    const std::string name = cudaGetDeviceProperties(&prop, device) == cudaSuccess ? prop.name : "this GPU";
    return name + " is compute capability " + std::to_string(major) + "." + std::to_string(minor) +
           "; this code is built for sm_90a (Hopper, 9.0: TMA, wgmma, setmaxnreg)";
}

}  // namespace fa::cuda
