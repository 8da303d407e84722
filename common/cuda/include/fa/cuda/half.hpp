/// \file fa/cuda/half.hpp
/// \brief 16-bit floating point on the device: the two types, device copies of a problem in
/// either, and conversions to and from float32 through strided views.
///
/// bf16 (bfloat16) keeps float32's 8 exponent bits and 7 mantissa bits: the same range as
/// float32 (no overflow where float32 has none) with about 3 significant digits. fp16 (IEEE half)
/// has 5 exponent bits and 10 mantissa bits: a digit more precision, but values above 65504
/// overflow to infinity. Both feed the tensor cores at the same rate; the choice is range against
/// precision.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fa/cuda/buffer.hpp"
#include "fa/error.hpp"
#include "fa/problem.hpp"
#include "fa/tensor.hpp"

namespace fa::cuda {

/// The 16-bit types of the tensor-core stages.
enum class DType {
    BF16,  ///< bfloat16: `__nv_bfloat16`
    FP16,  ///< IEEE half: `__half`
};

/// "bf16" or "fp16".
std::string to_string(DType dtype);

/// Converts `src` into `dst` element by element (round to nearest even), any strides, same shape.
void convert(View4<const float> src, View4<__nv_bfloat16> dst, cudaStream_t stream = nullptr);
/// \copydoc convert(View4<const float>, View4<__nv_bfloat16>, cudaStream_t)
void convert(View4<const float> src, View4<__half> dst, cudaStream_t stream = nullptr);
/// Widens `src` into `dst` (exact), any strides, same shape.
void convert(View4<const __nv_bfloat16> src, View4<float> dst, cudaStream_t stream = nullptr);
/// \copydoc convert(View4<const __nv_bfloat16>, View4<float>, cudaStream_t)
void convert(View4<const __half> src, View4<float> dst, cudaStream_t stream = nullptr);

/// Throws fa::InputError unless the 16-bit view `name` can be copied 16 bytes (8 elements) at a
/// time, as the tensor-core kernels do: contiguous features, other strides that are multiples of
/// 8 elements, a 16-byte aligned start (dense tensors in either layout qualify). `stage` names
/// the caller in the message, e.g. "stage 07".
template <class T>
void require_16_byte_rows(const std::string& stage, const char* name, const View4<T>& view) {
    const auto& s = view.stride;
    if (s[3] != 1 || s[0] % 8 || s[1] % 8 || s[2] % 8 || reinterpret_cast<uintptr_t>(view.data) % 16) {
        throw InputError(stage + ": " + name +
                         " must have contiguous features (stride 1), other strides that are multiples of 8 elements "
                         "and a 16-byte aligned start, for the kernels' 16-byte copies");
    }
}

/// Device memory holding q, k, v and o of one problem in the 16-bit type `T`, dense in one layout.
template <class T>
class HalfTensors {
public:
    /// Allocates the four tensors dense in `layout`; `o` is filled with NaN (all bits set), so an
    /// element a kernel forgets to write stays NaN.
    HalfTensors(const Problem& problem, Layout layout);
    /// Rounds float32 device views `q`, `k`, `v` (any strides) into this object's tensors.
    void load(View4<const float> q_f32, View4<const float> k_f32, View4<const float> v_f32, cudaStream_t stream = nullptr);

    View4<const T> q;  ///< (B, H, Nq, d) on the device
    View4<const T> k;  ///< (B, H, Nk, d) on the device
    View4<const T> v;  ///< (B, H, Nk, d) on the device
    View4<T> o;        ///< (B, H, Nq, d) on the device

private:
    DeviceBuffer<T> q_, k_, v_, o_;
};

extern template class HalfTensors<__nv_bfloat16>;
extern template class HalfTensors<__half>;

}  // namespace fa::cuda
