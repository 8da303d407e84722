/// \file inputs.hpp
/// \brief Seeded random inputs: never zeros, always reproducible from the printed seed.
#pragma once

#include <cstdint>
#include <string>

#include "fa/problem.hpp"
#include "fa/tensor.hpp"

namespace fa {

/// How input values are drawn.
enum class InputKind {
    Normal,  ///< standard normal entries: scores of order 1
    Large,   ///< normal entries times kLargeInputScale: scores of order hundreds, where exp overflows float32
};

/// Multiplier applied to standard normal entries for InputKind::Large. With entries of standard
/// deviation 20, a scaled score has standard deviation `20 * 20 = 400` at the default scale,
/// far beyond `ln(FLT_MAX) ~ 88.7`, so a softmax that exponentiates raw scores overflows.
inline constexpr float kLargeInputScale = 20.0f;

/// "normal" or "large".
std::string to_string(InputKind kind);

/// The three inputs of one problem.
struct Inputs {
    HostTensor q;  ///< (B, H, Nq, d)
    HostTensor k;  ///< (B, H, Nk, d)
    HostTensor v;  ///< (B, H, Nk, d)
};

/// Throws InputError when `t` holds a NaN or an infinity, so that such inputs are refused before
/// any stage runs rather than ending in a mismatch: `"q.npy: 3 of 65536 values are NaN or inf
/// (first at flat index 17, (b=0, h=0, n=0, x=17))"`. `name` names the file or the generated
/// tensor; the flat index counts in logical (b, h, n, x) order, the order of a C-order .npy file.
void require_finite(View4<const float> t, const std::string& name);

/// Draws q, k and v for `problem` in `layout` from a generator seeded with `seed`.
/// The values depend only on (problem shape, kind, seed), not on the layout: the same seed
/// gives the same logical tensors in both layouts, so results can be compared across layouts.
Inputs make_inputs(const Problem& problem, Layout layout, InputKind kind, uint64_t seed);

/// The upstream gradient dO of a backward stage, shaped like o (B, H, Nq, d): standard normal
/// entries from a generator derived from `seed` but distinct from those of q, k and v. Like
/// make_inputs(), the values do not depend on the layout.
HostTensor make_output_gradient(const Problem& problem, Layout layout, uint64_t seed);

}  // namespace fa
