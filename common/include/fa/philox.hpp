/// \file philox.hpp
/// \brief Philox4x32-10, the counter-based generator behind dropout, and the course's map from
/// one attention score's coordinates to its keep bit.
///
/// Dropout zeroes each entry of \f$P\f$ with probability \f$p\f$ and scales the others by
/// \f$1/(1-p)\f$. The backward needs the very same mask; storing it would cost
/// \f$B \cdot H \cdot N_q \cdot N_k\f$ bits, as much memory as the \f$N \times N\f$ matrix
/// FlashAttention exists to avoid. A *counter-based* generator removes the problem: its output is
/// a pure function of a counter and a key, with no state carried from one draw to the next, so any
/// thread of the forward or of the backward computes the bit of entry \f$(b, h, i, j)\f$ from the
/// coordinates alone, in any order, as often as it likes.
///
/// Philox4x32-R (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3",
/// SC'11) maps a 128-bit counter \f$(c_0, c_1, c_2, c_3)\f$ and a 64-bit key \f$(k_0, k_1)\f$ to
/// 128 random bits by R rounds of
///
/// \f[ (c_0, c_1, c_2, c_3) \leftarrow (\mathrm{hi}(M_1 c_2) \oplus c_1 \oplus k_0,\;
///      \mathrm{lo}(M_1 c_2),\; \mathrm{hi}(M_0 c_0) \oplus c_3 \oplus k_1,\; \mathrm{lo}(M_0 c_0)) \f]
///
/// with \f$M_0\f$ = 0xD2511F53, \f$M_1\f$ = 0xCD9E8D57 (hi and lo: the two halves of the 64-bit
/// product), the key bumped by the Weyl constants \f$W_0\f$ = 0x9E3779B9, \f$W_1\f$ = 0xBB67AE85
/// before every round but the first. Ten rounds is Random123's default and what cuRAND and
/// PyTorch use; the tests check the published known-answer vectors (Random123's
/// `tests/kat_vectors`) for 7 and 10 rounds.
///
/// ### The course's dropout map (the GPU kernels reproduce it bit for bit)
///
/// For score \f$(b, h, i, j)\f$ -- sequence \f$b\f$ of the batch, query head \f$h\f$, query row
/// \f$i\f$ and key column \f$j\f$ counted from the start of that sequence (not of the packed
/// tensor) -- with a 64-bit `seed` and a 32-bit `offset`:
///
/// | word  | holds |
/// | ----- | ----- |
/// | key \f$k_0\f$ | `seed` bits 0..31 |
/// | key \f$k_1\f$ | `seed` bits 32..63 |
/// | counter \f$c_0\f$ | \f$\lfloor j / 4 \rfloor\f$, the group of 4 neighbouring columns |
/// | counter \f$c_1\f$ | \f$i\f$ |
/// | counter \f$c_2\f$ | \f$b \cdot 2^{16} + h\f$ (so \f$b < 2^{16}\f$ and \f$h < 2^{16}\f$) |
/// | counter \f$c_3\f$ | `offset` |
///
/// One Philox call yields four 32-bit words \f$r_0..r_3\f$; column \f$j\f$ reads \f$r_{j \bmod 4}\f$,
/// so the call covers columns \f$4\lfloor j/4 \rfloor\f$ to \f$4\lfloor j/4 \rfloor + 3\f$. The entry is
/// *kept* iff \f$r_{j \bmod 4} \ge t\f$ with the threshold \f$t = \lfloor p \cdot 2^{32} \rfloor\f$
/// (dropout_threshold()). Every coordinate enters the counter, never the key, so two calls that
/// differ only in `offset` draw from the same key with different counters: the usual way to give
/// each training step fresh masks is to keep the seed and advance the offset.
///
/// The bias: a uniform 32-bit word falls below \f$t\f$ with probability exactly \f$t / 2^{32}\f$,
/// which lies in \f$(p - 2^{-32},\, p]\f$ because \f$p \cdot 2^{32}\f$ is exact in double and only the
/// floor rounds. So the keep rate is \f$1 - p\f$ plus less than \f$2^{-32}\f$, and scaling kept entries
/// by \f$1/(1-p)\f$ makes \f$E[\text{output}]\f$ exceed the undropped value by a relative
/// \f$< 2^{-32}/(1-p)\f$: far below float32's resolution. (FlashAttention-2 compares one byte per
/// entry against \f$\lfloor 255 p \rfloor\f$ to spend one Philox call on 16 entries; its keep rate
/// is off by up to 1/255. Here each entry gets a full word: 4 entries per call.)
/// With \f$p = 0\f$, \f$t = 0\f$ and every entry is kept.
///
/// A worked example a kernel can be checked against (the tests pin it): seed 0x0123456789abcdef,
/// offset 77, sequence 3, head 5, row 1234, columns 36..39 (group 9) are key (0x89abcdef,
/// 0x01234567) and counter (9, 1234, 0x00030005, 77), and Philox4x32-10 gives 0x6c8f69cb,
/// 0x289ccbb7, 0x5c681d21, 0xd6cce4e9: with \f$p = 0.5\f$ (\f$t\f$ = 0x80000000) only column 39 is
/// kept, dropout_keep4() = 0b1000.
///
/// Everything here is `constexpr` and compiles for the host and, through nvcc, for the device:
/// the kernels include this header unchanged.
#pragma once

