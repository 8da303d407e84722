// The warp emulator's fa/cuda/wgmma.cuh (async_units.hpp holds the queue). A wgmma.mma_async
// m64nNk16 joins its warpgroup's queue with each thread's accumulator and A registers, and runs
// only when every thread of the warpgroup has reached a wgmma.wait_group that covers its group:
// then it reads A and B (from shared memory through the descriptors, by the PTX ISA's canonical
// layouts and swizzles, or A from the threads' registers) and the accumulators, and writes D =
// A B (+ D), each sum in float32, k in order. So what a kernel does to an operand or an
// accumulator between the issue and the wait changes the result, as the PTX ISA leaves it
// undefined. wgmma.fence is checked only where the ISA asks for it before a warpgroup's first
// wgmma (the registers it orders are the same memory here); the operand fences do nothing.
#pragma once
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "async_units.hpp"

namespace fa::cuda::ptx {
inline void wgmma_fence() { emu::hopper::wgmma_fence(); }
inline void wgmma_commit_group() { emu::hopper::wgmma_commit_group(); }
template <int N>
inline void wgmma_wait_group() {
    emu::hopper::wgmma_wait_group(N);
}
inline void warpgroup_fence_operand(float&) {}
template <int R>
inline void warpgroup_fence_operands(float (&)[R]) {}
template <int N, class T>
inline void wgmma_m64nNk16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate, bool trans_b) {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk16: N is 8..256, a multiple of 8");
    emu::hopper::wgmma_issue(N, std::is_same_v<T, __half>, false, trans_b, accumulate, desc_a, desc_b, d, nullptr);
}
template <int N, class T>
inline void wgmma_m64nNk16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate, bool trans_b) {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk16: N is 8..256, a multiple of 8");
    emu::hopper::wgmma_issue(N, std::is_same_v<T, __half>, true, trans_b, accumulate, 0, desc_b, d, a);
}
// A read transposed (stored MN-major, imm-trans-a = 1): the same op with A through the MN-major layout.
template <int N, class T>
inline void wgmma_m64nNk16_ss_ta(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate, bool trans_b) {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk16: N is 8..256, a multiple of 8");
    emu::hopper::wgmma_issue(N, std::is_same_v<T, __half>, false, trans_b, accumulate, desc_a, desc_b, d, nullptr, true);
}
}  // namespace fa::cuda::ptx
