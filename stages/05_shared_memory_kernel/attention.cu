// Stage 05: the shared-memory attention kernel and its host side.
#include "attention.cuh"

#include <cstdio>
#include <limits>
#include <string>

#include "fa/cuda/check.hpp"
#include "fa/cuda/stage.hpp"
#include "fa/error.hpp"
#include "road.cuh"
#include "tile.cuh"

namespace fa::stage05 {

namespace {

//! [kernel]
/// One block computes O and LSE for Br query rows of one (batch, head). Blocks are numbered
/// query tile fastest, so the blocks that run side by side share the same K and V in L2.
/// `Cfg` is TileConfig<d> with the road's switches (steps 3 to 6; stages 05 and 06 run step 6).
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm) attention_kernel(const KernelArgs a) {
    extern __shared__ float4 smem_vec[];  // float4 so the carve-up below is 16-byte aligned
    float* Q_s = reinterpret_cast<float*>(smem_vec);  // [Br, d+4]  this block's Q tile, scaled; stays
    float* K_s = Q_s + Cfg::kQFloats;                 // [Bc, d+4]  K_j; later P_ij as [Bc, Br+4]
    float* V_s = K_s + Cfg::kKPFloats;                // [Bc, d]    V_j

    const int q_tiles = (a.seq_q + Cfg::kBr - 1) / Cfg::kBr;
    const int q0 = int(blockIdx.x % unsigned(q_tiles)) * Cfg::kBr;
    const int bh = int(blockIdx.x / unsigned(q_tiles));
    const int b = bh / a.heads, h = bh % a.heads;
    const float* q_head = a.q + b * a.q_sb + h * a.q_sh;  // [Nq, d] global
    const float* k_head = a.k + b * a.k_sb + h * a.k_sh;  // [Nk, d] global
    const float* v_head = a.v + b * a.v_sb + h * a.v_sh;  // [Nk, d] global
    const Lane me = this_lane();

    // Q_i is read from device memory once, already multiplied by scale * log2(e) (by scale before step 6).
    load_tile_gmem_to_smem<Cfg, Cfg::kBr, Cfg::kLdQK>(Q_s, q_head, a.q_sn, q0, a.seq_q, Cfg::kExp2 ? a.scale_log2 : a.scale);

    RowState<Cfg> st;
    init_row_state(st);
    int key_end[Cfg::kRowsPerThread];  // keys [0, key_end) are visible to the thread's i-th row
#pragma unroll
    for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
        const int row = q0 + me.row(i);
        key_end[i] = row < a.seq_q ? int(visible_key_end(row, a.seq_q, a.seq_k, a.causal)) : 0;
    }

    // Every K/V tile, masked: the tail of the last tile, and for causal problems the future keys.
    for (int kv0 = 0; kv0 < a.seq_k; kv0 += Cfg::kBc) {
        process_kv_tile<Cfg, true>(a, k_head, v_head, kv0, Q_s, K_s, V_s, st, key_end, me);
    }
    store_output(a, st, b, h, q0, me);
}
//! [kernel]

/// Launches `kKernel` with one block per (batch, head, `rows` query rows).
template <auto kKernel>
void launch_kernel(const KernelArgs& a, int rows, int threads, size_t smem_bytes, cudaStream_t stream, const std::string& name) {
    cuda::allow_dynamic_shared_memory<kKernel>(smem_bytes);
    const int64_t q_tiles = ceil_div(a.seq_q, rows);
    const auto blocks = unsigned(q_tiles * a.batch * a.heads);
    kKernel<<<blocks, threads, smem_bytes, stream>>>(a);
    FA_CUDA_CHECK_LAUNCH("stage05 " + name);
}

/// The register-tiled kernel with the switches of steps 3 to 6.
template <int D, bool Vec4, bool Pad, bool Exp2>
void launch_tiled(const KernelArgs& a, cudaStream_t stream) {
    using Cfg = TileConfig<D, Vec4, Pad, Exp2>;
    launch_kernel<attention_kernel<Cfg>>(a, Cfg::kBr, Cfg::kThreads, Cfg::kSmemBytes, stream,
                                         "attention_kernel<" + std::to_string(D) + ">");
}

