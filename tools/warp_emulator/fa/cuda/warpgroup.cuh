// The warp emulator's fa/cuda/warpgroup.cuh. setmaxnreg: the warp meets, and the block's end checks
// that the warps of each warpgroup asked for the same counts (the register file is not modeled).
// bar.sync / bar.arrive id, count: an arrival per thread (a whole warp arrives as 32, as on the
// GPU); the count-th releases the waiters and the barrier starts over; a use with another count
// than the current one, barrier 0 (__syncthreads' own), and a barrier left half full at the
// block's end stop the emulator. elect.sync elects lane 31: the PTX ISA promises one lane, the same
// each time, not which, so a kernel that assumes lane 0 shows it here.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "async_units.hpp"

namespace fa::cuda::ptx {
template <int N>
inline void setmaxnreg_inc() {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes 24..256 in steps of 8");
    emu::hopper::setmaxnreg(N);
}
template <int N>
inline void setmaxnreg_dec() {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes 24..256 in steps of 8");
    emu::hopper::setmaxnreg(N);
}
inline void named_barrier_sync(uint32_t id, uint32_t threads) { emu::hopper::named_barrier(id, threads, true); }
inline void named_barrier_arrive(uint32_t id, uint32_t threads) { emu::hopper::named_barrier(id, threads, false); }
inline bool elect_one_sync() { return __shfl_sync(0xffffffffu, int(emu::self()->lane), 31) == emu::self()->lane; }
inline int warpgroup_index() { return __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0); }
}  // namespace fa::cuda::ptx
