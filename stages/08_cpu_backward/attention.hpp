/// \file stages/08_cpu_backward/attention.hpp
/// \brief Stage 08: the FlashAttention-2 backward pass on the CPU, P recomputed tile by tile from
/// Q, K and the saved LSE.
///
/// **Adds:** gradients. Given q, k, v, the forward's O and LSE, and the upstream gradient dO,
/// compute dQ, dK and dV without ever holding an Nq x Nk matrix: first \f$D_i = \sum_x dO_{ix}
/// O_{ix}\f$ for every query row; then, for each key/value block \f$K_j, V_j\f$ (outer loop), stream
/// the query blocks \f$Q_i\f$ past it (inner loop): \f$P_{ij} = \exp(\text{scale}\,Q_i K_j^\top -
/// \text{LSE}_i)\f$, \f$dV_j \mathrel{+}= P_{ij}^\top dO_i\f$, \f$dP_{ij} = dO_i V_j^\top\f$,
/// \f$dS_{ij} = P_{ij} \circ (dP_{ij} - D_i)\f$, \f$dK_j \mathrel{+}= \text{scale}\, dS_{ij}^\top Q_i\f$,
/// \f$dQ_i \mathrel{+}= \text{scale}\, dS_{ij} K_j\f$. dK_j and dV_j stay in the block's
/// accumulators until its inner loop ends; dQ is accumulated in place across the outer loop.
/// Under the causal mask, the same tile classes as stage 06: blocks entirely above the diagonal
/// are skipped, blocks that cross it are masked, the rest run unmasked.
///
/// **Why:** the backward of stage 01 stores P (and dP, dS): Nq x Nk per head, the memory wall
/// the forward just escaped. The LSE saved by the forward makes P one exponential away from the
/// scores, so recomputing it costs one extra matrix product (\f$Q_i K_j^\top\f$) and saves all of
/// that memory. The outer loop runs over K/V blocks because dK_j and dV_j are sums over query
/// rows: with K/V outside they finish in local accumulators, and only dQ is revisited.
///
/// **Does not handle yet:** threads and the GPU (stage 09). (The key/value blocks are
/// independent, and so are the heads: threads could share them out, all but dQ, which every
/// key block adds to.)
///
/// **Measured:** on an AMD EPYC (one core of a 2-vCPU virtual machine, AVX-512), 2026-11-23,
/// B=1 H=1 d=64, the default Br=128 Bc=256 (`bench/cpu_sweep.sh --backward`): 140-148 GFLOP/s
/// from N=2048 to 16384, 86-92% of the 1024^3 Eigen float GEMM measured in the same runs; 0.38 MiB
/// allocated at N=16384 where the textbook backward holds 2 GiB per head. The lesson page
/// (stages/08_cpu_backward/README.md) has the table.
#pragma once

#include <cstdint>
#include <string>

#include "fa/problem.hpp"
#include "fa/tensor.hpp"

namespace fa::stage08 {

/// Largest block size accepted for Br or Bc (stage 04's).
inline constexpr int64_t kMaxBlock = 4096;

/// Block sizes of the tiled backward.
struct Tiling {
    // Defaults: the fastest measured at N = 4096, d = 64 (see the file comment). Bc = 256 keeps
    // S_ij and dP_ij (Br x Bc each, 128 KiB) in L2 with room for Q_i, dO_i, K_j and V_j.
    int64_t Br = 128;  ///< query rows per block Q_i, dO_i, dQ_i (`--block-m`)
    int64_t Bc = 256;  ///< key/value rows per block K_j, V_j, dK_j, dV_j (`--block-n`)
};

/// How many blocks (i, j) one call visited, summed over all heads.
struct BlockCounts {
    int64_t total = 0;     ///< B * H * Tr * Tc
    int64_t computed = 0;  ///< blocks whose P_ij was recomputed
    int64_t masked = 0;    ///< computed blocks that cross the causal diagonal and needed a mask
    int64_t skipped = 0;   ///< blocks entirely above the causal diagonal, never computed
};

/// Throws InputError naming the option (`--block-m`, `--block-n`) when a block size is outside
/// [1, kMaxBlock].
void check_tiling(const Tiling& tiling);

/// One line such as `Br=128 Bc=256 (Tc=16 key blocks outside, Tr=32 query blocks inside, per head)`
/// (Tr and Tc with Br and Bc clamped to Nq and Nk).
std::string describe(const Tiling& tiling, const Problem& problem);

/// The FlashAttention-2 backward pass with the default Tiling.
///
/// \param problem shapes, scale and causality
/// \param q (B, H, Nq, d) view, any strides
/// \param k (B, H, Nk, d) view
/// \param v (B, H, Nk, d) view
/// \param o (B, H, Nq, d) the forward's output
/// \param lse (B, H, Nq) the forward's log-sum-exp (-inf for rows that see no key)
/// \param dout (B, H, Nq, d) the upstream gradient dL/dO
/// \param dq (B, H, Nq, d) output: dL/dQ (0 for rows that see no key)
/// \param dk (B, H, Nk, d) output: dL/dK (0 for keys no query sees)
/// \param dv (B, H, Nk, d) output: dL/dV (0 for keys no query sees)
void attention_backward(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v,
                        View4<const float> o, View3<const float> lse, View4<const float> dout, View4<float> dq,
                        View4<float> dk, View4<float> dv);

/// The backward pass with explicit block sizes (see attention_backward()).
/// \return how many blocks were computed, masked and skipped
BlockCounts attention_backward_tiled(const Problem& problem, View4<const float> q, View4<const float> k,
                                     View4<const float> v, View4<const float> o, View3<const float> lse,
                                     View4<const float> dout, View4<float> dq, View4<float> dk, View4<float> dv,
                                     const Tiling& tiling);

/// Bytes of the intermediates: D (Nq floats per head), the blocks S_ij/P_ij and dP_ij/dS_ij
/// (Br x Bc each), dK_j and dV_j accumulators (Bc x d each), with Br and Bc clamped to Nq and
/// Nk. Independent of Nq * Nk. (Views whose feature axis is not contiguous would add a dense
/// copy of one head of each such tensor; bhnd and bnhd never do.)
double intermediate_bytes(const Problem& problem, const Tiling& tiling);

/// Bytes the naive backward holds for the same problem: P and dS (or dP), Nq x Nk floats each,
/// for every head (the tensors an autograd engine keeps).
double naive_backward_bytes(const Problem& problem);

}  // namespace fa::stage08
