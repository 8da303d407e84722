/// \file stages/11_hopper_kernel/attention.cuh
/// \brief Stage 11: stage 07's attention on Hopper's own machinery: wgmma (warpgroup matrix
/// multiply from shared memory), the TMA (whole tiles copied by one thread, swizzled on the way,
/// reported on mbarriers), and warp specialization (a producer warpgroup loading, consumer
/// warpgroups computing, registers moved to them with setmaxnreg).
///
/// **Adds:** `wgmma.mma_async` for both products (S = Q K^T with both operands read from
/// shared memory through descriptors; O += P V with P from registers and V read transposed),
/// the 128-byte swizzle that TMA and wgmma share, `cp.async.bulk.tensor` loads completing on
/// mbarriers, a producer warpgroup and `setmaxnreg`. Everything stage 07 handles is still
/// handled: bf16 and fp16, exp2 with the folded scale, causal with masked diagonal tiles and
/// skipped tiles beyond, any Nq and Nk (the TMA fills rows past the end with zeros), rows that
/// see no key, both layouts (the tensor map's strides), negative scales, LSE out.
///
/// **Why:** `mma.sync` stops at the mma.sync ceiling (bench/mma_ceiling,
/// docs/results/mma_ceiling.jsonl); `wgmma` is the instruction that reaches the rest of the tensor
/// cores' rate (the wgmma ceiling, with both operands in shared memory or A in registers:
/// bench/wgmma_ceiling, docs/results/wgmma_ceiling.jsonl), and frees the registers
/// and issue slots that mma.sync's operands cost. SDPA's cuDNN backend uses it, and is 1.3-1.8x
/// faster than stage 07 forward.
///
/// **Then:** ping-pong (the consumer warpgroups take turns on the tensor cores, named barriers),
/// the softmax of one tile under the previous tile's P V inside a warpgroup, the heaviest causal
/// tiles first in groups of heads sized to L2, the epilogue through shared memory and a TMA store, a shape
/// for d = 64 (three consumer warpgroups), and a persistent grid (one block per SM taking work
/// items from a counter, the next item's loads under this one's end) whose epilogue stores O 16
/// bytes a lane, for short causal heads at d = 64 small blocks of one consumer, three per SM, the
/// next work item claimed and decoded by the producer before the consumers ask for it, O stored by the
/// TMA from a buffer of its own (at d = 128 in room made by giving K and V rings of their own),
/// warpgroups whose rows all lie past Nq taking their turns without computing, and O rescaled only
/// when a row's maximum grows past 2^8. An instrumented build of steps 3, 4, 5, 8, 9, 10 and 12
/// records one block's timeline (timeline.hpp, `--timeline`).
///
/// **Does not handle yet:** d other than 64 and 128; the backward pass.
///
/// **Measured:** every step, and the final kernel beside stage 07 and SDPA's flash and cuDNN
/// backends in one run (bench/session.py run road11: docs/results/road11.csv, stage11_sweep.csv;
/// the lesson and the results page show them). On an H100 80GB HBM3 (2026-11-27) the default, step
/// 17, is at or above SDPA's cuDNN backend at 30 of the 32 points of bf16/fp16, d 64/128,
/// N 1024-16384, causal and not, in every round of three runs; d = 64 causal at N = 1024 in 13
/// rounds of 14 (0.997-1.026), and d = 128 without the mask at N = 1024 level with it (0.988-1.067,
/// below 1.0 in 6 rounds of 14) (docs/results/stage11_sweep_table.txt, stage11_lazy_rescale.txt).
#pragma once

#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fa/cuda/half.hpp"
#include "fa/cuda/timeline.hpp"
#include "fa/problem.hpp"
#include "fa/road.hpp"
#include "fa/stage.hpp"
#include "fa/tensor.hpp"

