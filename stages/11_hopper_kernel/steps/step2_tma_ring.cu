/// \file stages/11_hopper_kernel/steps/step2_tma_ring.cu
/// \brief Stage 11, step 2 on its own: step 1 with the tiles loaded by the TMA into a ring on mbarriers.
///
/// Over step 1: one thread hands each tile to the TMA (the tensor memory accelerator,
/// `cp.async.bulk.tensor`), which copies it in boxes, swizzled on the way as wgmma reads them, rows
/// past the end zero-filled, and counts its bytes on an mbarrier. K/V tile j goes to slot j % kStages
/// of a *ring*; the slot's *full* barrier completes a phase each time a tile's bytes land there, so
/// tile j waits for phase (j / kStages) & 1 (its *parity*). The switch kernel's step 2.
#include "common.cuh"
#include "fa/cuda/check.hpp"
#include "fa/cuda/mbarrier.cuh"
#include "fa/cuda/tma.cuh"
#include "steps.cuh"

namespace fa::stage11::step2 {

using namespace fa::stage11::steps;

constexpr char kStep[] = "stage 11 step 2";  ///< names the step in messages

/// The block's shape: Br = 64 query rows per consumer warpgroup, Bc keys per K/V tile.
template <int D>
struct Shape {
    static constexpr int kConsumers = 1;                    ///< consumer warpgroups
    static constexpr int kBr = 64 * kConsumers, kBc = 128;  ///< query rows per block, keys per tile
    static constexpr int kStages = 2;                       ///< slots of the ring, each a K and a V tile
    static constexpr int kThreads = 128 * kConsumers;       ///< threads per block
    static constexpr int kQBytes = kBr * D * 2, kKVBytes = kBc * D * 2;  ///< the Q tile, one K (or V) tile
    /// 1024 bytes to align the tiles (the swizzle's atom), Q, the ring, Q's barrier and a full barrier per slot.
    static constexpr int kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVBytes + 8 * (1 + kStages);
};

/// What the kernel reads: CommonArgs, and the TMA's maps of Q, K and V (B, H, N, d): boxes
/// [Br, 64] of Q, [Bc, 64] of K and V, 128-byte swizzle.
template <class T>
struct Args : CommonArgs<T> {
    CUtensorMap q_map, k_map, v_map;
};

/// One thread: the TMA copies of rows [row0, row0 + kRows) of head (b, h) of `map` into `tile` (D/64
/// swizzled boxes [kRows, 64]; rows past the end are zero), their bytes counted on barrier `bar`.
template <int D, int kRows>
__device__ __forceinline__ void tma_load_tile(const CUtensorMap* map, unsigned char* tile, uint32_t bar, int row0, int h, int b) {
    for (int box = 0; box < D / 64; ++box) tma_load_4d(smem_address(tile + box * kRows * 128), map, bar, 64 * box, row0, h, b);
}

//! [consume_tile]
/// One K/V tile for the consumer warpgroup, one thing after the other: S = Q K^T, the softmax, O += P V.
template <class T, int D>
__device__ __forceinline__ void consume_tile(ConsumerState<D>& st, uint32_t q_rows, uint32_t k_tile, uint32_t v_tile, int tile,
                                             int full, int row_lo, const Args<T>& a, int thread) {
    using S = Shape<D>;
    float s[S::kBc / 2], alpha[2];
    uint32_t p[S::kBc / 16][4];
    wgmma_fence();  // s is free for the wgmma to write
    issue_s<T, D, S::kBr, S::kBc>(s, q_rows, k_tile);
    wgmma_commit_group();
    wgmma_wait_group<0>();  // S is in registers
    warpgroup_fence_operands(s);
    softmax_tile<S::kBc>(st, s, alpha, tile, full, row_lo, a, thread);
    rescale_o<D>(st.o, alpha);
    pack_p<T, S::kBc>(s, p);
    wgmma_fence();  // O was rescaled and P written by ordinary instructions
    issue_pv<T, D, S::kBc>(st.o, p, v_tile);
    wgmma_commit_group();
    wgmma_wait_group<0>();  // O is in registers, and the slot is no longer read
    warpgroup_fence_operands(st.o);
}
//! [consume_tile]

//! [kernel]
/// The forward pass of one query tile of one (batch, head): block i runs work item i.
template <class T, int D>
__global__ void __launch_bounds__(Shape<D>::kThreads, 1) attention_kernel(const __grid_constant__ Args<T> a) {
    using S = Shape<D>;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* q_tile = smem_raw + (1024u - smem_address(smem_raw) % 1024u) % 1024u;  // [Br, d]: d/64 boxes [Br, 64]
    unsigned char* kv_ring = q_tile + S::kQBytes;  // kStages x (K [Bc, d], V [Bc, d])
    uint64_t* barriers = reinterpret_cast<uint64_t*>(kv_ring + 2 * S::kStages * S::kKVBytes);  // Q's, then slot s's full: 1 + s
    const auto bar = [&](int i) { return smem_address(barriers + i); };
    const Item it = work_item<S::kBr, S::kBc>(blockIdx.x, a);
    const int thread = int(threadIdx.x), consumer = thread / 128, ct = thread % 128;
    const int row_lo = it.q0 + 64 * consumer + 16 * (ct / 32) + ct % 32 / 4;  // row g of this warp; g + 8 is the other
    const uint32_t q_rows = smem_address(q_tile) + uint32_t(consumer) * 64 * 128;  // this warpgroup's 64 rows of Q
    ConsumerState<D> st;
    st.clear();
    if (it.end > 0) {
        //! [ring]
        if (thread == 0) {
            mbarrier_init(bar(0), 1);  // one arrival (the thread that announces the bytes), then the bytes
            for (int s = 0; s < S::kStages; ++s) mbarrier_init(bar(1 + s), 1);
            fence_mbarrier_init();  // the TMA unit sees the initialized barriers
        }
        __syncthreads();  // every thread sees them initialized before waiting on them
        //! [mainloop]
        // One thread hands the tiles to the TMA; K/V tile j goes to slot j % kStages, on its full barrier.
        const auto load_kv = [&](int tile) {
            unsigned char* k_dst = kv_ring + 2 * (tile % S::kStages) * S::kKVBytes;
            mbarrier_arrive_expect_tx(bar(1 + tile % S::kStages), 2 * S::kKVBytes);  // the phase ends when K and V have landed
            tma_load_tile<D, S::kBc>(&a.k_map, k_dst, bar(1 + tile % S::kStages), tile * S::kBc, it.h, it.b);
            tma_load_tile<D, S::kBc>(&a.v_map, k_dst + S::kKVBytes, bar(1 + tile % S::kStages), tile * S::kBc, it.h, it.b);
        };
        if (thread == 0) {
            mbarrier_arrive_expect_tx(bar(0), S::kQBytes);
            tma_load_tile<D, S::kBr>(&a.q_map, q_tile, bar(0), it.q0, it.h, it.b);
            for (int i = 0; i < S::kStages - 1 && i < it.end; ++i) load_kv(i);
        }
        mbarrier_wait_parity(bar(0), 0);  // Q has landed
        for (int tile = 0; tile < it.end; ++tile) {
            if (tile > 0) __syncthreads();  // every thread has finished tile - 1 (its wgmma waited): its slot is free
            if (thread == 0 && tile + S::kStages - 1 < it.end) load_kv(tile + S::kStages - 1);
            mbarrier_wait_parity(bar(1 + tile % S::kStages), uint32_t((tile / S::kStages) & 1));  // the slot's round tile / kStages
            const uint32_t k_tile = smem_address(kv_ring + 2 * (tile % S::kStages) * S::kKVBytes);
            consume_tile<T, D>(st, q_rows, k_tile, k_tile + S::kKVBytes, tile, it.full, row_lo, a, ct);
        }
        //! [mainloop]
        //! [ring]
    }
    write_output<T, D>(st, a, it.b, it.h, row_lo, ct);
}
//! [kernel]

//! [launch]
/// Fills the kernel's arguments (through a reference: fa/cuda/tensor_map.hpp says why).
template <class T, int D>
void fill_args(Args<T>& a, const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<T> o, View3<float> lse) {
    make_tensor_maps(a.q_map, a.k_map, a.v_map, p, q, k, v, Shape<D>::kBr, Shape<D>::kBc, kStep);
    fill_common(a, p, o, lse, Shape<D>::kBr);
}

#if !defined(FA_WARP_EMULATOR)  // the warp emulator runs the kernel with fill_args()' arguments itself
/// Launches one block per query tile and head.
template <class T, int D>
void launch(const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<T> o, View3<float> lse, cudaStream_t stream) {
    using S = Shape<D>;
    Args<T> a{};
    fill_args<T, D>(a, p, q, k, v, o, lse);
    cuda::allow_dynamic_shared_memory<attention_kernel<T, D>>(S::kSmemBytes);
    attention_kernel<T, D><<<unsigned(a.q_tiles * p.batch * p.heads), S::kThreads, S::kSmemBytes, stream>>>(a);
    FA_CUDA_CHECK_LAUNCH(std::string(kStep) + " attention_kernel<d=" + std::to_string(D) + ">");
}

void attention_device(const Problem& p, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k, View4<const __nv_bfloat16> v,
                      View4<__nv_bfloat16> o, View3<float> lse, cudaStream_t stream) {
    check_problem(p, q, k, v, o, kStep);
    p.head_dim == 64 ? launch<__nv_bfloat16, 64>(p, q, k, v, o, lse, stream) : launch<__nv_bfloat16, 128>(p, q, k, v, o, lse, stream);
}

void attention_device(const Problem& p, View4<const __half> q, View4<const __half> k, View4<const __half> v, View4<__half> o,
                      View3<float> lse, cudaStream_t stream) {
    check_problem(p, q, k, v, o, kStep);
    p.head_dim == 64 ? launch<__half, 64>(p, q, k, v, o, lse, stream) : launch<__half, 128>(p, q, k, v, o, lse, stream);
}
#endif
//! [launch]

}  // namespace fa::stage11::step2
