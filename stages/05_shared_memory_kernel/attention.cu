// Stage 05: the shared-memory attention kernel and its host side.
#include "attention.cuh"

#include <cstdio>
#include <limits>
#include <string>

#include "fa/cuda/check.hpp"
#include "fa/cuda/stage.hpp"
#include "fa/error.hpp"
#include "tile.cuh"

namespace fa::stage05 {

namespace {

//! [kernel]
/// One block computes O and LSE for Br query rows of one (batch, head). Blocks are numbered
/// query tile fastest, so the blocks that run side by side share the same K and V in L2.
template <int D>
__global__ void __launch_bounds__(TileConfig<D>::kThreads, TileConfig<D>::kMinBlocksPerSm)
attention_kernel(const KernelArgs a) {
    using Cfg = TileConfig<D>;
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

    // Q_i is read from device memory once, already multiplied by scale * log2(e).
    load_tile_gmem_to_smem<Cfg, Cfg::kBr, Cfg::kLdQK>(Q_s, q_head, a.q_sn, q0, a.seq_q, a.scale_log2);

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

template <int D>
void launch(const KernelArgs& a, cudaStream_t stream) {
    using Cfg = TileConfig<D>;
    // Above 48 KiB of dynamic shared memory a kernel must opt in, once per process.
    static const bool opted_in = [] {
        FA_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(Cfg::kSmemBytes)));
        return true;
    }();
    (void)opted_in;
    const int64_t q_tiles = (a.seq_q + Cfg::kBr - 1) / Cfg::kBr;
    const auto blocks = unsigned(q_tiles * a.batch * a.heads);
    attention_kernel<D><<<blocks, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(a);
    FA_CUDA_CHECK_LAUNCH("stage05 attention_kernel<" + std::to_string(D) + ">");
}

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

void check_supported(const Problem& p) { require_supported(p, "05"); }

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
    a.scale_log2 = float(p.softmax_scale() * 1.4426950408889634);  // log2(e)
    return a;
}

void attention_device(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<float> o,
                      View3<float> lse, cudaStream_t stream) {
    check_supported(p);
    const KernelArgs a = make_kernel_args(p, q, k, v, o, lse);
    switch (p.head_dim) {
        case 32: launch<32>(a, stream); break;
        case 64: launch<64>(a, stream); break;
        default: launch<128>(a, stream); break;
    }
}

void attention(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<float> o,
               View3<float> lse) {
    cuda::run_on_device(attention_device, p, q, k, v, o, lse);
}

std::string describe_config() {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "Br=%d Bc=%d, %d threads per block; per thread %dx%d of S_ij and %dx(d/16) of O_i in registers; "
                  "shared memory per block %zu / %zu / %zu B for d = 32 / 64 / 128",
                  TileConfig<64>::kBr, TileConfig<64>::kBc, TileConfig<64>::kThreads, TileConfig<64>::kRowsPerThread,
                  TileConfig<64>::kKeysPerThread, TileConfig<64>::kRowsPerThread, TileConfig<32>::kSmemBytes,
                  TileConfig<64>::kSmemBytes, TileConfig<128>::kSmemBytes);
    return buf;
}

}  // namespace fa::stage05
