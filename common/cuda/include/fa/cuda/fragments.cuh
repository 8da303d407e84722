/// \file fa/cuda/fragments.cuh
/// \brief What a warp does with mma fragments in registers: reductions along a row of an
/// accumulator fragment, and the quad transpose that gathers 16 contiguous bytes of a row.
///
/// In a 16 x 8 C fragment of `mma.m16n8k16` (fa/cuda/layouts.hpp, c_fragment_element) lane
/// 4g + t holds columns 2t and 2t+1 of rows g and g + 8: the four lanes of a quad (same g) hold
/// every column of their two rows, in every n-tile alike. A row's max or sum over a whole tile is
/// therefore each lane's own partial result, then two XOR shuffles inside the quad.
///
/// The same holds for wgmma's accumulator (fa/cuda/wgmma_layout.hpp), per warp of the warpgroup.
/// A lane's two columns of an 8-column block are 4 bytes once rounded to 16 bits; the quad's four
/// lanes hold the block's 16 bytes. quad_transpose() regroups four blocks so that each lane holds
/// one whole block, to be stored with one 16-byte store.
#pragma once

#include <cstdint>

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

//! [quad_transpose]
/// Transposes the 4 x 4 matrix of 32-bit words a quad holds, lane t (of 4) holding row t in
/// `v`: afterwards lane t holds column t. Two exchanges of two words each: lanes t and t ^ 2
/// swap the 2 x 2 blocks off the diagonal, then lanes t and t ^ 1 swap the two off-diagonal
/// words of every 2 x 2 block. Four shuffles; the selects keep every index a constant.
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], int t) {
    const bool lower = (t & 2) != 0;  // rows 2 and 3 send their columns 0 and 1, rows 0 and 1 their 2 and 3
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const uint32_t got = __shfl_xor_sync(0xffffffffu, lower ? v[j] : v[j + 2], 2);
        if (lower) {
            v[j] = got;
        } else {
            v[j + 2] = got;
        }
    }
    const bool odd = (t & 1) != 0;  // in each 2 x 2 block, an even row sends its word 1, an odd row its word 0
#pragma unroll
    for (int c = 0; c < 4; c += 2) {
        const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? v[c] : v[c + 1], 1);
        if (odd) {
            v[c] = got;
        } else {
            v[c + 1] = got;
        }
    }
}
//! [quad_transpose]

}  // namespace fa::cuda
