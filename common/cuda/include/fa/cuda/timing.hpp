/// \file fa/cuda/timing.hpp
/// \brief Timing GPU work with CUDA events: warm-up, the L2 cache flushed before every run, median.
///
/// A host clock around a kernel launch measures the launch, not the kernel: the launch returns at
/// once and the GPU runs later. CUDA events are stamped by the GPU itself in stream order, so
/// `start, kernel, stop` brackets exactly the kernel. Before each timed run a buffer several
/// times the L2's size is overwritten, so every run reads its inputs from device memory as a
/// real first call would, instead of finding them in the 50 MB L2 left warm by the run before.
#pragma once

#include <functional>

#include <cuda_runtime.h>

#include "fa/timing.hpp"

namespace fa::cuda {

/// Bytes overwritten before each timed run: four times the L2 of the current device, at least 64 MiB.
size_t l2_flush_bytes();

/// Runs `launch(stream)` `warmup` times untimed, then `repeat` times, each preceded by an L2
/// flush and bracketed by a pair of CUDA events; returns the summary of the event times.
/// The flush is outside the events. All work goes to `stream`; the call returns after it finished.
TimingStats time_on_gpu(const std::function<void(cudaStream_t)>& launch, int warmup, int repeat,
                        cudaStream_t stream = nullptr);

}  // namespace fa::cuda
