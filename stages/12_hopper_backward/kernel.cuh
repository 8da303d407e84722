/// \file stages/12_hopper_backward/kernel.cuh
/// \brief Stage 12's kernels: D_i and L_i first, then one block per key block K_j, V_j that the
/// query tiles stream past by the TMA, its five products on wgmma, then dQ rounded to 16 bits.
///
/// Three kernels run one after the other on the same stream:
///
/// 1. `backward_preprocess_kernel`: per query row, \f$D_i = \sum_x dO_{ix} O_{ix}\f$ and
///    \f$L_i \log_2 e\f$ (\f$+\infty\f$ for a row that sees no key and for the padding rows, so
///    that their P is exactly 0), side by side in one float32 array the TMA reads a tile at a
///    time; the float32 dQ accumulator set to zero.
/// 2. `hopper_backward_kernel`: one block of one warpgroup (128 threads) per (key block j, batch,
///    head). K_j and V_j are loaded once by the TMA and stay in shared memory; dK_j and dV_j stay in
///    registers (wgmma accumulators). The query tiles i that see any key of the block stream past:
///    Q_i, dO_i and the tile's L and D, loaded by the TMA into a ring of slots, each completing on
///    its mbarrier. Per query tile (Bc = 64 keys, Br = 64 queries):
///
///        S^T  = K_j Q_i^T          [Bc, Br]  SS: A = K_j, B = Q_i, both K-major in shared memory
///        dP^T = V_j dO_i^T         [Bc, Br]  SS: A = V_j, B = dO_i
///        P^T  = exp2(S^T scale log2e - L_i log2e)   masked entries 0, in registers
///        dS^T = P^T o (dP^T - D_i)                  in registers
///        dV_j += P^T dO_i          [Bc, d]   RS: A = P^T from the accumulators, B = dO_i MN-major
///        dK_j += dS^T Q_i          [Bc, d]   RS: A = dS^T, B = Q_i MN-major
///        dS^T -> shared memory, as the accumulator holds it ([keys, queries])
///        dQ_i  = dS_ij K_j         [Br, d]   SS: A = dS read transposed (MN-major), B = K_j MN-major
///        dQ_i -> shared memory (float32) -> global accumulator += by one bulk reduction
///
/// 3. `backward_postprocess_kernel`: dQ = scale * accumulator, rounded to 16 bits.
///
/// Why the scores are transposed: a wgmma's A operand from registers must be the m side of the
/// product, and its B operand the n side. dV_j = P^T dO_i has the keys as m, so the accumulator
/// that becomes its A must have the keys as its rows: S^T, not S. Computed as K Q^T, the
/// accumulator of S^T *is* P^T's A fragment (the identity stage 11 uses for P V), so dV and dK take
/// P^T and dS^T straight from registers. Only dQ, whose m side is the queries, needs dS the other
/// way round: it goes through shared memory, written as it sits in registers and read by a wgmma
/// that transposes its A operand (wgmma_m64nNk16_ss_ta).
///
/// The road (launch.cuh) grows by the compile-time Features; step 1 is this kernel with one
/// warpgroup doing everything (one thread issues the TMA copies and the bulk reductions). Step 2
/// (Features::warp_roles, backward_with_warp_roles()) splits the roles: a producer warpgroup
/// whose elected thread issues every TMA copy, and two consumer warpgroups, each the tile above for
/// its own 64 of the block's 128 keys, with its own dS^T and dQ buffers and bulk reductions; ring
/// slots are freed by empty mbarriers instead of a block-wide barrier. Step 1's path is kept apart
/// (if constexpr), so its machine code is what it was.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fa/cuda/mbarrier.cuh"
#include "fa/cuda/ptx.cuh"
#include "fa/cuda/tma.cuh"
#include "fa/cuda/warpgroup.cuh"
#include "fa/cuda/wgmma.cuh"
#include "fa/cuda/wgmma_layout.hpp"
#include "fa/problem.hpp"

namespace fa::stage12 {

//! [features]
/// What a step of stage 12's road switches on. Each member is one idea of the road; a step is
/// the one before with one more (launch.cuh). Step 1 has them all at their first value.
struct Features {
    /// Slots of the ring the query tiles (Q_i, dO_i, L_i, D_i) stream through: 2 loads tile i + 1
    /// while tile i is computed; 1 loads each tile only when the previous one is done.
    int stages = 2;

    /// Warp roles (step 2): a producer warpgroup whose one elected thread issues every TMA copy,
    /// and two consumer warpgroups that only compute, 64 keys each (128 keys a block). Full and
    /// empty barriers per slot replace the block-wide barrier that freed a slot.
    bool warp_roles = false;
    int producer_registers = 24;   ///< with `warp_roles`: registers per thread the producer keeps (setmaxnreg.dec)
    int consumer_registers = 240;  ///< with `warp_roles`: registers per thread of a consumer (setmaxnreg.inc)

    /// A dQ writer (step 3): warp 1 of the producer warpgroup issues the bulk reductions. A
    /// consumer stores its dQ_i partial, arrives on its buffer's full barrier and goes on; the
    /// writer adds the buffer into global memory and, once the reduction has read it, frees it on
    /// its empty barrier. No consumer waits for a bulk group, and the deterministic mode's turns
    /// are the writer's to wait for.
    bool dq_writer = false;

    /// One dQ_i partial per block (step 4): consumer 1 adds its partial onto consumer 0's in
    /// shared memory, and the writer issues one bulk reduction per tile instead of two.
    bool shared_dq = false;

