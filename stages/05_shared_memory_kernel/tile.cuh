/// \file tile.cuh
/// \brief The pieces of one query tile's work on the GPU, shared by stages 05 and 06.
///
/// One thread block owns `Br = 64` query rows of one (batch, head). Its Q tile is copied into
/// shared memory once and stays there; K and V stream through shared memory `Bc = 64` rows at a
/// time. For each K/V tile the block computes the scores `S_ij = Q_i K_j^T`, updates the running
/// row maxima `m_i` and sums `l_i` (online softmax), turns the scores into `P_ij`, and adds
/// `P_ij V_j` to the output accumulator `O_i`. Scores, `m_i`, `l_i` and `O_i` never leave the chip.
///
/// Work split inside a block (128 threads, 4 warps):
///
///     warp w owns the 16 query rows  w*16 .. w*16+15  of the tile
///     lane = rg*16 + cg:  rg (0..1) picks 8 of those rows:   rows w*16 + rg + 2*i,  i = 0..7
///                         cg (0..15) picks 4 of the 64 keys:  keys cg + 16*t,       t = 0..3
///                                          and d/16 of the d output features
///
/// so each thread owns an 8 x 4 micro-tile of `S_ij` and an 8 x (d/16) micro-tile of `O_i`, in
/// registers. The 16 threads that share a row sit in one half-warp, so a row's maximum is found
/// with four warp shuffles and no shared memory.
///
/// The scale is folded into Q when it is staged: Q_s holds `q * scale * log2(e)`, so the scores
/// come out in base-2 units and the softmax uses `exp2` (one hardware instruction) instead of `exp`.
///
/// TileConfig's three switches (float4 accesses, padded rows, exp2) are the last steps of stage
/// 05's road; with all three off this is the first register-tiled kernel of that road (step 3),
/// with all on the kernel stages 05 and 06 run.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "fa/problem.hpp"
#include "fa/tensor.hpp"

