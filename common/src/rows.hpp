// Rows of one head copied into Eigen matrices: what the float64 reference and the naive
// emulations (reference.cpp, reference_backward.cpp) read their inputs through. Private to
// fa_common.
#pragma once

#include <cmath>
#include <cstdint>

#include <Eigen/Dense>

#include "fa/precision.hpp"
#include "fa/tensor.hpp"

namespace fa::detail {

using MatrixXdR = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixXfR = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Copies rows [row0, row0 + rows) of head (b, h) into a double matrix [rows, d].
inline MatrixXdR load_rows(View4<const float> t, int64_t b, int64_t h, int64_t row0, int64_t rows) {
    MatrixXdR m(rows, t.shape[3]);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t x = 0; x < t.shape[3]; ++x) m(r, x) = t(b, h, row0 + r, x);
    return m;
}

// Copies rows [row0, row0 + rows) of head (b, h) into a float matrix [rows, d], rounded to `precision`.
inline MatrixXfR load_rounded(View4<const float> t, int64_t b, int64_t h, int64_t row0, int64_t rows, Precision precision) {
    MatrixXfR m(rows, t.shape[3]);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t x = 0; x < t.shape[3]; ++x) m(r, x) = round_to(precision, t(b, h, row0 + r, x));
    return m;
}

// `m` with every element rounded to `precision` (in place), except a finite value beyond the
// precision's range: it stays in float32 (where a kernel's float32 accumulator holds it) and is
// counted in `overflowed`, so one overflow does not turn the whole baseline into inf and NaN.
inline void round_all(Precision precision, MatrixXfR& m, int64_t& overflowed) {
    if (precision == Precision::Float32) return;  // round_to is the identity: skip the pass
    for (int64_t r = 0; r < m.rows(); ++r)
        for (int64_t c = 0; c < m.cols(); ++c) {
            const float rounded = round_to(precision, m(r, c));
            if (std::isfinite(rounded) || !std::isfinite(m(r, c))) {
                m(r, c) = rounded;
            } else {
                ++overflowed;
            }
        }
}

}  // namespace fa::detail
