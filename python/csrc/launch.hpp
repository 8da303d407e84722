/// \file python/csrc/launch.hpp
/// \brief The PyTorch operator's device half: a checked call (checks.hpp) queued on the caller's
/// stream through the stage its route names.
///
/// Nothing here allocates the call's outputs (PyTorch does, ops.cpp) or waits for the stream. The
/// backward's workspace (stage 09's and stage 12's float32 dQ accumulators) is kept per device and
/// stream, grown when a larger call needs more and never shrunk, so that a training loop allocates
/// it once; calls on one stream are ordered, which is what sharing it asks.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "checks.hpp"

namespace fa::pytorch {

/// Whether `device` runs stage 11's and stage 12's sm_90a code (a Hopper GPU, compute capability
/// 9.0); asked once per device.
bool is_hopper(int device);

/// The forward of a dense call by `route` (forward_route()): o (B, Hq, Nq, d) like q, lse (B, Hq, Nq) float32.
void forward(const DenseCall& call, Route route, const TensorArg& q, const TensorArg& k, const TensorArg& v,
             const TensorArg& o, const TensorArg& lse, cudaStream_t stream);

/// The backward of a dense call by `route` (backward_route()): dq, dk, dv like q, k, v.
void backward(const DenseCall& call, Route route, const TensorArg& dout, const TensorArg& q, const TensorArg& k,
              const TensorArg& v, const TensorArg& o, const TensorArg& lse, const TensorArg& dq, const TensorArg& dk,
              const TensorArg& dv, bool deterministic, cudaStream_t stream);

/// Ints of device memory the packed forward's and backward's schedules need (at least 1).
int64_t varlen_forward_schedule_ints(const VarlenCall& call);
int64_t varlen_backward_schedule_ints(const VarlenCall& call);

/// Stage 07's packed forward: o (total_q, Hq, d) like q, lse (Hq, total_q) float32; cu_seqlens on
/// the device, `schedule` varlen_forward_schedule_ints() ints of device memory.
void varlen_forward(const VarlenCall& call, const TensorArg& q, const TensorArg& k, const TensorArg& v,
                    const TensorArg& o, const TensorArg& lse, const TensorArg& cu_seqlens_q,
                    const TensorArg& cu_seqlens_k, int32_t* schedule, cudaStream_t stream);

/// Stage 09's packed backward, the same way.
void varlen_backward(const VarlenCall& call, const TensorArg& dout, const TensorArg& q, const TensorArg& k,
                     const TensorArg& v, const TensorArg& o, const TensorArg& lse, const TensorArg& dq,
                     const TensorArg& dk, const TensorArg& dv, const TensorArg& cu_seqlens_q,
                     const TensorArg& cu_seqlens_k, int32_t* schedule, bool deterministic, cudaStream_t stream);

}  // namespace fa::pytorch
