/// \file tensor.hpp
/// \brief Strided tensor views: a pointer, a shape and strides in elements.
///
/// Every stage reads and writes tensors through views whose *logical* index order is always
/// `(b, h, n, x)`. The strides decide where each element lives, so one kernel reads PyTorch's
/// `(B, H, N, d)` layout and flash-attn's `(B, N, H, d)` layout without a copy: transposing
/// the H and N axes only swaps two strides.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "fa/config.hpp"
#include "fa/problem.hpp"

namespace fa {

/// Physical order of the four axes in memory.
enum class Layout {
    BHND,  ///< (batch, heads, seq, dim): PyTorch's SDPA layout
    BNHD,  ///< (batch, seq, heads, dim): flash-attn's layout, what a QKV projection produces
};

/// "bhnd" or "bnhd".
std::string to_string(Layout layout);

/// A non-owning rank-4 view indexed logically as `(b, h, n, x)`.
template <class T>
struct View4 {
    T* data = nullptr;                          ///< element (0,0,0,0)
    std::array<int64_t, 4> shape{};             ///< logical sizes (B, H, N, d)
    std::array<int64_t, 4> stride{};            ///< element strides of the logical axes

    /// Offset in elements of `(b, h, n, x)`.
    FA_HD int64_t offset(int64_t b, int64_t h, int64_t n, int64_t x) const {
        return b * stride[0] + h * stride[1] + n * stride[2] + x * stride[3];
    }
    /// Element `(b, h, n, x)`.
    FA_HD T& operator()(int64_t b, int64_t h, int64_t n, int64_t x) const {
        return data[offset(b, h, n, x)];
    }
    /// Pointer to row `n` of head `(b, h)`: its `d` features are contiguous when stride[3] == 1.
    FA_HD T* row(int64_t b, int64_t h, int64_t n) const { return data + offset(b, h, n, 0); }
    /// Total number of elements.
    FA_HD int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
    /// The same view with const elements (only for views of non-const elements: a view of const
    /// elements would convert to its own type, which compilers warn about).
    template <class U = T, std::enable_if_t<!std::is_const_v<U>, int> = 0>
    operator View4<const U>() const { return {data, shape, stride}; }
};

/// A non-owning rank-3 view indexed as `(b, h, n)`, used for the LSE.
template <class T>
struct View3 {
    T* data = nullptr;                          ///< element (0,0,0)
    std::array<int64_t, 3> shape{};             ///< logical sizes (B, H, N)
    std::array<int64_t, 3> stride{};            ///< element strides

    /// Element `(b, h, n)`.
    FA_HD T& operator()(int64_t b, int64_t h, int64_t n) const {
        return data[b * stride[0] + h * stride[1] + n * stride[2]];
    }
    /// Total number of elements.
    FA_HD int64_t numel() const { return shape[0] * shape[1] * shape[2]; }
    /// The same view with const elements (only for views of non-const elements).
    template <class U = T, std::enable_if_t<!std::is_const_v<U>, int> = 0>
    operator View3<const U>() const { return {data, shape, stride}; }
};

/// Strides, in elements, of a dense `(B, H, N, d)` tensor stored in `layout`, listed in
/// logical order `(b, h, n, x)`.
std::array<int64_t, 4> dense_strides(int64_t B, int64_t H, int64_t N, int64_t d, Layout layout);

/// A view of a dense buffer of `B*H*N*d` elements stored in `layout`.
template <class T>
View4<T> make_view(T* data, int64_t B, int64_t H, int64_t N, int64_t d, Layout layout) {
    return {data, {B, H, N, d}, dense_strides(B, H, N, d, layout)};
}

/// A view of a dense `(B, H, N)` buffer.
template <class T>
View3<T> make_view3(T* data, int64_t B, int64_t H, int64_t N) {
    return {data, {B, H, N}, {H * N, N, 1}};
}

/// A float32 host tensor that owns its storage, with a chosen layout.
struct HostTensor {
    std::vector<float> storage;                 ///< the elements in physical order
    View4<float> view;                          ///< logical (B, H, N, d) view of storage

    HostTensor() = default;
    /// Allocates `B*H*N*d` elements laid out as `layout`, filled with `fill`.
    HostTensor(int64_t B, int64_t H, int64_t N, int64_t d, Layout layout, float fill = 0.0f);
    HostTensor(const HostTensor& other);             ///< deep copy; the view follows the new storage
    HostTensor& operator=(const HostTensor& other);  ///< deep copy; the view follows the new storage
    HostTensor(HostTensor&&) noexcept = default;     ///< move: the storage and its view move together
    HostTensor& operator=(HostTensor&&) noexcept = default;  ///< move assignment
    /// The same tensor, read-only.
    View4<const float> cview() const { return view; }
    /// Copies the elements in logical (b, h, n, x) order, whatever the layout.
    std::vector<float> logical() const;
};

/// Copies any rank-4 view into a vector in logical (b, h, n, x) order.
std::vector<float> to_logical(View4<const float> view);
/// Copies any rank-3 view into a vector in logical (b, h, n) order.
std::vector<float> to_logical(View3<const float> view);

}  // namespace fa
