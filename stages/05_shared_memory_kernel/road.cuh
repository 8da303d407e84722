/// \file road.cuh
/// \brief The first kernels of stage 05's road: stage 04's loops mapped onto threads as directly
/// as possible, before the register-tiled kernel of tile.cuh.
///
/// Steps 0 and 1 give each thread one query row; step 2 lets the whole block share each tile's
/// work. Steps 3 to 6 are the kernel of attention.cu with the switches of TileConfig.
/// fa::stage05::road() names them all.
#pragma once

#include <cmath>

#include <cuda_runtime.h>

#include "fa/problem.hpp"
#include "tile.cuh"

namespace fa::stage05 {

/// Rows (and threads) per block of the row-per-thread kernel.
inline constexpr int kRowKernelThreads = 64;
/// Keys per tile staged in shared memory by step 1 and step 2.
inline constexpr int kRoadTile = 64;

//! [row_update]
/// One key, seen by one row: the online softmax of stage 03 for a single score. `kx` and `vx`
/// point to the key's K and V rows (global memory in step 0, shared memory in step 1).
template <int D>
__device__ __forceinline__ void row_update(const float (&q)[D], const float* kx, const float* vx, float& m, float& l,
                                           float (&o)[D]) {
    float s = 0.0f;
#pragma unroll
    for (int x = 0; x < D; ++x) s = fmaf(q[x], kx[x], s);
    const float m_new = fmaxf(m, s);  // finite: only keys the row sees reach here
    const float alpha = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * alpha + p;
#pragma unroll
    for (int x = 0; x < D; ++x) o[x] = fmaf(p, vx[x], o[x] * alpha);
    m = m_new;
}
//! [row_update]

//! [row_kernel]
/// Steps 0 and 1: thread `t` of a block computes query row `q0 + t` alone, with its q and O rows
/// in registers. Step 0 (`kSharedKV = false`) reads every key and value row from device memory,
/// once per query row; step 1 copies each tile of 64 K and V rows into shared memory first, all
/// threads of the block together, and every thread then reads the tile from there.
template <int D, bool kSharedKV>
__global__ void __launch_bounds__(kRowKernelThreads) row_per_thread_kernel(const KernelArgs a) {
    extern __shared__ float4 smem_vec[];
    float* K_s = reinterpret_cast<float*>(smem_vec);  // [64, d] (step 1)
    float* V_s = K_s + kRoadTile * D;                  // [64, d] (step 1)

    const int q_tiles = int(ceil_div(a.seq_q, kRowKernelThreads));
    const int q0 = int(blockIdx.x % unsigned(q_tiles)) * kRowKernelThreads;
    const int bh = int(blockIdx.x / unsigned(q_tiles)), b = bh / a.heads, h = bh % a.heads;
    const float* k_head = a.k + b * a.k_sb + h * a.k_sh;
    const float* v_head = a.v + b * a.v_sb + h * a.v_sh;
    const int row = q0 + int(threadIdx.x);
    const bool real = row < a.seq_q;
    const int key_end = real ? int(visible_key_end(row, a.seq_q, a.seq_k, a.causal)) : 0;

    float q[D], o[D];
    const float* q_row = a.q + b * a.q_sb + h * a.q_sh + int64_t(real ? row : 0) * a.q_sn;
#pragma unroll
    for (int x = 0; x < D; ++x) {
        q[x] = real ? q_row[x] * a.scale : 0.0f;
        o[x] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;

    if constexpr (!kSharedKV) {
        for (int key = 0; key < key_end; ++key)
            row_update<D>(q, k_head + int64_t(key) * a.k_sn, v_head + int64_t(key) * a.v_sn, m, l, o);
    } else {
        for (int kv0 = 0; kv0 < a.seq_k; kv0 += kRoadTile) {
            __syncthreads();  // every thread is done with the previous tile
            for (int idx = int(threadIdx.x); idx < kRoadTile * D; idx += kRowKernelThreads) {
                const int r = idx / D, c = idx % D;
                const bool in = kv0 + r < a.seq_k;
                K_s[idx] = in ? k_head[int64_t(kv0 + r) * a.k_sn + c] : 0.0f;
                V_s[idx] = in ? v_head[int64_t(kv0 + r) * a.v_sn + c] : 0.0f;
            }
            __syncthreads();  // the tile is complete before any thread reads it
            const int keys = min(kRoadTile, key_end - kv0);  // this row's keys in the tile (may be <= 0)
            for (int j = 0; j < keys; ++j) row_update<D>(q, K_s + j * D, V_s + j * D, m, l, o);
        }
    }

    if (!real) return;
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;  // a row that sees no key: O = 0
    float* o_row = a.o + b * a.o_sb + h * a.o_sh + int64_t(row) * a.o_sn;
#pragma unroll
    for (int x = 0; x < D; ++x) o_row[x] = o[x] * inv_l;
    a.lse[b * a.lse_sb + h * a.lse_sh + int64_t(row) * a.lse_sn] = l > 0.0f ? m + logf(l) : -INFINITY;
}
//! [row_kernel]

//! [block_kernel]
/// Step 2: the block shares each tile's work. 128 threads, 64 query rows; Q_i, K_j, V_j, the
/// scores S_ij and the row statistics live in shared memory, and every phase hands out one
/// element per thread at a time: S_ij's 64 x 64 scores, then one row's softmax per thread
/// (threads 0 to 63), then O_i's 64 x d outputs, each thread keeping its d/2 of them in registers
/// across the tiles (it always owns the same ones). Three barriers per tile separate the phases.
template <int D>
__global__ void __launch_bounds__(128) block_tile_kernel(const KernelArgs a) {
    constexpr int kThreads = 128, kRows = 64, kKeys = kRoadTile;
    constexpr int kOwned = kRows * D / kThreads;  // outputs per thread
    extern __shared__ float4 smem_vec[];
    float* Q_s = reinterpret_cast<float*>(smem_vec);  // [64, d] scaled
    float* K_s = Q_s + kRows * D;                     // [64, d]
    float* V_s = K_s + kKeys * D;                     // [64, d]
    float* S_s = V_s + kKeys * D;                     // [64, 64] scores, then probabilities
    float* m_s = S_s + kRows * kKeys;                 // [64] running maxima
    float* l_s = m_s + kRows;                         // [64] running sums
    float* alpha_s = l_s + kRows;                     // [64] this tile's rescaling factors
    int* end_s = reinterpret_cast<int*>(alpha_s + kRows);  // [64] visible_key_end of each row

    const int q_tiles = int(ceil_div(a.seq_q, kRows));
    const int q0 = int(blockIdx.x % unsigned(q_tiles)) * kRows;
    const int bh = int(blockIdx.x / unsigned(q_tiles)), b = bh / a.heads, h = bh % a.heads;
    const float* q_head = a.q + b * a.q_sb + h * a.q_sh;
    const float* k_head = a.k + b * a.k_sb + h * a.k_sh;
    const float* v_head = a.v + b * a.v_sb + h * a.v_sh;
    const int tid = int(threadIdx.x);

    for (int idx = tid; idx < kRows * D; idx += kThreads) {
        const int r = idx / D, c = idx % D;
        Q_s[idx] = q0 + r < a.seq_q ? q_head[int64_t(q0 + r) * a.q_sn + c] * a.scale : 0.0f;
    }
    if (tid < kRows) {
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.0f;
        end_s[tid] = q0 + tid < a.seq_q ? int(visible_key_end(q0 + tid, a.seq_q, a.seq_k, a.causal)) : 0;
    }
    float o[kOwned];  // output idx = tid + k * 128: row idx / d, feature idx % d
#pragma unroll
    for (int k = 0; k < kOwned; ++k) o[k] = 0.0f;

    for (int kv0 = 0; kv0 < a.seq_k; kv0 += kKeys) {
        __syncthreads();  // the previous tile's reads of K_s, V_s and S_s are over
        for (int idx = tid; idx < kKeys * D; idx += kThreads) {
            const int r = idx / D, c = idx % D;
            const bool in = kv0 + r < a.seq_k;
            K_s[idx] = in ? k_head[int64_t(kv0 + r) * a.k_sn + c] : 0.0f;
            V_s[idx] = in ? v_head[int64_t(kv0 + r) * a.v_sn + c] : 0.0f;
        }
        __syncthreads();
        // S_ij: element idx is row idx / 64, key idx % 64; a warp takes 32 neighbouring keys of one row.
        for (int idx = tid; idx < kRows * kKeys; idx += kThreads) {
            const int r = idx / kKeys, j = idx % kKeys;
            float s = 0.0f;
            for (int x = 0; x < D; ++x) s = fmaf(Q_s[r * D + x], K_s[j * D + x], s);
            S_s[idx] = kv0 + j < end_s[r] ? s : -INFINITY;
        }
        __syncthreads();
        // The online softmax, one row per thread.
        if (tid < kRows) {
            float tile_max = -INFINITY;
            for (int j = 0; j < kKeys; ++j) tile_max = fmaxf(tile_max, S_s[tid * kKeys + j]);
            const float m_new = fmaxf(m_s[tid], tile_max);
            const float m_base = m_new == -INFINITY ? 0.0f : m_new;
            float sum = 0.0f;
            for (int j = 0; j < kKeys; ++j) {
                const float p = expf(S_s[tid * kKeys + j] - m_base);
                S_s[tid * kKeys + j] = p;
                sum += p;
            }
            const float alpha = expf(m_s[tid] - m_base);
            alpha_s[tid] = alpha;
            l_s[tid] = l_s[tid] * alpha + sum;
            m_s[tid] = m_new;
        }
        __syncthreads();
        // O_i = alpha O_i + P_ij V_j for the thread's outputs.
#pragma unroll
        for (int k = 0; k < kOwned; ++k) {
            const int idx = tid + k * kThreads, r = idx / D, c = idx % D;
            float acc = o[k] * alpha_s[r];
            for (int j = 0; j < kKeys; ++j) acc = fmaf(S_s[r * kKeys + j], V_s[j * D + c], acc);
            o[k] = acc;
        }
    }
    __syncthreads();  // l_s and m_s of the last tile are final
    float* o_head = a.o + b * a.o_sb + h * a.o_sh;
#pragma unroll
    for (int k = 0; k < kOwned; ++k) {
        const int idx = tid + k * kThreads, r = idx / D, c = idx % D;
        if (q0 + r < a.seq_q) o_head[int64_t(q0 + r) * a.o_sn + c] = l_s[r] > 0.0f ? o[k] / l_s[r] : 0.0f;
    }
    if (tid < kRows && q0 + tid < a.seq_q) {
        a.lse[b * a.lse_sb + h * a.lse_sh + int64_t(q0 + tid) * a.lse_sn] =
            l_s[tid] > 0.0f ? m_s[tid] + logf(l_s[tid]) : -INFINITY;
    }
}
//! [block_kernel]

/// Dynamic shared memory of block_tile_kernel<D>: Q_i, K_j, V_j, S_ij and four row arrays.
template <int D>
constexpr size_t block_tile_smem_bytes() {
    return sizeof(float) * (3 * size_t(64) * D + 64 * 64 + 4 * 64);
}

}  // namespace fa::stage05