    /// The same features with a ring of `n` slots.
    constexpr Features with_ring(int n) const {
        Features f = *this;
        f.stages = n;
        return f;
    }
    /// Step 2: warp specialization. Warpgroup 0 produces (its registers given away), warpgroups
    /// 1 and 2 consume, each the backward of its own 64 keys against the same query tiles.
    constexpr Features with_warp_roles() const {
        Features f = *this;
        f.warp_roles = true;
        return f;
    }
    /// Step 3: the bulk reductions issued by a warp of their own.
    constexpr Features with_dq_writer() const {
        Features f = *this;
        f.dq_writer = true;
        return f;
    }
    /// Step 4: the two consumers' partials summed in shared memory, one reduction per tile.
    constexpr Features with_shared_dq() const {
        Features f = *this;
        f.shared_dq = true;
        return f;
    }
};
//! [features]

/// The block's shape for head dimension D and the step's features: 64 keys per consumer
/// warpgroup (the m of every wgmma but dQ's), 64 queries per streamed tile. Step 1: one warpgroup
/// that also loads. Step 2: a producer warpgroup and two consumers, 128 keys a block.
template <int D, class Step>
struct Shape {
    static constexpr Features kF = Step::value;      ///< the step's features
    static constexpr int kStages = kF.stages;        ///< slots of the query-tile ring
    static constexpr int kBr = 64;                   ///< queries per tile (Br)
    static constexpr int kBc = 64;                   ///< keys per consumer warpgroup (Bc)
    static constexpr int kConsumers = kF.warp_roles ? 2 : 1;  ///< warpgroups that compute, each its own Bc keys
    static constexpr int kBlockKeys = kBc * kConsumers;       ///< keys per block
    static constexpr int kThreads = 128 * (kConsumers + (kF.warp_roles ? 1 : 0));  ///< the producer (step 2), the consumers
    static constexpr int kKVBytes = kBc * D * 2;     ///< one consumer's K_j or V_j: D/64 swizzled boxes [Bc, 64]
    static constexpr int kQBytes = kBr * D * 2;      ///< Q_i or dO_i: D/64 swizzled boxes [Br, 64]
    static constexpr int kStatsBytes = 2 * kBr * 4;  ///< L_i log2e, then D_i: [2, Br] float32
    /// One slot: Q_i, dO_i, the statistics, rounded up so the next slot's Q starts on 1024 bytes.
    static constexpr int kSlotBytes = 2 * kQBytes + 1024;
    static constexpr int kDsBytes = kBc * kBr * 2;   ///< one consumer's dS^T [Bc, Br]: one swizzled box (Br = 64)
    static constexpr int kDqBytes = kBr * D * 4;     ///< one dQ_i partial [Br, d] in float32, row-major
    /// dQ buffers: one per consumer, or one shared (Features::shared_dq).
    static constexpr int kDqBuffers = kF.shared_dq ? 1 : kConsumers;
    /// K/V's, then per slot a full barrier (and with warp roles an empty one); with the dQ writer
    /// a full and an empty barrier per dQ buffer, and with a shared buffer the barrier on which
    /// consumer 0 hands it to consumer 1.
    static constexpr int kBarriers =
        1 + kStages * (kF.warp_roles ? 2 : 1) + (kF.dq_writer ? 2 * kDqBuffers : 0) + (kF.shared_dq ? 1 : 0);
    /// 1024 bytes to align the tiles (the swizzle's atom), K and V of every consumer, the ring,
    /// dS^T of every consumer, the dQ buffers, the barriers.
    static constexpr int kSmemBytes = 1024 + 2 * kConsumers * kKVBytes + kStages * kSlotBytes + kConsumers * kDsBytes +
                                      kDqBuffers * kDqBytes + 8 * kBarriers;
    static_assert(kStages >= 1, "the ring has at least one slot");
    static_assert(kBr == 64, "dS^T is one 64-column swizzled box, the M of dQ's wgmma");
    static_assert(kSmemBytes <= 227 * 1024, "a block's shared memory on Hopper: at most 227 KiB");
    static_assert(!kF.dq_writer || kF.warp_roles, "the dQ writer is a warp of the producer warpgroup");
    static_assert(!kF.shared_dq || kF.dq_writer, "the shared dQ buffer is handed to the writer");
    static_assert(!kF.warp_roles || 128 * kF.producer_registers + 128 * kConsumers * kF.consumer_registers <= 65536,
                  "setmaxnreg: the warpgroups' registers fit the SM's 64 K (one block per SM)");
};

/// Whether a step type asks for the deterministic order of dQ's additions (StepN<N, true>).
template <class Step, class = void>
struct DeterministicStep : std::false_type {};
/// DeterministicStep for a step type with a `deterministic` member.
template <class Step>
struct DeterministicStep<Step, std::void_t<decltype(Step::deterministic)>> : std::bool_constant<Step::deterministic> {};

/// What the main kernel reads. Tensor maps of the 16-bit inputs (boxes [64, 64], 128-byte
/// swizzle: Q and dO with Br rows, K and V with Bc rows) and of the float32 statistics; where
/// dK and dV go; the float32 dQ accumulator.
template <class T>
struct Args {
    CUtensorMap q_map;      ///< Q (B, H, Nq, d), boxes [Br, 64]; coordinates {feature, row, head, batch}
    CUtensorMap k_map;      ///< K (B, H, Nk, d), boxes [Bc, 64]
    CUtensorMap v_map;      ///< V (B, H, Nk, d), boxes [Bc, 64]
    CUtensorMap do_map;     ///< dO (B, H, Nq, d), boxes [Br, 64]
    CUtensorMap stats_map;  ///< [2 B H, Nq_padded] float32, box [2, Br]: rows 2bh (L log2e) and 2bh + 1 (D)
    T* dk;                  ///< (B, H, Nk, d), features contiguous
    T* dv;                  ///< (B, H, Nk, d), features contiguous
    int64_t dk_s[3];        ///< strides of dk: batch, head, row
    int64_t dv_s[3];        ///< strides of dv
    float* dq_accum;        ///< [B H, Nq_padded, d] float32, zeroed by the preprocessing kernel
    int heads;              ///< H
    int k_blocks;           ///< key blocks per head
    int q_tiles;            ///< query tiles per head
    int seq_q;              ///< Nq
    int seq_k;              ///< Nk
    int seq_q_padded;       ///< Nq rounded up to whole query tiles
    bool causal;            ///< bottom-right causal mask
    float scale;            ///< softmax scale (dK = scale dS^T Q)
    float scale_log2;       ///< scale log2(e)
    int* turns;             ///< deterministic mode: [B H, q_tiles] dQ_i additions done per query tile (zeroed); else nullptr
};

/// What the preprocessing kernel reads and writes.
template <class T>
struct PreprocessArgs {
    const T* o;            ///< (B, H, Nq, d), the forward's output
    const T* dout;         ///< (B, H, Nq, d), dO
    const float* lse;      ///< (B, H, Nq), the forward's natural-log LSE
    int64_t o_s[3];        ///< strides of o
    int64_t do_s[3];       ///< strides of dout
    int64_t lse_s[3];      ///< strides of lse
    float* stats;          ///< [2 B H, Nq_padded]: L log2e rows and D rows, interleaved by head
    float* dq_accum;       ///< [B H, Nq_padded, d], zeroed
    int* turns;            ///< deterministic mode: [B H, q_tiles], zeroed (one per tile of 64 rows); else nullptr
    int64_t rows;          ///< B H Nq_padded
    int heads;             ///< H
    int seq_q;             ///< Nq
    int seq_q_padded;      ///< Nq rounded up to whole query tiles
};

/// What the postprocessing kernel reads and writes.
template <class T>
struct PostprocessArgs {
    const float* dq_accum;  ///< [B H, Nq_padded, d]
    T* dq;                  ///< (B, H, Nq, d), written
    int64_t dq_s[3];        ///< strides of dq
    int64_t rows;           ///< B H Nq
    int heads;              ///< H
    int seq_q;              ///< Nq
    int seq_q_padded;       ///< Nq rounded up to whole query tiles
    float scale;            ///< dQ = scale dS K
};

//! [query_tiles]
/// The first query tile of `br` rows that key block j (`bc` keys from j bc) is visible to: 0
/// without the mask; with it, the tile of the first row r that sees key j bc (r + Nk - Nq >= j bc).
/// Later rows see more keys, so the tiles from there to the last all visit the block.
__host__ __device__ inline int first_query_tile(int j, int br, int bc, int seq_q, int seq_k, bool causal) {
    if (!causal) return 0;
    const int64_t first_row = int64_t(j) * bc + seq_q - seq_k;
    return first_row > 0 ? int(first_row / br) : 0;
}

/// Whether the tile of queries from q0 and the keys from kv0 (bc of them) holds a pair the mask
/// hides: a key past Nk, or (causal) a key the tile's first row does not see (later rows see more).
__host__ __device__ inline bool tile_needs_mask(int q0, int kv0, int bc, int seq_q, int seq_k, bool causal) {
    return visible_key_end(q0, seq_q, seq_k, causal) < int64_t(kv0) + bc;
}
//! [query_tiles]

namespace detail {

using namespace fa::cuda::ptx;
namespace wl = fa::cuda::wgmma_layout;

/// Two 16-bit values of one register widened to float32, the lower half first.
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t bits);

/// unpack2() for bf16.
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t bits) {
    __nv_bfloat162 v;
    *reinterpret_cast<uint32_t*>(&v) = bits;
    return __bfloat1622float2(v);
}

