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
/// One Philox call costs about a hundred integer instructions (ten rounds of two 32 x 32 -> 64-bit
/// products, xors and adds), several times the tensor-core work of one score at d = 64, so what
/// decides dropout's price is how many scores share one call, and whether each thread can use
/// every bit it draws. The map therefore gives each score one *byte* (16 scores per call) and
/// groups the 16 so that one thread of the forward kernels holds all of them:
///
/// - rows \f$16I + g\f$ and \f$16I + g + 8\f$ (\f$g < 8\f$): the two rows a thread holds in a
///   16-row `mma` tile (m16n8k16's accumulator, and each warp's 16 rows of a `wgmma` m64 tile);
/// - columns \f$32K + 8u + 2q + e\f$ (\f$u < 4\f$, \f$q < 4\f$, \f$e < 2\f$): the two neighbouring
///   columns that thread holds in each of four 8-column tiles.
///
/// The backward kernels compute \f$S^\top\f$ (keys as rows), where a thread holds the transposed
/// pattern: a group's 16 bytes then belong to two neighbouring lanes of a warp, 8 each. Each lane
/// draws one call whole and hands the half its neighbour holds over with one shuffle (stage 09's
/// `dropout_keep_bits()`).
///
/// For score \f$(b, h, i, j)\f$ -- sequence \f$b\f$ of the batch, query head \f$h\f$, query row
/// \f$i\f$ and key column \f$j\f$ counted from the start of that sequence (not of the packed
/// tensor) -- with a 64-bit `seed` and a 32-bit `offset`:
///
/// | word  | holds |
/// | ----- | ----- |
/// | key \f$k_0\f$ | `seed` bits 0..31 |
/// | key \f$k_1\f$ | `seed` bits 32..63 |
/// | counter \f$c_0\f$ | \f$4 \lfloor j / 32 \rfloor + \lfloor (j \bmod 8) / 2 \rfloor\f$ |
/// | counter \f$c_1\f$ | \f$8 \lfloor i / 16 \rfloor + i \bmod 8\f$ |
/// | counter \f$c_2\f$ | \f$b \cdot 2^{16} + h\f$ (so \f$b < 2^{16}\f$ and \f$h < 2^{16}\f$) |
/// | counter \f$c_3\f$ | `offset` |
///
/// The call's 128 bits are 16 bytes, byte \f$n\f$ being bits \f$8(n \bmod 4)\f$ to
/// \f$8(n \bmod 4) + 7\f$ of word \f$\lfloor n/4 \rfloor\f$; score \f$(i, j)\f$ reads byte
/// \f$n = 8 \lfloor (i \bmod 16) / 8 \rfloor + 2 \lfloor (j \bmod 32) / 8 \rfloor + j \bmod 2\f$
/// (dropout_byte()), so a word holds one row's pairs of two neighbouring 8-column tiles. The score
/// is *kept* iff its byte is \f$\ge t = \lfloor 256 p + 1/2 \rfloor\f$ (dropout_threshold()), with
/// probability exactly \f$(256 - t)/256\f$. Every coordinate enters the counter, never the key, so
/// two calls that differ only in `offset` draw from the same key with different counters: the usual
/// way to give each training step fresh masks is to keep the seed and advance the offset.
///
/// **What a byte costs: p in steps of 1/256.** The drop probability that runs is
/// \f$p' = t/256\f$, the multiple of 1/256 nearest to \f$p\f$ (0.1 runs as 26/256 = 0.1015625), and
/// kept scores are scaled by \f$1/(1 - p')\f$ (dropout_keep_scale()), so the output's expectation
/// is the undropped value exactly. The course says \f$p'\f$ wherever it differs from \f$p\f$, and
/// refuses \f$p \ge 255.5/256\f$ (\f$t\f$ would be 256: nothing kept). FlashAttention-2 also spends a
/// byte per score, and scales by \f$1/(1-p)\f$ although the fraction it keeps is a multiple of 1/256.
/// With \f$p = 0\f$, \f$t = 0\f$ and every entry is kept.
///
/// A worked example a kernel can be checked against (the tests pin it): seed 0x0123456789abcdef,
/// offset 77, sequence 3, head 5, row 1234 and columns 36..37 (\f$I = 77\f$, \f$g = 2\f$,
/// \f$K = 1\f$, \f$q = 2\f$) are key (0x89abcdef, 0x01234567) and counter (6, 618, 0x00030005, 77),
/// and at \f$p = 0.5\f$ (\f$t = 128\f$) the call keeps bytes 0, 2, 8, 12, 13 and 14: dropout_keep16()
/// = 0x7105, so row 1234 keeps columns 36 and 44, row 1242 columns 36, 52, 53 and 60.
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

/// The threshold byte \f$t = \lfloor 256 p + 1/2 \rfloor\f$: a score is dropped iff its random byte
/// is below \f$t\f$. Requires \f$0 \le p < 255.5/256\f$, so that \f$t \le 255\f$ and something is
/// kept (VarlenProblem::validate() refuses anything else).
FA_HD constexpr uint32_t dropout_threshold(double p) { return uint32_t(p * 256.0 + 0.5); }

/// The drop probability that runs: \f$p' = t/256\f$ (dropout_threshold()), the multiple of 1/256
/// nearest to \f$p\f$.
FA_HD constexpr double dropout_effective_p(double p) { return double(dropout_threshold(p)) / 256.0; }

/// What a kept score is multiplied by: \f$1/(1 - p') = 256/(256 - t)\f$, so that the output's
/// expectation over masks is the undropped output exactly.
FA_HD constexpr double dropout_keep_scale(double p) { return 256.0 / double(256u - dropout_threshold(p)); }

