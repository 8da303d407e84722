/// \file fa/cuda/fragments.cuh
/// \brief What a warp does with mma fragments in registers: reductions along a row of an
/// accumulator fragment.
///
/// In a 16 x 8 C fragment of `mma.m16n8k16` (fa/cuda/layouts.hpp, c_fragment_element) lane
/// 4g + t holds columns 2t and 2t+1 of rows g and g + 8: the four lanes of a quad (same g) hold
/// every column of their two rows, in every n-tile alike. A row's max or sum over a whole tile is
/// therefore each lane's own partial result, then two XOR shuffles inside the quad.
#pragma once

#include <cuda_runtime.h>

namespace fa::cuda {

//! [quad]
/// Max across the four lanes of a quad: the lanes that share a row of every fragment.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
/// Sum across the four lanes of a quad.
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
//! [quad]

}  // namespace fa::cuda
