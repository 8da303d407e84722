// Stage 11: the Hopper kernel's instances, its entry points and the road of its features.
#include "attention.cuh"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "../07_pipelined_fused_kernel/attention.cuh"
#include "fa/cuda/check.hpp"
#include "fa/cuda/hopper.hpp"
#include "fa/cuda/tensor_map.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/error.hpp"
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

template <int... N>
std::vector<int> as_vector(Steps<N...>) {
    return {N...};
}

const std::vector<int> kTimelineSteps = as_vector(TimelineSteps{});

//! [group_budget]
/// Step 6's groups of heads: as many heads as have their K and V within this many bytes, so
/// that a group's K and V stay in the H100's 50 MB L2 while its blocks run.
constexpr long long kGroupBudgetBytes = 16LL << 20;
//! [group_budget]

/// kGroupBudgetBytes, or FA_STAGE11_GROUP_MIB MiB when that is set (bench/session.py run groups11
/// times several budgets with it).
long long group_budget_bytes() {
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
int group_heads_of(const Problem& p) {
    const long long kv_bytes_per_head = 2 * p.seq_k * p.head_dim * 2;  // K and V, 16-bit elements
    return heads_per_group(kv_bytes_per_head, group_budget_bytes(), int(p.batch * p.heads));
}

template <class T>
using LaunchFn = void (*)(const Args<T>&, cudaStream_t);

/// The current GPU's SM count.
int sm_count() {
    int device = 0, sms = 0;
    FA_CUDA_CHECK(cudaGetDevice(&device));
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return sms;
}

/// Thread blocks of a launch: one per work item (query tile, head), or with the persistent grid
/// one per SM (at most one per item), each looping over its items.
unsigned grid_blocks(const Features& f, int q_tiles, int batch_heads) {
    const unsigned items = unsigned(q_tiles) * unsigned(batch_heads);
    return f.persistent ? std::min(items, unsigned(sm_count() * f.blocks_per_sm)) : items;
}

template <class T, int D, class Step>
void launch_step(const Args<T>& a, cudaStream_t stream, const std::string& what) {
    using S = Shape<T, D, Step>;
    cuda::allow_dynamic_shared_memory<hopper_forward_kernel<T, D, Step>>(S::kSmemBytes, S::kF.blocks_per_sm > 1);
    const unsigned blocks = grid_blocks(S::kF, a.q_tiles, a.batch_heads);
    hopper_forward_kernel<T, D, Step><<<blocks, S::kThreads, S::kSmemBytes, stream>>>(a);
    FA_CUDA_CHECK_LAUNCH("stage11 hopper_forward_kernel<d=" + std::to_string(D) + ", " + what + ">");
}

template <class T, int D, int N>
void launch(const Args<T>& a, cudaStream_t stream) {
    launch_step<T, D, StepN<N>>(a, stream, "step " + std::to_string(N));
}

/// Step N's small blocks (d = 64; N of SmallBlocksSteps).
template <class T, int N>
void launch_step_small(const Args<T>& a, cudaStream_t stream) {
    launch_step<T, 64, SmallBlocksN<N>>(a, stream, "step " + std::to_string(N) + ", small blocks");
}

/// The step whose small blocks step `step` runs (11 or later): steps 12-16 run step 12's, step 17
/// its own, which carry step 14's batched epilogue and step 17's lazy rescale
/// (stage11_lazy_rescale.txt, part 8). The launch and the host's facts both ask here.
constexpr int small_blocks_step(int step) { return step >= 17 ? 17 : step >= 12 ? 12 : 11; }

/// The steps whose small blocks are built (the values small_blocks_step() takes).
using SmallBlocksSteps = Steps<11, 12, 17>;

template <class T>
LaunchFn<T> small_launcher(int step) {
    return find_step(SmallBlocksSteps{}, small_blocks_step(step), LaunchFn<T>{nullptr},
                [](auto n) -> LaunchFn<T> { return launch_step_small<T, decltype(n)::value>; });
}

template <class T, int D, int N>
void launch_timeline(const Args<T>& a, cudaStream_t stream) {
    launch_step<T, D, TimelineStepN<N>>(a, stream, "step " + std::to_string(N) + ", instrumented");
}

/// Step 11: the most keys a causal head at d = 64 may have for the small blocks
/// (Features::small_blocks()). Measured on an H100 (bf16 and fp16): x1.18 over step 10 at
/// Nk = 1024, x0.98 at Nk = 2048 (docs/results/stage11_small_blocks.txt).
constexpr int kSmallBlocksMaxKeys = 1024;

/// Whether step `step` runs its small blocks on problem p (step 11: d = 64, causal, Nk <= kSmallBlocksMaxKeys).
bool small_blocks_for(int step, const Problem& p) {
    return step >= 1 && step <= kLastStep && kSteps[step].small_blocks_short_causal && p.head_dim == 64 && p.causal &&
           p.seq_k <= kSmallBlocksMaxKeys;
}

/// The features step `step` runs problem p with (for the host: block rows, tile size, whether
/// tensor maps are needed, blocks per SM). The instrumented build is the step's own kernel on
/// every problem: it has no small blocks.
Features features_of(int step, const Problem& p, bool instrumented = false) {
    const Features f = kSteps[step >= 1 && step <= kLastStep ? step : 1];
    return (small_blocks_for(step, p) && !instrumented ? f.small_blocks() : f).at_head_dim(int(p.head_dim));
}

/// What the host says of a kernel instance: its shared memory, and whether O goes through a buffer
/// of its own (Shape::kStaged).
struct InstanceFacts {
    size_t smem;
    bool staged_o;
};

template <int D, class Step>
InstanceFacts facts_of_shape() {
    return {Shape<__nv_bfloat16, D, Step>::kSmemBytes, Shape<__nv_bfloat16, D, Step>::kStaged};
}

/// The facts of the instance step `step` (1 to kLastStep) runs problem p with.
InstanceFacts facts_of_step(int step, const Problem& p) {
    if (small_blocks_for(step, p)) {
        return find_step(SmallBlocksSteps{}, small_blocks_step(step), InstanceFacts{},
                    [](auto n) { return facts_of_shape<64, SmallBlocksN<decltype(n)::value>>(); });
    }
    const bool d64 = p.head_dim == 64;
    return find_step(KernelSteps{}, kernel_step(step), InstanceFacts{}, [d64](auto n) {
        constexpr int N = decltype(n)::value;
        return d64 ? facts_of_shape<64, StepN<N>>() : facts_of_shape<128, StepN<N>>();
    });
}

template <class T, int N>
LaunchFn<T> launcher_for(int d) {
    return d == 64 ? launch<T, 64, N> : d == 128 ? launch<T, 128, N> : nullptr;
}

/// The instrumented build of step `step` at head dimension d (null where none is built).
template <class T>
LaunchFn<T> find_timeline_launcher(int d, int step) {
    if constexpr (!std::is_same_v<T, __nv_bfloat16>) {
        return nullptr;
    } else {
        return find_step(TimelineSteps{}, step, LaunchFn<T>{nullptr}, [d](auto n) -> LaunchFn<T> {
            constexpr int N = decltype(n)::value;
            return d == 64 ? launch_timeline<T, 64, N> : d == 128 ? launch_timeline<T, 128, N> : nullptr;
        });
    }
}

/// Step `step`'s kernel at head dimension d (null where none is built).
template <class T>
LaunchFn<T> find_launcher(int d, int step) {
    return find_step(KernelSteps{}, kernel_step(step), LaunchFn<T>{nullptr}, [d](auto n) { return launcher_for<T, decltype(n)::value>(d); });
}

int resolve(int step) { return step < 0 ? kDefaultStep : step; }

/// Runs step `step` on device views; with `timeline` set, its instrumented build, block
/// `timeline_block` writing its marks there.
template <class T>
void run_device(const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<T> o, View3<float> lse,
                cudaStream_t stream, int step, cuda::TimelineMark* timeline = nullptr, int timeline_block = -1) {
    step = resolve(step);
    check_supported(p, step);
    if (step == 0 && timeline == nullptr) {  // the point of departure: stage 07's final kernel, on the same views
        stage07::attention_device(p, q, k, v, o, lse, stream);
        return;
    }
    const LaunchFn<T> launcher = timeline != nullptr          ? find_timeline_launcher<T>(int(p.head_dim), step)
                                 : small_blocks_for(step, p) ? small_launcher<T>(step)
                                                             : find_launcher<T>(int(p.head_dim), step);
    if (launcher == nullptr) {
        throw InputError(timeline != nullptr ? "stage 11: step " + std::to_string(step) + " has no instrumented build in this "
                                                   "dtype (--timeline: bf16, steps " + timeline_steps_text() + ")"
                                             : std::string("stage 11: no kernel is built for this head dimension and step"));
    }
    cuda::require_16_byte_rows("stage 11", "q", q);
    cuda::require_16_byte_rows("stage 11", "k", k);
    cuda::require_16_byte_rows("stage 11", "v", v);
    cuda::require_16_byte_rows("stage 11", "o", o);
    const Features f = features_of(step, p, timeline != nullptr);
    Args<T> a{};
    if (f.tma) {
        const DType dtype = std::is_same_v<T, __half> ? DType::FP16 : DType::BF16;
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
    a.q = q.data, a.k = k.data, a.v = v.data, a.o = o.data, a.lse = lse.data;
    a.q_sb = q.stride[0], a.q_sh = q.stride[1], a.q_sn = q.stride[2];
    a.k_sb = k.stride[0], a.k_sh = k.stride[1], a.k_sn = k.stride[2];
    a.v_sb = v.stride[0], a.v_sh = v.stride[1], a.v_sn = v.stride[2];
    a.o_sb = o.stride[0], a.o_sh = o.stride[1], a.o_sn = o.stride[2];
    a.lse_sb = lse.stride[0], a.lse_sh = lse.stride[1], a.lse_sn = lse.stride[2];
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
    a.timeline = timeline;
    a.timeline_block = timeline_block;
    if (!f.persistent) {
        launcher(a, stream);
        return;
    }
    // The persistent grid's work counter: allocated, zeroed and freed in the stream's order, so
    // that launches on other streams never share one.
    FA_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&a.work_counter), sizeof(unsigned), stream));
    try {
        FA_CUDA_CHECK(cudaMemsetAsync(a.work_counter, 0, sizeof(unsigned), stream));
        launcher(a, stream);
    } catch (...) {
        cudaFreeAsync(a.work_counter, stream);
        throw;
    }
    FA_CUDA_CHECK(cudaFreeAsync(a.work_counter, stream));
}

