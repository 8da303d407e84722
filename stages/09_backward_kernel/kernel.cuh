/// \file stages/09_backward_kernel/kernel.cuh
/// \brief Stage 09's kernels: D_i and the dQ accumulator first, then one block per key block
/// K_j, V_j streaming the query blocks past it, then dQ rounded to 16 bits.
///
/// Three kernels (four with the group split) run one after the other on the same stream:
///
/// 1. `backward_preprocess_kernel`: \f$D_i = \sum_x dO_{ix} O_{ix}\f$ in float32 for every query
///    row, \f$L_i \log_2 e\f$ (the LSE in the base the exp2 trick needs; \f$+\infty\f$ for a row
///    that sees no key, so that its P is exactly 0), the float32 dQ accumulator set to zero and,
///    for the deterministic mode, the turn counters set to zero. The three per-row arrays are
///    padded to a whole number of query blocks, so the main kernel copies them without bounds.
/// 2. `flash_backward_kernel`: one thread block per (key block j, batch, head). It keeps K_j and
///    V_j in shared memory and dK_j, dV_j in registers, and loops over the query blocks i that
///    see any key of block j (FlashAttention-2's loop order: dK_j and dV_j are sums over query
///    rows, so they finish in the block; only dQ is shared between blocks). Per query block:
///
///        S^T  = K_w Q_i^T                 [16 keys, Br]  per warp, A = K_w, B = Q_i (ldmatrix)
///        P^T  = exp2(S^T scale log2e - L_i log2e)        float32, masked entries 0
///        dP^T = V_w dO_i^T                [16 keys, Br]  A = V_w, B = dO_i (ldmatrix)
///        dS^T = P^T o (dP^T - D_i)                       float32
///        dV_w += P^T dO_i                 [16 keys, d]   A = P^T from the accumulators, B = dO_i (.trans)
///        dK_w += dS^T Q_i                 [16 keys, d]   A = dS^T from the accumulators, B = Q_i (.trans)
///        dS^T -> shared memory; barrier; dQ_i += dS K_j  [Br, d] split over the warps,
///                                         A = dS (ldmatrix.trans of dS^T), B = K_j (.trans)
///                                         then added into the float32 accumulator in global memory
///
///    Each warp owns 16 keys of the block from start to end, so S^T, P^T, dP^T and dS^T of those
///    keys live in its registers and dK_w, dV_w never leave them until the end. The query blocks
///    stream through a double-buffered cp.async pipeline: block i+1 loads while block i is
///    computed. dQ_i needs dS across all the block's keys (all warps), hence the one trip
///    through shared memory per query block.
/// 3. `backward_postprocess_kernel`: dQ = scale * accumulator, rounded to 16 bits.
/// 4. With grouped-query heads split over S > 1 blocks per group (the group split, atomic dQ
///    only), `backward_dkdv_reduce_kernel`: dK and dV = the sums of the S blocks' float32
///    partials, added in a fixed order and rounded to 16 bits.
///
/// The dQ additions of different key blocks to the same rows race. By default they are float32
/// atomic additions (`red.global.add`), whose order, and so whose rounding, changes from run to
/// run. The deterministic mode orders them: per (batch, head, query block i) a counter holds
/// how many key blocks have added their dQ_i; the key blocks take their turns from the last one
/// down (the grid runs them in that order too), so key block j waits until the counter reads the
/// number of key blocks after j that visit i, adds with the same `red`, publishes, and increments it.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "fa/cuda/layouts.hpp"
#include "fa/cuda/ptx.cuh"
#include "fa/cuda/tile_copy.cuh"
#include "fa/problem.hpp"
#include "fa/varlen.hpp"

