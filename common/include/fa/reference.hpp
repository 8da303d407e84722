/// \file reference.hpp
/// \brief The float64 golden reference every float32 stage is checked against.
#pragma once

#include <vector>

#include "fa/precision.hpp"
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

/// Output of naive_attention_emulated(), in logical order.
struct EmulatedAttention {
    std::vector<float> o;    ///< (B, H, Nq, d), each value representable in the emulated precision
    std::vector<float> lse;  ///< (B, H, Nq), float32; -inf for rows that see no key
};

/// Attention computed naively in `precision`, the way a straightforward implementation in that
/// precision computes it: q, k and v rounded to the precision; \f$S = Q K^\top\f$ accumulated in
/// float32, then scaled; the softmax in float32; P rounded to the precision; \f$O = P V\f$
/// accumulated in float32 and rounded to the precision; the LSE in float32. Its error against the
/// float64 reference is what a bf16/fp16 stage is allowed twice of (low_precision_tolerance()).
/// Costs as much as the reference, O(B H Nq Nk d), so the driver runs it only when the reference
/// runs; the products are Eigen float32 matrix products, a block of 128 query rows at a time.
EmulatedAttention naive_attention_emulated(Precision precision, const Problem& problem, View4<const float> q,
                                           View4<const float> k, View4<const float> v);

/// Floating-point operations the reference would do; executables skip it above a budget.
double reference_flops(const Problem& problem);

}  // namespace fa
