/// \file stages/09_backward_kernel/warp_tiled.cuh
/// \brief Stage 09's second main kernel: warps tile every product of the backward in two
/// dimensions, and P^T and dS^T pass through shared memory between the products.
///
/// The first kernel (kernel.cuh) gives each warp 16 keys for the whole kernel: S^T, P^T, dP^T
/// and dS^T of those keys stay in its registers and feed dV and dK directly. The price is that
/// every B fragment it loads (a piece of Q_i or dO_i) feeds a single 16-row m-tile, and each of
/// its warps reads all of Q_i and dO_i twice per key block: about 12.8 floating-point operations
/// per byte read from shared memory, where the tensor cores need more to stay busy: the mma.sync
/// ceiling per SM and clock (bench/mma_ceiling, docs/results/mma_ceiling.jsonl) over the 128 bytes
/// per clock an SM's shared memory delivers. This kernel raises that ratio by giving each warp a 32 x 32 (or larger) piece of
/// every product, so each loaded fragment feeds two m-tiles and two n-tiles:
///
///     S^T, dP^T [Bc keys, Br queries]  warps in a KeyWarps x QueryWarps grid, 32 keys each
///     P^T, dS^T -> shared memory (16-bit) ; barrier
///     dV, dK    [Bc keys, d]           the same KeyWarps along keys, QueryWarps along d
///     dQ_i      [Br queries, d]        (Br/32) x (Warps/(Br/32)) warps, 32 rows each
///
/// Every product now reads its A operand from shared memory (P^T, dS^T for dV, dK; the others as
/// before), and the 16-bit P^T and dS^T cost one store per element. The block is larger (Bc = 128
/// keys, 8 warps): each key block adds its dQ_i once per query block, so doubling Bc halves the
/// float32 atomic traffic of dQ per FLOP.
///
/// Steps 2 and 3 of the road run this same kernel with other features (launch.cuh): 64-query by
/// 128-key blocks at d = 128 (TunedKeys128), and on top of that dP^T computed 16 query columns at
/// a time (WithDpPieces), so that fewer of its registers spill.
#pragma once

#include <cstdint>
#include <type_traits>

#include "fa/philox.hpp"
#include "kernel.cuh"

