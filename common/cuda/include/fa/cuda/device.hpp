/// \file fa/cuda/device.hpp
/// \brief Is there a GPU, which one, how fast is it clocked, and does a problem fit in its memory.
#pragma once

#include <cstdint>
#include <string>

namespace fa::cuda {

/// "" when a CUDA GPU can be used; otherwise one line saying why not (no driver, no device).
std::string gpu_unavailable_reason();

/// What the course reports about the GPU it ran on (device 0, the current device).
struct GpuInfo {
    std::string name;              ///< e.g. "NVIDIA H100 80GB HBM3"
    int compute_major = 0;         ///< compute capability, major part (9 for Hopper)
    int compute_minor = 0;         ///< compute capability, minor part
    int sm_count = 0;              ///< streaming multiprocessors
    int max_sm_clock_mhz = 0;      ///< peak SM clock the device reports (cudaDevAttrClockRate)
    int max_memory_clock_mhz = 0;  ///< peak memory clock (cudaDevAttrMemoryClockRate)
    int memory_bus_bits = 0;       ///< width of the memory bus
    int64_t global_memory_bytes = 0;     ///< device memory
    int64_t l2_bytes = 0;                ///< L2 cache
    int64_t shared_memory_per_sm = 0;    ///< shared memory of one SM
    int64_t shared_memory_per_block = 0; ///< most shared memory one block may opt in to
    int registers_per_sm = 0;      ///< 32-bit registers of one SM
    /// Peak float32 FMA rate in FLOP/s: SMs x 128 lanes x 2 x peak clock (Volta and later).
    double fp32_peak_flops() const;
    /// One line: name, SMs, clock, memory.
    std::string describe() const;
};

/// Reads the current device's description (throws fa::cuda::Error without a GPU).
GpuInfo gpu_info();

/// The SM clock right now in MHz, read through NVML (loaded at run time, so the programs still
/// start on machines without a driver); -1 when NVML is not available. Read it right after a
/// timed run to see the clock the run actually had.
int current_sm_clock_mhz();

/// Throws fa::InputError when `bytes` do not fit in the device memory that is free now.
/// \param bytes what the run needs, in bytes
/// \param what  the problem, for the message (e.g. Problem::describe())
void require_device_memory(double bytes, const std::string& what);

}  // namespace fa::cuda