#include <cstdint>

#include "fa/config.hpp"

namespace fa {

/// Philox's first multiplier \f$M_0\f$ (applied to counter word 0).
inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
/// Philox's second multiplier \f$M_1\f$ (applied to counter word 2).
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
/// Weyl increment of key word 0 between rounds (the golden ratio's fractional bits).
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
/// Weyl increment of key word 1 between rounds (\f$\sqrt{3} - 1\f$'s fractional bits).
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

/// Four 32-bit words: a Philox counter, or the 128 random bits it maps to.
struct PhiloxWords {
    uint32_t w[4];  ///< words 0..3, in Random123's order
};

/// Philox4x32's 64-bit key as two 32-bit words.
struct PhiloxKey {
    uint32_t w[2];  ///< words 0 and 1, in Random123's order
};

/// One Philox4x32 round: two 32x32 -> 64-bit products, their halves swapped into the other lanes
/// and mixed with the key by xor.
FA_HD constexpr PhiloxWords philox4x32_round(PhiloxWords c, PhiloxKey k) {
    const uint64_t p0 = uint64_t(kPhiloxM0) * c.w[0];
    const uint64_t p1 = uint64_t(kPhiloxM1) * c.w[2];
    return {{uint32_t(p1 >> 32) ^ c.w[1] ^ k.w[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c.w[3] ^ k.w[1], uint32_t(p0)}};
}

/// Philox4x32 with `Rounds` rounds: the key is bumped by \f$(W_0, W_1)\f$ before every round
/// but the first.
template <int Rounds>
FA_HD constexpr PhiloxWords philox4x32(PhiloxWords counter, PhiloxKey key) {
    for (int r = 0; r < Rounds; ++r) {
        if (r > 0) {
            key.w[0] += kPhiloxW0;
            key.w[1] += kPhiloxW1;
        }
        counter = philox4x32_round(counter, key);
    }
    return counter;
}

/// Philox4x32-10: the generator dropout uses.
FA_HD constexpr PhiloxWords philox4x32_10(PhiloxWords counter, PhiloxKey key) {
    return philox4x32<10>(counter, key);
}

/// The threshold \f$t = \lfloor p \cdot 2^{32} \rfloor\f$ a random word is compared with: an
/// entry is dropped iff its word is below \f$t\f$. Requires \f$0 \le p < 1\f$ (then \f$t < 2^{32}\f$;
/// VarlenProblem::validate() refuses anything else). Multiplying by \f$2^{32}\f$ is exact in
/// double; the floor is the only rounding (see the file comment for the bias it leaves).
FA_HD constexpr uint32_t dropout_threshold(double p) { return uint32_t(p * 4294967296.0); }

/// The Philox key of a dropout seed: \f$k_0\f$ = low 32 bits, \f$k_1\f$ = high 32 bits.
FA_HD constexpr PhiloxKey dropout_key(uint64_t seed) { return {{uint32_t(seed), uint32_t(seed >> 32)}}; }

/// The Philox counter of the column group \f$\lfloor j/4 \rfloor\f$ = `col_group` of row `row`,
/// query head `head`, sequence `batch`: \f$(j/4,\; i,\; b \cdot 2^{16} + h,\; \text{offset})\f$.
/// `batch` and `head` must be below \f$2^{16}\f$ (VarlenProblem::validate() checks it when dropout
/// is on).
FA_HD constexpr PhiloxWords dropout_counter(uint32_t offset, uint32_t batch, uint32_t head, uint32_t row,
                                            uint32_t col_group) {
    return {{col_group, row, (batch << 16) | head, offset}};
}

/// The keep bits of the four columns \f$4g, \dots, 4g+3\f$ (\f$g\f$ = `col_group`) of row `row`:
/// bit \f$w\f$ of the result is 1 iff column \f$4g + w\f$ is kept, i.e. iff Philox word \f$w\f$
/// is \f$\ge\f$ `threshold` (dropout_threshold()). One Philox4x32-10 call.
FA_HD constexpr uint32_t dropout_keep4(uint64_t seed, uint32_t offset, uint32_t batch, uint32_t head, uint32_t row,
                                       uint32_t col_group, uint32_t threshold) {
    const PhiloxWords r = philox4x32_10(dropout_counter(offset, batch, head, row, col_group), dropout_key(seed));
    return uint32_t(r.w[0] >= threshold) | uint32_t(r.w[1] >= threshold) << 1 | uint32_t(r.w[2] >= threshold) << 2 |
           uint32_t(r.w[3] >= threshold) << 3;
}

/// Whether score \f$(b, h, i, j)\f$ = (`batch`, `head`, `row`, `col`) survives dropout with
/// probability `p` of dropping: keep probability \f$1 - p\f$ (to within \f$2^{-32}\f$). Rows and
/// columns count from the start of the sequence. The same bit as dropout_keep4() at bit
/// \f$j \bmod 4\f$; a kernel calls that instead, once per four columns.
FA_HD constexpr bool dropout_keep(uint64_t seed, uint32_t offset, uint32_t batch, uint32_t head, uint32_t row,
                                  uint32_t col, double p) {
    return (dropout_keep4(seed, offset, batch, head, row, col >> 2, dropout_threshold(p)) >> (col & 3u)) & 1u;
}

}  // namespace fa
