/// \file precision.hpp
/// \brief The precisions a stage may compute in, and float32 rounded to bfloat16 or float16 on the host.
///
/// Later stages run their matrix products on tensor cores in bfloat16 or float16. To check them,
/// the host needs to know exactly what rounding to those formats does: the conversions here
/// round to nearest, ties to even, like the GPU's `__float2bfloat16_rn` and `__float2half_rn`,
/// including subnormals, overflow to infinity and NaN. They are written out bit by bit, so they
/// do not depend on any compiler's half-precision support.
#pragma once

#include <cstdint>
#include <string>

namespace fa {

/// The precision a stage computes its products in.
enum class Precision {
    Float32,   ///< IEEE single: 8 exponent bits, 24 significant bits
    BFloat16,  ///< bfloat16: float32's 8 exponent bits, 8 significant bits (range of float32, 2-3 digits)
    Float16,   ///< IEEE half: 5 exponent bits, 11 significant bits (largest finite value 65504)
};

/// "float32", "bf16" or "fp16" (the spelling of the stages' `--dtype` option).
std::string to_string(Precision precision);

/// Unit roundoff `u` of `precision`: the largest relative error of one rounding to nearest,
/// half the distance from 1 to the next representable number. float32: \f$2^{-24}\f$,
/// bfloat16: \f$2^{-8}\f$, float16: \f$2^{-11}\f$.
double unit_roundoff(Precision precision);

/// `x` rounded to the nearest bfloat16, ties to even, as its 16 bits. NaN stays NaN (quiet),
/// values beyond the largest bfloat16 become infinities, subnormals are kept.
uint16_t float_to_bf16_bits(float x);

/// The float32 value of the bfloat16 bit pattern `bits` (exact: bfloat16 is float32's top half).
float bf16_bits_to_float(uint16_t bits);

/// `x` rounded to the nearest IEEE half, ties to even, as its 16 bits. NaN stays NaN (quiet),
/// magnitudes from 65520 up become infinities, values below \f$2^{-14}\f$ become subnormal
/// halves (multiples of \f$2^{-24}\f$) or zero.
uint16_t float_to_fp16_bits(float x);

/// Converts an IEEE 754 half-precision bit pattern to float (exact).
float half_to_float(uint16_t bits);

/// `x` rounded to `precision` and back to float32: the value a stage computing in `precision`
/// actually uses. Float32 returns `x` unchanged.
float round_to(Precision precision, float x);

}  // namespace fa
