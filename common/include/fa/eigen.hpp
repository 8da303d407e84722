/// \file eigen.hpp
/// \brief One attention head of a strided view as an Eigen matrix, for the CPU stages.
#pragma once

#include <cstdint>

#include <Eigen/Dense>

#include "fa/tensor.hpp"

namespace fa {

/// A dense row-major float matrix: the rows of a head are its tokens, so row-major keeps each
/// token's d features contiguous, as they are in both layouts.
using MatrixRM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// A read-only [N, d] row-major matrix whose rows lie an outer stride apart.
using HeadMap = Eigen::Map<const MatrixRM, 0, Eigen::OuterStride<>>;

/// Copies head (b, h) of `t` into a dense [N, d] matrix (the simple way: one gather per head).
inline MatrixRM load_head(View4<const float> t, int64_t b, int64_t h) {
    MatrixRM m(t.shape[2], t.shape[3]);
    for (int64_t n = 0; n < t.shape[2]; ++n)
        for (int64_t x = 0; x < t.shape[3]; ++x) m(n, x) = t(b, h, n, x);
    return m;
}

//! [head_matrix]
/// Head (b, h) of `t` as an [N, d] row-major matrix, without a copy when possible.
///
/// In both layouts the d features of a row are contiguous (stride[3] == 1); the layouts differ
/// only in how far apart rows are (d for bhnd, H * d for bnhd), which is exactly an outer
/// stride, so the head is used in place. A view with any other feature stride is gathered once
/// into `scratch`, which must outlive the returned map.
inline HeadMap head_matrix(View4<const float> t, int64_t b, int64_t h, MatrixRM& scratch) {
    const int64_t N = t.shape[2], d = t.shape[3];
    if (t.stride[3] == 1) return HeadMap(t.row(b, h, 0), N, d, Eigen::OuterStride<>(t.stride[2]));
    scratch = load_head(t, b, h);
    return HeadMap(scratch.data(), N, d, Eigen::OuterStride<>(d));
}
//! [head_matrix]

}  // namespace fa
