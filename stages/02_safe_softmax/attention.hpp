/// \file stages/02_safe_softmax/attention.hpp
/// \brief Stage 02: the softmax that never overflows, by subtracting each row's maximum.
///
/// **Adds:** the safe softmax. Before exponentiating, each row of `S` is shifted by its own
/// maximum `m`, so every exponent is `s - m <= 0` and every `exp(s - m)` lies in `(0, 1]`. The
/// row is read three times: once for `m`, once for `l = sum_j exp(s_j - m)`, once to divide by
/// `l`. The result is mathematically the same softmax; the LSE is `m + log(l)`.
///
/// **Why:** stage 01's `exp(s)` overflows float32 as soon as a score exceeds 88.7, and real
/// attention scores do (`--inputs large` gives scores of order 400). The shift costs one extra
/// pass over the row and removes the limit entirely.
///
/// **Does not handle yet:** memory. `S` is still materialized, Nq x Nk per head (1 GiB at
/// N = 16384), and each score is read three times. Stage 03 fuses the passes into one with the
/// online softmax; stage 04 also drops the Nq x Nk matrix.
///
/// **Measured:** on an Intel Xeon (Emerald Rapids, one core, AVX-512), 2026-11-22, B=1 H=1
/// d=64: N=16384 in 1.56 s with 1.02 GiB of intermediates (stage 01: 8.60 s, 2.02 GiB), and
/// finite on `--inputs large`. Details on the lesson page (stages/02_safe_softmax/README.md).
#pragma once

#include "fa/problem.hpp"
#include "fa/tensor.hpp"

namespace fa::stage02 {

/// Attention with the three-pass safe softmax; materializes S (overwritten in place by P) per head.
///
/// \param problem shapes, scale and causality
/// \param q (B, H, Nq, d) view, any layout
/// \param k (B, H, Nk, d) view
/// \param v (B, H, Nk, d) view
/// \param o (B, H, Nq, d) output view; rows that see no key get 0
/// \param lse (B, H, Nq) output: `m + log(l)` per row, -inf for rows that see no key
void attention(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v,
               View4<float> o, View3<float> lse);

/// Bytes of the intermediates this stage allocates: one Nq x Nk float32 matrix (S, then P in
/// place) and dense copies of one head's q, k, v and o.
double intermediate_bytes(const Problem& problem);

}  // namespace fa::stage02
