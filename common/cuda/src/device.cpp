#include "fa/cuda/device.hpp"

#include <dlfcn.h>

#include <cstdio>

#include <cuda_runtime.h>

#include "fa/counts.hpp"
#include "fa/cuda/check.hpp"
#include "fa/error.hpp"

namespace fa::cuda {

std::string gpu_unavailable_reason() {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status == cudaErrorNoDevice || (status == cudaSuccess && count == 0)) return "no CUDA device found";
    if (status == cudaErrorInsufficientDriver) return "no CUDA driver, or one older than this build's CUDA runtime";
    if (status != cudaSuccess) {
        // Clear the sticky error so later calls are not confused by it.
        (void)cudaGetLastError();
        return std::string("CUDA unavailable: ") + cudaGetErrorString(status);
    }
    return "";
}

double GpuInfo::fp32_peak_flops() const { return double(sm_count) * 128.0 * 2.0 * double(max_sm_clock_mhz) * 1e6; }

std::string GpuInfo::describe() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s (compute %d.%d, %d SMs, SM clock up to %d MHz, %s memory, %s L2)", name.c_str(),
                  compute_major, compute_minor, sm_count, max_sm_clock_mhz, format_bytes(double(global_memory_bytes)).c_str(),
                  format_bytes(double(l2_bytes)).c_str());
    return buf;
}

GpuInfo gpu_info() {
    int device = 0;
    FA_CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    FA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    GpuInfo info;
    info.name = prop.name;
    info.compute_major = prop.major;
    info.compute_minor = prop.minor;
    info.sm_count = prop.multiProcessorCount;
    info.global_memory_bytes = int64_t(prop.totalGlobalMem);
    info.l2_bytes = prop.l2CacheSize;
    info.shared_memory_per_sm = int64_t(prop.sharedMemPerMultiprocessor);
    info.shared_memory_per_block = int64_t(prop.sharedMemPerBlockOptin);
    info.registers_per_sm = prop.regsPerMultiprocessor;
    info.memory_bus_bits = prop.memoryBusWidth;
    // CUDA 13 removed the clock fields from cudaDeviceProp; the attributes remain.
    int khz = 0;
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
    info.max_sm_clock_mhz = khz / 1000;
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device));
    info.max_memory_clock_mhz = khz / 1000;
    return info;
}

namespace {

// The few NVML entry points we need, declared by hand so no NVML header or library is needed
// at build time; nvml.h documents them. NVML_CLOCK_SM is 1, NVML_SUCCESS is 0.
using nvmlDevice = void*;
using NvmlInit = int (*)();
using NvmlByPciBusId = int (*)(const char*, nvmlDevice*);
using NvmlClockInfo = int (*)(nvmlDevice, int, unsigned int*);

struct Nvml {
    NvmlByPciBusId by_pci = nullptr;
    NvmlClockInfo clock_info = nullptr;
    bool ok = false;
    Nvml() {
        void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) return;
        const auto init = reinterpret_cast<NvmlInit>(dlsym(lib, "nvmlInit_v2"));
        by_pci = reinterpret_cast<NvmlByPciBusId>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
        clock_info = reinterpret_cast<NvmlClockInfo>(dlsym(lib, "nvmlDeviceGetClockInfo"));
        ok = init != nullptr && by_pci != nullptr && clock_info != nullptr && init() == 0;
    }
};

}  // namespace

int current_sm_clock_mhz() {
    static const Nvml nvml;
    if (!nvml.ok) return -1;
    int device = 0;
    char bus_id[32] = {};
    // NVML numbers devices differently from CUDA; the PCI bus id names the same device in both.
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device) != cudaSuccess) return -1;
    nvmlDevice handle = nullptr;
    unsigned int mhz = 0;
    if (nvml.by_pci(bus_id, &handle) != 0 || nvml.clock_info(handle, /*NVML_CLOCK_SM*/ 1, &mhz) != 0) return -1;
    return int(mhz);
}

void require_device_memory(double bytes, const std::string& what) {
    size_t free_bytes = 0, total_bytes = 0;
    FA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    // Keep a little headroom for the runtime's own allocations.
    if (bytes > 0.95 * double(free_bytes)) {
        throw InputError("the problem " + what + " needs about " + format_bytes(bytes) + " of GPU memory but only " +
                         format_bytes(double(free_bytes)) + " of " + format_bytes(double(total_bytes)) + " is free on " +
                         gpu_info().name + ": use smaller sizes");
    }
}

}  // namespace fa::cuda
