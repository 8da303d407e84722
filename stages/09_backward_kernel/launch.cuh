/// \file stages/09_backward_kernel/launch.cuh
/// \brief Stage 09's tuned block shapes and its launch sequence: which kernels run, in which
/// order, with which arguments and how many blocks.
///
/// The host entry point (attention.cu) launches them on a stream; the CPU test
/// (tests/test_stage09_emulated.cpp) runs the very same sequence on the warp emulator
/// (tools/warp_emulator). Both take the shapes and the arguments from here, so the test checks
/// what the stage runs, not a copy of it.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../07_pipelined_fused_kernel/model_options.hpp"
#include "fa/error.hpp"
#include "fa/philox.hpp"
#include "fa/problem.hpp"
#include "fa/tensor.hpp"
#include "kernel.cuh"
#include "warp_tiled.cuh"

namespace fa::stage09 {

//! [tuned]
/// The block shape for head dimension D: query rows per query block, warps (16 keys each),
/// query columns per step, K/V fragments in registers or re-read, blocks per SM. Every thread
/// holds dK_w and dV_w (d/2 float32 registers each) for the whole kernel, and S^T and dP^T
/// (Bn/2 each) per step. Chosen from the compiler's register counts (`-Xptxas -v`): at d = 32
/// and 64, Bn = 32 with K_w, V_w re-read keeps a thread under 168 registers without spills, so
/// three blocks (12 warps) share an SM; at d = 128 dK_w and dV_w alone take 128 registers and two
/// blocks (the shared memory allows no more) fit at 255. The alternatives timed at d = 64 (the
/// lesson's road: K_w, V_w in registers, Bn = 16 or 64) were within -10% and +1.5% of this.
template <int D>
struct Tuned;
/// Tuned for d = 32.
template <>
struct Tuned<32> {
    /// the features
    using F = Features<64, 4, 32, false, 3>;
};
/// Tuned for d = 64.
template <>
struct Tuned<64> {
    /// the features
    using F = Features<64, 4, 32, false, 3>;
};
/// Tuned for d = 128.
template <>
struct Tuned<128> {
    /// the features
    using F = Features<64, 4, 32, false, 1>;
};
//! [tuned]

//! [tuned_tiled]
/// The warp-tiled kernel's shape for head dimension D: query rows, keys, warps, warps along the
/// keys, query columns per step, blocks per SM. Each warp holds dK and dV for 32 keys and
/// d / (Warps / KeyWarps) features. Chosen from the compiler's register counts (`-Xptxas -v`,
/// CUDA 13.0, sm_90): at d = 32 and 64 a 128 x 128 block (8 warps, 4 x 2) takes 156 and 225
/// registers without spills. At d = 128 the same block needs 64 registers of dK and dV per 32
/// keys and spills 76 bytes; Br = 128 queries by Bc = 64 keys (2 x 4 warps: 32 keys by 32
/// features of dK, dV each) fits in 255 without spills.
template <int D>
struct TunedTiled;
/// TunedTiled for d = 32.
template <>
struct TunedTiled<32> {
    /// the features
    using F = TiledFeatures<128, 128, 8, 4, 32, 1>;
};
/// TunedTiled for d = 64.
template <>
struct TunedTiled<64> {
    /// the features
    using F = TiledFeatures<128, 128, 8, 4, 32, 1>;
};
/// TunedTiled for d = 128.
template <>
struct TunedTiled<128> {
    /// the features
    using F = TiledFeatures<128, 64, 8, 2, 32, 1>;
};
//! [tuned_tiled]

//! [tuned_keys128]
/// Step 2: the warp-tiled kernel with 128-key blocks at every head dimension. At d = 32 and 64
/// that is step 1's shape (the same kernel instance). At d = 128 the block turns around: Br = 64
/// queries by Bc = 128 keys, 8 warps, 4 along the keys (FlashAttention-2's shape at d = 128).
/// Each key block then adds its dQ_i once per 128 keys instead of once per 64: half the float32
/// additions of dQ per FLOP, where step 0's profile found L2 busy 72% of the time, mostly with
/// them. A warp keeps dK and dV for 32 keys by 64 features (128 registers, step 1: 32 by 32), so
/// every P^T and dS^T fragment it reads feeds twice as many mma in dV and dK; S^T and dP^T
/// keep their 32 x 32 pieces, and dQ_i its 32-row by 32-feature pieces.
template <int D>
struct TunedKeys128 {
    /// the features: step 1's, whose blocks already hold 128 keys below d = 128
    using F = typename TunedTiled<D>::F;
};
/// TunedKeys128 for d = 128.
template <>
struct TunedKeys128<128> {
    /// the features
    using F = TiledFeatures<64, 128, 8, 4, 32, 1>;
};
//! [tuned_keys128]

//! [tuned_dp_pieces]
/// Step 3: step 2 with dP^T computed 16 query columns at a time (WithDpPieces). At d = 128 the
/// 128 registers of dK and dV, the 32 of P^T and the 32 of dP^T leave too few for the rest: step 2
/// spills 76 bytes per thread (`-Xptxas -v`, CUDA 13.0, sm_90); with one 16-column piece of dP^T
/// at a time they fall to 16 to 24 bytes, for 16 more `ldmatrix` of V_w per warp and query block.
/// At d = 32 and 64 nothing spills: step 2's shape, unchanged.
template <int D>
struct TunedDpPieces {
    /// the features: step 2's
    using F = typename TunedKeys128<D>::F;
};
/// TunedDpPieces for d = 128.
template <>
struct TunedDpPieces<128> {
    /// the features
    using F = WithDpPieces<TunedKeys128<128>::F, 16>;
};
//! [tuned_dp_pieces]

//! [tuned_pt_registers]
/// Step 4: step 2 with dV and dK fed from the registers of P^T and dS^T (WithPtInRegisters). At
/// d = 32 and 64 step 2's 128 x 128 block reads about 160 ldmatrix per warp and query block and
/// stores 64 registers of P^T and dS^T; the tensor cores wait on shared memory (its profile: the
/// shared-memory pipe busy twice as long as the tensor pipe). Fed from registers, dV and dK need
/// no A fragments from shared memory and no P^T tile: 128 ldmatrix and 32 stores. Each warp then
/// holds dK and dV for 32 keys by all d features (128 registers at d = 64): the compiler's count
/// is 255 registers with 36 bytes of spills at d = 64 (`-Xptxas -v`, CUDA 13.0, sm_90), 208 at
/// d = 32. At d = 128 that would be 256 registers of dK and dV alone: step 2's kernel.
template <int D>
struct TunedPtRegisters {
    /// the features: step 2's with P^T in registers
    using F = WithPtInRegisters<typename TunedKeys128<D>::F>;
};
/// TunedPtRegisters for d = 128: step 2's features.
template <>
struct TunedPtRegisters<128> {
    /// the features
    using F = TunedKeys128<128>::F;
};

/// Step 5: step 4 with S^T and dP^T 16 query columns at a time instead of 32 (no spills at d = 64,
/// 251 registers; the price: K_w and V_w read twice as often). At d = 128, step 2's kernel.
template <int D>
struct TunedPtRegisters16 {
    /// the features
    using F = WithPtInRegisters<TiledFeatures<TunedKeys128<D>::F::kBr, TunedKeys128<D>::F::kBc, TunedKeys128<D>::F::kWarps,
                                              TunedKeys128<D>::F::kKeyWarps, 16, TunedKeys128<D>::F::kMinBlocksPerSm>>;
};
/// TunedPtRegisters16 for d = 128: step 2's features.
template <>
struct TunedPtRegisters16<128> {
    /// the features
    using F = TunedKeys128<128>::F;
};
//! [tuned_pt_registers]

//! [tuned_fresh_lanes]
/// Step 6: step 4 with its offsets computed afresh in each query block (WithFreshLanes). Step 4
/// spills 36 bytes per thread at d = 64 and step 2, which it runs at d = 128, 76 bytes
/// (`-Xptxas -v`, CUDA 13.0, sm_90); Nsight Compute counts 1.19 and 2.54 GB of local loads in one
/// bf16 call at N = 4096, where SDPA flash's kernel reads 0.6 GB and 4 MB
/// (docs/results/ncu_flash09.txt). The spilled values are the warp's shared-memory addresses,
/// computed before the loop over query blocks and read back in every iteration. With them
/// computed afresh, nothing spills at d = 32, 64 or 128; but the kernel executes 9 % (d = 64) to
/// 31 % (d = 128) more instructions and runs 1 to 4 % slower than step 4 (the lesson's step 6,
/// measured on the H100): off by default.
template <int D>
struct TunedFreshLanes {
    /// the features
    using F = WithFreshLanes<typename TunedPtRegisters<D>::F>;
};
//! [tuned_fresh_lanes]

//! [tuned_dq_adds]
/// Steps 7 and 8: step 4 with dQ_i added one float32 at a time (7, FlashAttention-2's form) or four
/// (8, `red.global.add.v4.f32`) instead of two (WithDqAdds). Nsight Compute finds step 4's warps
/// waiting on the queue of local and global memory instructions (`lg_throttle`, 0.30 to 0.43 per
/// issued instruction at N = 4096) where FlashAttention-2's, which adds one value per instruction,
/// never do (docs/results/ncu_flash09.txt); besides the spills, that queue holds the dQ additions.
/// Measured on the H100 (the lesson's steps 7 and 8): step 7 runs at 0.79 to 0.82 times step 4's
/// speed, step 8 at 0.96 to 1.01: the count of instructions is not what fills the queue. Both off.
template <int D, int Width>
struct TunedDqAdds {
    /// the features
    using F = WithDqAdds<typename TunedPtRegisters<D>::F, Width>;
};
//! [tuned_dq_adds]

//! [tuned_dq_tiles]
/// Steps 9 and 10: step 4 (9) and step 8 (10) with the dQ accumulator in 8 x 8 tiles (WithDqTiles):
/// each `red` of a warp then lands on whole 128-byte lines (two for a pair per lane, four for four)
/// instead of eight rows' 32-byte pieces. Measured on the H100 (the lesson's steps 9 and 10): step 9's
/// backward at 1.09 to 1.12 times step 4's, its warps no longer waiting on the global queue at
/// d = 128; step 10 at 1.05 to 1.08. Step 9 is the default.
template <int D, int Width>
struct TunedDqTiles {
    /// the features
    using F = WithDqTiles<std::conditional_t<Width == 2, typename TunedPtRegisters<D>::F, typename TunedDqAdds<D, Width>::F>>;
};
//! [tuned_dq_tiles]

/// The features of the warp-tiled kernel at `Step` (1 to 10 of the road) and head dimension D.
template <int D, int Step>
using TiledStepFeatures = typename std::conditional_t<
    Step == 1, TunedTiled<D>,
    std::conditional_t<
        Step == 2, TunedKeys128<D>,
        std::conditional_t<
            Step == 3, TunedDpPieces<D>,
            std::conditional_t<
                Step == 4, TunedPtRegisters<D>,
                std::conditional_t<
                    Step == 5, TunedPtRegisters16<D>,
                    std::conditional_t<Step == 6, TunedFreshLanes<D>,
                                       std::conditional_t<Step == 7 || Step == 8, TunedDqAdds<D, Step == 7 ? 1 : 4>,
                                                          TunedDqTiles<D, Step == 9 ? 2 : 4>>>>>>>>::F;

/// The main kernels run_kernels() launches, one per step of the road (attention.cu: road()).
inline constexpr int kRoadSteps = 11;

/// `run(TiledStepFeatures<D, step>{})` for a step of the warp-tiled kernel (1 to kRoadSteps - 1;
/// the last for any larger step): the one place a step number becomes a kernel's features.
template <int D, int Step = 1, class Run>
decltype(auto) with_tiled_step(int step, Run&& run) {
    if constexpr (Step + 1 < kRoadSteps) {
        if (step != Step) return with_tiled_step<D, Step + 1>(step, run);
    }
    return run(TiledStepFeatures<D, Step>{});
}

//! [model_steps]
/// What a real model's call adds (stage 10), as stage 07 takes it: grouped-query heads, a sliding
/// window and the soft cap (stage07::ModelOptions, checked and resolved by stage07::resolve_options).
using stage07::ModelOptions;
using stage07::ResolvedOptions;
using stage07::MaxSeqlens;

/// The step of the road whose main kernel takes stage 10's switches: the default one
/// (attention.cuh's kDefaultStep; attention.cu checks that they agree).
inline constexpr int kModelStep = 9;

/// The default main kernel with stage 10's switches: grouped-query heads (a runtime value: Hq / Hk
/// = 1 is its plain case), a sliding window where `Window` (the window's bounds are runtime
/// values, but its masks and query-block ranges cost registers even where the window is full or
/// causal, so calls without a band run the instance without it), and the soft cap where `Softcap`
/// (a tanh per score and 1 - tanh^2 in dS), so that only the calls that ask for it pay it. Calls
/// without any of them run the default kernel itself (ResolvedOptions::plain()).
template <int D, bool Softcap, bool Window = true>
using ModelStep = ModelFeatures<TiledStepFeatures<D, kModelStep>, true, Window, Softcap>;

/// stage07::resolve_options() (InputError for Hk not dividing Hq, a bound below -1, a negative
/// or infinite cap, a dropout p out of range: Dropout::validate()), and what this backward adds:
/// the switches on the default main kernel only (`step`, 0 to kRoadSteps - 1, is the step that would run).
inline ResolvedOptions resolve_backward_options(const Problem& p, const ModelOptions& options, int step) {
    const ResolvedOptions m = stage07::resolve_options(p, options);
    if (!m.plain() && step != kModelStep) {
        throw InputError("stage 09: grouped heads, a window, a soft cap or dropout run on the default main kernel only "
                         "(--step " + std::to_string(kModelStep) + "), not on step " + std::to_string(step));
    }
    return m;
}

/// resolve_backward_options() for a packed call: stage07::resolve_varlen() (cu_seqlens, the longest
/// lengths, Hk dividing Hq, the window, the cap, dropout's p).
inline ResolvedOptions resolve_varlen_backward(const VarlenProblem& vp, const MaxSeqlens& max) {
    return stage07::resolve_varlen(vp, max);
}

/// Calls `run(F{})` with F, or Dropped<F> when `options` drop entries of P: dropout is a
/// compile-time switch too, so that the calls without it run the kernels they always ran.
template <class F, class Run>
decltype(auto) with_dropout_if(const ResolvedOptions& options, Run&& run) {
    if (options.dropout.enabled()) return run(Dropped<F>{});
    return run(F{});
}

/// Calls `run(F{})` with ModelStep<D, Softcap, Window> for the soft cap `options` ask for,
/// Dropped with dropout (named apart from stage 07's with_model_step(), which argument-dependent
/// lookup would also find for stage 07's ResolvedOptions).
template <int D, bool Window, class Run>
decltype(auto) with_capped_model_step(const ResolvedOptions& options, Run&& run) {
    if (options.softcap > 0.0) return with_dropout_if<ModelStep<D, true, Window>>(options, run);
    return with_dropout_if<ModelStep<D, false, Window>>(options, run);
}

/// Calls `run(F{})` with the features the default main kernel runs for `options`: its own when
/// they are plain, otherwise ModelStep with the switches they ask for, the window's code only for
/// a band (ResolvedOptions::has_band()).
template <int D, class Run>
decltype(auto) with_model_features(const ResolvedOptions& options, Run&& run) {
    if (options.plain()) return run(TiledStepFeatures<D, kModelStep>{});
    if (options.has_band()) return with_capped_model_step<D, true>(options, run);
    return with_capped_model_step<D, false>(options, run);
}
//! [model_steps]

/// The shape of one main kernel, for the host: block counts, padding, the workspace, the report.
struct Geometry {
    int br;                ///< query rows per query block
    int bc;                ///< keys per key block
    int warps;             ///< warps per block
    int bn;                ///< query columns per step
    int key_warps;         ///< warps along the keys (step 0: all of them, 16 keys each)
    bool kv_in_registers;  ///< step 0 only
    size_t smem;           ///< dynamic shared memory of one block, bytes
    int threads;           ///< threads per block
    bool pt_in_registers = false;  ///< dV and dK fed from the registers of P^T and dS^T (WithPtInRegisters)
};

/// The geometry of the warp-tiled kernel with features F.
template <int D, class F>
Geometry tiled_geometry() {
    using S = TiledShape<__nv_bfloat16, D, F>;
    return {F::kBr, F::kBc, F::kWarps, F::kBn, F::kKeyWarps, false, S::kSmemBytes, S::kThreads, kPtInRegisters<F>};
}

/// The geometry of the main kernel of `step` (0: warps own keys; 1 to kRoadSteps - 1: the
/// warp-tiled kernel with TiledStepFeatures) at head dimension D.
template <int D>
Geometry geometry_for(int step) {
    if (step == 0) {
        using F = typename Tuned<D>::F;
        using S = Shape<__nv_bfloat16, D, F>;
        return {F::kBr, F::kBc, F::kWarps, F::kBn, F::kWarps, F::kKVInRegisters, S::kSmemBytes, S::kThreads};
    }
    return with_tiled_step<D>(step, [](auto features) { return tiled_geometry<D, decltype(features)>(); });
}

/// Sizes every kernel derives from the problem and the block shape.
struct Counts {
    int64_t batch_heads;   ///< B * H
    int64_t q_blocks;      ///< Tr
    int64_t k_blocks;      ///< Tc
    int64_t seq_q_padded;  ///< Tr * Br
};

/// The counts of `problem` for blocks of shape `geo`; `extra_blocks` query blocks of padding rows
/// after the last (packed batches: a sequence's last query block may run past the packed rows).
inline Counts counts(const Problem& problem, const Geometry& geo, int64_t extra_blocks = 0) {
    Counts c{};
    c.batch_heads = problem.batch * problem.heads;
    c.q_blocks = ceil_div(problem.seq_q, geo.br);
    c.k_blocks = ceil_div(problem.seq_k, geo.bc);
    c.seq_q_padded = (c.q_blocks + extra_blocks) * geo.br;
    return c;
}

//! [group_split_rule]
/// A block's loop is long when it visits more than this many query blocks (its G / S query heads
/// times the query blocks of a head, Tr at most): group_split_rule() then asks for four blocks
/// per SM instead of two.
inline constexpr int64_t kLongLoopQueryBlocks = 512;

/// The group split's rule: S, the blocks that share one group of G = Hq / Hk query heads (each
/// visiting G / S of them), is the smallest divisor of G that gives the grid (`base_blocks` S
/// blocks; base_blocks: the grid without the split) two blocks per SM, or four while a block's
/// loop, G / S times `query_blocks` (the most query blocks a block visits per head), is longer
/// than kLongLoopQueryBlocks; G when none does. Two blocks per SM balance the causal grid's
/// longest blocks; beyond that each split adds its float32 partials, which only long loops pay
/// for (stage 09's lesson has the measurements on the H100).
inline int group_split_rule(int64_t base_blocks, int kv_group, int sms, int64_t query_blocks) {
    for (int s = 1; s < kv_group; ++s) {
        if (kv_group % s != 0) continue;
        const int64_t per_sm = (kv_group / s) * query_blocks > kLongLoopQueryBlocks ? 4 : 2;
        if (base_blocks * s >= per_sm * int64_t(sms)) return s;
    }
    return kv_group;
}
//! [group_split_rule]

/// The group split S for a call with G = `kv_group` query heads per K/V head: 1 in the
/// deterministic mode (its turns and its block order are those of the grid without the split) and
/// without grouped heads; otherwise `requested` (the override: FA_STAGE09_GROUP_SPLIT, or a test's
/// choice), or group_split_rule() when it is 0 (`query_blocks`: the most query blocks a block visits
/// per query head). Throws fa::InputError for a requested S that is
/// negative or does not divide G, or that makes the grid larger than 2^31 blocks.
inline int group_split(int64_t base_blocks, int kv_group, int64_t query_blocks, bool deterministic, int sms,
                       int requested) {
    if (requested < 0 || (requested > 0 && !deterministic && kv_group % requested != 0)) {
        std::string divisors;
        for (int s = 1; s <= kv_group; ++s) {
            if (kv_group % s == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(s);
        }
        throw InputError("stage 09: a group split of " + std::to_string(requested) +
                         " blocks (FA_STAGE09_GROUP_SPLIT) does not divide the " + std::to_string(kv_group) +
                         " query heads per K/V head: use 0 (the rule) or one of " + divisors);
    }
    if (deterministic || kv_group == 1) return 1;
    const int s = requested > 0 ? requested : group_split_rule(base_blocks, kv_group, sms, query_blocks);
    if (base_blocks * s >= (int64_t(1) << 31)) {
        throw InputError("stage 09: the group split " + std::to_string(s) + " needs more than 2^31 thread blocks");
    }
    return s;
}

/// The override of group_split()'s rule, from the environment: FA_STAGE09_GROUP_SPLIT=n (0 or
/// unset: the rule), to measure each S (bench/session.py run split09). Read beside
/// FA_STAGE09_BLOCK_ORDER (make_launches()), but by the callers, before they size the workspace.
inline int group_split_from_environment() {
    const char* text = std::getenv("FA_STAGE09_GROUP_SPLIT");
    if (text == nullptr || *text == '\0') return 0;
    char* end = nullptr;
    const long n = std::strtol(text, &end, 10);
    if (*end != '\0' || n < 0 || n > (1 << 20)) {
        throw InputError(std::string("FA_STAGE09_GROUP_SPLIT=") + text + " is not a number of blocks: use 0 (the rule) "
                         "or a divisor of the query heads per K/V head");
    }
    return int(n);
}

/// FA_STAGE09_BLOCK_ORDER=heads: the blocks head by head whatever the rules of make_launches()
/// and packed_longest_first() say, to measure what the order gains (bench/session.py run order09).
inline bool block_order_heads() {
    const char* order = std::getenv("FA_STAGE09_BLOCK_ORDER");
    return order != nullptr && std::string(order) == "heads";
}

/// Floats of the group split's partial sums: S float32 copies of dK and of dV, (B Hk Nk) rows of
/// d each (Hk = Hq / `kv_group`; packed: B = 1, Nk = total_k); none for S = 1.
inline int64_t partial_floats(const Problem& problem, int kv_group, int group_split) {
    if (group_split <= 1) return 0;
    return 2 * int64_t(group_split) * problem.batch * (problem.heads / kv_group) * problem.seq_k * problem.head_dim;
}

/// Floats of the workspace: L log2(e) and D (one per padded row), the dQ accumulator (d per padded
/// row), and with the group split S > 1 (of G = `kv_group`) its partial dK and dV (partial_floats()).
inline int64_t workspace_floats(const Problem& problem, const Geometry& geo, int64_t extra_blocks = 0, int kv_group = 1,
                                int group_split = 1) {
    const Counts c = counts(problem, geo, extra_blocks);
    return c.batch_heads * c.seq_q_padded * (2 + problem.head_dim) + partial_floats(problem, kv_group, group_split);
}

/// The launches of one backward (three, four with the group split): each kernel's arguments and block count.
template <class T>
struct Launches {
    PreprocessArgs<T> pre;     ///< backward_preprocess_kernel's arguments
    int64_t pre_blocks;        ///< its blocks (kPrePostThreads threads each)
    Args<T> main;              ///< the main kernel's arguments
    int64_t main_blocks;       ///< its blocks: one per (key block, batch, head), times S with the group split
    PostprocessArgs<T> post;   ///< backward_postprocess_kernel's arguments
    int64_t post_blocks;       ///< its blocks (grid-stride)
    DkdvReduceArgs<T> reduce;  ///< backward_dkdv_reduce_kernel's arguments (group split S > 1)
    int64_t reduce_blocks;     ///< its blocks (grid-stride); 0: no such launch (S = 1)
};

//! [launches]
/// The arguments and block counts of the three kernels for one problem. `workspace` holds
/// workspace_floats() floats (L log2(e), then D, then the dQ accumulator, per padded row); `turns`
/// holds B*H*Tr counters in the deterministic mode, nullptr otherwise.
/// With stage 10's options `m`: q, o, dout, dq and lse have Hq = p.heads heads, k, v, dk and dv
/// Hk = Hq / m.kv_group; the main grid has one block per (key block, batch, K/V head), the
/// preprocessing and postprocessing kernels work per query head. `group_split`: S of group_split()
/// (the workspace then holds workspace_floats() with the same S): S > 1 blocks per (key block,
/// batch, K/V head), the split innermost, and the kernel that adds their partial dK and dV.
template <class T, int D>
Launches<T> make_launches(const Problem& p, const ResolvedOptions& m, View4<const T> q, View4<const T> k,
                          View4<const T> v, View4<const T> o, View3<const float> lse, View4<const T> dout, View4<T> dq,
                          View4<T> dk, View4<T> dv, float* workspace, int* turns, const Geometry& geo,
                          int64_t extra_blocks = 0, int group_split = 1) {
    const Counts c = counts(p, geo, extra_blocks);
    float* lse_log2 = workspace;                                 // [B*H, Nq_padded]
    float* delta = lse_log2 + c.batch_heads * c.seq_q_padded;    // [B*H, Nq_padded]
    float* dq_accum = delta + c.batch_heads * c.seq_q_padded;    // [B*H, Nq_padded, d] (16-byte aligned: Nq_padded % 64 == 0)
    const double scale = p.softmax_scale();
    Launches<T> l{};

    PreprocessArgs<T>& pre = l.pre;
    pre.o = o.data, pre.dout = dout.data, pre.lse = lse.data;
    pre.lse_log2 = lse_log2, pre.delta = delta, pre.dq_accum = dq_accum, pre.turns = turns;
    pre.o_sb = o.stride[0], pre.o_sh = o.stride[1], pre.o_sn = o.stride[2];
    pre.do_sb = dout.stride[0], pre.do_sh = dout.stride[1], pre.do_sn = dout.stride[2];
    pre.lse_sb = lse.stride[0], pre.lse_sh = lse.stride[1], pre.lse_sn = lse.stride[2];
    pre.rows = c.batch_heads * c.seq_q_padded;
    pre.heads = int(p.heads), pre.seq_q = int(p.seq_q), pre.seq_q_padded = int(c.seq_q_padded), pre.br = geo.br;
    pre.lse_log2_shift = 0.0f, pre.delta_scale = 1.0f;  // dropout sets them below
    l.pre_blocks = ceil_div(pre.rows, kPrePostThreads / (D / 8));

    Args<T>& a = l.main;
    a.q = q.data, a.k = k.data, a.v = v.data, a.dout = dout.data, a.dk = dk.data, a.dv = dv.data;
    a.lse_log2 = lse_log2, a.delta = delta, a.dq_accum = dq_accum, a.turns = turns;
    a.q_sb = q.stride[0], a.q_sh = q.stride[1], a.q_sn = q.stride[2];
    a.k_sb = k.stride[0], a.k_sh = k.stride[1], a.k_sn = k.stride[2];
    a.v_sb = v.stride[0], a.v_sh = v.stride[1], a.v_sn = v.stride[2];
    a.do_sb = dout.stride[0], a.do_sh = dout.stride[1], a.do_sn = dout.stride[2];
    a.dk_sb = dk.stride[0], a.dk_sh = dk.stride[1], a.dk_sn = dk.stride[2];
    a.dv_sb = dv.stride[0], a.dv_sh = dv.stride[1], a.dv_sn = dv.stride[2];
    a.heads = int(p.heads), a.seq_q = int(p.seq_q), a.seq_k = int(p.seq_k), a.seq_q_padded = int(c.seq_q_padded);
    a.q_blocks = int(c.q_blocks), a.k_blocks = int(c.k_blocks);
    a.causal = p.causal || m.right == 0;  // the window (-1, 0) is causal attention
    // The scale keeps its sign: P = exp2(s * scale*log2e - L*log2e) is right for either sign, and
    // masked entries are zeroed after the exponential. A zero scale gives uniform weights.
    a.scale = float(scale);
    a.scale_log2 = float(scale * 1.4426950408889634);  // log2(e)
    a.kv_group = m.kv_group;
    a.window_left = m.left, a.window_right = m.right;  // causal is (-1, 0) here
    if (m.softcap > 0.0) {
        // The kernel scales and caps the scores itself (c tanh(scale s / c)), then takes P from
        // the capped ones with log2(e) alone; dK and dQ keep the softmax scale (a.scale, post.scale).
        a.softcap = float(m.softcap);
        a.softcap_scale = float(scale / m.softcap);
        a.scale_log2 = 1.4426950408889634f;
    }
    if (m.dropout.enabled()) {  // stage 07's map (fa/philox.hpp), as its forward drew it
        a.dropout_threshold = dropout_threshold(m.dropout.p);
        // The kept entries' factor c = 1/(1 - p') rides in P itself: exp2 of the scores minus
        // L log2(e) - log2(c) is c P, and D is divided by c (warp_tiled.cuh's dS).
        const double c = dropout_keep_scale(m.dropout.p);
        pre.lse_log2_shift = float(std::log2(c));
        pre.delta_scale = float(1.0 / c);
        a.dropout_seed_lo = uint32_t(m.dropout.seed), a.dropout_seed_hi = uint32_t(m.dropout.seed >> 32);
        a.dropout_offset = m.dropout.offset;
    }
    l.main_blocks = c.batch_heads / m.kv_group * c.k_blocks;
    // Grouped heads under a causal mask or a window: the longest loops first (the deterministic
    // mode keeps its order, which its turns need). FA_STAGE09_BLOCK_ORDER=heads keeps the blocks
    // head by head, to measure the difference (bench/session.py run order09).
    a.key_blocks_outer = m.kv_group > 1 && (a.causal || m.left >= 0 || m.right >= 0) && !block_order_heads();
    // The group split (group_split(); its override FA_STAGE09_GROUP_SPLIT is read by the callers,
    // which size the workspace with it): S blocks per block of the grid above, block base S + s,
    // so that the order above holds for the base blocks. Atomic dQ only: the deterministic mode's
    // turns and block order are those of the grid without the split (key_block_of_this_block,
    // wait_for_turn), so it keeps S = 1.
    if (group_split < 1 || m.kv_group % group_split != 0 || (turns != nullptr && group_split != 1)) {
        throw InputError("stage 09: a group split of " + std::to_string(group_split) + " blocks for " +
                         std::to_string(m.kv_group) + " query heads per K/V head" +
                         (turns != nullptr ? " in the deterministic mode" : "") +
                         ": use a divisor of the group (1 in the deterministic mode)");
    }
    a.group_split = group_split;
    l.main_blocks *= group_split;
    l.reduce_blocks = 0;
    if (group_split > 1) {
        const int64_t kv_rows = p.batch * (p.heads / m.kv_group) * p.seq_k;  // rows of dK: B Hk Nk
        a.dk_partial = dq_accum + c.batch_heads * c.seq_q_padded * D;     // [S, B*Hk, Nk, d]
        a.dv_partial = a.dk_partial + group_split * kv_rows * D;          // [S, B*Hk, Nk, d]
        a.partial_split_stride = kv_rows * D;
        a.partial_head_stride = p.seq_k * D;
        // The reduction reads 16-byte chunks: the workspace starts 16-byte aligned and every
        // piece before the partials is a multiple of 4 floats (Nq_padded % Br == 0, d % 8 == 0).
        if (reinterpret_cast<uintptr_t>(a.dk_partial) % 16 != 0 || reinterpret_cast<uintptr_t>(a.dv_partial) % 16 != 0) {
            throw std::logic_error("stage 09: the group split's partial sums are not 16-byte aligned");
        }
        DkdvReduceArgs<T>& r = l.reduce;
        r.dk_partial = a.dk_partial, r.dv_partial = a.dv_partial, r.dk = dk.data, r.dv = dv.data;
        r.dk_sb = dk.stride[0], r.dk_sh = dk.stride[1], r.dk_sn = dk.stride[2];
        r.dv_sb = dv.stride[0], r.dv_sh = dv.stride[1], r.dv_sn = dv.stride[2];
        r.rows = kv_rows, r.split_stride = kv_rows * D;
        r.heads = int(p.heads / m.kv_group), r.seq_k = int(p.seq_k), r.splits = group_split;
        l.reduce_blocks = std::min<int64_t>(ceil_div(kv_rows * (D / 8), kPrePostThreads), int64_t(1) << 16);
    }

    PostprocessArgs<T>& post = l.post;
    post.dq_accum = dq_accum, post.dq = dq.data;
    post.dq_sb = dq.stride[0], post.dq_sh = dq.stride[1], post.dq_sn = dq.stride[2];
    post.rows = c.batch_heads * p.seq_q;
    post.heads = int(p.heads), post.seq_q = int(p.seq_q), post.seq_q_padded = int(c.seq_q_padded);
    post.scale = float(scale);
    l.post_blocks = std::min<int64_t>(ceil_div(post.rows * (D / 8), kPrePostThreads), int64_t(1) << 16);
    return l;
}
//! [launches]

/// make_launches() of a plain call (no grouped heads, window or soft cap).
template <class T, int D>
Launches<T> make_launches(const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<const T> o,
                          View3<const float> lse, View4<const T> dout, View4<T> dq, View4<T> dk, View4<T> dv,
                          float* workspace, int* turns, const Geometry& geo) {
    return make_launches<T, D>(p, ResolvedOptions{}, q, k, v, o, lse, dout, dq, dk, dv, workspace, turns, geo);
}

/// A kernel as a type: `Kernel<k>::value` is `k`, so that a generic launcher receives the kernel
/// as a compile-time constant (what fa::cuda::allow_dynamic_shared_memory takes).
template <auto kKernel>
struct Kernel {
    static constexpr auto value = kKernel;  ///< the kernel
};


/// The earliest step of the road whose main kernel at head dimension D is the very instance step
/// `Step` launches (Step itself when no earlier step has it): several steps change one head
/// dimension only and run an earlier step's kernel at the others.
template <int D, int Step, int Earlier = 1>
constexpr int earliest_step_with_kernel() {
    if constexpr (Step == 0 || Earlier >= Step) {
        return Step;
    } else if constexpr (std::is_same_v<TiledStepFeatures<D, Earlier>, TiledStepFeatures<D, Step>>) {
        return Earlier;
    } else {
        return earliest_step_with_kernel<D, Step, Earlier + 1>();
    }
}

/// earliest_step_with_kernel() of every step, as a table.
template <int D, int... Steps>
constexpr std::array<int, sizeof...(Steps)> steps_with_kernel(std::integer_sequence<int, Steps...>) {
    return {earliest_step_with_kernel<D, Steps>()...};
}

/// The earliest step whose main kernel at head dimension D is the one `step` launches: a step
/// equal to an earlier one there needs no run of its own to be checked or timed.
template <int D>
int same_kernel_as(int step) {
    static constexpr std::array<int, kRoadSteps> kTable = steps_with_kernel<D>(std::make_integer_sequence<int, kRoadSteps>{});
    return kTable[size_t(step)];
}

/// The postprocessing kernel (dQ rounded to T) for an accumulator in rows or, kDqTiled, in 8 x 8
/// tiles (the main kernel's kDqTiles), through `launch` (see run_kernels).
template <class T, int D, bool kDqTiled, class Launch>
void launch_postprocess(const Launches<T>& l, Launch& launch) {
    launch(Kernel<backward_postprocess_kernel<T, D, kDqTiled>>{}, "backward_postprocess_kernel", l.post_blocks, kPrePostThreads,
           size_t(0), l.post);
}

/// The group split's fourth kernel (S > 1: the partial dK and dV added and rounded), after the
/// main kernel; nothing for S = 1.
template <class T, int D, class Launch>
void launch_dkdv_reduce(const Launches<T>& l, Launch& launch) {
    if (l.reduce_blocks == 0) return;
    launch(Kernel<backward_dkdv_reduce_kernel<T, D>>{}, "backward_dkdv_reduce_kernel", l.reduce_blocks, kPrePostThreads,
           size_t(0), l.reduce);
}

/// The warp-tiled main kernel with features F and what follows it, through `launch` (see
/// run_kernels): the group split's reduction (S > 1) and the postprocessing kernel that reads F's
/// accumulator (in rows, or in tiles: kDqTiles).
template <class T, int D, class F, bool kDeterministic, class Launch>
void launch_tiled(const Launches<T>& l, Launch& launch) {
    using S = TiledShape<T, D, F>;
    launch(Kernel<flash_backward_tiled_kernel<T, D, F, kDeterministic>>{}, "flash_backward_tiled_kernel", l.main_blocks,
           S::kThreads, S::kSmemBytes, l.main);
    launch_dkdv_reduce<T, D>(l, launch);
    launch_postprocess<T, D, kDqTiles<F>>(l, launch);
}

//! [run]
/// The launch sequence: preprocess (D_i, L_i log2 e, zeroed accumulator and turns), the main
/// kernel of `step`, postprocess (dQ rounded to T), in this order on one stream. `launch` is
/// called as `launch(Kernel<k>{}, name, blocks, threads, shared_bytes, args)` for each.
template <class T, int D, bool kDeterministic, class Launch>
void run_kernels(const Launches<T>& l, int step, Launch&& launch) {
    launch(Kernel<backward_preprocess_kernel<T, D>>{}, "backward_preprocess_kernel", l.pre_blocks, kPrePostThreads, size_t(0), l.pre);
    if (step == 0) {
        using F = typename Tuned<D>::F;
        using S = Shape<T, D, F>;
        launch(Kernel<flash_backward_kernel<T, D, F, kDeterministic>>{}, "flash_backward_kernel", l.main_blocks, S::kThreads,
               S::kSmemBytes, l.main);
        launch_postprocess<T, D, false>(l, launch);
        return;
    }
    with_tiled_step<D>(step, [&](auto features) { launch_tiled<T, D, decltype(features), kDeterministic>(l, launch); });
}
//! [run]

/// run_kernels() with stage 10's options: the default main kernel with the features
/// with_model_features() picks for `options` (launches made by make_launches() with the same options).
template <class T, int D, bool kDeterministic, class Launch>
void run_model_kernels(const Launches<T>& l, const ResolvedOptions& options, Launch&& launch) {
    launch(Kernel<backward_preprocess_kernel<T, D>>{}, "backward_preprocess_kernel", l.pre_blocks, kPrePostThreads, size_t(0), l.pre);
    with_model_features<D>(options, [&](auto features) { launch_tiled<T, D, decltype(features), kDeterministic>(l, launch); });
}

//! [varlen_launches]
/// The default main kernel on packed batches: ModelStep (grouped heads, the window, the soft cap
/// where `Softcap`; causal is the window (-1, 0) of each sequence) with the varlen switch.
template <int D, bool Softcap>
using VarlenStep = Packed<ModelStep<D, Softcap>>;

/// Calls `run(F{})` with the features a packed call runs for `options`: VarlenStep with or
/// without the soft cap, Dropped with dropout.
template <int D, class Run>
decltype(auto) with_varlen_features(const ResolvedOptions& options, Run&& run) {
    if (options.softcap > 0.0) return with_dropout_if<VarlenStep<D, true>>(options, run);
    return with_dropout_if<VarlenStep<D, false>>(options, run);
}

//! [kv_schedule]
/// The blocks of one K/V head of a packed call, as the main kernel's schedule: entry e is
/// (sequence, key block), 2 ints, one entry per key block of `bc` keys of every sequence that has
/// keys (a sequence with keys but no queries still writes dK = dV = 0), sequence by sequence.
/// With `longest_first` (packed_longest_first(); atomic dQ) the entries are sorted longest loop
/// first instead: by the query blocks of `br` rows the key block visits under the window
/// (window_query_blocks(), each sequence bottom-right aligned; causal is (-1, 0)), most first,
/// ties in sequence and key block order; the kernel then runs entry by entry with the heads
/// innermost (schedule_entry()), so the long sequences' first key blocks of every head start in
/// the first wave and the short loops fill the end of the run. In the deterministic mode
/// (`deterministic`) the key blocks of one sequence are neighbours, the last one first: the blocks
/// a block waits for then have smaller numbers, as in the dense grid (key_block_of_this_block).
inline std::vector<int32_t> kv_schedule(const VarlenProblem& vp, const ResolvedOptions& m, int br, int bc,
                                        bool deterministic, bool longest_first) {
    struct Entry {
        int32_t seq, block, query_blocks;
    };
    std::vector<Entry> entries;
    for (int64_t b = 0; b < vp.batch(); ++b) {
        const int nq = int(vp.seq_q(b)), nk = int(vp.seq_k(b)), blocks = int(ceil_div(nk, bc));
        for (int n = 0; n < blocks; ++n) {
            const int j = deterministic ? blocks - 1 - n : n;
            int begin, end;
            window_query_blocks(j, br, bc, nq, nk, m.left, m.right, begin, end);
            entries.push_back({int32_t(b), int32_t(j), int32_t(end - begin)});
        }
    }
    if (longest_first && !deterministic) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const Entry& x, const Entry& y) { return x.query_blocks > y.query_blocks; });
    }
    std::vector<int32_t> schedule;
    schedule.reserve(2 * entries.size());
    for (const Entry& e : entries) schedule.insert(schedule.end(), {e.seq, e.block});
    return schedule;
}

