// The warp emulator's fp16, through the compiler's _Float16 (IEEE binary16, round to nearest even).
#pragma once
#include "cuda_runtime.h"
struct __half { uint16_t x; };
struct __half2 { __half x, y; };
inline uint16_t emu_f2h(float f) { _Float16 h = (_Float16)f; uint16_t u; std::memcpy(&u, &h, 2); return u; }
inline float emu_h2f(uint16_t u) { _Float16 h; std::memcpy(&h, &u, 2); return (float)h; }
inline __half2 __floats2half2_rn(float a, float b) { return {{emu_f2h(a)}, {emu_f2h(b)}}; }
inline float2 __half22float2(__half2 v) { return {emu_h2f(v.x.x), emu_h2f(v.y.x)}; }
