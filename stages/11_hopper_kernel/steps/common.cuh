/// \file stages/11_hopper_kernel/steps/common.cuh
/// \brief What the standalone steps share unchanged: the arithmetic of one K/V tile and of the
/// epilogue, and the host's checks and arguments.
///
/// Steps 1, 2, 3, 4 and 9 differ in how the tiles reach shared memory and who computes what when;
/// what a consumer warpgroup computes on a tile is the same in all of them, and the same as the
/// switch kernel's steps 1-16 (kernel.cuh, without step 17's lazy rescale), operation for operation,
/// which is what makes their O and LSE equal bit for bit. A step's `Args` adds what it loads from to
/// CommonArgs, the outputs and the sizes every step reads alike.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>

#include <cuda.h>

#include "fa/cuda/fragments.cuh"
#include "fa/cuda/half.hpp"
#include "fa/cuda/ptx.cuh"
#include "fa/cuda/wgmma.cuh"
#include "fa/cuda/tensor_map.hpp"
#include "fa/cuda/wgmma_layout.hpp"
#include "fa/error.hpp"
#include "fa/problem.hpp"
#include "fa/tensor.hpp"

namespace fa::stage11::steps {

using namespace fa::cuda::ptx;
namespace wl = fa::cuda::wgmma_layout;

/// What every step reads alike: O and LSE (strides in elements: batch, head, row), the sizes, the
/// mask and the scale. A step's Args adds where Q, K and V come from.
template <class T>
struct CommonArgs {
    T* o;              ///< (B, H, Nq, d), features contiguous
    float* lse;        ///< (B, H, Nq)
    int64_t o_s[3];    ///< strides of o
    int64_t lse_s[3];  ///< strides of lse
    int heads;         ///< H
    int q_tiles;       ///< query tiles per head
    int seq_q;         ///< Nq
    int seq_k;         ///< Nk
    bool causal;       ///< bottom-right causal mask
    bool negate_s;     ///< scale < 0: S negated (exact), then |scale| used
    float scale;       ///< |scale|, at least FLT_MIN
    float scale_log2;  ///< |scale| log2(e), at least FLT_MIN
};

/// A work item: query rows [q0, q0 + Br) of head (b, h), and its key tiles: [0, full) every row
/// sees whole (no mask), [full, end) some row sees in part (masked), the rest no row sees (skipped).
struct Item {
    int b;     ///< batch
    int h;     ///< head
    int q0;    ///< first query row
    int full;  ///< key tiles [0, full) need no mask
    int end;   ///< key tiles [full, end) are masked; from end on, skipped
};

/// Work item w: query tile w % q_tiles of (batch, head) w / q_tiles, a causal head's tiles from the
/// last, the one that sees the most keys (the order of stage 07's grid).
template <int kBr, int kBc, class Args>
__device__ __forceinline__ Item work_item(unsigned w, const Args& a) {
    const int rank = int(w % unsigned(a.q_tiles)), bh = int(w / unsigned(a.q_tiles));
    Item it{bh / a.heads, bh % a.heads, (a.causal ? a.q_tiles - 1 - rank : rank) * kBr, 0, 0};
    const int q_last = (it.q0 + kBr < a.seq_q ? it.q0 + kBr : a.seq_q) - 1;
    it.full = int(visible_key_end(it.q0, a.seq_q, a.seq_k, a.causal)) / kBc;
    it.end = (int(visible_key_end(q_last, a.seq_q, a.seq_k, a.causal)) + kBc - 1) / kBc;
    return it;
}

/// What a consumer thread keeps across the K/V tiles: its part of O (unnormalized, in wgmma's
/// accumulator layout), and the running max m and sum l of its rows g and g + 8.
template <int D>
struct ConsumerState {
    float o[D / 2];  ///< this thread's part of O, unnormalized
    float m[2];      ///< running maximum of rows g and g + 8
    float l[2];      ///< running sum of this lane's columns of rows g and g + 8
    /// O = 0, m = -inf, l = 0: before the first tile of an item.
    __device__ __forceinline__ void clear() {
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.0f;
    }
};

//! [gemms]
/// Issues S = Q K^T (not committed): d/16 wgmma 64 x Bc x 16, Q ([Br, d], this warpgroup's 64 rows
/// at `q_rows`) and K ([Bc, d]) both K-major in shared memory (SS). `s` is the tensor cores' until waited for.
template <class T, int D, int kBr, int kBc>
__device__ __forceinline__ void issue_s(float (&s)[kBc / 2], uint32_t q_rows, uint32_t k_tile) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
        wgmma_m64nNk16_ss<kBc, T>(s, wl::k_major_descriptor(q_rows, kBr, ks), wl::k_major_descriptor(k_tile, kBc, ks), ks > 0, false);
    }
}

