/// \file reference.hpp
/// \brief The float64 golden reference every float32 stage is checked against.
#pragma once

#include <vector>

#include "fa/problem.hpp"
#include "fa/tensor.hpp"

namespace fa {

/// Output of the golden reference, in logical order.
struct Reference {
    std::vector<double> o;    ///< (B, H, Nq, d)
    std::vector<double> lse;  ///< (B, H, Nq); -inf for rows that see no key
};

/// Attention in float64 with Eigen: safe softmax (subtract the row max), causal mask
/// bottom-right aligned, computed a block of query rows at a time so its memory stays
/// O(rows * Nk) rather than O(Nq * Nk).
Reference reference_attention(const Problem& problem, View4<const float> q, View4<const float> k,
                              View4<const float> v);

/// Floating-point operations the reference would do; executables skip it above a budget.
double reference_flops(const Problem& problem);

}  // namespace fa
