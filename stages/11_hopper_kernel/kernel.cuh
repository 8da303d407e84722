/// \file stages/11_hopper_kernel/kernel.cuh
/// \brief Stage 11's kernel: one template whose compile-time Features switch each Hopper idea on.
///
/// A *consumer warpgroup* (4 warps, 128 threads) owns 64 query rows from start to end, as a
/// warp of stage 07 owned 16 or 32: the scores of its rows, m_i, l_i and O_i live in its
/// registers. Per K/V tile of `Bc` keys, per consumer warpgroup:
///
///     S   = Q_c K_j^T          [64, Bc]  d/16 wgmma m64nBck16, Q and K from shared memory (SS)
///     m_i, l_i, P = exp2(S*scale*log2e - m_i*scale*log2e)         float32, in registers
///     O_c = O_c * alpha + P V_j  [64, d]   Bc/16 wgmma m64ndk16, P from registers (RS), V as B
///                                           read transposed from its [keys, d] tile
///
/// The road (Features): step 1 loads tiles with cp.async as stage 07 did; step 2 lets the TMA
/// load them into a ring of buffers on mbarriers; step 3 gives the loads to a producer
/// warpgroup and the registers to the consumers (setmaxnreg).
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda_runtime.h>

#include "fa/cuda/mbarrier.cuh"
#include "fa/cuda/ptx.cuh"
#include "fa/cuda/tma.cuh"
#include "fa/cuda/warpgroup.cuh"
#include "fa/cuda/wgmma.cuh"
#include "fa/cuda/wgmma_layout.hpp"
#include "fa/problem.hpp"

namespace fa::stage11 {

//! [features]
/// The switches of the road, each one idea of the lesson. A step is a named value built from
/// the one before (`kStep2 = kStep1.with_tma_ring()`); a kernel takes it through a type whose
/// static member `value` holds it (CUDA sources are C++17: no class-type template parameters).
struct Features {
    int bc = 128;            ///< keys per K/V tile (the N of S = Q K^T's wgmma)
    int consumers = 1;       ///< consumer warpgroups; each owns 64 query rows, so Br = 64 x consumers
    int stages = 2;          ///< K/V tiles in the ring of shared buffers
    bool tma = false;        ///< tiles loaded by the TMA onto mbarriers (else by every thread with cp.async)
    bool producer = false;   ///< a producer warpgroup issues the loads; the consumers only compute
    int producer_registers = 24;   ///< with `producer`: registers per thread the producer keeps (setmaxnreg.dec)
    int consumer_registers = 240;  ///< with `producer`: registers per thread of a consumer (setmaxnreg.inc)