/// Issues O += P V (not committed): Bc/16 wgmma 64 x d x 16, P from registers (RS), V [Bc, d] read transposed.
template <class T, int D, int kBc>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&p)[kBc / 16][4], uint32_t v_tile) {
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) wgmma_m64nNk16_rs<D, T>(o, p[kk], wl::mn_major_descriptor(v_tile, kBc, kk), true, true);
}
//! [gemms]

//! [softmax]
/// The online softmax of one tile in place: s becomes P = exp2(S scale log2e - m_new scale log2e);
/// m and l are updated, alpha receives the factor O must be rescaled by. Register 4i + 2h + e of s
/// holds row row_lo + 8h, key kv0 + 8i + 2t + e (t = lane % 4: a quad of lanes holds a row).
/// kMask: each key is compared with its row's visible end (diagonal tiles and the last tile).
template <int kBc, bool kMask, class Args>
__device__ __forceinline__ void online_softmax(float (&m)[2], float (&l)[2], float (&s)[kBc / 2], float (&alpha)[2], int row_lo,
                                               int kv0, const Args& a, int thread) {
    const int t = thread % 4;
    if (a.negate_s) {  // scale < 0: S scale = (-S) |scale|, and flipping a sign is exact
#pragma unroll
        for (int i = 0; i < kBc / 2; ++i) s[i] = -s[i];
    }
    if constexpr (kMask) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int visible = int(visible_key_end(row_lo + 8 * h, a.seq_q, a.seq_k, a.causal));
#pragma unroll
            for (int i = 0; i < kBc / 8; ++i)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (kv0 + 8 * i + 2 * t + e >= visible) s[4 * i + 2 * h + e] = -INFINITY;
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float row_max = m[h];
#pragma unroll
        for (int i = 0; i < kBc / 8; ++i) row_max = fmaxf(row_max, fmaxf(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]));
        row_max = fa::cuda::quad_max(row_max);
        // A row that has seen no key keeps m = -inf; subtracting 0 keeps exp2(-inf) = 0, not NaN.
        const float m_scaled = (row_max == -INFINITY ? 0.0f : row_max) * a.scale_log2;
        alpha[h] = ex2(m[h] * a.scale_log2 - m_scaled);
        float row_sum = 0.0f;
#pragma unroll
        for (int i = 0; i < kBc / 8; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& x = s[4 * i + 2 * h + e];
                x = ex2(fmaf(x, a.scale_log2, -m_scaled));
                row_sum += x;
            }
        m[h] = row_max;
        l[h] = l[h] * alpha[h] + row_sum;  // this lane's columns; the quad sums them at the end
    }
}

/// The softmax of K/V tile `tile`: unmasked before `full`, masked from there on.
template <int kBc, int D, class Args>
__device__ __forceinline__ void softmax_tile(ConsumerState<D>& st, float (&s)[kBc / 2], float (&alpha)[2], int tile, int full,
                                             int row_lo, const Args& a, int thread) {
    if (tile < full) {
        online_softmax<kBc, false>(st.m, st.l, s, alpha, row_lo, tile * kBc, a, thread);
    } else {
        online_softmax<kBc, true>(st.m, st.l, s, alpha, row_lo, tile * kBc, a, thread);
    }
}

/// O *= alpha, row by row (registers 4i + 2h + e of O belong to row h).
template <int D>
__device__ __forceinline__ void rescale_o(float (&o)[D / 2], const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[4 * i + e] *= alpha[e / 2];
}

/// P rounded to 16 bits as the A operand of P V: the accumulator of 16 keys is, register for
/// register, the A fragment of one k-slice (wgmma_layout.hpp), so no shuffle.
template <class T, int kBc>
__device__ __forceinline__ void pack_p(const float (&s)[kBc / 2], uint32_t (&p)[kBc / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) p[kk][r] = pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}
//! [softmax]

