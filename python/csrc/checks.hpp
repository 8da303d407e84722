/// \file python/csrc/checks.hpp
/// \brief The PyTorch operator's host half: what a call's tensors must be, and which stage runs it.
///
/// torch.ops.flashcourse.* (python/csrc/ops.cpp) hands every tensor here as a TensorArg: its
/// argument name, element type, device, sizes and strides, nothing of PyTorch. The checks throw
/// fa::InputError naming the argument and what is allowed, before any kernel is looked at; the
/// routes pick the stage. Both are plain host code, tested without a GPU (tests/test_torch_checks.cpp).
///
/// Layout: a dense call's q, k, v arrive as (B, H, N, d) *logical* views with their strides, so
/// PyTorch's (B, H, N, d) tensors and flash-attn's (B, N, H, d) ones (transposed by the Python
/// side, python/flashcourse/ops.py) reach the kernels without a copy, as every stage reads them.
/// A packed (varlen) call's tensors are (total, H, d).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../../stages/07_pipelined_fused_kernel/model_options.hpp"
#include "fa/problem.hpp"
#include "fa/tensor.hpp"
#include "fa/varlen.hpp"

namespace fa::pytorch {

/// The element types a call may meet; every other one is Other (refused by name).
enum class Element { BF16, FP16, FP32, INT32, Other };

/// "bfloat16", "float16", "float32", "int32" or "another dtype": PyTorch's words.
std::string to_string(Element e);

/// One tensor argument as the operator sees it.
struct TensorArg {
    std::string name;              ///< its name in the operator's schema ("q", "cu_seqlens_k", ...)
    const void* data = nullptr;    ///< device pointer of element 0
    Element element = Element::Other;
    bool cuda = false;             ///< on a CUDA device
    int device = -1;               ///< the CUDA device's index
    std::vector<int64_t> sizes;    ///< as PyTorch gives them
    std::vector<int64_t> strides;  ///< in elements
};

/// The options of a call besides its tensors, as the operator's schema names them.
struct CallOptions {
    bool causal = false;     ///< bottom-right aligned (COURSE.md)
    double scale = 0.0;      ///< softmax scale; 0 or less: 1/sqrt(d)
    int64_t window_left = -1;   ///< keys before the diagonal a query sees; -1: all
    int64_t window_right = -1;  ///< keys after it; -1: all (causal makes it 0)
    double softcap = 0.0;    ///< c in c tanh(s / c); 0: off
    double dropout_p = 0.0;  ///< probability of dropping an entry of P; 0: off
    int64_t seed = 0;        ///< dropout's Philox key
    int64_t offset = 0;      ///< dropout's Philox offset (32 bits)
};

/// A dense call, checked: the problem (heads = Hq) and stage 10's options (Hk, window, cap, dropout).
struct DenseCall {
    Element element = Element::BF16;
    int device = 0;
    Problem problem;
    stage07::ModelOptions options;
};

/// A packed call, checked: the problem with host copies of cu_seqlens, and the longest lengths.
struct VarlenCall {
    Element element = Element::BF16;
    int device = 0;
    VarlenProblem problem;
    stage07::MaxSeqlens max;
};

/// Head dimensions the forward takes (stage 07's: 32, 64, 128, 256) and the backward (stage 09's: 32, 64, 128).
const std::vector<int>& forward_head_dims();
const std::vector<int>& backward_head_dims();

/// q (B, Hq, Nq, d), k and v (B, Hk, Nk, d), logical views: bf16 or fp16 alike, on one CUDA
/// device, d supported, Hk dividing Hq, features contiguous, other strides multiples of 8
/// elements and 16-byte aligned starts; then the options (scale finite, window bounds, cap,
/// dropout). `backward` also asks for the backward's head dimensions. Throws InputError naming
/// the argument.
DenseCall check_dense(const TensorArg& q, const TensorArg& k, const TensorArg& v, const CallOptions& options,
                      bool backward);

/// A tensor shaped, typed and placed like `like` (o like q, dout like q, lse (B, Hq, Nq) float32).
void check_like(const TensorArg& t, const std::vector<int64_t>& sizes, Element element, int device, bool rows_16_bytes);

/// Packed q (total_q, Hq, d), k and v (total_k, Hk, d), cu_seqlens_q and cu_seqlens_k int32 of B + 1
/// entries on the same device (their values in `cu_q`, `cu_k`, copied to the host by the caller),
/// the longest lengths; the same rules as check_dense() and VarlenProblem::validate()'s.
VarlenCall check_varlen(const TensorArg& q, const TensorArg& k, const TensorArg& v, const TensorArg& cu_seqlens_q,
                        const TensorArg& cu_seqlens_k, const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k,
                        int64_t max_seqlen_q, int64_t max_seqlen_k, const CallOptions& options, bool backward);

/// cu_seqlens_q or cu_seqlens_k: int32, one dimension, contiguous, on `device`. Its entries are
/// checked later (check_varlen()), once copied to the host.
void check_cu_seqlens(const TensorArg& t, int device);

/// A (B, H, N, d) logical view of a checked tensor. A size-1 axis gets the stride of the whole
/// tensor: PyTorch leaves any stride there, and the kernels' 16-byte rule and the TMA's maps read
/// every stride.
template <class T>
View4<T> view4(const TensorArg& t) {
    View4<T> v{static_cast<T*>(const_cast<void*>(t.data)), {t.sizes[0], t.sizes[1], t.sizes[2], t.sizes[3]},
               {t.strides[0], t.strides[1], t.strides[2], t.strides[3]}};
    int64_t extent = 1;
    for (int i = 0; i < 4; ++i) extent = std::max(extent, v.stride[i] * v.shape[i]);
    for (int i = 0; i < 3; ++i) {
        if (v.shape[i] == 1) v.stride[i] = extent;
    }
    return v;
}

/// A packed (total, H, d) tensor as the View4 (1, H, total, d) the stages take (make_packed_view()'s
/// axes), with its own strides.
template <class T>
View4<T> packed_view(const TensorArg& t) {
    TensorArg as4 = t;
    as4.sizes = {1, t.sizes[1], t.sizes[0], t.sizes[2]};
    as4.strides = {t.strides[0] * t.sizes[0], t.strides[1], t.strides[0], t.strides[2]};
    return view4<T>(as4);
}

/// Which stage's kernels a call runs.
enum class Route {
    Stage11,         ///< Hopper forward (sm_90a), the plain call
    Stage07,         ///< stage 07's forward, with stage 10's options where the call has them
    Stage12,         ///< Hopper backward (sm_90a), the plain call at d = 64
    Stage09,         ///< stage 09's backward, with stage 10's options where the call has them
    Stage07Varlen,   ///< stage 07's packed forward
    Stage09Varlen,   ///< stage 09's packed backward
};

/// "stage 11", "stage 07", ...: for messages and the tests.
std::string to_string(Route r);

/// The forward of a dense call: stage 11 on a Hopper GPU (`hopper`: compute capability 9.0) for a
/// plain call (no grouped heads, band, cap or dropout) at d = 64 or 128, where it is 1.3-1.8x
/// stage 07; stage 07 for everything else.
Route forward_route(const DenseCall& call, bool hopper);

/// The backward of a dense call: stage 12 on a Hopper GPU for a plain, non-deterministic call at
/// d = 64 (1.10-1.12x stage 09 on an H200, 2026-12-07; at d = 128 it is 0.82-0.85x, so stage 09
/// runs there); stage 09 for everything else (its deterministic order included).
Route backward_route(const DenseCall& call, bool hopper, bool deterministic);

}  // namespace fa::pytorch
