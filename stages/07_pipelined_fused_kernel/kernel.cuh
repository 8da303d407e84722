/// \file stages/07_pipelined_fused_kernel/kernel.cuh
/// \brief Stage 07's kernel: one template whose compile-time Features switch each idea on.
///
/// One thread block owns `Br` query rows of one (batch, head) and `kWarps` warps. Each warp owns
/// its own `Br / kWarps` rows from start to end (FlashAttention-2's split): the scores of its
/// rows, their running max `m_i` and sum `l_i`, and their output `O_i` live in that warp's
/// registers, so no warp ever waits for another's partial results. The warps share only the
/// K and V tiles, which stream through a ring of `kStages` shared-memory buffers, `Bc` keys at
/// a time.
///
/// Per K/V tile, per warp (`m16n8k16` = one tensor-core instruction on a 16 x 8 x 16 tile):
///
///     S   = Q_w K_j^T       [rows, Bc]  d/16 x Bc/8 mma per 16 rows, K fragments by ldmatrix
///     m_i, l_i, P = exp2(S*scale*log2e - m_i*scale*log2e)       float32, in registers
///     O_w = O_w * alpha + P V_j   [rows, d]  Bc/16 x d/8 mma per 16 rows, V by ldmatrix.trans
///
/// The road from the first tensor-core version to this one is a list of switches (FeatureSet:
/// each step is the one before `.with_` one more idea, see attention.cu); the benchmark turns them
/// on one at a time (see the lesson's table). The tile layouts, lane patterns, tile copy and PTX
/// wrappers are the tensor-core building blocks of common/cuda (fa/cuda/), shared with stage 09.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "fa/cuda/fragments.cuh"
#include "fa/cuda/layouts.hpp"
#include "fa/cuda/ptx.cuh"
#include "fa/cuda/tile_copy.cuh"
#include "fa/philox.hpp"
#include "fa/problem.hpp"
#include "fa/varlen.hpp"

namespace fa::stage07 {

//! [features]
/// The switches of the road, each one idea of the lesson, as a value that reads as words: a step
/// is the step before with one more idea switched on (`kStep2 = kStep1.with_swizzle()`, see
/// attention.cu). The kernel template takes them as a type, Features (below), because CUDA
/// sources are C++17: no class-type template parameters.
struct FeatureSet {
    int br = 64;       ///< query rows per block
    int bc = 64;       ///< keys per K/V tile
    int warps = 4;     ///< warps per block; each owns br / warps query rows
    /// K/V tiles in flight: 1 loads, waits, computes; 2 or more load tile j+1 while j is computed
    int stages = 1;
    bool ldmatrix = false;        ///< fragments by ldmatrix, not by 32-bit shared loads
    bool swizzle = false;         ///< XOR-swizzled shared tiles (no bank conflicts)
    bool p_in_registers = false;  ///< P fed to P*V from registers, not shared memory
    bool exp2 = false;            ///< exp2 with log2(e) folded into the scale (one FFMA + ex2)
    bool causal_skip = false;     ///< skip tiles above the diagonal, mask only the diagonal
    /// Q's fragments loaded into registers once (true), or re-read from shared memory for every
    /// K tile (false): fewer registers, so a warp can own 32 rows and reuse each K/V fragment twice
    bool q_in_registers = true;
    bool lazy_rescale = false;  ///< rescale O only in tiles where some row's maximum grew
    /// blocks that must fit on one SM at once: caps the registers per thread at 65536 / (threads x this)
    int min_blocks_per_sm = 1;
    /// keys per softmax step (0: bc): a K/V tile of bc keys is loaded (one barrier) and consumed bn
    /// keys at a time, so the registers of S and P follow bn while the barriers follow bc
    int bn = 0;
    /// Stage 10's switches, what real models call (off on the road; see ModelFeatures below):
    bool grouped_heads = false;  ///< Hq/Hk query heads share each K/V head (GQA, MQA), read in place
    bool window = false;         ///< a sliding window (left, right) of keys: only the tiles it touches are loaded
    bool softcap = false;        ///< scores squashed by c tanh(s / c) before the softmax (Gemma 2's soft cap)
    /// a packed batch of sequences of different lengths (cu_seqlens): each block finds its
    /// sequence and query tile in a schedule the host builds, and sees that sequence alone
    bool varlen = false;
    /// dropout on P (fa/philox.hpp's map): the mask regenerated from Philox, one call per 16 scores
    bool dropout = false;

