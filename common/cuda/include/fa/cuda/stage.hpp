/// \file fa/cuda/stage.hpp
/// \brief What a GPU stage adds to the shared stage driver: the host entry point built from the
/// device one, timing with CUDA events, the GPU and its clock in the report.
#pragma once

#include <functional>

#include <cuda_runtime.h>

#include "fa/stage.hpp"

namespace fa::cuda {

/// The device entry point of a GPU stage: views of device memory, work queued on `stream`.
using DeviceAttentionFn = std::function<void(const Problem&, View4<const float> q, View4<const float> k,
                                             View4<const float> v, View4<float> o, View3<float> lse,
                                             cudaStream_t stream)>;

/// Host entry point made from a device one: copies q, k, v (and the poisoned o, lse) to the
/// device, runs `device_entry` on the default stream, copies o and lse back.
void run_on_device(const DeviceAttentionFn& device_entry, const Problem& problem, View4<const float> q,
                   View4<const float> k, View4<const float> v, View4<float> o, View3<float> lse);

/// A StageSpec::bench for a GPU stage: the inputs are copied to the device once, then
/// time_on_gpu() times `device_entry` alone (CUDA events, warm-up, L2 flushed, median).
std::function<TimingStats(const Problem&, const Inputs&, const CommonOptions&)> device_bench(DeviceAttentionFn device_entry);

/// A StageSpec::after_bench: prints the GPU, its SM clock just after the timed runs, and the
/// measured rate against the GPU's float32 FMA peak.
void print_gpu_report(const Problem& problem, const TimingStats& stats);

/// A StageSpec::after_bench for the tensor-core stages: the GPU, its SM clock and the measured
/// rate, which the lesson sets against the mma.sync ceiling bench/mma_ceiling measures.
void print_tensor_core_report(const Problem& problem, const TimingStats& stats);

}  // namespace fa::cuda