//! [steps]
/// Step `step` of road() at head dimension D.
template <int D>
void launch(const KernelArgs& a, cudaStream_t stream, int step) {
    switch (step) {
        case 0:
            launch_kernel<row_per_thread_kernel<D, false>>(a, kRowKernelThreads, kRowKernelThreads, 0, stream,
                                                           "row_per_thread_kernel");
            break;
        case 1:
            launch_kernel<row_per_thread_kernel<D, true>>(a, kRowKernelThreads, kRowKernelThreads,
                                                          2 * sizeof(float) * kRoadTile * D, stream, "row_per_thread_kernel");
            break;
        case 2: launch_kernel<block_tile_kernel<D>>(a, 64, 128, block_tile_smem_bytes<D>(), stream, "block_tile_kernel"); break;
        case 3: launch_tiled<D, false, false, false>(a, stream); break;  // register micro-tiles
        case 4: launch_tiled<D, true, false, false>(a, stream); break;   // + float4 accesses
        case 5: launch_tiled<D, true, true, false>(a, stream); break;    // + padded pitch
        default: launch_tiled<D, true, true, true>(a, stream); break;    // + exp2: the final kernel
    }
}
//! [steps]

}  // namespace

void require_supported(const Problem& p, const char* stage) {
    if (p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 128) {
        throw InputError("head_dim " + std::to_string(p.head_dim) + " is not supported by stage " + stage +
                         ": use 32, 64 or 128");
    }
    constexpr int64_t kMaxRows = int64_t(1) << 30;
    if (p.seq_q > kMaxRows || p.seq_k > kMaxRows) {
        throw InputError("--seq-q and --seq-k must be at most 2^30 for stage " + std::string(stage));
    }
    const int64_t blocks = (p.seq_q + 63) / 64 * p.batch * p.heads;
    if (blocks > int64_t(std::numeric_limits<int>::max())) {
        throw InputError("batch * heads * ceil(seq_q / 64) = " + std::to_string(blocks) + " thread blocks is more than stage " +
                         stage + " launches (2^31 - 1): use smaller sizes");
    }
}

const std::vector<Step>& road() {
    static const std::vector<Step> steps = {
        {"row per thread", "one thread per query row, K and V read from device memory, expf"},
        {"K/V in shared memory", "the block copies each 64-row K/V tile to shared memory once; threads still own rows"},
        {"block-wide tiles", "128 threads share each tile: S_ij in shared memory, one score, row or output per thread at a time"},
        {"register micro-tiles", "each thread an 8 x 4 tile of S_ij and 8 x d/16 of O_i in registers, row maxima by shuffles"},
        {"float4", "16-byte loads and stores between global memory, shared memory and registers"},
        {"padding", "4 floats after each row of Q_s, K_s and P_s: no bank conflicts"},
        {"exp2", "log2(e) folded into Q's scale: scores in base 2, exp2f instead of expf (the final kernel)"},
    };
    return steps;
}

int final_step() { return int(road().size()) - 1; }

void check_supported(const Problem& p, int step) {
    require_supported(p, "05");
    if (step < -1 || step > final_step()) {
        throw InputError("--step " + std::to_string(step) + " is not a step of stage 05: use 0 to " +
                         std::to_string(final_step()));
    }
}