namespace fa::stage05 {

/// Pointers, strides (in elements) and sizes the kernels read. Built on the host by make_kernel_args().
struct KernelArgs {
    const float* q;  ///< (B, H, Nq, d): row n of head (b, h) starts at q + b*q_sb + h*q_sh + n*q_sn
    const float* k;  ///< (B, H, Nk, d)
    const float* v;  ///< (B, H, Nk, d)
    float* o;        ///< (B, H, Nq, d)
    float* lse;      ///< (B, H, Nq)
    int64_t q_sb;  ///< stride of q from one batch to the next
    int64_t q_sh;  ///< stride of q from one head to the next
    int64_t q_sn;  ///< stride of q from one row to the next (the feature stride is 1)
    int64_t k_sb;  ///< stride of k from one batch to the next
    int64_t k_sh;  ///< stride of k from one head to the next
    int64_t k_sn;  ///< stride of k from one row to the next
    int64_t v_sb;  ///< stride of v from one batch to the next
    int64_t v_sh;  ///< stride of v from one head to the next
    int64_t v_sn;  ///< stride of v from one row to the next
    int64_t o_sb;  ///< stride of o from one batch to the next
    int64_t o_sh;  ///< stride of o from one head to the next
    int64_t o_sn;  ///< stride of o from one row to the next
    int64_t lse_sb;  ///< stride of lse from one batch to the next
    int64_t lse_sh;  ///< stride of lse from one head to the next
    int64_t lse_sn;  ///< stride of lse from one row to the next
    int batch;                       ///< B
    int heads;                       ///< H
    int seq_q;                       ///< Nq
    int seq_k;                       ///< Nk
    bool causal;                     ///< bottom-right aligned causal mask
    float scale_log2;                ///< softmax scale times log2(e): scores come out in base 2
    float scale;                     ///< softmax scale: scores in natural-log units (the road's steps before exp2)
};

/// Checks that the kernels of stage `stage` ("05", "06") can run `problem` and throws
/// fa::InputError naming the option otherwise (head_dim must be 32, 64 or 128).
void require_supported(const Problem& problem, const char* stage);

/// Packs device views into KernelArgs; throws fa::InputError when a view cannot be read with
/// 16-byte loads (feature stride not 1, row strides not multiples of 4, misaligned pointers).
KernelArgs make_kernel_args(const Problem& problem, View4<const float> q, View4<const float> k,
                            View4<const float> v, View4<float> o, View3<float> lse);

//! [tile_config]
/// Compile-time shape of the kernels for head dimension `D`. The three switches are the last
/// steps of stage 05's road (fa::stage05::road()); stages 05 and 06 run with all three on.
template <int D, bool Vec4 = true, bool Pad = true, bool Exp2 = true>
struct TileConfig {
    static_assert(D == 32 || D == 64 || D == 128, "stage 05 kernels exist for d = 32, 64, 128");
    /// 16-byte loads and stores (float4) between global memory, shared memory and registers;
    /// off: one float per access
    static constexpr bool kVec4 = Vec4;
    /// 4 floats of padding after each row of Q_s, K_s and P_s; off: rows packed back to back
    static constexpr bool kPad = Pad;
    /// scores in base 2 (log2 e folded into Q's scale) and exp2; off: natural units and expf
    static constexpr bool kExp2 = Exp2;
    static constexpr int kHeadDim = D;            ///< d
    static constexpr int kThreads = 128;          ///< 4 warps per block
    static constexpr int kBr = 64;                ///< Br: query rows per block (4 warps x 16 rows)
    static constexpr int kBc = 64;                ///< Bc: key/value rows per tile
    static constexpr int kRowsPerThread = 8;      ///< rows of S_ij and O_i each thread owns
    static constexpr int kKeysPerThread = 4;      ///< columns of S_ij each thread owns
    static constexpr int kDimPerThread = D / 16;  ///< columns of O_i each thread owns
    /// floats per shared/global access of O and V (1 without kVec4)
    static constexpr int kVec = !Vec4 ? 1 : D >= 64 ? 4 : 2;
    static constexpr int kDimChunks = kDimPerThread / kVec;  ///< vector accesses per O row
    static constexpr int kPadFloats = Pad ? 4 : 0;           ///< padding after each row of Q_s, K_s, P_s
    /// Row pitch of Q_s and K_s in floats. The 4 extra floats shift consecutive rows by 4 banks,
    /// so the 8 lanes of a 16-byte access phase that read 8 different K rows hit 32 distinct banks.
    static constexpr int kLdQK = D + kPadFloats;
    static constexpr int kLdV = D;                ///< row pitch of V_s: lanes read along a row, no conflict
    static constexpr int kLdP = kBr + kPadFloats;  ///< row pitch of P_s (stored transposed: one row per key)
    static constexpr int kQFloats = kBr * kLdQK;  ///< Q_s: [Br, d+4]
    /// K_s [Bc, d+4] and P_s [Bc, Br+4] share one region: P_ij is written only after every warp
    /// has finished reading K_j. At d = 128 that saves 17 KiB, and it is what lets two blocks share
    /// an H100 SM (2 x 115 KiB would not fit in its 228 KB).
    static constexpr int kKPFloats = kBc * (kLdQK > kLdP ? kLdQK : kLdP);
    static constexpr int kVFloats = kBc * kLdV;   ///< V_s: [Bc, d]
    /// Dynamic shared memory per block in bytes (98 KiB at d = 128: two blocks fit in an H100 SM).
    static constexpr size_t kSmemBytes = sizeof(float) * size_t(kQFloats + kKPFloats + kVFloats);
    /// Blocks per SM the register budget is sized for (__launch_bounds__).
    static constexpr int kMinBlocksPerSm = D == 128 ? 2 : 3;
    /// Feature of O_i and V_j that the thread of column group `cg` holds in its c-th register:
    /// runs of kVec neighbouring features, the 16 groups side by side (one float per group
    /// without kVec4: feature cg + 16 c, so that a half-warp still reads 16 neighbouring floats).
    static __device__ __host__ constexpr int o_col(int cg, int c) {
        return (c / kVec) * 16 * kVec + cg * kVec + c % kVec;
    }
};
//! [tile_config]

/// The registers one thread keeps for its rows across the whole K/V loop.
template <class Cfg>
struct RowState {
    float o[Cfg::kRowsPerThread][Cfg::kDimPerThread];  ///< its micro-tile of O_i, not yet divided by l_i
    float m[Cfg::kRowsPerThread];  ///< running row maximum m_i of the scores (base-2 units), shared by the row's 16 lanes
    float l[Cfg::kRowsPerThread];  ///< this thread's part of the running sum l_i (its 4 keys per tile)
};

/// Where a thread sits in the block (see the file comment).
struct Lane {
    int warp;  ///< 0..3: which 16 rows of the tile
    int rg;    ///< 0..1: row group inside the warp
    int cg;    ///< 0..15: column group: keys cg + 16*t, features cg*kVec + 16*kVec*u + e
    /// Row of the tile (0..Br-1) of the thread's i-th row.
    __device__ int row(int i) const { return warp * 16 + rg + 2 * i; }
    /// Column of P_s where the thread's i-th row is stored: its 8 rows sit side by side.
    __device__ int p_slot(int i) const { return warp * 16 + rg * 8 + i; }
};

/// The calling thread's coordinates.
__device__ inline Lane this_lane() {
    const int lane = int(threadIdx.x) % 32;
    return {int(threadIdx.x) / 32, lane / 16, lane % 16};
}

// [load_tile]
/// Copies rows `[row0, row0 + kRows)` of one head from global memory into a shared tile of row
/// pitch `kLd`, multiplied by `scale`. Rows at or past `row_end` are filled with zeros: the tail
/// of the sequence is never read out of bounds, and the zeros cannot turn into NaN later.
/// Each thread moves 16 bytes at a time; consecutive threads move consecutive 16-byte pieces of
/// a row, so a warp reads 512 contiguous bytes (coalesced).
///
/// The loop is unrolled 4 times, not fully: fully unrolled, the compiler issues all of a thread's
/// loads of K and V at once (32 float4 = 128 registers at d = 128) on top of the O accumulators,
/// ran out of its 255 registers and spilled to local memory. Measured on an H100 at N = 4096:
/// d = 128 went from 28 to 37 TFLOP/s, d = 64 from 34 to 37, with this one change.
template <class Cfg, int kRows, int kLd>
__device__ __forceinline__ void load_tile_gmem_to_smem(float* __restrict__ tile,        // [kRows, kLd] shared
                                                       const float* __restrict__ head,  // [N, d] global, row pitch row_stride
                                                       int64_t row_stride, int row0, int row_end, float scale) {
    if constexpr (!Cfg::kVec4) {
        // One float per thread and access: still coalesced (a warp reads 128 contiguous bytes),
        // but four times the load and store instructions.
        constexpr int kFloats = kRows * Cfg::kHeadDim;
        static_assert(kFloats % Cfg::kThreads == 0, "every thread moves the same number of floats");
#pragma unroll 4
        for (int it = 0; it < kFloats / Cfg::kThreads; ++it) {
            const int idx = int(threadIdx.x) + it * Cfg::kThreads;
            const int r = idx / Cfg::kHeadDim, c = idx % Cfg::kHeadDim;
            tile[r * kLd + c] = row0 + r < row_end ? head[int64_t(row0 + r) * row_stride + c] * scale : 0.0f;
        }
    } else {
        constexpr int kVecsPerRow = Cfg::kHeadDim / 4;
        constexpr int kVecs = kRows * kVecsPerRow;
        static_assert(kVecs % Cfg::kThreads == 0, "every thread moves the same number of vectors");
#pragma unroll 4
        for (int it = 0; it < kVecs / Cfg::kThreads; ++it) {
            const int idx = int(threadIdx.x) + it * Cfg::kThreads;
            const int r = idx / kVecsPerRow;
            const int c = (idx % kVecsPerRow) * 4;
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (row0 + r < row_end) {
                x = *reinterpret_cast<const float4*>(head + int64_t(row0 + r) * row_stride + c);
                x.x *= scale;
                x.y *= scale;
                x.z *= scale;
                x.w *= scale;
            }
            *reinterpret_cast<float4*>(tile + r * kLd + c) = x;
        }
    }
}
// [load_tile]

// [scores]
/// `S_ij = Q_i K_j^T` for the thread's 8 x 4 micro-tile, reading Q_s and K_s 4 features at a
/// time. Per 4 features a thread issues 12 16-byte loads and 128 FMAs: 8 rows of Q (the same
/// address for the 16 lanes of a row group: a broadcast) and 4 rows of K (16 distinct rows per
/// half-warp, conflict-free thanks to the padded pitch).
template <class Cfg>
__device__ __forceinline__ void compute_scores(float (&s)[Cfg::kRowsPerThread][Cfg::kKeysPerThread],
                                               const float* __restrict__ Q_s,  // [Br, d+4] shared, scaled
                                               const float* __restrict__ K_s,  // [Bc, d+4] shared
                                               const Lane& me) {
#pragma unroll
    for (int i = 0; i < Cfg::kRowsPerThread; ++i)
#pragma unroll
        for (int t = 0; t < Cfg::kKeysPerThread; ++t) s[i][t] = 0.0f;

    if constexpr (!Cfg::kVec4) {
        // One feature at a time: 12 loads for 32 FMAs instead of 12 loads for 128.
#pragma unroll 8
        for (int x = 0; x < Cfg::kHeadDim; ++x) {
            float kx[Cfg::kKeysPerThread];
#pragma unroll
            for (int t = 0; t < Cfg::kKeysPerThread; ++t) kx[t] = K_s[(me.cg + 16 * t) * Cfg::kLdQK + x];
#pragma unroll
            for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
                const float qx = Q_s[me.row(i) * Cfg::kLdQK + x];
#pragma unroll
                for (int t = 0; t < Cfg::kKeysPerThread; ++t) s[i][t] = fmaf(qx, kx[t], s[i][t]);
            }
        }
    } else {
#pragma unroll 8
        for (int x = 0; x < Cfg::kHeadDim; x += 4) {
            float4 kv[Cfg::kKeysPerThread];
#pragma unroll
            for (int t = 0; t < Cfg::kKeysPerThread; ++t)
                kv[t] = *reinterpret_cast<const float4*>(K_s + (me.cg + 16 * t) * Cfg::kLdQK + x);
#pragma unroll
            for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
                const float4 qv = *reinterpret_cast<const float4*>(Q_s + me.row(i) * Cfg::kLdQK + x);
#pragma unroll
                for (int t = 0; t < Cfg::kKeysPerThread; ++t) {
                    s[i][t] = fmaf(qv.x, kv[t].x, s[i][t]);
                    s[i][t] = fmaf(qv.y, kv[t].y, s[i][t]);
                    s[i][t] = fmaf(qv.z, kv[t].z, s[i][t]);
                    s[i][t] = fmaf(qv.w, kv[t].w, s[i][t]);
                }
            }
        }
    }
}
// [scores]