    /// Fragments by `ldmatrix` (`.trans` for V).
    constexpr FeatureSet with_ldmatrix() const { FeatureSet f = *this; f.ldmatrix = true; return f; }
    /// XOR-swizzled shared tiles.
    constexpr FeatureSet with_swizzle() const { FeatureSet f = *this; f.swizzle = true; return f; }
    /// A cp.async ring of `depth` K/V tiles.
    constexpr FeatureSet with_pipeline(int depth) const { FeatureSet f = *this; f.stages = depth; return f; }
    /// P kept in registers as the A operand of P V.
    constexpr FeatureSet with_p_in_registers() const { FeatureSet f = *this; f.p_in_registers = true; return f; }
    /// exp2 with log2(e) folded into the scale.
    constexpr FeatureSet with_exp2() const { FeatureSet f = *this; f.exp2 = true; return f; }
    /// Query rows, keys per tile, warps, pipeline depth and where Q's fragments live: the block shape.
    constexpr FeatureSet with_tile(int rows, int keys, int n_warps, int depth, bool q_kept_in_registers) const {
        FeatureSet f = *this;
        f.br = rows, f.bc = keys, f.warps = n_warps, f.stages = depth, f.q_in_registers = q_kept_in_registers;
        return f;
    }
    /// Tiles above the causal diagonal skipped, only the diagonal masked.
    constexpr FeatureSet with_causal_skip() const { FeatureSet f = *this; f.causal_skip = true; return f; }
    /// O rescaled only when some row's maximum grew (`on`: where that measured faster).
    constexpr FeatureSet with_lazy_rescale(bool on = true) const { FeatureSet f = *this; f.lazy_rescale = on; return f; }
    /// A register cap: `blocks` blocks must fit on one SM.
    constexpr FeatureSet with_min_blocks_per_sm(int blocks) const { FeatureSet f = *this; f.min_blocks_per_sm = blocks; return f; }
    /// Softmax steps of `keys` keys inside each K/V tile.
    constexpr FeatureSet with_softmax_step(int keys) const { FeatureSet f = *this; f.bn = keys; return f; }
    /// Query head h reads K/V head h / (Hq/Hk).
    constexpr FeatureSet with_grouped_heads() const { FeatureSet f = *this; f.grouped_heads = true; return f; }
    /// Keys seen through a sliding window (left, right), its tiles only.
    constexpr FeatureSet with_window() const { FeatureSet f = *this; f.window = true; return f; }
    /// The soft cap c tanh(s / c) on the scores.
    constexpr FeatureSet with_softcap() const { FeatureSet f = *this; f.softcap = true; return f; }
    /// Packed variable-length sequences, one (sequence, query tile) per block.
    constexpr FeatureSet with_varlen() const { FeatureSet f = *this; f.varlen = true; return f; }
    /// Entries of P dropped at random after the row sums, the rest scaled by 1/(1-p').
    constexpr FeatureSet with_dropout() const { FeatureSet f = *this; f.dropout = true; return f; }
};

/// A FeatureSet as the type the kernel template takes, one template parameter per member
/// (FeaturesOf writes them; nobody types them).
template <int Br, int Bc, int Warps, int Stages, bool Ldmatrix, bool Swizzle, bool PInRegisters, bool Exp2,
          bool CausalSkip, bool QInRegisters = true, bool LazyRescale = false, int MinBlocksPerSm = 1, int Bn = 0>
struct Features {
    static constexpr int kBr = Br;        ///< query rows per block
    static constexpr int kBc = Bc;        ///< keys per K/V tile
    static constexpr int kWarps = Warps;  ///< warps per block; each owns kBr / kWarps query rows
    static constexpr int kStages = Stages;             ///< K/V tiles in flight (FeatureSet::stages)
    static constexpr bool kLdmatrix = Ldmatrix;        ///< FeatureSet::ldmatrix
    static constexpr bool kSwizzle = Swizzle;          ///< FeatureSet::swizzle
    static constexpr bool kPInRegisters = PInRegisters;  ///< FeatureSet::p_in_registers
    static constexpr bool kExp2 = Exp2;                ///< FeatureSet::exp2
    static constexpr bool kCausalSkip = CausalSkip;    ///< FeatureSet::causal_skip
    static constexpr bool kQInRegisters = QInRegisters;  ///< FeatureSet::q_in_registers
    static constexpr bool kLazyRescale = LazyRescale;  ///< FeatureSet::lazy_rescale
    static constexpr int kMinBlocksPerSm = MinBlocksPerSm;  ///< FeatureSet::min_blocks_per_sm
    static constexpr int kBn = Bn == 0 ? Bc : Bn;      ///< keys per softmax step (FeatureSet::bn)
    static_assert(kBc % kBn == 0, "a tile holds whole softmax steps");
    static constexpr bool kGroupedHeads = false;  ///< FeatureSet::grouped_heads (ModelFeatures turns it on)
    static constexpr bool kWindow = false;        ///< FeatureSet::window (ModelFeatures turns it on)
    static constexpr bool kSoftcap = false;       ///< FeatureSet::softcap (ModelFeatures turns it on)
    static constexpr bool kDropout = false;       ///< FeatureSet::dropout (Dropped turns it on)
};

/// Features F with stage 10's switches. A separate type rather than three more parameters of
/// Features, so that every kernel without them keeps its type, its name and its machine code.
template <class F, bool GroupedHeads, bool Window, bool Softcap>
struct ModelFeatures : F {
    static constexpr bool kGroupedHeads = GroupedHeads;  ///< FeatureSet::grouped_heads
    static constexpr bool kWindow = Window;              ///< FeatureSet::window
    static constexpr bool kSoftcap = Softcap;            ///< FeatureSet::softcap
};

/// Features F on a packed batch of sequences (FeatureSet::varlen). A wrapper, like InOrder below,
/// so that the types (and the machine code) of every kernel without it stay as they were.
template <class F>
struct Packed : F {
    static constexpr bool kVarlen = true;  ///< FeatureSet::varlen
};
/// Features F with dropout on P (FeatureSet::dropout). A wrapper too, for the same reason.
template <class F>
struct Dropped : F {
    static constexpr bool kDropout = true;  ///< FeatureSet::dropout
};

/// Whether F runs on a packed batch (Packed<...>).
template <class F, class = void>
struct PacksSequences : std::false_type {};
/// PacksSequences of a Packed<...>.
template <class F>
struct PacksSequences<F, std::void_t<decltype(F::kVarlen)>> : std::bool_constant<F::kVarlen> {};

/// Features<...> of a FeatureSet (every member but stage 10's switches).
template <class Set>
using PlainFeaturesOf = Features<Set::kFeatures.br, Set::kFeatures.bc, Set::kFeatures.warps, Set::kFeatures.stages,
                                 Set::kFeatures.ldmatrix, Set::kFeatures.swizzle, Set::kFeatures.p_in_registers,
                                 Set::kFeatures.exp2, Set::kFeatures.causal_skip, Set::kFeatures.q_in_registers,
                                 Set::kFeatures.lazy_rescale, Set::kFeatures.min_blocks_per_sm, Set::kFeatures.bn>;

/// The Features of `Set::kFeatures` but the varlen and dropout switches, a constexpr
/// FeatureSet: `FeaturesOf<RoadSet<D, 3>>`. With none of stage 10's switches on, it is the plain
/// Features<...> type the road has always used.
template <class Set>
using UndroppedFeaturesOf =
    std::conditional_t<Set::kFeatures.grouped_heads || Set::kFeatures.window || Set::kFeatures.softcap,
                       ModelFeatures<PlainFeaturesOf<Set>, Set::kFeatures.grouped_heads, Set::kFeatures.window,
                                     Set::kFeatures.softcap>,
                       PlainFeaturesOf<Set>>;
/// The Features of `Set::kFeatures` but the varlen switch: Dropped<...> when it drops entries of P.
template <class Set>
using UnpackedFeaturesOf =
    std::conditional_t<Set::kFeatures.dropout, Dropped<UndroppedFeaturesOf<Set>>, UndroppedFeaturesOf<Set>>;
/// The Features of `Set::kFeatures`, Packed<...> when it runs on packed sequences.
template <class Set>
using FeaturesOf = std::conditional_t<Set::kFeatures.varlen, Packed<UnpackedFeaturesOf<Set>>, UnpackedFeaturesOf<Set>>;
//! [features]

/// Features F with the query tiles run in order under a causal mask too (stage 06's order at the
/// shapes where its rule picks it) instead of heaviest first. Not a step of the road: the
/// benchmark times `InOrder<step 0>` beside step 0 (a tuning candidate), which measures what the
/// order stage 07 starts with is worth.
template <class F>
struct InOrder : F {
    static constexpr bool kInOrder = true;  ///< query tiles in order, causal or not
};
/// Whether F runs its query tiles in order (InOrder<...>) or, under a causal mask, heaviest first.
template <class F, class = void>
struct RunsInOrder : std::false_type {};
/// RunsInOrder of an InOrder<...>.
template <class F>
struct RunsInOrder<F, std::void_t<decltype(F::kInOrder)>> : std::bool_constant<F::kInOrder> {};

/// Pointers, strides (in elements) and sizes the kernel reads; built by the host entry point.
template <class T>
struct Args {
    const T* q;  ///< (B, H, Nq, d): row n of head (b, h) starts at q + b*q_sb + h*q_sh + n*q_sn
    const T* k;  ///< (B, H, Nk, d)
    const T* v;  ///< (B, H, Nk, d)
    T* o;        ///< (B, H, Nq, d)
    float* lse;  ///< (B, H, Nq)
    int64_t q_sb;     ///< batch stride of q (the feature stride is 1)
    int64_t q_sh;     ///< head stride of q
    int64_t q_sn;     ///< row stride of q
    int64_t k_sb;     ///< batch stride of k
    int64_t k_sh;     ///< head stride of k
    int64_t k_sn;     ///< row stride of k
    int64_t v_sb;     ///< batch stride of v
    int64_t v_sh;     ///< head stride of v
    int64_t v_sn;     ///< row stride of v
    int64_t o_sb;     ///< batch stride of o
    int64_t o_sh;     ///< head stride of o
    int64_t o_sn;     ///< row stride of o
    int64_t lse_sb;   ///< batch stride of lse
    int64_t lse_sh;   ///< head stride of lse
    int64_t lse_sn;   ///< row stride of lse
    int heads;       ///< H
    int batch_heads; ///< B * H
    int q_tiles;     ///< query tiles per (batch, head): ceil(Nq / Br)
    int seq_q;       ///< Nq
    int seq_k;       ///< Nk
    bool causal;     ///< bottom-right aligned causal mask (kWindow: the window masks; this only puts the heaviest query tiles first)
    bool negate_q;   ///< the scale is negative: Q's sign is flipped and |scale| used (exact)
    float scale;     ///< |softmax scale| (at least FLT_MIN, so that -inf * scale stays -inf)
    float scale_log2;  ///< |softmax scale| * log2(e)
    // Stage 10's fields, read only by kernels that switch the feature on (appended, so that the
    // fields above keep their offsets and the kernels without these switches their machine code).
    int kv_group;       ///< kGroupedHeads: Hq / Hk, query heads per K/V head (heads above is Hq)
    int window_left;    ///< kWindow: keys before the diagonal a query sees; -1 all
    int window_right;   ///< kWindow: keys after the diagonal a query sees; -1 all, 0 causal
    float softcap;      ///< kSoftcap: c in c tanh(s / c); scale and scale_log2 are then 1 and log2(e)
    float softcap_scale;  ///< kSoftcap: |softmax scale| / c, applied to Q K^T before the tanh
    // Packed batches (kVarlen). q, o are then (1, Hq, total_q, d), k, v (1, Hk, total_k, d) and lse
    // (1, Hq, total_q), as views of the packed (total, H, d) buffers; q_tiles counts the entries of
    // tile_schedule (the blocks of one head), seq_q and seq_k are the longest sequences.
    const int* cu_seqlens_q;   ///< kVarlen: (B+1) sequence b owns query rows [cu_seqlens_q[b], cu_seqlens_q[b+1])
    const int* cu_seqlens_k;   ///< kVarlen: (B+1) and key rows [cu_seqlens_k[b], cu_seqlens_k[b+1])
    const int* tile_schedule;  ///< kVarlen: (q_tiles, 2) block i of a head runs query tile [2i+1] of sequence [2i]
    // Dropout (kDropout; fa/philox.hpp): score (b, h, i, j) is kept iff its byte of Philox4x32-10
    // is at least the threshold, b the batch entry or, packed, the sequence.
    uint32_t dropout_threshold;  ///< kDropout: t = round(256 p); a score whose byte is below t is dropped
    float dropout_keep_scale;    ///< kDropout: 256 / (256 - t) = 1 / (1 - p'), O's factor for the kept scores
    uint32_t dropout_seed_lo;    ///< kDropout: the seed's bits 0..31, Philox key word 0
    uint32_t dropout_seed_hi;    ///< kDropout: the seed's bits 32..63, Philox key word 1
    uint32_t dropout_offset;     ///< kDropout: Philox counter word 3
    /// kVarlen: the blocks go entry by entry of the schedule, heads innermost (block = entry H +
    /// h), instead of head by head (block = h q_tiles + entry); make_varlen_args() says which.
    bool heads_innermost;
};

/// Shape constants of one kernel instance, derived from the head dimension and the features.
template <class T, int D, class F>
struct Shape {
    static_assert(sizeof(T) == 2, "tensor-core operands are 16-bit");
    static_assert(D % 16 == 0 && D >= 32, "d is a multiple of 16 (the mma's k)");
    static constexpr int kThreads = F::kWarps * 32;  ///< threads per block
    static constexpr int kRowsPerWarp = F::kBr / F::kWarps;  ///< query rows a warp owns
    static constexpr int kMTiles = kRowsPerWarp / 16;        ///< 16-row mma tiles per warp
    static_assert(kRowsPerWarp % 16 == 0 && kMTiles >= 1, "each warp owns a multiple of 16 rows");
    static constexpr int kNTiles = F::kBn / 8;   ///< 8-key column tiles of S per softmax step
    static constexpr int kDTiles = D / 8;        ///< 8-feature column tiles of O
    static constexpr int kQKSteps = D / 16;      ///< k-steps of S = Q K^T
    static constexpr int kPVSteps = F::kBn / 16; ///< k-steps of O += P V
    static_assert(F::kBn % 16 == 0, "Bn is a multiple of 16 (the mma's k for P V)");
    static constexpr int kChunksPerRow = D / 8;  ///< 16-byte chunks in one row of a Q, K or V tile
    static constexpr int kTileElems = F::kBc * D;  ///< elements of one K or V tile in shared memory
    static constexpr int kQElems = F::kBr * D;     ///< elements of the Q tile
    static constexpr int kPElems = F::kPInRegisters ? 0 : F::kBr * F::kBn;  ///< elements of the P tile (0: P in registers)
    using Tile = cuda::TileLayout<D, F::kSwizzle>;       ///< layout of the Q, K, V tiles (and of O on its way out)
    using PTile = cuda::TileLayout<F::kBn, F::kSwizzle>;  ///< layout of the P tile (without kPInRegisters)
    /// Shared memory: Q [Br, d], then kStages x (K [Bc, d], V [Bc, d]), then P [Br, Bc] if used.
    static constexpr size_t kSmemBytes = sizeof(T) * (size_t(kQElems) + 2 * size_t(F::kStages) * kTileElems + kPElems);
};


namespace detail {

using namespace fa::cuda::ptx;
using cuda::a_lane_bytes;
using cuda::fragment_address;
using cuda::k_lane_bytes;
using cuda::quad_max;
using cuda::quad_sum;
using cuda::v_lane_bytes;

/// The A fragment (16 x 16, rows r0.., columns c0..) of a row-major shared tile with kCols
/// columns. `lane_address` = tile address + a_lane_bytes (used with ldmatrix only; see
/// fa/cuda/layouts.hpp for which lane names which row).
template <int kCols, class F>
__device__ __forceinline__ void load_a_fragment(uint32_t (&a)[4], const uint16_t* tile, uint32_t lane_address, int r0,
                                                int c0, int lane) {
    using L = cuda::TileLayout<kCols, F::kSwizzle>;
    if constexpr (F::kLdmatrix) {
        // Lanes 0-15 give rows r0..r0+15 at column c0 (matrices 0, 1), lanes 16-31 the same rows at c0+8.
        ldmatrix_x4(a, fragment_address<L>(lane_address, r0, c0));
    } else {
        // The fragment map of mma_m16n8k16 read element pair by element pair: four 32-bit loads.
        const int g = lane / 4, t = lane % 4;
        const auto at = [&](int row, int col) { return *reinterpret_cast<const uint32_t*>(tile + L::offset(row, col)); };
        a[0] = at(r0 + g, c0 + 2 * t);
        a[1] = at(r0 + g + 8, c0 + 2 * t);
        a[2] = at(r0 + g, c0 + 2 * t + 8);
        a[3] = at(r0 + g + 8, c0 + 2 * t + 8);
    }
}

/// B fragments of two neighbouring 8-key column tiles of S = Q K^T, for features [c0, c0+16):
/// b[0..1] for keys n0..n0+7, b[2..3] for keys n0+8..n0+15. K is stored [keys, d] row by row,
/// which is B stored column by column: ldmatrix without .trans.
template <int D, class F>
__device__ __forceinline__ void load_k_fragments(uint32_t (&b)[4], const uint16_t* k_tile, uint32_t lane_address, int n0,
                                                 int c0, int lane) {
    using L = cuda::TileLayout<D, F::kSwizzle>;
    if constexpr (F::kLdmatrix) {
        // matrix 0: keys n0..+7, features c0..+7;  1: same keys, c0+8..;  2, 3: keys n0+8..+15
        ldmatrix_x4(b, fragment_address<L>(lane_address, n0, c0));
    } else {
        const int g = lane / 4, t = lane % 4;
        const auto at = [&](int row, int col) { return *reinterpret_cast<const uint32_t*>(k_tile + L::offset(row, col)); };
        b[0] = at(n0 + g, c0 + 2 * t);
        b[1] = at(n0 + g, c0 + 2 * t + 8);
        b[2] = at(n0 + 8 + g, c0 + 2 * t);
        b[3] = at(n0 + 8 + g, c0 + 2 * t + 8);
    }
}

/// B fragments of O += P V for keys [k0, k0+16) and two neighbouring 8-feature tiles at c0:
/// b[0..1] for features c0..c0+7, b[2..3] for c0+8..c0+15. V is stored [keys, d]; B needs pairs
/// of consecutive keys of one feature: ldmatrix.trans, or two 16-bit loads per register.
template <int D, class F>
__device__ __forceinline__ void load_v_fragments(uint32_t (&b)[4], const uint16_t* v_tile, uint32_t lane_address, int k0,
                                                 int c0, int lane) {
    using L = cuda::TileLayout<D, F::kSwizzle>;
    //! [step_ldmatrix]
    if constexpr (F::kLdmatrix) {
        // matrix 0: keys k0..+7, features c0..+7;  1: keys k0+8..+15, c0..;  2, 3: features c0+8..
        ldmatrix_x4_trans(b, fragment_address<L>(lane_address, k0, c0));
    } else {
        const int g = lane / 4, t = lane % 4;
        const auto pair = [&](int row, int col) {
            return uint32_t(v_tile[L::offset(row, col)]) | (uint32_t(v_tile[L::offset(row + 1, col)]) << 16);
        };
        b[0] = pair(k0 + 2 * t, c0 + g);
        b[1] = pair(k0 + 2 * t + 8, c0 + g);
        b[2] = pair(k0 + 2 * t, c0 + 8 + g);
        b[3] = pair(k0 + 2 * t + 8, c0 + 8 + g);
    }
    //! [step_ldmatrix]
}

/// Nq the block works with: its own sequence's (`seq_q`, packed batches) or the call's. Read from
/// the arguments where it is used, as the kernels before packed batches always did (a copy held
/// in a register from the start would change their machine code).
template <class F, class T>
__device__ __forceinline__ int block_seq_q(const Args<T>& a, int seq_q) {
    return PacksSequences<F>::value ? seq_q : a.seq_q;
}
/// Nk the block works with (see block_seq_q).
template <class F, class T>
__device__ __forceinline__ int block_seq_k(const Args<T>& a, int seq_k) {
    return PacksSequences<F>::value ? seq_k : a.seq_k;
}

/// What one warp keeps in registers across the K/V tiles.
template <class T, int D, class F>
struct WarpState {
    using S = Shape<T, D, F>;  ///< the shape constants
    /// Q_w as A fragments, loaded once (with kQInRegisters; otherwise re-read per tile)
    uint32_t q[F::kQInRegisters ? S::kMTiles : 1][F::kQInRegisters ? S::kQKSteps : 1][4];
    float o[S::kMTiles][S::kDTiles][4];         ///< O_w accumulators, unnormalized
    float m[S::kMTiles][2];                     ///< running row max of the raw scores (rows g, g+8)
    float l[S::kMTiles][2];                     ///< running row sum of P, this lane's columns only
};

//! [process_tile]
/// One K/V tile for one warp: S = Q_w K_j^T, the online softmax update, O_w += P V_j.
/// kMask: compare every key with its row's visible end (the diagonal and the last partial tile).
/// `sequence` and `head` (the batch entry or packed sequence, the query head) are read by dropout only.
template <class T, int D, class F, bool kMask>
__device__ __forceinline__ void process_tile(WarpState<T, D, F>& st, const uint16_t* q_tile, const uint16_t* k_tile,
                                             const uint16_t* v_tile, uint16_t* p_tile, int q0, int kv0, int warp_row0,
                                             int seq_q, int seq_k, const Args<T>& a, int lane, int sequence, int head) {
    using S = Shape<T, D, F>;  ///< the shape constants
    const int g = lane / 4, t = lane % 4;
    // This tile's lane addresses: computed here, from the slot's base, so that the compiler
    // keeps one register per tile rather than one per fragment for the whole loop.
    const uint32_t k_lane = smem_address(k_tile) + k_lane_bytes<typename S::Tile>(lane);
    const uint32_t v_lane = smem_address(v_tile) + v_lane_bytes<typename S::Tile>(lane);

    //! [final_scores]
    // S = Q K^T on the tensor cores: each K fragment pair is loaded once and used by every m-tile.
    float s[S::kMTiles][S::kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < S::kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < S::kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < S::kQKSteps; ++ks) {
        uint32_t q_smem[F::kQInRegisters ? 1 : S::kMTiles][4];  // this k-step's Q fragments, when re-read
        //! [step_q_in_registers]
        if constexpr (!F::kQInRegisters) {
            const uint32_t q_lane = smem_address(q_tile) + a_lane_bytes<typename S::Tile>(lane);
#pragma unroll
            for (int mt = 0; mt < S::kMTiles; ++mt) {
                load_a_fragment<D, F>(q_smem[mt], q_tile, q_lane, warp_row0 + mt * 16, ks * 16, lane);
                if (a.negate_q)  // see load_q_fragments in the kernel
#pragma unroll
                    for (int e = 0; e < 4; ++e) q_smem[mt][e] ^= 0x80008000u;
            }
        }
        //! [step_q_in_registers]
#pragma unroll
        for (int np = 0; np < S::kNTiles / 2; ++np) {
            uint32_t b[4];
            load_k_fragments<D, F>(b, k_tile, k_lane, np * 16, ks * 16, lane);
            const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
            for (int mt = 0; mt < S::kMTiles; ++mt) {
                const uint32_t(&qa)[4] = F::kQInRegisters ? st.q[F::kQInRegisters ? mt : 0][F::kQInRegisters ? ks : 0]
                                                           : q_smem[F::kQInRegisters ? 0 : mt];
                mma_m16n8k16<T>(s[mt][2 * np], qa, b_lo, s[mt][2 * np]);
                mma_m16n8k16<T>(s[mt][2 * np + 1], qa, b_hi, s[mt][2 * np + 1]);
            }
        }
    }

    //! [model_softcap]
    // The soft cap, s <- c tanh(|scale| s / c): the scale is applied here, before the tanh, so the
    // softmax below runs with scale 1 (the host passes scale = 1 and scale_log2 = log2(e)). Masked
    // keys still become -inf below, after the cap.
    if constexpr (F::kSoftcap) {
#pragma unroll
        for (int mt = 0; mt < S::kMTiles; ++mt)
#pragma unroll
            for (int nt = 0; nt < S::kNTiles; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[mt][nt][e] = a.softcap * tanhf(s[mt][nt][e] * a.softcap_scale);
    }
    //! [model_softcap]

    // Keys this row may not see (above the diagonal, past Nk) score -inf: exp gives 0. The end of
    // each row's visible keys is worked out here, in masked tiles only, rather than kept in
    // registers through the whole loop.
    //! [model_window_mask]
    if constexpr (kMask && F::kWindow) {
        // A window bounds each row on both sides: keys [begin, end) of visible_key_range()
        // (fa/varlen.hpp), the same rule as the float64 reference; rows past Nq see nothing.
        int key_begin[S::kMTiles][2], key_end[S::kMTiles][2];
#pragma unroll
        for (int mt = 0; mt < S::kMTiles; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = q0 + warp_row0 + mt * 16 + g + 8 * h;
                const int nq = block_seq_q<F>(a, seq_q), nk = block_seq_k<F>(a, seq_k);
                const KeyRange r = row < nq ? visible_key_range(row, nq, nk, Window{a.window_left, a.window_right})
                                                 : KeyRange{0, 0};
                key_begin[mt][h] = int(r.begin), key_end[mt][h] = int(r.end);
            }
#pragma unroll
        for (int mt = 0; mt < S::kMTiles; ++mt)
#pragma unroll
            for (int nt = 0; nt < S::kNTiles; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = kv0 + nt * 8 + 2 * t + (e % 2);
                    if (key < key_begin[mt][e / 2] || key >= key_end[mt][e / 2]) s[mt][nt][e] = -INFINITY;
                }
    } else if constexpr (kMask) {
    //! [model_window_mask]
        int key_end[S::kMTiles][2];
#pragma unroll
        for (int mt = 0; mt < S::kMTiles; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = q0 + warp_row0 + mt * 16 + g + 8 * h;
                const int nq = block_seq_q<F>(a, seq_q), nk = block_seq_k<F>(a, seq_k);
                key_end[mt][h] = row < nq ? int(visible_key_end(row, nq, nk, a.causal)) : 0;
            }
#pragma unroll
        for (int mt = 0; mt < S::kMTiles; ++mt)
#pragma unroll
            for (int nt = 0; nt < S::kNTiles; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = kv0 + nt * 8 + 2 * t + (e % 2);
                    if (key >= key_end[mt][e / 2]) s[mt][nt][e] = -INFINITY;
                }
    }

    //! [final_scores]
    //! [final_softmax]
    // Online softmax, row by row (each lane holds rows g and g+8 of every m-tile).
    float alphas[S::kMTiles][2];  // each row's rescale factor exp(m_old - m_new) for this tile
    bool any_grew = false;        // some row of this lane has a new maximum
#pragma unroll
    for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float row_max = st.m[mt][h];
#pragma unroll
            for (int nt = 0; nt < S::kNTiles; ++nt) row_max = fmaxf(row_max, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
            row_max = quad_max(row_max);  // the four lanes of a quad hold the whole row
            // A row that has seen no key yet keeps m = -inf; subtracting 0 instead keeps exp(-inf) = 0
            // rather than exp(-inf - -inf) = NaN.
            const float m_use = row_max == -INFINITY ? 0.0f : row_max;
            float alpha, row_sum = 0.0f;
            //! [step_exp2]
            if constexpr (F::kExp2) {
                // exp(scale*(s - m)) = 2^(s*scale*log2e - m*scale*log2e): one FFMA and one ex2 per score.
                const float m_scaled = m_use * a.scale_log2;
                alpha = ex2(st.m[mt][h] * a.scale_log2 - m_scaled);
#pragma unroll
                for (int nt = 0; nt < S::kNTiles; ++nt)
#pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; ++e) {
                        s[mt][nt][e] = ex2(fmaf(s[mt][nt][e], a.scale_log2, -m_scaled));
                        row_sum += s[mt][nt][e];
                    }
            } else {
                alpha = expf((st.m[mt][h] - m_use) * a.scale);
#pragma unroll
                for (int nt = 0; nt < S::kNTiles; ++nt)
#pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; ++e) {
                        s[mt][nt][e] = expf((s[mt][nt][e] - m_use) * a.scale);
                        row_sum += s[mt][nt][e];
                    }
            }
            //! [step_exp2]
            st.m[mt][h] = row_max;
            st.l[mt][h] = st.l[mt][h] * alpha + row_sum;  // this lane's columns; the quad sums at the end
            alphas[mt][h] = alpha;
            any_grew = any_grew || alpha != 1.0f;
        }
    }
    //! [step_lazy_rescale]
    // O_w *= alpha, row by row: d/4 multiplies per row and lane, more than the softmax itself
    // costs when Bc is small. Once the maxima settle (after the first tiles) every alpha is
    // exactly 1 (2^0); with kLazyRescale the warp skips the multiplies unless some row's max grew.
    if (!F::kLazyRescale || __any_sync(0xffffffffu, any_grew)) {
#pragma unroll
        for (int mt = 0; mt < S::kMTiles; ++mt)
#pragma unroll
            for (int dt = 0; dt < S::kDTiles; ++dt)
#pragma unroll
                for (int e = 0; e < 4; ++e) st.o[mt][dt][e] *= alphas[mt][e / 2];
    }
    //! [step_lazy_rescale]
    //! [final_softmax]