template <class T>
AttentionFn host_entry_for(int step) {
    return [step](const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<float> o,
                  View3<float> lse) {
        check_supported(p, resolve(step));
        // The 16-bit copies keep the layout of the float32 views, so the kernel (and the TMA)
        // reads either layout through its strides.
        const Layout layout = q.stride[1] >= q.stride[2] ? Layout::BHND : Layout::BNHD;
        cuda::DeviceTensors dev(p, q, k, v, o, lse);
        cuda::HalfTensors<T> half(p, layout);
        half.load(dev.q, dev.k, dev.v);
        run_device<T>(p, half.q, half.k, half.v, half.o, dev.lse, nullptr, step);
        cuda::convert(View4<const T>(half.o), dev.o);
        FA_CUDA_CHECK(cudaDeviceSynchronize());
        dev.copy_outputs_to(o, lse);
    };
}

}  // namespace

const std::vector<Step>& road() {
    static const std::vector<Step> steps = {
        {"stage 07", "the point of departure: stage 07's final kernel (mma.sync, cp.async, ldmatrix), on the same GPU"},
        {"wgmma", "one consumer warpgroup of 64 query rows: S = Q K^T by wgmma from shared memory, O += P V by wgmma "
                  "with P from registers; tiles copied by cp.async into the 128-byte swizzle, two deep"},
        {"TMA ring", "K and V tiles loaded by the TMA (one thread) into a ring of two buffers, each on its mbarrier"},
        {"producer warpgroup", "warp specialization: a producer warpgroup issues the TMA copies (24 registers), two "
                               "consumer warpgroups compute (240 registers, setmaxnreg); full and empty barriers"},
        {"ping-pong", "the two consumer warpgroups take turns on the tensor cores (named barriers): one's softmax runs "
                      "under the other's GEMMs; each turn issues S_j and P_{j-1} V_{j-1}; a three-slot ring"},
        {"softmax overlap", "inside a warpgroup: S_j and P_{j-1} V_{j-1} in two wgmma-groups, the softmax of S_j "
                            "starts when the first is done and runs under the second"},
        {"heaviest first", "causal: the heads in groups whose K and V fit in 16 MiB of L2; in a group, blocks "
                           "ordered rank by rank across its heads, so its heaviest query tiles run first and the "
                           "light ones last"},
        {"TMA store", "the epilogue: O rounded into shared memory (where Q was) and written by TMA stores, [64, 64] "
                      "boxes; LSE stored directly"},
        {"d64 shape", "at d = 64, three consumer warpgroups (Br = 192, 160 registers each) take turns; d = 128 as "
                      "step 7"},
        {"persistent", "a persistent grid: one block per SM loops over the work items in the order above; the next "
                       "item's Q and K/V tiles load while this item's last tiles and epilogue run (a Q-empty barrier); "
                       "O by plain stores, since Q's buffer is already refilling"},
        {"wide stores", "step 9's epilogue with 16-byte stores: each quad transposes its rounded words (four "
                        "shuffles), so a lane holds eight adjacent columns of O and a warp's store writes 8 rows x "
                        "64 bytes, whole sectors, with a quarter of the store instructions"},
        {"small blocks", "at d = 64 under a causal mask with Nk <= 1024: blocks of one producer and one consumer "
                         "warpgroup (Br = 64, Bc = 64, a four-slot ring, 136 registers), three per SM, interleaved by "
                         "the warp schedulers; every other problem as step 10"},
        {"early claim", "the persistent producer claims its next work item (a global atomicAdd) when it reaches the "
                        "current item's last K/V tile, and posts it decoded (head, first row, key tiles): the "
                        "consumers find it ready when they have written O"},
        {"staged store", "d = 64: O rounded into its own shared buffer and stored by the TMA, the store left running "
                         "until the warpgroup's next epilogue; d = 128 as step 12"},
        {"batched epilogue", "d = 128: the wide-store epilogue computes both rows of a thread (sums, normalization, "
                             "quad transposes) before any store, and its LSE last; d = 64 as step 13"},
        {"split ring", "d = 128: K and V on rings of two slots each, K's slot freed once S = Q K^T has read it, V's "
                       "after P V; the 64 KB freed hold O's buffer, stored by the TMA as step 13 does at d = 64; "
                       "d = 64 as step 14"},
        {"idle past Nq", "a consumer warpgroup whose 64 rows all lie past Nq (a head's last query tile, Nq not a multiple "
                         "of Br) issues no GEMM and computes no softmax: it takes its turns empty and arrives on the "
                         "ring's barriers, and the warpgroups with rows have the tensor cores to themselves"},
        {"lazy rescale", "a row keeps its maximum until a tile's exceeds it by more than 2^8 (P up to 256), and a "
                         "warp rescales O only when one of its rows took a new maximum (a vote); d = 128 and the small "
                         "blocks (d = 64's three consumers, 160 registers each, as step 16)"},
    };
    return steps;
}