//! [epilogue]
/// Normalizes O and writes this thread's two rows of head (b, h), 4 bytes a lane per 8-column
/// block, and their LSE = m |scale| + ln l (a row that saw no key: O = 0, LSE = -inf); rows past Nq are skipped.
template <class T, int D, class Args>
__device__ __forceinline__ void write_output(const ConsumerState<D>& st, const Args& a, int b, int h, int row_lo, int thread) {
    const int t = thread % 4;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const float l = fa::cuda::quad_sum(st.l[hh]);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const int row = row_lo + 8 * hh;
        if (row < a.seq_q) {
            T* o_row = a.o + b * a.o_s[0] + h * a.o_s[1] + int64_t(row) * a.o_s[2];
#pragma unroll
            for (int i = 0; i < D / 8; ++i) {
                *reinterpret_cast<uint32_t*>(o_row + 8 * i + 2 * t) = pack2<T>(st.o[4 * i + 2 * hh] * inv, st.o[4 * i + 2 * hh + 1] * inv);
            }
            if (t == 0) a.lse[b * a.lse_s[0] + h * a.lse_s[1] + row * a.lse_s[2]] = l > 0.0f ? st.m[hh] * a.scale + logf(l) : -INFINITY;
        }
    }
}
//! [epilogue]

/// Throws fa::InputError unless a step (`what`, "stage 11 step N") supports the problem: d = 64 or
/// 128, sizes within its 32-bit indices, 16-bit views it can copy 16 bytes at a time.
template <class T>
void check_problem(const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<T> o, const std::string& what) {
    if (p.head_dim != 64 && p.head_dim != 128) throw InputError(what + ": d must be 64 or 128, not " + std::to_string(p.head_dim));
    if (p.seq_q > (int64_t(1) << 30) || p.seq_k > (int64_t(1) << 30) || p.batch * p.heads > (int64_t(1) << 24) ||
        (p.seq_q + 63) / 64 * p.batch * p.heads >= (int64_t(1) << 31)) {
        throw InputError(what + ": at most 2^30 query or key rows, 2^24 batch x heads and 2^31 query tiles");
    }
    for (const auto& [name, view] : {std::pair{"q", q}, {"k", k}, {"v", v}}) cuda::require_16_byte_rows(what, name, view);
    cuda::require_16_byte_rows(what, "o", o);
}

/// Sets CommonArgs: O and LSE, the sizes, the mask and the scale.
template <class T>
void fill_common(CommonArgs<T>& a, const Problem& p, View4<T> o, View3<float> lse, int br) {
    a.o = o.data, a.lse = lse.data;
    for (int i = 0; i < 3; ++i) a.o_s[i] = o.stride[i], a.lse_s[i] = lse.stride[i];
    a.heads = int(p.heads), a.q_tiles = int((p.seq_q + br - 1) / br), a.seq_q = int(p.seq_q), a.seq_k = int(p.seq_k);
    a.causal = p.causal;
    const double scale = p.softmax_scale();
    a.negate_s = scale < 0;
    // A zero scale would make a masked score's -inf NaN (-inf x 0); FLT_MIN gives the same uniform weights.
    a.scale = std::max(float(std::fabs(scale)), FLT_MIN);
    a.scale_log2 = std::max(float(std::fabs(scale) * 1.4426950408889634), FLT_MIN);  // log2(e)
}

/// The TMA's maps of Q, K and V (boxes [Br, 64] of Q, [Bc, 64] of K and V, 128-byte swizzle): any
/// strides with contiguous features, rows past the end read as zeros.
template <class T>
void make_tensor_maps(CUtensorMap& q_map, CUtensorMap& k_map, CUtensorMap& v_map, const Problem& p, View4<const T> q, View4<const T> k,
                      View4<const T> v, int br, int bc, const std::string& what) {
    const cuda::DType dtype = std::is_same_v<T, __half> ? cuda::DType::FP16 : cuda::DType::BF16;
    const auto map = [&](CUtensorMap& m, const View4<const T>& x, int64_t rows, int box_rows, const char* name) {
        cuda::make_tensor_map_bhnd(m, x.data, dtype, p.batch, p.heads, rows, p.head_dim, x.stride[0], x.stride[1], x.stride[2], box_rows,
                                   what + " " + name);
    };
    map(q_map, q, p.seq_q, br, "q");
    map(k_map, k, p.seq_k, bc, "k");
    map(v_map, v, p.seq_k, bc, "v");
}

}  // namespace fa::stage11::steps
