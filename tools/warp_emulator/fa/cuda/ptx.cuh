// The warp emulator's fa/cuda/ptx.cuh: each wrapper does what the PTX ISA says the instruction
// does, lane by lane. ldmatrix: matrix m's row r comes from the address lane 8m + r gave; lane l
// receives row l/4, elements 2(l%4) and 2(l%4)+1 (.trans: column l/4, rows 2(l%4) and 2(l%4)+1).
// mma.m16n8k16: each lane assembles the A, B elements of its four outputs from the lanes and
// registers that hold them (the fragment maps of fa/cuda/layouts.hpp) and sums in float32.
// cp.async copies land when cp.async.wait_group lets them, not before: a kernel that reads a slot
// before waiting reads what was there. ex2 is exp2 (no approximation error). red.global.add is
// an atomic add per float, ld.global.acquire an acquiring atomic load. A lane's registers, its
// cp.async groups and its count of collectives are its Thread's (cuda_runtime.h: emu::self()).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
namespace emu {
inline size_t smem_limit;                                   // the launch's dynamic shared memory
inline void check_smem(uint32_t a, uint32_t bytes) {
    if (a + bytes > smem_limit) { std::fprintf(stderr, "shared access out of bounds: %u + %u > %zu\n", a, bytes, smem_limit); std::abort(); }
}
template <class T> float to_f(uint16_t h);
template <> inline float to_f<__nv_bfloat16>(uint16_t h) { return emu_bf2f(h); }
template <> inline float to_f<__half>(uint16_t h) { return emu_h2f(h); }
// The other way, rounded to nearest even: one float, or a whole buffer of them.
template <class T> uint16_t to_bits(float f);
template <> inline uint16_t to_bits<__nv_bfloat16>(float f) { return emu_f2bf(f); }
template <> inline uint16_t to_bits<__half>(float f) { return emu_f2h(f); }
template <class T> std::vector<uint16_t> to_bits(const std::vector<float>& x) {
    std::vector<uint16_t> r(x.size());
    for (size_t i = 0; i < r.size(); ++i) r[i] = to_bits<T>(x[i]);
    return r;
}
}  // namespace emu
namespace fa::cuda::ptx {
inline uint32_t smem_address(const void* p) { return uint32_t(static_cast<const unsigned char*>(p) - emu::smem_base); }
template <class T>
inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
    using namespace emu;
    Thread& me = *self();
    Warp* const w = me.w;
    const int lane = me.lane, p = next();
    for (int r = 0; r < 4; ++r) w->a[p][lane][r] = a[r];
    w->b[p][lane][0] = b[0], w->b[p][lane][1] = b[1];
    fibers::arrive_and_wait(w->bar);
    const auto A = [&](int row, int k) {
        const uint32_t reg = w->a[p][(row % 8) * 4 + (k % 8) / 2][(row / 8) + 2 * (k / 8)];
        return to_f<T>(uint16_t(k % 2 ? reg >> 16 : reg & 0xffff));
    };
    const auto B = [&](int k, int n) {
        const uint32_t reg = w->b[p][n * 4 + (k % 8) / 2][k / 8];
        return to_f<T>(uint16_t(k % 2 ? reg >> 16 : reg & 0xffff));
    };
    const int g = lane / 4, t = lane % 4;
    float out[4];
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
        float s = c[i];
        for (int k = 0; k < 16; ++k) s = std::fma(A(row, k), B(k, col), s);
        out[i] = s;
    }
    for (int i = 0; i < 4; ++i) d[i] = out[i];
}
inline void ldmatrix_common(uint32_t (&r)[4], uint32_t address, bool trans) {
    using namespace emu;
    if (address % 16 != 0) { std::fprintf(stderr, "ldmatrix address %u not 16-byte aligned\n", address); std::abort(); }
    check_smem(address, 16);
    Thread& me = *self();
    Warp* const w = me.w;
    const int lane = me.lane, p = next();
    w->addr[p][lane] = address;
    fibers::arrive_and_wait(w->bar);
    for (int m = 0; m < 4; ++m) {
        if (!trans) {
            std::memcpy(&r[m], smem_base + w->addr[p][8 * m + lane / 4] + 4 * (lane % 4), 4);
        } else {
            const int i0 = 2 * (lane % 4), j = lane / 4;
            uint16_t lo, hi;
            std::memcpy(&lo, smem_base + w->addr[p][8 * m + i0] + 2 * j, 2);
            std::memcpy(&hi, smem_base + w->addr[p][8 * m + i0 + 1] + 2 * j, 2);
            r[m] = uint32_t(lo) | (uint32_t(hi) << 16);
        }
    }
}
inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t a) { ldmatrix_common(r, a, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t a) { ldmatrix_common(r, a, true); }
inline void cp_async_16(uint32_t dst, const void* src, bool valid) {
    if (dst % 16 != 0) { std::fprintf(stderr, "cp.async dst misaligned\n"); std::abort(); }
    emu::check_smem(dst, 16);
    emu::self()->open_group.push_back({dst, src, valid, 16});
}
inline void cp_async_4(uint32_t dst, const void* src) {
    if (dst % 4 != 0 || reinterpret_cast<uintptr_t>(src) % 4 != 0) { std::fprintf(stderr, "cp.async (4 bytes) misaligned\n"); std::abort(); }
    emu::check_smem(dst, 4);
    emu::self()->open_group.push_back({dst, src, true, 4});
}
inline void cp_async_commit() {
    emu::Thread& me = *emu::self();
    me.groups.push_back(std::move(me.open_group));
    me.open_group.clear();
}
template <int N>
inline void cp_async_wait() {
    std::vector<std::vector<emu::Copy>>& groups = emu::self()->groups;
    while (int(groups.size()) > N) {
        for (const auto& c : groups.front()) {
            if (c.valid) std::memcpy(emu::smem_base + c.dst, c.src, c.bytes);
            else std::memset(emu::smem_base + c.dst, 0, c.bytes);
        }
        groups.erase(groups.begin());
    }
}
inline void red_global_add_v2_f32(float* address, float x, float y) {
    atomicAdd(address, x);
    atomicAdd(address + 1, y);
}
inline void red_global_add_v4_f32(float* address, float x, float y, float z, float w) {
    if ((reinterpret_cast<uintptr_t>(address) & 15u) != 0) { std::fprintf(stderr, "red.global.add.v4.f32: %p is not 16-byte aligned\n", static_cast<void*>(address)); std::abort(); }
    red_global_add_v2_f32(address, x, y);
    red_global_add_v2_f32(address + 2, z, w);
}
inline int ld_global_acquire_gpu_b32(const int* address) { return __atomic_load_n(address, __ATOMIC_ACQUIRE); }
template <class T> inline uint32_t pack2(float lo, float hi);
template <> inline uint32_t pack2<__nv_bfloat16>(float lo, float hi) { return uint32_t(emu_f2bf(lo)) | (uint32_t(emu_f2bf(hi)) << 16); }
template <> inline uint32_t pack2<__half>(float lo, float hi) { return uint32_t(emu_f2h(lo)) | (uint32_t(emu_f2h(hi)) << 16); }
inline float ex2(float x) { return std::exp2(x); }
}  // namespace fa::cuda::ptx
