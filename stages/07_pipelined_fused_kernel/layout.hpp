/// \file stages/07_pipelined_fused_kernel/layout.hpp
/// \brief Where things live: the swizzled shared-memory tiles and the mma fragments, as plain
/// functions the kernel uses and the host tests check (bijection, bank conflicts, fragment maps).
#pragma once

#include <cstdint>

#include "fa/config.hpp"

namespace fa::stage07 {

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
/// A position in a fragment.
struct Element {
    int row;  ///< row in the fragment
    int col;  ///< column in the fragment
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

}  // namespace fa::stage07
