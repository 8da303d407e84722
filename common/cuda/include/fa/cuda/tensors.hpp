/// \file fa/cuda/tensors.hpp
/// \brief Device copies of one attention problem's tensors, with the strides of the host views.
///
/// A GPU stage's host entry point copies q, k and v to the device, launches, and copies o and lse
/// back. The device tensors keep the host views' strides, so a kernel that reads through strides
/// handles PyTorch's (B, H, N, d) and flash-attn's (B, N, H, d) layouts alike, on both sides.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "fa/cuda/buffer.hpp"
#include "fa/problem.hpp"
#include "fa/tensor.hpp"

namespace fa::cuda {

/// Elements spanned by a view with non-negative strides: the largest offset plus one.
/// Throws fa::InputError for a negative stride.
int64_t span_elements(const View4<const float>& view);
/// Elements spanned by a rank-3 view (see the rank-4 overload).
int64_t span_elements(const View3<const float>& view);

/// Fills `count` floats at `data` with normal values of standard deviation `stddev`, drawn from
/// a counter-based generator seeded with `seed` (the same seed gives the same values).
void fill_normal(float* data, int64_t count, uint64_t seed, float stddev, cudaStream_t stream = nullptr);

/// Device memory holding q, k, v, o and lse of one problem, and device views of them.
class DeviceTensors {
public:
    /// Copies `q`, `k`, `v` to the device, and also the current contents of `o` and `lse`: the
    /// callers poison those with NaN, so an element the kernel forgets to write stays NaN.
    /// Refuses (fa::InputError) a problem that does not fit in the free device memory.
    DeviceTensors(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v,
                  View4<const float> o, View3<const float> lse);
    /// Random inputs made on the device (normal, seeded), dense in `layout`; o and lse unset.
    /// For benchmarks, where making gigabytes of inputs on the host would dominate the run.
    DeviceTensors(const Problem& problem, Layout layout, uint64_t seed);

    /// Copies the device o and lse into host views of the same shapes and strides.
    void copy_outputs_to(View4<float> o, View3<float> lse) const;

    View4<const float> q;  ///< (B, H, Nq, d) on the device
    View4<const float> k;  ///< (B, H, Nk, d) on the device
    View4<const float> v;  ///< (B, H, Nk, d) on the device
    View4<float> o;        ///< (B, H, Nq, d) on the device
    View3<float> lse;      ///< (B, H, Nq) on the device

    /// Device bytes a problem needs for these five tensors, dense.
    static double bytes_needed(const Problem& problem);

private:
    DeviceBuffer<float> q_, k_, v_, o_, lse_;
};

}  // namespace fa::cuda
