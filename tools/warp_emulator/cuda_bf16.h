// The warp emulator's bf16: the bits, rounded to nearest even from float32.
#pragma once
#include "cuda_runtime.h"
struct __nv_bfloat16 { uint16_t x; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
inline uint16_t emu_f2bf(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    if (std::isnan(f)) return 0x7fc0;
    u += 0x7fff + ((u >> 16) & 1);
    return uint16_t(u >> 16);
}
inline float emu_bf2f(uint16_t h) { uint32_t u = uint32_t(h) << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {{emu_f2bf(a)}, {emu_f2bf(b)}}; }
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return {emu_bf2f(v.x.x), emu_bf2f(v.y.x)}; }
