/// \file unpad.hpp
/// \brief Removing the padding of a batch and putting it back: a padded \f$(B, N, H, d)\f$ batch
/// with a \f$(B, N)\f$ padding mask \f$\leftrightarrow\f$ packed \f$(\text{total}, H, d)\f$ rows
/// with `cu_seqlens` (CPU versions; the GPU ones come with stage 10's kernels).
///
/// A batch of sequences of different lengths is usually stored padded to the longest, with a mask
/// saying which positions are real tokens. Attention on the padded block spends work on padding:
/// with lengths \f$\ell_b\f$ padded to \f$N\f$, the scores cost \f$B N^2\f$ where only
/// \f$\sum_b \ell_b^2\f$ are needed (lengths 128 and 8192 padded together waste nearly half).
/// Packing removes that waste: the real tokens of every sequence are gathered back to back into
/// a \f$(\text{total}, H, d)\f$ tensor, and `cu_seqlens` (prefix sums of the lengths, B+1 int32
/// entries) say where each sequence starts, so a kernel maps (sequence, query tile) to thread
/// blocks and never touches padding. This is flash-attn's `unpad_input` / `pad_input` pair
/// around `flash_attn_varlen_func`.
///
/// Both directions are index gathers through one list, PackedIndex::indices: packed row \f$t\f$
/// is padded position \f$\text{indices}[t] = b N + n\f$. unpad() gathers along it; pad() scatters
/// back and writes zeros everywhere else. The mask need not be a prefix: any positions marked
/// real are kept, in order, so left padding works too.
#pragma once

#include <cstdint>
#include <vector>

#include "fa/tensor.hpp"

namespace fa {

/// Where each real token of a padded \f$(B, N)\f$ batch goes in the packed tensor.
struct PackedIndex {
    int64_t batch = 0;                ///< B, sequences
    int64_t seq = 0;                  ///< N, padded length of each sequence
    std::vector<int64_t> indices;     ///< (total): packed row t is padded position indices[t] = b N + n
    std::vector<int32_t> cu_seqlens;  ///< (B+1): sequence b owns packed rows [cu_seqlens[b], cu_seqlens[b+1])
    int64_t max_seqlen = 0;           ///< the longest sequence (flash-attn's max_seqlen)

    /// Real tokens in all, the packed length.
    int64_t total() const { return int64_t(indices.size()); }
};

/// The packing of a \f$(B, N)\f$ padding mask in C order (nonzero = real token, 0 = padding).
/// Throws InputError when the mask does not hold B N entries or the total exceeds int32.
PackedIndex packed_index_from_mask(const std::vector<uint8_t>& mask, int64_t batch, int64_t seq);

/// The packing of right-padded sequences: sequence b holds positions \f$[0, \ell_b)\f$ of \f$N\f$.
/// Throws InputError for a length outside \f$[0, N]\f$.
PackedIndex packed_index_from_lengths(const std::vector<int64_t>& lengths, int64_t seq);

/// Gathers the real tokens of `padded` (logical \f$(B, H, N, d)\f$, any layout; a \f$(B, N, H,
/// d)\f$ buffer is its BNHD view) into `packed` (\f$(1, H, \text{total}, d)\f$, make_packed_view()).
/// Throws InputError when a shape disagrees with `index`.
void unpad(View4<const float> padded, const PackedIndex& index, View4<float> packed);

/// unpad() into a new packed \f$(\text{total}, H, d)\f$ tensor (`HostTensor(1, H, total, d, BNHD)`).
HostTensor unpad(View4<const float> padded, const PackedIndex& index);

/// Scatters `packed` (\f$(1, H, \text{total}, d)\f$) back into `padded` (\f$(B, H, N, d)\f$, any
/// layout), writing 0 at every padding position: the inverse of unpad() on real tokens. Throws
/// InputError when a shape disagrees with `index`.
void pad(View4<const float> packed, const PackedIndex& index, View4<float> padded);

/// pad() into a new \f$(B, H, N, d)\f$ tensor stored in `layout` (BNHD: the \f$(B, N, H, d)\f$
/// buffer a model holds).
HostTensor pad(View4<const float> packed, const PackedIndex& index, Layout layout = Layout::BNHD);

}  // namespace fa