namespace fa::stage09 {

//! [tiled_features]
/// The compile-time shape of the warp-tiled kernel.
template <int Br, int Bc, int Warps, int KeyWarps, int Bn, int MinBlocksPerSm = 1>
struct TiledFeatures {
    static constexpr int kBr = Br;        ///< query rows per query block Q_i, dO_i, dQ_i
    static constexpr int kBc = Bc;        ///< keys per key block K_j, V_j, dK_j, dV_j
    static constexpr int kWarps = Warps;  ///< warps per block
    /// warps along the keys in S^T, dP^T, dK and dV; the other Warps / KeyWarps warps split the
    /// queries of S^T and dP^T, and the features of dK and dV
    static constexpr int kKeyWarps = KeyWarps;
    /// query columns of S^T and dP^T a warp computes at a time (its registers follow Bn)
    static constexpr int kBn = Bn;
    /// blocks that must fit on one SM at once: caps the registers per thread at 65536 / (threads x this)
    static constexpr int kMinBlocksPerSm = MinBlocksPerSm;
};

/// Features F with dP^T (and dS^T) computed DpColumns query columns at a time instead of Bn: one
/// piece of dP^T beside the step's P^T in registers instead of all of it. For a block whose dK and
/// dV already fill half the registers (d = 128, 32 keys by 64 features per warp), that is what
/// keeps the rest from spilling.
template <class F, int DpColumns>
struct WithDpPieces : F {
    static constexpr int kDpColumns = DpColumns;  ///< query columns of dP^T per piece
    static_assert(F::kBn % DpColumns == 0 && DpColumns % 16 == 0, "whole pieces of 16-column k-steps");
};

/// Features F with dV and dK fed from the registers that hold P^T and dS^T (stage 07's identity:
/// two neighbouring 8-column accumulator tiles are one 16-column A fragment), as the first kernel
/// feeds them, instead of from the shared P^T and dS^T tiles. Each warp then owns dK and dV for
/// its keys and all d features, summed over its own query columns only; the Warps / KeyWarps warps
/// that share the keys add their partial sums once, at the end. What it saves per query block:
/// the 16-bit P^T tile (its stores and its shared memory), and the ldmatrix of the A operands of
/// dV and dK; dS^T still goes through shared memory for dQ. What it costs: dK and dV of d features
/// per warp instead of d / (Warps / KeyWarps), registers only small head dimensions can spare.
template <class F>
struct WithPtInRegisters : F {
    static constexpr bool kPtInRegisters = true;  ///< dV, dK from the registers of P^T, dS^T
};

//! [fresh_lanes]
/// Features F whose warps compute their offsets afresh in every query block: the lane's and the
/// warp's parts of every shared-memory address (which rows, columns and swizzled chunks it reads
/// and writes) are worked out again from threadIdx at the start of each query block, and from the
/// lane again in dK, dV's and dQ's products. Without it the compiler computes those addresses
/// once, before the loop over query blocks, and keeps them for the whole kernel: a dozen or more
/// registers beside the 128 of dK and dV, which is what spilled (76 bytes per thread at d = 128,
/// 36 at d = 64, all of them such addresses, stored before the loop and loaded in every
/// iteration). Afresh, they cost a few integer instructions per query block and live only
/// while their phase runs: no spills at d = 64 or 128 (`-Xptxas -v`, CUDA 13.0, sm_90).
template <class F>
struct WithFreshLanes : F {
    static constexpr bool kFreshLanes = true;  ///< offsets computed again in each query block
};

//! [dq_adds]
/// Features F whose dQ_i additions each carry `Width` consecutive float32 of one row: 1, one
/// `red.global.add.f32` per value (FlashAttention-2's form); 2, the default, one
/// `red.global.add.v2.f32` per pair a lane holds; 4, `red.global.add.v4.f32` (sm_90), a lane and its
/// neighbour lane ^ 1 first trading the pairs of the other's row, so that each holds four
/// consecutive values of one row (two shuffles per four values, half the additions of Width 2).
template <class F, int Width>
struct WithDqAdds : F {
    static constexpr int kDqAddWidth = Width;  ///< float32 per dQ addition
    static_assert(Width == 1 || Width == 2 || Width == 4, "one, two or four float32 per addition");
};
//! [dq_adds]

//! [dq_tiles]
/// Features F whose float32 dQ accumulator is stored in tiles of 8 rows by 8 features
/// (dq_tile_offset(), kernel.cuh) instead of row by row: the eight rows a warp's addition touches
/// (lanes g = 0 ... 7) are then one tile, 256 bytes side by side, where in rows they are eight
/// 32-byte pieces of eight 128-byte lines. The postprocessing kernel reads the tiles back
/// (backward_postprocess_kernel with kDqTiled). A packed batch's sequence starts on any row: its
/// rows fall into the tiles of the packed rows from that row's place on (Args::q_row0), so that
/// one addition spans at most two tiles.
template <class F>
struct WithDqTiles : F {
    static constexpr bool kDqTiles = true;  ///< dQ accumulator in 8 x 8 tiles
};
//! [dq_tiles]
//! [tiled_features]

/// Whether F feeds dV and dK from registers (WithPtInRegisters) or from the shared P^T and dS^T.
template <class F, class = void>
inline constexpr bool kPtInRegisters = false;
/// kPtInRegisters for features that say so.
template <class F>
inline constexpr bool kPtInRegisters<F, std::void_t<decltype(F::kPtInRegisters)>> = F::kPtInRegisters;

/// Whether F's warps compute their offsets afresh in each query block (WithFreshLanes).
template <class F, class = void>
inline constexpr bool kFreshLanes = false;
/// kFreshLanes for features that say so.
template <class F>
inline constexpr bool kFreshLanes<F, std::void_t<decltype(F::kFreshLanes)>> = F::kFreshLanes;

/// Whether F stores the dQ accumulator in 8 x 8 tiles (WithDqTiles).
template <class F, class = void>
inline constexpr bool kDqTiles = false;
/// kDqTiles for features that say so.
template <class F>
inline constexpr bool kDqTiles<F, std::void_t<decltype(F::kDqTiles)>> = F::kDqTiles;

/// Float32 values per dQ addition: F::kDqAddWidth where F names it (WithDqAdds), else 2.
template <class F, class = void>
inline constexpr int kDqAddWidth = 2;
/// kDqAddWidth for features that name it.
template <class F>
inline constexpr int kDqAddWidth<F, std::void_t<decltype(F::kDqAddWidth)>> = F::kDqAddWidth;

/// Query columns of dP^T per piece: F::kDpColumns where F names it (WithDpPieces), else F::kBn
/// (all the step's columns at once).
template <class F, class = void>
inline constexpr int kDpColumns = F::kBn;
/// kDpColumns for features that name their pieces.
template <class F>
inline constexpr int kDpColumns<F, std::void_t<decltype(F::kDpColumns)>> = F::kDpColumns;

/// Shape constants of one warp-tiled kernel instance.
template <class T, int D, class F>
struct TiledShape {
    static_assert(sizeof(T) == 2, "tensor-core operands are 16-bit");
    static_assert(D == 32 || D % 64 == 0, "d = 32 or a multiple of 64 (the swizzled tiles' rows)");
    static_assert(F::kBr == 32 || F::kBr % 64 == 0, "P^T and dS^T rows (Br queries) are 64 bytes or whole 128-byte segments");
    static constexpr int kThreads = F::kWarps * 32;                ///< threads per block
    static constexpr int kQueryWarps = F::kWarps / F::kKeyWarps;   ///< warps along queries (S^T) and features (dK, dV)
    static constexpr int kKeysPerWarp = F::kBc / F::kKeyWarps;     ///< keys of S^T, dK, dV per warp
    static constexpr int kKeyTiles = kKeysPerWarp / 16;            ///< 16-key m-tiles per warp
    static constexpr int kQueriesPerWarp = F::kBr / kQueryWarps;   ///< query columns of S^T per warp
    static constexpr int kSteps = kQueriesPerWarp / F::kBn;        ///< steps of Bn columns
    static constexpr int kNTiles = F::kBn / 8;                     ///< 8-query column tiles per step
    static constexpr int kKSteps = D / 16;                         ///< k-steps of S^T and dP^T
    /// features of dK, dV per warp: all d when they are fed from registers (WithPtInRegisters)
    static constexpr int kDkvCols = kPtInRegisters<F> ? D : D / kQueryWarps;
    static constexpr int kDkvTiles = kDkvCols / 8;                 ///< 8-feature tiles of dK, dV per warp
    static constexpr int kQSteps = F::kBr / 16;                    ///< k-steps of dV and dK (queries)
    static constexpr int kDqRowWarps = F::kBr / 32;                ///< warps along dQ_i's rows (32 each)
    static constexpr int kDqColWarps = F::kWarps / kDqRowWarps;    ///< warps along dQ_i's features
    static constexpr int kDqCols = D / kDqColWarps;                ///< dQ_i features per warp
    static_assert(F::kWarps % F::kKeyWarps == 0 && F::kBc % (16 * F::kKeyWarps) == 0, "whole 16-key tiles per warp");
    static_assert(F::kBr % kQueryWarps == 0 && kQueriesPerWarp % F::kBn == 0 && F::kBn % 16 == 0,
                  "whole steps of Bn query columns, Bn a multiple of 16");
    static_assert(D % kQueryWarps == 0 && kDkvCols % 16 == 0, "dK and dV features split in 16-feature pairs");
    static_assert(F::kBr % 32 == 0 && F::kWarps % kDqRowWarps == 0 && D % kDqColWarps == 0 && kDqCols % 16 == 0,
                  "dQ_i split in 32-row, 16-feature-pair pieces");
    static constexpr int kKVElems = F::kBc * D;       ///< elements of the K_j or V_j tile
    static constexpr int kQElems = F::kBr * D;        ///< elements of one Q_i or dO_i slot
    static constexpr int kPElems = F::kBc * F::kBr;   ///< elements of the P^T or dS^T tile
    static constexpr int kPTiles = kPtInRegisters<F> ? 1 : 2;  ///< shared [Bc, Br] tiles: dS^T, and P^T unless in registers
    /// Shared memory: K_j, V_j; two slots each of Q_i and dO_i; P^T (unless in registers) and
    /// dS^T; two slots each of the Br floats of L_i log2(e) and D_i.
    static constexpr size_t kSmemBytes =
        2 * (2 * size_t(kKVElems) + 4 * size_t(kQElems) + kPTiles * size_t(kPElems)) + 4 * 4 * size_t(F::kBr);
    static_assert(!kPtInRegisters<F> || kDpColumns<F> == F::kBn, "dP^T in pieces and P^T in registers are not combined");
    /// WithPtInRegisters: the float32 partial sums of dK and dV that the warps sharing their keys
    /// add at the end pass through the rings of Q_i and dO_i and the dS^T tile, free by then.
    static_assert(!kPtInRegisters<F> || 2 * 4 * size_t(F::kBc) * D <= 2 * (4 * size_t(kQElems) + size_t(kPElems)),
                  "the partial sums of dK and dV fit where Q_i, dO_i and dS^T were");
};

/// One warp's dK or dV accumulators: [key tiles][8-feature tiles][4 floats of the C fragment].
template <class T, int D, class F>
using DkvAccumulators = float[TiledShape<T, D, F>::kKeyTiles][TiledShape<T, D, F>::kDkvTiles][4];

namespace detail {

//! [fresh]
/// `x`, as a value the compiler cannot trace back (WithFreshLanes): an empty `asm volatile` that
/// says it changed `x`. What is computed from it is then computed where it is used, after this
/// point, instead of once before the loop and kept in a register. Without kFreshLanes, `x`.
template <class F>
__device__ __forceinline__ int fresh(int x) {
    if constexpr (kFreshLanes<F>) asm volatile("" : "+r"(x));
    return x;
}

/// Where one warp works in the block: its lane, the first key of its S^T, dP^T, dK and dV rows,
/// its first query column of S^T and dP^T, its first feature of dK and dV, and its rows and first
/// feature of dQ_i.
struct WarpPlace {
    int lane;        ///< the lane, 0 to 31
    int warp;        ///< the warp in the block
    int key_row0;    ///< first key of S^T, dP^T, dK, dV (in the key block)
    int query_col0;  ///< first query column of S^T and dP^T (in the query block)
    int dkv_col0;    ///< first feature of dK and dV
    int dq_row0;     ///< first row of dQ_i
    int dq_col0;     ///< first feature of dQ_i
};

/// The WarpPlace of thread `tid` of the block.
template <class T, int D, class F>
__device__ __forceinline__ WarpPlace warp_place(int tid) {
    using S = TiledShape<T, D, F>;
    WarpPlace w;
    w.warp = tid / 32, w.lane = tid % 32;
    w.key_row0 = (w.warp % F::kKeyWarps) * S::kKeysPerWarp;
    w.query_col0 = (w.warp / F::kKeyWarps) * S::kQueriesPerWarp;
    w.dkv_col0 = kPtInRegisters<F> ? 0 : (w.warp / F::kKeyWarps) * S::kDkvCols;
    w.dq_row0 = (w.warp % S::kDqRowWarps) * 32;
    w.dq_col0 = (w.warp / S::kDqRowWarps) * S::kDqCols;
    return w;
}
//! [fresh]

//! [tiled_dkdv_registers]
/// WithPtInRegisters: dV_w += P^T dO_i and dK_w += dS^T Q_i for this warp's keys, its Bn query
/// columns from `c0` and all d features, with P^T (float32, `p`) and dS^T (16-bit pairs, `ds`)
/// straight from the registers that computed them. Two neighbouring 8-query accumulator tiles
/// are, element for element, one 16-query A fragment (the first kernel's identity, and stage 07's
/// for P V); B comes from dO_i and Q_i by ldmatrix.trans, as in tiled_dkdv.
template <class T, int D, class F>
__device__ __forceinline__ void dkdv_from_registers(
    DkvAccumulators<T, D, F>& dk, DkvAccumulators<T, D, F>& dv,
    const float (&p)[TiledShape<T, D, F>::kKeyTiles][TiledShape<T, D, F>::kNTiles][4],
    const uint32_t (&ds)[TiledShape<T, D, F>::kKeyTiles][TiledShape<T, D, F>::kNTiles][2], const uint16_t* q_tile,
    const uint16_t* do_tile, int c0, int lane) {
    using S = TiledShape<T, D, F>;
    static_assert(S::kDkvCols == D, "this warp holds dK and dV for every feature");
    const uint32_t do_t = smem_address(do_tile) + v_lane_bytes<TileLayout<D, true>>(lane);
    const uint32_t q_t = smem_address(q_tile) + v_lane_bytes<TileLayout<D, true>>(lane);
#pragma unroll
    for (int kk = 0; kk < S::kNTiles / 2; ++kk) {
        uint32_t pa[S::kKeyTiles][4], dsa[S::kKeyTiles][4];
#pragma unroll
        for (int mt = 0; mt < S::kKeyTiles; ++mt) {
            const float* lo = p[mt][2 * kk];
            const float* hi = p[mt][2 * kk + 1];
            pa[mt][0] = pack2<T>(lo[0], lo[1]), pa[mt][1] = pack2<T>(lo[2], lo[3]);
            pa[mt][2] = pack2<T>(hi[0], hi[1]), pa[mt][3] = pack2<T>(hi[2], hi[3]);
            dsa[mt][0] = ds[mt][2 * kk][0], dsa[mt][1] = ds[mt][2 * kk][1];
            dsa[mt][2] = ds[mt][2 * kk + 1][0], dsa[mt][3] = ds[mt][2 * kk + 1][1];
        }
#pragma unroll
        for (int dpair = 0; dpair < S::kDkvTiles / 2; ++dpair) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, fragment_address<TileLayout<D, true>>(do_t, c0 + kk * 16, dpair * 16));
            const uint32_t bv_lo[2] = {b[0], b[1]}, bv_hi[2] = {b[2], b[3]};
#pragma unroll
            for (int mt = 0; mt < S::kKeyTiles; ++mt) {
                mma_m16n8k16<T>(dv[mt][2 * dpair], pa[mt], bv_lo, dv[mt][2 * dpair]);
                mma_m16n8k16<T>(dv[mt][2 * dpair + 1], pa[mt], bv_hi, dv[mt][2 * dpair + 1]);
            }
            ldmatrix_x4_trans(b, fragment_address<TileLayout<D, true>>(q_t, c0 + kk * 16, dpair * 16));
            const uint32_t bk_lo[2] = {b[0], b[1]}, bk_hi[2] = {b[2], b[3]};
#pragma unroll
            for (int mt = 0; mt < S::kKeyTiles; ++mt) {
                mma_m16n8k16<T>(dk[mt][2 * dpair], dsa[mt], bk_lo, dk[mt][2 * dpair]);
                mma_m16n8k16<T>(dk[mt][2 * dpair + 1], dsa[mt], bk_hi, dk[mt][2 * dpair + 1]);
            }
        }
    }
}
//! [tiled_dkdv_registers]

