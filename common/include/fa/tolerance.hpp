/// \file tolerance.hpp
/// \brief How far a stage's output may be from the reference: limits derived from what the
/// arithmetic can promise on *these* inputs, in one place.
///
/// A fixed tolerance cannot serve real inputs. With scores of order 1, float32 rounding leaves
/// \f$O\f$ within about \f$10^{-6}\f$ of the exact result; with scores in the thousands (the
/// large logits of real models) the rounding of a single score is already \f$10^{-4}\f$, and a
/// correct stage would fail a limit tuned for the first case. The rule below follows the error
/// from where it starts (the scores) to where it ends (the softmax weights, \f$O\f$, the LSE),
/// so a correct stage passes on any finite input, while a wrong block, a missed rescale or a
/// dropped key, whose errors are of the order of the output itself, still fails. The stage 01
/// lesson explains it with its numbers (\ref stage01_checking).
#pragma once

#include <cstdint>
#include <string>

#include "fa/metrics.hpp"
#include "fa/precision.hpp"
#include "fa/problem.hpp"
#include "fa/reference_backward.hpp"
#include "fa/tensor.hpp"
#include "fa/varlen.hpp"

namespace fa {

/// \f$\ln(\text{FLT\_MAX}) \approx 88.72\f$: `exp(s)` overflows float32 for any score above it.
inline constexpr double kExpOverflowScore = 88.72283905206835;

/// What the rounding error of attention depends on, measured once per run on the inputs (one
/// pass over q, k and v: O((Nq + Nk) d) per head, nothing next to the attention itself).
struct InputStats {
    /// S: the largest \f$\text{scale}\cdot\lVert q_i\rVert\,\lVert k_j\rVert\f$ over the heads,
    /// an upper bound of every \f$|s_{ij}|\f$ (Cauchy-Schwarz). It is also the natural size of a
    /// score's rounding error: a float32 dot product errs by about \f$u \sum_x |q_x k_x|\f$
    /// (scaled), and \f$\sum_x |q_x k_x| \le \lVert q\rVert\,\lVert k\rVert\f$.
    double score_bound = 0;
    double max_abs_v = 0;  ///< V: the largest \f$|v|\f$; O is an average of rows of v, so \f$|O| \le V\f$
    int64_t head_dim = 0;  ///< d: terms in each dot product
    int64_t seq_k = 0;     ///< Nk: the most terms in each row's sums \f$\ell = \sum_j e^{s_j - m}\f$ and \f$\sum_j p_j v_j\f$
};

/// Measures InputStats on q, k, v (any layout) for `problem`.
InputStats input_stats(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v);

/// InputStats of a packed call (fa/varlen.hpp): the score bound over every query head and the
/// key/value head it reads (each query and key row's norm: a bound for any pair), the largest
/// \f$|v|\f$, d, and the longest key sequence. q is \f$(1, H_q, \text{total}_q, d)\f$, k and v
/// \f$(1, H_k, \text{total}_k, d)\f$ (make_packed_view()).
InputStats input_stats_varlen(const VarlenProblem& problem, View4<const float> q, View4<const float> k, View4<const float> v);

/// The limits O and the LSE are judged by, and how they were derived.
struct Tolerances {
    Tolerance o;         ///< for O: max_abs and rel_l2
    Tolerance lse;       ///< for the LSE: max_abs (it is a logarithm: its error is absolute)
    double error_unit;   ///< E: the relative error allowed in the softmax weights (see rounding_tolerance())
    std::string rule;    ///< for the report: which rule, with its numbers (two lines, separated by '\\n')
};

/// The rounding rule, for a stage whose products take inputs in `precision` and accumulate in
/// float32 (Float32 for the float32 stages).
///
/// With \f$u\f$ the unit roundoff of float32 (\f$2^{-24}\f$), \f$u_P\f$ that of `precision`,
/// and S, V, d, Nk from `stats`:
///
/// - a score \f$s = \text{scale}\cdot q\cdot k\f$ errs by at most about
///   \f$\delta_s = (2u_P + \sqrt{d}\,u)\,S\f$: the inputs rounded to the precision (none for
///   float32, where 2u covers the scale and the shift by the row max instead), plus a float32
///   sum of d terms, whose rounding grows like \f$\sqrt{d}\f$ when q and k share a direction;
/// - a softmax weight \f$p_j \propto e^{s_j - m}\f$ then has relative error
///   \f$\le 2\delta_s\f$ (its own score and, through the normalization, all the others);
/// - the float32 sums over the Nk keys (\f$\ell\f$ and \f$\sum_j p_j v_j\f$) add a relative
///   \f$8u\sqrt{N_k}\f$, and rounding the weights and O to the precision \f$2u_P\f$.
///
/// So \f$E = 2\delta_s + 8u\sqrt{N_k} + 2u_P\f$ and:
/// O max_abs \f$\le E\,V\f$, O rel_l2 \f$\le E\f$, LSE max_abs \f$\le E\f$. The constants leave
/// at least 2.8 times the largest error measured on the correct CPU stages over magnitudes of q
/// and k from \f$10^{-3}\f$ to 100, d from 1 to 200, rows of up to 16384 keys, q and k sharing a
/// direction and v away from zero; a dropped or repeated key tile exceeds the limits 10^4 times
/// over, a skipped rescale 2 to 10^4 times wherever it changes the result (tests/test_tolerance.cpp).
///
/// For bf16 and fp16 this is an a priori bound, loose by design (every input rounding taken at
/// its worst); low_precision_tolerance() is the tight rule, used when the float64 reference runs.
Tolerances rounding_tolerance(const InputStats& stats, Precision precision = Precision::Float32);

/// The rule for stages that compute in bf16 or fp16 (FlashAttention's own): the error against
/// float64 may be at most twice the error of the same attention computed naively in that
/// precision (naive_attention_emulated(), measured against the same reference as `naive_o` and
/// `naive_lse`), plus a floor: the float32 rule (so the limit never drops below what float32
/// can promise) and, for O, one rounding to the precision (\f$u_P V\f$, \f$u_P\f$). If the
/// naive computation itself produced non-finite values (an input beyond fp16's 65504 rounds to
/// infinity), it cannot set limits: the rule says so, with the counts, and the a priori
/// rounding_tolerance() applies, as gradient_tolerance() does for gradients.
Tolerances low_precision_tolerance(const InputStats& stats, Precision precision, const Metrics& naive_o,
                                   const Metrics& naive_lse);

/// The limits the three gradients of a backward stage are judged by, and the rule in words.
struct GradientTolerances {
    Tolerance dq;      ///< for dQ
    Tolerance dk;      ///< for dK
    Tolerance dv;      ///< for dV
    std::string rule;  ///< for the report (lines separated by '\n')
};

/// The backward's rule, the forward's low-precision rule carried over to gradients: each
/// gradient may err against float64 by at most twice the error of the naive backward computed
/// in the stage's precision (`naive`, from naive_backward_emulated(), which stores P; measured
/// here against `reference`), plus three floors:
/// - \f$F \cdot \max|g_\text{ref}|\f$ for max_abs and \f$F\f$ for rel_l2, where \f$F\f$ is the
///   float32 forward's \f$E\f$ (rounding_tolerance()) plus, for bf16 and fp16, one rounding
///   \f$u_P\f$ of the gradient;
/// - for dQ and dK, \f$d\,u\f$ (u = 2^-24) times the magnitude of the terms that cancel in
///   \f$dP - D\f$ (EmulatedGradients::terms_max_abs for max_abs, terms_l2 over
///   \f$\|g_\text{ref}\|_2\f$ for rel_l2): the float32 error of the two d-term sums, which an
///   implementation that forms them in another order than the naive one has and the naive one
///   may lack (with one key, its dP and D are the same sum and cancel exactly, while the true
///   gradient is 0);
/// - for dQ and dK in bf16 and fp16, \f$2u_P\f$ times the terms through which D reaches them on
///   the rows where the naive backward's O is exactly a row of V (EmulatedGradients::d_terms_max_abs,
///   d_terms_l2): a one-hot softmax with scores in the thousands, where a FlashAttention forward's
///   O is two 16-bit roundings away from that row and the naive one's is not. Without it a
///   correct stage 09 fails in fp16 on q, k of magnitude 100 (scores near \f$10^4\f$ after the
///   scale): there the naive baseline is off by \f$2 \cdot 10^{-4}\f$ while the stage's dQ, off by
///   0.5 through D, is right to the rounding of O (tests/test_gradient_tolerance.cpp).
///
/// A measured baseline rather than an a priori bound, because a gradient is a sum of terms of
/// both signs (\f$dS = P \circ (dP - D)\f$ cancels by construction): its rounding error is
/// relative to the terms, not to the result, and the naive backward suffers the same
/// cancellation.
///
/// Where the baseline leaves the precision's range (dS or a gradient beyond fp16's 65504), it
/// keeps those values in float32 (EmulatedGradients::overflowed) and the rule's report says how
/// many. Only if it is still not finite where float64 is (an input beyond the range rounds to
/// infinity) does nothing measured set the limits: the report says so and the a priori bound of
/// gradient_tolerance_a_priori() applies.
GradientTolerances gradient_tolerance(const InputStats& stats, Precision precision, const Problem& problem,
                                      const EmulatedGradients& naive, const ReferenceGradients& reference);

/// The fallback when the float64 reference (and so the naive baseline) does not run: the
/// forward's a priori \f$E\f$ for `precision`, grown by \f$4\sqrt{N}\f$ (N the larger of Nq and
/// Nk) for the cancellation in the sums over keys and queries: max_abs \f$\le 4 E \sqrt{N}
/// \max|g|\f$, rel_l2 \f$\le 4 E \sqrt{N}\f$, with \f$\max|g|\f$ of the implementation compared
/// with (`other_max_abs`). Loose: it catches gross errors only, and the report says so.
GradientTolerances gradient_tolerance_a_priori(const InputStats& stats, Precision precision, const Problem& problem,
                                               const double (&other_max_abs)[3]);

}  // namespace fa