/// Whether a packed call's blocks go entry by entry, longest loop first (kv_schedule(),
/// schedule_entry()) rather than head by head: with atomic dQ, when the sequences differ in
/// length, or with grouped heads under a causal mask or a window (the dense grid's rule,
/// make_launches()). Head by head, the blocks running at once share their head's Q and dO in L2;
/// entry by entry, they read every head's. Equal lengths keep that locality, and lose little at
/// the end of the run, since every head ends with the same short loops. Mixed lengths put the
/// longest sequence's first key blocks of the last heads at the end of a head-by-head run, where
/// they run alone. Stage 10's lesson measures both orders on both kinds of batch
/// (docs/results/stage10_packed_order.txt). FA_STAGE09_BLOCK_ORDER=heads: head by head always.
inline bool packed_longest_first(const VarlenProblem& vp, const ResolvedOptions& m, bool deterministic) {
    if (deterministic || block_order_heads()) return false;
    if (m.kv_group > 1 && (m.left >= 0 || m.right >= 0)) return true;
    return vp.lengths_differ();
}
//! [kv_schedule]

/// The problem the preprocessing and postprocessing kernels see for a packed call: one batch
/// entry of Hq heads and total_q rows (they work row by row, whatever sequence a row is in).
inline Problem varlen_rows_problem(const VarlenProblem& vp) {
    Problem p;
    p.batch = 1, p.heads = vp.heads_q, p.seq_q = vp.total_q, p.seq_k = vp.total_k, p.head_dim = vp.head_dim;
    p.scale = vp.scale, p.causal = false;
    return p;
}

