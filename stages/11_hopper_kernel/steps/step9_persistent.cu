/// \file stages/11_hopper_kernel/steps/step9_persistent.cu
/// \brief Stage 11, step 9 on its own: step 4 as a persistent grid, one block per SM looping over work items.
///
/// Over step 4: the grid has one block per SM, and its producer takes *work items* (a query tile of a
/// head, numbered as step 4 numbers its blocks) from a counter in global memory and posts each in a
/// two-entry *mailbox* in shared memory for the consumers. The ring's slots, its parities and the turns
/// run on from item to item, so the next item's Q (once every consumer has read this one's: a *Q-empty*
/// barrier) and K/V tiles load while the consumers finish this item and write its O. Of steps 5-8 it
/// carries step 8's shape at d = 64 (three consumers of 160 registers, Br = 192), which sets the key
/// tiles each row sums over (its bits); not step 5's overlap, step 6's order or step 7's TMA store
/// (step 9 drops it), none of which changes a bit.
#include "common.cuh"
#include "fa/cuda/check.hpp"
#include "fa/cuda/mbarrier.cuh"
#include "fa/cuda/tma.cuh"
#include "fa/cuda/warpgroup.cuh"
#include "steps.cuh"

namespace fa::stage11::step9 {

using namespace fa::stage11::steps;

constexpr char kStep[] = "stage 11 step 9";  ///< names the step in messages

/// The block's shape: Br = 64 query rows per consumer warpgroup, Bc keys per K/V tile.
template <int D>
struct Shape {
    static constexpr int kConsumers = D == 64 ? 3 : 2;      ///< consumer warpgroups (step 8: three at d = 64)
    static constexpr int kBr = 64 * kConsumers, kBc = 128;  ///< query rows per block, keys per tile
    static constexpr int kStages = 3;                       ///< slots of the ring, each a K and a V tile
    static constexpr int kThreads = 128 * (1 + kConsumers);  ///< threads per block: the producer warpgroup, the consumers
    static constexpr int kProducerRegisters = 24, kConsumerRegisters = D == 64 ? 160 : 240;  ///< per thread, after setmaxnreg
    static constexpr int kQBytes = kBr * D * 2, kKVBytes = kBc * D * 2;  ///< the Q tile, one K (or V) tile
    /// 1024 bytes to align the tiles, Q, the ring, barriers: Q's, the slots', Q empty, the mailbox's 2 x 2; the mailbox.
    static constexpr int kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVBytes + 8 * (1 + 2 * kStages + 5 + 2);
};

/// What the kernel reads: CommonArgs, and the TMA's maps of Q, K and V (B, H, N, d): boxes
/// [Br, 64] of Q, [Bc, 64] of K and V, 128-byte swizzle.
template <class T>
struct Args : CommonArgs<T> {
    CUtensorMap q_map, k_map, v_map;
    unsigned items;          ///< work items: query tiles x B x H
    unsigned* work_counter;  ///< the next work item to hand out (zero at launch)
};

/// One thread: the TMA copies of rows [row0, row0 + kRows) of head (b, h) of `map` into `tile` (D/64
/// swizzled boxes [kRows, 64]; rows past the end are zero), their bytes counted on barrier `bar`.
template <int D, int kRows>
__device__ __forceinline__ void tma_load_tile(const CUtensorMap* map, unsigned char* tile, uint32_t bar, int row0, int h, int b) {
    for (int box = 0; box < D / 64; ++box) tma_load_4d(smem_address(tile + box * kRows * 128), map, bar, 64 * box, row0, h, b);
}

//! [mainloop]
/// The consumer warpgroup's K/V tiles of item `it`, its loop rotated into turns; the softmax of S_j follows turn j:
///
///     turn 0:    S_0 = Q K_0^T                 softmax 0
///     turn j:    S_j, O += P_{j-1} V_{j-1}     softmax j
///     turn end:  O += P_{end-1} V_{end-1}
template <class T, int D>
__device__ __forceinline__ void consume_tiles(ConsumerState<D>& st, uint32_t q_rows, unsigned char* kv_ring, uint64_t* barriers,
                                              const Item& it, int row_lo, const Args<T>& a, int thread, int consumer, int base,
                                              bool first_item) {
    using S = Shape<D>;
    const auto bar = [&](int i) { return smem_address(barriers + i); };
    // The item's tile j is the block's tile k = base + j in the ring: its slot and parity go on from item to item.
    const auto k_tile = [&](int tile) { return smem_address(kv_ring + 2 * ((base + tile) % S::kStages) * S::kKVBytes); };  // V: kKVBytes on
    const auto slot_full = [&](int tile) { mbarrier_wait_parity(bar(1 + (base + tile) % S::kStages), uint32_t((base + tile) / S::kStages & 1)); };
    const auto slot_empty = [&](int tile) { mbarrier_arrive(bar(1 + S::kStages + (base + tile) % S::kStages)); };  // its wgmma waited
    const auto q_read = [&](int tile) {  // S_{end-1} is in registers: Q's last reader has finished
        if (tile == it.end - 1) mbarrier_arrive(bar(1 + 2 * S::kStages));
    };
    //! [turns]
    // Consumer c waits for its turn on named barrier 1 + c (256 threads: its own and those of the one
    // that opens it), and opens the next consumer's once its wgmma are issued. The last consumer's
    // last turn opens consumer 0's first turn of the next item.
    const auto turn_begin = [&] { named_barrier_sync(1 + consumer, 256); };
    const auto turn_end = [&](bool) { named_barrier_arrive(1 + (consumer + 1) % S::kConsumers, 256); };
    if (consumer == 0 && first_item) named_barrier_arrive(1, 256);  // consumer 0 takes the block's first turn
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
    q_read(0);
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
        q_read(tile);
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
/// A persistent block: its producer takes work items from the counter until none is left, its
/// consumers compute each and write its O.
template <class T, int D>
__global__ void __launch_bounds__(Shape<D>::kThreads, 1) attention_kernel(const __grid_constant__ Args<T> a) {
    using S = Shape<D>;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* q_tile = smem_raw + (1024u - smem_address(smem_raw) % 1024u) % 1024u;  // [Br, d]: d/64 boxes [Br, 64]
    unsigned char* kv_ring = q_tile + S::kQBytes;  // kStages x (K [Bc, d], V [Bc, d])
    uint64_t* barriers = reinterpret_cast<uint64_t*>(kv_ring + 2 * S::kStages * S::kKVBytes);  // Q's; slot s's full 1 + s, empty 1 + kStages + s
    const auto bar = [&](int i) { return smem_address(barriers + i); };
    constexpr int kQEmpty = 1 + 2 * S::kStages, kItemFull = kQEmpty + 1, kItemEmpty = kQEmpty + 3;  // then entry e's full, empty: + e
    volatile unsigned* mailbox = reinterpret_cast<volatile unsigned*>(barriers + kQEmpty + 5);  // two entries, each an item's number
    const int thread = int(threadIdx.x), consumer = thread / 128 - 1, ct = thread % 128;  // warpgroup 0 produces
    const uint32_t q_rows = smem_address(q_tile) + uint32_t(consumer) * 64 * 128;  // this warpgroup's 64 rows of Q
    //! [ring]
    if (thread == 0) {
        mbarrier_init(bar(0), 1);  // one arrival (the thread that announces the bytes), then the bytes
        for (int s = 0; s < S::kStages; ++s) {
            mbarrier_init(bar(1 + s), 1);
            mbarrier_init(bar(1 + S::kStages + s), 128 * S::kConsumers);  // every consumer thread arrives
        }
        mbarrier_init(bar(kQEmpty), 128 * S::kConsumers);
        for (int e = 0; e < 2; ++e) mbarrier_init(bar(kItemFull + e), 1), mbarrier_init(bar(kItemEmpty + e), 128 * S::kConsumers);
        fence_mbarrier_init();  // the TMA unit sees the initialized barriers
    }
    __syncthreads();  // every thread sees them initialized before waiting on them
    // One thread hands the tiles to the TMA; the block's K/V tile k goes to slot k % kStages, on its full barrier.
    const auto load_kv = [&](int k, const Item& it, int tile) {
        unsigned char* k_dst = kv_ring + 2 * (k % S::kStages) * S::kKVBytes;
        mbarrier_arrive_expect_tx(bar(1 + k % S::kStages), 2 * S::kKVBytes);  // the phase ends when K and V have landed
        tma_load_tile<D, S::kBc>(&a.k_map, k_dst, bar(1 + k % S::kStages), tile * S::kBc, it.h, it.b);
        tma_load_tile<D, S::kBc>(&a.v_map, k_dst + S::kKVBytes, bar(1 + k % S::kStages), tile * S::kBc, it.h, it.b);
    };
    //! [roles]
    if (thread < 128) {  // the producer warpgroup
        setmaxnreg_dec<S::kProducerRegisters>();  // it needs few registers: the consumers take them
        if (thread == 0) {
            //! [scheduler]
            int rounds = 0, ring = 0;  // items with keys and K/V tiles so far: the consumers count them alike
            for (int r = 0;; ++r) {
                const unsigned w = atomicAdd(a.work_counter, 1u);  // the next item nobody has taken
                if (r >= 2) mbarrier_wait_parity(bar(kItemEmpty + r % 2), uint32_t((r / 2 - 1) & 1));  // entry r % 2 was read
                mailbox[r % 2] = w;
                mbarrier_arrive(bar(kItemFull + r % 2));  // release: the consumers' wait sees the entry
                if (w >= a.items) break;  // a number past the last item tells everyone to stop
                const Item it = work_item<S::kBr, S::kBc>(w, a);
                if (it.end == 0) continue;  // no key for any row: nothing to load
                if (rounds > 0) mbarrier_wait_parity(bar(kQEmpty), uint32_t((rounds - 1) & 1));  // every consumer has read the last Q
                ++rounds;
                mbarrier_arrive_expect_tx(bar(0), S::kQBytes);
                tma_load_tile<D, S::kBr>(&a.q_map, q_tile, bar(0), it.q0, it.h, it.b);
                for (int tile = 0; tile < it.end; ++tile, ++ring) {
                    // The slot's round ring / kStages refills it once round - 1 has been read: the empty barrier's phase.
                    if (ring >= S::kStages) mbarrier_wait_parity(bar(1 + S::kStages + ring % S::kStages), uint32_t((ring / S::kStages - 1) & 1));
                    load_kv(ring, it, tile);
                }
            }
            //! [scheduler]
        }
        return;  // the producer has nothing to write
    }
    setmaxnreg_inc<S::kConsumerRegisters>();  // the consumers get the registers
    //! [roles]
    int rounds = 0, ring = 0;
    for (int r = 0;; ++r) {
        mbarrier_wait_parity(bar(kItemFull + r % 2), uint32_t((r / 2) & 1));  // the producer has posted item r
        const unsigned w = mailbox[r % 2];
        mbarrier_arrive(bar(kItemEmpty + r % 2));  // entry r % 2 may be written again
        if (w >= a.items) break;
        const Item it = work_item<S::kBr, S::kBc>(w, a);
        const int row_lo = it.q0 + 64 * consumer + 16 * (ct / 32) + ct % 32 / 4;  // row g of this warp; g + 8 is the other
        ConsumerState<D> st;
        st.clear();
        if (it.end > 0) {
            mbarrier_wait_parity(bar(0), uint32_t(rounds & 1));  // this item's Q has landed
            consume_tiles<T, D>(st, q_rows, kv_ring, barriers, it, row_lo, a, ct, consumer, ring, rounds == 0);
            ring += it.end;
            ++rounds;
        }
        write_output<T, D>(st, a, it.b, it.h, row_lo, ct);
    }
    //! [ring]
    // The last consumer's last turn opened consumer 0's for an item that never came: consumer 0 takes
    // it, so that no named barrier is left half-arrived when the block ends.
    if (consumer == 0 && rounds > 0) named_barrier_sync(1, 256);
}
//! [kernel]
//! [launch]
/// Fills the kernel's arguments (through a reference: fa/cuda/tensor_map.hpp says why).
template <class T, int D>
void fill_args(Args<T>& a, const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<T> o, View3<float> lse) {
    make_tensor_maps(a.q_map, a.k_map, a.v_map, p, q, k, v, Shape<D>::kBr, Shape<D>::kBc, kStep);
    fill_common(a, p, o, lse, Shape<D>::kBr);
    a.items = unsigned(a.q_tiles * p.batch * p.heads);
}
#if !defined(FA_WARP_EMULATOR)  // (the warp emulator runs the kernel with fill_args()' arguments itself)
/// Checks the problem and launches one block per SM (at most one per work item).
template <class T, int D>
void launch(const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<T> o, View3<float> lse, cudaStream_t stream) {
    check_problem(p, q, k, v, o, kStep);
    Args<T> a{};
    fill_args<T, D>(a, p, q, k, v, o, lse);
    cuda::allow_dynamic_shared_memory<attention_kernel<T, D>>(Shape<D>::kSmemBytes);
    int device = 0, sms = 0;
    FA_CUDA_CHECK(cudaGetDevice(&device));
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    // The counter, allocated, zeroed and freed in the stream's order: launches on other streams never share one.
    FA_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&a.work_counter), sizeof(unsigned), stream));
    FA_CUDA_CHECK(cudaMemsetAsync(a.work_counter, 0, sizeof(unsigned), stream));
    attention_kernel<T, D><<<std::min(a.items, unsigned(sms)), Shape<D>::kThreads, Shape<D>::kSmemBytes, stream>>>(a);
    FA_CUDA_CHECK(cudaFreeAsync(a.work_counter, stream));
    FA_CUDA_CHECK_LAUNCH(std::string(kStep) + " attention_kernel<d=" + std::to_string(D) + ">");
}

void attention_device(const Problem& p, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k, View4<const __nv_bfloat16> v,
                      View4<__nv_bfloat16> o, View3<float> lse, cudaStream_t stream) {
    p.head_dim == 64 ? launch<__nv_bfloat16, 64>(p, q, k, v, o, lse, stream) : launch<__nv_bfloat16, 128>(p, q, k, v, o, lse, stream);
}
void attention_device(const Problem& p, View4<const __half> q, View4<const __half> k, View4<const __half> v, View4<__half> o,
                      View3<float> lse, cudaStream_t stream) {
    p.head_dim == 64 ? launch<__half, 64>(p, q, k, v, o, lse, stream) : launch<__half, 128>(p, q, k, v, o, lse, stream);
}
#endif
//! [launch]

}  // namespace fa::stage11::step9
