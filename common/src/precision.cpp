#include "fa/precision.hpp"

#include <bit>

namespace fa {

std::string to_string(Precision precision) {
    switch (precision) {
    case Precision::BFloat16: return "bf16";
    case Precision::Float16: return "fp16";
    default: return "float32";
    }
}

double unit_roundoff(Precision precision) {
    switch (precision) {
    case Precision::BFloat16: return 0x1p-8;
    case Precision::Float16: return 0x1p-11;
    default: return 0x1p-24;
    }
}

uint16_t float_to_bf16_bits(float x) {
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x0040u);  // NaN: keep it, quiet
    // Round to nearest even on the 16 bits dropped: add 0x7fff, plus 1 when the kept part is odd.
    // A carry out of the significand moves into the exponent, which is exactly right, and turns
    // the largest values into infinity.
    const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
    return uint16_t((bits + rounding) >> 16);
}

float bf16_bits_to_float(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }

uint16_t float_to_fp16_bits(float x) {
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
    const uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN, quiet
    // 65520 = 65504 + half an ulp rounds to even, which is 65536: too large, infinity.
    if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
    if (abs < 0x38800000u) {  // below 2^-14, the smallest normal half: a subnormal m * 2^-24, or 0
        const uint32_t exponent = abs >> 23;
        if (exponent < 102) return sign;  // below 2^-25: rounds to zero (2^-25 itself ties to even, 0)
        const uint32_t significand = (abs & 0x7fffffu) | 0x800000u;  // value = significand * 2^(exponent - 150)
        const uint32_t shift = 126 - exponent;                     // to units of 2^-24: 14..24 bits dropped
        uint32_t m = significand >> shift;
        const uint32_t rest = significand & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (m & 1u))) ++m;  // m = 1024 is the smallest normal: still right
        return uint16_t(sign | m);
    }
    // Normal: rebias the exponent (127 -> 15), keep 10 of the 23 significand bits, round the 13
    // dropped ones to nearest even; a carry moves into the exponent.
    uint32_t h = ((abs >> 23) - 127 + 15) << 10 | ((abs >> 13) & 0x3ffu);
    const uint32_t rest = abs & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return uint16_t(sign | h);
}

float half_to_float(uint16_t bits) {
    const uint32_t sign = (bits >> 15) & 1u, exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
    uint32_t out;
    if (exponent == 0) {
        if (mantissa == 0) {
            out = sign << 31;
        } else {  // subnormal half: normalize it
            int e = -1;
            uint32_t m = mantissa;
            do {
                ++e;
                m <<= 1;
            } while ((m & 0x400u) == 0);
            out = (sign << 31) | (uint32_t(127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (exponent == 31) {
        out = (sign << 31) | 0x7f800000u | (mantissa << 13);  // inf or NaN
    } else {
        out = (sign << 31) | ((exponent + 127 - 15) << 23) | (mantissa << 13);
    }
    return std::bit_cast<float>(out);
}

float round_to(Precision precision, float x) {
    switch (precision) {
    case Precision::BFloat16: return bf16_bits_to_float(float_to_bf16_bits(x));
    case Precision::Float16: return half_to_float(float_to_fp16_bits(x));
    default: return x;
    }
}

}  // namespace fa
