/// \file metrics.hpp
/// \brief Error metrics between a result and a reference, and the tolerances they are judged by.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fa/inputs.hpp"

namespace fa {

/// How far `out` is from `ref`. Elements where both are the same infinity (an LSE of -inf for a
/// row that sees no key) count as exact; any other non-finite value in `out` is counted in
/// `nonfinite` and excluded from the other figures.
struct Metrics {
    double max_abs = 0;     ///< max |out - ref|
    double mean_abs = 0;    ///< mean |out - ref|
    double max_rel = 0;     ///< max |out - ref| / (|ref| + 1e-6)
    double cosine = 1;      ///< cosine similarity of out and ref as flat vectors
    double rel_l2 = 0;      ///< ||out - ref||_2 / ||ref||_2
    int64_t nonfinite = 0;  ///< NaN or unexpected inf in out
    int64_t count = 0;      ///< elements compared
    int64_t worst_index = -1;  ///< flat logical index of the largest |out - ref|
};

/// Computes every metric of `out` against `ref` (both in the same logical order).
Metrics compare(const std::vector<float>& out, const std::vector<double>& ref);
/// The same, with a float32 reference (for stage-against-stage comparisons).
Metrics compare(const std::vector<float>& out, const std::vector<float>& ref);

/// Limits a comparison must stay within. Both conditions must hold.
struct Tolerance {
    double max_abs;  ///< largest allowed |out - ref|
    double rel_l2;   ///< largest allowed relative L2 error
};

/// Tolerance for the output O of float32 stages, compared with float64 or with another float32
/// stage, for inputs of `kind`.
///
/// Normal inputs give scores of order 1: float32 rounding leaves O within about 1e-6 of the
/// exact result, and the limits (max_abs 1e-4, rel_l2 1e-5) still catch one wrong block, a
/// missed rescale or a dropped key. Large inputs give scores of order 400 whose float32 rounding
/// is of order 1e-4 in absolute terms; softmax turns that into relative weight errors of the
/// same size, so the limits widen to max_abs 5e-3, rel_l2 5e-4.
Tolerance output_tolerance(InputKind kind);

/// Tolerance for the LSE of float32 stages for inputs of `kind` (normal: 2e-5 absolute;
/// large, where the LSE itself is in the hundreds: 1e-2 absolute; rel_l2 2e-6 and 1e-5).
Tolerance lse_tolerance(InputKind kind);

/// True when `m` has no unexpected non-finite value and meets `tol`.
bool passes(const Metrics& m, const Tolerance& tol);

}  // namespace fa
