// The warp emulator's cuda_runtime.h: just enough of CUDA for the kernels of stages 07, 09 and 11
// to compile as C++ and run on the CPU, and for their host launch code to build its arguments. Each CUDA thread of a block is a fiber (fibers.hpp): all of
// a block's threads take turns on one OS thread, and a thread's own state (threadIdx, its lane,
// its warp, its cp.async groups) lives in its Thread, which emu::self() names while it runs. A
// block's threads meet at __syncthreads in one fibers::Barrier; a warp's 32 threads exchange
// registers through a Warp (two alternating slots per collective, and a barrier: no lane reads a
// slot before all 32 have written it, and a lane that has passed collective n+1's barrier knows
// every lane has finished reading collective n's slot). Used by the tests *_emulated.cpp.
//
// It defines FA_WARP_EMULATOR, so that a source file can leave out what only nvcc compiles (a
// launch with <<<...>>>) when the emulator runs its kernels.
#pragma once
#define FA_WARP_EMULATOR 1
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
#define __grid_constant__
struct dim3 { unsigned x = 0, y = 0, z = 0; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint4 { uint32_t x, y, z, w; };
struct int2 { int x, y; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
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
/// __shfl_sync from lane `src`: the value every lane receives is that lane's.
inline unsigned __shfl_sync(unsigned, unsigned v, int src) {
    emu::Thread& t = *emu::self();
    const int p = emu::next();
    t.w->u[p][t.lane] = v;
    emu::fibers::arrive_and_wait(t.w->bar);
    return t.w->u[p][src & 31];
}
inline int __shfl_sync(unsigned mask, int v, int src) { return int(__shfl_sync(mask, unsigned(v), src)); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline float2 __ldcg(const float2* p) { return *p; }
inline void __stcg(float2* p, float2 v) { *p = v; }
/// __ballot_sync over the whole warp: bit l is lane l's `v`.
inline unsigned __ballot_sync(unsigned, bool v) {
    emu::Thread& t = *emu::self();
    const int p = emu::next();
    t.w->u[p][t.lane] = v ? 1u : 0u;
    emu::fibers::arrive_and_wait(t.w->bar);
    unsigned r = 0;
    for (int l = 0; l < 32; ++l) r |= t.w->u[p][l] << l;
    return r;
}
inline bool __any_sync(unsigned mask, bool v) { return __ballot_sync(mask, v) != 0; }
inline bool __all_sync(unsigned mask, bool v) { return __ballot_sync(mask, v) == 0xffffffffu; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }

// The host's CUDA runtime, as far as the stages' launch code calls it: device memory is host memory,
// a copy is memcpy, a stream orders nothing (each call is done when it returns), and every call
// succeeds. The device has emu::sm_count SMs, so a persistent grid has that many blocks (which run
// one after the other here). cudaGetDriverEntryPointByVersion finds the emulated driver functions of
// cuda.h here, as the real runtime finds the driver's.
typedef int cudaError_t;
inline constexpr cudaError_t cudaSuccess = 0;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8, cudaFuncAttributePreferredSharedMemoryCarveout = 9 };
enum cudaSharedCarveout { cudaSharedmemCarveoutDefault = -1, cudaSharedmemCarveoutMaxShared = 100, cudaSharedmemCarveoutMaxL1 = 0 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0, cudaDriverEntryPointSymbolNotFound = 1 };
inline constexpr unsigned long long cudaEnableDefault = 0;
namespace emu {
inline int sm_count = 4;  // what cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount) says
}
inline const char* cudaGetErrorString(cudaError_t) { return "no error (the warp emulator's runtime)"; }
inline const char* cudaGetErrorName(cudaError_t) { return "cudaSuccess"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaMalloc(void** p, size_t bytes) {
    *p = std::malloc(bytes > 0 ? bytes : 1);
    return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) {
    std::free(p);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
    std::memcpy(dst, src, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void* p, int value, size_t bytes) {
    std::memset(p, value, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) { return cudaMemset(p, value, bytes); }
template <class F>
cudaError_t cudaFuncSetAttribute(F*, cudaFuncAttribute, int) { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int* device) {
    *device = 0;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr, int) {
    *value = emu::sm_count;
    return cudaSuccess;
}

#include "cuda.h"
/// The driver functions the stages ask the runtime for: cuTensorMapEncodeTiled (cuda.h here).
inline cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned, unsigned long long,
                                                    cudaDriverEntryPointQueryResult* status) {
    const bool found = std::strcmp(symbol, "cuTensorMapEncodeTiled") == 0;
    *fn = found ? reinterpret_cast<void*>(&cuTensorMapEncodeTiled) : nullptr;
    if (status != nullptr) *status = found ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}