// [mask]
/// Sets to -inf every score whose key the row may not see: keys at or past `key_end[i]`, the
/// row's visible_key_end(). That covers both the causal mask and the tail of the last K tile.
template <class Cfg>
__device__ __forceinline__ void mask_scores(float (&s)[Cfg::kRowsPerThread][Cfg::kKeysPerThread], int kv0,
                                            const int (&key_end)[Cfg::kRowsPerThread], const Lane& me) {
#pragma unroll
    for (int i = 0; i < Cfg::kRowsPerThread; ++i)
#pragma unroll
        for (int t = 0; t < Cfg::kKeysPerThread; ++t)
            if (kv0 + me.cg + 16 * t >= key_end[i]) s[i][t] = -INFINITY;
}
// [mask]

/// The exponential of the softmax in the units of the scores: `exp2f` (one `ex2.approx` and a
/// range fix-up) for base-2 scores, `expf` (a longer sequence that keeps full float accuracy)
/// for natural ones.
template <class Cfg>
__device__ __forceinline__ float softmax_exp(float x) {
    if constexpr (Cfg::kExp2) {
        return exp2f(x);
    } else {
        return expf(x);
    }
}

// [online_softmax]
/// The online-softmax step for one K/V tile. Per row: the new maximum `m_new = max(m_i,
/// rowmax(S_ij))` (4 shuffles across the row's 16 lanes), the correction `alpha = 2^(m_i - m_new)`
/// that rescales what was accumulated against the old maximum, and `P_ij = 2^(S_ij - m_new)`,
/// written over the scores. A row that has seen only masked keys keeps `m = -inf`; it
/// exponentiates against 0 instead, so `2^(-inf - 0) = 0` rather than `2^(-inf + inf) = NaN`.
template <class Cfg>
__device__ __forceinline__ void online_softmax_update(float (&s)[Cfg::kRowsPerThread][Cfg::kKeysPerThread],
                                                      RowState<Cfg>& st) {
#pragma unroll
    for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
        float tile_max = s[i][0];
#pragma unroll
        for (int t = 1; t < Cfg::kKeysPerThread; ++t) tile_max = fmaxf(tile_max, s[i][t]);
        // Lanes cg = 0..15 of one half-warp hold the 64 keys of this row: xor 8, 4, 2, 1 stays inside it.
#pragma unroll
        for (int offset = 8; offset > 0; offset /= 2)
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
        const float m_new = fmaxf(st.m[i], tile_max);
        const float m_base = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = softmax_exp<Cfg>(st.m[i] - m_base);
        st.m[i] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int t = 0; t < Cfg::kKeysPerThread; ++t) {
            s[i][t] = softmax_exp<Cfg>(s[i][t] - m_base);
            sum += s[i][t];
        }
        // Each lane keeps its own part of l_i; the 16 parts are added once, at the end.
        st.l[i] = st.l[i] * alpha + sum;