namespace fa::stage09 {

//! [features]
/// The compile-time shape of the main kernel. `Features<...>` is a type so that a kernel
/// template can take it (CUDA sources are C++17: no class-type template parameters).
template <int Br, int Warps, int Bn, bool KVInRegisters, int MinBlocksPerSm = 1>
struct Features {
    static constexpr int kBr = Br;        ///< query rows per query block Q_i, dO_i, dQ_i
    static constexpr int kWarps = Warps;  ///< warps per block; each owns 16 keys of K_j, V_j
    static constexpr int kBc = 16 * Warps;  ///< keys per key block K_j, V_j, dK_j, dV_j
    /// query columns of S^T per step: a query block is consumed kBn columns at a time, so the
    /// registers of S^T, dP^T and their 16-bit copies follow Bn while the barriers follow Br
    static constexpr int kBn = Bn;
    /// K_w and V_w as A fragments loaded into registers once (true), or re-read from shared
    /// memory for every step (false): d/2 registers per thread for the two, too many at d = 128
    static constexpr bool kKVInRegisters = KVInRegisters;
    /// blocks that must fit on one SM at once: caps the registers per thread at 65536 / (threads x this)
    static constexpr int kMinBlocksPerSm = MinBlocksPerSm;
    static_assert(Br % Bn == 0 && Bn % 16 == 0, "a query block holds whole steps of 16-column k-steps");
    static_assert(Br % 16 == 0 && Warps % (Br / 16) == 0,
                  "the dQ products split the query block's 16-row tiles evenly over the warps");
};
//! [features]

//! [model_features]
/// Features F with stage 10's switches: grouped-query heads (a block per K/V head that visits the
/// query heads of its group, query head h reading K/V head h / (Hq/Hk) in place), a sliding window
/// of keys and the soft cap. A wrapper, as stage 07's ModelFeatures, so that every kernel without
/// the switches keeps its type, its name and its machine code. Only the warp-tiled kernel takes it.
template <class F, bool GroupedHeads, bool Window, bool Softcap>
struct ModelFeatures : F {
    static constexpr bool kGroupedHeads = GroupedHeads;  ///< Hq / Hk query heads per K/V head
    static constexpr bool kWindow = Window;              ///< keys seen through a window (left, right)
    static constexpr bool kSoftcap = Softcap;            ///< scores squashed by c tanh(s / c)
};

/// Whether F has grouped-query heads (ModelFeatures); false for every plain Features.
template <class F, class = void>
inline constexpr bool kGroupedHeads = false;
/// kGroupedHeads for features that say.
template <class F>
inline constexpr bool kGroupedHeads<F, std::void_t<decltype(F::kGroupedHeads)>> = F::kGroupedHeads;
/// Whether F sees keys through a sliding window (ModelFeatures).
template <class F, class = void>
inline constexpr bool kWindow = false;
/// kWindow for features that say.
template <class F>
inline constexpr bool kWindow<F, std::void_t<decltype(F::kWindow)>> = F::kWindow;
/// Whether F caps the scores (ModelFeatures).
template <class F, class = void>
inline constexpr bool kSoftcap = false;
/// kSoftcap for features that say.
template <class F>
inline constexpr bool kSoftcap<F, std::void_t<decltype(F::kSoftcap)>> = F::kSoftcap;

/// Features F on a packed batch of sequences of different lengths (stage 07's Packed, cu_seqlens):
/// each block takes (sequence, key block) from a schedule the host builds and sees that sequence
/// alone, as a batch of one. A wrapper too, for the same reason.
template <class F>
struct Packed : F {
    static constexpr bool kVarlen = true;  ///< a packed batch
};
/// Whether F runs on a packed batch (Packed).
template <class F, class = void>
inline constexpr bool kPacked = false;
/// kPacked of a Packed<...>.
template <class F>
inline constexpr bool kPacked<F, std::void_t<decltype(F::kVarlen)>> = F::kVarlen;

/// Features F with dropout on P (stage 07's Dropped): the mask regenerated from stage 07's map
/// (fa/philox.hpp), the dropped P~ feeding dV, the undropped P dS. A wrapper too, for the same
/// reason. Only the warp-tiled kernel with stage 10's other switches takes it (launch.cuh).
template <class F>
struct Dropped : F {
    static constexpr bool kDropout = true;  ///< entries of P dropped at random
};
/// Whether F applies dropout (Dropped).
template <class F, class = void>
inline constexpr bool kDropout = false;
/// kDropout of a Dropped<...>.
template <class F>
inline constexpr bool kDropout<F, std::void_t<decltype(F::kDropout)>> = F::kDropout;
//! [model_features]

/// Pointers, strides (in elements) and sizes the main kernel reads; built by the host entry point.
template <class T>
struct Args {
    const T* q;     ///< (B, H, Nq, d): row n of head (b, h) starts at q + b*q_sb + h*q_sh + n*q_sn
    const T* k;     ///< (B, H, Nk, d)
    const T* v;     ///< (B, H, Nk, d)
    const T* dout;  ///< (B, H, Nq, d): dO
    T* dk;          ///< (B, H, Nk, d), written
    T* dv;          ///< (B, H, Nk, d), written
    /// [B*H, seq_q_padded] \f$L_i \log_2 e\f$, \f$+\infty\f$ for rows that see no key and padding rows
    const float* lse_log2;
    const float* delta;  ///< [B*H, seq_q_padded] \f$D_i\f$, 0 for padding rows
    float* dq_accum;     ///< [B*H, seq_q_padded, d] float32 sum of dS K over the key blocks (unscaled)
    int* turns;          ///< [B*H, q_blocks] deterministic mode: key blocks that have added their dQ_i
    int64_t q_sb;    ///< batch stride of q (the feature stride of every tensor is 1)
    int64_t q_sh;    ///< head stride of q
    int64_t q_sn;    ///< row stride of q
    int64_t k_sb;    ///< batch stride of k
    int64_t k_sh;    ///< head stride of k
    int64_t k_sn;    ///< row stride of k
    int64_t v_sb;    ///< batch stride of v
    int64_t v_sh;    ///< head stride of v
    int64_t v_sn;    ///< row stride of v
    int64_t do_sb;   ///< batch stride of dout
    int64_t do_sh;   ///< head stride of dout
    int64_t do_sn;   ///< row stride of dout
    int64_t dk_sb;   ///< batch stride of dk
    int64_t dk_sh;   ///< head stride of dk
    int64_t dk_sn;   ///< row stride of dk
    int64_t dv_sb;   ///< batch stride of dv
    int64_t dv_sh;   ///< head stride of dv
    int64_t dv_sn;   ///< row stride of dv
    int heads;         ///< H
    int seq_q;         ///< Nq
    int seq_k;         ///< Nk
    int seq_q_padded;  ///< Nq rounded up to a whole number of query blocks (q_blocks * Br)
    int q_blocks;      ///< Tr = ceil(Nq / Br)
    int k_blocks;      ///< Tc = ceil(Nk / Bc)
    bool causal;       ///< bottom-right aligned causal mask
    float scale;       ///< softmax scale, signed (dK and dQ are scaled by it)
    float scale_log2;  ///< softmax scale * log2(e), signed (kSoftcap: log2(e), the capped scores are scaled already)
    // Stage 10's fields, read only by kernels that switch the feature on (appended, so that the
    // fields above keep their offsets and the kernels without these switches their machine code).
    int kv_group;      ///< kGroupedHeads: Hq / Hk, query heads per K/V head (heads above is Hq)
    int window_left;   ///< kWindow: keys before the diagonal a query sees; -1 all
    int window_right;  ///< kWindow: keys after the diagonal a query sees; -1 all, 0 causal
    float softcap;        ///< kSoftcap: c in c tanh(s / c); scale_log2 is then log2(e)
    float softcap_scale;  ///< kSoftcap: softmax scale / c, applied to Q K^T before the tanh
    // Packed batches (kPacked). q, o, dout, dq are then (1, Hq, total_q, d), k, v, dk, dv (1, Hk,
    // total_k, d), the per-row arrays per query head hold the packed rows (and a query block of
    // padding past them), seq_q and seq_k are the longest sequences; each block replaces them with
    // its sequence's (sequence_args()).
    const int* cu_seqlens_q;  ///< kPacked: (B+1) sequence b owns query rows [cu_seqlens_q[b], cu_seqlens_q[b+1])
    const int* cu_seqlens_k;  ///< kPacked: (B+1) and key rows [cu_seqlens_k[b], cu_seqlens_k[b+1])
    const int* kv_schedule;   ///< kPacked: (entries, 2) block e of a K/V head works on key block [2e+1] of sequence [2e]
    int schedule_entries;     ///< kPacked: blocks per K/V head
    /// Grids with stage 10's switches, atomic dQ: 1 when the blocks go key block by key block
    /// across the heads (dense: block e works on key block e / (B Hk) of K/V head e % (B Hk);
    /// packed: entry e / Hk of the schedule, sorted longest loop first, schedule_entry()), so that
    /// the longest loops start first; 0 head by head.
    int key_blocks_outer;
    // Dropout (kDropout): score (b, h, i, j) is kept iff its byte of Philox4x32-10 is at least the
    // threshold, with b the batch entry or packed sequence, h the query head, i and j counted
    // within the sequence: stage 07's forward map, regenerated here bit for bit.
    uint32_t dropout_threshold;  ///< kDropout: t = round(256 p); a score whose byte is below t is dropped
    uint32_t dropout_seed_lo;    ///< kDropout: the seed's bits 0..31, Philox key word 0
    uint32_t dropout_seed_hi;    ///< kDropout: the seed's bits 32..63, Philox key word 1
    uint32_t dropout_offset;     ///< kDropout: Philox counter word 3
    // The group split (kGroupedHeads, atomic dQ; launch.cuh's group_split()): S blocks share the
    // query heads of one group, block base S + s (base: the block of the grid without the split)
    // taking heads s G/S .. (s+1) G/S - 1. With S > 1 each writes its partial dK_j (times the
    // scale) and dV_j in float32, and backward_dkdv_reduce_kernel adds the S of them.
    int group_split;               ///< kGroupedHeads: S, a divisor of kv_group (1: one block per group, no partials)
    float* dk_partial;             ///< S > 1: [S, B*Hk, Nk, d] float32 dK of each split, times the scale (packed: Nk = total_k)
    float* dv_partial;             ///< S > 1: [S, B*Hk, Nk, d] float32 dV of each split
    int64_t partial_split_stride;  ///< S > 1: floats of one split, B Hk Nk d
    int64_t partial_head_stride;   ///< S > 1: floats of one K/V head, Nk d (packed: total_k d)
    /// kPacked with the dQ accumulator in tiles (WithDqTiles): the block's sequence's first packed
    /// row (sequence_args()); its rows fall into the tiles from this row's place in its tile on.
    int q_row0;
};

/// What the preprocessing kernel reads and writes.
template <class T>
struct PreprocessArgs {
    const T* o;         ///< (B, H, Nq, d) the forward's output, 16-bit
    const T* dout;      ///< (B, H, Nq, d) dO
    const float* lse;   ///< (B, H, Nq) the forward's LSE (natural log, -inf for rows that see no key)
    float* lse_log2;    ///< [B*H, seq_q_padded], written
    float* delta;       ///< [B*H, seq_q_padded], written
    float* dq_accum;    ///< [B*H, seq_q_padded, d], zeroed
    int* turns;         ///< [B*H, q_blocks], zeroed (nullptr outside the deterministic mode)
    int64_t o_sb;       ///< batch stride of o
    int64_t o_sh;       ///< head stride of o
    int64_t o_sn;       ///< row stride of o
    int64_t do_sb;      ///< batch stride of dout
    int64_t do_sh;      ///< head stride of dout
    int64_t do_sn;      ///< row stride of dout
    int64_t lse_sb;     ///< batch stride of lse
    int64_t lse_sh;     ///< head stride of lse
    int64_t lse_sn;     ///< row stride of lse
    int64_t rows;       ///< B * H * seq_q_padded
    int heads;          ///< H
    int seq_q;          ///< Nq
    int seq_q_padded;   ///< Nq rounded up to a whole number of query blocks
    int br;             ///< Br of the main kernel (a turn counter per query block)
    /// Dropout: log2 of c = 1/(1 - p'), subtracted from each row's L log2(e), so that the main
    /// kernel's exp2 gives c P (0 without dropout).
    float lse_log2_shift;
    /// Dropout: 1/c = 1 - p', each row's D multiplied by it (1 without dropout).
    float delta_scale;
};

/// What the postprocessing kernel reads and writes.
template <class T>
struct PostprocessArgs {
    const float* dq_accum;  ///< [B*H, seq_q_padded, d] float32 sums of dS K
    T* dq;                  ///< (B, H, Nq, d), written
    int64_t dq_sb;          ///< batch stride of dq
    int64_t dq_sh;          ///< head stride of dq
    int64_t dq_sn;          ///< row stride of dq
    int64_t rows;           ///< B * H * Nq
    int heads;              ///< H
    int seq_q;              ///< Nq
    int seq_q_padded;       ///< row count of one head in dq_accum
    float scale;            ///< softmax scale, signed
};

/// What the kernel that adds the group split's partial dK and dV reads and writes (S > 1 only).
template <class T>
struct DkdvReduceArgs {
    const float* dk_partial;  ///< [S, B*Hk, Nk, d] float32, each split's dK times the scale
    const float* dv_partial;  ///< [S, B*Hk, Nk, d] float32, each split's dV
    T* dk;                    ///< (B, Hk, Nk, d), written
    T* dv;                    ///< (B, Hk, Nk, d), written
    int64_t dk_sb;            ///< batch stride of dk
    int64_t dk_sh;            ///< head stride of dk
    int64_t dk_sn;            ///< row stride of dk
    int64_t dv_sb;            ///< batch stride of dv
    int64_t dv_sh;            ///< head stride of dv
    int64_t dv_sn;            ///< row stride of dv
    int64_t rows;             ///< B * Hk * Nk (packed: Hk * total_k, B = 1)
    int64_t split_stride;     ///< floats of one split: rows * d
    int heads;                ///< Hk
    int seq_k;                ///< Nk
    int splits;               ///< S
};

/// Shape constants of one main-kernel instance, derived from the head dimension and the features.
template <class T, int D, class F>
struct Shape {
    static_assert(sizeof(T) == 2, "tensor-core operands are 16-bit");
    static_assert(D == 32 || D % 64 == 0, "d = 32 or a multiple of 64 (the swizzled tiles' rows)");
    static constexpr int kThreads = F::kWarps * 32;  ///< threads per block
    static constexpr int kSteps = F::kBr / F::kBn;   ///< steps of Bn query columns per query block
    static constexpr int kNTiles = F::kBn / 8;       ///< 8-query column tiles of S^T per step
    static constexpr int kKSteps = D / 16;           ///< k-steps of S^T = K Q^T and dP^T = V dO^T
    static constexpr int kPSteps = F::kBn / 16;      ///< k-steps of dV += P^T dO and dK += dS^T Q per step
    static constexpr int kDTiles = D / 8;            ///< 8-feature column tiles of dK_w and dV_w
    static constexpr int kRowTiles = F::kBr / 16;    ///< 16-row tiles of dQ_i
    static constexpr int kColSplit = F::kWarps / kRowTiles;  ///< warps sharing one row tile of dQ_i
    static constexpr int kColsPerWarp = D / kColSplit;      ///< dQ_i features one warp computes
    /// dQ_i features accumulated at a time (at most 32: 16 float32 registers beside dK_w and dV_w)
    static constexpr int kChunkCols = kColsPerWarp < 32 ? kColsPerWarp : 32;
    static_assert(kColsPerWarp % 16 == 0 && kColsPerWarp % kChunkCols == 0, "dQ chunks of whole 16-feature pairs");
    static constexpr int kKVElems = F::kBc * D;   ///< elements of the K_j or V_j tile
    static constexpr int kQElems = F::kBr * D;    ///< elements of one Q_i or dO_i slot
    static constexpr int kDsElems = F::kBc * F::kBr;  ///< elements of the dS^T tile
    /// Shared memory: K_j, V_j; two slots each of Q_i and dO_i; dS^T; two slots each of the
    /// Br floats of L_i log2(e) and D_i.
    static constexpr size_t kSmemBytes =
        2 * (2 * size_t(kKVElems) + 4 * size_t(kQElems) + size_t(kDsElems)) + 4 * 4 * size_t(F::kBr);
};

namespace detail {

// The tensor-core building blocks stages 07 and 09 share: PTX wrappers, tile layouts, lane
// patterns and the tile copy (common/cuda/include/fa/cuda/).
using namespace fa::cuda::ptx;
using cuda::a_lane_bytes;
using cuda::fragment_address;
using cuda::k_lane_bytes;
using cuda::TileLayout;
using cuda::v_lane_bytes;

/// Two 16-bit values of one register widened to float32 (the lower half first).
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

// ------------------------------------------------------------------- preprocessing

/// Sum over x of a[x] * b[x] for the eight 16-bit values of two 16-byte chunks, in float32.
template <class T>
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b) {
    const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 x = unpack2<T>(av[i]), y = unpack2<T>(bv[i]);
        sum = fmaf(x.x, y.x, sum);
        sum = fmaf(x.y, y.y, sum);
    }
    return sum;
}

}  // namespace detail

/// Threads per block of the pre- and postprocessing kernels.
inline constexpr int kPrePostThreads = 256;

