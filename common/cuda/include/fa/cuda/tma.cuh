/// \file fa/cuda/tma.cuh
/// \brief The tensor memory accelerator (TMA): `cp.async.bulk.tensor` loads of a whole box from
/// global to shared memory that complete on an mbarrier, its store form for the epilogue, the
/// bulk-group instructions that wait for stores, and the float32 reductions into global memory
/// (global += shared) that a backward's dQ needs (sm_90).
///
/// One thread issues a TMA copy; the hardware then moves the whole box (e.g. 128 rows x 64
/// columns of a K tile), computes every address from the *tensor map* (a 128-byte descriptor
/// built on the host by fa::cuda::make_tensor_map, passed to the kernel as a
/// `const __grid_constant__ CUtensorMap` parameter), swizzles the box as it writes shared memory
/// (fa/cuda/wgmma_layout.hpp), and fills the rows outside the tensor with zeros. A load
/// reports its bytes to an mbarrier (`complete_tx::bytes`), whose phase completes when they have
/// all landed (fa/cuda/mbarrier.cuh).
///
/// Coordinates are in elements, innermost dimension first: for a (B, H, N, d) tensor,
/// `{col, row, head, batch}`. The shared destination of a 128-byte-swizzled box must be
/// 1024-byte aligned.
#pragma once

#include <cstdint>

#include <cuda.h>

namespace fa::cuda::ptx {

//! [tma]
/// The generic address of a tensor map (a kernel parameter) as the 64-bit operand TMA takes.
__device__ __forceinline__ uint64_t tensor_map_address(const CUtensorMap* map) { return reinterpret_cast<uint64_t>(map); }

/// `prefetch.tensormap`: brings the tensor map into the TMA unit's cache ahead of the first copy.
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map_address(map)) : "memory");
}

/// <tt>cp.async.bulk.tensor.2d.shared\::cluster.global.mbarrier\::complete_tx\::bytes</tt>: loads the box
/// at element coordinates (c0, c1) of a 2-d tensor map into shared memory at `dst`; its bytes
/// count down the transactions of mbarrier `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
        "l"(tensor_map_address(map)), "r"(bar), "r"(c0), "r"(c1)
        : "memory");
}

/// <tt>cp.async.bulk.shared\::cluster.global.mbarrier\::complete_tx\::bytes</tt>: copies `bytes`
/// contiguous bytes from global memory at `src` into shared memory at `dst`, no tensor map and no
/// swizzle; its bytes count down the transactions of mbarrier `bar`. `bytes` a multiple of 16, both
/// addresses 16-byte aligned.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

/// tma_load_2d() for a 3-d tensor map: coordinates (c0, c1, c2), innermost first.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
        "l"(tensor_map_address(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

/// tma_load_2d() for a 4-d tensor map: coordinates (c0, c1, c2, c3), innermost first; for the
/// (B, H, N, d) maps of fa::cuda::make_tensor_map_bhnd, (column, row, head, batch).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
        "l"(tensor_map_address(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}

/// <tt>cp.async.bulk.tensor.2d.global.shared\::cta.bulk_group</tt>: tma_store_4d() for a 2-d tensor map.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(tensor_map_address(map)),
                 "r"(src), "r"(c0), "r"(c1)
                 : "memory");
}

/// <tt>cp.async.bulk.tensor.4d.global.shared\::cta.bulk_group</tt>: stores the box at `src` in shared
/// memory (laid out and swizzled as a load of the same map would leave it) to coordinates
/// (c0, c1, c2, c3); elements outside the tensor are not written. Write the box with plain
/// stores, then fence_proxy_async() and a barrier, then one thread stores; complete with
/// bulk_commit_group() and bulk_wait_group_read() before the shared memory is reused or the
/// block exits.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                     tensor_map_address(map)),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

/// `cp.async.bulk.commit_group`: closes a bulk group of the TMA stores this thread issued.
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

/// `cp.async.bulk.wait_group.read N`: waits until at most `N` bulk groups of this thread still
/// *read* their shared source: after it, the shared memory may be overwritten (the global
/// writes may still be on their way).
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

/// `cp.async.bulk.wait_group N`: waits until at most `N` bulk groups of this thread are
/// pending at all (their global writes done).
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
//! [tma]

//! [tma_reduce]
/// <tt>cp.reduce.async.bulk.tensor.2d.global.shared\::cta.add.tile.bulk_group</tt>: adds the box at `src`
/// in shared memory (laid out and swizzled as a load of the same map would leave it) element by
/// element into the tensor at coordinates (c0, c1): global += shared, in the map's element type
/// (a float32 map for the float32 sums of a backward's dQ); elements outside the tensor are left
/// alone. Each element's add is atomic, so boxes of several blocks may overlap. Committed and
/// waited for as tma_store_4d() (bulk_commit_group(), bulk_wait_group_read()).
__device__ __forceinline__ void tma_reduce_add_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
    asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                     tensor_map_address(map)),
                 "r"(src), "r"(c0), "r"(c1)
                 : "memory");
}

/// <tt>cp.reduce.async.bulk.tensor.4d.global.shared\::cta.add.tile.bulk_group</tt>: tma_reduce_add_2d() for a
/// 4-d tensor map, coordinates (c0, c1, c2, c3), innermost first.
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                     tensor_map_address(map)),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

/// <tt>cp.reduce.async.bulk.global.shared\::cta.bulk_group.add.f32</tt>: adds `bytes` bytes of float32
/// at `src` in shared memory into global memory at `dst`, element by element (global += shared,
/// each add atomic); no tensor map, no swizzle: a contiguous run. `bytes` a multiple of 16, both
/// addresses 16-byte aligned. Committed and waited for as tma_store_4d().
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
}
//! [tma_reduce]

}  // namespace fa::cuda::ptx