#pragma unroll
        for (int c = 0; c < Cfg::kDimPerThread; ++c) st.o[i][c] *= alpha;
    }
}
// [online_softmax]

/// Writes the thread's 8 x 4 micro-tile of P_ij into P_s, transposed (one row of P_s per key),
/// so that for each key a thread later reads its 8 rows with two 16-byte loads.
template <class Cfg>
__device__ __forceinline__ void store_probabilities_to_smem(const float (&p)[Cfg::kRowsPerThread][Cfg::kKeysPerThread],
                                                            float* __restrict__ P_s,  // [Bc, Br+4] shared
                                                            const Lane& me) {
#pragma unroll
    for (int t = 0; t < Cfg::kKeysPerThread; ++t) {
        float* dst = P_s + (me.cg + 16 * t) * Cfg::kLdP + me.p_slot(0);
        if constexpr (Cfg::kVec4) {
            *reinterpret_cast<float4*>(dst) = make_float4(p[0][t], p[1][t], p[2][t], p[3][t]);
            *reinterpret_cast<float4*>(dst + 4) = make_float4(p[4][t], p[5][t], p[6][t], p[7][t]);
        } else {
#pragma unroll
            for (int i = 0; i < Cfg::kRowsPerThread; ++i) dst[i] = p[i][t];
        }
    }
}