int final_step() { return kDefaultStep; }

const std::vector<int>& supported_head_dims() {
    static const std::vector<int> dims{64, 128};
    return dims;
}

std::string gpu_unavailable_reason() {
    const std::string reason = cuda::hopper_unavailable_reason();
    return reason.empty() ? "" : "a Hopper GPU (sm_90a): " + reason;
}

void check_supported(const Problem& p, int step) {
    step = resolve(step);
    const int steps = int(road().size());
    if (step >= steps) {
        throw InputError("--step " + std::to_string(step) + " does not exist: stage 11 has steps 0 to " + std::to_string(steps - 1));
    }
    if (p.head_dim != 64 && p.head_dim != 128) {
        throw InputError("--head-dim " + std::to_string(p.head_dim) + " is not supported by stage 11: use 64, 128");
    }
    if (p.seq_q > (int64_t(1) << 30) || p.seq_k > (int64_t(1) << 30) || p.batch * p.heads > (int64_t(1) << 24)) {
        throw InputError("stage 11 takes at most 2^30 query or key rows and 2^24 batch x heads (32-bit tile indices)");
    }
    if ((p.seq_q + 63) / 64 * p.batch * p.heads >= (int64_t(1) << 31)) {
        throw InputError("stage 11: the problem needs more than 2^31 thread blocks");
    }
}