/// The launches of a packed call: make_launches() of varlen_rows_problem() with one query block
/// of padding rows more per head (a sequence's last query block may run that far past the packed
/// rows), a turn counter per padded row (`turns`: Hq seq_q_padded ints, all zeroed by the
/// preprocessing kernel, which counts them as one-row blocks), and the packed arrays: cu_seqlens
/// and the schedule of `entries` entries (kv_schedule()), all on the device; `longest_first`: the
/// schedule is sorted longest loop first, and the blocks go entry by entry (packed_longest_first(),
/// the value kv_schedule() was given). The window of `m` is resolved against the longest sequences
/// (resolve_varlen()).
template <class T, int D>
Launches<T> make_varlen_launches(const VarlenProblem& vp, const ResolvedOptions& m, View4<const T> q, View4<const T> k,
                                 View4<const T> v, View4<const T> o, View3<const float> lse, View4<const T> dout,
                                 View4<T> dq, View4<T> dk, View4<T> dv, float* workspace, int* turns, const Geometry& geo,
                                 const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, const int32_t* schedule,
                                 int64_t entries, bool longest_first, int group_split = 1) {
    Launches<T> l =
        make_launches<T, D>(varlen_rows_problem(vp), m, q, k, v, o, lse, dout, dq, dk, dv, workspace, turns, geo, 1, group_split);
    l.pre.br = 1;  // zero every row's counter
    l.main.causal = false;  // the window of each sequence masks
    l.main.cu_seqlens_q = cu_seqlens_q, l.main.cu_seqlens_k = cu_seqlens_k;
    l.main.kv_schedule = schedule, l.main.schedule_entries = int(entries);
    l.main.key_blocks_outer = longest_first;
    l.main_blocks = (vp.heads_q / m.kv_group) * entries * group_split;
    return l;
}
//! [varlen_launches]

/// run_model_kernels() for a packed call (launches made by make_varlen_launches()).
template <class T, int D, bool kDeterministic, class Launch>
void run_varlen_kernels(const Launches<T>& l, const ResolvedOptions& options, Launch&& launch) {
    launch(Kernel<backward_preprocess_kernel<T, D>>{}, "backward_preprocess_kernel", l.pre_blocks, kPrePostThreads, size_t(0), l.pre);
    stage09::with_varlen_features<D>(options, [&](auto features) { launch_tiled<T, D, decltype(features), kDeterministic>(l, launch); });
}

}  // namespace fa::stage09