// [pv]
/// `O_i += P_ij V_j` for the thread's 8 x (d/16) micro-tile: for each of the Bc keys, its 8
/// probabilities (two broadcast loads from P_s) times d/16 features of that key's V row.
template <class Cfg>
__device__ __forceinline__ void accumulate_pv(RowState<Cfg>& st,
                                              const float* __restrict__ P_s,  // [Bc, Br+4] shared
                                              const float* __restrict__ V_s,  // [Bc, d] shared
                                              const Lane& me) {
#pragma unroll 8
    for (int j = 0; j < Cfg::kBc; ++j) {
        float p[Cfg::kRowsPerThread];
        float v[Cfg::kDimPerThread];
        if constexpr (!Cfg::kVec4) {
            // One float per load: 8 + d/16 loads for 8 * d/16 FMAs.
#pragma unroll
            for (int i = 0; i < Cfg::kRowsPerThread; ++i) p[i] = P_s[j * Cfg::kLdP + me.p_slot(i)];
#pragma unroll
            for (int c = 0; c < Cfg::kDimPerThread; ++c) v[c] = V_s[j * Cfg::kLdV + Cfg::o_col(me.cg, c)];
        } else {
            const float4 p0 = *reinterpret_cast<const float4*>(P_s + j * Cfg::kLdP + me.p_slot(0));
            const float4 p1 = *reinterpret_cast<const float4*>(P_s + j * Cfg::kLdP + me.p_slot(4));
            p[0] = p0.x, p[1] = p0.y, p[2] = p0.z, p[3] = p0.w, p[4] = p1.x, p[5] = p1.y, p[6] = p1.z, p[7] = p1.w;
#pragma unroll
            for (int u = 0; u < Cfg::kDimChunks; ++u) {
                const float* src = V_s + j * Cfg::kLdV + u * 16 * Cfg::kVec + me.cg * Cfg::kVec;
                if constexpr (Cfg::kVec == 4) {
                    const float4 x = *reinterpret_cast<const float4*>(src);
                    v[u * 4 + 0] = x.x;
                    v[u * 4 + 1] = x.y;
                    v[u * 4 + 2] = x.z;
                    v[u * 4 + 3] = x.w;
                } else {
                    const float2 x = *reinterpret_cast<const float2*>(src);
                    v[u * 2 + 0] = x.x;
                    v[u * 2 + 1] = x.y;
                }
            }
        }
#pragma unroll
        for (int i = 0; i < Cfg::kRowsPerThread; ++i)
#pragma unroll
            for (int c = 0; c < Cfg::kDimPerThread; ++c) st.o[i][c] = fmaf(p[i], v[c], st.o[i][c]);
    }
}
// [pv]

