/// \file python/csrc/ops.cpp
/// \brief torch.ops.flashcourse.*: the course's kernels registered with PyTorch through its stable
/// ABI, so that one build serves the PyTorch releases after the one it was built against.
///
/// Only PyTorch's stable C++ headers are used (torch/csrc/stable/, torch/headeronly/): tensors are
/// torch::stable::Tensor handles, their outputs are allocated by torch::stable::new_empty on the
/// caller's device, and the kernels run on the caller's current CUDA stream. Everything the
/// kernels ask of a call is checked in checks.cpp (fa::InputError naming the argument, turned
/// into a RuntimeError here, prefixed with the operator's name); launch.cpp runs the stage that
/// forward_route() and backward_route() pick. The schemas' fake kernels and autograd live on the
/// Python side (python/flashcourse/ops.py).
///
/// The four operators:
///   fwd(q, k, v, ...) -> (out, lse)             q (B, Hq, Nq, d), k and v (B, Hk, Nk, d), any strides
///                                               with contiguous features; out like q, lse (B, Hq, Nq) float32
///   bwd(dout, q, k, v, out, lse, ...) -> (dq, dk, dv)
///   varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...) -> (out, lse)
///                                               q (total_q, Hq, d), k and v (total_k, Hk, d); lse (Hq, total_q)
///   varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, ...) -> (dq, dk, dv)
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include "checks.hpp"
#include "fa/cuda/check.hpp"
#include "fa/error.hpp"
#include "launch.hpp"

