/// \file stages/03_online_softmax/attention.hpp
/// \brief Stage 03: the online softmax, one query row at a time, in one pass over the keys.
///
/// **Adds:** the online softmax. For each query row the keys stream past once; the row keeps
/// a running maximum `m`, a running sum `l = sum exp(s_j - m)` and a running output
/// `acc = sum exp(s_j - m) v_j`. When a new score raises the maximum from `m_old` to `m_new`,
/// everything summed so far is multiplied by `exp(m_old - m_new)`, which re-expresses it against
/// the new maximum. At the end `O = acc / l` and `LSE = m + log(l)`.
///
/// **Why:** stage 02 needs the whole row of scores before it can start (its max), so it stores
/// S: Nq x Nk floats. Here no score outlives its own key, so the intermediate memory is O(N d)
/// (the dense copies of one head's q, k and v) instead of O(N^2).
///
/// **Does not handle yet:** speed. Each score is a dot product of length d and each update an
/// axpy of length d: vector-sized work, with two scalar `exp` per key. The matrix units of
/// the CPU (and GEMM's cache reuse) go unused; stage 04 restores them by processing blocks.
///
/// **Measured:** on an Intel Xeon (Emerald Rapids, one core, AVX-512), 2026-11-22, B=1 H=1
/// d=64, N=4096: 318 ms (13.5 GFLOP/s) with 3.0 MiB of intermediates, against stage 02's 93 ms
/// and 69 MiB: the memory is won, the speed is lost. Details on the lesson page
/// (stages/03_online_softmax/README.md).
#pragma once

#include "fa/problem.hpp"
#include "fa/tensor.hpp"

namespace fa::stage03 {

/// Attention with the online softmax: one pass over the keys per query row, no score matrix.
///
/// \param problem shapes, scale and causality
/// \param q (B, H, Nq, d) view, any layout
/// \param k (B, H, Nk, d) view
/// \param v (B, H, Nk, d) view
/// \param o (B, H, Nq, d) output view; rows that see no key get 0
/// \param lse (B, H, Nq) output: `m + log(l)` per row, -inf for rows that see no key
void attention(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v,
               View4<float> o, View3<float> lse);

/// Bytes of the intermediates this stage allocates: dense copies of one head's q, k and v, and
/// one output row. O(N d), independent of Nq * Nk.
double intermediate_bytes(const Problem& problem);

}  // namespace fa::stage03