    /// Step 2: the TMA loads each K and V tile in whole boxes, swizzled as wgmma reads them, and
    /// reports on an mbarrier; a ring `stages` deep.
    constexpr Features with_tma_ring(int ring_stages) const {
        Features f = *this;
        f.tma = true;
        f.stages = ring_stages;
        return f;
    }
    /// Step 3: warp specialization. One warpgroup produces (one thread issues TMA copies, its
    /// registers given away), `consumer_groups` warpgroups consume; full and empty barriers
    /// per slot replace the block-wide barrier.
    constexpr Features with_producer_warpgroup(int consumer_groups) const {
        Features f = *this;
        f.producer = true;
        f.consumers = consumer_groups;
        return f;
    }
    constexpr int br() const { return 64 * consumers; }                      ///< query rows per block
    constexpr int threads() const { return 128 * (consumers + (producer ? 1 : 0)); }  ///< threads per block
};
//! [features]

/// Pointers, strides (in elements), sizes and tensor maps the kernel reads.
template <class T>
struct Args {
    CUtensorMap q_map;  ///< (B, H, Nq, d) boxes [Br, 64] (TMA steps only)
    CUtensorMap k_map;  ///< (B, H, Nk, d) boxes [Bc, 64]
    CUtensorMap v_map;  ///< (B, H, Nk, d) boxes [Bc, 64]
    const T* q;  ///< (B, H, Nq, d): row n of head (b, h) at q + b*q_sb + h*q_sh + n*q_sn
    const T* k;  ///< (B, H, Nk, d)
    const T* v;  ///< (B, H, Nk, d)
    T* o;        ///< (B, H, Nq, d)
    float* lse;  ///< (B, H, Nq)
    int64_t q_sb;  ///< batch stride of q (the feature stride is 1)
    int64_t q_sh;  ///< head stride of q
    int64_t q_sn;  ///< row stride of q
    int64_t k_sb;  ///< batch stride of k
    int64_t k_sh;  ///< head stride of k
    int64_t k_sn;  ///< row stride of k
    int64_t v_sb;  ///< batch stride of v
    int64_t v_sh;  ///< head stride of v
    int64_t v_sn;  ///< row stride of v
    int64_t o_sb;  ///< batch stride of o
    int64_t o_sh;  ///< head stride of o
    int64_t o_sn;  ///< row stride of o
    int64_t lse_sb;  ///< batch stride of lse
    int64_t lse_sh;  ///< head stride of lse
    int64_t lse_sn;  ///< row stride of lse
    int heads;        ///< H
    int batch_heads;  ///< B * H
    int q_tiles;      ///< query tiles per (batch, head): ceil(Nq / Br)
    int seq_q;        ///< Nq
    int seq_k;        ///< Nk
    bool causal;      ///< bottom-right aligned causal mask
    bool negate_s;    ///< the scale is negative: S's sign is flipped and |scale| used (exact)
    float scale;      ///< |softmax scale| (at least FLT_MIN)
    float scale_log2; ///< |softmax scale| * log2(e)
};

/// Shape constants of one kernel instance.
template <class T, int D, class Step>
struct Shape {
    static constexpr Features kF = Step::value;  ///< the step's switches
    static_assert(sizeof(T) == 2, "wgmma operands are 16-bit here");
    static_assert(D == 64 || D == 128, "d is 64 or 128 (whole 64-column swizzled boxes; the S and O accumulators fit)");
    static_assert(kF.bc % 16 == 0 && kF.bc >= 16 && kF.bc <= 256, "Bc is a wgmma N for S and a multiple of P V's k");
    static constexpr int kBr = kF.br();            ///< query rows per block
    static constexpr int kBc = kF.bc;              ///< keys per tile
    static constexpr int kThreads = kF.threads();  ///< threads per block
    static constexpr int kQBytes = kBr * D * 2;    ///< the Q tile
    static constexpr int kKVBytes = kBc * D * 2;   ///< one K (or V) tile
    static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "every tile starts on a 1024-byte boundary (the swizzle's atom)");
    static constexpr int kBarrierBytes = 8 * (1 + 2 * kF.stages);  ///< the mbarriers: Q's, and a full and an empty one per slot
    /// Shared memory: 1024 bytes of slack to align, Q, then stages x (K, V), then the barriers.
    static constexpr size_t kSmemBytes = 1024 + size_t(kQBytes) + 2 * size_t(kF.stages) * kKVBytes + kBarrierBytes;
};

//! [key_tiles]
/// The key tiles of the query tile `[q0, q0 + br)`: `[0, full)` every row sees in full (no
/// mask), `[full, end)` some row sees in part (masked), the rest no row sees (skipped).
__host__ __device__ inline void key_tiles(int q0, int br, int bc, int seq_q, int seq_k, bool causal, int& full, int& end) {
    const int q_last = (q0 + br < seq_q ? q0 + br : seq_q) - 1;
    const int fewest = int(visible_key_end(q0, seq_q, seq_k, causal));
    const int most = int(visible_key_end(q_last, seq_q, seq_k, causal));
    full = fewest / bc;
    end = (most + bc - 1) / bc;
}
//! [key_tiles]