//! [tiled_dropout]
/// Where the dropout map puts this block's scores (Dropped): dropout's b, the batch entry or
/// the packed sequence, and h, the query head (not the K/V head).
struct DropoutSite {
    uint32_t sequence;  ///< b of the map
    uint32_t head;      ///< h of the map: the query head
};

/// The keep bits of one warp's step of S^T (keys from `key0`, query columns from `query0`, both
/// within the sequence), regenerated from stage 07's map (fa/philox.hpp) bit for bit. One Philox
/// call covers 16 scores: query rows i, i + 8 (i mod 16 < 8) by 32 keys of one parity pair
/// (j mod 8 = 2u, 2u + 1). A lane of S^T holds keys g, g + 8, g + 16, g + 24 (g = lane / 4) and
/// query columns 2t, 2t + 1, 2t + 8, 2t + 9 of each 32-key by 16-query piece: 8 bytes of the call
/// of column 2t and 8 of that of 2t + 1, the other 8 of each belonging to lane ^ 4 (key g ^ 1).
/// So each lane makes one call, column 2t + g % 2, and swaps its 16 keep bits with lane ^ 4.
/// Bit 16 (e % 2) + 8 (nt % 2) + 4 (mt % 2) + 2 (e / 2) of word [mt / 2][nt / 2] is then the
/// keep bit of accumulator element e of tile (mt, nt) (dropout_kept()).
template <class T, int D, class F>
__device__ __forceinline__ void dropout_keep_bits(uint32_t (&keep)[TiledShape<T, D, F>::kKeyTiles / 2][TiledShape<T, D, F>::kNTiles / 2],
                                                  int key0, int query0, const DropoutSite& site, const Args<T>& a,
                                                  int lane) {
    using S = TiledShape<T, D, F>;
    static_assert(S::kKeyTiles % 2 == 0 && S::kNTiles % 2 == 0, "whole 32-key by 16-query groups of the dropout map");
    const int g = lane / 4, t = lane % 4;
    const uint32_t parity = uint32_t(g % 2);
    const PhiloxKey key{{a.dropout_seed_lo, a.dropout_seed_hi}};
    const uint32_t threshold4 = a.dropout_threshold * 0x01010101u;  // t in each byte
#pragma unroll
    for (int m = 0; m < S::kKeyTiles / 2; ++m)
#pragma unroll
        for (int n = 0; n < S::kNTiles / 2; ++n) {
            const uint32_t row = uint32_t(query0 + 16 * n + 2 * t) + parity;  // query column 2t + g % 2
            const uint32_t col = uint32_t(key0 + 32 * m + g);                 // key g of the 32
            const PhiloxWords bytes =
                philox4x32_10(dropout_counter(a.dropout_offset, site.sequence, site.head, row, col), key);
            // Byte b of the call decides bit b: four bytes at a time (fa/philox.hpp's dropout_keep4).
            const uint32_t mine = dropout_keep4(bytes.w[0], threshold4) | dropout_keep4(bytes.w[1], threshold4) << 4 |
                                  dropout_keep4(bytes.w[2], threshold4) << 8 | dropout_keep4(bytes.w[3], threshold4) << 12;
            const uint32_t theirs = __shfl_xor_sync(0xffffffffu, mine, 4);  // key g ^ 1's lane: the other column
            // Low half: the call of column 2t, high half: of 2t + 1; shifted so that key parity g % 2 is bit 0.
            keep[m][n] = (parity != 0 ? theirs | mine << 16 : mine | theirs << 16) >> parity;
        }
}

/// Whether accumulator element e of tile (mt, nt) of S^T survives dropout (dropout_keep_bits()).
/// The loops that call it are unrolled: the word and the shift are constants.
template <size_t M, size_t N>
__device__ __forceinline__ bool dropout_kept(const uint32_t (&keep)[M][N], int mt, int nt, int e) {
    return (keep[mt / 2][nt / 2] >> (16 * (e % 2) + 8 * (nt % 2) + 4 * (mt % 2) + 2 * (e / 2))) & 1u;
}
//! [tiled_dropout]