void attention_device(const Problem& p, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k,
                      View4<const __nv_bfloat16> v, View4<__nv_bfloat16> o, View3<float> lse, cudaStream_t stream, int step) {
    run_device<__nv_bfloat16>(p, q, k, v, o, lse, stream, step);
}

void attention_device(const Problem& p, View4<const __half> q, View4<const __half> k, View4<const __half> v,
                      View4<__half> o, View3<float> lse, cudaStream_t stream, int step) {
    run_device<__half>(p, q, k, v, o, lse, stream, step);
}

AttentionFn host_entry(DType dtype, int step) {
    return dtype == DType::BF16 ? host_entry_for<__nv_bfloat16>(step) : host_entry_for<__half>(step);
}

void attention(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<float> o,
               View3<float> lse) {
    host_entry(DType::BF16)(p, q, k, v, o, lse);
}

bool runs_small_blocks(const Problem& p, int step) { return small_blocks_for(resolve(step), p); }

const std::vector<int>& timeline_steps() { return kTimelineSteps; }

std::string timeline_steps_text() {
    std::string text;
    for (const int s : kTimelineSteps) text += (text.empty() ? "" : ", ") + std::to_string(s);
    return text;
}

TimelineBlock timeline_block(const Problem& p, int step, int block) {
    step = resolve(step);
    check_supported(p, step);
    if (std::find(kTimelineSteps.begin(), kTimelineSteps.end(), step) == kTimelineSteps.end()) {
        throw InputError("--timeline: step " + std::to_string(step) + " has no instrumented build; use --step " +
                         timeline_steps_text() + " (or leave --step out: the default step " + std::to_string(kDefaultStep) + ")");
    }
    const Features f = features_of(step, p, true);
    TimelineBlock t;
    t.q_tiles = int((p.seq_q + f.br() - 1) / f.br());
    t.blocks = int(grid_blocks(f, t.q_tiles, int(p.batch * p.heads)));
    if (block < 0) {  // the first block of the second wave: it starts on an SM the first wave has warmed
        block = f.persistent ? 0 : std::min(sm_count(), t.blocks - 1);
    }
    if (block >= t.blocks) {
        throw InputError("--timeline-block " + std::to_string(block) + " does not exist: this problem has blocks 0 to " +
                         std::to_string(t.blocks - 1));
    }
    t.block = block;
    const int group = f.heaviest_first_grid && p.causal ? group_heads_of(p) : 1;
    // The block's work item. The persistent grid's blocks take theirs at run time: its fields
    // stay -1.
    if (f.persistent) {
        t.q_tile = t.batch = t.head = t.full = t.end = -1;
    } else {
        const BlockWork w = block_work(unsigned(block), t.q_tiles, int(p.batch * p.heads), p.causal, group);
        t.q_tile = w.q_tile;
        t.batch = w.bh / int(p.heads);
        t.head = w.bh % int(p.heads);
        key_tiles(w.q_tile * f.br(), f.br(), f.bc, int(p.seq_q), int(p.seq_k), p.causal, t.full, t.end);
    }
    t.br = f.br();
    t.bc = f.bc;
    t.consumers = f.consumers;
    t.overlap = f.overlap;
    t.ping_pong = f.ping_pong;
    t.persistent = f.persistent;
    t.stages = f.stages;
    return t;
}

