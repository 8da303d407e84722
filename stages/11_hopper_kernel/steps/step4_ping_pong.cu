/// \file stages/11_hopper_kernel/steps/step4_ping_pong.cu
/// \brief Stage 11, step 4 on its own: step 3 with the consumers taking turns on the tensor cores.
///
/// Over step 3: a consumer's loop is rotated so that the two GEMMs between two of its softmaxes,
/// S_j = Q K_j^T and P_{j-1} V_{j-1}, are issued together in one *turn*; named barriers pass the
/// turn from consumer to consumer (*ping-pong*), so one's softmax runs while the other's GEMMs keep
/// the tensor cores busy. A consumer now holds two tiles at once (K_j and V_{j-1}): the ring grows
/// to three slots. The switch kernel's step 4.
#include "common.cuh"
#include "fa/cuda/check.hpp"
#include "fa/cuda/mbarrier.cuh"
#include "fa/cuda/tma.cuh"
#include "fa/cuda/warpgroup.cuh"
#include "steps.cuh"

namespace fa::stage11::step4 {

using namespace fa::stage11::steps;

constexpr char kStep[] = "stage 11 step 4";  ///< names the step in messages

/// The block's shape: Br = 64 query rows per consumer warpgroup, Bc keys per K/V tile.
template <int D>
struct Shape {
    static constexpr int kConsumers = 2;                    ///< consumer warpgroups
    static constexpr int kBr = 64 * kConsumers, kBc = 128;  ///< query rows per block, keys per tile
    static constexpr int kStages = 3;                       ///< slots of the ring, each a K and a V tile
    static constexpr int kThreads = 128 * (1 + kConsumers);  ///< threads per block: the producer warpgroup, the consumers
    static constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;  ///< per thread, after setmaxnreg
    static constexpr int kQBytes = kBr * D * 2, kKVBytes = kBc * D * 2;  ///< the Q tile, one K (or V) tile
    /// 1024 bytes to align the tiles (the swizzle's atom), Q, the ring, Q's barrier, a full and an empty barrier per slot.
    static constexpr int kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVBytes + 8 * (1 + 2 * kStages);
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

//! [mainloop]
/// The consumer warpgroup's K/V tiles, its loop rotated into turns; the softmax of S_j follows turn j:
///
///     turn 0:    S_0 = Q K_0^T                 softmax 0
///     turn j:    S_j, O += P_{j-1} V_{j-1}     softmax j
///     turn end:  O += P_{end-1} V_{end-1}
template <class T, int D>
__device__ __forceinline__ void consume_tiles(ConsumerState<D>& st, uint32_t q_rows, unsigned char* kv_ring, uint64_t* barriers,
                                              const Item& it, int row_lo, const Args<T>& a, int thread, int consumer) {
    using S = Shape<D>;
    const auto bar = [&](int i) { return smem_address(barriers + i); };
    const auto k_tile = [&](int tile) { return smem_address(kv_ring + 2 * (tile % S::kStages) * S::kKVBytes); };  // V: kKVBytes on
    const auto slot_full = [&](int tile) { mbarrier_wait_parity(bar(1 + tile % S::kStages), uint32_t((tile / S::kStages) & 1)); };
    const auto slot_empty = [&](int tile) { mbarrier_arrive(bar(1 + S::kStages + tile % S::kStages)); };  // its wgmma waited
    //! [turns]
    // Consumer c waits for its turn on named barrier 1 + c (256 threads: its own and those of the one
    // that opens it), and opens the next consumer's once its wgmma are issued. The last consumer's
    // last turn opens nothing, so that no barrier is left half-arrived when the block ends.
    const auto turn_begin = [&] { named_barrier_sync(1 + consumer, 256); };
    const auto turn_end = [&](bool last) {
        if (!(last && consumer == S::kConsumers - 1)) named_barrier_arrive(1 + (consumer + 1) % S::kConsumers, 256);
    };
    if (consumer == 0) named_barrier_arrive(1, 256);  // consumer 0 takes the first turn
    //! [turns]
    float s[S::kBc / 2], alpha[2];  // S_j, then P_j in float32
    uint32_t p[S::kBc / 16][4];     // P_{j-1}, the A operand of turn j's P V
    slot_full(0);
    turn_begin();
    wgmma_fence();  // s is free for the wgmma to write
    issue_s<T, D, S::kBr, S::kBc>(s, q_rows, k_tile(0));
    wgmma_commit_group();
    turn_end(false);
    wgmma_wait_group<0>();  // S_0 is in registers
    warpgroup_fence_operands(s);
    softmax_tile<S::kBc>(st, s, alpha, 0, it.full, row_lo, a, thread);
    rescale_o<D>(st.o, alpha);  // O is 0: kept so that every tile does the same
    pack_p<T, S::kBc>(s, p);
    for (int tile = 1; tile < it.end; ++tile) {
        slot_full(tile);
        turn_begin();
        wgmma_fence();  // O was rescaled, P and s written by ordinary instructions
        issue_s<T, D, S::kBr, S::kBc>(s, q_rows, k_tile(tile));
        wgmma_commit_group();
        issue_pv<T, D, S::kBc>(st.o, p, k_tile(tile - 1) + S::kKVBytes);
        wgmma_commit_group();
        turn_end(false);
        wgmma_wait_group<0>();  // S_j and P_{j-1} V_{j-1} are done
        warpgroup_fence_operands(s);
        softmax_tile<S::kBc>(st, s, alpha, tile, it.full, row_lo, a, thread);
        warpgroup_fence_operands(st.o);
        warpgroup_fence_operands(s);
        slot_empty(tile - 1);  // K_{j-1} and V_{j-1} are no longer read
        rescale_o<D>(st.o, alpha);
        pack_p<T, S::kBc>(s, p);
    }
    turn_begin();
    wgmma_fence();  // O was rescaled and P written by ordinary instructions
    issue_pv<T, D, S::kBc>(st.o, p, k_tile(it.end - 1) + S::kKVBytes);
    wgmma_commit_group();
    turn_end(true);
    wgmma_wait_group<0>();  // O is complete
    warpgroup_fence_operands(st.o);
    slot_empty(it.end - 1);
}
//! [mainloop]

//! [kernel]
/// The forward pass of one query tile of one (batch, head): block i runs work item i.
template <class T, int D>
__global__ void __launch_bounds__(Shape<D>::kThreads, 1) attention_kernel(const __grid_constant__ Args<T> a) {
    using S = Shape<D>;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* q_tile = smem_raw + (1024u - smem_address(smem_raw) % 1024u) % 1024u;  // [Br, d]: d/64 boxes [Br, 64]
    unsigned char* kv_ring = q_tile + S::kQBytes;  // kStages x (K [Bc, d], V [Bc, d])
    uint64_t* barriers = reinterpret_cast<uint64_t*>(kv_ring + 2 * S::kStages * S::kKVBytes);  // Q's; slot s's full 1 + s, empty 1 + kStages + s
    const auto bar = [&](int i) { return smem_address(barriers + i); };
    const Item it = work_item<S::kBr, S::kBc>(blockIdx.x, a);
    const int thread = int(threadIdx.x), consumer = thread / 128 - 1, ct = thread % 128;  // warpgroup 0 produces
    const int row_lo = it.q0 + 64 * consumer + 16 * (ct / 32) + ct % 32 / 4;  // row g of this warp; g + 8 is the other
    const uint32_t q_rows = smem_address(q_tile) + uint32_t(consumer) * 64 * 128;  // this warpgroup's 64 rows of Q
    ConsumerState<D> st;
    st.clear();
    if (it.end > 0) {
        //! [ring]
        if (thread == 0) {
            mbarrier_init(bar(0), 1);  // one arrival (the thread that announces the bytes), then the bytes
            for (int s = 0; s < S::kStages; ++s) {
                mbarrier_init(bar(1 + s), 1);
                mbarrier_init(bar(1 + S::kStages + s), 128 * S::kConsumers);  // every consumer thread arrives
            }
            fence_mbarrier_init();  // the TMA unit sees the initialized barriers
        }
        __syncthreads();  // every thread sees them initialized before waiting on them
        // One thread hands the tiles to the TMA; K/V tile j goes to slot j % kStages, on its full barrier.
        const auto load_kv = [&](int tile) {
            unsigned char* k_dst = kv_ring + 2 * (tile % S::kStages) * S::kKVBytes;
            mbarrier_arrive_expect_tx(bar(1 + tile % S::kStages), 2 * S::kKVBytes);  // the phase ends when K and V have landed
            tma_load_tile<D, S::kBc>(&a.k_map, k_dst, bar(1 + tile % S::kStages), tile * S::kBc, it.h, it.b);
            tma_load_tile<D, S::kBc>(&a.v_map, k_dst + S::kKVBytes, bar(1 + tile % S::kStages), tile * S::kBc, it.h, it.b);
        };
        //! [roles]
        if (thread < 128) {  // the producer warpgroup
            setmaxnreg_dec<S::kProducerRegisters>();  // it needs few registers: the consumers take them
            if (thread == 0) {
                mbarrier_arrive_expect_tx(bar(0), S::kQBytes);
                tma_load_tile<D, S::kBr>(&a.q_map, q_tile, bar(0), it.q0, it.h, it.b);
                for (int tile = 0; tile < it.end; ++tile) {
                    // The slot's round tile / kStages refills it once round - 1 has been read: the empty barrier's phase.
                    if (tile >= S::kStages) mbarrier_wait_parity(bar(1 + S::kStages + tile % S::kStages), uint32_t((tile / S::kStages - 1) & 1));
                    load_kv(tile);
                }
            }
            return;  // the producer has nothing to write
        }
        setmaxnreg_inc<S::kConsumerRegisters>();  // the consumers get the registers
        //! [roles]
        mbarrier_wait_parity(bar(0), 0);  // Q has landed
        consume_tiles<T, D>(st, q_rows, kv_ring, barriers, it, row_lo, a, ct, consumer);
        //! [ring]
    } else if (thread < 128) {
        return;  // no key for any row: the producer has nothing to load
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

}  // namespace fa::stage11::step4