KernelArgs make_kernel_args(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v,
                            View4<float> o, View3<float> lse) {
    const auto vectorizable = [](const char* name, const void* data, const std::array<int64_t, 4>& stride) {
        if (stride[3] != 1 || stride[0] % 4 || stride[1] % 4 || stride[2] % 4 || reinterpret_cast<uintptr_t>(data) % 16) {
            throw InputError(std::string(name) +
                             " must have contiguous features (stride 1), other strides that are multiples of 4 "
                             "and a 16-byte aligned start for the GPU kernels' 16-byte loads");
        }
    };
    vectorizable("q", q.data, q.stride);
    vectorizable("k", k.data, k.stride);
    vectorizable("v", v.data, v.stride);
    vectorizable("o", o.data, o.stride);
    KernelArgs a{};
    a.q = q.data;
    a.k = k.data;
    a.v = v.data;
    a.o = o.data;
    a.lse = lse.data;
    a.q_sb = q.stride[0], a.q_sh = q.stride[1], a.q_sn = q.stride[2];
    a.k_sb = k.stride[0], a.k_sh = k.stride[1], a.k_sn = k.stride[2];
    a.v_sb = v.stride[0], a.v_sh = v.stride[1], a.v_sn = v.stride[2];
    a.o_sb = o.stride[0], a.o_sh = o.stride[1], a.o_sn = o.stride[2];
    a.lse_sb = lse.stride[0], a.lse_sh = lse.stride[1], a.lse_sn = lse.stride[2];
    a.batch = int(p.batch);
    a.heads = int(p.heads);
    a.seq_q = int(p.seq_q);
    a.seq_k = int(p.seq_k);
    a.causal = p.causal;
    a.scale = float(p.softmax_scale());
    a.scale_log2 = float(p.softmax_scale() * 1.4426950408889634);  // log2(e)
    return a;
}

void attention_device(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<float> o,
                      View3<float> lse, cudaStream_t stream, int step) {
    check_supported(p, step);
    const KernelArgs a = make_kernel_args(p, q, k, v, o, lse);
    if (step < 0) step = final_step();
    switch (p.head_dim) {
        case 32: launch<32>(a, stream, step); break;
        case 64: launch<64>(a, stream, step); break;
        default: launch<128>(a, stream, step); break;
    }
}

void attention(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<float> o,
               View3<float> lse) {
    attention_step(p, q, k, v, o, lse, -1);
}

void attention_step(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<float> o,
                    View3<float> lse, int step) {
    cuda::run_on_device(
        [step](const Problem& pp, View4<const float> dq, View4<const float> dk, View4<const float> dv, View4<float> dout,
               View3<float> dlse, cudaStream_t s) { attention_device(pp, dq, dk, dv, dout, dlse, s, step); },
        p, q, k, v, o, lse);
}

std::string describe_config(int step) {
    if (step < 0) step = final_step();
    const std::string name = "step " + std::to_string(step) + " (" + road()[size_t(step)].name + "): ";
    if (step == 0 || step == 1) {
        return name + std::to_string(kRowKernelThreads) + " threads per block, one query row each, q and O rows in registers" +
               (step == 1 ? "; 64-row K/V tiles in shared memory" : "; K and V read from device memory");
    }
    if (step == 2) {
        return name + "Br=64 Bc=64, 128 threads per block; Q_i, K_j, V_j and S_ij in shared memory (" +
               std::to_string(block_tile_smem_bytes<64>()) + " B at d = 64), d/2 outputs per thread in registers";
    }
    char buf[360];
    std::snprintf(buf, sizeof buf,
                  "Br=%d Bc=%d, %d threads per block; per thread %dx%d of S_ij and %dx(d/16) of O_i in registers; "
                  "%s accesses, %s rows, %s; shared memory per block %zu / %zu / %zu B for d = 32 / 64 / 128",
                  TileConfig<64>::kBr, TileConfig<64>::kBc, TileConfig<64>::kThreads, TileConfig<64>::kRowsPerThread,
                  TileConfig<64>::kKeysPerThread, TileConfig<64>::kRowsPerThread, step >= 4 ? "float4" : "one-float",
                  step >= 5 ? "padded" : "unpadded", step >= 6 ? "exp2" : "expf",
                  step >= 5 ? TileConfig<32>::kSmemBytes : TileConfig<32, true, false>::kSmemBytes,
                  step >= 5 ? TileConfig<64>::kSmemBytes : TileConfig<64, true, false>::kSmemBytes,
                  step >= 5 ? TileConfig<128>::kSmemBytes : TileConfig<128, true, false>::kSmemBytes);
    return name + buf;
}

}  // namespace fa::stage05