void attention_device_timeline(const Problem& p, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k,
                               View4<const __nv_bfloat16> v, View4<__nv_bfloat16> o, View3<float> lse, cudaStream_t stream,
                               int step, cuda::TimelineMark* marks, int block) {
    const TimelineBlock t = timeline_block(p, step, block);  // checks the step and the block
    run_device<__nv_bfloat16>(p, q, k, v, o, lse, stream, step, marks, t.block);
}

namespace {

/// The persistent grid's last wave, in key tiles: the busiest block's and the average block's
/// (busiest_block(), the items in the counter's order, item (t, head) costing `key_tiles_of[t]`),
/// and the share of the run the average block is busy. Empty for problems of more than 2^22 items
/// (not worth the host's time).
std::string last_wave(const Problem& p, const Features& f, const std::vector<int>& key_tiles_of) {
    const int q_tiles = int(key_tiles_of.size()), batch_heads = int(p.batch * p.heads);
    const long long items = (long long)q_tiles * batch_heads;
    if (items > (1LL << 22)) return "";
    const int group = f.heaviest_first_grid && p.causal ? group_heads_of(p) : 1;
    std::vector<double> costs(static_cast<size_t>(items));
    double total = 0.0;
    for (long long w = 0; w < items; ++w) {
        costs[size_t(w)] = key_tiles_of[size_t(block_work(unsigned(w), q_tiles, batch_heads, p.causal, group).q_tile)];
        total += costs[size_t(w)];
    }
    const int blocks = int(grid_blocks(f, q_tiles, batch_heads));
    const double busiest = busiest_block(costs, blocks), average = total / blocks;
    char buf[160];
    std::snprintf(buf, sizeof buf, "; in key tiles the busiest block %.0f, the average %.1f (%.3f)", busiest, average,
                  busiest > 0 ? average / busiest : 1.0);
    return buf;
}

}  // namespace

