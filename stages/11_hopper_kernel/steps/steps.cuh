/// \file stages/11_hopper_kernel/steps/steps.cuh
/// \brief The early steps of stage 11's road, each a kernel of its own in one file that reads top
/// to bottom: step 1 (step1_wgmma.cu), 2 (step2_tma_ring.cu), 3 (step3_warp_roles.cu), 4
/// (step4_ping_pong.cu) and 9 (step9_persistent.cu). Each gives the switch kernel's step
/// (stage11::attention_device(..., step)) the same O and LSE, bit for bit (test_stage11_steps).
///
/// Each entry takes device views of 16-bit Q, K, V and O (either layout: contiguous features,
/// other strides multiples of 8 elements, 16-byte aligned) and float32 LSE; d = 64 or 128, any
/// Nq and Nk, causal or not, any finite scale. It throws fa::InputError for what it cannot do.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fa/problem.hpp"
#include "fa/tensor.hpp"

/// Step 1: one consumer warpgroup, S = Q K^T and O += P V by wgmma, tiles copied by cp.async.
namespace fa::stage11::step1 {
/// O and LSE of `p` in bf16 from device views on `stream`; fa::InputError for what the step cannot run.
void attention_device(const Problem& p, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k,
                      View4<const __nv_bfloat16> v, View4<__nv_bfloat16> o, View3<float> lse, cudaStream_t stream);
/// The same in fp16.
void attention_device(const Problem& p, View4<const __half> q, View4<const __half> k, View4<const __half> v,
                      View4<__half> o, View3<float> lse, cudaStream_t stream);
}  // namespace fa::stage11::step1

/// Step 2: the tiles loaded by the TMA into a ring of slots, each on its mbarrier.
namespace fa::stage11::step2 {
/// O and LSE of `p` in bf16 from device views on `stream`; fa::InputError for what the step cannot run.
void attention_device(const Problem& p, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k,
                      View4<const __nv_bfloat16> v, View4<__nv_bfloat16> o, View3<float> lse, cudaStream_t stream);
/// The same in fp16.
void attention_device(const Problem& p, View4<const __half> q, View4<const __half> k, View4<const __half> v,
                      View4<__half> o, View3<float> lse, cudaStream_t stream);
}  // namespace fa::stage11::step2

/// Step 3: a producer warpgroup loads, two consumer warpgroups compute (setmaxnreg).
namespace fa::stage11::step3 {
/// O and LSE of `p` in bf16 from device views on `stream`; fa::InputError for what the step cannot run.
void attention_device(const Problem& p, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k,
                      View4<const __nv_bfloat16> v, View4<__nv_bfloat16> o, View3<float> lse, cudaStream_t stream);
/// The same in fp16.
void attention_device(const Problem& p, View4<const __half> q, View4<const __half> k, View4<const __half> v,
                      View4<__half> o, View3<float> lse, cudaStream_t stream);
}  // namespace fa::stage11::step3

/// Step 4: the consumer warpgroups take turns on the tensor cores (ping-pong).
namespace fa::stage11::step4 {
/// O and LSE of `p` in bf16 from device views on `stream`; fa::InputError for what the step cannot run.
void attention_device(const Problem& p, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k,
                      View4<const __nv_bfloat16> v, View4<__nv_bfloat16> o, View3<float> lse, cudaStream_t stream);
/// The same in fp16.
void attention_device(const Problem& p, View4<const __half> q, View4<const __half> k, View4<const __half> v,
                      View4<__half> o, View3<float> lse, cudaStream_t stream);
}  // namespace fa::stage11::step4

/// Step 9: a persistent grid, one block per SM looping over the work items.
namespace fa::stage11::step9 {
/// O and LSE of `p` in bf16 from device views on `stream`; fa::InputError for what the step cannot run.
void attention_device(const Problem& p, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k,
                      View4<const __nv_bfloat16> v, View4<__nv_bfloat16> o, View3<float> lse, cudaStream_t stream);
/// The same in fp16.
void attention_device(const Problem& p, View4<const __half> q, View4<const __half> k, View4<const __half> v,
                      View4<__half> o, View3<float> lse, cudaStream_t stream);
}  // namespace fa::stage11::step9