namespace fa::stage11 {

using cuda::DType;

/// One step of the road. Step 0 is stage 07's final kernel (mma.sync), the point of departure.
using Step = RoadStep;

/// The steps, in order.
const std::vector<Step>& road();

/// The step attention_device() runs by default: the one expected fastest (the road table in
/// docs/results/ says whether it is).
int final_step();

/// Head dimensions every step supports (64 and 128).
const std::vector<int>& supported_head_dims();

/// Throws fa::InputError unless step `step` supports `problem` (head dimension, sizes that fit
/// the kernel's 32-bit indices, the step number).
void check_supported(const Problem& problem, int step);

/// "" when this machine can run stage 11 (a Hopper GPU, sm_90a); otherwise one line saying why not.
std::string gpu_unavailable_reason();

/// Device entry point, bf16: queues the kernel on `stream`. All views point to device memory;
/// q, k, v, o need a feature stride of 1, other strides that are multiples of 8 elements and
/// 16-byte aligned starts (dense tensors in either layout have them; so does the TMA).
///
/// \param problem shapes, scale and causality
/// \param q (B, H, Nq, d) on the device
/// \param k (B, H, Nk, d) on the device
/// \param v (B, H, Nk, d) on the device
/// \param o (B, H, Nq, d) on the device, written
/// \param lse (B, H, Nq) float32 on the device, written: natural-log logsumexp of the scaled scores
/// \param stream where the kernel runs
/// \param step which step of road() runs (default: the final kernel)
void attention_device(const Problem& problem, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k,
                      View4<const __nv_bfloat16> v, View4<__nv_bfloat16> o, View3<float> lse, cudaStream_t stream,
                      int step = -1);

/// Device entry point, fp16 (see the bf16 overload).
void attention_device(const Problem& problem, View4<const __half> q, View4<const __half> k, View4<const __half> v,
                      View4<__half> o, View3<float> lse, cudaStream_t stream, int step = -1);

/// A host entry point with the float32 signature every stage shares: q, k, v are copied to the
/// device and rounded to `dtype` there, step `step` runs, o is widened back to float32.
AttentionFn host_entry(DType dtype, int step = -1);

/// host_entry(DType::BF16) with the final kernel.
void attention(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v,
               View4<float> o, View3<float> lse);

/// Whether step `step` (default: the final kernel) runs `problem` with its small blocks: step 11
/// and after, d = 64, causal, at most 1024 keys (otherwise step 10's kernel).
bool runs_small_blocks(const Problem& problem, int step = -1);

/// Steps with an instrumented build (bf16), whose kernels can record a timeline (timeline.hpp).
const std::vector<int>& timeline_steps();

/// timeline_steps() as text for messages: "3, 4, 5, 8, 9, 10, 12".
std::string timeline_steps_text();

/// The block an instrumented run records, and what it computes.
struct TimelineBlock {
    int blocks = 0;      ///< thread blocks in the grid
    int block = 0;       ///< the recording block
    int q_tiles = 0;     ///< query tiles per (batch, head)
    int q_tile = 0;      ///< the block's query tile (-1 for the persistent grid: its blocks take work at run time)
    int batch = 0;       ///< its batch index (-1: persistent grid)
    int head = 0;        ///< its head (-1: persistent grid)
    int full = 0;        ///< key tiles [0, full) unmasked (-1: persistent grid)
    int end = 0;         ///< key tiles [full, end) masked; the rest skipped (-1: persistent grid)
    int br = 0;          ///< query rows per block
    int bc = 0;          ///< keys per tile
    int consumers = 0;   ///< consumer warpgroups (warpgroup 0 is the producer)
    bool ping_pong = false;  ///< the consumers take turns
    bool overlap = false;    ///< the softmax runs under the previous P V
    bool persistent = false; ///< the block loops over several work items (step 9)
    int stages = 0;          ///< slots of the K/V ring
};

/// The block that records step `step`'s timeline for `problem`: `block`, or with -1 the first
/// block of the second wave (block number = the GPU's SM count; block 0 of a persistent grid). Throws fa::InputError for a step
/// without an instrumented build or a block the grid does not have.
TimelineBlock timeline_block(const Problem& problem, int step, int block = -1);

/// The instrumented build of step `step`, bf16: computes what attention_device() computes, and
/// block `block` (as timeline_block() resolves it) writes its marks to `marks` (device memory,
/// (1 + consumers) x kTimelineMarks records, warpgroup w's from w x kTimelineMarks; zero them
/// first: a record whose cycle is 0 is no mark).
void attention_device_timeline(const Problem& problem, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k,
                               View4<const __nv_bfloat16> v, View4<__nv_bfloat16> o, View3<float> lse, cudaStream_t stream,
                               int step, cuda::TimelineMark* marks, int block = -1);

/// Block shape, warpgroups, ring depth, loads, shared memory and tile counts, in one line.
std::string describe_config(const Problem& problem, int step = -1);

}  // namespace fa::stage11
