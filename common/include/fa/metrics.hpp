/// \file metrics.hpp
/// \brief Error metrics between a result and a reference, and the limits they are judged by.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

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

/// Limits a comparison must stay within. Both conditions must hold; a rel_l2 of infinity sets
/// no relative limit (the LSE's error is judged in absolute terms only). fa/tolerance.hpp
/// derives them from the inputs.
struct Tolerance {
    double max_abs;                                           ///< largest allowed |out - ref|
    double rel_l2 = std::numeric_limits<double>::infinity();  ///< largest allowed relative L2 error
};

/// True when `m` has no unexpected non-finite value and meets `tol`.
bool passes(const Metrics& m, const Tolerance& tol);

}  // namespace fa
