/// \file stages/13_decode/args.hpp
/// \brief What stage 13's kernels (kernel.cuh) take and how they are laid out: the tile shape, the
/// shared memory map, the argument block and the grids. Plain code, callable from the host, so the
/// host entry point, the executable and the emulated test read them without a CUDA compiler.
#pragma once

#include <cstdint>

#include "fa/config.hpp"
#include "fa/cuda/layouts.hpp"
#include "fa/problem.hpp"

#include "decode_problem.hpp"  // kKeysPerTile (Bc) and kRowsPerTile (one m16 slab), the split rule's too

namespace fa::stage13 {

/// \name The split kernel's shape
///@{
inline constexpr int kWarps = 4;                   ///< warps per block; warp w owns keys 16w.. of each tile
inline constexpr int kThreads = 32 * kWarps;       ///< threads per block
inline constexpr int kStages = 2;                  ///< K/V tiles in flight (the cp.async ring)
inline constexpr int kCombineRowsPerBlock = 4;     ///< the combine kernel: one warp per row
///@}

/// Shared memory of the split kernel at head dimension D, and where each part starts.
template <int D>
struct SplitShape {
    using Layout = cuda::TileLayout<D, true>;                   ///< swizzled [rows, D] tiles of 16-bit elements
    static constexpr int kQBytes = kRowsPerTile * D * 2;            ///< [16, D] Q tile
    static constexpr int kTileBytes = kKeysPerTile * D * 2;         ///< [64, D] K or V tile
    static constexpr int kRingBytes = 2 * kStages * kTileBytes;  ///< kStages x (K tile, V tile)
    /// After the last tile the ring holds the warps' merge: [kWarps, 16, D] float O plus m and l.
    static constexpr int kMergeBytes = kWarps * kRowsPerTile * D * 4 + 2 * kWarps * kRowsPerTile * 4;
    static_assert(kMergeBytes <= kRingBytes, "the merge reuses the K/V ring");
    static constexpr int kSmemBytes = kQBytes + kRingBytes;      ///< dynamic shared memory per block
};

/// Everything the kernels read; built on the host by make_decode_args() (decode.cu and the
/// emulated test alike). Element offsets are in elements of the 16-bit type T.
template <class T>
struct DecodeArgs {
    const T* q = nullptr;          ///< (B, seq_q, Hq, D)
    const T* k_new = nullptr;      ///< (B, seq_q, Hk, D), the rows the append writes; null without append
    const T* v_new = nullptr;      ///< like k_new
    T* k_cache = nullptr;          ///< contiguous: (B, capacity, Hk, D); paged: the pool (num_pages, page_size, Hk, D)
    T* v_cache = nullptr;          ///< like k_cache
    const int32_t* block_table = nullptr;  ///< (B, pages_per_seq); null: the cache is contiguous
    const int32_t* cache_seqlens = nullptr;  ///< (B,) keys cached before the call
    T* o = nullptr;                ///< (B, seq_q, Hq, D), written when splits == 1 and by the combine
    float* lse = nullptr;          ///< (B, Hq, seq_q)
    float* o_partial = nullptr;    ///< (splits, B, Hq, seq_q, D), each split's normalized O
    float* lse_partial = nullptr;  ///< (splits, B, Hq, seq_q), each split's LSE
    int batch = 1;                 ///< B
    int seq_q = 1;                 ///< new rows per sequence
    int heads_q = 1;               ///< Hq
    int heads_k = 1;               ///< Hk
    int group = 1;                 ///< G = Hq / Hk
    int rows = 1;                  ///< seq_q x G rows per K/V head
    int row_tiles = 1;             ///< ceil(rows / 16)
    int splits = 1;                ///< blocks per (sequence, K/V head, row tile)
    int append_rows = 0;           ///< seq_q with append, 0 without: seq_k = cache_seqlens + append_rows
    int page_shift = 0;            ///< log2(page_size) (paged)
    int pages_per_seq = 0;         ///< block table row length (paged)
    int64_t seq_stride = 0;        ///< contiguous: elements from one sequence's cache to the next (capacity Hk D)
    int64_t page_stride = 0;       ///< paged: elements of one page (page_size Hk D)
    float scale_log2 = 0;          ///< softmax scale times log2(e): scores go straight to exp2
};

/// Blocks of the split kernel: splits x (Hk x row tiles) x B, flattened, split fastest.
template <class T>
FA_HD inline int64_t split_grid(const DecodeArgs<T>& a) {
    return int64_t(a.splits) * a.heads_k * a.row_tiles * a.batch;
}
/// Blocks of the combine kernel.
template <class T>
FA_HD inline int64_t combine_grid(const DecodeArgs<T>& a) {
    return ceil_div(int64_t(a.batch) * a.heads_q * a.seq_q, kCombineRowsPerBlock);
}
/// Threads of the append kernel's grid-stride loop: one per 16-byte chunk of a new row, K and V.
template <class T>
FA_HD inline int64_t append_chunks(const DecodeArgs<T>& a, int d) {
    return a.append_rows == 0 ? 0 : int64_t(a.batch) * a.seq_q * a.heads_k * (d / 8);
}

/// Smaller of two ints (device and host alike; the emulator has no CUDA min).
FA_HD inline int imin(int x, int y) { return x < y ? x : y; }
/// Larger of two ints.
FA_HD inline int imax(int x, int y) { return x > y ? x : y; }

}  // namespace fa::stage13
