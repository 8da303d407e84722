/// \file stages/11_hopper_kernel/launch.cuh
/// \brief Stage 11's road of features, the kernel instances it builds, which one runs a call, and
/// that call's arguments and grid.
///
/// The entry points (attention.cu) launch the instance on a stream; the CPU test
/// (tests/test_stage11_emulated.cpp) runs the same instance with the same arguments on the warp
/// emulator (tools/warp_emulator). Both take them from here, so the test checks what the stage
/// runs. The names stay in an anonymous namespace, as when they were attention.cu's own, so the
/// kernels keep their names (hopper_forward_kernel<T, D, StepN<N>> of that object's namespace).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include <cuda_runtime.h>

#include "fa/cuda/half.hpp"
#include "fa/cuda/tensor_map.hpp"
#include "fa/error.hpp"
#include "fa/kernel_args.hpp"
#include "fa/problem.hpp"
#include "fa/tensor.hpp"
#include "kernel.cuh"

namespace fa::stage11 {

namespace {

// Why kDefaultStep (at the road snippet's end) is 17: in three runs on an H100, step 10 was level with
// step 9 or ahead of it at every point with N = 1024 and 4096 (×1.00-1.09), and at N = 16384
// within the spread of that point between runs (×0.94-1.05; stage11_road_table.txt,
// stage11_own_key_tiles.txt). Step 11 runs step 10's kernel except on short causal heads at
// d = 64, where its small blocks were ×1.18 in bf16 and fp16 at N = 1024 (stage11_small_blocks.txt).
// Step 12 was ×1.005-1.03 of step 11 at every N = 1024 point in two runs, and level with it at
// N = 4096 and 16384 within the spread between rounds (stage11_early_claim.txt). Step 13 was
// ×1.006-1.010 of step 12 at d = 64 without the mask at N = 1024 and ×1.003-1.018 at 2048 and 4096
// in two runs, level elsewhere (its d = 128 code is step 12's; stage11_staged_store.txt). Step 14
// was ×1.008-1.019 of step 13 at d = 128 at N = 1024 and ×1.003-1.014 at 2048 and 4096 in two runs
// (its d = 64 code is step 13's; stage11_batched_epilogue.txt). Step 15 was ×1.005-1.034 of step 14
// at every d = 128 point, bf16 and fp16, in two runs (its d = 64 code is step 14's;
// stage11_split_ring.txt). Step 16 was x1.068-1.072 of step 15 at d = 64 without the mask at N = 1024
// and x1.018-1.035 at 2048 and 4096 in two rounds; at d = 128, where no warpgroup is idle in those
// shapes, x0.993-1.003 up to N = 4096 (stage11_idle_warpgroups.txt). Step 17 was x1.012-1.031 of
// step 16 at every d = 128 point up to N = 4096 (x1.028-1.035 at 16384 under the mask) and
// x1.026-1.032 on d = 64's short causal heads (the small blocks, half of it step 14's batched
// epilogue, which they carry from step 17 on), bf16 and fp16, in two runs of two rounds; d = 64's
// other kernel is step 16's, byte for byte (stage11_lazy_rescale.txt).
//! [road]
// The road as named values, each the one before plus one idea (see Features).
constexpr Features kStep1{};                                    // one consumer warpgroup, wgmma, cp.async ring
constexpr Features kStep2 = kStep1.with_tma_ring(2);            // + TMA loads on mbarriers
constexpr Features kStep3 = kStep2.with_producer_warpgroup(2);  // + producer warpgroup, two consumers, setmaxnreg
constexpr Features kStep4 = kStep3.with_ping_pong(3);           // + consumers take turns on the tensor cores
constexpr Features kStep5 = kStep4.with_softmax_overlap();      // + softmax of S_j under P_{j-1} V_{j-1}
constexpr Features kStep6 = kStep5.with_heaviest_first_grid();  // + causal: a group's heaviest tiles first
constexpr Features kStep7 = kStep6.with_tma_store();            // + O leaves through shared memory and the TMA
constexpr Features kStep8 = kStep7.with_three_consumers_at_d64();  // + d = 64: three consumers, Br = 192
constexpr Features kStep9 = kStep8.with_persistent_grid();  // + one block per SM loops over the work; O by plain stores
constexpr Features kStep10 = kStep9.with_wide_stores();     // + the epilogue's stores 16 bytes a lane (a quad transpose)
constexpr Features kStep11 = kStep10.with_small_blocks_for_short_causal_heads();  // + d = 64, causal, Nk <= 1024: small blocks
constexpr Features kStep12 = kStep11.with_early_claim();  // + the next work item claimed while this one's last tile loads
constexpr Features kStep13 = kStep12.with_staged_store();  // + d = 64: O through its own buffer and a TMA store left running
constexpr Features kStep14 = kStep13.with_batched_epilogue();  // + the plain-store epilogue's rows done together
constexpr Features kStep15 = kStep14.with_split_ring_at_d128(2);  // + d = 128: K and V on rings of two slots each, O staged
constexpr Features kStep16 = kStep15.with_idle_warpgroups_past_nq();  // + warpgroups whose rows lie past Nq compute nothing
constexpr Features kStep17 = kStep16.with_lazy_rescale(8);  // + O rescaled only when a row's maximum grows past 2^8

// [0]: stage 07 (its own kernel; kStep1 fills the place)
constexpr Features kSteps[] = {kStep1, kStep1, kStep2, kStep3, kStep4, kStep5, kStep6, kStep7, kStep8, kStep9, kStep10, kStep11, kStep12, kStep13, kStep14, kStep15, kStep16, kStep17};
constexpr int kLastStep = 17;

/// Step N as a type the kernel template takes.
template <int N>
struct StepN {
    static constexpr Features value = kSteps[N];
};

/// The step attention_device() runs by default: the fastest of the road (measured: the comment above the road).
constexpr int kDefaultStep = 17;
//! [road]

/// Step N's small blocks (Features::small_blocks()), the kernel step 11 runs on short causal heads at d = 64.
template <int N>
struct SmallBlocksN {
    static constexpr Features value = kSteps[N].small_blocks();
};

/// Step N's instrumented build: the same kernel, its marks recorded (timeline.hpp).
template <int N>
struct TimelineStepN {
    static constexpr Features value = kSteps[N].with_timeline();
};

/// A list of steps as a type: the instances a launch may find are compiled from these lists, and
/// find_step() looks a run-time step up in one.
template <int... N>
using Steps = std::integer_sequence<int, N...>;

/// The steps with a kernel of their own: step 11 runs step 10's kernel except on short causal
/// heads at d = 64, where it runs its small blocks (small_blocks_step()).
using KernelSteps = Steps<1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17>;

/// The kernel of KernelSteps that step `step` runs on every problem without small blocks: step 11
/// differs from step 10 only on short causal heads at d = 64, and elsewhere its kernel would be
/// step 10's instruction for instruction.
constexpr int kernel_step(int step) { return step == 11 ? 10 : step; }

/// The steps with an instrumented build (bf16): no overlap (3), ping-pong (4), the softmax under
/// P V (5), the tile shapes of step 8 (7 at d = 128), the persistent grid (9), its wide
/// stores (10), the early claim of the next item (12) and the default step (17).
using TimelineSteps = Steps<3, 4, 5, 8, 9, 10, 12, 17>;

/// Calls fn(std::integral_constant<int, N>{}) for the N of the list equal to `step` and returns
/// what it returns, or `none` where the list has no such N.
template <class R, int... N, class Fn>
R find_step(Steps<N...>, int step, R none, Fn&& fn) {
    R found = none;
    (void)((step == N && (found = fn(std::integral_constant<int, N>{}), true)) || ...);
    return found;
}


//! [group_budget]
/// Step 6's groups of heads: as many heads as have their K and V within this many bytes, so
/// that a group's K and V stay in the H100's 50 MB L2 while its blocks run.
constexpr long long kGroupBudgetBytes = 16LL << 20;
//! [group_budget]

/// kGroupBudgetBytes, or FA_STAGE11_GROUP_MIB MiB when that is set (bench/session.py run groups11
/// times several budgets with it).
inline long long group_budget_bytes() {
    const char* env = std::getenv("FA_STAGE11_GROUP_MIB");
    if (env == nullptr || *env == '\0') return kGroupBudgetBytes;
    char* end = nullptr;
    const long long mib = std::strtoll(env, &end, 10);
    if (*end != '\0' || mib < 1 || mib > (1LL << 30)) {
        throw InputError(std::string("FA_STAGE11_GROUP_MIB=") + env + " is not a whole number of MiB from 1 to 2^30");
    }
    return mib << 20;
}

/// (batch, head) pairs per group of step 6's block order for problem p (schedule.hpp).
inline int group_heads_of(const Problem& p) {
    const long long kv_bytes_per_head = 2 * p.seq_k * p.head_dim * 2;  // K and V, 16-bit elements
    return heads_per_group(kv_bytes_per_head, group_budget_bytes(), int(p.batch * p.heads));
}

/// The step whose small blocks step `step` runs (11 or later): steps 12-16 run step 12's, step 17
/// its own, which carry step 14's batched epilogue and step 17's lazy rescale
/// (stage11_lazy_rescale.txt, part 8). The launch and the host's facts both ask here.
constexpr int small_blocks_step(int step) { return step >= 17 ? 17 : step >= 12 ? 12 : 11; }

/// The steps whose small blocks are built (the values small_blocks_step() takes).
using SmallBlocksSteps = Steps<11, 12, 17>;

/// Step 11: the most keys a causal head at d = 64 may have for the small blocks
/// (Features::small_blocks()). Measured on an H100 (bf16 and fp16): x1.18 over step 10 at
/// Nk = 1024, x0.98 at Nk = 2048 (docs/results/stage11_small_blocks.txt).
constexpr int kSmallBlocksMaxKeys = 1024;

/// Whether step `step` runs its small blocks on problem p (step 11: d = 64, causal, Nk <= kSmallBlocksMaxKeys).
inline bool small_blocks_for(int step, const Problem& p) {
    return step >= 1 && step <= kLastStep && kSteps[step].small_blocks_short_causal && p.head_dim == 64 && p.causal &&
           p.seq_k <= kSmallBlocksMaxKeys;
}

/// The features step `step` runs problem p with (for the host: block rows, tile size, whether
/// tensor maps are needed, blocks per SM). The instrumented build is the step's own kernel on
/// every problem: it has no small blocks.
inline Features features_of(int step, const Problem& p, bool instrumented = false) {
    const Features f = kSteps[step >= 1 && step <= kLastStep ? step : 1];
    return (small_blocks_for(step, p) && !instrumented ? f.small_blocks() : f).at_head_dim(int(p.head_dim));
}

/// Step N's label in messages.
template <int N>
std::string step_label(StepN<N>) {
    return "step " + std::to_string(N);
}
template <int N>
std::string step_label(SmallBlocksN<N>) {
    return "step " + std::to_string(N) + ", small blocks";
}
template <int N>
std::string step_label(TimelineStepN<N>) {
    return "step " + std::to_string(N) + ", instrumented";
}

/// Thread blocks of a launch: one per work item (query tile, head), or with the persistent grid
/// one per SM of the `sms` (at most one per item), each looping over its items.
inline unsigned grid_blocks(const Features& f, int q_tiles, int batch_heads, int sms) {
    const unsigned items = unsigned(q_tiles) * unsigned(batch_heads);
    return f.persistent ? std::min(items, unsigned(sms * f.blocks_per_sm)) : items;
}

/// A launch of one kernel instance on a stream.
template <class T>
using LaunchFn = void (*)(const Args<T>&, cudaStream_t);

/// Launch<T, D, Step>::run at head dimension d (null for another d).
template <class T, template <class, int, class> class Launch, class Step64, class Step128>
LaunchFn<T> launcher_at(int d) {
    return d == 64 ? &Launch<T, 64, Step64>::run : d == 128 ? &Launch<T, 128, Step128>::run : nullptr;
}

/// The instance that step `step` (1 to kLastStep) runs problem p with, as Launch<T, D, Step>::run
/// (attention.cu's launches it on a stream, the emulated test's on the CPU): the step's kernel, its
/// small blocks where small_blocks_for() says so, or with `instrumented` its instrumented build
/// (bf16 only). Null where none is built. The instances compiled are those this can return.
template <class T, template <class, int, class> class Launch>
LaunchFn<T> find_launcher(const Problem& p, int step, bool instrumented) {
    const int d = int(p.head_dim);
    if (instrumented) {
        if constexpr (!std::is_same_v<T, __nv_bfloat16>) {
            return nullptr;
        } else {
            return find_step(TimelineSteps{}, step, LaunchFn<T>{nullptr}, [d](auto n) {
                using Step = TimelineStepN<decltype(n)::value>;
                return launcher_at<T, Launch, Step, Step>(d);
            });
        }
    }
    if (small_blocks_for(step, p)) {
        return find_step(SmallBlocksSteps{}, small_blocks_step(step), LaunchFn<T>{nullptr},
                         [](auto n) -> LaunchFn<T> { return &Launch<T, 64, SmallBlocksN<decltype(n)::value>>::run; });
    }
    return find_step(KernelSteps{}, kernel_step(step), LaunchFn<T>{nullptr}, [d](auto n) {
        using Step = StepN<decltype(n)::value>;
        return launcher_at<T, Launch, Step, Step>(d);
    });
}

/// Fills the kernel's arguments for problem p on device views (features contiguous, other strides
/// multiples of 8 elements, 16-byte aligned starts: fa::InputError otherwise) with the features f
/// of the instance that runs it: tensor maps where f loads by the TMA, strides, sizes, the scale.
/// The persistent grid's work counter and the instrumented build's fields are left to the caller.
/// Through a reference (see fa/cuda/tensor_map.hpp on the maps' alignment).
template <class T>
void fill_args(Args<T>& a, const Problem& p, const Features& f, View4<const T> q, View4<const T> k, View4<const T> v, View4<T> o,
               View3<float> lse) {
    cuda::require_16_byte_rows("stage 11", "q", q);
    cuda::require_16_byte_rows("stage 11", "k", k);
    cuda::require_16_byte_rows("stage 11", "v", v);
    cuda::require_16_byte_rows("stage 11", "o", o);
    if (f.tma) {
        const cuda::DType dtype = std::is_same_v<T, __half> ? cuda::DType::FP16 : cuda::DType::BF16;
        cuda::make_tensor_map_bhnd(a.q_map, q.data, dtype, p.batch, p.heads, p.seq_q, p.head_dim, q.stride[0], q.stride[1],
                                   q.stride[2], f.br(), "stage 11 q");
        cuda::make_tensor_map_bhnd(a.k_map, k.data, dtype, p.batch, p.heads, p.seq_k, p.head_dim, k.stride[0], k.stride[1],
                                   k.stride[2], f.bc, "stage 11 k");
        cuda::make_tensor_map_bhnd(a.v_map, v.data, dtype, p.batch, p.heads, p.seq_k, p.head_dim, v.stride[0], v.stride[1],
                                   v.stride[2], f.bc, "stage 11 v");
        if (f.tma_store || f.staged_store) {  // one [64, 64] box per consumer warpgroup and 64 columns
            cuda::make_tensor_map_bhnd(a.o_map, o.data, dtype, p.batch, p.heads, p.seq_q, p.head_dim, o.stride[0], o.stride[1],
                                       o.stride[2], 64, "stage 11 o");
        }
    }
    set_forward_tensors(a, q, k, v, o, lse);
    a.heads = int(p.heads);
    a.batch_heads = int(p.batch * p.heads);
    a.q_tiles = int((p.seq_q + f.br() - 1) / f.br());
    a.group_heads = group_heads_of(p);
    a.seq_q = int(p.seq_q);
    a.seq_k = int(p.seq_k);
    a.causal = p.causal;
    const double scale = p.softmax_scale();
    a.negate_s = scale < 0;
    // A zero scale would turn the -inf of a masked score into NaN (-inf * 0); the smallest normal
    // float gives the same uniform weights, since |s| * FLT_MIN rounds to 0 for every finite score.
    a.scale = std::max(float(std::fabs(scale)), FLT_MIN);
    a.scale_log2 = std::max(float(std::fabs(scale) * 1.4426950408889634), FLT_MIN);  // log2(e)
}

}  // namespace

}  // namespace fa::stage11
