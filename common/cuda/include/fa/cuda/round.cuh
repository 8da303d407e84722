/// \file common/cuda/include/fa/cuda/round.cuh
/// \brief One float to T on the device, round to nearest even (`from_float<T>`), and back
/// (`to_float`): the conversions every element-wise kernel of the course shares.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace fa::cuda {

/// `x` as T (bf16, fp16 or float), rounded to nearest even.
template <class T>
__device__ __forceinline__ T from_float(float x);
/// from_float() for bf16.
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
/// from_float() for fp16.
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
/// from_float() for float: `x` itself.
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }

/// `x` widened to float (exactly).
__device__ __forceinline__ float to_float(float x) { return x; }
/// to_float() of a bf16.
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
/// to_float() of an fp16.
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

}  // namespace fa::cuda