//! [tiled_sdp]
/// S^T, P^T, dP^T and dS^T for this warp's keys and Bn query columns from `c0` of query block
/// `q0`; P^T and dS^T stored, rounded to T, into the shared [Bc, Br] tiles. WithPtInRegisters:
/// only dS^T is stored, and dV_w, dK_w are updated here from the registers (dkdv_from_registers).
/// kMask: compare every (key, query) pair with the causal diagonal and Nk (as process_step of the
/// first kernel). Dropped: the dropped P~ feeds dV, the undropped P dS (`site`: the map's b and h).
template <class T, int D, class F, bool kMask>
__device__ __forceinline__ void tiled_scores(DkvAccumulators<T, D, F>& dk, DkvAccumulators<T, D, F>& dv,
                                             const uint16_t* k_tile, const uint16_t* v_tile, const uint16_t* q_tile,
                                             const uint16_t* do_tile, const float* lse_slot, const float* delta_slot,
                                             uint16_t* pt_tile, uint16_t* dst_tile, int q0, int c0, int kv0,
                                             int key_row0, const Args<T>& a, int lane,
                                             [[maybe_unused]] const DropoutSite& site) {
    using S = TiledShape<T, D, F>;
    using LP = TileLayout<F::kBr, true>;  // P^T and dS^T: Bc rows of Br queries
    const int g = lane / 4, t = lane % 4;
    const uint32_t k_a = smem_address(k_tile) + a_lane_bytes<TileLayout<D, true>>(lane);
    const uint32_t v_a = smem_address(v_tile) + a_lane_bytes<TileLayout<D, true>>(lane);
    const uint32_t q_b = smem_address(q_tile) + k_lane_bytes<TileLayout<D, true>>(lane);
    const uint32_t do_b = smem_address(do_tile) + k_lane_bytes<TileLayout<D, true>>(lane);

    // X^T = A B^T for (A, B) = (K_w, Q_i) and (V_w, dO_i): each A fragment feeds kNTiles mma, each
    // B fragment pair kKeyTiles x 2.
    const auto product = [&](float (&acc)[S::kKeyTiles][S::kNTiles][4], uint32_t a_lane, uint32_t b_lane) {
#pragma unroll
        for (int mt = 0; mt < S::kKeyTiles; ++mt)
#pragma unroll
            for (int nt = 0; nt < S::kNTiles; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < S::kKSteps; ++ks) {
            uint32_t af[S::kKeyTiles][4];
#pragma unroll
            for (int mt = 0; mt < S::kKeyTiles; ++mt) ldmatrix_x4(af[mt], fragment_address<TileLayout<D, true>>(a_lane, key_row0 + 16 * mt, ks * 16));
#pragma unroll
            for (int np = 0; np < S::kNTiles / 2; ++np) {
                uint32_t b[4];
                ldmatrix_x4(b, fragment_address<TileLayout<D, true>>(b_lane, c0 + np * 16, ks * 16));
                const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
                for (int mt = 0; mt < S::kKeyTiles; ++mt) {
                    mma_m16n8k16<T>(acc[mt][2 * np], af[mt], b_lo, acc[mt][2 * np]);
                    mma_m16n8k16<T>(acc[mt][2 * np + 1], af[mt], b_hi, acc[mt][2 * np + 1]);
                }
            }
        }
    };

    //! [model_dropout_bits]
    // Dropout: the keep bits of the step's scores, drawn before S^T (fewer registers live).
    [[maybe_unused]] uint32_t keep[kDropout<F> ? S::kKeyTiles / 2 : 1][kDropout<F> ? S::kNTiles / 2 : 1];
    if constexpr (kDropout<F>) dropout_keep_bits<T, D, F>(keep, kv0 + key_row0, q0 + c0, site, a, lane);
    // Entry e of tile (mt, nt) of M o x, M the keep bits: x if kept, else 0. The factor
    // c = 1/(1 - p') is already in P (the preprocessing folded it into the LSE) and in the D it
    // meets (divided by it): see below.
    [[maybe_unused]] const auto dropped = [&](float x, int mt, int nt, int e) {
        return dropout_kept(keep, mt, nt, e) ? x : 0.0f;
    };
    //! [model_dropout_bits]

    float s[S::kKeyTiles][S::kNTiles][4];
    product(s, k_a, q_b);
    //! [model_softcap]
    // The soft cap (stage 07's): s <- c tanh(scale s / c), the scale applied before the tanh, so
    // that P below takes the capped scores with log2(e) alone (the host passes scale_log2 =
    // log2(e)). dS is then the gradient of the capped score; the products need that of scale s:
    // d(c tanh(x / c))/dx = 1 - tanh^2(x / c), kept per score until dS is formed.
    [[maybe_unused]] float dcap[kSoftcap<F> ? S::kKeyTiles : 1][kSoftcap<F> ? S::kNTiles : 1][4];
    if constexpr (kSoftcap<F>) {
#pragma unroll
        for (int mt = 0; mt < S::kKeyTiles; ++mt)
#pragma unroll
            for (int nt = 0; nt < S::kNTiles; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float u = tanhf(s[mt][nt][e] * a.softcap_scale);
                    s[mt][nt][e] = a.softcap * u;
                    dcap[mt][nt][e] = 1.0f - u * u;
                }
    }
    //! [model_softcap]
    // P^T = exp2(S^T scale log2e - L log2e); element e of tile (mt, nt) is key 16 mt + g + 8 (e/2),
    // query nt*8 + 2t + e%2 of the warp's piece.
    const int key_offset = a.seq_k - a.seq_q;
#pragma unroll
    for (int nt = 0; nt < S::kNTiles; ++nt) {
        const float2 l2 = *reinterpret_cast<const float2*>(lse_slot + c0 + nt * 8 + 2 * t);
#pragma unroll
        for (int mt = 0; mt < S::kKeyTiles; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float p = ex2(fmaf(s[mt][nt][e], a.scale_log2, -(e % 2 ? l2.y : l2.x)));
                if constexpr (kMask && kWindow<F>) {
                    //! [model_window_mask]
                    // The window (fa/varlen.hpp): query r sees key k iff r + Nk - Nq - left <= k <=
                    // r + Nk - Nq + right (a bound of -1 dropping its side) and k < Nk (and, packed,
                    // r < Nq: the rows past the sequence's end are the next sequence's).
                    const int key = kv0 + key_row0 + 16 * mt + g + 8 * (e / 2);
                    const int query = q0 + c0 + nt * 8 + 2 * t + e % 2;
                    const bool visible = key < a.seq_k && (a.window_left < 0 || key >= query + key_offset - a.window_left) &&
                                         (a.window_right < 0 || key <= query + key_offset + a.window_right) &&
                                         (!kPacked<F> || query < a.seq_q);  // packed: past Nq is the next sequence
                    if (!visible) p = 0.0f;
                    //! [model_window_mask]
                } else if constexpr (kMask) {
                    const int key = kv0 + key_row0 + 16 * mt + g + 8 * (e / 2);
                    const int query = q0 + c0 + nt * 8 + 2 * t + e % 2;
                    if (!(key < a.seq_k && (!a.causal || key <= query + key_offset))) p = 0.0f;
                }
                s[mt][nt][e] = p;
            }
    }
    // P^T into shared memory (16-bit) for dV; the float32 P^T stays in registers for dS^T.
    // Dropped: the registers hold c P^T (c = 1/(1 - p'), folded into the LSE by the
    // preprocessing), and dV takes P~^T = M o c P^T, M the keep bits: the kept entries as they are.
    if constexpr (!kPtInRegisters<F>) {
        const auto pt = [&](int mt, int nt, int e) {
            if constexpr (kDropout<F>) {
                return dropped(s[mt][nt][e], mt, nt, e);
            } else {
                return s[mt][nt][e];
            }
        };
#pragma unroll
        for (int mt = 0; mt < S::kKeyTiles; ++mt)
#pragma unroll
            for (int nt = 0; nt < S::kNTiles; ++nt) {
                const int r = key_row0 + 16 * mt + g, c = c0 + nt * 8 + 2 * t;
                *reinterpret_cast<uint32_t*>(pt_tile + LP::offset(r, c)) = pack2<T>(pt(mt, nt, 0), pt(mt, nt, 1));
                *reinterpret_cast<uint32_t*>(pt_tile + LP::offset(r + 8, c)) = pack2<T>(pt(mt, nt, 2), pt(mt, nt, 3));
            }
    }

    if constexpr (kDpColumns<F> == F::kBn) {  // dP^T of the whole step at once
        float dp[S::kKeyTiles][S::kNTiles][4];
        product(dp, v_a, do_b);
        //! [model_dropout_ds]
        // Dropped: the product is dP~^T = (dO V^T)^T, and dS = P o (dP - D) with dP = c M o dP~.
        // The registers hold c P and the D slots D / c, so dS = c P o (M o dP~ - D / c): the kept
        // entries of dP~ as they are, no multiply.
        if constexpr (kDropout<F>) {
#pragma unroll
            for (int mt = 0; mt < S::kKeyTiles; ++mt)
#pragma unroll
                for (int nt = 0; nt < S::kNTiles; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) dp[mt][nt][e] = dropped(dp[mt][nt][e], mt, nt, e);
        }
        //! [model_dropout_ds]
        // dS^T = P^T o (dP^T - D), from the float32 P^T still in registers, rounded to T: one
        // register per key row and pair of queries, stored as it is (and, WithPtInRegisters, the
        // A fragments of dK's product).
        uint32_t ds[S::kKeyTiles][S::kNTiles][2];
#pragma unroll
        for (int nt = 0; nt < S::kNTiles; ++nt) {
            const float2 d2 = *reinterpret_cast<const float2*>(delta_slot + c0 + nt * 8 + 2 * t);
#pragma unroll
            for (int mt = 0; mt < S::kKeyTiles; ++mt) {
                const int r = key_row0 + 16 * mt + g, c = c0 + nt * 8 + 2 * t;
                const float* x = dp[mt][nt];
                const float* p = s[mt][nt];
                if constexpr (kSoftcap<F>) {  // dS of the uncapped score: times 1 - tanh^2
                    const float* c = dcap[mt][nt];
                    ds[mt][nt][0] = pack2<T>(p[0] * (x[0] - d2.x) * c[0], p[1] * (x[1] - d2.y) * c[1]);
                    ds[mt][nt][1] = pack2<T>(p[2] * (x[2] - d2.x) * c[2], p[3] * (x[3] - d2.y) * c[3]);
                } else {
                    ds[mt][nt][0] = pack2<T>(p[0] * (x[0] - d2.x), p[1] * (x[1] - d2.y));
                    ds[mt][nt][1] = pack2<T>(p[2] * (x[2] - d2.x), p[3] * (x[3] - d2.y));
                }
                *reinterpret_cast<uint32_t*>(dst_tile + LP::offset(r, c)) = ds[mt][nt][0];
                *reinterpret_cast<uint32_t*>(dst_tile + LP::offset(r + 8, c)) = ds[mt][nt][1];
            }
        }
        if constexpr (kPtInRegisters<F> && kDropout<F>) {
            //! [model_dropout_pt_registers]
            // Dropped, P^T in registers: dS^T is formed, so the registers of c P^T now take
            // P~^T = M o c P^T for dV.
#pragma unroll
            for (int mt = 0; mt < S::kKeyTiles; ++mt)
#pragma unroll
                for (int nt = 0; nt < S::kNTiles; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[mt][nt][e] = dropped(s[mt][nt][e], mt, nt, e);
            //! [model_dropout_pt_registers]
        }
        if constexpr (kPtInRegisters<F>) dkdv_from_registers<T, D, F>(dk, dv, s, ds, q_tile, do_tile, c0, lane);
    } else {
        //! [tiled_dp_pieces]
        // dP^T and dS^T kDpColumns query columns at a time: the float32 P^T of the whole step stays
        // in registers, but only one piece of dP^T beside it. Each piece reads the V_w fragments
        // again (the price: Bn / kDpColumns times the A loads of dP^T).
        static_assert(!kSoftcap<F> && !kDropout<F>,
                      "stage 10's soft cap and dropout run on the default main kernel, whose dP^T is not in pieces");
        constexpr int kPieceTiles = kDpColumns<F> / 8;  // 8-query column tiles per piece
#pragma unroll
        for (int piece = 0; piece < S::kNTiles / kPieceTiles; ++piece) {
            const int pc0 = c0 + piece * kDpColumns<F>;  // the piece's first query column
            float dp[S::kKeyTiles][kPieceTiles][4];
#pragma unroll
            for (int mt = 0; mt < S::kKeyTiles; ++mt)
#pragma unroll
                for (int nt = 0; nt < kPieceTiles; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) dp[mt][nt][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < S::kKSteps; ++ks) {
                uint32_t af[S::kKeyTiles][4];
#pragma unroll
                for (int mt = 0; mt < S::kKeyTiles; ++mt)
                    ldmatrix_x4(af[mt], fragment_address<TileLayout<D, true>>(v_a, key_row0 + 16 * mt, ks * 16));
#pragma unroll
                for (int np = 0; np < kPieceTiles / 2; ++np) {
                    uint32_t b[4];
                    ldmatrix_x4(b, fragment_address<TileLayout<D, true>>(do_b, pc0 + np * 16, ks * 16));
                    const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
                    for (int mt = 0; mt < S::kKeyTiles; ++mt) {
                        mma_m16n8k16<T>(dp[mt][2 * np], af[mt], b_lo, dp[mt][2 * np]);
                        mma_m16n8k16<T>(dp[mt][2 * np + 1], af[mt], b_hi, dp[mt][2 * np + 1]);
                    }
                }
            }
            // dS^T of the piece, from the float32 P^T of its columns.
#pragma unroll
            for (int nt = 0; nt < kPieceTiles; ++nt) {
                const float2 d2 = *reinterpret_cast<const float2*>(delta_slot + pc0 + nt * 8 + 2 * t);
#pragma unroll
                for (int mt = 0; mt < S::kKeyTiles; ++mt) {
                    const int r = key_row0 + 16 * mt + g, c = pc0 + nt * 8 + 2 * t;
                    const float* x = dp[mt][nt];
                    const float* p = s[mt][piece * kPieceTiles + nt];
                    *reinterpret_cast<uint32_t*>(dst_tile + LP::offset(r, c)) =
                        pack2<T>(p[0] * (x[0] - d2.x), p[1] * (x[1] - d2.y));
                    *reinterpret_cast<uint32_t*>(dst_tile + LP::offset(r + 8, c)) =
                        pack2<T>(p[2] * (x[2] - d2.x), p[3] * (x[3] - d2.y));
                }
            }
        }
        //! [tiled_dp_pieces]
    }
}
//! [tiled_sdp]

//! [tiled_dkdv]
/// dV_w += P^T dO_i and dK_w += dS^T Q_i for this warp's keys and features [col0, col0 + kDkvCols):
/// A from the shared P^T and dS^T tiles (row-major: keys are rows, queries the k-dimension),
/// B from dO_i and Q_i by ldmatrix.trans (pairs of consecutive queries of one feature).
template <class T, int D, class F>
__device__ __forceinline__ void tiled_dkdv(DkvAccumulators<T, D, F>& dk, DkvAccumulators<T, D, F>& dv, const uint16_t* pt_tile, const uint16_t* dst_tile, const uint16_t* q_tile,
                                           const uint16_t* do_tile, int key_row0, int col0, int lane) {
    using S = TiledShape<T, D, F>;
    lane = fresh<F>(lane);  // WithFreshLanes: this phase's addresses from here, not from before the loop
    const uint32_t pt_a = smem_address(pt_tile) + a_lane_bytes<TileLayout<F::kBr, true>>(lane);
    const uint32_t dst_a = smem_address(dst_tile) + a_lane_bytes<TileLayout<F::kBr, true>>(lane);
    const uint32_t do_t = smem_address(do_tile) + v_lane_bytes<TileLayout<D, true>>(lane);
    const uint32_t q_t = smem_address(q_tile) + v_lane_bytes<TileLayout<D, true>>(lane);
#pragma unroll
    for (int kk = 0; kk < S::kQSteps; ++kk) {
        uint32_t pa[S::kKeyTiles][4], dsa[S::kKeyTiles][4];
#pragma unroll
        for (int mt = 0; mt < S::kKeyTiles; ++mt) {
            ldmatrix_x4(pa[mt], fragment_address<TileLayout<F::kBr, true>>(pt_a, key_row0 + 16 * mt, kk * 16));
            ldmatrix_x4(dsa[mt], fragment_address<TileLayout<F::kBr, true>>(dst_a, key_row0 + 16 * mt, kk * 16));
        }
#pragma unroll
        for (int dpair = 0; dpair < S::kDkvTiles / 2; ++dpair) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, fragment_address<TileLayout<D, true>>(do_t, kk * 16, col0 + dpair * 16));
            const uint32_t bv_lo[2] = {b[0], b[1]}, bv_hi[2] = {b[2], b[3]};
#pragma unroll
            for (int mt = 0; mt < S::kKeyTiles; ++mt) {
                mma_m16n8k16<T>(dv[mt][2 * dpair], pa[mt], bv_lo, dv[mt][2 * dpair]);
                mma_m16n8k16<T>(dv[mt][2 * dpair + 1], pa[mt], bv_hi, dv[mt][2 * dpair + 1]);
            }
            ldmatrix_x4_trans(b, fragment_address<TileLayout<D, true>>(q_t, kk * 16, col0 + dpair * 16));
            const uint32_t bk_lo[2] = {b[0], b[1]}, bk_hi[2] = {b[2], b[3]};
#pragma unroll
            for (int mt = 0; mt < S::kKeyTiles; ++mt) {
                mma_m16n8k16<T>(dk[mt][2 * dpair], dsa[mt], bk_lo, dk[mt][2 * dpair]);
                mma_m16n8k16<T>(dk[mt][2 * dpair + 1], dsa[mt], bk_hi, dk[mt][2 * dpair + 1]);
            }
        }
    }
}
//! [tiled_dkdv]

