/// \file fa/cuda/wgmma_layout.hpp
/// \brief Where Hopper's instructions put things, as plain C++ the kernels use and the host
/// tests check without a GPU: the 128-byte swizzle of a TMA box, the shared-memory matrix
/// descriptor of `wgmma`, the accumulator fragment of `wgmma.m64nNk16` and how it becomes the
/// A operand of the next `wgmma` (the RS form).
///
/// Everything here is `constexpr` and compiles as plain C++ (no CUDA header needed), so
/// tests/test_hopper_layouts.cpp runs in CI on machines without nvcc.
///
/// Sources: the PTX ISA, sections "Asynchronous Warpgroup Level Matrix Shared Memory Layout"
/// (the descriptor and the canonical layouts), "Register Fragments" of wgmma (the accumulator
/// and the A operand), and "Tensor Copy" / swizzling modes of cp.async.bulk.tensor.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FA_WGMMA_HD __host__ __device__
#else
#define FA_WGMMA_HD
#endif

namespace fa::cuda::wgmma_layout {

//! [swizzle128]
/// The 128-byte swizzle of TMA and wgmma (`CU_TENSOR_MAP_SWIZZLE_128B`, descriptor mode 1).
///
/// A box of 16-bit elements whose rows are 64 elements (128 bytes) wide lands in shared memory
/// row after row, 128 bytes per row; inside every group of 8 rows (a 1024-byte *atom*) the
/// 16-byte chunk `c` of row `r` is stored at chunk `c ^ (r % 8)`. The hardware applies this as
/// a function of the *address*: bits [4, 7) of the byte address are XORed with bits [7, 10).
/// That is why a swizzled tile must start at a multiple of 1024 bytes, and why moving the
/// start address of a wgmma operand by 32 bytes (16 elements) inside an atom selects the next
/// k-slice: the hardware swizzles the moved address the same way the TMA did.
constexpr int kSwizzleBytes = 128;   ///< width of one swizzled row: 64 elements of 16 bits
constexpr int kSwizzleElems = 64;    ///< 16-bit elements per swizzled row
constexpr int kAtomRows = 8;         ///< rows in one swizzle atom
constexpr int kAtomBytes = 1024;     ///< bytes in one atom (8 rows x 128 bytes); the alignment a tile needs

/// Byte offset of element (row, col) of a [rows, 64] box of 16-bit elements with the 128-byte
/// swizzle, from the box's start (a multiple of 1024 bytes).
FA_WGMMA_HD constexpr uint32_t swizzle128_offset(int row, int col) {
    const uint32_t chunk = uint32_t(col / 8) ^ uint32_t(row % 8);  // 16-byte chunk, permuted within the row
    return uint32_t(row) * kSwizzleBytes + chunk * 16u + uint32_t(col % 8) * 2u;
}

/// The same map on addresses: what the hardware does to a plain row-major byte offset (bits
/// [4, 7) XOR bits [7, 10)). `swizzle128_offset(r, c) == swizzle128_address(r * 128 + c * 2)`.
FA_WGMMA_HD constexpr uint32_t swizzle128_address(uint32_t byte_offset) {
    return byte_offset ^ (((byte_offset >> 7) & 7u) << 4);
}

/// Byte offset of element (row, col) of a [rows, D] tile stored as D / 64 boxes of [rows, 64]
/// one after the other (how the TMA loads a d = 128 tile: two boxes, since a swizzled box is at
/// most 128 bytes wide), each box swizzled as above.
FA_WGMMA_HD constexpr uint32_t tile_offset(int rows, int row, int col) {
    return uint32_t(col / kSwizzleElems) * uint32_t(rows) * kSwizzleBytes + swizzle128_offset(row, col % kSwizzleElems);
}
//! [swizzle128]

//! [descriptor]
/// The 64-bit shared-memory matrix descriptor a `wgmma` reads an operand through, per the PTX
/// ISA (all addresses and offsets in bytes, encoded divided by 16):
///
///     bits  0-13  start address >> 4         (shared-memory address of the operand)
///     bits 16-29  leading byte offset >> 4   (LBO)
///     bits 32-45  stride byte offset >> 4    (SBO)
///     bits 49-51  base offset                (0: the tile starts on a 1024-byte boundary)
///     bits 62-63  swizzle: 0 none, 1 = 128 B, 2 = 64 B, 3 = 32 B
///
/// What LBO and SBO mean depends on how the operand is stored. With the 128-byte swizzle:
///
/// - **K-major** (each row of A or B holds consecutive k, e.g. Q [rows, d] and K [keys, d] in
///   S = Q K^T): SBO = 1024, the step from one 8-row atom to the next along M or N; LBO is not
///   used (the 16 k of one instruction lie inside one 128-byte row) and is set to 1 by
///   convention. The k-slices of an atom are reached by adding 32 bytes to the start address.
/// - **MN-major** (each row holds consecutive m or n, e.g. V [keys, d] read as B of O += P V,
///   with `tnspB` = 1): SBO = 1024, the step between groups of 8 k (8 keys); LBO = the step
///   from one 64-element stretch of N to the next (the next 64-column box of V).
enum class Swizzle : uint32_t { None = 0, B128 = 1, B64 = 2, B32 = 3 };

/// The fields of a descriptor, in bytes (decoded).
struct Descriptor {
    uint32_t start_address;  ///< shared-memory byte address (multiple of 16, below 256 KiB)
    uint32_t leading_byte_offset;  ///< LBO in bytes (multiple of 16)
    uint32_t stride_byte_offset;   ///< SBO in bytes (multiple of 16)
    uint32_t base_offset;          ///< 3 bits; 0 for tiles aligned to the swizzle's repeat
    Swizzle swizzle;               ///< swizzle mode
};

/// Encodes a descriptor (see the bit fields above). Addresses and offsets are cut to their
/// 14 encoded bits, as the hardware reads them.
FA_WGMMA_HD constexpr uint64_t encode_descriptor(uint32_t start_address, uint32_t leading_byte_offset,
                                                 uint32_t stride_byte_offset, Swizzle swizzle, uint32_t base_offset = 0) {
    return uint64_t((start_address >> 4) & 0x3FFFu) | (uint64_t((leading_byte_offset >> 4) & 0x3FFFu) << 16) |
           (uint64_t((stride_byte_offset >> 4) & 0x3FFFu) << 32) | (uint64_t(base_offset & 7u) << 49) |
           (uint64_t(swizzle) << 62);
}

/// Decodes a descriptor into its fields (bytes).
FA_WGMMA_HD constexpr Descriptor decode_descriptor(uint64_t desc) {
    return {uint32_t(desc & 0x3FFFu) << 4, uint32_t((desc >> 16) & 0x3FFFu) << 4, uint32_t((desc >> 32) & 0x3FFFu) << 4,
            uint32_t((desc >> 49) & 7u), Swizzle(uint32_t(desc >> 62) & 3u)};
}

/// Descriptor of the k-slice `k16` (16 elements of k) of a K-major operand stored as a
/// [rows, D] tile of 128-byte-swizzled [rows, 64] boxes (tile_offset): the slice's box, plus
/// 32 bytes per slice inside the box; SBO = 1024 (one atom of 8 rows).
FA_WGMMA_HD constexpr uint64_t k_major_descriptor(uint32_t tile_address, int rows, int k16) {
    const uint32_t start = tile_address + uint32_t(k16 / 4) * uint32_t(rows) * kSwizzleBytes + uint32_t(k16 % 4) * 32u;
    return encode_descriptor(start, 16, kAtomBytes, Swizzle::B128);
}

/// Descriptor of the k-slice `k16` (rows 16 k16 .. 16 k16 + 15) of an MN-major operand stored
/// as a [rows, D] tile of swizzled [rows, 64] boxes, k along the rows and n along the columns
/// (V [keys, d] as B of O += P V): 16 rows further is 2048 bytes; SBO = 1024 (8 rows of k);
/// LBO = one box, rows x 128 bytes (the next 64 columns of n).
FA_WGMMA_HD constexpr uint64_t mn_major_descriptor(uint32_t tile_address, int rows, int k16) {
    const uint32_t start = tile_address + uint32_t(k16) * 16u * kSwizzleBytes;
    return encode_descriptor(start, uint32_t(rows) * kSwizzleBytes, kAtomBytes, Swizzle::B128);
}
//! [descriptor]

//! [fragments]
/// A position in a matrix.
struct Element {
    int row;  ///< row (m)
    int col;  ///< column (n, or k for an A operand)
};

/// The element of the m64nN float32 accumulator that register `index` (0 .. N/2 - 1) of thread
/// `thread` (0..127) of the warpgroup holds. Warp w = thread / 32 owns rows 16w .. 16w + 15;
/// inside them the layout is that of mma.sync's 16 x 8 C fragment, repeated for every 8
/// columns: with g = lane / 4, t = lane % 4, for the 8-column group i = index / 4,
///
///     d[4i + 0], d[4i + 1] = (16w + g,     8i + 2t, 8i + 2t + 1)
///     d[4i + 2], d[4i + 3] = (16w + g + 8, 8i + 2t, 8i + 2t + 1)
FA_WGMMA_HD constexpr Element accumulator_element(int thread, int index) {
    const int warp = thread / 32, lane = thread % 32, g = lane / 4, t = lane % 4;
    const int group = index / 4, e = index % 4;
    return {16 * warp + g + 8 * (e / 2), 8 * group + 2 * t + e % 2};
}

/// The element of the 64 x 16 A operand (16-bit, row-major, k along the columns) of the RS
/// form of wgmma that register `reg` (0..3), half `half` (0 = low 16 bits) of thread `thread`
/// holds: warp w serves rows 16w..16w+15 in mma.sync's m16n8k16 A layout,
///
///     a[0] = (16w + g, 2t..2t+1)   a[1] = (16w + g + 8, 2t..2t+1)
///     a[2] = (16w + g, 2t+8..+9)   a[3] = (16w + g + 8, 2t+8..+9)
FA_WGMMA_HD constexpr Element a_operand_element(int thread, int reg, int half) {
    const int warp = thread / 32, lane = thread % 32, g = lane / 4, t = lane % 4;
    return {16 * warp + g + 8 * (reg % 2), 2 * t + half + 8 * (reg / 2)};
}

/// The accumulator register that becomes half `half` of register `reg` of the A operand for
/// k-slice `k16` when an m64nN accumulator (S, float32) is rounded and repacked as the A
/// operand of the next wgmma (P in O += P V): the same thread holds both, so the repacking is
/// `a[k16][reg] = pack(d[8 k16 + 2 reg], d[8 k16 + 2 reg + 1])`, no shuffle.
FA_WGMMA_HD constexpr int accumulator_index_for_a(int k16, int reg, int half) { return 8 * k16 + 2 * reg + half; }
//! [fragments]

}  // namespace fa::cuda::wgmma_layout
