// Stage 06: causal masking by tiles: full tiles without a mask, diagonal tiles with it, the rest skipped.
#include "attention.cuh"

#include <cstdio>
#include <string>

#include "../05_shared_memory_kernel/tile.cuh"
#include "fa/cuda/check.hpp"
#include "fa/cuda/stage.hpp"

namespace fa::stage06 {

using stage05::KernelArgs;
using stage05::Lane;
using stage05::RowState;
using stage05::TileConfig;

namespace {

//! [key_range]
/// The key tiles of one query tile `[q0, q0 + Br)`, by how its rows see them. Every row sees
/// keys `[0, visible_key_end(row))`, and that end grows with the row, so the first row sees the
/// fewest keys and the last valid row the most:
///   tiles `[0, full)`     every row sees every key: no mask needed
///   tiles `[full, end)`   some row sees some key, but not all rows all keys: mask
///   tiles `[end, Tc)`     no row sees any key: skipped
struct KeyTiles {
    int full;  ///< tiles before this one are unmasked
    int end;   ///< tiles from this one on are skipped
};

template <int kBr, int kBc>
__host__ __device__ KeyTiles key_tiles(int q0, int seq_q, int seq_k, bool causal) {
    const int q_last = (q0 + kBr < seq_q ? q0 + kBr : seq_q) - 1;
    const int fewest = int(visible_key_end(q0, seq_q, seq_k, causal));
    const int most = int(visible_key_end(q_last, seq_q, seq_k, causal));
    return {fewest / kBc, (most + kBc - 1) / kBc};
}
//! [key_range]

//! [kernel_head]
/// One block computes O and LSE for Br query rows of one (batch, head), visiting only the key
/// tiles its rows can see.
template <int D>
__global__ void __launch_bounds__(TileConfig<D>::kThreads, TileConfig<D>::kMinBlocksPerSm)
causal_attention_kernel(const KernelArgs a, bool heavy_first) {
    using Cfg = TileConfig<D>;
    extern __shared__ float4 smem_vec[];
    float* Q_s = reinterpret_cast<float*>(smem_vec);  // [Br, d+4]  this block's Q tile, scaled; stays
    float* K_s = Q_s + Cfg::kQFloats;                 // [Bc, d+4]  K_j; later P_ij as [Bc, Br+4]
    float* V_s = K_s + Cfg::kKPFloats;                // [Bc, d]    V_j

    // Heaviest first: under a causal mask the last query tiles see the most keys, so block 0
    // takes the last query tile of head 0, block 1 the last tile of head 1, and so on; the
    // lightest tiles come last and fill the gaps while the final heavy ones finish.
    // In order: query tile fastest, as in stage 05.
    const int q_tiles = (a.seq_q + Cfg::kBr - 1) / Cfg::kBr;
    const int heads_total = a.batch * a.heads;
    int q_tile, bh;
    if (heavy_first) {
        q_tile = q_tiles - 1 - int(blockIdx.x / unsigned(heads_total));
        bh = int(blockIdx.x % unsigned(heads_total));
    } else {
        q_tile = int(blockIdx.x % unsigned(q_tiles));
        bh = int(blockIdx.x / unsigned(q_tiles));
    }
    //! [kernel_head]
    const int q0 = q_tile * Cfg::kBr;
    const int b = bh / a.heads, h = bh % a.heads;
    const float* q_head = a.q + b * a.q_sb + h * a.q_sh;  // [Nq, d] global
    const float* k_head = a.k + b * a.k_sb + h * a.k_sh;  // [Nk, d] global
    const float* v_head = a.v + b * a.v_sb + h * a.v_sh;  // [Nk, d] global
    const Lane me = stage05::this_lane();

    //! [kernel_loops]
    RowState<Cfg> st;
    stage05::init_row_state(st);
    const KeyTiles tiles = key_tiles<Cfg::kBr, Cfg::kBc>(q0, a.seq_q, a.seq_k, a.causal);
    if (tiles.end > 0) {  // a query tile that sees no key skips straight to writing O = 0, LSE = -inf
        stage05::load_tile_gmem_to_smem<Cfg, Cfg::kBr, Cfg::kLdQK>(Q_s, q_head, a.q_sn, q0, a.seq_q, a.scale_log2);
        int key_end[Cfg::kRowsPerThread];
#pragma unroll
        for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
            const int row = q0 + me.row(i);
            key_end[i] = row < a.seq_q ? int(visible_key_end(row, a.seq_q, a.seq_k, a.causal)) : 0;
        }
        int t = 0;
        for (; t < tiles.full; ++t)  // left of the diagonal: every score counts, no mask
            stage05::process_kv_tile<Cfg, false>(a, k_head, v_head, t * Cfg::kBc, Q_s, K_s, V_s, st, key_end, me);
        for (; t < tiles.end; ++t)   // on the diagonal (or the last, partial tile): mask per element
            stage05::process_kv_tile<Cfg, true>(a, k_head, v_head, t * Cfg::kBc, Q_s, K_s, V_s, st, key_end, me);
        // tiles [end, Tc) lie above the diagonal: never loaded, never computed
    }
    stage05::store_output(a, st, b, h, q0, me);
}
//! [kernel_loops]

template <int D>
void opt_in_shared_memory() {
    cuda::allow_dynamic_shared_memory<causal_attention_kernel<D>>(TileConfig<D>::kSmemBytes);
}

/// Blocks of causal_attention_kernel<D> the current GPU runs at the same time.
template <int D>
int resident_blocks() {
    opt_in_shared_memory<D>();
    static const int blocks = [] {
        int per_sm = 0, sms = 0, device = 0;
        FA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, causal_attention_kernel<D>,
                                                                    TileConfig<D>::kThreads, TileConfig<D>::kSmemBytes));
        FA_CUDA_CHECK(cudaGetDevice(&device));
        FA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        return per_sm * sms;
    }();
    return blocks;
}

