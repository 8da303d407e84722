/// \file stages/07_pipelined_fused_kernel/launch.cuh
/// \brief Stage 07's tuned block shapes, its road of features, the instances stage 10's switches
/// add, and the kernel's arguments for one call.
///
/// The host entry points (attention.cu) launch the kernel on a stream; the CPU test
/// (tests/test_stage07_emulated.cpp) runs the very same instances with the very same arguments on
/// the warp emulator (tools/warp_emulator). Both take them from here, so the test checks what the
/// stage runs, not a copy of it.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "fa/philox.hpp"
#include "fa/kernel_args.hpp"
#include "fa/problem.hpp"
#include "fa/tensor.hpp"
#include "kernel.cuh"
#include "model_options.hpp"

namespace fa::stage07 {

// The tuned shapes and the road are read in the lesson (its snippets `tuned` and `road`, with the
// words around them); Doxygen's reference pages leave them out, as when they lived in attention.cu.
/// \cond
//! [tuned]
/// The tile shape of the final kernel for head dimension D: query rows per block, keys per
/// tile, warps, pipeline depth, Q's fragments kept in registers or re-read, and whether O is
/// rescaled lazily. Chosen by measurement on an H100 (see the lesson): each warp owns 16 or 32
/// query rows; more rows per warp reuse every K and V fragment more often, but need more
/// registers (Q fragments, O accumulators and S all stay in registers).
template <int D>
struct Tuned;
template <>
struct Tuned<32> {
    static constexpr int kBr = 128, kBc = 64, kWarps = 4, kStages = 2;
    static constexpr bool kQInRegisters = true, kLazyRescale = false;
};
template <>
struct Tuned<64> {
    static constexpr int kBr = 128, kBc = 64, kWarps = 4, kStages = 2;
    static constexpr bool kQInRegisters = true, kLazyRescale = false;
};
template <>
struct Tuned<128> {  // 32 rows per warp fit only with Q re-read from shared memory
    static constexpr int kBr = 128, kBc = 64, kWarps = 4, kStages = 2;
    static constexpr bool kQInRegisters = false, kLazyRescale = true;
};
template <>
struct Tuned<256> {
    static constexpr int kBr = 64, kBc = 32, kWarps = 4, kStages = 2;
    static constexpr bool kQInRegisters = false, kLazyRescale = false;
};
//! [tuned]

//! [road]
// Step 0, the first tensor-core kernel: mma.sync on fragments gathered by 32-bit shared loads
// from plain row-major tiles; load, wait, compute; P through shared memory; expf; under a causal
// mask every key tile visited and masked. Blocks of 64 query rows, 4 warps of 16 rows, 64 keys
// per tile. Each later step is the one before with one more idea switched on.
constexpr FeatureSet kStep0 = FeatureSet{};
constexpr FeatureSet kStep1 = kStep0.with_ldmatrix();
constexpr FeatureSet kStep2 = kStep1.with_swizzle();
constexpr FeatureSet kStep3 = kStep2.with_pipeline(2);
constexpr FeatureSet kStep4 = kStep3.with_p_in_registers();
constexpr FeatureSet kStep5 = kStep4.with_exp2();
template <int D>  // the block shape measured best for this d
constexpr FeatureSet kStep6 = kStep5.with_tile(Tuned<D>::kBr, Tuned<D>::kBc, Tuned<D>::kWarps, Tuned<D>::kStages,
                                               Tuned<D>::kQInRegisters);
template <int D>
constexpr FeatureSet kStep7 = kStep6<D>.with_causal_skip();
template <int D>  // where it measured faster (d = 128): the final kernel
constexpr FeatureSet kStep8 = kStep7<D>.with_lazy_rescale(Tuned<D>::kLazyRescale);
constexpr int kFinalStep = 8;

/// Step `Step` of the road at head dimension D, as a FeatureSet (kFeatures) for FeaturesOf.
template <int D, int Step>
struct RoadSet {
    static constexpr FeatureSet kSteps[kFinalStep + 1] = {kStep0, kStep1, kStep2, kStep3, kStep4, kStep5, kStep6<D>, kStep7<D>, kStep8<D>};
    static constexpr FeatureSet kFeatures = kSteps[Step];  ///< the features of the step
};
/// The kernel's Features of step `Step` at head dimension D.
template <int D, int Step>
using RoadStep = FeaturesOf<RoadSet<D, Step>>;
//! [road]
/// \endcond

//! [model_steps]
/// The final kernel with stage 10's switches: grouped-query heads (a runtime value: Hq/Hk = 1 is
/// its plain case), a sliding window where `Window` (its bounds are runtime values, but its tile
/// ranges and two-sided masks cost registers even where the window is full or causal, so dense
/// calls without a band run the instance without it and mask by the causal flag), the soft cap
/// where `Softcap` (a tanh per score) and dropout where `Dropout` (a Philox call per 16 scores),
/// so that only the calls that ask for those pay them. Calls without any of them run the final
/// kernel itself (ResolvedOptions::plain()).
template <int D, bool Softcap, bool Dropout = false, bool Window = true>
struct ModelSet {
    /// the final kernel's features with the grouped heads
    static constexpr FeatureSet kGrouped = kStep8<D>.with_grouped_heads();
    /// ... maybe with the window
    static constexpr FeatureSet kModel = Window ? kGrouped.with_window() : kGrouped;
    /// ... maybe with the soft cap
    static constexpr FeatureSet kCapped = Softcap ? kModel.with_softcap() : kModel;
    /// ... and maybe with dropout
    static constexpr FeatureSet kFeatures = Dropout ? kCapped.with_dropout() : kCapped;
};
/// The kernel's Features of the final kernel with stage 10's switches.
template <int D, bool Softcap, bool Dropout = false, bool Window = true>
using ModelStep = FeaturesOf<ModelSet<D, Softcap, Dropout, Window>>;

/// Calls `run(F{})` with ModelStep<D, Softcap, Dropout, Window> for the soft cap and dropout that
/// `options` ask for.
template <int D, bool Window, class Run>
decltype(auto) with_model_step(const ResolvedOptions& options, Run&& run) {
    const bool capped = options.softcap > 0.0, dropped = options.dropout.enabled();
    if (capped && dropped) return run(ModelStep<D, true, true, Window>{});
    if (capped) return run(ModelStep<D, true, false, Window>{});
    if (dropped) return run(ModelStep<D, false, true, Window>{});
    return run(ModelStep<D, false, false, Window>{});
}

/// Calls `run(F{})` with the Features F the final kernel runs for `options`: the final kernel
/// itself when they are plain, otherwise ModelStep with the switches they ask for, the window's
/// code only for a band (ResolvedOptions::has_band()).
template <int D, class Run>
decltype(auto) with_final_features(const ResolvedOptions& options, Run&& run) {
    if (options.plain()) return run(RoadStep<D, kFinalStep>{});
    if (options.has_band()) return with_model_step<D, true>(options, run);
    return with_model_step<D, false>(options, run);
}
//! [model_steps]

//! [varlen_steps]
/// ModelSet on packed batches: the final kernel with grouped heads and the window (causal is the
/// window (-1, 0) of each sequence), the soft cap where `Softcap`, dropout where `Dropout`, and
/// the varlen switch. Packed calls keep the window's code without a band: without it ptxas spilled
/// more, not less (bf16, d = 128: 152 bytes of spill stores instead of 128; d = 64: 68 instead of 28).
template <int D, bool Softcap, bool Dropout = false>
struct VarlenSet {
    /// ModelSet's features with the varlen switch
    static constexpr FeatureSet kFeatures = ModelSet<D, Softcap, Dropout>::kFeatures.with_varlen();
};
/// The kernel's Features on packed batches.
template <int D, bool Softcap, bool Dropout = false>
using VarlenStep = FeaturesOf<VarlenSet<D, Softcap, Dropout>>;

/// Calls `run(F{})` with the Features F a packed call runs for `options`: VarlenStep with or
/// without the soft cap and dropout.
template <int D, class Run>
decltype(auto) with_varlen_features(const ResolvedOptions& options, Run&& run) {
    const bool capped = options.softcap > 0.0, dropped = options.dropout.enabled();
    if (capped && dropped) return run(VarlenStep<D, true, true>{});
    if (capped) return run(VarlenStep<D, true, false>{});
    if (dropped) return run(VarlenStep<D, false, true>{});
    return run(VarlenStep<D, false, false>{});
}
//! [varlen_steps]

/// The block shape of one instance, for the host.
struct Geometry {
    int br;      ///< query rows per block
    int bc;      ///< keys per K/V tile
    int warps;   ///< warps per block
    int stages;  ///< K/V tiles in flight
    bool q_in_registers;  ///< Q's fragments kept in registers (or re-read from shared memory)
    bool causal_skip;  ///< key tiles above the causal diagonal skipped (otherwise visited and masked)
    size_t smem;  ///< dynamic shared memory of one block, bytes
};

/// The Geometry of the instance (T, D, F).
template <class T, int D, class F>
Geometry geometry() {
    return {F::kBr, F::kBc, F::kWarps, F::kStages, F::kQInRegisters, F::kCausalSkip, Shape<T, D, F>::kSmemBytes};
}

//! [make_args]
/// The kernel's arguments for one call: pointers and strides of the views (elements), sizes, the
/// scale, and stage 10's options. q, o are (B, Hq, Nq, d), k, v (B, Hk, Nk, d), lse (B, Hq, Nq).
template <class T>
Args<T> make_args(const Problem& p, const ResolvedOptions& m, View4<const T> q, View4<const T> k, View4<const T> v,
                   View4<T> o, View3<float> lse, const Geometry& geo) {
    Args<T> a{};
    set_forward_tensors(a, q, k, v, o, lse);
    a.heads = int(p.heads);
    a.batch_heads = int(p.batch * p.heads);
    a.q_tiles = int((p.seq_q + geo.br - 1) / geo.br);
    a.seq_q = int(p.seq_q);
    a.seq_k = int(p.seq_k);
    // The plain kernel masks by this flag; with a window it only orders the query tiles (later
    // tiles see more keys when the right bound is set: heaviest first).
    a.causal = m.plain() ? p.causal || m.right == 0 : m.right >= 0;
    const double scale = p.softmax_scale();
    a.negate_q = scale < 0;
    // A zero scale would turn the -inf of a masked score into NaN (-inf * 0); the smallest normal
    // float gives the same uniform weights, since |s| * FLT_MIN rounds to 0 for every finite score.
    a.scale = std::max(float(std::fabs(scale)), FLT_MIN);
    a.scale_log2 = std::max(float(std::fabs(scale) * 1.4426950408889634), FLT_MIN);  // log2(e)
    a.kv_group = m.kv_group;
    a.window_left = m.left;
    a.window_right = m.right;
    if (m.softcap > 0.0) {
        // The kernel scales and caps the scores itself (c tanh(|scale| s / c)); the softmax then
        // runs on the capped scores with scale 1.
        a.softcap = float(m.softcap);
        a.softcap_scale = float(std::fabs(scale) / m.softcap);
        a.scale = 1.0f;
        a.scale_log2 = 1.4426950408889634f;
    }
    if (m.dropout.enabled()) {
        // fa/philox.hpp's map: the threshold byte, the factor of the kept scores, the key and counter word 3.
        a.dropout_threshold = dropout_threshold(m.dropout.p);
        a.dropout_keep_scale = float(dropout_keep_scale(m.dropout.p));
        a.dropout_seed_lo = uint32_t(m.dropout.seed), a.dropout_seed_hi = uint32_t(m.dropout.seed >> 32);
        a.dropout_offset = m.dropout.offset;
    }
    return a;
}
//! [make_args]

//! [tile_schedule]
/// The blocks of one head of a packed call, as the kernel's tile schedule: entry i is (sequence,
/// query tile), 2 ints, one entry per query tile of `br` rows that holds a query (so none for an
/// empty sequence, none past a sequence's end). Ordered heaviest first: by the key tiles of `bc`
/// keys the tile visits under the window (window_key_tiles(), each sequence bottom-right aligned),
/// most first, ties in sequence and tile order. The long sequences' heavy tiles then start
/// first and the short ones fill the gaps at the end of the run, as the causal order of a dense
/// call does.
inline std::vector<int32_t> tile_schedule(const VarlenProblem& vp, const ResolvedOptions& m, int br, int bc) {
    struct Entry {
        int32_t seq, tile, key_tiles;
    };
    std::vector<Entry> entries;
    for (int64_t b = 0; b < vp.batch(); ++b) {
        const int nq = int(vp.seq_q(b)), nk = int(vp.seq_k(b));
        for (int tile = 0; tile * br < nq; ++tile) {
            int first, full_first, full_end, end;
            window_key_tiles(tile * br, br, bc, nq, nk, Window{m.left, m.right}, first, full_first, full_end, end);
            entries.push_back({int32_t(b), int32_t(tile), int32_t(end - first)});
        }
    }
    std::stable_sort(entries.begin(), entries.end(), [](const Entry& x, const Entry& y) { return x.key_tiles > y.key_tiles; });
    std::vector<int32_t> schedule;
    schedule.reserve(2 * entries.size());
    for (const Entry& e : entries) schedule.insert(schedule.end(), {e.seq, e.tile});
    return schedule;
}
//! [tile_schedule]

//! [packed_heads_innermost]
/// Whether a packed call's blocks go entry by entry of the schedule, heads innermost, rather than
/// head by head: when the sequences differ in length (VarlenProblem::lengths_differ()). Head by
/// head, the blocks running at once share one head's K and V in L2, and with equal lengths every
/// head ends with the same light tiles; with mixed lengths the last heads' heaviest tiles (the
/// longest sequence's last query tiles) would start at the end of the run and run there alone.
/// Stage 10's lesson measures both orders (FA_STAGE07_BLOCK_ORDER=heads: head by head always).
inline bool packed_heads_innermost(const VarlenProblem& vp) {
    const char* order = std::getenv("FA_STAGE07_BLOCK_ORDER");
    if (order != nullptr && std::string(order) == "heads") return false;
    return vp.lengths_differ();
}
//! [packed_heads_innermost]

//! [make_varlen_args]
/// The kernel's arguments for one packed call: make_args() of the dense problem of one batch
/// entry at the longest lengths (varlen_bounds_problem()), with the packed views q, o (1, Hq,
/// total_q, d), k, v (1, Hk, total_k, d), lse (1, Hq, total_q), and the three device arrays:
/// cu_seqlens_q and cu_seqlens_k (B+1 each) and the tile schedule of `schedule_entries` entries
/// (tile_schedule(), 2 ints each). q_tiles is the schedule's length: blocks per head; their order
/// is packed_heads_innermost()'s.
template <class T>
Args<T> make_varlen_args(const VarlenProblem& vp, const MaxSeqlens& max, const ResolvedOptions& m, View4<const T> q,
                         View4<const T> k, View4<const T> v, View4<T> o, View3<float> lse, const Geometry& geo,
                         const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, const int32_t* schedule,
                         int64_t schedule_entries) {
    Args<T> a = make_args<T>(varlen_bounds_problem(vp, max), m, q, k, v, o, lse, geo);
    a.q_tiles = int(schedule_entries);
    a.causal = false;  // the schedule orders the tiles; the window masks
    a.cu_seqlens_q = cu_seqlens_q, a.cu_seqlens_k = cu_seqlens_k, a.tile_schedule = schedule;
    a.heads_innermost = packed_heads_innermost(vp);
    return a;
}
//! [make_varlen_args]

/// Thread blocks of one launch: query tiles x B x Hq.
template <class T>
int64_t grid_blocks(const Args<T>& a) {
    return int64_t(a.q_tiles) * a.batch_heads;
}

}  // namespace fa::stage07
