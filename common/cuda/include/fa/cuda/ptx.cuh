/// \file fa/cuda/ptx.cuh
/// \brief The PTX instructions the tensor-core stages use, one small inline function each.
///
/// Each wrapper is named after its instruction and says, in its comment, which lane of the warp
/// holds which element of the fragments it reads or writes. The notation follows the PTX ISA:
/// for a warp's 32 lanes,
///
///     g = lane / 4   (the "group": which row of an 8-row slab the lane serves)
///     t = lane % 4   (the lane's place inside its group of four)
///
/// Pictures: docs/images/mma_fragments.svg (A, B and C of m16n8k16), docs/images/ldmatrix.svg
/// (ldmatrix and its .trans form), docs/images/pipeline.svg (cp.async groups).
///
/// All of them need compute capability 8.0 or later (Ampere, Hopper): `mma.sync` with bf16,
/// `ldmatrix` and `cp.async` arrived with sm_80. The layouts they produce, and the lane patterns
/// that pick which rows `ldmatrix` loads, are in fa/cuda/layouts.hpp.
///
/// tools/warp_emulator/fa/cuda/ptx.cuh stands in for this header in the CPU test of stage 09:
/// every wrapper there does, lane by lane, what the PTX ISA says the instruction does.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace fa::cuda::ptx {

/// The shared-memory address of a generic pointer into shared memory, as the 32-bit value the
/// `.shared` state space takes.
__device__ __forceinline__ uint32_t smem_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

//! [mma]
/// `D = A * B + C` on the tensor cores for one 16 x 8 x 16 tile, 16-bit inputs, float32
/// accumulators: `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` (or `.f16.f16` for fp16).
///
/// Fragments, per lane (each `uint32_t` holds two 16-bit elements, the lower column first):
///
///     A (16 x 16, row-major)   a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]
///                              a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
///     B (16 x 8, "col")        b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]
///     C, D (16 x 8, float32)   c[0], c[1] = C[g][2t, 2t+1]    c[2], c[3] = C[g+8][2t, 2t+1]
///
/// "col" for B means each register holds two elements of one *column* of B: B is read as if
/// stored column by column, which for `S = Q K^T` is exactly K stored row by row.
/// `T` is `__nv_bfloat16` or `__half`; `d` may alias `c`.
template <class T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                             const float (&c)[4]);

/// mma_m16n8k16() for bf16 operands.
template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                            const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

/// mma_m16n8k16() for fp16 operands.
template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                     const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
//! [mma]

//! [ldmatrix]
/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: four 8 x 8 matrices of 16-bit elements from
/// shared memory into registers, the way the tensor cores want them.
///
/// Lanes 8i .. 8i+7 each give the address of one 16-byte row of matrix i (row `lane % 8`).
/// Afterwards `r[i]` of every lane holds two elements of matrix i: row g, columns 2t and 2t+1.
/// With matrix 0 = rows 0-7 / columns 0-7 of a 16 x 16 tile, matrix 1 = rows 8-15 / columns
/// 0-7, matrix 2 = rows 0-7 / columns 8-15 and matrix 3 = rows 8-15 / columns 8-15, `r` is
/// the A fragment of mma_m16n8k16 as it stands. The rows may sit anywhere in shared memory
/// (16-byte aligned), which is what lets the tile be swizzled.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_row_address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_row_address));
}

/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`: as ldmatrix_x4, but each matrix arrives
/// transposed: `r[i]` holds row 2t and 2t+1 of column g of matrix i. Reading V (stored as
/// [keys, d], one key per row) this way gives each lane a pair of consecutive keys of one
/// feature column: the B fragment of `O += P V` without ever storing V transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_row_address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_row_address));
}
//! [ldmatrix]

//! [cp_async]
/// `cp.async.cg.shared.global` with zero-fill: copies 16 bytes from global to shared memory
/// without passing through registers, and without waiting. When `valid` is false nothing is
/// read (the source may point anywhere) and the 16 bytes are filled with zeros: that is how a
/// tile that runs past the end of the sequence loads, never out of bounds, and its missing
/// rows hold zeros rather than stale data (0 * stale NaN would still be NaN).
/// `.cg` caches in L2 only: the tile goes to shared memory, L1 would hold a useless copy.
__device__ __forceinline__ void cp_async_16(uint32_t smem_address_dst, const void* gmem_src, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address_dst), "l"(gmem_src), "r"(src_bytes));
}

/// `cp.async.ca.shared.global` of 4 bytes: one float from global to shared memory, in the same
/// commit groups as cp_async_16(), for data whose rows start at any float (a packed sequence's
/// row statistics), where 16-byte copies would not be aligned. `.ca` is the only form that takes
/// fewer than 16 bytes. A plain load and store instead would make the thread wait for the load
/// before its store, where the copy lets it go on.
__device__ __forceinline__ void cp_async_4(uint32_t smem_address_dst, const void* gmem_src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_address_dst), "l"(gmem_src));
}

/// `cp.async.commit_group`: closes the group of every cp.async this thread issued since the
/// last commit. Groups complete in order; each pipeline stage is one group.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/// `cp.async.wait_group N`: waits until at most `N` of this thread's committed groups are
/// still in flight, i.e. every group but the newest N has landed in shared memory. It covers
/// this thread's own copies only: a `__syncthreads()` must follow before other threads read.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
//! [cp_async]

//! [global_sync]
/// `red.global.add.v2.f32`: adds (x, y) to the two float32 at `address` (8-byte aligned, global
/// memory) without returning anything, in one request for the pair; on GPUs before sm_90, which
/// lack the vector form, two `red.global.add.f32` (atomicAdd with its result unused). The
/// additions are atomic; their order, and so the rounding of the sum, is not fixed.
__device__ __forceinline__ void red_global_add_v2_f32(float* address, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(address), "f"(x), "f"(y) : "memory");
#else
    atomicAdd(address, x);
    atomicAdd(address + 1, y);
#endif
}

/// `red.global.add.v4.f32`: adds (x, y, z, w) to the four float32 at `address` (16-byte aligned,
/// global memory) in one request; before sm_90, two red_global_add_v2_f32. Atomic, in no fixed
/// order, as red_global_add_v2_f32.
__device__ __forceinline__ void red_global_add_v4_f32(float* address, float x, float y, float z, float w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(address), "f"(x), "f"(y), "f"(z), "f"(w)
                 : "memory");
#else
    red_global_add_v2_f32(address, x, y);
    red_global_add_v2_f32(address + 2, z, w);
#endif
}

/// `ld.global.acquire.gpu.b32`: reads a counter another block publishes. The memory operations of
/// this thread that follow it see every write that was made visible before the counter's value
/// was written (release/acquire at GPU scope): the reading side of a flag, whose writing side is
/// `__threadfence()` then an atomic store or add.
__device__ __forceinline__ int ld_global_acquire_gpu_b32(const int* address) {
    int value;
    asm volatile("ld.global.acquire.gpu.b32 %0, [%1];\n" : "=r"(value) : "l"(address) : "memory");
    return value;
}
//! [global_sync]

/// Two floats rounded to 16 bits and packed into one register, `lo` in the lower half: the
/// element order every fragment above uses.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

/// pack2() for bf16.
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

/// pack2() for fp16.
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

/// `ex2.approx.ftz.f32`: 2^x on the special-function unit, one instruction. `exp(x)` itself
/// costs a multiply by log2(e) on top; folding log2(e) into the softmax scale removes it.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

}  // namespace fa::cuda::ptx