namespace detail {

using namespace fa::cuda::ptx;
namespace wl = fa::cuda::wgmma_layout;

/// Copies rows `[row0, row0 + kRows)` of a [n_rows, D] global matrix into a shared tile in the
/// layout the TMA would leave (D / 64 swizzled boxes of [kRows, 64], wgmma_layout::tile_offset)
/// with 16-byte cp.async copies spread over `threads` threads; rows past `n_rows` are zero.
template <class T, int D, int kRows>
__device__ __forceinline__ void load_tile_cp_async(unsigned char* tile, const T* gmem, int64_t row_stride, int row0, int n_rows,
                                                   int thread, int threads) {
    constexpr int kChunksPerRow = D / 8;
    const uint32_t base = smem_address(tile);
    for (int i = thread; i < kRows * kChunksPerRow; i += threads) {
        const int r = i / kChunksPerRow, c = (i % kChunksPerRow) * 8;
        const bool valid = row0 + r < n_rows;
        const T* src = valid ? gmem + int64_t(row0 + r) * row_stride + c : gmem;
        cp_async_16(base + wl::tile_offset(kRows, r, c), src, valid);
    }
}

/// Max and sum across the four lanes of a quad: the lanes that share a row of the accumulator.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
/// Sum across the four lanes of a quad.
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/// What one consumer warpgroup keeps in registers across the K/V tiles (per thread).
template <int D>
struct ConsumerState {
    float o[D / 2];  ///< O_c accumulator, unnormalized (wgmma_layout::accumulator_element)
    float m[2];      ///< running max of the raw scores of this thread's rows g and g + 8
    float l[2];      ///< running sum of P over this thread's columns of those rows
};

//! [consume_tile]
/// One K/V tile for one consumer warpgroup: S = Q_c K_j^T, the online softmax, O_c += P V_j.
/// `q_tile`: shared address of this warpgroup's 64 rows of Q; `k_tile`, `v_tile`: the slot.
/// kMask: compare every key with its row's visible end (diagonal tiles and the last tile).
template <class T, int D, class Step, bool kMask>
__device__ __forceinline__ void consume_tile(ConsumerState<D>& st, uint32_t q_desc_base, uint32_t k_tile, uint32_t v_tile,
                                             int row_lo, int kv0, const Args<T>& a, int thread) {
    using S = Shape<T, D, Step>;
    constexpr int kBc = S::kBc;
    const int t = (thread % 32) % 4;

    // S = Q K^T: d/16 wgmma, each 64 x Bc x 16, both operands K-major from shared memory.
    float s[kBc / 2];
    wgmma_fence();  // the registers of s are free for the wgmma to write
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
        wgmma_m64nNk16_ss<kBc, T>(s, wl::k_major_descriptor(q_desc_base, S::kBr, ks) , wl::k_major_descriptor(k_tile, kBc, ks),
                                  ks > 0, false);
    }
    wgmma_commit_group();
    wgmma_wait_group<0>();  // S is in registers
    warpgroup_fence_operands(s);

    if (a.negate_s) {  // scale < 0: S * scale = (-S) * |scale|, and flipping a sign is exact
#pragma unroll
        for (int i = 0; i < kBc / 2; ++i) s[i] = -s[i];
    }
    if constexpr (kMask) {
        // Row of register pair h: row_lo + 8h. Key of register 4i + 2h + e: kv0 + 8i + 2t + e.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row_lo + 8 * h;
            const int visible = int(visible_key_end(row, a.seq_q, a.seq_k, a.causal));
#pragma unroll
            for (int i = 0; i < kBc / 8; ++i)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (kv0 + 8 * i + 2 * t + e >= visible) s[4 * i + 2 * h + e] = -INFINITY;
        }
    }

    // Online softmax, row by row: a quad (4 lanes) holds a whole row of S.
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float row_max = st.m[h];
#pragma unroll
        for (int i = 0; i < kBc / 8; ++i) row_max = fmaxf(row_max, fmaxf(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]));
        row_max = quad_max(row_max);
        // A row that has seen no key keeps m = -inf; subtracting 0 keeps exp2(-inf) = 0, not NaN.
        const float m_scaled = (row_max == -INFINITY ? 0.0f : row_max) * a.scale_log2;
        alpha[h] = ex2(st.m[h] * a.scale_log2 - m_scaled);
        float row_sum = 0.0f;
#pragma unroll
        for (int i = 0; i < kBc / 8; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& x = s[4 * i + 2 * h + e];
                x = ex2(fmaf(x, a.scale_log2, -m_scaled));
                row_sum += x;
            }
        st.m[h] = row_max;
        st.l[h] = st.l[h] * alpha[h] + row_sum;  // this lane's columns; the quad sums at the end
    }
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) st.o[4 * i + e] *= alpha[e / 2];

    // P as the A operand: the accumulator of 16 keys is, register for register, the A layout
    // of one k-slice (wgmma_layout::accumulator_index_for_a): round and pack in place.
    uint32_t p[kBc / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) p[kk][r] = pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);

    // O += P V: Bc/16 wgmma, each 64 x d x 16; V [keys, d] is B stored MN-major (transposed).
    wgmma_fence();  // O was rescaled and P written by ordinary instructions
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
        wgmma_m64nNk16_rs<D, T>(st.o, p[kk], wl::mn_major_descriptor(v_tile, kBc, kk), true, true);
    }
    wgmma_commit_group();
    wgmma_wait_group<0>();  // O is in registers, and the K and V slots are no longer read
    warpgroup_fence_operands(st.o);
}
//! [consume_tile]

