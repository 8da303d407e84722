// The warp emulator's cuda_runtime.h: just enough of CUDA for stage 09's kernels to compile as
// C++ and run on CPU threads, one std::thread per CUDA thread. A block's threads meet at
// __syncthreads through a std::barrier; a warp's 32 threads exchange registers through a Warp
// (two alternating slots per collective: a lane that has passed collective n+1's barrier knows
// every lane has finished reading collective n's slot). Used by test_stage09_emulated only.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
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
    std::barrier<> bar{32};
    uint32_t addr[2][32];
    uint32_t a[2][32][4];
    uint32_t b[2][32][2];
    float f[2][32];
};
inline thread_local dim3 tid, bid, bdim, gdim;  // threadIdx, blockIdx, blockDim, gridDim
inline thread_local int lane, warp, gen;        // lane, warp in the block, collectives so far
inline thread_local Warp* w;                    // this thread's warp
inline std::barrier<>* block_bar;               // __syncthreads of the running block
inline unsigned char* smem_base;                // the block's shared memory (one block at a time)
inline int next() { return gen++ & 1; }
}  // namespace emu
#define threadIdx (emu::tid)
#define blockIdx (emu::bid)
#define blockDim (emu::bdim)
#define gridDim (emu::gdim)
inline void __syncthreads() { emu::block_bar->arrive_and_wait(); }
inline void __syncwarp() { emu::w->bar.arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// A thread sleeps only in a loop that waits for another block (stage 09's deterministic turns).
// Blocks run here one at a time, in order: a wait that is not over at once is for a block that
// runs later, and would never end. On the GPU that is a wait on a block that may not have started.
inline void __nanosleep(unsigned) {
    std::fprintf(stderr, "emulator: a block waits for a block that runs after it\n");
    std::abort();
}
inline float __shfl_xor_sync(unsigned, float v, int offset) {
    const int p = emu::next();
    emu::w->f[p][emu::lane] = v;
    emu::w->bar.arrive_and_wait();
    const float r = emu::w->f[p][emu::lane ^ offset];
    return r;
}
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline float2 __ldcg(const float2* p) { return *p; }
inline void __stcg(float2* p, float2 v) { *p = v; }
inline bool __any_sync(unsigned, bool v) {
    const int p = emu::next();
    emu::w->f[p][emu::lane] = v ? 1.f : 0.f;
    emu::w->bar.arrive_and_wait();
    bool r = false;
    for (int l = 0; l < 32; ++l) r = r || emu::w->f[p][l] != 0.f;
    return r;
}
