// The warp emulator's fp16: IEEE binary16, float32 -> fp16 rounded to nearest even, as the GPU's
// __floats2half2_rn. Written out in integer arithmetic so that any C++20 compiler builds it (GCC
// and Clang 14 on x86 differ on whether they offer _Float16).
#pragma once
#include "cuda_runtime.h"
struct __half { uint16_t x; };
struct __half2 { __half x, y; };
inline uint16_t emu_f2h(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    const uint32_t sign = (b >> 16) & 0x8000u, mag = b & 0x7fffffffu;
    if (mag >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0u));  // inf, NaN
    if (mag >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to above 65504: inf
    if (mag < 0x38800000u) {  // below 2^-14: a subnormal fp16 (or zero), in units of 2^-24
        if (mag < 0x33000000u) return uint16_t(sign);  // below half of 2^-24: rounds to zero
        const uint32_t m = (mag & 0x7fffffu) | 0x800000u;
        const int shift = 126 - int(mag >> 23);  // 14..24: bits of m below the fp16 unit 2^-24
        uint32_t h = m >> shift;
        const uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (h & 1u))) ++h;
        return uint16_t(sign | h);
    }
    // Normal: rebias the exponent (127 -> 15), keep 10 mantissa bits, round the 13 dropped ones.
    uint32_t h = ((mag >> 13) - (112u << 10));
    const uint32_t rest = mag & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
    return uint16_t(sign | h);
}
inline float emu_h2f(uint16_t u) {
    const uint32_t sign = uint32_t(u & 0x8000u) << 16, e = (u >> 10) & 0x1fu, m = u & 0x3ffu;
    uint32_t b;
    if (e == 0x1fu) {
        b = sign | 0x7f800000u | (m << 13);  // inf, NaN
    } else if (e != 0) {
        b = sign | ((e + 112u) << 23) | (m << 13);
    } else {  // zero or subnormal: m * 2^-24, exact in float32
        const float x = float(m) * 0x1p-24f;
        std::memcpy(&b, &x, 4);
        b |= sign;
    }
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
inline __half2 __floats2half2_rn(float a, float b) { return {{emu_f2h(a)}, {emu_f2h(b)}}; }
inline float2 __half22float2(__half2 v) { return {emu_h2f(v.x.x), emu_h2f(v.y.x)}; }
