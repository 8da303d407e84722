/// \file counts.hpp
/// \brief The two numbers of attention: operations and bytes.
#pragma once

#include <cstdint>
#include <string>

#include "fa/problem.hpp"

namespace fa {

/// Floating-point operations of the forward pass by the usual convention:
/// two matrix products of `2 * Nq * Nk * d` each per head, so `4 * B * H * Nq * Nk * d`,
/// halved for causal attention when Nq == Nk. The softmax's exponentials are not counted.
double attention_flops(const Problem& problem);

/// The backward pass alone: 2.5 times the forward count (five matrix products of
/// `2 * Nq * Nk * d` per head to the forward's two; recomputing S is one of the five).
double attention_flops_backward(const Problem& problem);

/// Forward plus backward: 3.5 times the forward count (two products forward, five backward).
double attention_flops_fwd_bwd(const Problem& problem);

/// Fewest bytes any implementation must move through main memory in float32: q, k and v read
/// once, o and lse written once.
double attention_min_bytes(const Problem& problem, int bytes_per_element = 4);

/// Bytes of the materialized score matrix S (or P) of all heads: `B * H * Nq * Nk * 4`.
double score_matrix_bytes(const Problem& problem);

/// "1.23 GiB", "512 B", ... with binary prefixes.
std::string format_bytes(double bytes);

/// "1.23 GFLOP", "4.5 TFLOP", ... with decimal prefixes.
std::string format_flops(double flops);

}  // namespace fa
