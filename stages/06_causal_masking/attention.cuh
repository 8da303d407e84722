/// \file stages/06_causal_masking/attention.cuh
/// \brief Stage 06: causal attention that skips the key tiles the mask hides.
///
/// **Adds:** for each query tile, the key tiles split three ways by where they sit against the
/// bottom-right aligned diagonal. Tiles every row of the query tile sees in full run without a
/// mask (the first loop); tiles the diagonal crosses run with the per-element mask (the second
/// loop, at most two tiles for a 64 x 64 tile grid); tiles entirely above the diagonal are never
/// loaded nor computed. Causal query tiles are launched heaviest first when every head has
/// several blocks running at once, so the short tiles near the top of the causal triangle fill
/// the gaps at the end of the run instead of the long ones starting last. A query tile that sees no key at all writes O = 0 and LSE = -inf directly.
///
/// **Why:** in stage 05 a causal problem costs as much as a non-causal one: every score is
/// computed and half are then thrown away. Skipping whole tiles halves the work at Nq = Nk, and
/// keeping the mask out of the full tiles keeps their inner loop as lean as the non-causal one.
///
/// **Does not handle yet:** overlapping loads with math, tensor cores and half precision
/// (stage 07).
///
/// **Measured:** on an NVIDIA H100 80GB HBM3 (SXM) at 1980 MHz, 2026-11-22, at N = 8192: causal
/// takes 0.513 (d = 64) and 0.449 (d = 128) of the non-causal time; causal runs reach 0.81 to
/// 1.12 times PyTorch SDPA's efficient backend in float32 for N = 512 to 16384. The lesson page
/// (stages/06_causal_masking/README.md) has the table.
#pragma once

#include <string>

#include <cuda_runtime.h>

#include "fa/problem.hpp"
#include "fa/tensor.hpp"

namespace fa::stage06 {

/// Throws fa::InputError unless the kernel supports `problem` (head_dim 32, 64 or 128).
void check_supported(const Problem& problem);

/// The order in which the query tiles are handed to the GPU.
enum class Schedule {
    Auto,        ///< what attention_device uses: see chosen_schedule()
    HeavyFirst,  ///< the last query tiles (the most keys to see under a causal mask) of every head first
    InOrder,     ///< query tile fastest, head by head, as stage 05 does
};

/// The order Schedule::Auto picks for `problem` on the current GPU: HeavyFirst when the problem
/// is causal and at least 4 blocks of every head run at the same time (B * H * 4 <= the blocks
/// the GPU holds at once), InOrder otherwise. Heaviest-first interleaves the heads; with many
/// heads, the blocks running together then belong to different heads and no longer share K and
/// V in L2, which costs more than the better balance gains (measured on an H100: see the lesson).
Schedule chosen_schedule(const Problem& problem);

/// Device entry point: queues the kernel on `stream`; all views point to device memory (see
/// fa::stage05::attention_device for the layout requirements).
///
/// \param problem shapes, scale and causality
/// \param q (B, H, Nq, d) on the device
/// \param k (B, H, Nk, d) on the device
/// \param v (B, H, Nk, d) on the device
/// \param o (B, H, Nq, d) on the device, written
/// \param lse (B, H, Nq) on the device, written
/// \param stream where the kernel runs
/// \param schedule order of the query tiles (the benchmark compares them; the result is the same)
void attention_device(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v,
                      View4<float> o, View3<float> lse, cudaStream_t stream, Schedule schedule = Schedule::Auto);

/// Host entry point with the signature every stage shares (copy in, launch, copy out).
void attention(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v,
               View4<float> o, View3<float> lse);

/// How the key tiles of one problem divide: per (batch, head), summed over its query tiles.
struct TileCounts {
    int64_t total = 0;     ///< Tr x Tc: every tile of the score matrix
    int64_t unmasked = 0;  ///< seen in full by every row of their query tile: computed without a mask
    int64_t masked = 0;    ///< crossed by the diagonal or the end of the keys: computed with the mask
    int64_t skipped = 0;   ///< entirely above the diagonal: never loaded nor computed
};

/// Counts the tiles the kernel computes, masks and skips for `problem` (one head).
TileCounts count_tiles(const Problem& problem);

/// Block shape and tile counts for `problem`, in one line for the stage's report.
std::string describe_config(const Problem& problem);

}  // namespace fa::stage06