/// Normalizes O, writes this warpgroup's rows of O and their LSE (rows past Nq are skipped).
template <class T, int D>
__device__ __forceinline__ void write_output(ConsumerState<D>& st, const Args<T>& a, int b, int h, int row_lo, int thread) {
    const int t = (thread % 32) % 4;
    T* o_head = a.o + b * a.o_sb + h * a.o_sh;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const float l = quad_sum(st.l[hh]);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // l = 0: the row saw no key, O = 0
        const int row = row_lo + 8 * hh;
        if (row < a.seq_q) {
            T* o_row = o_head + int64_t(row) * a.o_sn;
#pragma unroll
            for (int i = 0; i < D / 8; ++i) {
                *reinterpret_cast<uint32_t*>(o_row + 8 * i + 2 * t) =
                    pack2<T>(st.o[4 * i + 2 * hh] * inv, st.o[4 * i + 2 * hh + 1] * inv);
            }
            if (t == 0) {
                // LSE = ln(sum_j exp(scale*s_j)) = m*|scale| + ln(l), natural-log units.
                a.lse[b * a.lse_sb + h * a.lse_sh + row * a.lse_sn] = l > 0.0f ? st.m[hh] * a.scale + logf(l) : -INFINITY;
            }
        }
    }
}

/// Runs tiles [0, end) for one consumer warpgroup, the masked ones from `full` on; `slot_ready`
/// (tile) blocks until the tile's K and V are in their slot, `slot_done(tile)` says they have
/// been read.
template <class T, int D, class Step, class Ready, class Done>
__device__ __forceinline__ void consume_tiles(ConsumerState<D>& st, uint32_t q_tile, unsigned char* kv_ring, int full, int end,
                                              int row_lo, const Args<T>& a, int thread, Ready slot_ready, Done slot_done) {
    using S = Shape<T, D, Step>;
    for (int tile = 0; tile < end; ++tile) {
        slot_ready(tile);
        const int slot = tile % S::kF.stages;
        const uint32_t k_tile = smem_address(kv_ring + 2 * slot * S::kKVBytes);
        const uint32_t v_tile = k_tile + S::kKVBytes;
        if (tile < full) {
            consume_tile<T, D, Step, false>(st, q_tile, k_tile, v_tile, row_lo, tile * S::kBc, a, thread);
        } else {
            consume_tile<T, D, Step, true>(st, q_tile, k_tile, v_tile, row_lo, tile * S::kBc, a, thread);
        }
        slot_done(tile);
    }
}

}  // namespace detail

