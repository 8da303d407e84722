/// \file fa/cuda/layouts.hpp
/// \brief Where things live on the tensor-core path: the swizzled shared-memory tiles, the
/// fragments of `mma.m16n8k16`, and which lane hands `ldmatrix` which 16-byte row.
///
/// Everything here is integer arithmetic on (row, column) pairs, callable from the kernels and
/// from host code alike, so the host tests (tests/test_cuda_layouts.cpp) check it without a GPU:
/// the swizzle is a bijection free of bank conflicts, the fragment maps cover their tiles, and
/// each lane pattern, fed to `ldmatrix` as the PTX ISA defines it, gives exactly the fragment
/// that `mma.m16n8k16` expects.
///
/// Pictures: docs/images/swizzle.svg (the XOR swizzle), docs/images/mma_fragments.svg (A, B, C
/// of m16n8k16), docs/images/ldmatrix.svg and docs/images/lane_patterns.svg (which lane gives
/// which row).
#pragma once

#include <cstdint>

#include "fa/config.hpp"

namespace fa::cuda {

//! [swizzle]
/// A [rows, kCols] tile of 16-bit elements in shared memory, plain row-major or XOR-swizzled.
///
/// Shared memory serves a warp from 32 banks of 4 bytes: 128 bytes side by side. A tile row of
/// d = 64 bf16 is exactly 128 bytes, so column c of every row sits in the same bank, and
/// `ldmatrix`, which reads one 16-byte chunk from each of 8 consecutive rows, is served one row
/// at a time: an 8-way bank conflict. The swizzle stores chunk c (of the eight 16-byte chunks of
/// a 128-byte segment of row r) in slot `c ^ (r % 8)`: eight consecutive rows then put the same
/// logical chunk in eight different slots, and each segment keeps its own eight chunks (a
/// permutation, so the 16-byte cp.async writes of one row stay conflict-free as well). Rows of
/// 64 bytes (d = 32) share a segment two by two; there the key is `(r / 2) % 4`.
template <int kCols, bool kSwizzle>
struct TileLayout {
    static_assert(kCols == 32 || kCols % 64 == 0, "rows of 64 bytes or of whole 128-byte segments");
    static constexpr int kRowBytes = 2 * kCols;  ///< bytes in one row of 16-bit elements

    /// Element offset of (row, col).
    FA_HD static int offset(int row, int col) {
        if constexpr (!kSwizzle) {
            return row * kCols + col;
        } else if constexpr (kCols == 32) {
            return row * kCols + (((col / 8) ^ ((row >> 1) & 3)) * 8) + col % 8;
        } else {
            return row * kCols + (col / 64) * 64 + ((((col % 64) / 8) ^ (row & 7)) * 8) + col % 8;
        }
    }