/// The Philox key of a dropout seed: \f$k_0\f$ = low 32 bits, \f$k_1\f$ = high 32 bits.
FA_HD constexpr PhiloxKey dropout_key(uint64_t seed) { return {{uint32_t(seed), uint32_t(seed >> 32)}}; }

/// The Philox counter of the group that holds score (`row`, `col`) of query head `head` of
/// sequence `batch`: \f$(4 \lfloor j/32 \rfloor + \lfloor (j \bmod 8)/2 \rfloor,\;
/// 8 \lfloor i/16 \rfloor + i \bmod 8,\; b \cdot 2^{16} + h,\; \text{offset})\f$. `batch` and `head`
/// must be below \f$2^{16}\f$ (VarlenProblem::validate() checks it when dropout is on).
//! [dropout_map]
FA_HD constexpr PhiloxWords dropout_counter(uint32_t offset, uint32_t batch, uint32_t head, uint32_t row, uint32_t col) {
    return {{(col / 32u) * 4u + (col % 8u) / 2u, (row / 16u) * 8u + row % 8u, (batch << 16) | head, offset}};
}
//! [dropout_map]

/// Which of its group's 16 bytes decides score (`row`, `col`):
/// \f$8 \lfloor (i \bmod 16)/8 \rfloor + 2 \lfloor (j \bmod 32)/8 \rfloor + j \bmod 2\f$.
FA_HD constexpr uint32_t dropout_byte(uint32_t row, uint32_t col) {
    return 8u * ((row % 16u) / 8u) + 2u * ((col % 32u) / 8u) + col % 2u;
}

/// Byte \f$n\f$ (0..15) of one call's 128 bits: bits \f$8(n \bmod 4)\f$ to \f$8(n \bmod 4) + 7\f$ of
/// word \f$\lfloor n/4 \rfloor\f$. A kernel that holds the whole group reads its 16 bytes this way,
/// \f$n\f$ known at compile time (dropout_byte() of each of its scores).
FA_HD constexpr uint32_t philox_byte(const PhiloxWords& r, uint32_t n) { return (r.w[n / 4] >> (8u * (n % 4u))) & 0xffu; }

/// The keep bits of one word's four bytes: bit \f$k\f$ is 1 iff byte \f$k\f$ of `word` is
/// \f$\ge t\f$, where `threshold4` holds \f$t\f$ in each of its four bytes (\f$t \cdot\f$
/// 0x01010101). The four comparisons at once, in the word's own bits ("SWAR"):
///
/// - \f$d = (w \lor \mathtt{0x80808080}) - (t_4 \land \mathtt{0x7f7f7f7f})\f$: in each byte
///   \f$(128 + w_{\mathrm{low}}) - t_{\mathrm{low}} \ge 1\f$ (the low seven bits), so no byte
///   borrows from the next, and the byte's top bit is 1 iff \f$w_{\mathrm{low}} \ge t_{\mathrm{low}}\f$;
/// - a byte is \f$\ge t\f$ iff its top bit is 1 where \f$t\f$'s is 0, or the two top bits are
///   equal and \f$d\f$'s is 1: \f$g = ((w \land \lnot t_4) \lor (\lnot(w \oplus t_4) \land d))
///   \land \mathtt{0x80808080}\f$, one three-input logic op and a mask;
/// - the product \f$g \cdot \mathtt{0x00204081}\f$ moves bit \f$8k + 7\f$ to bit \f$28 + k\f$
///   (the partial products land on distinct bits, so nothing carries), and \f$\gg 28\f$ leaves the
///   four keep bits.
///
/// About seven integer instructions a word where a byte at a time takes three or four a byte; the
/// backward kernels, which draw the bits of every score they hold, use it (stage 09's
/// dropout_keep_bits()). The tests compare it with the byte-by-byte definition for every
/// threshold and byte value.
FA_HD constexpr uint32_t dropout_keep4(uint32_t word, uint32_t threshold4) {
    constexpr uint32_t kHigh = 0x80808080u;
    const uint32_t d = (word | kHigh) - (threshold4 & ~kHigh);
    const uint32_t ge = ((word & ~threshold4) | (~(word ^ threshold4) & d)) & kHigh;
    return (ge * 0x00204081u) >> 28;
}

/// The keep bits of the whole group that holds score (`row`, `col`): bit \f$n\f$ is 1 iff byte
/// \f$n\f$ of the Philox4x32-10 call is \f$\ge\f$ `threshold` (dropout_threshold()). One call.
FA_HD constexpr uint32_t dropout_keep16(uint64_t seed, uint32_t offset, uint32_t batch, uint32_t head, uint32_t row,
                                        uint32_t col, uint32_t threshold) {
    const PhiloxWords r = philox4x32_10(dropout_counter(offset, batch, head, row, col), dropout_key(seed));
    uint32_t bits = 0;
    for (uint32_t n = 0; n < 16; ++n) bits |= uint32_t(philox_byte(r, n) >= threshold) << n;
    return bits;
}

/// Whether score \f$(b, h, i, j)\f$ = (`batch`, `head`, `row`, `col`) survives dropout with drop
/// probability `p` (as it runs: \f$p'\f$, dropout_effective_p()). Rows and columns count from the
/// start of the sequence. A kernel calls dropout_keep16() instead, once per 16 scores.
FA_HD constexpr bool dropout_keep(uint64_t seed, uint32_t offset, uint32_t batch, uint32_t head, uint32_t row,
                                  uint32_t col, double p) {
    return (dropout_keep16(seed, offset, batch, head, row, col, dropout_threshold(p)) >> dropout_byte(row, col)) & 1u;
}

}  // namespace fa
