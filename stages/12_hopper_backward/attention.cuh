/// \file stages/12_hopper_backward/attention.cuh
/// \brief Stage 12: stage 09's backward on Hopper's own machinery: the TMA streaming the query
/// tiles past a key block that stays in shared memory, the five products on wgmma, and dQ added
/// into global memory by the TMA's bulk reduction (sm_90a).
///
/// **Adds:** one block per key block K_j, V_j (64 keys, loaded once by the TMA); the query tiles
/// Q_i, dO_i and their rows' L_i and D_i loaded by the TMA into a ring of two slots on mbarriers;
/// \f$S^\top = K Q^\top\f$ and \f$dP^\top = V dO^\top\f$ by wgmma from shared memory, so that
/// \f$P^\top\f$ and \f$dS^\top\f$ come out of the accumulators already in the A-operand layout of
/// \f$dV \mathrel{+}= P^\top dO\f$ and \f$dK \mathrel{+}= dS^\top Q\f$ (wgmma from registers);
/// \f$dS^\top\f$ written to shared memory as it is and read transposed by \f$dQ_i = dS\,K_j\f$;
/// dQ_i's float32 partial sent to global memory by one `cp.reduce.async.bulk .add.f32` per tile
/// (atomic per element, no thread waits on it). A preprocessing kernel makes D and L log2e, a
/// postprocessing one rounds scale * dQ. Everything stage 09 handles without stage 10's switches
/// is handled: bf16 and fp16, any Nq and Nk, causal (bottom-right) with the diagonal tiles masked,
/// rows that see no key (zero gradients), both layouts (the tensor maps' strides), any scale.
///
/// **Why:** stage 09's backward stops at mma.sync's rate; SDPA's cuDNN backward, on wgmma, is
/// 1.5-1.9x faster on the H200 (issue 50's table). The backward does 2.5 times the forward's work
/// in five products, so it gains from wgmma at least as much as stage 11's forward did.
///
/// **Step 2** (warp roles): a producer warpgroup (one elected thread issues every TMA copy,
/// setmaxnreg down to 24) and two consumer warpgroups (setmaxnreg up to 240) of 64 keys each, 128
/// keys a block; full and empty mbarriers per ring slot; each consumer's dQ_i partial added by its
/// own bulk reduction. **Step 3** (the dQ writer): warp 1 of the producer warpgroup issues the
/// bulk reductions, full and empty mbarriers per dQ buffer. **Step 4**: one dQ buffer per block,
/// consumer 1 adding its partial onto consumer 0's, one reduction per tile. `--deterministic`
/// (steps 0, 3 and 4): dQ's additions in a fixed order, the last key block first, a turn counter
/// per query tile passed on only once the reduction has *landed*, not merely read its source.
/// Steps 2 to 4 are checked on the CPU emulator; not yet run on a GPU.
///
/// **Then:** the measured road, and the default step by it.
///
/// **Does not handle yet:** stage 10's switches; d other than 64 and 128.
///
/// **Measured:** step 1 on an H200 (2026-12-07; the lesson's road table, RECORD.md); steps 2 to 4
/// not yet: they have been checked on the CPU by the warp emulator only (tests/test_stage12_emulated.cpp).
#pragma once

#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../09_backward_kernel/attention.cuh"
#include "fa/cuda/buffer.hpp"
#include "fa/cuda/half.hpp"
#include "fa/problem.hpp"
#include "fa/road.hpp"
#include "fa/stage.hpp"
#include "fa/tensor.hpp"