    /// Byte offset of the 16-byte chunk at (r0 + rl, c0 + cl), for r0 a multiple of 8, c0 a
    /// multiple of 16 and cl 0 or 8, split into a lane's part and two constants:
    ///     `(offset_bytes(rl, cl) ^ xor_bits(c0)) + add_bits(r0, c0)`.
    /// The kernel computes the lane's part once per tile and each fragment address with one
    /// XOR and an immediate offset, instead of keeping one address register per fragment.
    FA_HD static constexpr uint32_t xor_bits(int c0) { return kSwizzle ? uint32_t(c0 % 64) * 2 : 0; }
    /// See xor_bits().
    FA_HD static constexpr uint32_t add_bits(int r0, int c0) {
        return uint32_t(r0 * kRowBytes) + (kSwizzle ? uint32_t(c0 / 64) * 128 : uint32_t(c0) * 2);
    }
};
//! [swizzle]

//! [fragments]
/// A position in a tile or a fragment.
struct Element {
    int row;  ///< row in the tile or fragment
    int col;  ///< column in the tile or fragment
};
/// The element of a 16 x 16 A fragment (row-major) that register `reg` (0..3), half `half`
/// (0 = low 16 bits, 1 = high) of lane `lane` holds, per the PTX ISA's m16n8k16 layout.
FA_HD inline Element a_fragment_element(int lane, int reg, int half) {
    const int g = lane / 4, t = lane % 4;
    return {g + 8 * (reg % 2), 2 * t + half + 8 * (reg / 2)};
}
/// The element of a 16 x 8 B fragment (k x n, "col") in register `reg` (0..1), half `half`.
FA_HD inline Element b_fragment_element(int lane, int reg, int half) {
    const int g = lane / 4, t = lane % 4;
    return {2 * t + half + 8 * reg, g};
}
/// The element of a 16 x 8 float32 C/D fragment held in accumulator `index` (0..3).
FA_HD inline Element c_fragment_element(int lane, int index) {
    const int g = lane / 4, t = lane % 4;
    return {g + 8 * (index / 2), 2 * t + index % 2};
}
//! [fragments]

//! [lane_patterns]
/// \name Lane patterns of ldmatrix.x4
///
/// `ldmatrix.x4` loads four 8 x 8 matrices; lanes 8i .. 8i+7 each give the shared address of one
/// 16-byte row (eight 16-bit elements) of matrix i, and afterwards register i of every lane holds
/// two elements of matrix i (see fa/cuda/ptx.cuh). Which row a lane names decides which fragment
/// arrives. Each function below returns, for `lane`, the (row, column) of the first element of
/// the 16-byte row it hands over, relative to the 16 x 16 block being loaded; the kernels add
/// the block's origin with fragment_address(). docs/images/lane_patterns.svg draws all three.
///@{

/// A operand (16 x 16, row-major; Q or P in the forward, K_w or V_w in the backward), plain
/// ldmatrix. Register i of the A fragment is rows 8(i%2).., columns 8(i/2).. (a_fragment_element),
/// so matrix i must be that 8 x 8 block: lanes 0-15 name rows 0-15 at column 0 (matrices 0, 1),
/// lanes 16-31 the same rows at column 8 (matrices 2, 3).
FA_HD inline Element a_lane_element(int lane) { return {lane % 16, (lane / 16) * 8}; }

/// B operands of two neighbouring n-tiles (16 x 8 each) from a tile stored one n per row (K in
/// S = Q K^T: a key per row, its features along the row), plain ldmatrix. B is "col": register
/// j of a B fragment holds B[2t.., g], which is row g, columns 2t.. of the stored tile, so plain
/// ldmatrix serves it. Matrix 0: rows 0-7, columns 0-7 (b[0] of n-tile 0); matrix 1: rows 0-7,
/// columns 8-15 (b[1]); matrices 2, 3: rows 8-15 (n-tile 1). Lanes 0-7 and 8-15 name rows 0-7,
/// lanes 16-31 rows 8-15; lanes 8-15 and 24-31 at column 8.
FA_HD inline Element k_lane_element(int lane) { return {(lane / 16) * 8 + lane % 8, ((lane / 8) % 2) * 8}; }

/// B operands of two neighbouring n-tiles from a tile stored one k per row (V in O += P V: a key
/// per row, the features (n) along it), with `ldmatrix.trans`: register j must hold B[2t, 2t+1][g],
/// two keys of one feature, which is a column of the stored tile; .trans hands each lane a column
/// pair instead of a row pair. Matrix 0: rows (keys) 0-7, columns 0-7 (b[0] of n-tile 0);
/// matrix 1: rows 8-15, columns 0-7 (b[1]); matrices 2, 3: columns 8-15 (n-tile 1). Lanes 0-7
/// and 16-23 name rows 0-7, lanes 8-15 and 24-31 rows 8-15; lanes 16-31 at column 8.
/// (The same pattern with plain ldmatrix would be k_lane_element's; the same rows with .trans
/// from the k pattern give an A operand read transposed, as stage 09 reads dS from dS^T.)
FA_HD inline Element v_lane_element(int lane) { return {((lane / 8) % 2) * 8 + lane % 8, (lane / 16) * 8}; }

/// Byte offset, inside a tile laid out as `Layout`, of the 16-byte row a lane names in the 16 x 16
/// block at the tile's origin.
template <class Layout>
FA_HD inline uint32_t lane_bytes(Element e) {
    return uint32_t(Layout::offset(e.row, e.col)) * 2;
}
/// lane_bytes() of a_lane_element(): add the tile's shared address once per tile.
template <class Layout>
FA_HD inline uint32_t a_lane_bytes(int lane) {
    return lane_bytes<Layout>(a_lane_element(lane));
}
/// lane_bytes() of k_lane_element().
template <class Layout>
FA_HD inline uint32_t k_lane_bytes(int lane) {
    return lane_bytes<Layout>(k_lane_element(lane));
}
/// lane_bytes() of v_lane_element().
template <class Layout>
FA_HD inline uint32_t v_lane_bytes(int lane) {
    return lane_bytes<Layout>(v_lane_element(lane));
}

/// Shared address of the 16 x 16 block at (r0, c0) for this lane, from its address at the tile's
/// origin (tile address + one of the *_lane_bytes above): one XOR and an immediate offset (see
/// TileLayout::xor_bits). r0 a multiple of 8, c0 a multiple of 16.
template <class Layout>
FA_HD inline uint32_t fragment_address(uint32_t lane_address, int r0, int c0) {
    return (lane_address ^ Layout::xor_bits(c0)) + Layout::add_bits(r0, c0);
}
///@}
//! [lane_patterns]

}  // namespace fa::cuda