template <int D>
void launch(const KernelArgs& a, bool heavy_first, cudaStream_t stream) {
    using Cfg = TileConfig<D>;
    opt_in_shared_memory<D>();
    const int64_t q_tiles = (a.seq_q + Cfg::kBr - 1) / Cfg::kBr;
    const auto blocks = unsigned(q_tiles * a.batch * a.heads);
    causal_attention_kernel<D><<<blocks, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(a, heavy_first);
    FA_CUDA_CHECK_LAUNCH("stage06 causal_attention_kernel<" + std::to_string(D) + ">");
}

}  // namespace

void check_supported(const Problem& p) { stage05::require_supported(p, "06"); }

Schedule chosen_schedule(const Problem& p) {
    check_supported(p);
    const int resident = p.head_dim == 32 ? resident_blocks<32>() : p.head_dim == 64 ? resident_blocks<64>() : resident_blocks<128>();
    return p.causal && 4 * p.batch * p.heads <= resident ? Schedule::HeavyFirst : Schedule::InOrder;
}

void attention_device(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<float> o,
                      View3<float> lse, cudaStream_t stream, Schedule schedule) {
    check_supported(p);
    const KernelArgs a = stage05::make_kernel_args(p, q, k, v, o, lse);
    if (schedule == Schedule::Auto) schedule = chosen_schedule(p);
    const bool heavy_first = schedule == Schedule::HeavyFirst;
    switch (p.head_dim) {
        case 32: launch<32>(a, heavy_first, stream); break;
        case 64: launch<64>(a, heavy_first, stream); break;
        default: launch<128>(a, heavy_first, stream); break;
    }
}

void attention(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<float> o,
               View3<float> lse) {
    cuda::run_on_device(
        [](const Problem& pr, View4<const float> dq, View4<const float> dk, View4<const float> dv, View4<float> dout,
           View3<float> dlse, cudaStream_t s) { attention_device(pr, dq, dk, dv, dout, dlse, s); },
        p, q, k, v, o, lse);
}

TileCounts count_tiles(const Problem& p) {
    constexpr int kBr = TileConfig<64>::kBr, kBc = TileConfig<64>::kBc;
    const int q_tiles = int((p.seq_q + kBr - 1) / kBr), k_tiles = int((p.seq_k + kBc - 1) / kBc);
    TileCounts c;
    for (int t = 0; t < q_tiles; ++t) {
        const KeyTiles kt = key_tiles<kBr, kBc>(t * kBr, int(p.seq_q), int(p.seq_k), p.causal);
        c.unmasked += kt.full;
        c.masked += kt.end - kt.full;
    }
    c.total = int64_t(q_tiles) * k_tiles;
    c.skipped = c.total - c.unmasked - c.masked;
    return c;
}

std::string describe_config(const Problem& p) {
    const TileCounts c = count_tiles(p);
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "Br=%d Bc=%d, %d threads per block (stage 05's tiles); per head %lld of %lld key tiles computed "
                  "without mask, %lld with mask, %lld skipped; query tiles %s",
                  TileConfig<64>::kBr, TileConfig<64>::kBc, TileConfig<64>::kThreads, (long long)c.unmasked,
                  (long long)c.total, (long long)c.masked, (long long)c.skipped,
                  chosen_schedule(p) == Schedule::HeavyFirst ? "heaviest first" : "in order");
    return buf;
}

}  // namespace fa::stage06