//! [kernel]
/// The whole forward pass for one query tile of one (batch, head); grid: query tiles x B x H.
template <class T, int D, class Step>
__global__ void __launch_bounds__(Shape<T, D, Step>::kThreads, 1) hopper_forward_kernel(const __grid_constant__ Args<T> a) {
    using S = Shape<T, D, Step>;
    constexpr Features kF = S::kF;
    extern __shared__ unsigned char smem_raw[];
    // The swizzle is a function of the address: tiles start on 1024-byte boundaries.
    unsigned char* smem = smem_raw + ((1024u - fa::cuda::ptx::smem_address(smem_raw) % 1024u) % 1024u);
    unsigned char* q_tile = smem;                    // [Br, d]: d/64 swizzled boxes [Br, 64]
    unsigned char* kv_ring = q_tile + S::kQBytes;    // stages x (K [Bc, d], V [Bc, d]), each d/64 boxes [Bc, 64]
    uint64_t* barriers = reinterpret_cast<uint64_t*>(kv_ring + 2 * kF.stages * S::kKVBytes);
    // barriers[0]: Q landed; [1 + s]: slot s full; [1 + stages + s]: slot s empty (producer step)
    const auto bar = [&](int i) { return fa::cuda::ptx::smem_address(barriers + i); };

    // Causal problems start with the last query tiles: they see the most keys.
    const int q_tile_index = int(blockIdx.x % unsigned(a.q_tiles));
    const int q0 = (a.causal ? a.q_tiles - 1 - q_tile_index : q_tile_index) * S::kBr;
    const int bh = int(blockIdx.x / unsigned(a.q_tiles)), b = bh / a.heads, h = bh % a.heads;
    const int thread = int(threadIdx.x);
    int full, end;
    key_tiles(q0, S::kBr, S::kBc, a.seq_q, a.seq_k, a.causal, full, end);

    // The consumer warpgroup of this thread (its 64 rows), and its thread index in it.
    const int consumer = kF.producer ? int(threadIdx.x) / 128 - 1 : int(threadIdx.x) / 128;
    const int ct = thread % 128;
    const int row_lo = q0 + 64 * consumer + 16 * (ct / 32) + (ct % 32) / 4;  // row g of this warp; g + 8 is the other
    const uint32_t q_rows = fa::cuda::ptx::smem_address(q_tile) + uint32_t(consumer) * 64 * 128;  // this group's 64 rows

    detail::ConsumerState<D> st;
#pragma unroll
    for (int i = 0; i < D / 2; ++i) st.o[i] = 0.0f;
    st.m[0] = st.m[1] = -INFINITY;
    st.l[0] = st.l[1] = 0.0f;

    const T* q_head = a.q + b * a.q_sb + h * a.q_sh;  // [Nq, d] global
    const T* k_head = a.k + b * a.k_sb + h * a.k_sh;  // [Nk, d] global
    const T* v_head = a.v + b * a.v_sb + h * a.v_sh;  // [Nk, d] global
    const uint32_t kv_tx = 2u * S::kKVBytes;          // bytes the TMA delivers per K/V tile

    // One thread issues the TMA copies of tile `tile` (K and V, d/64 boxes each) onto its slot's barrier.
    const auto tma_load_kv = [&](int tile) {
        const int slot = tile % kF.stages;
        unsigned char* k_dst = kv_ring + 2 * slot * S::kKVBytes;
        const uint32_t full_bar = bar(1 + slot);
        fa::cuda::ptx::mbarrier_arrive_expect_tx(full_bar, kv_tx);
#pragma unroll
        for (int box = 0; box < D / 64; ++box) {
            fa::cuda::ptx::tma_load_4d(fa::cuda::ptx::smem_address(k_dst + box * S::kBc * 128), &a.k_map, full_bar, 64 * box,
                                       tile * S::kBc, h, b);
            fa::cuda::ptx::tma_load_4d(fa::cuda::ptx::smem_address(k_dst + S::kKVBytes + box * S::kBc * 128), &a.v_map,
                                       full_bar, 64 * box, tile * S::kBc, h, b);
        }
    };
    const auto tma_load_q = [&] {
        fa::cuda::ptx::mbarrier_arrive_expect_tx(bar(0), uint32_t(S::kQBytes));
#pragma unroll
        for (int box = 0; box < D / 64; ++box) {
            fa::cuda::ptx::tma_load_4d(fa::cuda::ptx::smem_address(q_tile + box * S::kBr * 128), &a.q_map, bar(0), 64 * box, q0, h, b);
        }
    };

    if (end > 0) {
        if constexpr (!kF.tma) {
            //! [step1_loads]
            // Step 1: every thread copies with cp.async, as in stage 07; a ring of kStages slots.
            const auto load_kv = [&](int tile) {
                unsigned char* k_dst = kv_ring + 2 * (tile % kF.stages) * S::kKVBytes;
                detail::load_tile_cp_async<T, D, S::kBc>(k_dst, k_head, a.k_sn, tile * S::kBc, a.seq_k, thread, S::kThreads);
                detail::load_tile_cp_async<T, D, S::kBc>(k_dst + S::kKVBytes, v_head, a.v_sn, tile * S::kBc, a.seq_k, thread,
                                                         S::kThreads);
            };
            detail::load_tile_cp_async<T, D, S::kBr>(q_tile, q_head, a.q_sn, q0, a.seq_q, thread, S::kThreads);
#pragma unroll
            for (int i = 0; i < kF.stages - 1; ++i) {
                if (i < end) load_kv(i);
                fa::cuda::ptx::cp_async_commit();  // Q travels in group 0; empty groups keep the count uniform
            }
            detail::consume_tiles<T, D, Step>(
                st, q_rows, kv_ring, full, end, row_lo, a, thread,
                [&](int tile) {
                    fa::cuda::ptx::cp_async_wait<kF.stages - 2>();  // this thread's copies of tile `tile` have landed
                    fa::cuda::ptx::fence_proxy_async();  // ... and are visible to wgmma's reads (the async proxy)
                    // Every thread's copies of `tile` are in before any wgmma reads them, and every
                    // wgmma of tile-1 has finished (wait_group 0) before its slot is refilled below.
                    __syncthreads();
                    const int next = tile + kF.stages - 1;
                    if (next < end) load_kv(next);
                    fa::cuda::ptx::cp_async_commit();
                },
                [](int) {});
            fa::cuda::ptx::cp_async_wait<0>();  // nothing may still be landing when the block exits
            //! [step1_loads]
        } else if constexpr (!kF.producer) {
            //! [step2_loads]
            // Step 2: thread 0 issues TMA copies; each slot's mbarrier says when its bytes are in.
            if (thread == 0) {
                fa::cuda::ptx::mbarrier_init(bar(0), 1);
                for (int s = 0; s < kF.stages; ++s) fa::cuda::ptx::mbarrier_init(bar(1 + s), 1);
                fa::cuda::ptx::fence_mbarrier_init();  // the TMA unit sees the initialized barriers
            }
            __syncthreads();  // every thread sees them initialized before waiting on them
            if (thread == 0) {
                tma_load_q();
                for (int i = 0; i < kF.stages - 1 && i < end; ++i) tma_load_kv(i);
            }
            fa::cuda::ptx::mbarrier_wait_parity(bar(0), 0);  // Q has landed
            detail::consume_tiles<T, D, Step>(
                st, q_rows, kv_ring, full, end, row_lo, a, thread,
                [&](int tile) {
                    // Every thread has finished tile-1 (its wgmma waited), so its slot may be refilled.
                    if (tile > 0) __syncthreads();
                    const int next = tile + kF.stages - 1;
                    if (thread == 0 && next < end) tma_load_kv(next);
                    // The slot's phase (tile / stages) completes when its bytes have landed.
                    fa::cuda::ptx::mbarrier_wait_parity(bar(1 + tile % kF.stages), uint32_t((tile / kF.stages) & 1));
                },
                [](int) {});
            //! [step2_loads]
        } else {
            //! [step3_roles]
            // Step 3: warpgroup 0 produces, warpgroups 1.. consume. Slot s is *full* when the TMA
            // delivered its bytes (1 arrival + bytes), *empty* when every consumer thread has
            // finished reading it (128 x consumers arrivals).
            if (thread == 0) {
                fa::cuda::ptx::mbarrier_init(bar(0), 1);
                for (int s = 0; s < kF.stages; ++s) {
                    fa::cuda::ptx::mbarrier_init(bar(1 + s), 1);
                    fa::cuda::ptx::mbarrier_init(bar(1 + kF.stages + s), 128 * kF.consumers);
                }
                fa::cuda::ptx::fence_mbarrier_init();  // the TMA unit sees the initialized barriers
            }
            __syncthreads();  // the barriers are initialized before either side uses them
            if (thread < 128) {
                fa::cuda::ptx::setmaxnreg_dec<kF.producer_registers>();  // the producer needs few registers
                if (thread == 0) {
                    tma_load_q();
                    for (int tile = 0; tile < end; ++tile) {
                        const int slot = tile % kF.stages;
                        // Round r = tile / stages refills the slot after round r-1 was consumed.
                        if (tile >= kF.stages) {
                            fa::cuda::ptx::mbarrier_wait_parity(bar(1 + kF.stages + slot), uint32_t((tile / kF.stages - 1) & 1));
                        }
                        tma_load_kv(tile);
                    }
                }
                return;  // the producer has nothing to write
            }
            fa::cuda::ptx::setmaxnreg_inc<kF.consumer_registers>();  // the consumers get the registers back
            fa::cuda::ptx::mbarrier_wait_parity(bar(0), 0);          // Q has landed
            detail::consume_tiles<T, D, Step>(
                st, q_rows, kv_ring, full, end, row_lo, a, thread,
                [&](int tile) {
                    fa::cuda::ptx::mbarrier_wait_parity(bar(1 + tile % kF.stages), uint32_t((tile / kF.stages) & 1));
                },
                [&](int tile) {
                    // This thread's wgmma on the slot have completed (wait_group 0 in consume_tile).
                    fa::cuda::ptx::mbarrier_arrive(bar(1 + kF.stages + tile % kF.stages));
                });
            //! [step3_roles]
        }
    } else if constexpr (kF.producer) {
        if (thread < 128) return;  // no key for any row: the producer has nothing to load
    }
    detail::write_output<T, D>(st, a, b, h, row_lo, ct);
}
//! [kernel]

}  // namespace fa::stage11