namespace fa::stage12 {

using cuda::DType;

/// How the host entry point runs the backward.
struct Options {
    DType dtype = DType::BF16;  ///< 16-bit type of q, k, v, o, dO and the gradients (`--dtype`)
    int step = -1;              ///< the step of road() (`--step`); -1: final_step()
    /// Add the key blocks' dQ_i partials in a fixed order (the last key block first), so that dq is
    /// bit-identical from run to run (`--deterministic`): step 0 (stage 09's order) and steps from
    /// first_deterministic_step(); otherwise the additions race, each float atomically.
    bool deterministic = false;
};

/// The first Hopper step that keeps the deterministic order (its dQ writer waits for the turns).
int first_deterministic_step();

/// The steps, in order. Step 0 is stage 09's default backward, the point of departure.
const std::vector<RoadStep>& road();

/// The step that runs when none is named.
int final_step();

/// Head dimensions every Hopper step supports (64 and 128).
const std::vector<int>& supported_head_dims();

/// Throws fa::InputError unless step `step` (-1: final_step()) supports `problem`: the head
/// dimension (the message names `--head-dim`), sizes within the kernel's indices, the step, and
/// with `deterministic` a step that keeps the order (0, or first_deterministic_step() and on).
void check_supported(const Problem& problem, int step = -1, bool deterministic = false);

/// "" when this machine can run stage 12 (a Hopper GPU, sm_90a); otherwise one line saying why not.
std::string gpu_unavailable_reason();

/// Device memory the backward needs besides its inputs and outputs: per (batch, head) the rows'
/// L log2e and D, and the float32 dQ accumulator. A caller that runs the backward often keeps one
/// and passes it to every call (it grows when needed, never shrinks); calls that share one must be
/// queued on one stream.
struct Workspace {
    cuda::DeviceBuffer<float> floats;  ///< [2 B H, Nq_padded] statistics, then [B H, Nq_padded, d]
    stage09::Workspace step0;          ///< step 0's (stage 09's kernels keep their own layout)
};

/// Bytes of the workspace the backward of `problem` needs at step `step` (`deterministic`: step
/// 0's own, in stage 09's order).
double workspace_bytes(const Problem& problem, int step = -1, bool deterministic = false);

/// Device entry point, bf16: queues the kernels on `stream`. Every view points to device memory;
/// q, k, v, o, dout, dq, dk, dv need a feature stride of 1, other strides that are multiples of 8
/// elements and 16-byte aligned starts (dense tensors in either layout have them).
///
/// \param problem shapes, scale and causality
/// \param q (B, H, Nq, d)
/// \param k (B, H, Nk, d)
/// \param v (B, H, Nk, d)
/// \param o (B, H, Nq, d) the forward's output (stage 11's, or any FlashAttention forward's)
/// \param lse (B, H, Nq) float32, the forward's natural-log LSE (-inf for rows that see no key)
/// \param dout (B, H, Nq, d) the upstream gradient dO
/// \param dq (B, H, Nq, d) written: dL/dQ (0 for rows that see no key)
/// \param dk (B, H, Nk, d) written: dL/dK
/// \param dv (B, H, Nk, d) written: dL/dV
/// \param stream where the kernels run
/// \param workspace kept by the caller (grown if needed); nullptr: allocated for this call, which
///        then waits for the stream before freeing it
/// \param step the step of road() (-1: final_step())
/// \param deterministic dQ's additions in a fixed order (Options::deterministic)
void attention_backward_device(const Problem& problem, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k,
                               View4<const __nv_bfloat16> v, View4<const __nv_bfloat16> o, View3<const float> lse,
                               View4<const __nv_bfloat16> dout, View4<__nv_bfloat16> dq, View4<__nv_bfloat16> dk,
                               View4<__nv_bfloat16> dv, cudaStream_t stream, Workspace* workspace = nullptr, int step = -1,
                               bool deterministic = false);

/// Device entry point, fp16 (see the bf16 overload).
void attention_backward_device(const Problem& problem, View4<const __half> q, View4<const __half> k, View4<const __half> v,
                               View4<const __half> o, View3<const float> lse, View4<const __half> dout, View4<__half> dq,
                               View4<__half> dk, View4<__half> dv, cudaStream_t stream, Workspace* workspace = nullptr,
                               int step = -1, bool deterministic = false);

/// A host entry point with the float32 signature of every backward stage (fa::BackwardFn): the
/// inputs are copied to the device and rounded to `options.dtype` there, the backward runs, the
/// gradients are widened back to float32 into the host views (any strides).
BackwardFn host_entry(const Options& options);

/// host_entry() with the default Options (bf16, the final step).
void attention_backward(const Problem& problem, View4<const float> q, View4<const float> k, View4<const float> v,
                        View4<const float> o, View3<const float> lse, View4<const float> dout, View4<float> dq,
                        View4<float> dk, View4<float> dv);

/// Block shape, ring, shared memory, the dQ path and the tile counts for `problem`, in one line.
std::string describe_config(const Problem& problem, const Options& options);

/// Device memory beyond the float32 inputs and outputs the host entry point allocates: the
/// 16-bit copies of q, k, v, o, dO, dq, dk, dv and the workspace.
double intermediate_bytes(const Problem& problem, const Options& options);

}  // namespace fa::stage12