    //! [model_dropout]
    // Dropout: the row sums above (and the LSE) are those of the undropped P; dropped entries are
    // zeroed now, before P V, and the epilogue scales O by 1/(1-p'). The mask is regenerated from
    // the coordinates (fa/philox.hpp), never stored. This lane's 16 scores of one m-tile and four
    // 8-key n-tiles (rows g, g+8; columns 2t, 2t+1 of each) are one Philox call's 16 bytes.
    if constexpr (F::kDropout) {
        static_assert(S::kNTiles % 4 == 0, "a softmax step holds whole 32-key groups of the dropout map (Bn % 32 == 0)");
        const PhiloxKey key{{a.dropout_seed_lo, a.dropout_seed_hi}};
#pragma unroll
        for (int mt = 0; mt < S::kMTiles; ++mt) {
            const uint32_t row = uint32_t(q0 + warp_row0 + mt * 16 + g);  // row g + 8 shares the call
#pragma unroll
            for (int group = 0; group < S::kNTiles / 4; ++group) {
                const uint32_t col = uint32_t(kv0 + group * 32 + 2 * t);  // column 2t of the group's first n-tile
                const PhiloxWords bytes = philox4x32_10(
                    dropout_counter(a.dropout_offset, uint32_t(sequence), uint32_t(head), row, col), key);
#pragma unroll
                for (int u = 0; u < 4; ++u)          // the group's n-tiles
#pragma unroll
                    for (int e = 0; e < 4; ++e) {  // accumulator element: row g + 8 (e / 2), column 2t + e % 2
                        // dropout_byte() of that row and column: 8 (e / 2) + 2 u + e % 2
                        const uint32_t n = 8u * uint32_t(e / 2) + 2u * uint32_t(u) + uint32_t(e % 2);
                        if (philox_byte(bytes, n) < a.dropout_threshold) s[mt][4 * group + u][e] = 0.0f;
                    }
            }
        }
    }
    //! [model_dropout]