//! [preprocess]
/// D_i, L_i log2(e), zeroed dQ accumulator and turn counters, for every row of every head,
/// padding rows included. Grid: ceil(rows / (256 / (d/8))) blocks of 256 threads; the d/8
/// threads of one row each read one 16-byte chunk of O and of dO.
template <class T, int D>
__global__ void __launch_bounds__(kPrePostThreads) backward_preprocess_kernel(const PreprocessArgs<T> a) {
    constexpr int kChunks = D / 8;  // 16-byte chunks in a row of 16-bit values
    constexpr int kRowsPerBlock = kPrePostThreads / kChunks;
    static_assert(32 % kChunks == 0, "a row's threads sit in one warp, for the shuffles");
    const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + int(threadIdx.x) / kChunks;  // in [0, B*H*Nq_padded)
    const int chunk = int(threadIdx.x) % kChunks;
    const bool in_range = row < a.rows;
    const int bh = int(row / a.seq_q_padded), n = int(row % a.seq_q_padded);
    const int b = bh / a.heads, h = bh % a.heads;
    const bool real = in_range && n < a.seq_q;  // padding rows have D = 0 and P = 0
    float sum = 0.0f;
    if (real) {
        const uint4 o4 = *reinterpret_cast<const uint4*>(a.o + b * a.o_sb + h * a.o_sh + n * a.o_sn + chunk * 8);
        const uint4 d4 = *reinterpret_cast<const uint4*>(a.dout + b * a.do_sb + h * a.do_sh + n * a.do_sn + chunk * 8);
        sum = detail::dot8<T>(o4, d4);
    }
    // Every thread takes part (no early exit), so the shuffles see all kChunks lanes of the row.
#pragma unroll
    for (int offset = kChunks / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (!in_range) return;
    float4* acc = reinterpret_cast<float4*>(a.dq_accum + row * D + chunk * 8);
    acc[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    acc[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (chunk == 0) {
        a.delta[row] = sum * a.delta_scale;
        const float lse = real ? a.lse[b * a.lse_sb + h * a.lse_sh + n * a.lse_sn] : -INFINITY;
        // P = exp2(s*scale*log2e - L*log2e). A row that sees no key has L = -inf; +inf here makes
        // its P exactly 0 for every score (exp2(-inf) = 0) instead of exp2(+inf) = inf.
        a.lse_log2[row] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f - a.lse_log2_shift;
        if (a.turns != nullptr && n % a.br == 0) a.turns[int64_t(bh) * (a.seq_q_padded / a.br) + n / a.br] = 0;
    }
}
//! [preprocess]

//! [dq_tile_offset]
/// Where feature `col` of row `row` of one head's dQ accumulator is, in floats from the head's
/// first row, when it is kept in tiles of 8 rows by 8 features (WithDqTiles; otherwise row D + col):
/// a tile row-major inside and the tiles of 8 rows side by side. The 8 features from `col` & ~7 of
/// row `row` are still 8 consecutive floats, and a head (Nq_padded rows, a multiple of 8) takes the
/// same room.
template <int D>
__host__ __device__ __forceinline__ int64_t dq_tile_offset(int64_t row, int col) {
    return (row & ~int64_t(7)) * D + (col & ~7) * 8 + (row & 7) * 8 + (col & 7);
}
//! [dq_tile_offset]

//! [postprocess]
/// dQ = scale * accumulator, rounded to T: one thread per 16-byte chunk of dq (grid-stride).
/// kDqTiled: the accumulator is in 8 x 8 tiles (dq_tile_offset()).
template <class T, int D, bool kDqTiled = false>
__global__ void __launch_bounds__(kPrePostThreads) backward_postprocess_kernel(const PostprocessArgs<T> a) {
    constexpr int kChunks = D / 8;
    const int64_t units = a.rows * kChunks;
    for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += int64_t(gridDim.x) * blockDim.x) {
        const int64_t row = u / kChunks;  // in [0, B*H*Nq)
        const int chunk = int(u % kChunks);
        const int bh = int(row / a.seq_q), n = int(row % a.seq_q);
        const int b = bh / a.heads, h = bh % a.heads;
        const float* head = a.dq_accum + int64_t(bh) * a.seq_q_padded * D;
        const float4* src = reinterpret_cast<const float4*>(
            kDqTiled ? head + dq_tile_offset<D>(n, chunk * 8) : a.dq_accum + (int64_t(bh) * a.seq_q_padded + n) * D + chunk * 8);
        const float4 x = src[0], y = src[1];
        const float s = a.scale;
        uint4 out;
        out.x = fa::cuda::ptx::pack2<T>(x.x * s, x.y * s);
        out.y = fa::cuda::ptx::pack2<T>(x.z * s, x.w * s);
        out.z = fa::cuda::ptx::pack2<T>(y.x * s, y.y * s);
        out.w = fa::cuda::ptx::pack2<T>(y.z * s, y.w * s);
        *reinterpret_cast<uint4*>(a.dq + b * a.dq_sb + h * a.dq_sh + n * a.dq_sn + chunk * 8) = out;
    }
}
//! [postprocess]

//! [dkdv_reduce]
/// Eight features of the S float32 partial sums at `first`, `stride` floats apart, added in the
/// order s = 0, 1, ..., S-1 (the same bits on every run) and rounded to T.
template <class T>
__device__ __forceinline__ uint4 sum_splits_rounded(const float* first, int64_t stride, int splits) {
    float4 x = reinterpret_cast<const float4*>(first)[0], y = reinterpret_cast<const float4*>(first)[1];
#pragma unroll 1
    for (int s = 1; s < splits; ++s) {
        const float4* p = reinterpret_cast<const float4*>(first + s * stride);
        const float4 u = p[0], v = p[1];
        x.x += u.x, x.y += u.y, x.z += u.z, x.w += u.w;
        y.x += v.x, y.y += v.y, y.z += v.z, y.w += v.w;
    }
    uint4 out;
    out.x = fa::cuda::ptx::pack2<T>(x.x, x.y);
    out.y = fa::cuda::ptx::pack2<T>(x.z, x.w);
    out.z = fa::cuda::ptx::pack2<T>(y.x, y.y);
    out.w = fa::cuda::ptx::pack2<T>(y.z, y.w);
    return out;
}

/// The group split's last step (S > 1): dK and dV = the sums of the S blocks' partials, rounded
/// to T, one thread per 16-byte chunk of dk and of dv (grid-stride). The partials are packed
/// [S, rows, d] (16-byte aligned: launch.cuh checks), dk and dv written through their strides.
template <class T, int D>
__global__ void __launch_bounds__(kPrePostThreads) backward_dkdv_reduce_kernel(const DkdvReduceArgs<T> a) {
    constexpr int kChunks = D / 8;
    const int64_t units = a.rows * kChunks;
    for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += int64_t(gridDim.x) * blockDim.x) {
        const int64_t row = u / kChunks;  // in [0, B*Hk*Nk)
        const int chunk = int(u % kChunks);
        const int bh = int(row / a.seq_k), n = int(row % a.seq_k);
        const int b = bh / a.heads, h = bh % a.heads;
        const int64_t at = row * D + chunk * 8;
        *reinterpret_cast<uint4*>(a.dk + b * a.dk_sb + h * a.dk_sh + n * a.dk_sn + chunk * 8) =
            sum_splits_rounded<T>(a.dk_partial + at, a.split_stride, a.splits);
        *reinterpret_cast<uint4*>(a.dv + b * a.dv_sb + h * a.dv_sh + n * a.dv_sn + chunk * 8) =
            sum_splits_rounded<T>(a.dv_partial + at, a.split_stride, a.splits);
    }
}
//! [dkdv_reduce]

namespace detail {

/// What one warp keeps in registers across the query blocks.
template <class T, int D, class F>
struct WarpState {
    using S = Shape<T, D, F>;  ///< the shape constants
    static constexpr int kFragSteps = F::kKVInRegisters ? S::kKSteps : 1;  ///< k-steps kept (1: unused)
    uint32_t k[kFragSteps][4];  ///< K_w as A fragments (with kKVInRegisters)
    uint32_t v[kFragSteps][4];  ///< V_w as A fragments (with kKVInRegisters)
    float dk[S::kDTiles][4];    ///< dK_w accumulators [16 keys, d], unscaled
    float dv[S::kDTiles][4];    ///< dV_w accumulators [16 keys, d]
};

/// Copies the Br floats of L_i log2(e) and of D_i of query block `q0` into their shared slots:
/// one 16-byte cp.async per thread for the first Br/2 threads. The arrays are padded to whole
/// query blocks, so every copy is in bounds.
template <class F>
__device__ __forceinline__ void load_row_stats(float* lse_slot, float* delta_slot, const float* lse_head,
                                               const float* delta_head, int q0) {
    constexpr int kChunks = F::kBr / 4;  // 16-byte chunks of Br floats
    static_assert(2 * kChunks <= 32 * F::kWarps, "enough threads for one chunk each");
    const int tid = int(threadIdx.x);
    if (tid < kChunks) {
        cp_async_16(smem_address(lse_slot + 4 * tid), lse_head + q0 + 4 * tid, true);
    } else if (tid < 2 * kChunks) {
        const int c = tid - kChunks;
        cp_async_16(smem_address(delta_slot + 4 * c), delta_head + q0 + 4 * c, true);
    }
}

//! [process_step]
/// Bn query columns [c0, c0 + Bn) of query block i for one warp: S^T, P^T, dP^T, dS^T in
/// registers; dV_w and dK_w updated; dS^T stored into the shared tile for the dQ products.
/// kMask: compare every (key, query) pair with the causal diagonal and Nk (blocks that cross
/// the diagonal, and the last, partial key block). Query rows past Nq need no mask: their
/// L log2(e) is +inf (P = 0) and their dO rows are zero-filled.
template <class T, int D, class F, bool kMask>
__device__ __forceinline__ void process_step(WarpState<T, D, F>& st, const uint16_t* k_tile, const uint16_t* v_tile,
                                             const uint16_t* q_tile, const uint16_t* do_tile, const float* lse_slot,
                                             const float* delta_slot, uint16_t* ds_tile, int q0, int c0, int kv0,
                                             const Args<T>& a, int warp, int lane) {
    using S = Shape<T, D, F>;
    using LDs = TileLayout<F::kBr, true>;  // the dS^T tile: Bc rows of Br queries
    const int g = lane / 4, t = lane % 4;
    const int key_row0 = warp * 16;  // this warp's first key inside the block

    // Lane addresses, one per tile and pattern (fa/cuda/layouts.hpp): "a" reads 16 x 16 A
    // fragments row-major, "k" reads B fragments of rows stored one per n (non-transposed),
    // "v" reads B fragments of rows stored one per k (transposed by ldmatrix.trans).
    const uint32_t k_a = smem_address(k_tile) + a_lane_bytes<TileLayout<D, true>>(lane);
    const uint32_t v_a = smem_address(v_tile) + a_lane_bytes<TileLayout<D, true>>(lane);
    const uint32_t q_b = smem_address(q_tile) + k_lane_bytes<TileLayout<D, true>>(lane);
    const uint32_t do_b = smem_address(do_tile) + k_lane_bytes<TileLayout<D, true>>(lane);

    // S^T = K_w Q_i^T: keys are the rows (M), queries the columns (N), features the k-dimension.
    // Q_i stored [queries, d] is B stored column by column: plain ldmatrix, as K in the forward.
    float s[S::kNTiles][4];
#pragma unroll
    for (int nt = 0; nt < S::kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < S::kKSteps; ++ks) {
        uint32_t ka[4];
        if constexpr (F::kKVInRegisters) {
#pragma unroll
            for (int e = 0; e < 4; ++e) ka[e] = st.k[F::kKVInRegisters ? ks : 0][e];
        } else {
            ldmatrix_x4(ka, fragment_address<TileLayout<D, true>>(k_a, key_row0, ks * 16));
        }
#pragma unroll
        for (int np = 0; np < S::kNTiles / 2; ++np) {
            uint32_t b[4];
            ldmatrix_x4(b, fragment_address<TileLayout<D, true>>(q_b, c0 + np * 16, ks * 16));
            const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
            mma_m16n8k16<T>(s[2 * np], ka, b_lo, s[2 * np]);
            mma_m16n8k16<T>(s[2 * np + 1], ka, b_hi, s[2 * np + 1]);
        }
    }

    // P^T = exp(scale*S^T - L) = exp2(S^T * scale*log2e - L*log2e): one FFMA and one ex2 per
    // score. The accumulator element e of tile nt sits at key g + 8*(e/2), query nt*8 + 2t + e%2;
    // a lane's two queries of a tile are neighbours, so their L (and D below) is one 8-byte load.
    const int key_offset = a.seq_k - a.seq_q;  // causal: query q sees key k iff k <= q + Nk - Nq
#pragma unroll
    for (int nt = 0; nt < S::kNTiles; ++nt) {
        const float2 l2 = *reinterpret_cast<const float2*>(lse_slot + c0 + nt * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float p = ex2(fmaf(s[nt][e], a.scale_log2, -(e % 2 ? l2.y : l2.x)));
            if constexpr (kMask) {
                const int key = kv0 + key_row0 + g + 8 * (e / 2);
                const int query = q0 + c0 + nt * 8 + 2 * t + e % 2;
                const bool visible = key < a.seq_k && (!a.causal || key <= query + key_offset);
                // Set after the exponential, not as -inf before it: with a negative scale,
                // -inf * scale would be +inf.
                if (!visible) p = 0.0f;
            }
            s[nt][e] = p;
        }
    }

    // dP^T = V_w dO_i^T: the same product with V_w and dO_i in place of K_w and Q_i.
    float dp[S::kNTiles][4];
#pragma unroll
    for (int nt = 0; nt < S::kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < S::kKSteps; ++ks) {
        uint32_t va[4];
        if constexpr (F::kKVInRegisters) {
#pragma unroll
            for (int e = 0; e < 4; ++e) va[e] = st.v[F::kKVInRegisters ? ks : 0][e];
        } else {
            ldmatrix_x4(va, fragment_address<TileLayout<D, true>>(v_a, key_row0, ks * 16));
        }
#pragma unroll
        for (int np = 0; np < S::kNTiles / 2; ++np) {
            uint32_t b[4];
            ldmatrix_x4(b, fragment_address<TileLayout<D, true>>(do_b, c0 + np * 16, ks * 16));
            const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
            mma_m16n8k16<T>(dp[2 * np], va, b_lo, dp[2 * np]);
            mma_m16n8k16<T>(dp[2 * np + 1], va, b_hi, dp[2 * np + 1]);
        }
    }

    // dS^T = P^T o (dP^T - D), in float32 from the float32 P (rounding P first would add a
    // second rounding to every dS).
#pragma unroll
    for (int nt = 0; nt < S::kNTiles; ++nt) {
        const float2 d2 = *reinterpret_cast<const float2*>(delta_slot + c0 + nt * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[nt][e] = s[nt][e] * (dp[nt][e] - (e % 2 ? d2.y : d2.x));
    }

    // P^T and dS^T as A fragments: two neighbouring 8-query accumulator tiles are, element for
    // element, the A layout of one 16-query k-step (the identity stage 07 uses for P V).
    uint32_t pa[S::kPSteps][4], dsa[S::kPSteps][4];
#pragma unroll
    for (int kk = 0; kk < S::kPSteps; ++kk) {
        pa[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
        pa[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
        pa[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        dsa[kk][0] = pack2<T>(dp[2 * kk][0], dp[2 * kk][1]);
        dsa[kk][1] = pack2<T>(dp[2 * kk][2], dp[2 * kk][3]);
        dsa[kk][2] = pack2<T>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
        dsa[kk][3] = pack2<T>(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
    }

    // dS^T into the shared [Bc, Br] tile, for the dQ products of every warp: each register is two
    // neighbouring queries of one key, one 32-bit store. Eight rows g with the same logical chunk
    // land in eight different swizzle slots: the 32 lanes hit 32 different banks.
#pragma unroll
    for (int kk = 0; kk < S::kPSteps; ++kk) {
        const int r = key_row0 + g, c = c0 + kk * 16 + 2 * t;
        *reinterpret_cast<uint32_t*>(ds_tile + LDs::offset(r, c)) = dsa[kk][0];
        *reinterpret_cast<uint32_t*>(ds_tile + LDs::offset(r + 8, c)) = dsa[kk][1];
        *reinterpret_cast<uint32_t*>(ds_tile + LDs::offset(r, c + 8)) = dsa[kk][2];
        *reinterpret_cast<uint32_t*>(ds_tile + LDs::offset(r + 8, c + 8)) = dsa[kk][3];
    }

    // dV_w += P^T dO_i and dK_w += dS^T Q_i: queries are now the k-dimension. dO_i and Q_i are
    // stored [queries, d]; B needs pairs of consecutive queries of one feature: ldmatrix.trans,
    // as V in the forward. Each B fragment pair is loaded once for its two mma.
    const uint32_t do_t = smem_address(do_tile) + v_lane_bytes<TileLayout<D, true>>(lane);
    const uint32_t q_t = smem_address(q_tile) + v_lane_bytes<TileLayout<D, true>>(lane);
#pragma unroll
    for (int kk = 0; kk < S::kPSteps; ++kk) {
#pragma unroll
        for (int dpair = 0; dpair < S::kDTiles / 2; ++dpair) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, fragment_address<TileLayout<D, true>>(do_t, c0 + kk * 16, dpair * 16));
            const uint32_t bv_lo[2] = {b[0], b[1]}, bv_hi[2] = {b[2], b[3]};
            mma_m16n8k16<T>(st.dv[2 * dpair], pa[kk], bv_lo, st.dv[2 * dpair]);
            mma_m16n8k16<T>(st.dv[2 * dpair + 1], pa[kk], bv_hi, st.dv[2 * dpair + 1]);
            ldmatrix_x4_trans(b, fragment_address<TileLayout<D, true>>(q_t, c0 + kk * 16, dpair * 16));
            const uint32_t bk_lo[2] = {b[0], b[1]}, bk_hi[2] = {b[2], b[3]};
            mma_m16n8k16<T>(st.dk[2 * dpair], dsa[kk], bk_lo, st.dk[2 * dpair]);
            mma_m16n8k16<T>(st.dk[2 * dpair + 1], dsa[kk], bk_hi, st.dk[2 * dpair + 1]);
        }
    }
}
//! [process_step]

//! [accumulate_dq]
/// dQ_i += dS K_j for this warp's part of the query block (16 rows, kColsPerWarp features),
/// added into the float32 accumulator in global memory. A = dS [queries, keys] is dS^T read
/// with ldmatrix.trans (lanes give key rows, each matrix arrives transposed: query rows);
/// B = K_j [keys, d] needs pairs of consecutive keys of one feature: ldmatrix.trans again.
/// The additions are `red` in both modes; in the deterministic mode the caller holds the turn.
template <class T, int D, class F>
__device__ __forceinline__ void accumulate_dq(const uint16_t* ds_tile, const uint16_t* k_tile, float* dq_block, int warp,
                                              int lane) {
    using S = Shape<T, D, F>;
    const int g = lane / 4, t = lane % 4;
    // With one warp per row tile (kColSplit = 1) every warp computes all d features.
    const int row_tile = warp % S::kRowTiles, col_part = S::kColSplit == 1 ? 0 : warp / S::kRowTiles;
    // ds lane pattern: lanes 0-7 keys 0-7 / queries 0-7, 8-15 keys 0-7 / queries 8-15, 16-23
    // keys 8-15 / queries 0-7, 24-31 keys 8-15 / queries 8-15: after the transposing load,
    // matrix i is exactly register a[i] of the A fragment of dS (k_lane_element of fa/cuda/layouts.hpp).
    const uint32_t ds_a = smem_address(ds_tile) + k_lane_bytes<TileLayout<F::kBr, true>>(lane);
    const uint32_t k_t = smem_address(k_tile) + v_lane_bytes<TileLayout<D, true>>(lane);
    float* rows = dq_block + int64_t(row_tile * 16) * D;  // [16, d] of the accumulator
#pragma unroll
    for (int chunk = 0; chunk < S::kColsPerWarp / S::kChunkCols; ++chunk) {
        const int col0 = col_part * S::kColsPerWarp + chunk * S::kChunkCols;
        float acc[S::kChunkCols / 8][4];
#pragma unroll
        for (int nt = 0; nt < S::kChunkCols / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < F::kBc / 16; ++kk) {
            uint32_t ds[4];
            ldmatrix_x4_trans(ds, fragment_address<TileLayout<F::kBr, true>>(ds_a, kk * 16, row_tile * 16));
#pragma unroll
            for (int dpair = 0; dpair < S::kChunkCols / 16; ++dpair) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, fragment_address<TileLayout<D, true>>(k_t, kk * 16, col0 + dpair * 16));
                const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
                mma_m16n8k16<T>(acc[2 * dpair], ds, b_lo, acc[2 * dpair]);
                mma_m16n8k16<T>(acc[2 * dpair + 1], ds, b_hi, acc[2 * dpair + 1]);
            }
        }
        // Each lane holds rows g and g+8, features 2t and 2t+1 of every 8-feature tile: pairs of
        // neighbouring floats, one 8-byte access each.
#pragma unroll
        for (int nt = 0; nt < S::kChunkCols / 8; ++nt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                float* p = rows + (g + 8 * hh) * D + col0 + nt * 8 + 2 * t;
                red_global_add_v2_f32(p, acc[nt][2 * hh], acc[nt][2 * hh + 1]);
            }
    }
}
//! [accumulate_dq]

}  // namespace detail

//! [query_blocks]
/// The query blocks key block `j` visits: `[begin, Tr)`. Without the causal mask, all of them;
/// with it, the first block holding a row that sees key `j*Bc` (query `r` sees key `k` iff
/// `k <= r + Nk - Nq`). `begin` never decreases with j, so the key blocks visiting query block
/// i are always a prefix `0, 1, ...` of the key blocks: the deterministic mode's turn of key
/// block j at any query block is simply j.
__host__ __device__ inline int first_query_block(int j, int br, int bc, int seq_q, int seq_k, bool causal) {
    if (!causal) return 0;
    const int64_t first_row = int64_t(j) * bc + seq_q - seq_k;  // first query row that sees key j*Bc
    return first_row > 0 ? int(first_row / br) : 0;
}

/// True when block (query block starting at `q0`, key block starting at `kv0`) holds a (query,
/// key) pair the mask hides: the key block runs past Nk, or (causal) the block's first query row
/// does not see its last key. Later rows see more keys, so the first row decides.
__host__ __device__ inline bool block_needs_mask(int q0, int kv0, int bc, int seq_q, int seq_k, bool causal) {
    const int64_t end = visible_key_end(q0, seq_q, seq_k, causal);  // keys [0, end) visible to row q0
    return end < int64_t(kv0) + bc;
}
//! [query_blocks]

//! [window_blocks]
//! [window_query_blocks]
/// The query blocks key block `j` visits under the window (left, right) (fa/varlen.hpp's Window,
/// -1 unbounded; causal is (-1, 0)): `[begin, end)`, the blocks holding a row that sees one of its
/// keys (`begin == end`: none). Row r sees the keys [max(0, δ_r - left), min(Nk, δ_r + right + 1))
/// with δ_r = r + Nk - Nq (visible_key_range()), so it sees a key of [kv0, kv_last] iff
/// δ_r + right >= kv0 and δ_r - left <= kv_last: the rows from r0 = kv0 - right - (Nk - Nq) to
/// r1 = kv_last + left - (Nk - Nq) (a bound of -1 drops its side), clipped to the rows that exist.
/// r0 <= r1 before the clipping (kv0 <= kv_last, left + right >= 0 when both are set), so the
/// block visits a row iff the clipped range is not empty. With (-1, 0): first_query_block(), up
/// to Tr, except that query blocks past Nq's last row are never visited.
__host__ __device__ inline void window_query_blocks(int j, int br, int bc, int seq_q, int seq_k, int left, int right,
                                                    int& begin, int& end) {
    const int64_t offset = int64_t(seq_k) - seq_q;  // row r's diagonal key is r + offset
    const int64_t kv0 = int64_t(j) * bc, kv_last = (kv0 + bc < seq_k ? kv0 + bc : seq_k) - 1;
    int64_t r0 = right < 0 ? 0 : kv0 - right - offset;
    int64_t r1 = left < 0 ? seq_q - 1 : kv_last + left - offset;
    r0 = r0 > 0 ? r0 : 0;
    r1 = r1 < seq_q - 1 ? r1 : seq_q - 1;
    begin = r0 <= r1 ? int(r0 / br) : 0;
    end = r0 <= r1 ? int(r1 / br) + 1 : 0;
}
//! [window_query_blocks]

/// The key blocks that visit query block `i` under the window: `[first, last]` (first > last:
/// none). Key block j visits i iff r0(j) <= q_last and r1(j) >= q0 (the block's first and last
/// rows; window_query_blocks()'s r0, r1 before clipping). Both only grow with j, so the j with
/// r0(j) <= q_last are a prefix 0 .. last and the j with r1(j) >= q0 a suffix first .. Tc-1: the
/// visitors are the range between. r0(j) <= q_last iff j Bc <= q_last + right + Nk - Nq; r1(j)
/// >= q0 iff the block's last key kv_last(j) >= q0 - left + Nk - Nq =: x, i.e. (x < Nk) j >= x / Bc.
__host__ __device__ inline void window_key_blocks(int i, int br, int bc, int seq_q, int seq_k, int k_blocks, int left,
                                                  int right, int& first, int& last) {
    const int64_t offset = int64_t(seq_k) - seq_q;
    const int64_t q0 = int64_t(i) * br, q_last = (q0 + br < seq_q ? q0 + br : seq_q) - 1;
    last = k_blocks - 1;
    if (right >= 0) {
        const int64_t reach = q_last + right + offset;  // the last key the block's last row sees
        last = reach < 0 ? -1 : (reach / bc < k_blocks - 1 ? int(reach / bc) : k_blocks - 1);
    }
    first = 0;
    if (left >= 0) {
        const int64_t x = q0 - left + offset;  // the first key the block's first row sees
        first = x < 0 ? 0 : (x < seq_k ? int(x / bc) : k_blocks);
    }
}

/// True when the block (query block from `q0`, key block from `kv0`) holds a (query, key) pair
/// the window hides, among its real rows: its first row does not see its last key (or the block
/// runs past Nk), or its last row does not see its first key. The first row sees the fewest keys
/// on the right, the last the fewest on the left, so those two rows decide.
__host__ __device__ inline bool window_block_needs_mask(int q0, int br, int kv0, int bc, int seq_q, int seq_k, int left,
                                                        int right) {
    const int q_last = (q0 + br < seq_q ? q0 + br : seq_q) - 1;
    const KeyRange top = visible_key_range(q0, seq_q, seq_k, Window{left, right});
    const KeyRange bottom = visible_key_range(q_last, seq_q, seq_k, Window{left, right});
    return top.end < int64_t(kv0) + bc || bottom.begin > kv0;
}

/// The query blocks that key block `j` meets without a mask under the window: `[begin, end)`,
/// worked out once per key block, so that the loop over the query blocks tells a masked block
/// from a full one by two comparisons, not by window_block_needs_mask()'s two
/// visible_key_range() in 64-bit arithmetic on each. A block is full when its keys end within Nk
/// and, for a whole block of Br rows, its first row q0 sees its last key (right >= 0: q0 + δ +
/// right >= kv0 + Bc - 1, a least i) and its last row its first key (left >= 0: q0 + Br - 1 + δ -
/// left <= kv0, a largest i), δ = Nk - Nq. Only whole blocks count ((i + 1) Br <= Nq): the last,
/// partial query block of a dense problem takes the masked path, whose visible entries are the
/// same numbers, and a packed sequence's last block must, since its rows past Nq are the next
/// sequence's. Among whole blocks the range is exactly the blocks window_block_needs_mask() lets
/// through (tests/test_stage09_model_emulated.cpp).
__host__ __device__ inline void window_full_query_blocks(int j, int br, int bc, int seq_q, int seq_k, int left,
                                                         int right, int& begin, int& end) {
    const int64_t offset = int64_t(seq_k) - seq_q;
    const int64_t kv0 = int64_t(j) * bc;
    begin = end = 0;
    if (kv0 + bc > seq_k) return;  // the key block runs past Nk: every block of it is masked
    int64_t lo = 0, hi = seq_q / br;  // whole blocks: i < floor(Nq / Br)
    if (right >= 0) {
        const int64_t least_q0 = kv0 + bc - 1 - offset - right;
        if (least_q0 > 0) lo = (least_q0 + br - 1) / br;
    }
    if (left >= 0) {
        const int64_t largest_q0 = kv0 + left - offset - (br - 1);
        if (largest_q0 < 0) return;
        hi = largest_q0 / br + 1 < hi ? largest_q0 / br + 1 : hi;
    }
    if (lo < hi) begin = int(lo), end = int(hi);
}
//! [window_blocks]

namespace detail {

//! [turns]
/// The key block this thread block works on. Atomic mode: j = blockIdx % Tc, the longest loops
/// (small j) first. Deterministic mode: the other way round, key block Tc-1 first, because the
/// key blocks take their turns at a query block from the last one down (wait_for_turn): every
/// block a block waits for then has a smaller block number and was started before it.
template <bool kDeterministic, class T>
__device__ __forceinline__ int key_block_of_block(const Args<T>& a, unsigned block) {
    const int jb = int(block % unsigned(a.k_blocks));
    return kDeterministic ? a.k_blocks - 1 - jb : jb;
}

/// key_block_of_block() of this thread block.
template <bool kDeterministic, class T>
__device__ __forceinline__ int key_block_of_this_block(const Args<T>& a) {
    return key_block_of_block<kDeterministic>(a, blockIdx.x);
}

/// The counter of query block `i` of head `bh`: [B*H, Tr] counters, one per query block; kPerRow
/// (packed batches, where `a` is the block's sequence_args()): one per packed row of the head,
/// that of the block's first row (each query block of a sequence starts at a row of its own).
template <bool kPerRow, int Br, class T>
__device__ __forceinline__ int* turn_counter(const Args<T>& a, int bh, int i) {
    if constexpr (kPerRow) {
        return a.turns + int64_t(bh) * a.seq_q_padded + int64_t(i) * Br;
    } else {
        return a.turns + int64_t(bh) * a.q_blocks + i;
    }
}

/// The deterministic mode's wait: thread 0 spins until key block `j` has the turn at query block
/// `i` of head `bh`, i.e. until the key blocks j+1 .. last_key_block(i) that visit i have added
/// their dQ_i. In the causal triangle they got there first: key block j' > j starts at a query
/// block no earlier than j's, so when j arrives at i, j' has done fewer iterations to reach it
/// (and at j's first query block no later key block has anything to add, or it started there
/// too). The caller's next __syncthreads carries the acquired turn to every thread before their
/// dQ_i additions.
///
/// kWindowed (stage 10's sliding windows): the key blocks that visit i are no longer a prefix
/// 0 .. last(i) but a range [first(i), last(i)] (window_key_blocks()), and the turn of key block
/// j at i is still last(i) - j. Why that is right, and why no block waits for one launched after
/// it (the lesson's stage09_model_turns):
/// 1. The count. Key block j adds at i once the counter reads last(i) - j: the number of key
///    blocks j' in (j, last(i)]. All of them visit i, because the visitors form a range that
///    holds j and last(i); none of those below j adds before j, because their turns are larger.
///    So at every query block the visitors add one at a time, from last(i) down to first(i), and
///    the counter of each turn is reached exactly once.
/// 2. Whom a block waits for. Key block j waits at i only for key blocks j' > j of the same
///    batch and head (grouped heads: the same query head; every key block of a K/V head visits
///    the query heads of its group in the same order, each with counters of its own). In the
///    deterministic grid key block j' is block Tc-1-j' of its head (key_block_of_this_block): a
///    smaller block number, launched before j's block.
/// 3. No wait lasts forever. A block waits only for larger key blocks, so the waits form no
///    cycle; the largest visitor of i, last(i), waits for nobody there, and by induction downward
///    every j' > j that visits i passes its turn at i after finitely many steps, however the
///    blocks of lower numbers are doing.
/// The emulated test (tests/test_stage09_model_emulated.cpp) runs the blocks one at a time in
/// order of block number and stops if a block ever has to wait: every turn it checks is there
/// when its block arrives.
///
/// kPerRow (packed batches): the counter of a query block is that of its first packed row
/// (turn_counter()), since the query blocks of different sequences start at any row.
template <class T, int Br, int Bc, bool kWindowed = false, bool kPerRow = false>
__device__ __forceinline__ void wait_for_turn(const Args<T>& a, int bh, int i, int j) {
    if (threadIdx.x == 0) {
        const int* turn = turn_counter<kPerRow, Br>(a, bh, i);
        int last;
        if constexpr (kWindowed) {
            int first;
            window_key_blocks(i, Br, Bc, a.seq_q, a.seq_k, a.k_blocks, a.window_left, a.window_right, first, last);
        } else {
            last = last_key_block(i, Br, Bc, a.seq_q, a.seq_k, a.k_blocks, a.causal);
        }
        const int mine = last - j;
        while (ld_global_acquire_gpu_b32(turn) != mine) __nanosleep(32);
    }
}

/// Passes the turn at query block `i` on: every thread's fence waits until its dQ_i additions
/// (`red`, performed in L2) are done GPU-wide, the barrier orders all of them before thread 0's
/// increment, and thread 0's own fence makes the increment a release of everything it has
/// observed (the other threads' additions included). The next key block's additions to the same
/// floats therefore come after these in L2's order of operations: a fixed order of float sums.
template <bool kPerRow = false, int Br = 1, class T>
__device__ __forceinline__ void pass_turn(const Args<T>& a, int bh, int i) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(turn_counter<kPerRow, Br>(a, bh, i), 1);
    }
}
//! [turns]

//! [frame]
/// Where one block of either main kernel works: its key block j (counted from the last one in the
/// deterministic mode, key_block_of_this_block), its (batch, head) bh, and that head's rows of
/// every tensor it reads or adds to. With grouped-query heads (kGroupedHeads), h is the K/V head
/// (k, v and the dK, dV it writes) and bh the batch and query head whose rows q, dout, lse, delta
/// and dq point to at the moment (for_query_head() places them on a head of the group,
/// next_query_head() moves them to the next one).
template <class T>
struct BlockView {
    int j;                  ///< the key block
    int bh;                 ///< batch * heads + head (kGroupedHeads: batch * Hq + the query head)
    int b;                  ///< the batch
    int h;                  ///< the head (kGroupedHeads: the K/V head)
    int kv0;                ///< the key block's first key, j Bc
    const T* q;             ///< [Nq, d]
    const T* k;             ///< [Nk, d]
    const T* v;             ///< [Nk, d]
    const T* dout;          ///< [Nq, d]
    const float* lse;       ///< [Nq_padded] L_i log2(e)
    const float* delta;     ///< [Nq_padded] D_i
    float* dq;              ///< [Nq_padded, d] the float32 dQ accumulator
};

/// The BlockView of this thread block, with key blocks of `Bc` keys and head dimension `D`.
template <class T, int D, int Bc, bool kDeterministic>
__device__ __forceinline__ BlockView<T> block_view(const Args<T>& a) {
    BlockView<T> w;
    w.j = key_block_of_this_block<kDeterministic>(a);
    w.bh = int(blockIdx.x / unsigned(a.k_blocks));
    w.b = w.bh / a.heads;
    w.h = w.bh % a.heads;
    w.kv0 = w.j * Bc;
    w.q = a.q + w.b * a.q_sb + w.h * a.q_sh;
    w.k = a.k + w.b * a.k_sb + w.h * a.k_sh;
    w.v = a.v + w.b * a.v_sb + w.h * a.v_sh;
    w.dout = a.dout + w.b * a.do_sb + w.h * a.do_sh;
    w.lse = a.lse_log2 + int64_t(w.bh) * a.seq_q_padded;
    w.delta = a.delta + int64_t(w.bh) * a.seq_q_padded;
    w.dq = a.dq_accum + int64_t(w.bh) * a.seq_q_padded * D;
    return w;
}
//! [frame]

/// The query blocks of the block's key block that need no mask with a window (kWindow; packed
/// calls always carry it, causal as (-1, 0)): window_full_query_blocks(), once per block.
struct FullQueryBlocks {
    int begin = 0;  ///< the first query block without a mask
    int end = 0;    ///< one past the last
};

/// FullQueryBlocks of key block `j` for `a` (a packed block's: its sequence's); empty without a window.
template <class F, class T>
__device__ __forceinline__ FullQueryBlocks full_query_blocks(const Args<T>& a, int j) {
    static_assert(!kPacked<F> || kWindow<F>, "packed calls mask each sequence through the window");
    FullQueryBlocks full;
    if constexpr (kWindow<F>) {
        window_full_query_blocks(j, F::kBr, F::kBc, a.seq_q, a.seq_k, a.window_left, a.window_right, full.begin, full.end);
    }
    return full;
}

/// Whether query block `i` with key block `kv0` needs the mask: with a window (kWindow), when i
/// is outside `full` (full_query_blocks()); otherwise where the block crosses the causal
/// diagonal or Nk (block_needs_mask()).
template <class F, class T>
__device__ __forceinline__ bool needs_mask(const Args<T>& a, int i, int kv0, const FullQueryBlocks& full) {
    if constexpr (kWindow<F>) {
        return i < full.begin || i >= full.end;
    } else {
        return block_needs_mask(i * F::kBr, kv0, F::kBc, a.seq_q, a.seq_k, a.causal);
    }
}

//! [group_split]
/// Whether features F with kDeterministic split a group of query heads over several blocks: grouped
/// heads with atomic dQ. The deterministic mode keeps one block per group (S = 1): its turns and
/// its block order are those of the grid without the split. Without kGroupSplit the functions
/// below are the very expressions the kernels had before the split, so that those instances keep
/// their machine code (tools/cubin_text_hashes.py).
template <class F, bool kDeterministic>
inline constexpr bool kGroupSplit = kGroupedHeads<F> && !kDeterministic;

/// The block of the grid without the group split that this block is a part of: blockIdx / S
/// (`group_split` = S; the split innermost, so that the base grid's order, longest loops first or
/// the packed schedule, holds for the base blocks). Without kGroupSplit, blockIdx itself.
template <class F, bool kDeterministic>
__device__ __forceinline__ unsigned base_block(int group_split) {
    if constexpr (kGroupSplit<F, kDeterministic>) {
        return blockIdx.x / unsigned(group_split);
    } else {
        return blockIdx.x;
    }
}

/// Which of the S splits of its group this block works on: blockIdx mod S (0 without kGroupSplit).
template <class F, bool kDeterministic>
__device__ __forceinline__ int split_of_block(int group_split) {
    if constexpr (kGroupSplit<F, kDeterministic>) {
        return int(blockIdx.x % unsigned(group_split));
    } else {
        return 0;
    }
}

/// The query heads this block visits, of the `group` of its K/V head: group / S with kGroupSplit.
template <class F, bool kDeterministic>
__device__ __forceinline__ int query_heads_of_block(int group, int group_split) {
    if constexpr (kGroupSplit<F, kDeterministic>) {
        return group / group_split;
    } else {
        return group;
    }
}

/// The first query head this block visits, for K/V head `h_kv`: h_kv G + s G / S.
template <class F, bool kDeterministic>
__device__ __forceinline__ int first_query_head(int h_kv, int group, int group_split) {
    if constexpr (kGroupSplit<F, kDeterministic>) {
        return h_kv * group + split_of_block<F, kDeterministic>(group_split) * (group / group_split);
    } else {
        return h_kv * group;
    }
}
//! [group_split]

//! [packed_order]
/// The K/V heads of `a` (Hq / Hk with grouped heads, Hq otherwise).
template <class F, class T>
__device__ __forceinline__ int kv_heads_of(const Args<T>& a) {
    return a.heads / (kGroupedHeads<F> ? a.kv_group : 1);
}

/// The entry of the packed schedule this block works on, and (packed_kv_head()) its K/V head
/// (kPacked). With a.key_blocks_outer (atomic dQ; the host's packed_longest_first()) the grid
/// goes entry by entry, the K/V heads innermost: base block e Hk + h_kv, over a schedule the host
/// sorted longest loop first (kv_schedule()), so that the first wave holds the longest key blocks
/// of every head and every sequence. Otherwise head by head, base block h_kv E + e: the blocks
/// running at once share their head's Q and dO in L2, and in the deterministic mode a block waits
/// only for blocks of its own head with smaller numbers, as in the dense grid.
template <class F, bool kDeterministic, class T>
__device__ __forceinline__ int schedule_entry(const Args<T>& a) {
    const unsigned base = base_block<F, kDeterministic>(a.group_split);
    if (!kDeterministic && a.key_blocks_outer) return int(base / unsigned(kv_heads_of<F>(a)));
    return int(base % unsigned(a.schedule_entries));
}

/// The K/V head (b Hk + h_kv with b = 0: a packed batch is one batch entry) of this packed block.
template <class F, bool kDeterministic, class T>
__device__ __forceinline__ int packed_kv_head(const Args<T>& a) {
    const unsigned base = base_block<F, kDeterministic>(a.group_split);
    if (!kDeterministic && a.key_blocks_outer) return int(base % unsigned(kv_heads_of<F>(a)));
    return int(base / unsigned(a.schedule_entries));
}
//! [packed_order]

//! [model_varlen_block]
/// The arguments of a packed batch (kPacked) as this block sees them: its sequence b (entry
/// base_block() mod E of the schedule) alone, as a dense batch of one. Every pointer starts at the
/// sequence's first row (cu_seqlens), Nq, Nk, Tr and Tc are the sequence's; the per-row arrays
/// keep their head stride (seq_q_padded), so the sequence's rows of head h start at h
/// seq_q_padded + cu_seqlens_q[b]. Everything downstream (the window's ranges, the masks, the
/// tile copies, the stores of dK and dV) then reads one sequence as it reads a dense head,
/// bottom-right alignment included, and never touches another sequence's rows.
template <class F, int D, bool kDeterministic, class T>
__device__ __forceinline__ Args<T> sequence_args(const Args<T>& a) {
    Args<T> s = a;
    const int b = a.kv_schedule[2 * schedule_entry<F, kDeterministic>(a)];
    const int q_begin = a.cu_seqlens_q[b], k_begin = a.cu_seqlens_k[b];
    s.seq_q = a.cu_seqlens_q[b + 1] - q_begin;
    s.seq_k = a.cu_seqlens_k[b + 1] - k_begin;
    s.q_blocks = (s.seq_q + F::kBr - 1) / F::kBr;
    s.k_blocks = (s.seq_k + F::kBc - 1) / F::kBc;
    s.q = a.q + int64_t(q_begin) * a.q_sn;
    s.dout = a.dout + int64_t(q_begin) * a.do_sn;
    s.k = a.k + int64_t(k_begin) * a.k_sn;
    s.v = a.v + int64_t(k_begin) * a.v_sn;
    s.dk = a.dk + int64_t(k_begin) * a.dk_sn;
    s.dv = a.dv + int64_t(k_begin) * a.dv_sn;
    s.lse_log2 = a.lse_log2 + q_begin;
    s.delta = a.delta + q_begin;
    s.dq_accum = a.dq_accum + int64_t(q_begin) * D;
    s.q_row0 = q_begin;
    if (a.turns != nullptr) s.turns = a.turns + q_begin;
    if constexpr (kGroupSplit<F, kDeterministic>) {  // the sequence's rows of each K/V head's partials
        s.dk_partial = a.dk_partial + int64_t(k_begin) * D;
        s.dv_partial = a.dv_partial + int64_t(k_begin) * D;
    }
    return s;
}

/// load_row_stats() for a packed batch: a sequence's rows start anywhere, so its Br floats of
/// L log2(e) and D need not be 16-byte aligned. One 4-byte cp.async per float (cp_async_4), by the
/// first 2 Br threads, in the commit group of the query block's tiles: like the aligned copies,
/// they cost the thread no wait (a load and a store would stall it on the load, about 5 % of the
/// kernel's warp samples at d = 64). Rows past the sequence belong to the next one (or to the
/// padding): the mask hides them (query < Nq).
template <class F>
__device__ __forceinline__ void load_row_stats_unaligned(float* lse_slot, float* delta_slot, const float* lse_head,
                                                         const float* delta_head, int q0) {
    static_assert(2 * F::kBr <= 32 * F::kWarps, "enough threads for one float each");
    const int tid = int(threadIdx.x);
    if (tid < F::kBr) {
        cp_async_4(smem_address(lse_slot + tid), lse_head + q0 + tid);
    } else if (tid < 2 * F::kBr) {
        cp_async_4(smem_address(delta_slot + tid - F::kBr), delta_head + q0 + tid - F::kBr);
    }
}
//! [model_varlen_block]

//! [model_heads]
/// `w` moved to query head `hq` of its batch: that head's rows of Q, dO, L log2(e), D and the dQ
/// accumulator, and bh (its turns). K, V, dK and dV stay those of the K/V head `w.h`.
template <class T, int D>
__device__ __forceinline__ BlockView<T> for_query_head(const Args<T>& a, BlockView<T> w, int hq) {
    w.bh = w.b * a.heads + hq;
    w.q = a.q + w.b * a.q_sb + hq * a.q_sh;
    w.dout = a.dout + w.b * a.do_sb + hq * a.do_sh;
    w.lse = a.lse_log2 + int64_t(w.bh) * a.seq_q_padded;
    w.delta = a.delta + int64_t(w.bh) * a.seq_q_padded;
    w.dq = a.dq_accum + int64_t(w.bh) * a.seq_q_padded * D;
    return w;
}

/// The BlockView of this thread block with stage 10's switches: base block (b Hk + h_kv) Tc + jb
/// of a flat grid works on key block j of K/V head h_kv, which query heads h_kv G .. h_kv G + G - 1
/// read (G = Hq / Hk, kGroupedHeads; G = 1 otherwise); it starts at the first query head of its
/// split of the group (the group split: block base S + s takes the G / S heads from h_kv G + s G / S;
/// S = 1 without it, base = blockIdx).
/// Packed (kPacked, `a` the block's sequence_args()): entry e of the schedule for K/V head h_kv,
/// base block e Hk + h_kv (a.key_blocks_outer) or h_kv E + e: schedule_entry().
/// A dense grid with a.key_blocks_outer (atomic dQ) goes key block by key block instead: base block
/// j (B Hk) + b Hk + h_kv, so that the first wave holds the key blocks with the most query blocks
/// to visit of every head (grouped heads make a block's loop G times longer and the blocks G
/// times fewer: head by head, the long loops of the last heads would start when the first wave
/// is half done and run alone at the end).
template <class T, int D, class F, bool kDeterministic>
__device__ __forceinline__ BlockView<T> model_block_view(const Args<T>& a) {
    const int group = kGroupedHeads<F> ? a.kv_group : 1;
    const int kv_heads = kv_heads_of<F>(a);
    const unsigned base = base_block<F, kDeterministic>(a.group_split);
    BlockView<T> w;
    int bh_kv;
    if constexpr (kPacked<F>) {  // entry e of the schedule, for its K/V head (schedule_entry())
        bh_kv = packed_kv_head<F, kDeterministic>(a);
        w.j = a.kv_schedule[2 * schedule_entry<F, kDeterministic>(a) + 1];
    } else if (!kDeterministic && a.key_blocks_outer) {  // the longest loops first, across all heads
        const unsigned base_grid = gridDim.x / unsigned(kGroupSplit<F, kDeterministic> ? a.group_split : 1);
        const unsigned heads_of_grid = base_grid / unsigned(a.k_blocks);  // B Hk
        bh_kv = int(base % heads_of_grid);
        w.j = int(base / heads_of_grid);
    } else {
        bh_kv = int(base / unsigned(a.k_blocks));
        w.j = key_block_of_block<kDeterministic>(a, base);
    }
    w.b = bh_kv / kv_heads;
    w.h = bh_kv % kv_heads;
    w.kv0 = w.j * F::kBc;
    w.k = a.k + w.b * a.k_sb + w.h * a.k_sh;
    w.v = a.v + w.b * a.v_sb + w.h * a.v_sh;
    return for_query_head<T, D>(a, w, first_query_head<F, kDeterministic>(w.h, group, a.group_split));
}
//! [model_heads]

//! [pipeline]
/// The pipeline both main kernels run around their work on each query block. Prologue: K_j and
/// V_j (rows past Nk zero-filled) and the first query block's Q_i, dO_i, L_i and D_i, one commit
/// group. Then for each query block i that key block j sees: wait for this thread's copies of
/// block i, a barrier, `after_barrier(i, i_begin)`, the prefetch of block i+1 into the other slot
/// of the rings (the slot iteration i-1 read: free since the barrier), and `body(i, slot)` while
/// that prefetch is in flight. Nothing is still landing when it returns, even if no query block
/// was visited.
///
/// The barrier orders every thread's copies of block i before any warp reads them, and every
/// warp's reads of iteration i-1 (its Q/dO slot, and the kernel's own tiles of dS^T or P^T)
/// before the prefetch and this iteration's stores overwrite them.
template <class F, class L, int kThreads, int kQElems, class T, class AfterBarrier, class Body>
__device__ __forceinline__ void query_block_pipeline(const Args<T>& a, const BlockView<T>& w, uint16_t* k_tile,
                                                     uint16_t* v_tile, uint16_t* q_ring, uint16_t* do_ring,
                                                     float* lse_ring, float* delta_ring, AfterBarrier&& after_barrier,
                                                     Body&& body) {
    const int i_begin = first_query_block(w.j, F::kBr, F::kBc, a.seq_q, a.seq_k, a.causal);
    const int i_end = a.q_blocks;
    const auto load_query_block = [&](int i, int slot) {
        cuda::load_tile_gmem_to_smem<F::kBr, L, kThreads>(reinterpret_cast<T*>(q_ring + slot * kQElems), w.q, a.q_sn,
                                                          i * F::kBr, a.seq_q);
        cuda::load_tile_gmem_to_smem<F::kBr, L, kThreads>(reinterpret_cast<T*>(do_ring + slot * kQElems), w.dout,
                                                          a.do_sn, i * F::kBr, a.seq_q);
        load_row_stats<F>(lse_ring + slot * F::kBr, delta_ring + slot * F::kBr, w.lse, w.delta, i * F::kBr);
    };

    cuda::load_tile_gmem_to_smem<F::kBc, L, kThreads>(reinterpret_cast<T*>(k_tile), w.k, a.k_sn, w.kv0, a.seq_k);
    cuda::load_tile_gmem_to_smem<F::kBc, L, kThreads>(reinterpret_cast<T*>(v_tile), w.v, a.v_sn, w.kv0, a.seq_k);
    if (i_begin < i_end) load_query_block(i_begin, 0);
    fa::cuda::ptx::cp_async_commit();

    for (int i = i_begin; i < i_end; ++i) {
        const int slot = (i - i_begin) % 2;
        fa::cuda::ptx::cp_async_wait<0>();  // this thread's copies of block i (and of K_j, V_j) have landed
        __syncthreads();
        after_barrier(i, i_begin);
        if (i + 1 < i_end) load_query_block(i + 1, slot ^ 1);
        fa::cuda::ptx::cp_async_commit();  // (possibly empty) group of block i+1, in flight during the body
        body(i, slot);
    }
    fa::cuda::ptx::cp_async_wait<0>();  // nothing may still be landing (the loop may not have run)
}
//! [pipeline]

//! [model_pipeline]
/// `w` moved from its query head to the next one: for_query_head(a, w, h + 1) as additions of one
/// head's strides, with no multiplication.
template <class T, int D>
__device__ __forceinline__ BlockView<T> next_query_head(const Args<T>& a, BlockView<T> w) {
    w.bh += 1;
    w.q += a.q_sh;
    w.dout += a.do_sh;
    w.lse += a.seq_q_padded;
    w.delta += a.seq_q_padded;
    w.dq += int64_t(a.seq_q_padded) * D;
    return w;
}

/// query_block_pipeline with stage 10's switches. Key block j visits the query blocks
/// [i_begin, i_end) whose rows see its keys (kWindow: window_query_blocks(), the window's range,
/// masked at its two ends), once for every query head of its K/V head's group
/// (kGroupedHeads: G = Hq / Hk heads, in order; with the group split the G / S heads of this
/// block's split), as one stream of G (i_end - i_begin) iterations
/// through the same rings: the prefetch runs from one head's last query block into the next
/// head's first, and K_j, V_j (and the caller's dK_j, dV_j in registers) stay for the whole group.
/// `w` is on the query head of the iteration whose `body(i, slot)` runs, so that the body reads
/// that head's rows and adds into that head's dQ; it moves to the next head (next_query_head())
/// after the head's last query block. The query block and the head are counted along, not
/// divided out of the iteration's number: a division by a runtime count costs some twenty
/// instructions, and the loop would need two per iteration.
template <class F, class L, int kThreads, int kQElems, int D, bool kDeterministic, class T, class Body>
__device__ __forceinline__ void model_query_block_pipeline(const Args<T>& a, BlockView<T>& w, uint16_t* k_tile,
                                                           uint16_t* v_tile, uint16_t* q_ring, uint16_t* do_ring,
                                                           float* lse_ring, float* delta_ring, Body&& body) {
    //! [model_group_loop]
    int i_begin, i_end;  // the query blocks key block j visits (the window's range, or the causal one)
    if constexpr (kWindow<F>) {
        window_query_blocks(w.j, F::kBr, F::kBc, a.seq_q, a.seq_k, a.window_left, a.window_right, i_begin, i_end);
    } else {
        i_begin = first_query_block(w.j, F::kBr, F::kBc, a.seq_q, a.seq_k, a.causal), i_end = a.q_blocks;
    }
    const int blocks = i_end - i_begin > 0 ? i_end - i_begin : 0;  // query blocks per query head
    const int group = kGroupedHeads<F> ? a.kv_group : 1;
    const int heads = query_heads_of_block<F, kDeterministic>(group, a.group_split);  // G, or G / S with the group split
    const int iterations = heads * blocks;
    //! [model_group_loop]
    // Query block i of the head `x` is on (w already is on the first head of the block's split).
    const auto load_query_block = [&](const BlockView<T>& x, int i, int slot) {
        const int q0 = i * F::kBr;
        cuda::load_tile_gmem_to_smem<F::kBr, L, kThreads>(reinterpret_cast<T*>(q_ring + slot * kQElems), x.q, a.q_sn, q0,
                                                          a.seq_q);
        cuda::load_tile_gmem_to_smem<F::kBr, L, kThreads>(reinterpret_cast<T*>(do_ring + slot * kQElems), x.dout, a.do_sn,
                                                          q0, a.seq_q);
        if constexpr (kPacked<F>) {
            load_row_stats_unaligned<F>(lse_ring + slot * F::kBr, delta_ring + slot * F::kBr, x.lse, x.delta, q0);
        } else {
            load_row_stats<F>(lse_ring + slot * F::kBr, delta_ring + slot * F::kBr, x.lse, x.delta, q0);
        }
    };

    cuda::load_tile_gmem_to_smem<F::kBc, L, kThreads>(reinterpret_cast<T*>(k_tile), w.k, a.k_sn, w.kv0, a.seq_k);
    cuda::load_tile_gmem_to_smem<F::kBc, L, kThreads>(reinterpret_cast<T*>(v_tile), w.v, a.v_sn, w.kv0, a.seq_k);
    if (iterations > 0) load_query_block(w, i_begin, 0);
    fa::cuda::ptx::cp_async_commit();

    int i = i_begin;  // iteration n's query block, of the head `w` is on
    for (int n = 0; n < iterations; ++n) {
        const int slot = n % 2;
        fa::cuda::ptx::cp_async_wait<0>();  // this thread's copies of iteration n (and of K_j, V_j) have landed
        __syncthreads();  // ... and every thread's; every warp is done with iteration n-1's slot
        const bool head_done = i + 1 == i_end;  // iteration n+1 starts the next head
        if (n + 1 < iterations) {
            if (head_done) {
                load_query_block(next_query_head<T, D>(a, w), i_begin, slot ^ 1);
            } else {
                load_query_block(w, i + 1, slot ^ 1);
            }
        }
        fa::cuda::ptx::cp_async_commit();  // (possibly empty) group of iteration n+1, in flight during the body
        body(i, slot);
        if (head_done && n + 1 < iterations) {
            w = next_query_head<T, D>(a, w);
            i = i_begin;
        } else {
            ++i;
        }
    }
    fa::cuda::ptx::cp_async_wait<0>();  // nothing may still be landing (the loop may not have run)
}
//! [model_pipeline]

//! [store_dkdv]
/// The last part of both epilogues: rows [row0, row0 + rows) of dK_j and dV_j, already rounded to
/// T and staged in the K_j and V_j tiles, written to global memory as 16-byte chunks, chunk c by
/// the thread with c = first + n stride. Rows past Nk are not this block's to write.
template <class T, int D, class L>
__device__ __forceinline__ void store_dkdv_rows(const Args<T>& a, const BlockView<T>& w, const uint16_t* k_tile,
                                                const uint16_t* v_tile, int row0, int rows, int first, int stride) {
    T* dk_head = a.dk + w.b * a.dk_sb + w.h * a.dk_sh;
    T* dv_head = a.dv + w.b * a.dv_sb + w.h * a.dv_sh;
    constexpr int kChunksPerRow = D / 8;
#pragma unroll
    for (int c = first; c < rows * kChunksPerRow; c += stride) {
        const int r = row0 + c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
        const int key = w.kv0 + r;
        if (key < a.seq_k) {
            *reinterpret_cast<uint4*>(dk_head + int64_t(key) * a.dk_sn + col) =
                *reinterpret_cast<const uint4*>(k_tile + L::offset(r, col));
            *reinterpret_cast<uint4*>(dv_head + int64_t(key) * a.dv_sn + col) =
                *reinterpret_cast<const uint4*>(v_tile + L::offset(r, col));
        }
    }
}
//! [store_dkdv]

}  // namespace detail

