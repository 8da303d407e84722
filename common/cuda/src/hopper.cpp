// Whether the GPU runs sm_90a code.
#include "fa/cuda/hopper.hpp"

#include <cuda_runtime.h>

#include "fa/cuda/device.hpp"

namespace fa::cuda {

std::string hopper_unavailable_reason() {
    const std::string no_gpu = gpu_unavailable_reason();
    if (!no_gpu.empty()) return "needs a Hopper GPU (compute capability 9.0, sm_90a): " + no_gpu;
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        return "needs a Hopper GPU (compute capability 9.0, sm_90a): the device's compute capability cannot be read";
    }
    if (major == 9 && minor == 0) return "";
    cudaDeviceProp prop{};
    const std::string name = cudaGetDeviceProperties(&prop, device) == cudaSuccess ? prop.name : "this GPU";
    return "needs a Hopper GPU (compute capability 9.0, sm_90a: TMA, wgmma, setmaxnreg); " + name + " is " +
           std::to_string(major) + "." + std::to_string(minor);
}

}  // namespace fa::cuda
