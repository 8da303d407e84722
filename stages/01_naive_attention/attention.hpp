/// \file stages/01_naive_attention/attention.hpp
/// \brief Stage 01: attention exactly as the formula reads, every intermediate materialized.
///
/// **Adds:** the starting point. `S = scale * Q K^T` is built in full (Nq x Nk per head), the
/// softmax is `exp(s) / sum(exp(s))` exactly as written in textbooks, and `O = P V`.
///
/// **Why:** it is the definition every later stage must reproduce, and it shows the two walls:
/// memory, because S and P are Nq x Nk per head (2 GiB at N = 16384 for one head in float32),
/// and range, because `exp(s)` overflows float32 once `s > 88.7` (run it with `--inputs large`).
///
/// **Does not handle yet:** large scores (overflow is the lesson, fixed by stage 02), memory
/// (fixed by stages 03 and 04), speed.
///
/// **Measured:** on an Intel Xeon (Emerald Rapids, one core, AVX-512), 2026-11-22, B=1 H=1 d=64:
/// N=16384 in 8.60 s with 2.02 GiB of S and P; `--inputs large` gives NaN. Details on the
/// lesson page (stages/01_naive_attention/README.md).
#pragma once

#include "fa/problem.hpp"
#include "fa/tensor.hpp"

namespace fa::stage01 {

/// Naive attention: materializes S and P for each head, softmax without max subtraction.
///
/// \param problem shapes, scale and causality
/// \param q (B, H, Nq, d) view, any layout
/// \param k (B, H, Nk, d) view
/// \param v (B, H, Nk, d) view
/// \param o (B, H, Nq, d) output view
/// \param lse (B, H, Nq) output: `log(sum_j exp(s_ij))`, -inf for rows that see no key
void attention(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v,
               View4<float> o, View3<float> lse);

/// Bytes of the intermediates this stage allocates: S and P, Nq x Nk float32 each, one head at a time.
double intermediate_bytes(const Problem& problem);

}  // namespace fa::stage01