//! [dq_add_or_zero]
/// What a lane adds to dQ for a row of a packed query block: its product where the row is the
/// sequence's (`inside`), -0 past the sequence's end, where the rows are the next sequence's.
/// Adding -0 changes no float: x + (-0) = x for every x, +0 and -0 included, under
/// round-to-nearest (+0 would not do: the additions flush subnormal sums to a zero of their sign,
/// so an accumulator can hold -0, and -0 + (+0) is +0). So the addition need not be skipped.
/// Skipping it took a branch per addition: `if (inside)` around the `red`, and even a PTX
/// predicate on it (`@p red.global.add`), came out of ptxas as a branch with its reconvergence
/// (`BSSY`, `BRA`, `BSYNC`) around each `REDG`; a select is one instruction. The -0 is a
/// constant, not the product: a row past the end has dS = 0, but 0 × an infinite K is NaN.
__device__ __forceinline__ float dq_add_or_zero(bool inside, float x) { return inside ? x : -0.0f; }
//! [dq_add_or_zero]

//! [tiled_dq]
/// dQ_i += dS K_j for rows [row0, row0 + 32) and features [col0, col0 + kDqCols) of the query
/// block, added into the float32 accumulator. A = dS is dS^T read by ldmatrix.trans, B = K_j by
/// ldmatrix.trans, as accumulate_dq of the first kernel; each fragment now feeds two m-tiles or
/// kDqCols/8 n-tiles. `before_adding()` runs, in every thread, between the products and the
/// additions: the deterministic mode waits for its turn there, so that the products are not part
/// of the time other key blocks wait for it.
///
/// kRowLimit (packed batches): only the first `rows` rows of the query block are added to, the
/// others being another sequence's (they get -0, dq_add_or_zero()).
///
/// kDqTiles<F> (WithDqTiles): `dq_block` is the first row of a tile of 8 and the query block's
/// rows start `shift` rows into it (0 for dense problems; a packed sequence starts on any row).
/// row0 and col0 are multiples of 8, so that a lane's place in its tile, worked out once from g, t
/// and the shift (`lane_tile`), moves by whole tiles from one addition to the next: + 8 rows is
/// 8 D floats, + 8 features 64.
template <class T, int D, class F, bool kRowLimit = false, class BeforeAdding>
__device__ __forceinline__ void tiled_dq(const uint16_t* dst_tile, const uint16_t* k_tile, float* dq_block, int row0,
                                         int col0, int lane, BeforeAdding&& before_adding, int rows = 0, int shift = 0) {
    using S = TiledShape<T, D, F>;
    constexpr int kTiles = S::kDqCols / 8;
    lane = fresh<F>(lane);  // WithFreshLanes: this phase's addresses from here
    const int g = lane / 4, t = lane % 4;
    const uint32_t ds_a = smem_address(dst_tile) + k_lane_bytes<TileLayout<F::kBr, true>>(lane);
    const uint32_t k_t = smem_address(k_tile) + v_lane_bytes<TileLayout<D, true>>(lane);
    float acc[2][kTiles][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < F::kBc / 16; ++kk) {
        uint32_t ds[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) ldmatrix_x4_trans(ds[mt], fragment_address<TileLayout<F::kBr, true>>(ds_a, kk * 16, row0 + 16 * mt));
#pragma unroll
        for (int dpair = 0; dpair < kTiles / 2; ++dpair) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, fragment_address<TileLayout<D, true>>(k_t, kk * 16, col0 + dpair * 16));
            const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                mma_m16n8k16<T>(acc[mt][2 * dpair], ds[mt], b_lo, acc[mt][2 * dpair]);
                mma_m16n8k16<T>(acc[mt][2 * dpair + 1], ds[mt], b_hi, acc[mt][2 * dpair + 1]);
            }
        }
    }
    before_adding();
    if constexpr (kDqAddWidth<F> == 4) {
        //! [dq_adds_v4]
        // Lane (g, t) holds rows g and g + 8, columns 2t, 2t + 1 of each tile; lane t ^ 1 the next
        // (or previous) two columns. An even t keeps row g and takes its neighbour's pair of row g;
        // an odd t keeps row g + 8 and takes its neighbour's pair of row g + 8: four consecutive
        // values of one row each, 16-byte aligned (columns 2t or 2t - 2, a multiple of 4).
        const bool odd = (t & 1) != 0;
        const int hh = odd ? 1 : 0;
        // Packed, in tiles: the lane's first row g + 8 hh, shifted, as dq_tile_offset() places it.
        const int lane_tile = kDqTiles<F> && kRowLimit ? int(dq_tile_offset<D>(shift + g + 8 * hh, col0 + 2 * (t & ~1))) : 0;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < kTiles; ++nt) {
                const float* c = acc[mt][nt];
                const float give0 = odd ? c[0] : c[2], give1 = odd ? c[1] : c[3];
                const float take0 = __shfl_xor_sync(0xffffffffu, give0, 1);
                const float take1 = __shfl_xor_sync(0xffffffffu, give1, 1);
                const int row = row0 + 16 * mt + g + 8 * hh;
                if (kRowLimit && row >= rows) continue;
                float* p;
                if constexpr (kDqTiles<F> && kRowLimit) {  // rows shifted into their tiles
                    p = dq_block + lane_tile + int64_t(row0 + 16 * mt) * D + nt * 64;
                } else if constexpr (kDqTiles<F>) {  // dq_tile_offset(), with row0 and col0 multiples of 8
                    p = dq_block + int64_t(row0 + 16 * mt + 8 * hh) * D + (col0 + nt * 8) * 8 + 8 * g + 2 * (t & ~1);
                } else {
                    p = dq_block + int64_t(row) * D + col0 + nt * 8 + 2 * (t & ~1);
                }
                if (odd) {
                    red_global_add_v4_f32(p, take0, take1, c[2], c[3]);
                } else {
                    red_global_add_v4_f32(p, c[0], c[1], take0, take1);
                }
            }
        //! [dq_adds_v4]
    } else {
        // Packed, in tiles: the lane's first row g, shifted, as dq_tile_offset() places it.
        const int lane_tile = kDqTiles<F> && kRowLimit ? int(dq_tile_offset<D>(shift + g, col0 + 2 * t)) : 0;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    // kRowLimit (packed): the rows past the sequence, which are the next one's,
                    // must not change. Pairs of floats add -0 there (dq_add_or_zero()) rather
                    // than skip the addition.
                    const bool inside = !kRowLimit || row0 + 16 * mt + g + 8 * hh < rows;
                    if (kDqAddWidth<F> == 1 && !inside) continue;
                    float* p;
                    if constexpr (kDqTiles<F> && kRowLimit) {  // rows shifted into their tiles
                        p = dq_block + lane_tile + int64_t(row0 + 16 * mt + 8 * hh) * D + nt * 64;
                    } else if constexpr (kDqTiles<F>) {  // dq_tile_offset(), with row0 and col0 multiples of 8
                        p = dq_block + int64_t(row0 + 16 * mt + 8 * hh) * D + (col0 + nt * 8) * 8 + 8 * g + 2 * t;
                    } else {
                        p = dq_block + int64_t(row0 + 16 * mt + g + 8 * hh) * D + col0 + nt * 8 + 2 * t;
                    }
                    if constexpr (kDqAddWidth<F> == 1) {
                        atomicAdd(p, acc[mt][nt][2 * hh]);  // result unused: red.global.add.f32
                        atomicAdd(p + 1, acc[mt][nt][2 * hh + 1]);
                    } else if constexpr (kRowLimit) {
                        red_global_add_v2_f32(p, dq_add_or_zero(inside, acc[mt][nt][2 * hh]),
                                              dq_add_or_zero(inside, acc[mt][nt][2 * hh + 1]));
                    } else {
                        red_global_add_v2_f32(p, acc[mt][nt][2 * hh], acc[mt][nt][2 * hh + 1]);
                    }
                }
    }
}
//! [tiled_dq]

}  // namespace detail