/// unpack2() for fp16.
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t bits) {
    __half2 v;
    *reinterpret_cast<uint32_t*>(&v) = bits;
    return __half22float2(v);
}

/// One thread: the TMA copies of rows [row0, row0 + kRows) of head (b, h) of `map` into `tile`
/// (D/64 swizzled boxes [kRows, 64]; rows past the end arrive as zeros), counted on `bar`.
template <int D, int kRows>
__device__ __forceinline__ void tma_load_tile(const CUtensorMap* map, unsigned char* tile, uint32_t bar, int row0, int h, int b) {
    for (int box = 0; box < D / 64; ++box) tma_load_4d(smem_address(tile + box * kRows * 128), map, bar, 64 * box, row0, h, b);
}

//! [gemms]
/// Issues acc = A B^T (not committed) for two [64, d] tiles both K-major in shared memory (SS):
/// d/16 wgmma 64 x 64 x 16. With A = K_j and B = Q_i this is S^T; with V_j and dO_i, dP^T.
template <class T, int D>
__device__ __forceinline__ void issue_transposed_scores(float (&acc)[32], uint32_t a_tile, uint32_t b_tile) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
        wgmma_m64nNk16_ss<64, T>(acc, wl::k_major_descriptor(a_tile, 64, ks), wl::k_major_descriptor(b_tile, 64, ks), ks > 0, false);
    }
}

/// Issues acc += A B (not committed): A [64 keys, Br] from registers (P^T or dS^T, packed by
/// pack_a()), B = [Br, d] of shared memory read MN-major (dO_i or Q_i: k = query, n = feature),
/// Br/16 wgmma 64 x d x 16: dV_j += P^T dO_i and dK_j += dS^T Q_i.
template <class T, int D, int kBr>
__device__ __forceinline__ void issue_key_gradient(float (&acc)[D / 2], const uint32_t (&a)[kBr / 16][4], uint32_t b_tile) {
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) wgmma_m64nNk16_rs<D, T>(acc, a[kk], wl::mn_major_descriptor(b_tile, kBr, kk), true, true);
}

/// Issues dQ_i = dS K_j (not committed): A = dS [Br, Bc] read transposed from dS^T [Bc, Br] in
/// shared memory (k = key along its rows, m = query along its columns), B = K_j [Bc, d] read
/// MN-major (k = key, n = feature), Bc/16 wgmma 64 x d x 16.
template <class T, int D, int kBc>
__device__ __forceinline__ void issue_dq(float (&acc)[D / 2], uint32_t ds_tile, uint32_t k_tile) {
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
        wgmma_m64nNk16_ss_ta<D, T>(acc, wl::mn_major_descriptor(ds_tile, kBc, kk), wl::mn_major_descriptor(k_tile, kBc, kk), kk > 0, true);
    }
}
//! [gemms]

/// A [64, 64] float32 accumulator rounded to 16 bits as the A operand of the next wgmma, k-slice
/// by k-slice (wgmma_layout::accumulator_index_for_a: the same thread holds both, no shuffle).
template <class T>
__device__ __forceinline__ void pack_a(const float (&acc)[32], uint32_t (&a)[4][4]) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) a[kk][r] = pack2<T>(acc[8 * kk + 2 * r], acc[8 * kk + 2 * r + 1]);
}

//! [probabilities]
/// P^T and dS^T in place, from S^T (`s`) and dP^T (`dp`) of keys kv0.. and queries q0.. (register
/// 4i + 2h + e of this thread: key kv0 + 16 warp + g + 8h, query q0 + 8i + 2t + e). `l2` and `delta`
/// are the tile's L log2e and D in shared memory, one per query (a column of the transposed
/// scores). kMask: each pair is compared with the query's visible end (the diagonal tiles, the
/// block's last keys past Nk).
template <bool kMask>
__device__ __forceinline__ void probabilities_and_ds(float (&s)[32], float (&dp)[32], const float* l2, const float* delta, int q0,
                                                     int key_lo, float scale_log2, int seq_q, int seq_k, bool causal, int t) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int col = 8 * i + 2 * t + e;
            const float lse2 = l2[col], d = delta[col];
            const int64_t visible = kMask ? visible_key_end(q0 + col, seq_q, seq_k, causal) : 0;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float& x = s[4 * i + 2 * h + e];
                // L = +inf (a row that sees no key, a padding row) makes P exactly 0: exp2(-inf).
                float p = ex2(fmaf(x, scale_log2, -lse2));
                if (kMask && key_lo + 8 * h >= visible) p = 0.0f;
                x = p;
                float& y = dp[4 * i + 2 * h + e];
                y = p * (y - d);
            }
        }
}
//! [probabilities]

}  // namespace detail

/// Threads per block of the pre- and postprocessing kernels.
inline constexpr int kPrePostThreads = 256;

