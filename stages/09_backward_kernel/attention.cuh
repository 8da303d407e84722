/// \file stages/09_backward_kernel/attention.cuh
/// \brief Stage 09: the FlashAttention-2 backward pass on tensor cores, in bf16 or fp16 with
/// float32 accumulation: stage 08's loops as three CUDA kernels.
///
/// **Adds:** the gradients on the GPU. A preprocessing kernel computes \f$D_i = \sum_x dO_{ix}
/// O_{ix}\f$ and zeroes a float32 dQ accumulator; the main kernel gives each thread block one key
/// block \f$K_j, V_j\f$ (64 keys, 16 per warp) and streams the query blocks \f$Q_i, dO_i\f$ past it
/// through a double-buffered `cp.async` pipeline; per query block each warp recomputes
/// \f$P_{ij}^\top\f$ from its keys and the saved LSE (exp2 trick), and runs four of the five
/// products on the tensor cores straight from registers: \f$S^\top = K_w Q_i^\top\f$,
/// \f$dP^\top = V_w dO_i^\top\f$, \f$dV_w \mathrel{+}= P^\top dO_i\f$, \f$dK_w \mathrel{+}= dS^\top
/// Q_i\f$ (P and dS reach the last two in the accumulator layout, which is the A-operand layout:
/// stage 07's identity). The fifth, \f$dQ_i \mathrel{+}= dS\, K_j\f$, needs dS across all the
/// block's keys: it goes through shared memory once, then into the float32 accumulator by
/// atomic additions, or, with `deterministic`, in a fixed order (the last key block that visits
/// the query block first, then down to key block 0) enforced by a counter per query block. A postprocessing kernel rounds \f$\text{scale} \cdot
/// dQ\f$ to 16 bits. Causal blocks above the diagonal are skipped, only the blocks crossing it
/// (and the last, partial key block) are masked; any Nq and Nk; both layouts through strides.
///
/// **Why:** stage 08 shows the algorithm on one CPU core. The backward does 2.5 times the
/// forward's work in five products, so it belongs on the same tensor cores as stage 07's
/// forward; what is new is the reduction across thread blocks that dQ needs.
///
/// **Stage 10's switches** (ModelOptions, on the default main kernel): grouped-query heads (a
/// block per key block of a K/V head visits the query heads of its group, dK and dV summed in
/// registers; with atomic dQ the group may be split over S blocks whose float32 partials a fourth
/// kernel adds in a fixed order: launch.cuh's group_split(), FA_STAGE09_GROUP_SPLIT), sliding
/// windows (a range of query blocks per key block, masked at both edges; the
/// deterministic turns count from each query block's last visitor), the soft cap (dS times
/// 1 - tanh^2), packed batches of different lengths (attention_backward_varlen_device(): a
/// block per key block of one sequence, from a schedule), and dropout (stage 07's mask
/// regenerated from Philox, never stored: the dropped P~ feeds dV, the undropped P dS). Checked
/// on the CPU by the warp emulator and on the H100 (test_stage09, 2026-11-25); timed beside SDPA
/// by `bench/session.py run stage10` (docs/results/stage10.txt).
///
/// **Does not handle yet:** head dimensions other than 32, 64 and 128; Hopper's own instructions
/// (TMA, wgmma); dQ written without a float32 accumulator in global memory.
///
/// **Measured:** on an NVIDIA H100 80GB HBM3, 2026-11-26, B * N = 16384 tokens, H * d = 2048,
/// bf16 and fp16, N 4096 and 16384, causal and not, three rounds each ours then SDPA
/// (docs/results/stage09_steps910_quick.txt), the default main kernel (step 9) against SDPA flash:
/// the backward 1.06 to 1.18 at d = 64 and 1.03 to 1.17 at d = 128, with stage 07's forward against
/// flash's pair 1.05 to 1.15; 1.09 to 1.12 times step 4's backward, the default before it. On N 512
/// to 8192 (an NVIDIA H200, the same day, docs/results/stage09_grid_step9_ratios_over_rounds.txt)
/// the backward 1.05 to 1.38 and the pair 1.04 to 1.33; against cuDNN's pair 0.59 to 0.82. The
/// deterministic mode costs 1.24 to 1.43 times the atomic one. The lesson page
/// (stages/09_backward_kernel/README.md) has the tables, the profiles and the road.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../07_pipelined_fused_kernel/model_options.hpp"
#include "fa/cuda/buffer.hpp"
#include "fa/cuda/half.hpp"
#include "fa/problem.hpp"
#include "fa/road.hpp"
#include "fa/stage.hpp"
#include "fa/tensor.hpp"
#include "fa/varlen.hpp"

