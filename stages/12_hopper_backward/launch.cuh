/// \file stages/12_hopper_backward/launch.cuh
/// \brief Stage 12's road of features, its block counts and workspace, and the arguments and grids
/// of the three kernels of one call.
///
/// The entry points (attention.cu) launch them on a stream; the CPU test
/// (tests/test_stage12_emulated.cpp) runs the same kernels with the same arguments on the warp
/// emulator (tools/warp_emulator). Both take them from here, so the test checks what the stage runs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include <cuda.h>
#include <cuda_runtime.h>

#include "fa/cuda/half.hpp"
#include "fa/cuda/tensor_map.hpp"
#include "fa/error.hpp"
#include "fa/problem.hpp"
#include "fa/tensor.hpp"
#include "kernel.cuh"

namespace fa::stage12 {

//! [road]
// The road as named values, each the one before plus one idea (see Features). Step 0 is stage
// 09's default backward (mma.sync, cp.async), the point of departure; it runs its own kernels.
constexpr Features kStep1{};  ///< one warpgroup: K_j, V_j by the TMA; Q_i, dO_i, L, D on a ring of two; five wgmma; dQ by bulk reduction
/// a producer warpgroup and two consumers of 64 keys each (setmaxnreg), full and empty barriers per slot
constexpr Features kStep2 = kStep1.with_warp_roles();
/// the bulk reductions issued by a warp of the producer warpgroup (the dQ writer)
constexpr Features kStep3 = kStep2.with_dq_writer();
/// one dQ_i partial per block: consumer 1 adds its partial onto consumer 0's, one reduction per tile
constexpr Features kStep4 = kStep3.with_shared_dq();

/// Every step's features by number; [0] is stage 09 (its own kernels; kStep1 fills the place).
constexpr Features kSteps[] = {kStep1, kStep1, kStep2, kStep3, kStep4};
constexpr int kLastStep = 4;  ///< the last step of the road
/// The first step whose kernel keeps the deterministic order (its dQ writer waits for the turns).
constexpr int kFirstDeterministicStep = 3;

/// Step N as a type the kernel template takes; `Deterministic`: dQ's additions in a fixed order
/// (write_dq()), from kFirstDeterministicStep on.
template <int N, bool Deterministic = false>
struct StepN {
    static constexpr Features value = kSteps[N];             ///< step N's features
    static constexpr bool deterministic = Deterministic;     ///< the fixed order of dQ's additions
    static_assert(!Deterministic || N >= kFirstDeterministicStep, "the deterministic order needs the dQ writer");
};

/// The step attention_backward_device() runs by default. Steps 2 to 4 have not run on a GPU yet,
/// so step 1 stays the default until a measurement says otherwise (RECORD.md).
constexpr int kDefaultStep = 1;
//! [road]

/// Tiles, blocks and padded lengths of one problem (every step of the Hopper kernel shares them
/// but the keys of a block: 64 at step 1, 128 at step 2).
struct Counts {
    int64_t batch_heads;   ///< B H
    int64_t q_tiles;       ///< query tiles of 64 rows per head
    int64_t k_blocks;      ///< key blocks of `block_keys` keys per head
    int64_t seq_q_padded;  ///< Nq rounded up to whole query tiles
};

/// counts() of `p` for blocks of `block_keys` keys.
inline Counts counts(const Problem& p, int block_keys = 64) {
    constexpr int kBr = 64;
    Counts c{};
    c.batch_heads = p.batch * p.heads;
    c.q_tiles = (p.seq_q + kBr - 1) / kBr;
    c.k_blocks = (p.seq_k + block_keys - 1) / block_keys;
    c.seq_q_padded = c.q_tiles * kBr;
    return c;
}

/// Floats of the workspace: per head two rows of Nq_padded statistics (L log2e, D), then the
/// float32 dQ accumulator [B H, Nq_padded, d], then the deterministic mode's turn counters
/// [B H, q_tiles] (32-bit integers in float-sized places).
inline int64_t workspace_floats(const Problem& p) {
    const Counts c = counts(p);
    return 2 * c.batch_heads * c.seq_q_padded + c.batch_heads * c.seq_q_padded * p.head_dim + c.batch_heads * c.q_tiles;
}

/// Throws fa::InputError unless the Hopper kernels run `p`: d = 64 or 128 (whole 64-column TMA
/// boxes, the two N of dV's and dQ's wgmma built), sizes within their 32-bit indices and grid.
inline void check_hopper_kernel_supports(const Problem& p) {
    if (p.head_dim != 64 && p.head_dim != 128) {
        throw InputError("--head-dim " + std::to_string(p.head_dim) + " is not supported by stage 12: use 64 or 128");
    }
    const Counts c = counts(p);
    const auto refuse = [](const std::string& what, int64_t value, const std::string& limit) {
        throw InputError("stage 12: " + what + " = " + std::to_string(value) + " is beyond its kernels' indices: " + limit);
    };
    if (p.seq_q > (int64_t(1) << 30)) refuse("--seq-q", p.seq_q, "at most 2^30 query rows");
    if (p.seq_k > (int64_t(1) << 30)) refuse("--seq-k", p.seq_k, "at most 2^30 key rows");
    if (c.batch_heads > (int64_t(1) << 24)) refuse("batch x heads", c.batch_heads, "at most 2^24");
    if (c.batch_heads * c.k_blocks >= (int64_t(1) << 31)) {
        refuse("batch x heads x key blocks of 64", c.batch_heads * c.k_blocks, "fewer than 2^31 (the grid)");
    }
    if (2 * c.batch_heads * c.seq_q_padded >= (int64_t(1) << 32)) {  // the rows of L log2e and D, one 2D tensor map
        refuse("2 x batch x heads x query rows padded to 64", 2 * c.batch_heads * c.seq_q_padded,
               "fewer than 2^32 (the statistics' tensor map)");
    }
}

/// The arguments and grids of the three kernels of one call.
template <class T>
struct Launches {
    PreprocessArgs<T> pre;    ///< the preprocessing kernel's
    Args<T> main;             ///< the main kernel's
    PostprocessArgs<T> post;  ///< the postprocessing kernel's
    int64_t pre_blocks;   ///< preprocessing blocks of kPrePostThreads
    int64_t main_blocks;  ///< one per key block (64 keys at step 1, 128 at step 2) of every head
    int64_t post_blocks;  ///< postprocessing blocks of kPrePostThreads (grid-stride)
};

//! [launches]
/// Fills Launches for `p` on 16-bit views (either layout, features contiguous, other strides
/// multiples of 8 elements) and `workspace` (workspace_floats() floats). The tensor maps come from
/// the views' strides, so the TMA reads either layout as it is. `Step` (StepN<N>) sets the keys
/// of a block, so the grid and Args::k_blocks.
template <class T, int D, class Step>
Launches<T> make_launches(const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<const T> o,
                          View3<const float> lse, View4<const T> dout, View4<T> dq, View4<T> dk, View4<T> dv, float* workspace) {
    check_hopper_kernel_supports(p);
    const char* names[] = {"q", "k", "v", "o", "dout"};
    const View4<const T>* ins[] = {&q, &k, &v, &o, &dout};
    for (int i = 0; i < 5; ++i) cuda::require_16_byte_rows("stage 12", names[i], *ins[i]);
    cuda::require_16_byte_rows("stage 12", "dq", dq);
    cuda::require_16_byte_rows("stage 12", "dk", dk);
    cuda::require_16_byte_rows("stage 12", "dv", dv);
    const Counts c = counts(p, Shape<D, Step>::kBlockKeys);
    float* stats = workspace;
    float* dq_accum = workspace + 2 * c.batch_heads * c.seq_q_padded;
    int* turns = DeterministicStep<Step>::value ? reinterpret_cast<int*>(dq_accum + c.batch_heads * c.seq_q_padded * p.head_dim)
                                                : nullptr;
    static_assert(sizeof(int) == sizeof(float), "the turn counters sit in float-sized places of the workspace");
    Launches<T> l{};

    l.pre.o = o.data, l.pre.dout = dout.data, l.pre.lse = lse.data;
    for (int i = 0; i < 3; ++i) l.pre.o_s[i] = o.stride[i], l.pre.do_s[i] = dout.stride[i], l.pre.lse_s[i] = lse.stride[i];
    l.pre.stats = stats, l.pre.dq_accum = dq_accum, l.pre.turns = turns;
    l.pre.rows = c.batch_heads * c.seq_q_padded;
    l.pre.heads = int(p.heads), l.pre.seq_q = int(p.seq_q), l.pre.seq_q_padded = int(c.seq_q_padded);
    l.pre_blocks = (l.pre.rows + kPrePostThreads / (D / 8) - 1) / (kPrePostThreads / (D / 8));

    Args<T>& a = l.main;
    const cuda::DType dtype = std::is_same_v<T, __half> ? cuda::DType::FP16 : cuda::DType::BF16;
    const auto map = [&](CUtensorMap& m, const View4<const T>& x, int64_t rows, const char* name) {
        cuda::make_tensor_map_bhnd(m, x.data, dtype, p.batch, p.heads, rows, p.head_dim, x.stride[0], x.stride[1], x.stride[2], 64,
                                   std::string("stage 12 ") + name);
    };
    map(a.q_map, q, p.seq_q, "q");
    map(a.k_map, k, p.seq_k, "k");
    map(a.v_map, v, p.seq_k, "v");
    map(a.do_map, dout, p.seq_q, "dout");
    cuda::make_tensor_map_f32_2d(a.stats_map, stats, 2 * c.batch_heads, c.seq_q_padded, c.seq_q_padded, 2, 64, "stage 12 L and D");
    a.dk = dk.data, a.dv = dv.data;
    for (int i = 0; i < 3; ++i) a.dk_s[i] = dk.stride[i], a.dv_s[i] = dv.stride[i];
    a.dq_accum = dq_accum;
    a.turns = turns;
    a.heads = int(p.heads), a.k_blocks = int(c.k_blocks), a.q_tiles = int(c.q_tiles);
    a.seq_q = int(p.seq_q), a.seq_k = int(p.seq_k), a.seq_q_padded = int(c.seq_q_padded);
    a.causal = p.causal;
    const double scale = p.softmax_scale();
    a.scale = float(scale);
    a.scale_log2 = float(scale * 1.4426950408889634);  // log2(e); a negative scale keeps its sign, exactly
    l.main_blocks = c.batch_heads * c.k_blocks;

    l.post.dq_accum = dq_accum, l.post.dq = dq.data;
    for (int i = 0; i < 3; ++i) l.post.dq_s[i] = dq.stride[i];
    l.post.rows = c.batch_heads * p.seq_q;
    l.post.heads = int(p.heads), l.post.seq_q = int(p.seq_q), l.post.seq_q_padded = int(c.seq_q_padded);
    l.post.scale = float(scale);
    const int64_t units = l.post.rows * (D / 8);
    l.post_blocks = std::min<int64_t>((units + kPrePostThreads - 1) / kPrePostThreads, 65535);
    return l;
}
//! [launches]

/// Runs the three kernels of `l` in order through `launch(kernel, name, blocks, threads, smem,
/// args)`, where `kernel` is a std::integral_constant of the kernel's address (a device launch on
/// the GPU, the warp emulator on the CPU). `Step` is a type whose `value` is the step's Features
/// (StepN<N>).
template <class T, int D, class Step, class Launch>
void run_kernels(const Launches<T>& l, Launch&& launch) {
    using Sh = Shape<D, Step>;
    launch(std::integral_constant<decltype(&backward_preprocess_kernel<T, D>), &backward_preprocess_kernel<T, D>>{},
           "backward_preprocess_kernel", l.pre_blocks, kPrePostThreads, size_t(0), l.pre);
    launch(std::integral_constant<decltype(&hopper_backward_kernel<T, D, Step>), &hopper_backward_kernel<T, D, Step>>{},
           "hopper_backward_kernel", l.main_blocks, Sh::kThreads, size_t(Sh::kSmemBytes), l.main);
    launch(std::integral_constant<decltype(&backward_postprocess_kernel<T, D>), &backward_postprocess_kernel<T, D>>{},
           "backward_postprocess_kernel", l.post_blocks, kPrePostThreads, size_t(0), l.post);
}

}  // namespace fa::stage12
