/// \file fa/cuda/tile_copy.cuh
/// \brief A tile of rows from global to shared memory with 16-byte `cp.async` copies spread over
/// the block: the one way the tensor-core stages fill their shared tiles.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "fa/cuda/layouts.hpp"
#include "fa/cuda/ptx.cuh"

namespace fa::cuda {

//! [tile_copy]
/// Copies rows `[row0, row0 + kRows)` of a [n_rows, Layout's columns] global matrix (row stride
/// `row_stride` elements, features contiguous) into a shared tile laid out as `Layout`, with the
/// `kThreads` threads of the block; rows past `n_rows` are zero-filled. Issues the copies only:
/// the caller commits them (cp_async_commit) and waits for them (cp_async_wait) before reading.
///
/// Thread i copies 16-byte chunk i % (kCols/8) of row i / (kCols/8), then the same chunk every
/// kRowsPerPass = kThreads / (kCols/8) rows further. Consecutive threads thus read consecutive
/// 16-byte pieces of a row (coalesced: a warp reads whole rows), and eight consecutive threads
/// write the eight chunks of one 128-byte segment, which the swizzle only permutes within the
/// segment: no bank conflict on the write side either (docs/images/lane_patterns.svg, bottom).
/// One source pointer is stepped by a fixed stride and one shared address takes immediate
/// offsets, so the copies cost a few registers, not one 64-bit address per chunk.
template <int kRows, class Layout, int kThreads, class T>
__device__ __forceinline__ void load_tile_gmem_to_smem(T* tile, const T* gmem, int64_t row_stride, int row0, int n_rows) {
    static_assert(sizeof(T) == 2, "tiles of 16-bit elements");
    constexpr int kCols = Layout::kRowBytes / 2;
    constexpr int kChunksPerRow = kCols / 8;  // 16-byte chunks in one row
    constexpr int kRowsPerPass = kThreads / kChunksPerRow;
    static_assert(kThreads % kChunksPerRow == 0, "a pass copies whole rows");
    const int row = int(threadIdx.x) / kChunksPerRow, col = (int(threadIdx.x) % kChunksPerRow) * 8;
    const T* src = gmem + int64_t(row0 + row) * row_stride + col;
    const int64_t src_step = int64_t(kRowsPerPass) * row_stride;
    const uint32_t dst = ptx::smem_address(tile) + uint32_t(Layout::offset(row, col)) * 2;
#pragma unroll
    for (int pass = 0; pass < (kRows + kRowsPerPass - 1) / kRowsPerPass; ++pass) {
        const int r = row + pass * kRowsPerPass;
        if (kRows % kRowsPerPass != 0 && r >= kRows) break;
        const bool valid = row0 + r < n_rows;
        // The swizzle key of a row is its index mod 8, unchanged when a pass spans a multiple of 8 rows.
        const uint32_t dst_r = kRowsPerPass % 8 == 0 ? dst + uint32_t(pass * kRowsPerPass * kCols * 2)
                                                     : ptx::smem_address(tile) + uint32_t(Layout::offset(r, col)) * 2;
        ptx::cp_async_16(dst_r, valid ? src : gmem, valid);
        src += src_step;
    }
}
//! [tile_copy]

}  // namespace fa::cuda