namespace {

using fa::pytorch::CallOptions;
using fa::pytorch::Element;
using fa::pytorch::TensorArg;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

/// What the checks read of a tensor: name, element type, device, sizes and strides.
TensorArg arg(const char* name, const Tensor& t) {
    STD_TORCH_CHECK(t.defined(), name, " is an undefined tensor");
    TensorArg a;
    a.name = name;
    a.data = t.data_ptr();
    switch (t.scalar_type()) {
        case ScalarType::BFloat16: a.element = Element::BF16; break;
        case ScalarType::Half: a.element = Element::FP16; break;
        case ScalarType::Float: a.element = Element::FP32; break;
        case ScalarType::Int: a.element = Element::INT32; break;
        default: a.element = Element::Other; break;
    }
    a.cuda = t.is_cuda();
    a.device = a.cuda ? int(t.get_device_index()) : -1;
    for (int64_t i = 0; i < t.dim(); ++i) {
        a.sizes.push_back(t.size(i));
        a.strides.push_back(t.stride(i));
    }
    return a;
}

/// The current CUDA stream of `device`: the one PyTorch queues this call's other work on.
cudaStream_t current_stream(int device) {
    void* stream = nullptr;
    TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
    return static_cast<cudaStream_t>(stream);
}

Tensor empty(const Tensor& like, std::vector<int64_t> sizes, ScalarType dtype) {
    return torch::stable::new_empty(like, torch::headeronly::IntHeaderOnlyArrayRef(sizes.data(), sizes.size()), dtype);
}

/// A new (B, H, N, d) tensor of like's type, dense in like's order of the H and N axes: (B, N, H, d)
/// in memory when like's token axis is the outer one (flash-attn's layout), (B, H, N, d) otherwise.
/// python/flashcourse/ops.py's fake kernels make the same choice.
Tensor empty_in_layout_of(const Tensor& like) {
    const int64_t b = like.size(0), h = like.size(1), n = like.size(2), d = like.size(3);
    if (like.stride(2) > like.stride(1)) {
        return torch::stable::transpose(empty(like, {b, n, h, d}, like.scalar_type()), 1, 2);
    }
    return empty(like, {b, h, n, d}, like.scalar_type());
}

/// Runs `body`, turning the checks' InputError into a RuntimeError that names the operator.
template <class Body>
auto named(const char* op, Body&& body) {
    try {
        return body();
    } catch (const fa::InputError& e) {
        throw std::runtime_error(std::string("flashcourse.") + op + ": " + e.what());
    }
}

CallOptions call_options(bool causal, double scale, int64_t window_left, int64_t window_right, double softcap,
                         double dropout_p, int64_t seed, int64_t offset) {
    return CallOptions{causal, scale, window_left, window_right, softcap, dropout_p, seed, offset};
}

/// cu_seqlens' values on the host, where the stages build their schedules from them (this waits
/// for the stream: the values may be written by the kernels queued before).
std::vector<int32_t> to_host(const TensorArg& cu, cudaStream_t stream) {
    std::vector<int32_t> host(size_t(cu.sizes[0]));
    FA_CUDA_CHECK(cudaMemcpyAsync(host.data(), cu.data, host.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    FA_CUDA_CHECK(cudaStreamSynchronize(stream));
    return host;
}

std::tuple<Tensor, Tensor> fwd(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                               int64_t window_left, int64_t window_right, double softcap, double dropout_p, int64_t seed,
                               int64_t offset) {
    return named("fwd", [&] {
        const TensorArg qa = arg("q", q), ka = arg("k", k), va = arg("v", v);
        const CallOptions options = call_options(causal, scale, window_left, window_right, softcap, dropout_p, seed, offset);
        const fa::pytorch::DenseCall call = fa::pytorch::check_dense(qa, ka, va, options, false);
        const torch::stable::accelerator::DeviceGuard guard(call.device);
        Tensor out = empty_in_layout_of(q);
        Tensor lse = empty(q, {q.size(0), q.size(1), q.size(2)}, ScalarType::Float);
        const fa::pytorch::Route route = fa::pytorch::forward_route(call, fa::pytorch::is_hopper(call.device));
        fa::pytorch::forward(call, route, qa, ka, va, arg("out", out), arg("lse", lse), current_stream(call.device));
        return std::make_tuple(out, lse);
    });
}

std::tuple<Tensor, Tensor, Tensor> bwd(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& out, const Tensor& lse, bool causal, double scale,
                                       int64_t window_left, int64_t window_right, double softcap, double dropout_p,
                                       int64_t seed, int64_t offset, bool deterministic) {
    return named("bwd", [&] {
        const TensorArg qa = arg("q", q), ka = arg("k", k), va = arg("v", v), oa = arg("out", out),
                        la = arg("lse", lse), da = arg("dout", dout);
        const CallOptions options = call_options(causal, scale, window_left, window_right, softcap, dropout_p, seed, offset);
        const fa::pytorch::DenseCall call = fa::pytorch::check_dense(qa, ka, va, options, true);
        fa::pytorch::check_like(oa, qa.sizes, qa.element, call.device, true);
        fa::pytorch::check_like(da, qa.sizes, qa.element, call.device, true);
        fa::pytorch::check_like(la, {qa.sizes[0], qa.sizes[1], qa.sizes[2]}, Element::FP32, call.device, false);
        const torch::stable::accelerator::DeviceGuard guard(call.device);
        Tensor dq = empty_in_layout_of(q), dk = empty_in_layout_of(k), dv = empty_in_layout_of(v);
        const fa::pytorch::Route route =
            fa::pytorch::backward_route(call, fa::pytorch::is_hopper(call.device), deterministic);
        fa::pytorch::backward(call, route, da, qa, ka, va, oa, la, arg("dq", dq), arg("dk", dk), arg("dv", dv),
                              deterministic, current_stream(call.device));
        return std::make_tuple(dq, dk, dv);
    });
}

std::tuple<Tensor, Tensor> varlen_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
                                      const Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, bool causal,
                                      double scale, int64_t window_left, int64_t window_right, double softcap,
                                      double dropout_p, int64_t seed, int64_t offset) {
    return named("varlen_fwd", [&] {
        const TensorArg qa = arg("q", q), ka = arg("k", k), va = arg("v", v), cq = arg("cu_seqlens_q", cu_seqlens_q),
                        ck = arg("cu_seqlens_k", cu_seqlens_k);
        fa::pytorch::check_cu_seqlens(cq, qa.device);
        fa::pytorch::check_cu_seqlens(ck, qa.device);
        const torch::stable::accelerator::DeviceGuard guard(qa.device);
        const cudaStream_t stream = current_stream(qa.device);
        const CallOptions options = call_options(causal, scale, window_left, window_right, softcap, dropout_p, seed, offset);
        const fa::pytorch::VarlenCall call = fa::pytorch::check_varlen(
            qa, ka, va, cq, ck, to_host(cq, stream), to_host(ck, stream), max_seqlen_q, max_seqlen_k, options, false);
        Tensor out = empty(q, {q.size(0), q.size(1), q.size(2)}, q.scalar_type());
        Tensor lse = empty(q, {q.size(1), q.size(0)}, ScalarType::Float);
        Tensor schedule = empty(q, {fa::pytorch::varlen_forward_schedule_ints(call)}, ScalarType::Int);
        fa::pytorch::varlen_forward(call, qa, ka, va, arg("out", out), arg("lse", lse), cq, ck,
                                    static_cast<int32_t*>(schedule.data_ptr()), stream);
        return std::make_tuple(out, lse);
    });
}

std::tuple<Tensor, Tensor, Tensor> varlen_bwd(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& out, const Tensor& lse, const Tensor& cu_seqlens_q,
                                              const Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                              bool causal, double scale, int64_t window_left, int64_t window_right,
                                              double softcap, double dropout_p, int64_t seed, int64_t offset,
                                              bool deterministic) {
    return named("varlen_bwd", [&] {
        const TensorArg qa = arg("q", q), ka = arg("k", k), va = arg("v", v), oa = arg("out", out),
                        la = arg("lse", lse), da = arg("dout", dout), cq = arg("cu_seqlens_q", cu_seqlens_q),
                        ck = arg("cu_seqlens_k", cu_seqlens_k);
        fa::pytorch::check_cu_seqlens(cq, qa.device);
        fa::pytorch::check_cu_seqlens(ck, qa.device);
        const torch::stable::accelerator::DeviceGuard guard(qa.device);
        const cudaStream_t stream = current_stream(qa.device);
        const CallOptions options = call_options(causal, scale, window_left, window_right, softcap, dropout_p, seed, offset);
        const fa::pytorch::VarlenCall call = fa::pytorch::check_varlen(
            qa, ka, va, cq, ck, to_host(cq, stream), to_host(ck, stream), max_seqlen_q, max_seqlen_k, options, true);
        fa::pytorch::check_like(oa, qa.sizes, qa.element, call.device, true);
        fa::pytorch::check_like(da, qa.sizes, qa.element, call.device, true);
        fa::pytorch::check_like(la, {qa.sizes[1], qa.sizes[0]}, Element::FP32, call.device, false);
        Tensor dq = empty(q, {q.size(0), q.size(1), q.size(2)}, q.scalar_type());
        Tensor dk = empty(k, {k.size(0), k.size(1), k.size(2)}, k.scalar_type());
        Tensor dv = empty(v, {v.size(0), v.size(1), v.size(2)}, v.scalar_type());
        Tensor schedule = empty(q, {fa::pytorch::varlen_backward_schedule_ints(call)}, ScalarType::Int);
        fa::pytorch::varlen_backward(call, da, qa, ka, va, oa, la, arg("dq", dq), arg("dk", dk), arg("dv", dv), cq, ck,
                                     static_cast<int32_t*>(schedule.data_ptr()), deterministic, stream);
        return std::make_tuple(dq, dk, dv);
    });
}

}  // namespace

// The schemas: `float` is a C++ double, `int` an int64_t. scale <= 0 means 1/sqrt(d); a window
// bound of -1 means none; softcap 0 and dropout_p 0 switch those off. The Python side
// (python/flashcourse/ops.py) gives each its fake kernel and its autograd formula.
STABLE_TORCH_LIBRARY(flashcourse, m) {
    m.def("fwd(Tensor q, Tensor k, Tensor v, bool causal, float scale, int window_left, int window_right, "
          "float softcap, float dropout_p, int seed, int offset) -> (Tensor out, Tensor lse)");
    m.def("bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal, float scale, "
          "int window_left, int window_right, float softcap, float dropout_p, int seed, int offset, "
          "bool deterministic) -> (Tensor dq, Tensor dk, Tensor dv)");
    m.def("varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
          "int max_seqlen_k, bool causal, float scale, int window_left, int window_right, float softcap, "
          "float dropout_p, int seed, int offset) -> (Tensor out, Tensor lse)");
    m.def("varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, "
          "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, bool causal, float scale, int window_left, "
          "int window_right, float softcap, float dropout_p, int seed, int offset, bool deterministic) "
          "-> (Tensor dq, Tensor dk, Tensor dv)");
}

STABLE_TORCH_LIBRARY_IMPL(flashcourse, CUDA, m) {
    m.impl("fwd", TORCH_BOX(&fwd));
    m.impl("bwd", TORCH_BOX(&bwd));
    m.impl("varlen_fwd", TORCH_BOX(&varlen_fwd));
    m.impl("varlen_bwd", TORCH_BOX(&varlen_bwd));
}