namespace fa::stage09 {

using cuda::DType;

/// How the host entry point runs the backward.
struct Options {
    DType dtype = DType::BF16;   ///< 16-bit type of q, k, v, o, dO and the gradients (`--dtype`)
    /// Add the dQ contributions of the key blocks in a fixed order (the last key block first), so that
    /// dq is bit-identical from run to run (`--deterministic`); otherwise float32 atomic additions
    bool deterministic = false;
    /// The main kernel (`--step`, see road()); -1: kDefaultStep
    int step = -1;
};

/// Stage 09's main kernels, in the order the lesson builds them (`--step`): warps owning keys,
/// warp-tiled, warp-tiled with 128-key blocks at every head dimension, with dP^T in pieces, with
/// dV and dK fed from the registers of P^T and dS^T, and that in 16-column steps.
const std::vector<RoadStep>& road();

/// The main kernel that runs when none is named: the fastest measured, step 9 (step 4's kernel, the
/// warp-tiled one with 128-key blocks and dV and dK fed from registers at d = 32 and 64, with its
/// float32 dQ accumulator stored in 8 x 8 tiles). On the H100 (2026-11-26, bf16 and fp16, N 4096
/// and 16384, causal and not, three rounds) its backward was 1.09-1.12 times step 4's and 1.03-1.18
/// times SDPA flash's (docs/results/stage09_steps910_quick.txt). The lesson's road tables have the figures.
inline constexpr int kDefaultStep = 9;

/// Device memory the backward needs besides its inputs and outputs. A caller that runs the
/// backward often (a benchmark, a training loop) keeps one and passes it to every call, so that
/// no call allocates; it grows when a larger problem needs more and never shrinks. The calls
/// that share one must be ordered (queued on one stream): each call's kernels own it until they end.
struct Workspace {
    /// Per (batch, head), with Nq rounded up to a whole number of query blocks: L_i log2(e),
    /// then D_i, then the float32 dQ accumulator [Nq rounded, d]
    cuda::DeviceBuffer<float> floats;
    /// Deterministic mode: per (batch, head, query block), how many key blocks have added their dQ_i
    cuda::DeviceBuffer<int> turns;
};

/// Head dimensions the kernel supports (32, 64, 128).
const std::vector<int>& supported_head_dims();

/// Throws fa::InputError unless the kernel supports `problem`: the head dimension (the message
/// names `--head-dim` and lists the supported ones), sizes that fit its 32-bit indices, and
/// `step` (-1 or a step of road()).
void check_supported(const Problem& problem, int step = -1);

/// Bytes of the workspace (see Workspace) the backward of `problem` needs.
double workspace_bytes(const Problem& problem, bool deterministic, int step = -1);

/// Device entry point, bf16: queues the three kernels on `stream`. Every view points to device
/// memory; q, k, v, o, dout, dq, dk, dv need a feature stride of 1, other strides that are
/// multiples of 8 elements and 16-byte aligned starts (dense tensors in either layout have them).
///
/// \param problem shapes, scale and causality
/// \param q (B, H, Nq, d)
/// \param k (B, H, Nk, d)
/// \param v (B, H, Nk, d)
/// \param o (B, H, Nq, d) the forward's output
/// \param lse (B, H, Nq) float32, the forward's natural-log LSE (-inf for rows that see no key)
/// \param dout (B, H, Nq, d) the upstream gradient dO
/// \param dq (B, H, Nq, d) written: dL/dQ (0 for rows that see no key)
/// \param dk (B, H, Nk, d) written: dL/dK
/// \param dv (B, H, Nk, d) written: dL/dV
/// \param deterministic add dQ's contributions in a fixed order (bit-identical dq from run to run)
/// \param stream where the kernels run
/// \param workspace kept by the caller (grown if needed); nullptr: allocated for this call and
///        freed after the stream has finished with it (this call then waits for the stream)
/// \param step the main kernel, a step of road() (-1: kDefaultStep)
void attention_backward_device(const Problem& problem, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k,
                               View4<const __nv_bfloat16> v, View4<const __nv_bfloat16> o, View3<const float> lse,
                               View4<const __nv_bfloat16> dout, View4<__nv_bfloat16> dq, View4<__nv_bfloat16> dk,
                               View4<__nv_bfloat16> dv, bool deterministic, cudaStream_t stream,
                               Workspace* workspace = nullptr, int step = -1);

/// Device entry point, fp16 (see the bf16 overload).
void attention_backward_device(const Problem& problem, View4<const __half> q, View4<const __half> k,
                               View4<const __half> v, View4<const __half> o, View3<const float> lse,
                               View4<const __half> dout, View4<__half> dq, View4<__half> dk, View4<__half> dv,
                               bool deterministic, cudaStream_t stream, Workspace* workspace = nullptr,
                               int step = -1);

/// What a real model's call adds (stage 10): grouped-query heads, a sliding window and the soft
/// cap, as stage 07's forward takes them (Hk = kv_heads dividing Hq = problem.heads; the window
/// bottom-right aligned, causal as (-1, 0); the cap c tanh(s / c) on the scaled scores).
using stage07::ModelOptions;

/// Device entry point with stage 10's options, bf16: the gradients of stage 07's forward run with
/// the same options. q, o, dout, dq are (B, Hq, Nq, d) with Hq = problem.heads, k, v, dk, dv are
/// (B, Hk, Nk, d) with Hk = options.kv_heads, lse is (B, Hq, Nq) (that forward's). dK and dV of a
/// K/V head are sums over the query heads of its group, added in registers (no atomics: the same
/// bits on every run; with atomic dQ the group split S of launch.cuh's group_split() adds S float32
/// partials in a fixed order, FA_STAGE09_GROUP_SPLIT=n overriding its rule, InputError for an n
/// that does not divide Hq / Hk); dQ as the plain call (atomic or deterministic). Throws fa::InputError when
/// Hk does not divide Hq (naming both), for a window bound below -1, a negative soft cap, a
/// dropout p outside [0, 255.5/256) (Dropout::validate(); the forward's seed and offset give the
/// same mask), options on a step other than kDefaultStep, or views of the wrong shapes. Plain options run exactly the kernels of the overload without them.
void attention_backward_device(const Problem& problem, const ModelOptions& options, View4<const __nv_bfloat16> q,
                               View4<const __nv_bfloat16> k, View4<const __nv_bfloat16> v, View4<const __nv_bfloat16> o,
                               View3<const float> lse, View4<const __nv_bfloat16> dout, View4<__nv_bfloat16> dq,
                               View4<__nv_bfloat16> dk, View4<__nv_bfloat16> dv, bool deterministic, cudaStream_t stream,
                               Workspace* workspace = nullptr, int step = -1);

/// Device entry point with stage 10's options, fp16 (see the bf16 overload).
void attention_backward_device(const Problem& problem, const ModelOptions& options, View4<const __half> q,
                               View4<const __half> k, View4<const __half> v, View4<const __half> o, View3<const float> lse,
                               View4<const __half> dout, View4<__half> dq, View4<__half> dk, View4<__half> dv,
                               bool deterministic, cudaStream_t stream, Workspace* workspace = nullptr, int step = -1);

/// The longest sequences of a packed call (flash_attn_varlen_func's max_seqlen_q, max_seqlen_k).
using stage07::MaxSeqlens;

/// The device arrays of a packed call: cu_seqlens as flash_attn_varlen_func takes them, and room for
/// the schedule of the main kernel the call writes (varlen_backward_schedule_ints() ints).
struct VarlenBackwardArrays {
    const int32_t* cu_seqlens_q = nullptr;  ///< (B+1) on the device, equal to problem.cu_seqlens_q
    const int32_t* cu_seqlens_k = nullptr;  ///< (B+1) on the device, equal to problem.cu_seqlens_k
    int32_t* schedule = nullptr;            ///< varlen_backward_schedule_ints(problem) ints on the device, written
};

/// Ints of device memory the schedule of a packed call needs (2 per key block of every sequence).
int64_t varlen_backward_schedule_ints(const VarlenProblem& problem);

/// Device entry point for a packed batch of sequences of different lengths, bf16: the backward of
/// stage07::attention_varlen_device() with the same problem. q, o, dout, dq are packed (total_q,
/// Hq, d) buffers and k, v, dk, dv (total_k, Hk, d), passed as make_packed_view() views (1, H,
/// total, d); lse is (Hq, total_q), the View3 (1, Hq, total_q), that forward's. Each sequence's
/// queries see its keys only, the window and causality aligned bottom-right in each sequence,
/// with grouped heads, the soft cap and the dropout of the problem (the forward's mask: b the
/// sequence's index, rows and columns counted from its start). Throws fa::InputError naming what
/// is wrong (resolve_varlen(): cu_seqlens, the longest lengths, Hk not dividing Hq, a dropout p
/// out of range; the head dimension; the views' shapes). Queues a copy of the schedule and the three
/// kernels on `stream`; `workspace` as in the dense call.
void attention_backward_varlen_device(const VarlenProblem& problem, const MaxSeqlens& max,
                                      View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k,
                                      View4<const __nv_bfloat16> v, View4<const __nv_bfloat16> o, View3<const float> lse,
                                      View4<const __nv_bfloat16> dout, View4<__nv_bfloat16> dq, View4<__nv_bfloat16> dk,
                                      View4<__nv_bfloat16> dv, const VarlenBackwardArrays& arrays, bool deterministic,
                                      cudaStream_t stream, Workspace* workspace = nullptr);

/// Device entry point for a packed batch, fp16 (see the bf16 overload).
void attention_backward_varlen_device(const VarlenProblem& problem, const MaxSeqlens& max, View4<const __half> q,
                                      View4<const __half> k, View4<const __half> v, View4<const __half> o,
                                      View3<const float> lse, View4<const __half> dout, View4<__half> dq,
                                      View4<__half> dk, View4<__half> dv, const VarlenBackwardArrays& arrays,
                                      bool deterministic, cudaStream_t stream, Workspace* workspace = nullptr);

/// A host entry point with the float32 signature of every backward stage (fa::BackwardFn): the
/// inputs are copied to the device and rounded to `options.dtype` there, the backward runs, the
/// gradients are widened back to float32 into the host views (any strides).
BackwardFn host_entry(const Options& options);

/// host_entry() with stage 10's options `model`: k, v, dk and dv (float32 host views) have Hk
/// heads, the others Hq (see the device entry point with ModelOptions); the same copies, roundings
/// and checks.
BackwardFn host_entry(const Options& options, const ModelOptions& model);

/// host_entry() with the default Options (bf16, atomic dQ additions).
void attention_backward(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v,
                        View4<const float> o, View3<const float> lse, View4<const float> dout, View4<float> dq,
                        View4<float> dk, View4<float> dv);

/// Block shape, warps, shared memory, the dQ mode and the block counts for `problem`, in one line.
std::string describe_config(const Problem& problem, const Options& options);

/// Device memory beyond the float32 inputs and outputs the host entry point allocates: the
/// 16-bit copies of q, k, v, o, dO, dq, dk, dv and the workspace.
double intermediate_bytes(const Problem& problem, const Options& options);

}  // namespace fa::stage09