//! [preprocess]
/// D_i and L_i log2e of every row of every head, padding rows included, and the zeroed dQ
/// accumulator. The d/8 threads of a row each read 16 bytes of O and of dO.
template <class T, int D>
__global__ void __launch_bounds__(kPrePostThreads) backward_preprocess_kernel(const PreprocessArgs<T> a) {
    constexpr int kChunks = D / 8, kRowsPerBlock = kPrePostThreads / kChunks;
    static_assert(32 % kChunks == 0, "a row's threads sit in one warp, for the shuffles");
    const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + int(threadIdx.x) / kChunks;  // in [0, B H Nq_padded)
    const int chunk = int(threadIdx.x) % kChunks;
    const bool in_range = row < a.rows;
    const int64_t bh = row / a.seq_q_padded;
    const int n = int(row % a.seq_q_padded), b = int(bh / a.heads), h = int(bh % a.heads);
    const bool real = in_range && n < a.seq_q;
    float sum = 0.0f;
    if (real) {
        const uint4 o4 = *reinterpret_cast<const uint4*>(a.o + b * a.o_s[0] + h * a.o_s[1] + n * a.o_s[2] + chunk * 8);
        const uint4 d4 = *reinterpret_cast<const uint4*>(a.dout + b * a.do_s[0] + h * a.do_s[1] + n * a.do_s[2] + chunk * 8);
        const uint32_t ov[4] = {o4.x, o4.y, o4.z, o4.w}, dv[4] = {d4.x, d4.y, d4.z, d4.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 x = detail::unpack2<T>(ov[i]), y = detail::unpack2<T>(dv[i]);
            sum = fmaf(x.x, y.x, sum);
            sum = fmaf(x.y, y.y, sum);
        }
    }
    // Every thread takes part (no early return before), so the shuffles see all kChunks lanes of the row.
#pragma unroll
    for (int offset = kChunks / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (!in_range) return;
    float4* acc = reinterpret_cast<float4*>(a.dq_accum + row * D + chunk * 8);
    acc[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    acc[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (a.turns != nullptr && chunk == 0 && n % 64 == 0) a.turns[bh * (a.seq_q_padded / 64) + n / 64] = 0;
    if (chunk == 0) {
        const float lse = real ? a.lse[b * a.lse_s[0] + h * a.lse_s[1] + n * a.lse_s[2]] : -INFINITY;
        // P = exp2(S scale log2e - L log2e): a row that sees no key has L = -inf, and +inf here
        // makes its P exactly 0 for every score.
        a.stats[(2 * bh) * a.seq_q_padded + n] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
        a.stats[(2 * bh + 1) * a.seq_q_padded + n] = sum;
    }
}
//! [preprocess]

//! [postprocess]
/// dQ = scale * accumulator, rounded to T: one thread per 16 bytes of dq (grid-stride).
template <class T, int D>
__global__ void __launch_bounds__(kPrePostThreads) backward_postprocess_kernel(const PostprocessArgs<T> a) {
    constexpr int kChunks = D / 8;
    const int64_t units = a.rows * kChunks;
    for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += int64_t(gridDim.x) * blockDim.x) {
        const int64_t row = u / kChunks;  // in [0, B H Nq)
        const int chunk = int(u % kChunks);
        const int64_t bh = row / a.seq_q;
        const int n = int(row % a.seq_q), b = int(bh / a.heads), h = int(bh % a.heads);
        const float4* src = reinterpret_cast<const float4*>(a.dq_accum + (bh * a.seq_q_padded + n) * D + chunk * 8);
        const float4 x = src[0], y = src[1];
        const float s = a.scale;
        uint4 out;
        out.x = fa::cuda::ptx::pack2<T>(x.x * s, x.y * s);
        out.y = fa::cuda::ptx::pack2<T>(x.z * s, x.w * s);
        out.z = fa::cuda::ptx::pack2<T>(y.x * s, y.y * s);
        out.w = fa::cuda::ptx::pack2<T>(y.z * s, y.w * s);
        *reinterpret_cast<uint4*>(a.dq + b * a.dq_s[0] + h * a.dq_s[1] + n * a.dq_s[2] + chunk * 8) = out;
    }
}
//! [postprocess]

//! [dq_writer]
/// The dQ writer of steps 3 and on: one elected lane of warp 1 of the producer warpgroup. For
/// every tile n of the block and every dQ buffer (consumer 1's first: the deterministic order
/// within a block), it waits until the buffer's consumer has stored tile n's partial (the
/// buffer's full barrier), adds it into global memory by one bulk reduction and, once the
/// reduction has *read* the buffer (wait_group.read), frees it on its empty barrier.
///
/// kDet, the deterministic order: the additions into query tile i of head bh happen one at a
/// time, from the last key block that visits i down to block 0 (the grid runs the key blocks in
/// that order: kDeterministic in backward_with_warp_roles). Unit u of key block j (its buffers,
/// consumer 1's first) has the turn when the tile's counter reads U (last(i) - j) + u, U the
/// buffers per block. It waits for that value with acquiring loads, adds, and passes the turn on
/// only when the reduction has *completed*: wait_group.read says the shared memory may be
/// reused, not that the adds have reached global memory; wait_group 0 (without .read) waits for
/// the writes too. The proxy fences order the bulk reduction (the asynchronous proxy) after the
/// acquiring load and before the increment (the generic proxy); __threadfence makes the increment
/// a release of everything before it at the GPU's scope.
template <class T, int D, class S, bool kDet, class Full, class Empty>
__device__ __forceinline__ void write_dq(const Args<T>& a, const float* dq_tiles, const Full& dq_full, const Empty& dq_empty,
                                         int bh, int j, int i_begin, int count) {
    using namespace fa::cuda::ptx;
    for (int n = 0; n < count; ++n) {
        const int i = i_begin + n;
        float* dst = a.dq_accum + (int64_t(bh) * a.seq_q_padded + int64_t(i) * S::kBr) * D;
        for (int u = 0; u < S::kDqBuffers; ++u) {
            const int buf = S::kDqBuffers - 1 - u;
            mbarrier_wait_parity(dq_full(buf), uint32_t(n & 1));  // tile n's partial is in the buffer
            int* turn = nullptr;
            if constexpr (kDet) {
                turn = a.turns + int64_t(bh) * a.q_tiles + i;
                const int mine = S::kDqBuffers * (last_key_block(i, S::kBr, S::kBlockKeys, a.seq_q, a.seq_k, a.k_blocks, a.causal) - j) + u;
                while (ld_global_acquire_gpu_b32(turn) != mine) __nanosleep(32);
                fence_proxy_async_global();  // the additions acquired come before this reduction's
            }
            bulk_reduce_add_f32(dst, smem_address(dq_tiles + buf * S::kBr * D), uint32_t(S::kDqBytes));
            bulk_commit_group();
            bulk_wait_group_read<0>();       // the reduction has read the buffer...
            mbarrier_arrive(dq_empty(buf));  // ...so its consumer may store the next tile's partial
            if constexpr (kDet) {
                bulk_wait_group<0>();        // ...and now it has added it into global memory
                fence_proxy_async_global();  // those writes come before the increment
                __threadfence();
                atomicAdd(turn, 1);
            }
        }
    }
    bulk_wait_group<0>();  // nothing of this block's dQ is still on its way when it exits
}
//! [dq_writer]

//! [warp_roles_kernel]
/// Step 2's block (Features::warp_roles): the backward of 128 keys K_j, V_j of one (batch, head),
/// block x being key block x % k_blocks of head x / k_blocks. Warpgroup 0 produces: one elected
/// thread loads K_j and V_j once and streams the query tiles into the ring, refilling a slot once
/// both consumers have released it on its empty barrier. Warpgroups 1 and 2 consume: consumer c
/// owns keys j 128 + 64 c and on, its own dK and dV accumulators, its own S^T, dP^T, P^T, dS^T
/// against every query tile, its own dS^T and dQ buffers in shared memory, and its own bulk
/// reductions of dQ_i. Nothing but the ring ties the two consumers together. From step 3 a warp of
/// the producer warpgroup issues the reductions (write_dq()); from step 4 the consumers share one
/// dQ buffer, consumer 1 adding its partial onto consumer 0's.
template <class T, int D, class Step>
__device__ __forceinline__ void backward_with_warp_roles(const Args<T>& a, unsigned char* smem_raw) {
    using namespace detail;
    using S = Shape<D, Step>;
    constexpr int kBr = S::kBr, kBc = S::kBc, kStages = S::kStages, kConsumers = S::kConsumers;
    constexpr Features kF = S::kF;
    constexpr bool kDeterministic = DeterministicStep<Step>::value;
    static_assert(!kDeterministic || kF.dq_writer, "the deterministic order is kept by the dQ writer (step 3 and on)");
    unsigned char* k_tiles = smem_raw + (1024u - smem_address(smem_raw) % 1024u) % 1024u;  // consumer c's K_j [Bc, d] at c kKVBytes
    unsigned char* v_tiles = k_tiles + kConsumers * S::kKVBytes;                           // consumer c's V_j [Bc, d]
    unsigned char* ring = v_tiles + kConsumers * S::kKVBytes;  // kStages x (Q_i [Br, d], dO_i [Br, d], L and D [2, Br] float32)
    unsigned char* ds_tiles = ring + kStages * S::kSlotBytes;                   // consumer c's dS^T [Bc, Br] at c kDsBytes
    float* dq_tiles = reinterpret_cast<float*>(ds_tiles + kConsumers * S::kDsBytes);  // buffer b's dQ_i [Br, d] float32 at b Br d
    uint64_t* barriers = reinterpret_cast<uint64_t*>(dq_tiles + S::kDqBuffers * kBr * D);  // K/V's; slot s's full 1 + s, empty 1 + kStages + s
    const auto bar = [&](int i) { return smem_address(barriers + i); };
    const auto full = [&](int s) { return bar(1 + s); };
    const auto empty = [&](int s) { return bar(1 + kStages + s); };
    const auto slot_q = [&](int s) { return ring + s * S::kSlotBytes; };
    const auto slot_do = [&](int s) { return ring + s * S::kSlotBytes + S::kQBytes; };
    const auto slot_stats = [&](int s) { return reinterpret_cast<const float*>(ring + s * S::kSlotBytes + 2 * S::kQBytes); };
    // With the dQ writer: buffer b's full and empty barriers, then (shared buffer) the handoff
    // from consumer 0 to consumer 1.
    const auto dq_full = [&](int b) { return bar(1 + 2 * kStages + b); };
    const auto dq_empty = [&](int b) { return bar(1 + 2 * kStages + S::kDqBuffers + b); };
    const auto dq_handoff = [&] { return bar(1 + 2 * kStages + 2 * S::kDqBuffers); };

    // The deterministic order runs the key blocks of a head from the last one down (write_dq()).
    const int jb = int(blockIdx.x % unsigned(a.k_blocks)), bh = int(blockIdx.x / unsigned(a.k_blocks));
    const int j = kDeterministic ? a.k_blocks - 1 - jb : jb;
    const int b = bh / a.heads, h = bh % a.heads, kv0 = j * S::kBlockKeys;
    const int thread = int(threadIdx.x);
    // The tiles that see any key of the block: those that see its first key, consumer 0's. Consumer
    // 1's keys come later, so a tile or two at the start may see none of them: its mask zeroes them.
    const int i_begin = first_query_tile(j, kBr, S::kBlockKeys, a.seq_q, a.seq_k, a.causal);
    const int count = a.q_tiles - i_begin;

    //! [roles]
    if (count > 0 && thread == 0) {
        mbarrier_init(bar(0), 1);  // one arrival (the thread that announces the bytes), then the bytes
        for (int s = 0; s < kStages; ++s) {
            mbarrier_init(full(s), 1);                   // the producer's arrival, then the slot's bytes
            mbarrier_init(empty(s), 128 * kConsumers);   // every consumer thread, once it has read the slot
        }
        if constexpr (kF.dq_writer) {
            for (int b2 = 0; b2 < S::kDqBuffers; ++b2) {
                mbarrier_init(dq_full(b2), 128);  // the threads of the consumer that stores the buffer last
                mbarrier_init(dq_empty(b2), 1);   // the writer, once its reduction has read the buffer
            }
            if constexpr (kF.shared_dq) mbarrier_init(dq_handoff(), 128);  // consumer 0's threads
        }
        fence_mbarrier_init();  // the TMA unit sees the initialized barriers
    }
    __syncthreads();  // every thread sees the barriers initialized before it waits on them (the last block-wide barrier)

    if (warpgroup_index() == 0) {  // the producer warpgroup
        setmaxnreg_dec<kF.producer_registers>();  // it needs few registers: the consumers take them
        //! [producer]
        if (count > 0 && thread / 32 == 0 && elect_one_sync()) {
            mbarrier_arrive_expect_tx(bar(0), 2 * kConsumers * S::kKVBytes);  // K_j and V_j of both consumers, loaded once
            for (int c = 0; c < kConsumers; ++c) {
                // Keys past Nk arrive as zeros (the TMA fills what lies outside the tensor, and counts its bytes).
                tma_load_tile<D, kBc>(&a.k_map, k_tiles + c * S::kKVBytes, bar(0), kv0 + c * kBc, h, b);
                tma_load_tile<D, kBc>(&a.v_map, v_tiles + c * S::kKVBytes, bar(0), kv0 + c * kBc, h, b);
            }
            for (int n = 0; n < count; ++n) {
                const int s = n % kStages, q0 = (i_begin + n) * kBr;
                // Round n / kStages of slot s may begin once round n / kStages - 1 has been read by
                // every consumer thread: that round's phase of the empty barrier, parity (n / kStages - 1) % 2.
                if (n >= kStages) mbarrier_wait_parity(empty(s), uint32_t((n / kStages - 1) & 1));
                mbarrier_arrive_expect_tx(full(s), 2 * S::kQBytes + S::kStatsBytes);  // Q_i, dO_i, L and D
                tma_load_tile<D, kBr>(&a.q_map, slot_q(s), full(s), q0, h, b);
                tma_load_tile<D, kBr>(&a.do_map, slot_do(s), full(s), q0, h, b);
                tma_load_2d(smem_address(slot_stats(s)), &a.stats_map, full(s), q0, 2 * bh);
            }
        }
        //! [producer]
        if constexpr (kF.dq_writer) {
            if (count > 0 && thread / 32 == 1 && elect_one_sync()) {
                write_dq<T, D, S, kDeterministic>(a, dq_tiles, dq_full, dq_empty, bh, j, i_begin, count);
            }
        }
        return;  // the producer writes nothing itself; its loads complete on barriers the consumers wait for
    }
    setmaxnreg_inc<kF.consumer_registers>();  // the consumers get the registers
    //! [roles]

    const int c = thread / 128 - 1, ct = thread % 128, warp = ct / 32, g = ct % 32 / 4, t = ct % 4;
    const int kv0c = kv0 + c * kBc;             // this consumer's first key
    const int key_lo = kv0c + 16 * warp + g;    // this thread's key rows: key_lo and key_lo + 8
    const uint32_t consumer_bar = uint32_t(1 + c);  // named barrier of this consumer's 128 threads (0 is __syncthreads')
    unsigned char* ds_tile = ds_tiles + c * S::kDsBytes;
    float* dq_tile = dq_tiles + c * kBr * D;
    float dv[D / 2], dk[D / 2];  // dV, dK of rows key_lo, key_lo + 8 in the accumulator layout
#pragma unroll
    for (int x = 0; x < D / 2; ++x) dv[x] = dk[x] = 0.0f;

    if (count > 0) {
        const uint32_t k_addr = smem_address(k_tiles + c * S::kKVBytes), v_addr = smem_address(v_tiles + c * S::kKVBytes);
        const uint32_t ds_addr = smem_address(ds_tile);
        mbarrier_wait_parity(bar(0), 0);  // K_j and V_j have landed
        //! [consumer_tile]
        for (int n = 0; n < count; ++n) {
            const int s = n % kStages, q0 = (i_begin + n) * kBr;
            // No barrier at the top of the tile: the slot is the producer's to refill only after the
            // empty barrier, and dS^T and dQ's buffer of tile n - 1 were last read before this
            // consumer's last barrier of tile n - 1 (see below), which every thread has passed.
            mbarrier_wait_parity(full(s), uint32_t((n / kStages) & 1));  // the slot's round n / kStages has landed
            const uint32_t q_addr = smem_address(slot_q(s)), do_addr = smem_address(slot_do(s));
            float st[32], dpt[32];  // S^T, then P^T; dP^T, then dS^T: [Bc, Br], keys along the rows
            wgmma_fence();          // st and dpt are free for the wgmma to write
            issue_transposed_scores<T, D>(st, k_addr, q_addr);
            issue_transposed_scores<T, D>(dpt, v_addr, do_addr);
            wgmma_commit_group();
            wgmma_wait_group<0>();  // S^T and dP^T are in registers
            warpgroup_fence_operands(st);
            warpgroup_fence_operands(dpt);
            const float* l2 = slot_stats(s);
            if (tile_needs_mask(q0, kv0c, kBc, a.seq_q, a.seq_k, a.causal)) {
                probabilities_and_ds<true>(st, dpt, l2, l2 + kBr, q0, key_lo, a.scale_log2, a.seq_q, a.seq_k, a.causal, t);
            } else {
                probabilities_and_ds<false>(st, dpt, l2, l2 + kBr, q0, key_lo, a.scale_log2, a.seq_q, a.seq_k, a.causal, t);
            }
            uint32_t p_a[4][4], ds_a[4][4];  // P^T and dS^T rounded to T, as A operands (k-slices of 16 queries)
            pack_a<T>(st, p_a);
            pack_a<T>(dpt, ds_a);
            // dS^T to this consumer's buffer as the accumulator holds it (see step 1's tile).
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int row = 16 * warp + g + 8 * (r % 2), col = 16 * kk + 8 * (r / 2) + 2 * t;
                    *reinterpret_cast<uint32_t*>(ds_tile + wl::swizzle128_offset(row, col)) = ds_a[kk][r];
                }
            wgmma_fence();  // p_a and ds_a were written by ordinary instructions
            issue_key_gradient<T, D, kBr>(dv, p_a, do_addr);
            issue_key_gradient<T, D, kBr>(dk, ds_a, q_addr);
            wgmma_commit_group();
            wgmma_wait_group<0>();  // dV and dK are in registers; p_a and ds_a are free
            warpgroup_fence_operands(dv);
            warpgroup_fence_operands(dk);
            // This thread is done with the slot: its L and D were read by plain loads, its Q_i and
            // dO_i by the wgmma just waited for (dQ reads only dS^T and K_j). When all 256 consumer
            // threads have arrived, the producer may refill it.
            mbarrier_arrive(empty(s));
            fence_proxy_async();  // this thread's plain stores of dS^T become visible to the wgmma's reads
            //! [consumer_tile]
            if constexpr (kF.dq_writer) {
                //! [dq_to_writer]
                named_barrier_sync(consumer_bar, 128);  // this consumer's dS^T is written
                float dq[D / 2];
                wgmma_fence();  // dq is free for the wgmma to write
                issue_dq<T, D, kBc>(dq, ds_addr, k_addr);
                wgmma_commit_group();
                wgmma_wait_group<0>();  // this consumer's part of dQ_i is in registers; dS^T is no longer read
                warpgroup_fence_operands(dq);
                // Every thread of this consumer has waited for the wgmma that read dS^T: from here
                // on tile n + 1 may rewrite it.
                named_barrier_sync(consumer_bar, 128);
                const int buf = kF.shared_dq ? 0 : c;
                float* dq_buf = dq_tiles + buf * kBr * D;
                const bool adds = kF.shared_dq && c == 1;  // consumer 1 adds onto consumer 0's partial
                if (adds) {
                    mbarrier_wait_parity(dq_handoff(), uint32_t(n & 1));  // consumer 0's partial of tile n is stored
                } else if (n > 0) {
                    mbarrier_wait_parity(dq_empty(buf), uint32_t((n - 1) & 1));  // the writer has read tile n - 1's
                }
#pragma unroll
                for (int i = 0; i < D / 8; ++i)
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        const int row = 16 * warp + g + 8 * hh;
                        float* at = dq_buf + row * D + 8 * i + 2 * t;
                        if (adds) {  // the same thread of consumer 0 stored these two floats: same layout
                            atomicAdd(at, dq[4 * i + 2 * hh]);  // no value returned: a reduction, no register
                            atomicAdd(at + 1, dq[4 * i + 2 * hh + 1]);
                        } else {
                            *reinterpret_cast<float2*>(at) = make_float2(dq[4 * i + 2 * hh], dq[4 * i + 2 * hh + 1]);
                        }
                    }
                fence_proxy_async();  // the plain stores of dQ_i become visible to the bulk reduction
                if (kF.shared_dq && c == 0) {
                    mbarrier_arrive(dq_handoff());  // consumer 1 adds its partial next
                } else {
                    mbarrier_arrive(dq_full(buf));  // the writer takes the buffer
                }
                //! [dq_to_writer]
            } else {
                //! [dq_per_consumer]
                // This consumer's reduction of tile n - 1 has *read* its dQ buffer (not necessarily added it yet).
                if (ct == 0) bulk_wait_group_read<0>();
                named_barrier_sync(consumer_bar, 128);  // this consumer's dS^T is written; its dQ buffer may be overwritten
                float dq[D / 2];
                wgmma_fence();  // dq is free for the wgmma to write
                issue_dq<T, D, kBc>(dq, ds_addr, k_addr);
                wgmma_commit_group();
                wgmma_wait_group<0>();  // this consumer's part of dQ_i (its 64 keys) is in registers; dS^T is no longer read
                warpgroup_fence_operands(dq);
    #pragma unroll
                for (int i = 0; i < D / 8; ++i)
    #pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        const int row = 16 * warp + g + 8 * hh;
                        *reinterpret_cast<float2*>(dq_tile + row * D + 8 * i + 2 * t) = make_float2(dq[4 * i + 2 * hh], dq[4 * i + 2 * hh + 1]);
                    }
                fence_proxy_async();  // the plain stores of dQ_i become visible to the bulk reduction
                // Every thread of this consumer has stored its part of dQ_i, and so has waited for the
                // wgmma that read dS^T: from here on tile n + 1 may rewrite dS^T.
                named_barrier_sync(consumer_bar, 128);
                if (ct == 0) {
                    // Each consumer adds its own partial, so the two add into the same rows, each float
                    // atomically: summing them in shared memory first would save half the reductions but
                    // make each consumer wait for the other at every tile, the coupling the warp roles remove.
                    bulk_reduce_add_f32(a.dq_accum + (int64_t(bh) * a.seq_q_padded + q0) * D, smem_address(dq_tile), uint32_t(S::kDqBytes));
                    bulk_commit_group();
                }
                //! [dq_per_consumer]
            }
        }
        // This consumer's last reductions have read their source and added it into global memory
        // (wait_group, not wait_group.read), before the block exits (step 2; from step 3 the writer's).
        if constexpr (!kF.dq_writer) {
            if (ct == 0) bulk_wait_group<0>();
        }
    }

    // dK = scale dS^T Q and dV of this consumer's rows key_lo and key_lo + 8; keys past Nk skipped.
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int key = key_lo + 8 * hh;
        if (key >= a.seq_k) continue;
        T* dk_row = a.dk + b * a.dk_s[0] + h * a.dk_s[1] + int64_t(key) * a.dk_s[2];
        T* dv_row = a.dv + b * a.dv_s[0] + h * a.dv_s[1] + int64_t(key) * a.dv_s[2];
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
            *reinterpret_cast<uint32_t*>(dk_row + 8 * i + 2 * t) = pack2<T>(dk[4 * i + 2 * hh] * a.scale, dk[4 * i + 2 * hh + 1] * a.scale);
            *reinterpret_cast<uint32_t*>(dv_row + 8 * i + 2 * t) = pack2<T>(dv[4 * i + 2 * hh], dv[4 * i + 2 * hh + 1]);
        }
    }
}
//! [warp_roles_kernel]