std::string describe_config(const Problem& p, int step) {
    step = resolve(step);
    check_supported(p, step);
    if (step == 0) return "step 0 (stage 07's final kernel): " + stage07::describe_config(p);
    const Features f = features_of(step, p);
    const InstanceFacts facts = facts_of_step(step, p);
    const int q_tiles = int((p.seq_q + f.br() - 1) / f.br()), k_tiles = int((p.seq_k + f.bc - 1) / f.bc);
    long long unmasked = 0, masked = 0;
    std::vector<int> key_tiles_of(static_cast<size_t>(q_tiles));  // query tile t's key tiles (its work, for last_wave())
    for (int t = 0; t < q_tiles; ++t) {
        int full = 0, end = 0;
        key_tiles(t * f.br(), f.br(), f.bc, int(p.seq_q), int(p.seq_k), p.causal, full, end);
        unmasked += full;
        masked += end - full;
        key_tiles_of[size_t(t)] = end;
    }
    const long long total = (long long)q_tiles * k_tiles;
    const std::string group = f.heaviest_first_grid && p.causal ? std::to_string(group_heads_of(p)) + " heads" : "";
    const std::string persistent =
        f.persistent ? ", persistent grid of " + std::to_string(grid_blocks(f, q_tiles, int(p.batch * p.heads))) + " blocks (" +
                           std::to_string(f.blocks_per_sm) + " per SM) for " +
                           std::to_string((long long)q_tiles * p.batch * p.heads) + " work items" + last_wave(p, f, key_tiles_of)
                     : "";
    char buf[1024];
    std::snprintf(buf, sizeof buf,
                  "step %d (%s): Br=%d Bc=%d, %d consumer warpgroup(s)%s, %d-slot ring%s loaded by %s%s%s%s%s%s%s, %zu B shared "
                  "memory; per head %lld of %lld key tiles unmasked, %lld masked, %lld skipped",
                  step, road()[size_t(step)].name.c_str(), f.br(), f.bc, f.consumers,
                  f.producer ? " + 1 producer warpgroup" : "", f.stages, f.split_ring ? "s of K and of V" : "",
                  f.tma ? "the TMA" : "cp.async",
                  f.ping_pong && f.consumers > 1 ? ", ping-pong" : "", f.overlap ? ", softmax under P V" : "",
                  f.heaviest_first_grid && p.causal ? ", heaviest tiles first across groups of " : "", group.c_str(),
                  f.tma_store || facts.staged_o ? ", O by TMA store" : f.wide_stores ? ", O by 16-byte stores" : "",
                  persistent.c_str(), facts.smem,
                  unmasked, total, masked, total - unmasked - masked);
    return buf;
}

}  // namespace fa::stage11
