// The warp emulator's cuda_runtime.h: just enough of CUDA for the kernels of stages 07 and 09 to
// compile as C++ and run on the CPU. Each CUDA thread of a block is a fiber (fibers.hpp): all of
// a block's threads take turns on one OS thread, and a thread's own state (threadIdx, its lane,
// its warp, its cp.async groups) lives in its Thread, which emu::self() names while it runs. A
// block's threads meet at __syncthreads in one fibers::Barrier; a warp's 32 threads exchange
// registers through a Warp (two alternating slots per collective, and a barrier: no lane reads a
// slot before all 32 have written it, and a lane that has passed collective n+1's barrier knows
// every lane has finished reading collective n's slot). Used by test_stage07_emulated and
// test_stage09_emulated.
#pragma once
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fibers.hpp"

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
struct dim3 { unsigned x = 0, y = 0, z = 0; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint4 { uint32_t x, y, z, w; };
struct int2 { int x, y; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
typedef int cudaError_t;
typedef void* cudaStream_t;
namespace emu {
/// What the 32 lanes of one warp exchange in their collectives (ldmatrix, mma, shuffles).
struct Warp {
    fibers::Barrier bar{32, "a warp collective or __syncwarp"};
    uint32_t addr[2][32];
    uint32_t a[2][32][4];
    uint32_t b[2][32][2];
    float f[2][32];
    uint32_t u[2][32];
};
struct Copy { uint32_t dst; const void* src; bool valid; uint32_t bytes; };  // one cp.async (16 or 4 bytes)
/// One CUDA thread: its fiber, and what a CUDA thread keeps for itself.
struct Thread : fibers::Fiber {
    dim3 tid, bid, bdim, gdim;                // threadIdx, blockIdx, blockDim, gridDim
    int lane = 0, warp = 0, gen = 0;          // lane, warp in the block, collectives so far
    Warp* w = nullptr;                        // this thread's warp
    std::vector<std::vector<Copy>> groups;    // committed cp.async groups, oldest first
    std::vector<Copy> open_group;             // copies since the last commit
};
/// The thread running now.
inline Thread* self() { return static_cast<Thread*>(fibers::current); }
inline fibers::Barrier* block_bar;              // __syncthreads of the running block
inline unsigned char* smem_base;                // the block's shared memory (one block at a time)
inline int next() { return self()->gen++ & 1; }
}  // namespace emu
#define threadIdx (emu::self()->tid)
#define blockIdx (emu::self()->bid)
#define blockDim (emu::self()->bdim)
#define gridDim (emu::self()->gdim)
inline void __syncthreads() { emu::fibers::arrive_and_wait(*emu::block_bar); }
inline void __syncwarp() { emu::fibers::arrive_and_wait(emu::self()->w->bar); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// A thread sleeps only in a loop that waits for another block (stage 09's deterministic turns).
// Blocks run here one at a time, in order: a wait that is not over at once is for a block that
// runs later, and would never end. On the GPU that is a wait on a block that may not have started.
inline void __nanosleep(unsigned) {
    std::fprintf(stderr, "emulator: a block waits for a block that runs after it\n");
    std::abort();
}
namespace emu {
/// A shuffle: `v` through this warp's `slots` (Warp::f or Warp::u), lane ^ offset's value back.
template <class V>
V shuffle_xor(V v, int offset, V (Warp::*slots)[2][32]) {
    Thread& t = *self();
    const int p = next();
    (t.w->*slots)[p][t.lane] = v;
    fibers::arrive_and_wait(t.w->bar);
    return (t.w->*slots)[p][t.lane ^ offset];
}
}  // namespace emu
inline float __shfl_xor_sync(unsigned, float v, int offset) { return emu::shuffle_xor(v, offset, &emu::Warp::f); }
inline unsigned __shfl_xor_sync(unsigned, unsigned v, int offset) { return emu::shuffle_xor(v, offset, &emu::Warp::u); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline float2 __ldcg(const float2* p) { return *p; }
inline void __stcg(float2* p, float2 v) { *p = v; }
inline bool __any_sync(unsigned, bool v) {
    emu::Thread& t = *emu::self();
    const int p = emu::next();
    t.w->f[p][t.lane] = v ? 1.f : 0.f;
    emu::fibers::arrive_and_wait(t.w->bar);
    bool r = false;
    for (int l = 0; l < 32; ++l) r = r || t.w->f[p][l] != 0.f;
    return r;
}
