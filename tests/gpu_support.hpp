// Host arrays on the device, for the GPU tests: float32 values rounded to the 16-bit type T the
// kernels read (and read back), and int32 arrays (cu_seqlens). A copy of an empty array is an empty buffer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "fa/cuda/buffer.hpp"

namespace fa::test {

/// A 16-bit value widened to float32.
inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float to_float(__half x) { return __half2float(x); }  ///< see the bf16 one

/// `x` rounded to T (__nv_bfloat16 or __half) in a new device buffer.
template <class T>
fa::cuda::DeviceBuffer<T> to_device(const std::vector<float>& x) {
    std::vector<T> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        if constexpr (std::is_same_v<T, __nv_bfloat16>) {
            h[i] = __float2bfloat16(x[i]);
        } else {
            h[i] = __float2half(x[i]);
        }
    }
    fa::cuda::DeviceBuffer<T> d(x.size());
    if (!h.empty()) d.copy_from_host(h.data(), h.size());
    return d;
}

/// `x` in a new device buffer.
inline fa::cuda::DeviceBuffer<int32_t> ints_to_device(const std::vector<int32_t>& x) {
    fa::cuda::DeviceBuffer<int32_t> d(x.size());
    if (!x.empty()) d.copy_from_host(x.data(), x.size());
    return d;
}

}  // namespace fa::test