//! [tiled_kernel]
/// The work of one block of the warp-tiled backward kernel (flash_backward_tiled_kernel below),
/// with the arguments `a` the block sees.
template <class T, int D, class F, bool kDeterministic>
__device__ __forceinline__ void tiled_backward_block(const Args<T>& a) {
    using S = TiledShape<T, D, F>;
    using L = cuda::TileLayout<D, true>;  // K_j, V_j, Q_i, dO_i (and dK_j, dV_j on their way out): rows of d features
    extern __shared__ __align__(128) unsigned char smem_raw[];
    uint16_t* k_tile = reinterpret_cast<uint16_t*>(smem_raw);  // [Bc, d]  K_j, swizzled
    uint16_t* v_tile = k_tile + S::kKVElems;                    // [Bc, d]  V_j
    uint16_t* q_ring = v_tile + S::kKVElems;                    // 2 x [Br, d] Q_i
    uint16_t* do_ring = q_ring + 2 * S::kQElems;                // 2 x [Br, d] dO_i
    uint16_t* pt_tile = do_ring + 2 * S::kQElems;               // [Bc, Br] P^T (not WithPtInRegisters)
    uint16_t* dst_tile = pt_tile + (S::kPTiles - 1) * S::kPElems;  // [Bc, Br] dS^T
    float* lse_ring = reinterpret_cast<float*>(dst_tile + S::kPElems);  // 2 x [Br] L_i log2(e)
    float* delta_ring = lse_ring + 2 * F::kBr;                         // 2 x [Br] D_i

    // Stage 10's switches (ModelFeatures): a block per key block of a K/V head, which visits the
    // query heads of its group in turn (`w` moves from one to the next, model_query_block_pipeline).
    constexpr bool kModel = kGroupedHeads<F> || kWindow<F> || kPacked<F>;
    detail::BlockView<T> w;
    if constexpr (kModel) {
        w = detail::model_block_view<T, D, F, kDeterministic>(a);
    } else {
        w = detail::block_view<T, D, F::kBc, kDeterministic>(a);
    }
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int g = lane / 4, t = lane % 4;
    // The warp's pieces: keys (S^T, dP^T, dK, dV), query columns (S^T, dP^T), features (dK, dV),
    // and rows and features of dQ_i (detail::warp_place(), written out here in the order the
    // kernels of the other steps have always computed them).
    const int key_row0 = (warp % F::kKeyWarps) * S::kKeysPerWarp;
    const int query_col0 = (warp / F::kKeyWarps) * S::kQueriesPerWarp;
    const int dkv_col0 = kPtInRegisters<F> ? 0 : (warp / F::kKeyWarps) * S::kDkvCols;
    const int dq_row0 = (warp % S::kDqRowWarps) * 32;
    const int dq_col0 = (warp / S::kDqRowWarps) * S::kDqCols;
    const detail::WarpPlace place{lane, warp, key_row0, query_col0, dkv_col0, dq_row0, dq_col0};

    const detail::FullQueryBlocks full = detail::full_query_blocks<F>(a, w.j);  // kWindow: once per block
    // Dropped: the map's b, a packed block's sequence (from the schedule; its `a` is a batch of one).
    [[maybe_unused]] uint32_t site_sequence = 0;
    if constexpr (kDropout<F>) {
        site_sequence = uint32_t(kPacked<F> ? a.kv_schedule[2 * detail::schedule_entry<F, kDeterministic>(a)] : w.b);
    }

    float dk[S::kKeyTiles][S::kDkvTiles][4], dv[S::kKeyTiles][S::kDkvTiles][4];
#pragma unroll
    for (int mt = 0; mt < S::kKeyTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < S::kDkvTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) dk[mt][nt][e] = dv[mt][nt][e] = 0.0f;

    const auto query_block = [&](int i, int slot) {
        const int q0 = i * F::kBr;
        // WithFreshLanes: the warp's place worked out again for this query block (see fresh()).
        const detail::WarpPlace here =
            kFreshLanes<F> ? detail::warp_place<T, D, F>(detail::fresh<F>(int(threadIdx.x))) : place;
        const uint16_t* q_tile = q_ring + slot * S::kQElems;
        const uint16_t* do_tile = do_ring + slot * S::kQElems;
        const float* lse_slot = lse_ring + slot * F::kBr;
        const float* delta_slot = delta_ring + slot * F::kBr;
        const bool mask = detail::needs_mask<F>(a, i, w.kv0, full);
        // Dropped: the map's b and h, the query head `w` is on now.
        detail::DropoutSite site{};
        if constexpr (kDropout<F>) {
            site.sequence = site_sequence;
            site.head = uint32_t(w.bh % a.heads);
        }
#pragma unroll 1
        for (int step = 0; step < S::kSteps; ++step) {
            const int c0 = here.query_col0 + step * F::kBn;
            if (mask) {
                detail::tiled_scores<T, D, F, true>(dk, dv, k_tile, v_tile, q_tile, do_tile, lse_slot, delta_slot,
                                                    pt_tile, dst_tile, q0, c0, w.kv0, here.key_row0, a, here.lane, site);
            } else {
                detail::tiled_scores<T, D, F, false>(dk, dv, k_tile, v_tile, q_tile, do_tile, lse_slot, delta_slot,
                                                     pt_tile, dst_tile, q0, c0, w.kv0, here.key_row0, a, here.lane, site);
            }
        }
        __syncthreads();  // all of P^T and dS^T stored before any warp reads another warp's piece
        if constexpr (!kPtInRegisters<F>) {
            detail::tiled_dkdv<T, D, F>(dk, dv, pt_tile, dst_tile, q_tile, do_tile, here.key_row0, here.dkv_col0, here.lane);
        }
        // dQ_i's products, then the additions; the deterministic mode waits for its turn between
        // the two, holding its products in registers.
        // A packed sequence's rows in tiles (WithDqTiles) start q_row0 % 8 rows into a tile.
        const int shift = kPacked<F> && kDqTiles<F> ? a.q_row0 & 7 : 0;
        detail::tiled_dq<T, D, F, kPacked<F>>(dst_tile, k_tile, w.dq + int64_t(q0 - shift) * D, here.dq_row0, here.dq_col0,
                                              here.lane, [&] {
            if constexpr (kDeterministic) {
                detail::wait_for_turn<T, F::kBr, F::kBc, kWindow<F>, kPacked<F>>(a, w.bh, i, w.j);
                __syncthreads();  // the turn thread 0 acquired, before every thread's dQ_i additions
            }
        }, a.seq_q - q0, shift);
        if constexpr (kDeterministic) detail::pass_turn<kPacked<F>, F::kBr>(a, w.bh, i);
    };
    if constexpr (kModel) {
        detail::model_query_block_pipeline<F, L, S::kThreads, S::kQElems, D, kDeterministic>(
            a, w, k_tile, v_tile, q_ring, do_ring, lse_ring, delta_ring, query_block);
    } else {
        // The same pipeline as the first kernel's (query_block_pipeline), with nothing to do after its barrier.
        detail::query_block_pipeline<F, L, S::kThreads, S::kQElems>(a, w, k_tile, v_tile, q_ring, do_ring, lse_ring,
                                                                    delta_ring, [](int, int) {}, query_block);
    }

    // Epilogue: dK_j (scaled) and dV_j rounded to T, staged in the K_j and V_j tiles once every
    // warp is done reading them, then written as whole 16-byte chunks by all threads.
    __syncthreads();
    //! [tiled_partial_sums]
    if constexpr (kPtInRegisters<F>) {
        // Each warp summed dK and dV over its own query columns: the kQueryWarps warps that share
        // keys add their float32 sums into the first one's, one warp at a time, through the
        // shared memory of Q_i, dO_i and dS^T (no warp reads those any more). Element r of lane l
        // of warp (key warp kw, query warp qw) sits at float ((kw * 2 kRegs + r) * 32 + l): a
        // warp's 32 lanes touch 32 consecutive floats, one bank each.
        constexpr int kRegs = S::kKeyTiles * S::kDkvTiles * 4;  // floats of dK (and of dV) per thread
        float* partial = reinterpret_cast<float*>(q_ring);
        const int key_warp = warp % F::kKeyWarps, query_warp = warp / F::kKeyWarps;
        float* mine = partial + key_warp * 2 * kRegs * 32 + lane;
#pragma unroll 1
        for (int from = 1; from < S::kQueryWarps; ++from) {
            if (query_warp == from) {
#pragma unroll
                for (int mt = 0; mt < S::kKeyTiles; ++mt)
#pragma unroll
                    for (int nt = 0; nt < S::kDkvTiles; ++nt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int r = (mt * S::kDkvTiles + nt) * 4 + e;
                            mine[r * 32] = dk[mt][nt][e];
                            mine[(kRegs + r) * 32] = dv[mt][nt][e];
                        }
            }
            __syncthreads();  // query warp `from`'s sums stored before the first query warp adds them
            if (query_warp == 0) {
#pragma unroll
                for (int mt = 0; mt < S::kKeyTiles; ++mt)
#pragma unroll
                    for (int nt = 0; nt < S::kDkvTiles; ++nt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int r = (mt * S::kDkvTiles + nt) * 4 + e;
                            dk[mt][nt][e] += mine[r * 32];
                            dv[mt][nt][e] += mine[(kRegs + r) * 32];
                        }
            }
            if (from + 1 < S::kQueryWarps) __syncthreads();  // read before the next warp's sums overwrite them
        }
    }
    //! [tiled_partial_sums]
    //! [tiled_split_epilogue]
    if constexpr (detail::kGroupSplit<F, kDeterministic>) {
        if (a.group_split > 1) {  // the same for every thread of the block: none reaches the barrier below
            // This block's part of the group: dK_j (times the scale) and dV_j in float32, into the
            // partials of its split, for backward_dkdv_reduce_kernel to add. A lane's two
            // neighbouring features are one 8-byte store; the 4 lanes of a row fill a 32-byte sector.
            const int64_t bh_kv = int64_t(w.b) * (a.heads / a.kv_group) + w.h;
            const int split = detail::split_of_block<F, kDeterministic>(a.group_split);
            const int64_t at = split * a.partial_split_stride + bh_kv * a.partial_head_stride;
            float* dk_rows = a.dk_partial + at;  // [Nk, d] of this split and K/V head
            float* dv_rows = a.dv_partial + at;
            if (!kPtInRegisters<F> || warp < F::kKeyWarps) {  // P^T in registers: the first query warp holds the sums
#pragma unroll
                for (int mt = 0; mt < S::kKeyTiles; ++mt)
#pragma unroll
                    for (int nt = 0; nt < S::kDkvTiles; ++nt)
#pragma unroll
                        for (int hh = 0; hh < 2; ++hh) {
                            const int key = w.kv0 + key_row0 + 16 * mt + g + 8 * hh, c = dkv_col0 + nt * 8 + 2 * t;
                            if (key >= a.seq_k) continue;  // rows past Nk are not this block's to write
                            *reinterpret_cast<float2*>(dk_rows + int64_t(key) * D + c) =
                                make_float2(dk[mt][nt][2 * hh] * a.scale, dk[mt][nt][2 * hh + 1] * a.scale);
                            *reinterpret_cast<float2*>(dv_rows + int64_t(key) * D + c) =
                                make_float2(dv[mt][nt][2 * hh], dv[mt][nt][2 * hh + 1]);
                        }
            }
            return;
        }
    }
    //! [tiled_split_epilogue]
#pragma unroll
    for (int mt = 0; mt < S::kKeyTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < S::kDkvTiles; ++nt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                if (kPtInRegisters<F> && warp >= F::kKeyWarps) break;  // the first query warp holds the sums
                const int r = key_row0 + 16 * mt + g + 8 * hh, c = dkv_col0 + nt * 8 + 2 * t;
                *reinterpret_cast<uint32_t*>(k_tile + L::offset(r, c)) =
                    fa::cuda::ptx::pack2<T>(dk[mt][nt][2 * hh] * a.scale, dk[mt][nt][2 * hh + 1] * a.scale);
                *reinterpret_cast<uint32_t*>(v_tile + L::offset(r, c)) =
                    fa::cuda::ptx::pack2<T>(dv[mt][nt][2 * hh], dv[mt][nt][2 * hh + 1]);
            }
    __syncthreads();
    detail::store_dkdv_rows<T, D, L>(a, w, k_tile, v_tile, 0, F::kBc, int(threadIdx.x), S::kThreads);
}
//! [tiled_kernel]

/// The warp-tiled backward kernel: one block per (key block j, batch, head), j fastest, as the
/// first kernel; the same Args, preprocessing, postprocessing and deterministic turns. A packed
/// batch's block (kPacked) sees its sequence alone, as a dense batch of one (sequence_args()).
template <class T, int D, class F, bool kDeterministic>
__global__ void __launch_bounds__(TiledShape<T, D, F>::kThreads, F::kMinBlocksPerSm)
    flash_backward_tiled_kernel(const Args<T> a) {
    if constexpr (kPacked<F>) {
        tiled_backward_block<T, D, F, kDeterministic>(detail::sequence_args<F, D, kDeterministic>(a));
    } else {
        tiled_backward_block<T, D, F, kDeterministic>(a);
    }
}

}  // namespace fa::stage09
