/// \file stages/05_shared_memory_kernel/attention.cuh
/// \brief Stage 05: the tiled algorithm of stage 04 as one CUDA kernel, in float32.
///
/// **Adds:** the GPU. One thread block per (batch, head, tile of Br = 64 query rows). The Q tile
/// is staged in shared memory once and stays; K and V stream through shared memory Bc = 64 rows
/// at a time; the scores `S_ij`, the running `m_i` and `l_i` and the output `O_i` live in
/// registers, each thread owning an 8 x 4 micro-tile of `S_ij` and an 8 x (d/16) micro-tile of
/// `O_i`. The softmax works in base 2 (`exp2`, with `log2 e` folded into the scale). Any Nq and
/// Nk (the tails are masked, never read out of bounds), both layouts (strides), d = 32, 64, 128.
/// The stage gets there by a road of seven steps (road(), `--step N`): from the kernel a
/// newcomer writes first, one thread per query row reading K and V from device memory
/// (road.cuh), through K/V tiles in shared memory and a block that shares each tile's work, to
/// the register micro-tiles, then three switches of TileConfig (float4 accesses, padded rows,
/// exp2). Every step is a complete, correct attention; the last is the kernel stages 05 and 06 run.
///
/// **Why:** attention is two matrix products joined by a softmax; on a GPU the products are
/// fast only when their operands come from shared memory and registers, not from device memory.
/// Online softmax is what lets the block keep only one K/V tile at a time, whatever N is.
///
/// **Does not handle yet:** skipping the key tiles a causal mask hides (stage 06 does; here a
/// causal problem is correct but costs as much as a non-causal one), overlapping the loads of
/// the next tile with the math of this one (stage 07), tensor cores and half precision (stage 07).
///
/// **Measured:** on an NVIDIA H100 80GB HBM3 (SXM) at 1980 MHz, 2026-11-22, non-causal,
/// B * N = 16384 tokens, H * d = 2048, N = 512 to 16384: 35.8 to 38.1 TFLOP/s at d = 64
/// (1.07 to 1.13 times PyTorch SDPA's efficient backend in float32), 31.9 to 35.0 TFLOP/s at
/// d = 128 (0.73 to 0.77 times). Causal problems take as long as non-causal ones here, so
/// against SDPA's causal runs the ratio falls to 0.36 to 0.65 (below the course's 0.5 at d = 128;
/// stage 06 fixes it). The lesson page (stages/05_shared_memory_kernel/README.md) has the table,
/// the Nsight Compute profile, and every step of the road timed and profiled on the same GPU
/// (bench/session.py run road05 ncu05road): at d = 64, N = 4096, 2026-11-23, from 5.8 TFLOP/s
/// (one thread per row) to 37.6 (the final kernel), the padding step alone worth 1.9 times.
#pragma once

#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "fa/problem.hpp"
#include "fa/road.hpp"
#include "fa/tensor.hpp"

namespace fa::stage05 {

/// One step of the road from the first kernel a newcomer writes to the final one.
using Step = RoadStep;

/// The steps, in order; the last is the kernel attention_device() runs by default (and the
/// one stage 06 builds on).
const std::vector<Step>& road();

/// Index of the final kernel in road().
int final_step();

/// Throws fa::InputError unless the kernel supports `problem`: head_dim 32, 64 or 128, sizes
/// whose indices fit the kernel's 32-bit row counters, and `step` -1 (the final kernel) or a
/// step of road().
void check_supported(const Problem& problem, int step = -1);

/// Device entry point: queues the kernel on `stream`. All views point to device memory; q, k,
/// v, o must have a feature stride of 1 and 16-byte aligned rows (dense tensors in either layout do).
///
/// \param problem shapes, scale and causality
/// \param q (B, H, Nq, d) on the device
/// \param k (B, H, Nk, d) on the device
/// \param v (B, H, Nk, d) on the device
/// \param o (B, H, Nq, d) on the device, written
/// \param lse (B, H, Nq) on the device, written: natural-log logsumexp of the scaled scores
/// \param stream where the kernel runs
/// \param step which step of road() runs (-1: the final kernel)
void attention_device(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v,
                      View4<float> o, View3<float> lse, cudaStream_t stream, int step = -1);

/// Host entry point with the signature every stage shares: copies q, k, v to the device,
/// runs the final kernel and copies o and lse back.
void attention(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v,
               View4<float> o, View3<float> lse);

/// attention() with step `step` of road() (-1: the final kernel).
void attention_step(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v,
                    View4<float> o, View3<float> lse, int step);

/// Block shape and shared memory of step `step` (-1: the final kernel), in one line for the report.
std::string describe_config(int step = -1);

}  // namespace fa::stage05
