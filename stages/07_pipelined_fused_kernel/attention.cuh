/// \file stages/07_pipelined_fused_kernel/attention.cuh
/// \brief Stage 07: the causal tiled kernel of stage 06 on tensor cores, in bf16 or fp16, with the
/// loads of the next K/V tile overlapped with the math of this one.
///
/// **Adds:** `mma.sync.m16n8k16` (16-bit inputs, float32 accumulators) for both matrix products;
/// fragments loaded with `ldmatrix` (`.trans` for V) from XOR-swizzled shared tiles, free of
/// bank conflicts; a `cp.async` ring of K/V tiles, two deep, so tile j+1 is in flight while tile
/// j is computed; FlashAttention-2's split of the work (each warp owns its query rows: no
/// reduction across warps); P rounded to 16 bits in registers and fed to `P V` as it lies (the
/// accumulator layout is the operand layout); exp2 with log2(e) folded into the scale. Stage 06's
/// causal tile classes, any Nq and Nk, rows that see no key, both layouts: all still handled.
///
/// **Why:** stage 06 runs at about 35 TFLOP/s on float32 FMA units whose peak is 67; the tensor
/// cores of the same GPU do 16-bit products an order of magnitude faster through `mma.sync` (the
/// mma.sync ceiling: bench/mma_ceiling, docs/results/mma_ceiling.jsonl). Feeding them is the
/// whole game: operands must arrive in registers in the tensor cores' own layout, shared memory
/// must serve them without conflicts, and the loads from device memory must hide behind the math.
///
/// **Stage 10's switches:** grouped-query heads, sliding windows, the soft cap and dropout
/// (ModelOptions, the attention_device() overloads that take them), on the final kernel; packed
/// batches of sequences of different lengths (attention_varlen_device(), cu_seqlens), with the
/// same switches.
///
/// **Does not handle yet:** the backward pass (stages 08, 09; with dropout, stage 10); Hopper's
/// own instructions (TMA, wgmma, warp specialization); head dimensions other than 32, 64, 128
/// and 256.
///
/// **Measured:** see the lesson page (stages/07_pipelined_fused_kernel/README.md): the table of
/// the road and the sweep beside PyTorch SDPA's flash and cuDNN backends, on an H100.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fa/cuda/half.hpp"
#include "fa/problem.hpp"
#include "fa/road.hpp"
#include "fa/stage.hpp"
#include "fa/tensor.hpp"
#include "model_options.hpp"

namespace fa::stage07 {

using cuda::DType;

/// One step of the road from the first tensor-core kernel to the final one. Step i switches on
/// everything steps 0..i switch on.
using Step = RoadStep;

/// The steps, in order; the last is the kernel attention_device() runs by default.
const std::vector<Step>& road();

/// Index of the final kernel in road().
int final_step();

/// Head dimensions the final kernel supports (32, 64, 128, 256).
const std::vector<int>& supported_head_dims();

/// Head dimensions every step of the road is built for (64 and 128).
const std::vector<int>& road_head_dims();

/// Throws fa::InputError unless step `step` supports `problem`: the head dimension, sizes that
/// fit the kernel's 32-bit indices, and the step number itself.
void check_supported(const Problem& problem, int step);

/// Device entry point, bf16: queues the kernel on `stream`. All views point to device memory;
/// q, k, v, o need a feature stride of 1, other strides that are multiples of 8 elements and
/// 16-byte aligned starts (dense tensors in either layout have them).
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

/// Device entry point with stage 10's options, bf16: grouped-query heads, a sliding window, a
/// soft cap and dropout (ModelOptions) on the final kernel. q and o are (B, Hq, Nq, d) with Hq =
/// problem.heads, k and v are (B, Hk, Nk, d) with Hk = options.kv_heads, lse is (B, Hq, Nq) (with
/// dropout, that of the undropped scores, as the backward needs it). Throws fa::InputError when
/// Hk does not divide Hq (naming both), for a bound below -1, a negative soft cap, or a dropout p
/// outside [0, 255.5/256) (Dropout::validate()). Plain options (dropout 0 included) run exactly
/// the kernel of the overload without them.
void attention_device(const Problem& problem, const ModelOptions& options, View4<const __nv_bfloat16> q,
                      View4<const __nv_bfloat16> k, View4<const __nv_bfloat16> v, View4<__nv_bfloat16> o, View3<float> lse,
                      cudaStream_t stream);

/// Device entry point with stage 10's options, fp16 (see the bf16 overload).
void attention_device(const Problem& problem, const ModelOptions& options, View4<const __half> q, View4<const __half> k,
                      View4<const __half> v, View4<__half> o, View3<float> lse, cudaStream_t stream);

/// The device arrays of a packed call: cu_seqlens as flash_attn_varlen_func takes them, and room
/// for the tile schedule the call writes (varlen_schedule_ints() ints). The host copies of the
/// same cu_seqlens travel in the VarlenProblem, which the call checks and builds the schedule from.
struct VarlenDeviceArrays {
    const int32_t* cu_seqlens_q = nullptr;  ///< (B+1) on the device, equal to problem.cu_seqlens_q
    const int32_t* cu_seqlens_k = nullptr;  ///< (B+1) on the device, equal to problem.cu_seqlens_k
    int32_t* schedule = nullptr;            ///< varlen_schedule_ints(problem) ints on the device, written
};

/// Ints of device memory the tile schedule of `problem` may need (2 per query tile of 64 rows).
int64_t varlen_schedule_ints(const VarlenProblem& problem);

/// Device entry point for a packed batch of sequences of different lengths, bf16, as
/// flash_attn_varlen_func: q and o are packed (total_q, Hq, d) buffers, k and v (total_k, Hk, d),
/// passed as make_packed_view() views (1, H, total, d); lse is (Hq, total_q), the View3 (1, Hq,
/// total_q). Sequence b's queries see its keys only, causal and windows aligned bottom-right in
/// each sequence (problem.window; causal is (-1, 0)), with grouped heads, the soft cap and the
/// dropout of the problem (dropout's b is the sequence's index, rows and columns count from the
/// sequence's start). Throws fa::InputError naming what is wrong (resolve_varlen(): cu_seqlens, the
/// longest lengths, Hk not dividing Hq, a dropout p outside [0, 255.5/256); then the views' shapes). Queues a copy of the tile
/// schedule and the kernel on `stream`; one block per (query tile of a sequence, head), none for
/// padding.
void attention_varlen_device(const VarlenProblem& problem, const MaxSeqlens& max, View4<const __nv_bfloat16> q,
                             View4<const __nv_bfloat16> k, View4<const __nv_bfloat16> v, View4<__nv_bfloat16> o,
                             View3<float> lse, const VarlenDeviceArrays& arrays, cudaStream_t stream);

/// Device entry point for a packed batch, fp16 (see the bf16 overload).
void attention_varlen_device(const VarlenProblem& problem, const MaxSeqlens& max, View4<const __half> q,
                             View4<const __half> k, View4<const __half> v, View4<__half> o, View3<float> lse,
                             const VarlenDeviceArrays& arrays, cudaStream_t stream);

/// A host entry point with the float32 signature every stage shares: q, k, v are copied to the
/// device and rounded to `dtype` there, step `step` runs, o is widened back to float32.
AttentionFn host_entry(DType dtype, int step = -1);

/// host_entry(DType::BF16) with the final kernel.
void attention(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v,
               View4<float> o, View3<float> lse);

/// Block shape, warps, pipeline depth, shared memory and tile counts for `problem`, in one line.
std::string describe_config(const Problem& problem, int step = -1);

}  // namespace fa::stage07
