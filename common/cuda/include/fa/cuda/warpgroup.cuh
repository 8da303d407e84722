/// \file fa/cuda/warpgroup.cuh
/// \brief What warp-specialized Hopper kernels need besides the matrix instructions: moving
/// registers between warpgroups (`setmaxnreg`), named barriers (`bar.sync` / `bar.arrive` on a
/// subset of the block), electing one lane (`elect.sync`), and the warpgroup's index (sm_90).
#pragma once

#include <cstdint>

namespace fa::cuda::ptx {

//! [setmaxnreg]
/// `setmaxnreg.inc.sync.aligned.u32 N`: raises this warp's register allocation to `N` per
/// thread (24 <= N <= 256, a multiple of 8), waiting until the SM's pool has them. Every warp of
/// a warpgroup must execute it together. The kernel must be compiled for a fixed allocation
/// (`__launch_bounds__(threads, 1)`), else ptxas ignores it (warning C7508).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes 24..256 in steps of 8");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/// `setmaxnreg.dec.sync.aligned.u32 N`: lowers this warp's allocation to `N` per thread and
/// returns the rest to the SM's pool (a producer warpgroup gives its registers to the consumers).
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes 24..256 in steps of 8");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
//! [setmaxnreg]

//! [named_barriers]
/// `bar.sync id, threads`: waits until `threads` threads (a multiple of 32) have arrived at
/// barrier `id` (0..15; 0 is __syncthreads'). Orders shared-memory accesses of the threads
/// that take part, like __syncthreads for a subset of the block.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/// `bar.arrive id, threads`: counts this warp's arrival at barrier `id` without waiting (the
/// other side of a named_barrier_sync: "my part is done, go on").
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
//! [named_barriers]

//! [elect]
/// `elect.sync`: true in exactly one active lane of the warp (the same one in every lane's
/// view). Cheaper than comparing lane ids when one thread must issue a TMA copy.
__device__ __forceinline__ bool elect_one_sync() {
    uint32_t elected;
    asm volatile(
        "{\n.reg .pred p;\n.reg .b32 lane;\nelect.sync lane|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(elected));
    return elected != 0;
}

/// Index of this thread's warpgroup in the block (threads 0-127: 0, 128-255: 1, ...), made
/// uniform across the warp so the compiler knows branches on it do not diverge.
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0); }
//! [elect]

}  // namespace fa::cuda::ptx
