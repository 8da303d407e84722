/// \file stages/04_cpu_tiling/attention.hpp
/// \brief Stage 04: the FlashAttention algorithm on the CPU, blocks of queries against blocks of keys.
///
/// **Adds:** tiling. Q is cut into Tr blocks `Q_i` of Br rows, K and V into Tc blocks `K_j`, `V_j`
/// of Bc rows. For each `Q_i` the key blocks stream past: `S_ij = scale * Q_i K_j^T` is one small
/// matrix product, the online softmax of stage 03 is applied to whole rows of `S_ij` at once
/// (running `m_i`, `l_i`, and `O_i` rescaled by `exp(m_old - m_new)`), and `O_i += P_ij V_j` is a
/// second matrix product. `O_i / l_i` and `LSE = m_i + log(l_i)` are written once at the end.
/// Under the causal mask, key blocks entirely above the diagonal are never computed, and only
/// the blocks that cross it are masked.
///
/// **Why:** stage 03 proved the memory argument (no Nq x Nk matrix) but does vector work, one
/// key at a time. Blocks turn that work back into matrix products, which reuse every loaded value
/// Br or Bc times from cache and run at GEMM speed, while the intermediates stay Br x Bc. The
/// same loop structure, with `Q_i`, `K_j`, `V_j` in shared memory, is stage 05's CUDA kernel.
///
/// **Also shows:** `Tiling::local_softmax` (`--local-softmax`), the tempting shortcut of
/// normalizing each `S_ij` by its own row max and row sum. It is wrong whenever a row spans
/// more than one key block, and the executable reports the mismatch.
///
/// **Does not handle yet:** threads (one core; the heads and query blocks are independent and
/// could be spread over cores), and the GPU, which is where the next stage goes.
///
/// **Measured:** on an Intel Xeon (Emerald Rapids, one core of a 2-vCPU virtual machine,
/// AVX-512), 2026-11-22, B=1 H=1 N=4096 d=64, Br=128 Bc=512: 99-102 GFLOP/s, 71-77% of the
/// 1024^3 Eigen float GEMM measured in the same runs. Peak RSS at N=16384: 20.7 MiB, 1.0% of
/// stage 01's 2.04 GiB. The lesson page (stages/04_cpu_tiling/README.md) has the details.
#pragma once

#include <cstdint>
#include <string>

#include "fa/problem.hpp"
#include "fa/tensor.hpp"

namespace fa::stage04 {

/// Largest block size accepted for Br or Bc (a 4096 x 4096 score block is already 64 MiB).
inline constexpr int64_t kMaxBlock = 4096;

/// Block sizes and the softmax variant of the tiled algorithm.
struct Tiling {
    int64_t Br = 128;   ///< query rows per block Q_i (`--block-m`)
    int64_t Bc = 512;   ///< key/value rows per block K_j, V_j (`--block-n`)
    /// Normalize each S_ij with its own row max and row sum and add `P_ij V_j` without any
    /// rescaling. WRONG whenever Nk > Bc; kept to show why the online softmax is needed.
    bool local_softmax = false;
};

/// How many score blocks S_ij one call computed, summed over all heads.
struct BlockCounts {
    int64_t total = 0;     ///< B * H * Tr * Tc: every block of the full score matrix
    int64_t computed = 0;  ///< blocks whose S_ij was computed
    int64_t masked = 0;    ///< computed blocks that cross the causal diagonal and needed a mask
    int64_t skipped = 0;   ///< blocks entirely above the causal diagonal, never computed
};

/// Throws InputError naming the option (`--block-m`, `--block-n`) when a block size is outside
/// [1, kMaxBlock].
void check_tiling(const Tiling& tiling);

/// One line such as `Br=64 Bc=512 (Tr=64 x Tc=8 blocks per head), online softmax`.
std::string describe(const Tiling& tiling, const Problem& problem);

/// The FlashAttention forward pass with the default Tiling.
///
/// \param problem shapes, scale and causality
/// \param q (B, H, Nq, d) view, any strides
/// \param k (B, H, Nk, d) view
/// \param v (B, H, Nk, d) view
/// \param o (B, H, Nq, d) output view; rows that see no key get 0
/// \param lse (B, H, Nq) output: `m_i + log(l_i)`, -inf for rows that see no key
void attention(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v,
               View4<float> o, View3<float> lse);

/// The FlashAttention forward pass with explicit block sizes (see attention()).
///
/// \param problem shapes, scale and causality
/// \param q (B, H, Nq, d) view, any strides
/// \param k (B, H, Nk, d) view
/// \param v (B, H, Nk, d) view
/// \param o (B, H, Nq, d) output view
/// \param lse (B, H, Nq) output
/// \param tiling Br, Bc and the softmax variant; checked with check_tiling()
/// \return how many score blocks were computed, masked and skipped
BlockCounts attention_tiled(const Problem& problem, View4<const float> q, View4<const float> k,
                            View4<const float> v, View4<float> o, View3<float> lse, const Tiling& tiling);

/// Bytes of the intermediates: S_ij / P_ij (Br x Bc), Q_i and O_i (Br x d), m_i and l_i (Br),
/// with Br and Bc clamped to Nq and Nk. Independent of Nq * Nk. (Views whose feature axis is
/// not contiguous would add a dense copy of one head's q, k, v; bhnd and bnhd never do.)
double intermediate_bytes(const Problem& problem, const Tiling& tiling);

/// Single-core Eigen float GEMM rates on this machine: the ceilings stage 04 is compared with.
struct GemmCeiling {
    double square_gflops = 0;  ///< C = A B, all three 1024 x 1024, row-major
    double blocks_gflops = 0;  ///< the block products of stage 04 alone (see measure_gemm_ceiling())
    std::string blocks_shape;  ///< e.g. "[64 x 64] x [64 x 512] then [64 x 512] x [512 x 64]"
};

/// Measures GemmCeiling: the median of `repeat` timed runs of (1) a 1024^3 square product and
/// (2) every block product stage 04 performs on one head of `problem` without the causal mask,
/// `S_ij = Q_i K_j^T` and `O_i += P_ij V_j`, with no softmax between them. (2) is what the tiled
/// loop could reach if the softmax were free; (1) is the machine's GEMM rate.
GemmCeiling measure_gemm_ceiling(const Problem& problem, const Tiling& tiling, int repeat);

}  // namespace fa::stage04