//! [kernel]
/// The backward of one key block K_j, V_j of one (batch, head): block x is key block x % k_blocks
/// of head x / k_blocks. Writes dK_j and dV_j, and adds every visited query tile's dQ_i into the
/// float32 accumulator.
template <class T, int D, class Step>
__global__ void __launch_bounds__(Shape<D, Step>::kThreads, 1) hopper_backward_kernel(const __grid_constant__ Args<T> a) {
    using namespace detail;
    using S = Shape<D, Step>;
    extern __shared__ unsigned char smem_raw[];
    if constexpr (S::kF.warp_roles) {
        backward_with_warp_roles<T, D, Step>(a, smem_raw);  // step 2
    } else {  // step 1: one warpgroup does everything
        constexpr int kBr = S::kBr, kBc = S::kBc, kStages = S::kStages;
        unsigned char* k_tile = smem_raw + (1024u - smem_address(smem_raw) % 1024u) % 1024u;  // K_j [Bc, d]: d/64 boxes [Bc, 64]
        unsigned char* v_tile = k_tile + S::kKVBytes;                                         // V_j [Bc, d]
        unsigned char* ring = v_tile + S::kKVBytes;  // kStages x (Q_i [Br, d], dO_i [Br, d], L and D [2, Br] float32)
        unsigned char* ds_tile = ring + kStages * S::kSlotBytes;                       // dS^T [Bc, Br], one swizzled box
        float* dq_tile = reinterpret_cast<float*>(ds_tile + S::kDsBytes);              // dQ_i [Br, d] float32, row-major
        uint64_t* barriers = reinterpret_cast<uint64_t*>(dq_tile + kBr * D);           // K/V's, then slot s's full: 1 + s
        const auto bar = [&](int i) { return smem_address(barriers + i); };
        const auto slot_q = [&](int s) { return ring + s * S::kSlotBytes; };
        const auto slot_do = [&](int s) { return ring + s * S::kSlotBytes + S::kQBytes; };
        const auto slot_stats = [&](int s) { return reinterpret_cast<const float*>(ring + s * S::kSlotBytes + 2 * S::kQBytes); };

        const int j = int(blockIdx.x % unsigned(a.k_blocks)), bh = int(blockIdx.x / unsigned(a.k_blocks));
        const int b = bh / a.heads, h = bh % a.heads, kv0 = j * kBc;
        const int thread = int(threadIdx.x), warp = thread / 32, g = thread % 32 / 4, t = thread % 4;
        const int key_lo = kv0 + 16 * warp + g;  // this thread's key rows: key_lo and key_lo + 8
        const int i_begin = first_query_tile(j, kBr, kBc, a.seq_q, a.seq_k, a.causal);
        const int count = a.q_tiles - i_begin;  // query tiles that visit this key block

        float dv[D / 2], dk[D / 2];  // dV_j, dK_j rows key_lo, key_lo + 8 in the accumulator layout
#pragma unroll
        for (int x = 0; x < D / 2; ++x) dv[x] = dk[x] = 0.0f;

        if (count > 0) {
            //! [ring]
            if (thread == 0) {
                mbarrier_init(bar(0), 1);  // one arrival (the thread that announces the bytes), then the bytes
                for (int s = 0; s < kStages; ++s) mbarrier_init(bar(1 + s), 1);
                fence_mbarrier_init();  // the TMA unit sees the initialized barriers
            }
            __syncthreads();  // every thread sees the barriers initialized before it waits on them
            // One thread hands tile n (query tile i_begin + n) to the TMA: slot n % kStages, on its full barrier.
            const auto load_query_tile = [&](int n) {
                const int s = n % kStages, q0 = (i_begin + n) * kBr;
                mbarrier_arrive_expect_tx(bar(1 + s), 2 * S::kQBytes + S::kStatsBytes);  // Q_i, dO_i, L and D
                tma_load_tile<D, kBr>(&a.q_map, slot_q(s), bar(1 + s), q0, h, b);
                tma_load_tile<D, kBr>(&a.do_map, slot_do(s), bar(1 + s), q0, h, b);
                tma_load_2d(smem_address(slot_stats(s)), &a.stats_map, bar(1 + s), q0, 2 * bh);
            };
            if (thread == 0) {
                mbarrier_arrive_expect_tx(bar(0), 2 * S::kKVBytes);  // K_j and V_j, loaded once
                tma_load_tile<D, kBc>(&a.k_map, k_tile, bar(0), kv0, h, b);
                tma_load_tile<D, kBc>(&a.v_map, v_tile, bar(0), kv0, h, b);
                for (int n = 0; n < kStages - 1 && n < count; ++n) load_query_tile(n);
            }
            mbarrier_wait_parity(bar(0), 0);  // K_j and V_j have landed
            const uint32_t k_addr = smem_address(k_tile), v_addr = smem_address(v_tile), ds_addr = smem_address(ds_tile);
            for (int n = 0; n < count; ++n) {
                const int s = n % kStages, q0 = (i_begin + n) * kBr;
                // Every thread has finished tile n - 1 (its wgmma waited): its slot, dS^T and dQ's buffer are free.
                if (n > 0) __syncthreads();
                if (thread == 0 && n + kStages - 1 < count) load_query_tile(n + kStages - 1);
                mbarrier_wait_parity(bar(1 + s), uint32_t((n / kStages) & 1));  // the slot's round n / kStages has landed
                //! [ring]
                //! [tile]
                const uint32_t q_addr = smem_address(slot_q(s)), do_addr = smem_address(slot_do(s));
                float st[32], dpt[32];  // S^T, then P^T; dP^T, then dS^T: [Bc, Br], keys along the rows
                wgmma_fence();          // st and dpt are free for the wgmma to write
                issue_transposed_scores<T, D>(st, k_addr, q_addr);
                issue_transposed_scores<T, D>(dpt, v_addr, do_addr);
                wgmma_commit_group();
                wgmma_wait_group<0>();  // S^T and dP^T are in registers
                warpgroup_fence_operands(st);
                warpgroup_fence_operands(dpt);
                const float* l2 = slot_stats(s);
                if (tile_needs_mask(q0, kv0, kBc, a.seq_q, a.seq_k, a.causal)) {
                    probabilities_and_ds<true>(st, dpt, l2, l2 + kBr, q0, key_lo, a.scale_log2, a.seq_q, a.seq_k, a.causal, t);
                } else {
                    probabilities_and_ds<false>(st, dpt, l2, l2 + kBr, q0, key_lo, a.scale_log2, a.seq_q, a.seq_k, a.causal, t);
                }
                uint32_t p_a[4][4], ds_a[4][4];  // P^T and dS^T rounded to T, as A operands (k-slices of 16 queries)
                pack_a<T>(st, p_a);
                pack_a<T>(dpt, ds_a);
                // dS^T to shared memory as the accumulator holds it: word r of k-slice kk is keys
                // 16 warp + g + 8 (r % 2), queries 16 kk + 8 (r / 2) + 2t and one more, in the 128-byte swizzle.
#pragma unroll
                for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                    for (int r = 0; r < 4; ++r) {
                        const int row = 16 * warp + g + 8 * (r % 2), col = 16 * kk + 8 * (r / 2) + 2 * t;
                        *reinterpret_cast<uint32_t*>(ds_tile + wl::swizzle128_offset(row, col)) = ds_a[kk][r];
                    }
                wgmma_fence();  // p_a and ds_a were written by ordinary instructions
                issue_key_gradient<T, D, kBr>(dv, p_a, do_addr);
                issue_key_gradient<T, D, kBr>(dk, ds_a, q_addr);
                wgmma_commit_group();
                wgmma_wait_group<0>();  // dV_j and dK_j are in registers; p_a and ds_a are free
                warpgroup_fence_operands(dv);
                warpgroup_fence_operands(dk);
                fence_proxy_async();  // this thread's plain stores of dS^T become visible to the wgmma's reads
                //! [dq_reduction]
                // The bulk reduction of tile n - 1 has *read* dQ's buffer (not necessarily added it yet).
                if (thread == 0) bulk_wait_group_read<0>();
                __syncthreads();  // every thread's part of dS^T is written; dQ's buffer may be overwritten
                float dq[D / 2];
                wgmma_fence();  // dq is free for the wgmma to write
                issue_dq<T, D, kBc>(dq, ds_addr, k_addr);
                wgmma_commit_group();
                wgmma_wait_group<0>();  // dQ_i's partial is in registers; dS^T is no longer read
                warpgroup_fence_operands(dq);
                // Rows 16 warp + g + 8hh of the tile, two columns per 8, float32.
#pragma unroll
                for (int i = 0; i < D / 8; ++i)
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        const int row = 16 * warp + g + 8 * hh;
                        *reinterpret_cast<float2*>(dq_tile + row * D + 8 * i + 2 * t) =
                            make_float2(dq[4 * i + 2 * hh], dq[4 * i + 2 * hh + 1]);
                    }
                fence_proxy_async();  // the plain stores of dQ_i become visible to the bulk reduction
                __syncthreads();      // every thread's part of dQ_i is in shared memory
                if (thread == 0) {
                    // The tile's rows are contiguous in the accumulator ([Br, d] floats from row q0 of
                    // head bh): one reduction adds them all, each float atomically.
                    bulk_reduce_add_f32(a.dq_accum + (int64_t(bh) * a.seq_q_padded + q0) * D, smem_address(dq_tile), uint32_t(S::kDqBytes));
                    bulk_commit_group();
                }
                //! [dq_reduction]
                //! [tile]
            }
            // The block's last reductions have read their source and added it into global memory
            // (wait_group, not wait_group.read): nothing of this block's dQ is still on its way when it
            // exits, before the postprocessing kernel reads the accumulator.
            if (thread == 0) bulk_wait_group<0>();
        }

        //! [epilogue]
        // dK_j = scale dS^T Q and dV_j, rows key_lo and key_lo + 8, 4 bytes a lane per 8 columns; keys past Nk skipped.
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int key = key_lo + 8 * hh;
            if (key >= a.seq_k) continue;
            T* dk_row = a.dk + b * a.dk_s[0] + h * a.dk_s[1] + int64_t(key) * a.dk_s[2];
            T* dv_row = a.dv + b * a.dv_s[0] + h * a.dv_s[1] + int64_t(key) * a.dv_s[2];
#pragma unroll
            for (int i = 0; i < D / 8; ++i) {
                *reinterpret_cast<uint32_t*>(dk_row + 8 * i + 2 * t) =
                    pack2<T>(dk[4 * i + 2 * hh] * a.scale, dk[4 * i + 2 * hh + 1] * a.scale);
                *reinterpret_cast<uint32_t*>(dv_row + 8 * i + 2 * t) = pack2<T>(dv[4 * i + 2 * hh], dv[4 * i + 2 * hh + 1]);
            }
        }
        //! [epilogue]
    }
}
//! [kernel]

}  // namespace fa::stage12