    //! [final_p]
    // P as A fragments. The accumulator layout of two neighbouring 8-key tiles of S is, element
    // for element, the A layout of one 16-key slice: round, pack, and P is ready where it is.
    uint32_t p[S::kMTiles][S::kPVSteps][4];
#pragma unroll
    for (int mt = 0; mt < S::kMTiles; ++mt)
#pragma unroll
        for (int kk = 0; kk < S::kPVSteps; ++kk) {
            p[mt][kk][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
            p[mt][kk][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
            p[mt][kk][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
            p[mt][kk][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
    //! [final_p]
    //! [step_p_in_registers]
    if constexpr (!F::kPInRegisters) {
        // The detour the first versions take: P to shared memory (this warp's rows only), then
        // back as A fragments, the way Q was loaded.
#pragma unroll
        for (int mt = 0; mt < S::kMTiles; ++mt)
#pragma unroll
            for (int kk = 0; kk < S::kPVSteps; ++kk) {
                const int r = warp_row0 + mt * 16 + g, c = kk * 16 + 2 * t;
                using PL = typename S::PTile;
                *reinterpret_cast<uint32_t*>(p_tile + PL::offset(r, c)) = p[mt][kk][0];
                *reinterpret_cast<uint32_t*>(p_tile + PL::offset(r + 8, c)) = p[mt][kk][1];
                *reinterpret_cast<uint32_t*>(p_tile + PL::offset(r, c + 8)) = p[mt][kk][2];
                *reinterpret_cast<uint32_t*>(p_tile + PL::offset(r + 8, c + 8)) = p[mt][kk][3];
            }
        __syncwarp();  // orders this warp's P stores before its own loads of P (no other warp reads these rows)
        const uint32_t p_lane = smem_address(p_tile) + a_lane_bytes<typename S::PTile>(lane);
#pragma unroll
        for (int mt = 0; mt < S::kMTiles; ++mt)
#pragma unroll
            for (int kk = 0; kk < S::kPVSteps; ++kk)
                load_a_fragment<F::kBn, F>(p[mt][kk], p_tile, p_lane, warp_row0 + mt * 16, kk * 16, lane);
        __syncwarp();  // orders the loads of P before the next tile's stores into the same rows
    }
    //! [step_p_in_registers]

    //! [final_pv]
    // O += P V: each V fragment pair (two 8-feature tiles) is loaded once and used by every m-tile.
#pragma unroll
    for (int kk = 0; kk < S::kPVSteps; ++kk) {
#pragma unroll
        for (int dp = 0; dp < S::kDTiles / 2; ++dp) {
            uint32_t b[4];
            load_v_fragments<D, F>(b, v_tile, v_lane, kk * 16, dp * 16, lane);
            const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
            for (int mt = 0; mt < S::kMTiles; ++mt) {
                mma_m16n8k16<T>(st.o[mt][2 * dp], p[mt][kk], b_lo, st.o[mt][2 * dp]);
                mma_m16n8k16<T>(st.o[mt][2 * dp + 1], p[mt][kk], b_hi, st.o[mt][2 * dp + 1]);
            }
        }
    }
    //! [final_pv]
}
//! [process_tile]

//! [model_varlen_block]
/// Where one block of a packed batch (kVarlen) works: entry `entry` of the host's tile schedule
/// (the kernel's block index: see its start) names its sequence and query tile (`tile`);
/// cu_seqlens give the sequence's first query and key rows (`q_row0`, `k_row0`) and its lengths
/// (`seq_q`, `seq_k`). From there the block reads its sequence as stage 07 reads a dense head,
/// bottom-right causal alignment and windows included, and never touches another sequence's rows.
/// `seq` is the sequence's index (dropout's coordinate b).
template <class T>
__device__ __forceinline__ void find_sequence(const Args<T>& a, int entry, int& tile, int& q_row0, int& k_row0, int& seq_q,
                                              int& seq_k, int& seq) {
    seq = a.tile_schedule[2 * entry];
    tile = a.tile_schedule[2 * entry + 1];
    const int q_begin = a.cu_seqlens_q[seq], k_begin = a.cu_seqlens_k[seq];
    seq_q = a.cu_seqlens_q[seq + 1] - q_begin;
    seq_k = a.cu_seqlens_k[seq + 1] - k_begin;
    q_row0 = q_begin, k_row0 = k_begin;
}
//! [model_varlen_block]

}  // namespace detail

//! [key_tiles]
/// The key tiles of the query tile `[q0, q0 + Br)`: `[0, full)` every row sees in full (no
/// mask), `[full, end)` some row sees only in part (mask), `[end, Tc)` no row sees (skipped).
/// Without causal skipping every tile is visited with the mask, as a first version would.
__host__ __device__ inline void key_tiles(int q0, int br, int bc, int seq_q, int seq_k, bool causal, bool causal_skip,
                                          int& full, int& end) {
    const int q_last = (q0 + br < seq_q ? q0 + br : seq_q) - 1;
    const int fewest = int(visible_key_end(q0, seq_q, seq_k, causal));
    const int most = int(visible_key_end(q_last, seq_q, seq_k, causal));
    if (causal_skip || !causal) {
        full = fewest / bc;
        end = (most + bc - 1) / bc;
    } else {
        full = 0;
        end = (seq_k + bc - 1) / bc;
    }
}
//! [key_tiles]

//! [window_key_tiles]
/// The key tiles of the query tile `[q0, q0 + Br)` under the window (left, right) (fa/varlen.hpp's
/// Window, -1 unbounded): the tiles `[first, end)` are visited, of which `[full_first, full_end)`
/// every row sees in full (no mask); the others, at both ends, some row sees only in part; the
/// tiles before `first` and from `end` on no row sees, and are never loaded. The tile classes of
/// key_tiles() with a second edge: a row's first visible key, like its last, only grows with
/// the row, so the tile's first row bounds where the tile starts and where its unmasked keys end,
/// and its last row where it ends and where its unmasked keys start. With (-1, 0) these are
/// key_tiles()'s numbers with first = full_first = 0.
__host__ __device__ inline void window_key_tiles(int q0, int br, int bc, int seq_q, int seq_k, Window window, int& first,
                                                 int& full_first, int& full_end, int& end) {
    const int q_last = (q0 + br < seq_q ? q0 + br : seq_q) - 1;
    const KeyRange top = visible_key_range(q0, seq_q, seq_k, window);        // the tile's first row
    const KeyRange bottom = visible_key_range(q_last, seq_q, seq_k, window);  // its last row
    first = int(top.begin / bc);
    end = int((bottom.end + bc - 1) / bc);
    if (end < first) end = first;  // no row sees a key (every range empty)
    full_first = int((bottom.begin + bc - 1) / bc);
    full_end = int(top.end / bc);
    full_first = full_first < first ? first : (full_first > end ? end : full_first);
    full_end = full_end < full_first ? full_first : (full_end > end ? end : full_end);
}
//! [window_key_tiles]

//! [kernel]
//! [kernel_start]
/// The whole forward pass for one query tile of one (batch, head); grid: query tiles x B x H blocks
/// (packed batches, kVarlen: entries of the tile schedule x H blocks).
template <class T, int D, class F>
__global__ void __launch_bounds__(Shape<T, D, F>::kThreads, F::kMinBlocksPerSm) flash_forward_kernel(const Args<T> a) {
    using S = Shape<T, D, F>;  ///< the shape constants
    extern __shared__ __align__(128) unsigned char smem_raw[];
    uint16_t* q_tile = reinterpret_cast<uint16_t*>(smem_raw);  // [Br, d]                 swizzled
    uint16_t* kv_ring = q_tile + S::kQElems;                     // kStages x ([Bc, d] K, [Bc, d] V)
    uint16_t* p_tile = kv_ring + 2 * F::kStages * S::kTileElems; // [Br, Bc] (only without kPInRegisters)
    const auto k_slot = [&](int i) { return kv_ring + (2 * (i % F::kStages)) * S::kTileElems; };
    const auto v_slot = [&](int i) { return kv_ring + (2 * (i % F::kStages) + 1) * S::kTileElems; };

    // Causal problems start with the last query tiles of each head: they see the most keys,
    // and the short ones then fill the gaps at the end of the run.
    // One flat grid (its x dimension holds 2^31 - 1 blocks; y and z only 65535): query tile
    // fastest, so the blocks running together share one head's K and V in L2.
    // A packed batch's blocks take their sequence and query tile from the schedule, in the order
    // the host gave it (heaviest first as well), and see B = 1 (find_sequence); head by head when
    // the sequences are equal, entry by entry with the heads innermost when their lengths differ,
    // so that the longest sequence's heaviest tiles of the last heads do not start last. A dense
    // call's blocks see Nq and Nk of the call and start at row 0.
    //! [model_block_order]
    // The block's query tile (packed: its entry of the schedule) and (batch, head): the query tile
    // fastest, or (packed, heads_innermost; B = 1) the head fastest.
    const bool heads_innermost = PacksSequences<F>::value && a.heads_innermost;
    const int q_tile_index = int(heads_innermost ? blockIdx.x / unsigned(a.heads) : blockIdx.x % unsigned(a.q_tiles));
    int scheduled_tile = 0, seq_q = 0, seq_k = 0;  // (kVarlen) the sequence's Nq and Nk: block_seq_q/k()
    int q_row0 = 0, k_row0 = 0;  // the sequence's first query and key rows (cu_seqlens are int32)
    int packed_seq = 0;          // (kVarlen) the sequence's index
    if constexpr (PacksSequences<F>::value) {
        detail::find_sequence(a, q_tile_index, scheduled_tile, q_row0, k_row0, seq_q, seq_k, packed_seq);
    }
    const int q0 = (PacksSequences<F>::value ? scheduled_tile
                    : a.causal && !RunsInOrder<F>::value ? a.q_tiles - 1 - q_tile_index : q_tile_index) * F::kBr;
    const int bh = int(heads_innermost ? blockIdx.x % unsigned(a.heads) : blockIdx.x / unsigned(a.q_tiles));
    const int b = bh / a.heads, h = bh % a.heads;
    //! [model_block_order]
    const int sequence = PacksSequences<F>::value ? packed_seq : b;  // dropout's b: the batch entry or the sequence
    const T* q_head = a.q + b * a.q_sb + h * a.q_sh + q_row0 * a.q_sn;  // [Nq, d] global
    //! [model_heads]
    // Grouped-query heads: query head h reads K/V head h / (Hq/Hk), in place (never copied).
    const int h_kv = F::kGroupedHeads ? h / a.kv_group : h;
    //! [model_heads]
    const T* k_head = a.k + b * a.k_sb + h_kv * a.k_sh + k_row0 * a.k_sn;  // [Nk, d] global
    const T* v_head = a.v + b * a.v_sb + h_kv * a.v_sh + k_row0 * a.v_sn;  // [Nk, d] global
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int g = lane / 4, t = lane % 4;
    const int warp_row0 = warp * S::kRowsPerWarp;  // first row of this warp inside the tile

    detail::WarpState<T, D, F> st;
#pragma unroll
    for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            st.m[mt][hh] = -INFINITY;
            st.l[mt][hh] = 0.0f;
        }
#pragma unroll
        for (int dt = 0; dt < S::kDTiles; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) st.o[mt][dt][e] = 0.0f;
    }

    // The loop below counts the visited key tiles from 0 (`tile`, which also picks the ring slot);
    // key tile `first + tile` is loaded. Only a window makes `first` more than 0.
    int full, end;
    int first = 0, full_first = 0;  // (kWindow) the first visited and the first unmasked key tile
    //! [model_window_tiles]
    if constexpr (F::kWindow) {
        int full_end, window_end;
        window_key_tiles(q0, F::kBr, F::kBc, detail::block_seq_q<F>(a, seq_q), detail::block_seq_k<F>(a, seq_k), Window{a.window_left, a.window_right}, first, full_first,
                         full_end, window_end);
        end = window_end - first, full = full_end - first, full_first -= first;  // counted from `first`
    } else {
        key_tiles(q0, F::kBr, F::kBc, detail::block_seq_q<F>(a, seq_q), detail::block_seq_k<F>(a, seq_k), a.causal, F::kCausalSkip, full, end);
    }
    //! [model_window_tiles]

    const auto load_kv = [&](int tile) {
        const int key_tile = F::kWindow ? first + tile : tile;
        cuda::load_tile_gmem_to_smem<F::kBc, typename S::Tile, S::kThreads>(reinterpret_cast<T*>(k_slot(tile)), k_head, a.k_sn,
                                                                            key_tile * F::kBc, detail::block_seq_k<F>(a, seq_k));
        cuda::load_tile_gmem_to_smem<F::kBc, typename S::Tile, S::kThreads>(reinterpret_cast<T*>(v_slot(tile)), v_head, a.v_sn,
                                                                            key_tile * F::kBc, detail::block_seq_k<F>(a, seq_k));
    };
    const auto run_tile = [&](int tile) {
#pragma unroll 1  // one softmax step at a time: unrolled, the compiler would interleave them and need both S tiles
        for (int step = 0; step < F::kBc / F::kBn; ++step) {  // Bn keys at a time (rows step*Bn.. of the tile)
            const uint16_t* k_rows = k_slot(tile) + step * F::kBn * D;
            const uint16_t* v_rows = v_slot(tile) + step * F::kBn * D;
            const int kv0 = (F::kWindow ? first + tile : tile) * F::kBc + step * F::kBn;
            if (tile < full && (!F::kWindow || tile >= full_first)) {
                detail::process_tile<T, D, F, false>(st, q_tile, k_rows, v_rows, p_tile, q0, kv0, warp_row0, seq_q, seq_k, a, lane,
                                                     sequence, h);
            } else {
                detail::process_tile<T, D, F, true>(st, q_tile, k_rows, v_rows, p_tile, q0, kv0, warp_row0, seq_q, seq_k, a, lane,
                                                    sequence, h);
            }
        }
    };
    const auto load_q_fragments = [&] {
        if constexpr (!F::kQInRegisters) return;  // re-read from shared memory for every tile instead
        const uint32_t q_lane = cuda::ptx::smem_address(q_tile) + cuda::a_lane_bytes<typename S::Tile>(lane);
#pragma unroll
        for (int mt = 0; mt < S::kMTiles; ++mt)
#pragma unroll
            for (int ks = 0; ks < S::kQKSteps; ++ks) {
                detail::load_a_fragment<D, F>(st.q[mt][ks], q_tile, q_lane, warp_row0 + mt * 16, ks * 16, lane);
                if (a.negate_q)  // S = Q K^T * scale = (-Q) K^T * |scale|: flipping sign bits is exact
#pragma unroll
                    for (int e = 0; e < 4; ++e) st.q[mt][ks][e] ^= 0x80008000u;
            }
    };

    //! [kernel_start]
    if (end > 0) {  // a query tile that sees no key writes O = 0, LSE = -inf straight away
        cuda::load_tile_gmem_to_smem<F::kBr, typename S::Tile, S::kThreads>(reinterpret_cast<T*>(q_tile), q_head, a.q_sn, q0,
                                                                            detail::block_seq_q<F>(a, seq_q));
        //! [step_pipeline]
        if constexpr (F::kStages == 1) {
            // No pipeline: load, wait, compute, one tile after the other.
            for (int tile = 0; tile < end; ++tile) {
                if (tile > 0) __syncthreads();  // every warp is done reading the previous tile before it is overwritten
                load_kv(tile);
                fa::cuda::ptx::cp_async_commit();
                fa::cuda::ptx::cp_async_wait<0>();  // this thread's copies (Q and) tile `tile` have landed
                __syncthreads();                    // ... and every other thread's: the whole tile is visible
                if (tile == 0) load_q_fragments();
                run_tile(tile);
            }
        } else {
            //! [pipeline]
            // Prologue: tiles 0 .. kStages-2 in flight (Q travels with tile 0), one commit group each.
#pragma unroll
            for (int i = 0; i < F::kStages - 1; ++i) {
                if (i < end) load_kv(i);
                fa::cuda::ptx::cp_async_commit();  // an empty group past the end keeps the count uniform
            }
            for (int tile = 0; tile < end; ++tile) {
                // Steady state: groups 0..tile must have landed; kStages-2 newer ones may still fly.
                fa::cuda::ptx::cp_async_wait<F::kStages - 2>();
                // Orders every thread's copies of tile `tile` before any warp's ldmatrix of it, and
                // every warp's reads of tile `tile-1` before the copies below overwrite its slot.
                __syncthreads();
                if (tile == 0) load_q_fragments();
                const int next = tile + F::kStages - 1;
                if (next < end) load_kv(next);     // into the slot tile-1 used: free since the barrier
                fa::cuda::ptx::cp_async_commit();  // (possibly empty) group of tile `next`
                run_tile(tile);                    // the tensor cores work while `next` is in flight
            }
            fa::cuda::ptx::cp_async_wait<0>();  // nothing may still be landing when the block exits
            //! [pipeline]
        }
        //! [step_pipeline]
    }

    //! [epilogue]
    // Epilogue: finish the row sums across the quad, normalize, write O (through shared memory,
    // so that global stores are whole 16-byte rows) and the LSE.
    // This warp's rows of the Q tile are free: only this warp read them (its Q fragments).
    __syncwarp();
    uint16_t* o_stage = q_tile;  // [Br, d], this warp's rows only
#pragma unroll
    for (int mt = 0; mt < S::kMTiles; ++mt) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float l = cuda::quad_sum(st.l[mt][hh]);
            // l = 0: the row saw no key, O = 0. With dropout, l is the undropped sum (the LSE's) and
            // the kept entries are scaled by 1/(1-p') here, once per row rather than once per score.
            const float inv = l > 0.0f ? (F::kDropout ? a.dropout_keep_scale : 1.0f) / l : 0.0f;
            const int r = warp_row0 + mt * 16 + g + 8 * hh;
#pragma unroll
            for (int dt = 0; dt < S::kDTiles; ++dt) {
                *reinterpret_cast<uint32_t*>(o_stage + S::Tile::offset(r, dt * 8 + 2 * t)) =
                    fa::cuda::ptx::pack2<T>(st.o[mt][dt][2 * hh] * inv, st.o[mt][dt][2 * hh + 1] * inv);
            }
            const int row = q0 + r;
            if (t == 0 && row < detail::block_seq_q<F>(a, seq_q)) {
                // LSE = ln(sum_j exp(scale*s_j)) = m*|scale| + ln(l), in natural-log units.
                const float lse = l > 0.0f ? st.m[mt][hh] * a.scale + logf(l) : -INFINITY;
                a.lse[b * a.lse_sb + h * a.lse_sh + (q_row0 + row) * a.lse_sn] = lse;
            }
        }
    }
    __syncwarp();  // orders this warp's staging stores before its 16-byte reads of the same rows
    T* o_head = a.o + b * a.o_sb + h * a.o_sh + q_row0 * a.o_sn;
    constexpr int kChunks = S::kRowsPerWarp * S::kChunksPerRow;
#pragma unroll
    for (int i = 0; i < (kChunks + 31) / 32; ++i) {
        const int chunk = lane + 32 * i;
        if (kChunks % 32 != 0 && chunk >= kChunks) break;
        const int r = warp_row0 + chunk / S::kChunksPerRow, col = (chunk % S::kChunksPerRow) * 8;
        if (q0 + r < detail::block_seq_q<F>(a, seq_q)) {
            *reinterpret_cast<uint4*>(o_head + int64_t(q0 + r) * a.o_sn + col) =
                *reinterpret_cast<const uint4*>(o_stage + S::Tile::offset(r, col));
        }
    }
    //! [epilogue]
}
//! [kernel]

}  // namespace fa::stage07