// [kv_step]
/// One step of the K/V loop: stage K_j and V_j, `S_ij = Q_i K_j^T`, mask if `kMasked`, online
/// softmax, `O_i += P_ij V_j`. Stage 05 runs every tile masked; stage 06 runs the tiles below
/// the diagonal without the mask.
template <class Cfg, bool kMasked>
__device__ __forceinline__ void process_kv_tile(const KernelArgs& a, const float* __restrict__ k_head,  // [Nk, d] global
                                                const float* __restrict__ v_head,  // [Nk, d] global
                                                int kv0, const float* Q_s, float* K_s, float* V_s,
                                                RowState<Cfg>& st, const int (&key_end)[Cfg::kRowsPerThread],
                                                const Lane& me) {
    float* P_s = K_s;  // P_ij reuses K_j's shared memory once every warp is done with K_j
    __syncthreads();   // all warps finished the previous step's reads of P_s and V_s before they are overwritten
    load_tile_gmem_to_smem<Cfg, Cfg::kBc, Cfg::kLdQK>(K_s, k_head, a.k_sn, kv0, a.seq_k, 1.0f);
    load_tile_gmem_to_smem<Cfg, Cfg::kBc, Cfg::kLdV>(V_s, v_head, a.v_sn, kv0, a.seq_k, 1.0f);
    __syncthreads();  // K_s, V_s (and, on the first step, Q_s) are written before any warp reads them

    float s[Cfg::kRowsPerThread][Cfg::kKeysPerThread];
    compute_scores<Cfg>(s, Q_s, K_s, me);
    if constexpr (kMasked) mask_scores<Cfg>(s, kv0, key_end, me);
    online_softmax_update<Cfg>(s, st);

    __syncthreads();  // every warp finished reading K_s before P_ij overwrites it
    store_probabilities_to_smem<Cfg>(s, P_s, me);
    __syncwarp();     // this warp's P_ij rows are written before its own lanes read them (no other warp reads them)
    accumulate_pv<Cfg>(st, P_s, V_s, me);
}
// [kv_step]

/// Starting state of a thread's rows: O = 0, m = -inf, l = 0.
template <class Cfg>
__device__ __forceinline__ void init_row_state(RowState<Cfg>& st) {
#pragma unroll
    for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
        st.m[i] = -INFINITY;
        st.l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < Cfg::kDimPerThread; ++c) st.o[i][c] = 0.0f;
    }
}

// [epilogue]
/// Adds up the 16 lanes' parts of `l_i`, divides O by it and writes O and the natural-log LSE
/// `(m_i + log2 l_i) * ln 2` of every valid row. A row that saw no key (`l_i = 0`) gets O = 0 and
/// LSE = -inf, never NaN.
template <class Cfg>
__device__ __forceinline__ void store_output(const KernelArgs& a, const RowState<Cfg>& st, int b, int h, int q0,
                                             const Lane& me) {
    float* o_head = a.o + b * a.o_sb + h * a.o_sh;        // [Nq, d] global
    float* lse_head = a.lse + b * a.lse_sb + h * a.lse_sh;  // [Nq] global
    // Every lane takes part in the shuffles, so they come before any lane skips a padding row.
    float l[Cfg::kRowsPerThread];
#pragma unroll
    for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
        l[i] = st.l[i];
#pragma unroll
        for (int offset = 8; offset > 0; offset /= 2) l[i] += __shfl_xor_sync(0xffffffffu, l[i], offset);
    }
#pragma unroll
    for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
        const int row = q0 + me.row(i);
        if (row >= a.seq_q) continue;  // padding row of the last query tile
        const float inv_l = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        float* dst = o_head + int64_t(row) * a.o_sn;
#pragma unroll
        for (int u = 0; u < Cfg::kDimChunks; ++u) {
            const int col = u * 16 * Cfg::kVec + me.cg * Cfg::kVec;
            const float* x = &st.o[i][u * Cfg::kVec];
            if constexpr (Cfg::kVec == 1) {
                dst[col] = x[0] * inv_l;
            } else if constexpr (Cfg::kVec == 4) {
                *reinterpret_cast<float4*>(dst + col) = make_float4(x[0] * inv_l, x[1] * inv_l, x[2] * inv_l, x[3] * inv_l);
            } else {
                *reinterpret_cast<float2*>(dst + col) = make_float2(x[0] * inv_l, x[1] * inv_l);
            }
        }
        if (me.cg == 0) {
            float lse = -INFINITY;
            if (l[i] > 0.0f) lse = Cfg::kExp2 ? (st.m[i] + log2f(l[i])) * 0.69314718055994531f : st.m[i] + logf(l[i]);
            lse_head[int64_t(row) * a.lse_sn] = lse;
        }
    }
}
// [epilogue]

}  // namespace fa::stage05
