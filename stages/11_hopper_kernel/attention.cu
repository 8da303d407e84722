// Stage 11: its entry points (the instance launch.cuh chooses, launched on a stream), its road's names, the host's facts.
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
#include "launch.cuh"

namespace fa::stage11 {

namespace {

template <int... N>
std::vector<int> as_vector(Steps<N...>) {
    return {N...};
}

const std::vector<int> kTimelineSteps = as_vector(TimelineSteps{});

/// The current GPU's SM count.
int sm_count() {
    int device = 0, sms = 0;
    FA_CUDA_CHECK(cudaGetDevice(&device));
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return sms;
}

/// Thread blocks of a launch on this GPU (launch.cuh's grid_blocks()).
unsigned grid_blocks(const Features& f, int q_tiles, int batch_heads) { return grid_blocks(f, q_tiles, batch_heads, sm_count()); }

/// Launches one kernel instance on a stream (the Launch of launch.cuh's find_launcher()).
template <class T, int D, class Step>
struct StreamLaunch {
    static void run(const Args<T>& a, cudaStream_t stream) {
        using S = Shape<T, D, Step>;
        cuda::allow_dynamic_shared_memory<hopper_forward_kernel<T, D, Step>>(S::kSmemBytes, S::kF.blocks_per_sm > 1);
        const unsigned blocks = grid_blocks(S::kF, a.q_tiles, a.batch_heads);
        hopper_forward_kernel<T, D, Step><<<blocks, S::kThreads, S::kSmemBytes, stream>>>(a);
        FA_CUDA_CHECK_LAUNCH("stage11 hopper_forward_kernel<d=" + std::to_string(D) + ", " + step_label(Step{}) + ">");
    }
};

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
    const LaunchFn<T> launcher = find_launcher<T, StreamLaunch>(p, step, timeline != nullptr);
    if (launcher == nullptr) {
        throw InputError(timeline != nullptr ? "stage 11: step " + std::to_string(step) + " has no instrumented build in this "
                                                   "dtype (--timeline: bf16, steps " + timeline_steps_text() + ")"
                                             : std::string("stage 11: no kernel is built for this head dimension and step"));
    }
    const Features f = features_of(step, p, timeline != nullptr);
    Args<T> a{};
    fill_args(a, p, f, q, k, v, o, lse);
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
