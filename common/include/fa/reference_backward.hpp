/// \file reference_backward.hpp
/// \brief The gradients of attention: the float64 golden reference, and the naive backward
/// (the one that stores P) in float32, bf16 or fp16, whose error sets the backward's tolerances.
///
/// With \f$S = \text{scale}\, Q K^\top\f$ (masked entries \f$-\infty\f$), \f$P = \text{softmax}(S)\f$
/// row by row, \f$O = P V\f$ and the upstream gradient \f$dO = \partial L / \partial O\f$:
///
/// \f[ dV = P^\top dO,\quad dP = dO\, V^\top,\quad D_i = \textstyle\sum_x dO_{ix} O_{ix},\quad
///     dS = P \circ (dP - D \mathbf{1}^\top),\quad dQ = \text{scale}\; dS\, K,\quad
///     dK = \text{scale}\; dS^\top Q . \f]
///
/// Rows that see no key (causal with Nq > Nk) have \f$P = 0\f$: they contribute nothing and get
/// \f$dQ = 0\f$. The LSE is an output the backward reads, not one it differentiates: only \f$dO\f$
/// flows back.
#pragma once

#include <vector>

#include "fa/precision.hpp"
#include "fa/problem.hpp"
#include "fa/tensor.hpp"

namespace fa {

/// Gradients from the float64 reference, in logical (b, h, n, x) order.
struct ReferenceGradients {
    std::vector<double> dq;  ///< (B, H, Nq, d)
    std::vector<double> dk;  ///< (B, H, Nk, d)
    std::vector<double> dv;  ///< (B, H, Nk, d)
};

/// The backward pass in float64 with Eigen, from q, k, v and dO alone: it recomputes S, P and O
/// in float64 (it does not trust any stage's O or LSE), a block of 128 query rows at a time, so
/// its memory stays O(rows x Nk) per head plus one head's dK and dV.
ReferenceGradients reference_backward(const Problem& problem, View4<const float> q, View4<const float> k,
                                      View4<const float> v, View4<const float> dout);

/// Gradients of naive_backward_emulated(), in logical order; every value representable in the
/// emulated precision.
struct EmulatedGradients {
    std::vector<float> dq;  ///< (B, H, Nq, d)
    std::vector<float> dk;  ///< (B, H, Nk, d)
    std::vector<float> dv;  ///< (B, H, Nk, d)
    /// How large the terms that cancel in \f$dP - D\f$ make dQ and dK: the largest element of
    /// \f$T_Q = \text{scale}\,(P \circ (|dP| + |D|))\,|K|\f$ and \f$T_K = \text{scale}\,(P \circ
    /// (|dP| + |D|))^\top |Q|\f$, and 0 for dV (no difference enters it). A float32 sum of d
    /// products errs by up to \f$d\,u\f$ of the sum of their magnitudes, so an implementation
    /// that forms \f$dP\f$ and \f$D\f$ in another order than this one may differ from it by about
    /// \f$d\,u\,T\f$ (gradient_tolerance() allows it).
    double terms_max_abs[3] = {0.0, 0.0, 0.0};
    /// The L2 norms of \f$T_Q\f$ and \f$T_K\f$ over every head (0 for dV).
    double terms_l2[3] = {0.0, 0.0, 0.0};
    /// How far an error in \f$D_i = \sum_x dO_{ix} O_{ix}\f$ moves dQ and dK on the rows where this
    /// backward is exempt from it: the largest element of \f$T^D_Q = \text{scale}\,\bar D \circ
    /// (P\,|K|)\f$ and \f$T^D_K = \text{scale}\,P^\top (\bar D \circ |Q|)\f$ (row-wise products),
    /// with \f$\bar D_i = \sum_x |dO_{ix}|\,(P\,|V|)_{ix}\f$ on those rows and 0 elsewhere; 0 for dV.
    ///
    /// The rows: P rounds to a single 1 in the precision (a one-hot softmax, its scores far apart)
    /// and the largest score \f$s_i\f$ is so large that \f$u\,(|s_i| + 4) \ge u_P / 2\f$ (fp16:
    /// \f$|s_i| \gtrsim 4096\f$, bf16: 32768). On such a row this backward's O is exactly a row of V
    /// and \f$dP - D\f$ cancels exactly. A FlashAttention forward gets the largest P only to float32
    /// rounding of the score, \f$e^{\pm u |s_i|}\f$ (stage 07: exp2 of a fused multiply-add
    /// against the rounded \f$m \cdot \text{scale} \log_2 e\f$, plus the approximate exp2), which
    /// now reaches half a 16-bit unit; it rounds P before \f$P V\f$ but sums \f$\ell\f$ unrounded,
    /// then rounds O: its O errs by up to \f$2u_P |v|\f$, its D by \f$2u_P \bar D\f$, and every
    /// \f$dS_{ij} = P_{ij}(dP_{ij} - D_i)\f$ of the row with it (gradient_tolerance() allows
    /// \f$2u_P T^D\f$). Below that size its P rounds back to 1 and its O to the row of V; on rows
    /// that are not one-hot this backward's O is rounded as well, and its error carries the effect.
    double d_terms_max_abs[3] = {0.0, 0.0, 0.0};
    /// The L2 norms of \f$T^D_Q\f$ and \f$T^D_K\f$ over every head (0 for dV).
    double d_terms_l2[3] = {0.0, 0.0, 0.0};
    /// Values beyond the precision's range (65504 in fp16) where they were to be rounded: dS or a
    /// gradient (P and O cannot: \f$P \le 1\f$, \f$|O| \le \max|v|\f$). Each keeps the float32
    /// value a kernel's float32 accumulator holds instead of becoming an infinity, so one overflow
    /// does not leave the baseline without a finite error; gradient_tolerance() reports the count.
    int64_t overflowed = 0;
};

/// The backward pass as a straightforward implementation in `precision` computes it, storing the
/// Nq x Nk matrices P and dS of one head: q, k, v and dO rounded to the precision; S, the softmax
/// and O as in naive_attention_emulated() (O rounded to the precision); every product accumulated
/// in float32 with its 16-bit operands rounded (P and dS are rounded before they enter
/// \f$P^\top dO\f$, \f$dS\,K\f$ and \f$dS^\top Q\f$); D and dS in float32; dQ, dK, dV rounded to the
/// precision, except that a value beyond the precision's range stays in float32 and is counted
/// (EmulatedGradients::overflowed). For Float32 nothing is rounded: it is the textbook float32
/// backward. Its error against reference_backward() is what a stage's gradients are allowed
/// twice of (gradient_tolerance()). Costs O(B H Nq Nk d) and Nq x Nk floats per head: the driver runs it
/// only when the float64 reference runs.
EmulatedGradients naive_backward_emulated(Precision precision, const Problem& problem, View4<const float> q,
                                          View4<const float> k, View4<const float> v, View4<const float> dout);

/// Floating-point operations reference_backward() is charged for: the forward's two products
/// again and the five of a FlashAttention backward, \f$14\,B H N_q N_k d\f$, with no causal
/// halving (the reference computes every score). The executables skip it above their reference
/// budget.
double reference_backward_flops(const Problem& problem);

}  // namespace fa
