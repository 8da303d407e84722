/// \file reference_ext.hpp
/// \brief The float64 reference, forward and backward, extended once for what stage 10 adds:
/// packed variable-length batches, grouped-query heads, sliding windows, the soft cap and dropout.
///
/// For one sequence \f$b\f$ and query head \f$h\f$ reading key/value head \f$g = \lfloor h /
/// (H_q/H_k) \rfloor\f$ (VarlenProblem):
///
/// \f[ S^{raw} = \text{scale}\; Q K_g^\top,\qquad S = c \tanh(S^{raw} / c)\ \ (\text{or } S = S^{raw}
///     \text{ when } c = 0),\qquad P = \text{softmax}(S + \text{window mask}), \f]
/// \f[ \tilde P = P \circ Z,\quad Z_{ij} = \frac{\text{keep}_{ij}}{1 - p},\qquad O = \tilde P V_g,
///     \qquad \text{LSE}_i = \log \textstyle\sum_j e^{S_{ij}} \text{ over the visible } j. \f]
///
/// The LSE is that of the scores before dropout: it is what the backward needs to rebuild \f$P\f$
/// (the mask is regenerated, not stored). keep comes from dropout_keep() (fa/philox.hpp) with the
/// row and column counted within the sequence. The backward, with \f$dO\f$ given:
///
/// \f[ d\tilde P = dO\, V_g^\top,\quad dP = d\tilde P \circ Z,\quad D_i = \textstyle\sum_x dO_{ix} O_{ix}
///     = \sum_j P_{ij}\, dP_{ij},\quad dS = P \circ (dP - D \mathbf{1}^\top), \f]
/// \f[ dS^{raw} = dS \circ (1 - \tanh^2(S^{raw}/c)),\quad dQ = \text{scale}\; dS^{raw} K_g,\quad
///     dK_g \mathrel{+}= \text{scale}\; (dS^{raw})^\top Q,\quad dV_g \mathrel{+}= \tilde P^\top dO, \f]
///
/// dK and dV of key/value head \f$g\f$ summing over the \f$H_q/H_k\f$ query heads of its group.
/// \f$D\f$ is still \f$\text{rowsum}(dO \circ O)\f$ with dropout, because \f$O\f$ is the dropped
/// output: \f$\sum_j P_{ij} Z_{ij} (dO V^\top)_{ij} = \sum_x dO_{ix} O_{ix}\f$.
///
/// With no new feature (equal lengths, \f$H_q = H_k\f$, window (-1, -1) or (-1, 0), no cap, no
/// dropout) these are reference_attention() and reference_backward() exactly: the same Eigen
/// products on the same blocks of 128 query rows, so the same float64 sums, bit for bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fa/precision.hpp"
#include "fa/reference.hpp"
#include "fa/reference_backward.hpp"
#include "fa/tensor.hpp"
#include "fa/varlen.hpp"

namespace fa {

/// Output of reference_attention_varlen().
struct VarlenReference {
    std::vector<double> o;    ///< (total_q, Hq, d), the packed order of q
    std::vector<double> lse;  ///< (Hq, total_q); -inf for rows that see no key
};

/// Gradients of reference_backward_varlen(), in the packed orders of q, k and v.
struct VarlenGradients {
    std::vector<double> dq;  ///< (total_q, Hq, d)
    std::vector<double> dk;  ///< (total_k, Hk, d), summed over each key/value head's group
    std::vector<double> dv;  ///< (total_k, Hk, d), summed over each key/value head's group
};

/// The float64 forward of VarlenProblem: q is \f$(1, H_q, \text{total}_q, d)\f$, k and v \f$(1, H_k,
/// \text{total}_k, d)\f$ (make_packed_view(); any strides). Validates the problem and the shapes
/// (InputError). Safe softmax, a block of 128 query rows of one sequence and head at a time:
/// memory O(128 x max Nk).
VarlenReference reference_attention_varlen(const VarlenProblem& problem, View4<const float> q, View4<const float> k,
                                           View4<const float> v);

/// The float64 backward of VarlenProblem from q, k, v and dO alone (dO shaped like q): it
/// recomputes S, P, the dropout mask and O in float64 and trusts no stage's output. Rows that see
/// no key get dQ = 0; keys no query sees get dK = dV = 0; never NaN.
VarlenGradients reference_backward_varlen(const VarlenProblem& problem, View4<const float> q, View4<const float> k,
                                          View4<const float> v, View4<const float> dout);

/// The dropout keep mask \f$(B, H_q, \max N_q, \max N_k)\f$ as uint8 in C order: 1 where
/// dropout_keep() keeps entry \f$(b, h, i, j)\f$, 0 where it drops it, and 0 outside sequence
/// \f$b\f$'s \f$N_q^{(b)} \times N_k^{(b)}\f$ corner (padding). It is dropout alone: the window
/// is not applied (P is 0 there anyway). Without dropout every entry of the corner is 1. An outside
/// reference that zeroes \f$P\f$ where the mask is 0 and scales the rest by \f$1/(1-p)\f$ gets the
/// O and gradients of reference_attention_varlen() and reference_backward_varlen(). Throws
/// InputError when the mask would exceed `max_elements` (it is for small problems: `--save`).
std::vector<uint8_t> dropout_keep_mask(const VarlenProblem& problem, int64_t max_elements = int64_t(1) << 28);

/// Writes dropout_keep_mask() to `path` as a uint8 .npy file of shape \f$(B, H_q, \max N_q, \max
/// N_k)\f$ (`--save DIR` writes `DIR/dropout_mask.npy`); InputError as dropout_keep_mask(), or
/// when the file cannot be written.
void write_dropout_mask_npy(const std::string& path, const VarlenProblem& problem,
                            int64_t max_elements = int64_t(1) << 28);

/// reference_attention_varlen() as a straightforward implementation in `precision` computes it:
/// what naive_attention_emulated() is to the dense reference, with the grouped heads, the window,
/// the soft cap and dropout. q, k, v rounded to the precision; S summed in float32, scaled, then
/// capped; the softmax in float32 over the visible keys; P (dropped entries 0, kept ones times
/// \f$1/(1-p')\f$) rounded; O summed in float32 and rounded. o in the packed order (total_q, Hq,
/// d), lse (Hq, total_q), as VarlenReference. Its error against the float64 reference is what a
/// 16-bit stage may err twice of (low_precision_tolerance()).
EmulatedAttention naive_attention_varlen_emulated(Precision precision, const VarlenProblem& problem, View4<const float> q,
                                                  View4<const float> k, View4<const float> v);

/// reference_backward_varlen() as a straightforward implementation in `precision` computes it:
/// what naive_backward_emulated() is to the dense backward (P and dS stored per sequence and
/// head, rounded before they enter a product; D and dS in float32; the same
/// EmulatedGradients::terms_max_abs and d_terms_max_abs), with the window, the soft cap (dS times
/// \f$1 - \tanh^2\f$), dropout (\f$\tilde P\f$ into O and dV, \f$dP\f$ times the mask) and dK, dV of
/// each key/value head summed in float32 over its group before they are rounded. Gradients in the
/// packed orders of VarlenGradients; the input to gradient_tolerance().
EmulatedGradients naive_backward_varlen_emulated(Precision precision, const VarlenProblem& problem, View4<const float> q,
                                                 View4<const float> k, View4<const float> v, View4<const float> dout);

/// Floating-point operations reference_attention_varlen() is charged for: \f$4 d\f$ per (query,
/// key) pair of every sequence and query head, every pair counted (the reference computes every
/// score of a sequence, visible or not).
double reference_varlen_flops(const VarlenProblem& problem);

}  // namespace fa
