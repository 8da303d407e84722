#include "launch.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../../stages/07_pipelined_fused_kernel/attention.cuh"
#include "../../stages/09_backward_kernel/attention.cuh"
#include "../../stages/11_hopper_kernel/attention.cuh"
#include "../../stages/12_hopper_backward/attention.cuh"
#include "fa/cuda/check.hpp"

namespace fa::pytorch {

namespace {

/// The LSE (B, H, N) of a dense call, or the packed (Hq, total_q) as the View3 (1, Hq, total_q).
template <class T>
View3<T> view3(const TensorArg& t) {
    T* data = static_cast<T*>(const_cast<void*>(t.data));
    if (t.sizes.size() == 2) return {data, {1, t.sizes[0], t.sizes[1]}, {t.sizes[0] * t.sizes[1], t.sizes[1], 1}};
    return {data, {t.sizes[0], t.sizes[1], t.sizes[2]}, {t.sizes[1] * t.sizes[2], t.sizes[2], 1}};
}

/// The backward's workspaces of one (device, stream), and the lock its calls hold.
struct Workspaces {
    std::mutex lock;
    stage09::Workspace stage09;
    stage12::Workspace stage12;
};

Workspaces& workspaces(int device, cudaStream_t stream) {
    static std::mutex lock;
    static std::map<std::pair<int, cudaStream_t>, std::unique_ptr<Workspaces>> all;
    const std::lock_guard<std::mutex> guard(lock);
    std::unique_ptr<Workspaces>& w = all[{device, stream}];
    if (!w) w = std::make_unique<Workspaces>();
    return *w;
}

template <class T>
void forward_as(const DenseCall& c, Route route, const TensorArg& q, const TensorArg& k, const TensorArg& v,
                const TensorArg& o, const TensorArg& lse, cudaStream_t stream) {
    const View4<const T> qv = view4<const T>(q), kv = view4<const T>(k), vv = view4<const T>(v);
    if (route == Route::Stage11) {
        stage11::attention_device(c.problem, qv, kv, vv, view4<T>(o), view3<float>(lse), stream);
    } else {
        stage07::attention_device(c.problem, c.options, qv, kv, vv, view4<T>(o), view3<float>(lse), stream);
    }
}

template <class T>
void backward_as(const DenseCall& c, Route route, const TensorArg& dout, const TensorArg& q, const TensorArg& k,
                 const TensorArg& v, const TensorArg& o, const TensorArg& lse, const TensorArg& dq, const TensorArg& dk,
                 const TensorArg& dv, bool deterministic, cudaStream_t stream) {
    Workspaces& ws = workspaces(c.device, stream);
    const std::lock_guard<std::mutex> guard(ws.lock);
    const View3<float> l = view3<float>(lse);
    const View3<const float> lc{l.data, l.shape, l.stride};
    if (route == Route::Stage12) {
        stage12::attention_backward_device(c.problem, view4<const T>(q), view4<const T>(k), view4<const T>(v),
                                           view4<const T>(o), lc, view4<const T>(dout), view4<T>(dq), view4<T>(dk),
                                           view4<T>(dv), stream, &ws.stage12);
    } else {
        stage09::attention_backward_device(c.problem, c.options, view4<const T>(q), view4<const T>(k), view4<const T>(v),
                                           view4<const T>(o), lc, view4<const T>(dout), view4<T>(dq), view4<T>(dk),
                                           view4<T>(dv), deterministic, stream, &ws.stage09);
    }
}

template <class T>
void varlen_forward_as(const VarlenCall& c, const TensorArg& q, const TensorArg& k, const TensorArg& v,
                       const TensorArg& o, const TensorArg& lse, const TensorArg& cu_q, const TensorArg& cu_k,
                       int32_t* schedule, cudaStream_t stream) {
    const stage07::VarlenDeviceArrays arrays{static_cast<const int32_t*>(cu_q.data), static_cast<const int32_t*>(cu_k.data),
                                             schedule};
    stage07::attention_varlen_device(c.problem, c.max, packed_view<const T>(q), packed_view<const T>(k),
                                     packed_view<const T>(v), packed_view<T>(o), view3<float>(lse), arrays, stream);
}

template <class T>
void varlen_backward_as(const VarlenCall& c, const TensorArg& dout, const TensorArg& q, const TensorArg& k,
                        const TensorArg& v, const TensorArg& o, const TensorArg& lse, const TensorArg& dq,
                        const TensorArg& dk, const TensorArg& dv, const TensorArg& cu_q, const TensorArg& cu_k,
                        int32_t* schedule, bool deterministic, cudaStream_t stream) {
    Workspaces& ws = workspaces(c.device, stream);
    const std::lock_guard<std::mutex> guard(ws.lock);
    const View3<float> l = view3<float>(lse);
    const stage09::VarlenBackwardArrays arrays{static_cast<const int32_t*>(cu_q.data),
                                               static_cast<const int32_t*>(cu_k.data), schedule};
    stage09::attention_backward_varlen_device(c.problem, c.max, packed_view<const T>(q), packed_view<const T>(k),
                                              packed_view<const T>(v), packed_view<const T>(o),
                                              View3<const float>{l.data, l.shape, l.stride}, packed_view<const T>(dout),
                                              packed_view<T>(dq), packed_view<T>(dk), packed_view<T>(dv), arrays,
                                              deterministic, stream, &ws.stage09);
}

}  // namespace

bool is_hopper(int device) {
    static std::mutex lock;
    static std::map<int, bool> known;
    const std::lock_guard<std::mutex> guard(lock);
    const auto found = known.find(device);
    if (found != known.end()) return found->second;
    int major = 0, minor = 0;
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return known[device] = major == 9 && minor == 0;
}

void forward(const DenseCall& call, Route route, const TensorArg& q, const TensorArg& k, const TensorArg& v,
             const TensorArg& o, const TensorArg& lse, cudaStream_t stream) {
    if (call.element == Element::BF16) {
        forward_as<__nv_bfloat16>(call, route, q, k, v, o, lse, stream);
    } else {
        forward_as<__half>(call, route, q, k, v, o, lse, stream);
    }
}

void backward(const DenseCall& call, Route route, const TensorArg& dout, const TensorArg& q, const TensorArg& k,
              const TensorArg& v, const TensorArg& o, const TensorArg& lse, const TensorArg& dq, const TensorArg& dk,
              const TensorArg& dv, bool deterministic, cudaStream_t stream) {
    if (call.element == Element::BF16) {
        backward_as<__nv_bfloat16>(call, route, dout, q, k, v, o, lse, dq, dk, dv, deterministic, stream);
    } else {
        backward_as<__half>(call, route, dout, q, k, v, o, lse, dq, dk, dv, deterministic, stream);
    }
}

int64_t varlen_forward_schedule_ints(const VarlenCall& call) {
    return std::max<int64_t>(1, stage07::varlen_schedule_ints(call.problem));
}

int64_t varlen_backward_schedule_ints(const VarlenCall& call) {
    return std::max<int64_t>(1, stage09::varlen_backward_schedule_ints(call.problem));
}

void varlen_forward(const VarlenCall& call, const TensorArg& q, const TensorArg& k, const TensorArg& v,
                    const TensorArg& o, const TensorArg& lse, const TensorArg& cu_seqlens_q,
                    const TensorArg& cu_seqlens_k, int32_t* schedule, cudaStream_t stream) {
    if (call.element == Element::BF16) {
        varlen_forward_as<__nv_bfloat16>(call, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, schedule, stream);
    } else {
        varlen_forward_as<__half>(call, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, schedule, stream);
    }
}

void varlen_backward(const VarlenCall& call, const TensorArg& dout, const TensorArg& q, const TensorArg& k,
                     const TensorArg& v, const TensorArg& o, const TensorArg& lse, const TensorArg& dq,
                     const TensorArg& dk, const TensorArg& dv, const TensorArg& cu_seqlens_q,
                     const TensorArg& cu_seqlens_k, int32_t* schedule, bool deterministic, cudaStream_t stream) {
    if (call.element == Element::BF16) {
        varlen_backward_as<__nv_bfloat16>(call, dout, q, k, v, o, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, schedule,
                                          deterministic, stream);
    } else {
        varlen_backward_as<__half>(call, dout, q, k, v, o, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, schedule,
                                   deterministic, stream);
    }
}

}  // namespace fa::pytorch