//! [kernel]
/// The main backward kernel: one block per (key block j, batch, head) in a flat grid, j fastest
/// (Tc blocks of one head are neighbours, so the deterministic mode's predecessors of a block
/// were launched before it, and the blocks running together share one head's Q and dO in L2);
/// the deterministic mode counts j from the last key block (key_block_of_this_block).
template <class T, int D, class F, bool kDeterministic>
__global__ void __launch_bounds__(Shape<T, D, F>::kThreads, F::kMinBlocksPerSm) flash_backward_kernel(const Args<T> a) {
    using S = Shape<T, D, F>;
    using L = cuda::TileLayout<D, true>;  // K_j, V_j, Q_i, dO_i (and dK_j, dV_j on their way out): rows of d features
    extern __shared__ __align__(128) unsigned char smem_raw[];
    uint16_t* k_tile = reinterpret_cast<uint16_t*>(smem_raw);  // [Bc, d]   K_j, swizzled
    uint16_t* v_tile = k_tile + S::kKVElems;                    // [Bc, d]   V_j
    uint16_t* q_ring = v_tile + S::kKVElems;                    // 2 x [Br, d] Q_i
    uint16_t* do_ring = q_ring + 2 * S::kQElems;                // 2 x [Br, d] dO_i
    uint16_t* ds_tile = do_ring + 2 * S::kQElems;               // [Bc, Br]  dS^T
    float* lse_ring = reinterpret_cast<float*>(ds_tile + S::kDsElems);  // 2 x [Br] L_i log2(e)
    float* delta_ring = lse_ring + 2 * F::kBr;                         // 2 x [Br] D_i

    const detail::BlockView<T> w = detail::block_view<T, D, F::kBc, kDeterministic>(a);
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int g = lane / 4, t = lane % 4;

    detail::WarpState<T, D, F> st;
#pragma unroll
    for (int dt = 0; dt < S::kDTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) st.dk[dt][e] = st.dv[dt][e] = 0.0f;

    const auto kv_fragments_once = [&](int i, int i_begin) {
        if (F::kKVInRegisters && i == i_begin) {
            // K_w and V_w as A fragments, once: the same 16 keys for every query block.
            const uint32_t k_a = fa::cuda::ptx::smem_address(k_tile) + cuda::a_lane_bytes<L>(lane);
            const uint32_t v_a = fa::cuda::ptx::smem_address(v_tile) + cuda::a_lane_bytes<L>(lane);
#pragma unroll
            for (int ks = 0; ks < detail::WarpState<T, D, F>::kFragSteps; ++ks) {
                fa::cuda::ptx::ldmatrix_x4(st.k[ks], cuda::fragment_address<L>(k_a, warp * 16, ks * 16));
                fa::cuda::ptx::ldmatrix_x4(st.v[ks], cuda::fragment_address<L>(v_a, warp * 16, ks * 16));
            }
        }
    };
    const auto query_block = [&](int i, int slot) {
        const int q0 = i * F::kBr;
        const uint16_t* q_tile = q_ring + slot * S::kQElems;
        const uint16_t* do_tile = do_ring + slot * S::kQElems;
        const float* lse_slot = lse_ring + slot * F::kBr;
        const float* delta_slot = delta_ring + slot * F::kBr;
        const bool mask = block_needs_mask(q0, w.kv0, F::kBc, a.seq_q, a.seq_k, a.causal);
#pragma unroll 1  // one step at a time: unrolled, the compiler would keep two steps' S^T and dP^T alive
        for (int step = 0; step < S::kSteps; ++step) {
            if (mask) {
                detail::process_step<T, D, F, true>(st, k_tile, v_tile, q_tile, do_tile, lse_slot, delta_slot, ds_tile, q0,
                                                    step * F::kBn, w.kv0, a, warp, lane);
            } else {
                detail::process_step<T, D, F, false>(st, k_tile, v_tile, q_tile, do_tile, lse_slot, delta_slot, ds_tile,
                                                     q0, step * F::kBn, w.kv0, a, warp, lane);
            }
        }

        if constexpr (kDeterministic) detail::wait_for_turn<T, F::kBr, F::kBc>(a, w.bh, i, w.j);
        // Orders every warp's dS^T stores before the dQ products read them (and, deterministic,
        // the turn thread 0 just acquired before every thread's dQ_i accesses).
        __syncthreads();
        detail::accumulate_dq<T, D, F>(ds_tile, k_tile, w.dq + int64_t(q0) * D, warp, lane);
        if constexpr (kDeterministic) detail::pass_turn(a, w.bh, i);
    };
    detail::query_block_pipeline<F, L, S::kThreads, S::kQElems>(a, w, k_tile, v_tile, q_ring, do_ring, lse_ring,
                                                                delta_ring, kv_fragments_once, query_block);

    // Epilogue: dK_j = scale * sum dS^T Q and dV_j, rounded to T and written through shared memory
    // (whole 16-byte rows in global memory). Every warp has finished reading K_j (all of it, in
    // the dQ products) and V_j once all warps pass this barrier; each warp then stages its own 16
    // rows of dK in K_j's tile and of dV in V_j's, and writes them.
    __syncthreads();
#pragma unroll
    for (int dt = 0; dt < S::kDTiles; ++dt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int r = warp * 16 + g + 8 * hh, c = dt * 8 + 2 * t;
            *reinterpret_cast<uint32_t*>(k_tile + L::offset(r, c)) =
                fa::cuda::ptx::pack2<T>(st.dk[dt][2 * hh] * a.scale, st.dk[dt][2 * hh + 1] * a.scale);
            *reinterpret_cast<uint32_t*>(v_tile + L::offset(r, c)) =
                fa::cuda::ptx::pack2<T>(st.dv[dt][2 * hh], st.dv[dt][2 * hh + 1]);
        }
    __syncwarp();  // orders this warp's staging stores before its 16-byte reads of the same rows
    detail::store_dkdv_rows<T, D, L>(a, w, k_tile, v_tile, warp * 16, 16, lane, 32);
}
//! [kernel]

}  // namespace fa::stage09
