/// \file stages/11_hopper_kernel/kernel.cuh
/// \brief Stage 11's kernel: one template whose compile-time Features switch each Hopper idea on.
///
/// A *consumer warpgroup* (4 warps, 128 threads) owns 64 query rows from start to end, as a
/// warp of stage 07 owned 16 or 32: the scores of its rows, m_i, l_i and O_i live in its
/// registers. Per K/V tile of `Bc` keys, per consumer warpgroup:
///
///     S   = Q_c K_j^T          [64, Bc]  d/16 wgmma m64nBck16, Q and K from shared memory (SS)
///     m_i, l_i, P = exp2(S*scale*log2e - m_i*scale*log2e)         float32, in registers
///     O_c = O_c * alpha + P V_j  [64, d]   Bc/16 wgmma m64ndk16, P from registers (RS), V as B
///                                           read transposed from its [keys, d] tile
///
/// The road (Features): step 1 loads tiles with cp.async as stage 07 did; step 2 lets the TMA
/// load them into a ring of buffers on mbarriers; step 3 gives the loads to a producer
/// warpgroup and the registers to the consumers (setmaxnreg); step 4 makes the consumer
/// warpgroups take turns on the tensor cores (ping-pong), so one's softmax runs under the
/// other's GEMMs; step 5 overlaps a warpgroup's own softmax with its previous P V; step 6 runs
/// the heaviest causal query tiles of a group of heads first; step 7 writes O through shared memory
/// with a TMA store; step 8 gives d = 64 three consumer warpgroups; step 9 keeps one block per SM,
/// taking work items from a counter, so that the next item's loads run under this one's end
/// (detail::run_persistent); step 10 stores O 16 bytes a lane (detail::write_output, kWide); step
/// 11 runs short causal heads at d = 64 in small blocks, three per SM (Features::small_blocks());
/// step 12's producer claims the next item early and posts it decoded; step 13 gives O its own
/// shared buffer at d = 64 and leaves its TMA store running (write_output_tma, kStaged); step 14
/// orders d = 128's plain-store epilogue as one batch (write_output_batched); step 15 gives K and V
/// rings of their own, which frees the room for d = 128's O buffer (Shape::k_offset, v_offset); step
/// 16's warpgroups whose rows all lie past Nq take their turns without computing (pass_turns); step
/// 17 keeps a row's maximum until it grows past 2^8 and rescales O only when one moved (lazy_rescale).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>
#include <cuda_runtime.h>

#include "fa/cuda/fragments.cuh"
#include "fa/cuda/mbarrier.cuh"
#include "fa/cuda/ptx.cuh"
#include "fa/cuda/timeline.cuh"
#include "fa/cuda/tma.cuh"
#include "fa/cuda/warpgroup.cuh"
#include "fa/cuda/wgmma.cuh"
#include "fa/cuda/wgmma_layout.hpp"
#include "fa/problem.hpp"
#include "schedule.hpp"
#include "timeline.hpp"

namespace fa::stage11 {

//! [features]
/// The switches of the road, each one idea of the lesson. A step is a named value built from
/// the one before (`kStep2 = kStep1.with_tma_ring()`); a kernel takes it through a type whose
/// static member `value` holds it (CUDA sources are C++17: no class-type template parameters).
struct Features {
    int bc = 128;            ///< keys per K/V tile (the N of S = Q K^T's wgmma)
    int consumers = 1;       ///< consumer warpgroups; each owns 64 query rows, so Br = 64 x consumers
    int stages = 2;          ///< K/V tiles in the ring of shared buffers
    bool tma = false;        ///< tiles loaded by the TMA onto mbarriers (else by every thread with cp.async)
    bool producer = false;   ///< a producer warpgroup issues the loads; the consumers only compute
    int producer_registers = 24;   ///< with `producer`: registers per thread the producer keeps (setmaxnreg.dec)
    int consumer_registers = 240;  ///< with `producer`: registers per thread of a consumer (setmaxnreg.inc)
    bool ping_pong = false;  ///< consumer warpgroups take turns issuing their GEMMs (named barriers)
    bool overlap = false;    ///< with `ping_pong`: a warpgroup's softmax of tile j runs under its own P_{j-1} V_{j-1}
    bool heaviest_first_grid = false;  ///< causal: blocks ordered rank by rank across a group of heads (Args::group_heads)
    bool tma_store = false;  ///< O goes through shared memory and leaves with a TMA store
    int consumers_d64 = 0;   ///< at d = 64: consumer warpgroups (0: `consumers`)
    int consumer_registers_d64 = 0;  ///< at d = 64 with `consumers_d64`: registers per consumer thread
    bool persistent = false;  ///< one block per SM loops over the work; the next tile's loads overlap this tile's end
    bool wide_stores = false;  ///< plain-store epilogue: a quad transposes its words and each lane stores 16 bytes
    int blocks_per_sm = 1;     ///< blocks an SM holds at once (the launch bounds; the persistent grid's blocks per SM)
    bool small_blocks_short_causal = false;  ///< at d = 64, causal, few keys: small_blocks()' kernel (the host's rule)
    bool claim_ahead = false;  ///< persistent grid: the producer claims the next item while it loads this one's last tile
    bool staged_store = false;  ///< persistent grid, where it fits: O through its own shared buffer and a TMA store left running
    bool batched_epilogue = false;  ///< wide-store epilogue: both rows of a thread computed before any store, the LSE last
    int split_ring_d128 = 0;  ///< persistent grid at d = 128: K and V in rings of their own, this many slots each (0: one ring)
    bool split_ring = false;  ///< K and V in rings of their own, `stages` slots each (at_head_dim() sets it from split_ring_d128)
    bool idle_past_nq = false;  ///< persistent grid: a consumer warpgroup whose rows all lie past Nq only takes its turns (pass_turns())
    bool lazy_rescale = false;  ///< a row keeps its maximum until a tile's exceeds it by more than 2^rescale_slack_log2; O rescaled only then
    int rescale_slack_log2 = 0;  ///< with `lazy_rescale`: how far (log2 units of exp2's argument) P may exceed 1
    bool timeline = false;   ///< the instrumented build: one block records timestamped marks (Args::timeline)

    /// Step 2: the TMA loads each K and V tile in whole boxes, swizzled as wgmma reads them, and
    /// reports on an mbarrier; a ring `stages` deep.
    constexpr Features with_tma_ring(int ring_stages) const {
        Features f = *this;
        f.tma = true;
        f.stages = ring_stages;
        return f;
    }
    /// Step 3: warp specialization. One warpgroup produces (one thread issues TMA copies, its
    /// registers given away), `consumer_groups` warpgroups consume; full and empty barriers
    /// per slot replace the block-wide barrier.
    constexpr Features with_producer_warpgroup(int consumer_groups) const {
        Features f = *this;
        f.producer = true;
        f.consumers = consumer_groups;
        return f;
    }
    /// Step 4: ping-pong. The loop of a consumer warpgroup is rotated so that the GEMMs between
    /// two of its softmaxes (P_{j-1} V_{j-1}, then S_j = Q K_j^T) are issued together, in a
    /// *turn*; named barriers pass the turn from warpgroup to warpgroup, so while one issues
    /// its GEMMs the others compute their softmax. A warpgroup now holds two tiles at a time
    /// (K_j and V_{j-1}), so the ring grows to `ring_stages` slots to keep the TMA ahead.
    constexpr Features with_ping_pong(int ring_stages) const {
        Features f = *this;
        f.ping_pong = true;
        f.stages = ring_stages;
        return f;
    }
    /// Step 5: inside a warpgroup, S_j and P_{j-1} V_{j-1} are committed as two wgmma-groups;
    /// the softmax of S_j starts when the first is done (wait_group 1) and runs while the tensor
    /// cores still compute P_{j-1} V_{j-1}; O is rescaled and P_j written after the second.
    constexpr Features with_softmax_overlap() const {
        Features f = *this;
        f.overlap = true;
        return f;
    }
    /// Step 6: under a causal mask, the heads are taken in groups whose K and V fit in L2
    /// together, and inside a group block i runs query tile `i / G` of the group's head `i % G`,
    /// counted from the last: the group's heaviest tiles start first and the light ones fill the
    /// end (stage 07 and steps 1-5 go head by head, each head from its heaviest tile).
    constexpr Features with_heaviest_first_grid() const {
        Features f = *this;
        f.heaviest_first_grid = true;
        return f;
    }
    /// Step 7: the epilogue writes O, normalized and rounded, into the warpgroup's rows of the Q
    /// tile (Q is no longer read), and one thread stores each 64 x 64 box with the TMA.
    constexpr Features with_tma_store() const {
        Features f = *this;
        f.tma_store = true;
        return f;
    }
    //! [step8_shape]
    /// Step 8: a shape for d = 64, where a tile's GEMMs are half as long as at d = 128 and the
    /// softmax as long: three consumer warpgroups (Br = 192) take turns, so two softmaxes hide
    /// under each one's GEMMs, and a K/V tile serves 192 query rows; 160 registers each
    /// (24 + 3 x 160 <= 512 per lane of the register file). d = 128 keeps two (its O alone is
    /// 64 registers).
    constexpr Features with_three_consumers_at_d64() const {
        Features f = *this;
        f.consumers_d64 = 3;
        f.consumer_registers_d64 = 160;
        return f;
    }
    //! [step8_shape]
    /// Step 9: a persistent grid. One block per SM takes the work items (query tile, head) from a
    /// counter, in the order of the grid before, and keeps its producer and consumers, its ring
    /// and its turns from one item to the next: the producer loads the next
    /// item's Q as soon as every consumer's last S = Q K^T has read the current one (a *Q empty*
    /// barrier), and its K and V tiles as the ring frees slots, while the consumers still finish the
    /// current item's last tiles and write its O. That Q buffer is why O goes out by plain stores
    /// again (step 7 staged it in Q's place): the next Q is already landing there.
    constexpr Features with_persistent_grid() const {
        Features f = *this;
        f.persistent = true;
        f.tma_store = false;
        return f;
    }
    /// Step 10: the plain-store epilogue of step 9, rearranged. A lane holds two columns (4 bytes)
    /// of each 8-column block of its rows, so a warp's 4-byte stores write 8 rows x 16 bytes: 8
    /// cache lines, each half a 32-byte sector, for 4 bytes a lane. A transpose inside each quad
    /// (fa::cuda::quad_transpose, four shuffles) gives each lane a whole block of four; one 16-byte
    /// store per lane then writes 8 rows x 64 bytes: a quarter of the store instructions and
    /// whole sectors.
    constexpr Features with_wide_stores() const {
        Features f = *this;
        f.wide_stores = true;
        return f;
    }
    /// Step 11: at d = 64 under a causal mask with few keys (launch.cuh's kSmallBlocksMaxKeys), the
    /// host launches small_blocks()' kernel instead of step 10's. The choice follows the problem, as a
    /// library chooses tile shapes; every other problem runs step 10.
    constexpr Features with_small_blocks_for_short_causal_heads() const {
        Features f = *this;
        f.small_blocks_short_causal = true;
        return f;
    }
    /// Step 12: the next work item ready before the consumers ask for it. The persistent producer
    /// claims it (the counter's atomicAdd, a round trip of about a microsecond) when it reaches the
    /// current item's last K/V tile, before waiting for that tile's slot, instead of after issuing
    /// it; and it posts the item decoded (head, first query row, key tiles), so that a consumer
    /// that has written O reads five numbers instead of computing them (block_work()'s divisions).
    constexpr Features with_early_claim() const {
        Features f = *this;
        f.claim_ahead = true;
        return f;
    }
    /// Step 13: the epilogue shortened where a [Br, d] tile fits beside Q and the ring (d = 64). A
    /// consumer rounds its normalized O into its own rows of a shared buffer and one of its threads
    /// hands them to the TMA (step 7's store, in a buffer of their own, since Q's is refilling);
    /// nobody waits for the store, only, at the warpgroup's next item's end, for the TMA to have
    /// read the buffer. No quad transpose, no global stores in the consumer's epilogue.
    constexpr Features with_staged_store() const {
        Features f = *this;
        f.staged_store = true;
        return f;
    }
    /// Step 14: the plain-store epilogue (d = 128; d = 64 stages O) as one batch. Step 10's loop
    /// does a thread's two rows one after the other, and its LSE store, under a branch (one lane
    /// of four, rows before Nq), sits between them: ptxas cannot move the second row's shuffles
    /// above it, and the epilogue is a chain of shuffle latencies. Here the sums, the normalization
    /// and the quad transposes of both rows come first, then the stores, then the LSE.
    constexpr Features with_batched_epilogue() const {
        Features f = *this;
        f.batched_epilogue = true;
        return f;
    }
    /// Step 15, at d = 128: K and V on rings of their own, `ring_stages` slots each. A ring slot of
    /// steps 4-14 holds a tile's K and V and frees both after P V, although K's last reader,
    /// S = Q K^T, ended a softmax earlier. Here K_j's slot is freed when every consumer has S_j in
    /// registers and V_j's when P_j V_j is done, and a turn waits for V_{j-1}, the V it reads,
    /// not V_j: K_{j+2} and V_{j+1} load while turn j runs, as far ahead as the three-slot ring
    /// loaded them, from four tiles instead of six. The 64 KB freed hold O's buffer: step 13's
    /// staged store now fits at d = 128. At d = 64 (three consumers) the kernel is step 14's.
    constexpr Features with_split_ring_at_d128(int ring_stages) const {
        Features f = *this;
        f.split_ring_d128 = ring_stages;
        return f;
    }
    /// Step 16: a query tile that ends past Nq (the last of a head, when Nq is not a multiple of Br)
    /// leaves some consumer warpgroups without a row: at d = 64 and N = 1024, 1024 = 5 x 192 + 64,
    /// so in every head's last tile two of the three compute scores no one reads. Here such a
    /// warpgroup issues no GEMM and computes no softmax: it takes its turns empty (the next
    /// warpgroup's opens at once) and arrives on the ring's and Q's barriers as before, so the
    /// warpgroups with rows have the tensor cores to themselves. Its epilogue runs as before and
    /// writes nothing: the TMA store leaves out rows past Nq, and so do the LSE's stores.
    constexpr Features with_idle_warpgroups_past_nq() const {
        Features f = *this;
        f.idle_past_nq = true;
        return f;
    }
    /// Step 17: O rescaled only when a maximum moved. The online softmax multiplies a warpgroup's O
    /// by alpha = exp2(m_old - m_new) after every tile: 64 multiplies a thread at d = 128, on the
    /// path that must fit under the other warpgroups' GEMMs, and after the first tiles the row
    /// maxima rarely move. Here a row keeps its maximum until a tile's exceeds it by more than
    /// 2^slack_log2 (so P may reach 2^slack_log2, which float32's l and O and the 16-bit P hold
    /// with room to spare), and a warp rescales its O only when one of its rows moved (a vote).
    /// Not in d = 64's shape of three consumers (step 8): with 160 registers a thread, ptxas spilled
    /// 128 bytes around the branch, and it lost there; the small blocks of step 11 keep it.
    constexpr Features with_lazy_rescale(int slack_log2) const {
        Features f = *this;
        f.lazy_rescale = true;
        f.rescale_slack_log2 = slack_log2;
        return f;
    }
    //! [small_blocks_shape]
    /// The shape step 11 runs on short causal heads at d = 64: blocks of one producer and one
    /// consumer warpgroup (Br = 64), three per SM, each with its own ring of four 64-key tiles.
    /// The warp schedulers interleave the blocks as the turns of step 4 interleaved the consumers
    /// of one block (a block of one consumer takes no turns), and the consumer keeps step 5's
    /// overlap. A causal diagonal tile now costs 64 query rows, not 192, and no row past Nq is
    /// computed. Registers: 65536 / (3 x 256) gives 80 a thread at launch; the producer keeps 24
    /// and the consumer takes 136 (setmaxnreg), enough for S, P and O of 64-key tiles at d = 64.
    constexpr Features small_blocks() const {
        Features f = *this;
        f.small_blocks_short_causal = false;
        f.consumers = 1;
        f.consumers_d64 = 0;  // no d = 64 override: this is the d = 64 shape
        f.consumer_registers = 136;
        f.consumer_registers_d64 = 0;
        f.bc = 64;
        f.stages = 4;
        f.blocks_per_sm = 3;
        return f;
    }
    //! [small_blocks_shape]
    /// The instrumented build of a step: one thread per warpgroup of block Args::timeline_block
    /// records when each wait, GEMM issue, softmax and epilogue ends (fa/cuda/timeline.cuh), so
    /// that the lesson's timeline is measured. Not a step of the road: the same kernel, observed.
    constexpr Features with_timeline() const {
        Features f = *this;
        f.timeline = true;
        return f;
    }
    /// The switches as they apply at head dimension `d` (the d = 64 shape of step 8, the d = 128 ring of step 15).
    constexpr Features at_head_dim(int d) const {
        Features f = *this;
        if (d == 64 && consumers_d64 > 0) {
            f.consumers = consumers_d64;
            f.consumer_registers = consumer_registers_d64;
            f.lazy_rescale = false;  // step 17: no room in 160 registers (see with_lazy_rescale())
        }
        if (d == 128 && split_ring_d128 > 0) {
            f.split_ring = true;
            f.stages = split_ring_d128;
        }
        return f;
    }
    constexpr int br() const { return 64 * consumers; }                      ///< query rows per block
    constexpr int threads() const { return 128 * (consumers + (producer ? 1 : 0)); }  ///< threads per block
    /// Registers per thread a block is launched with: the 64 K of an SM's register file shared by
    /// `blocks_per_sm` blocks, in the granules of 8 the hardware allocates, at most 255;
    /// setmaxnreg then moves them between the block's warpgroups.
    constexpr int launch_registers() const {
        const int per_thread = 65536 / (threads() * blocks_per_sm) / 8 * 8;
        return per_thread < 255 ? per_thread : 255;
    }
};
//! [features]

/// Pointers, strides (in elements), sizes and tensor maps the kernel reads.
template <class T>
struct Args {
    CUtensorMap q_map;  ///< (B, H, Nq, d) boxes [Br, 64] (TMA steps only)
    CUtensorMap k_map;  ///< (B, H, Nk, d) boxes [Bc, 64]
    CUtensorMap v_map;  ///< (B, H, Nk, d) boxes [Bc, 64]
    CUtensorMap o_map;  ///< (B, H, Nq, d) boxes [64, 64] (the TMA-store epilogue only)
    const T* q;  ///< (B, H, Nq, d): row n of head (b, h) at q + b*q_sb + h*q_sh + n*q_sn
    const T* k;  ///< (B, H, Nk, d)
    const T* v;  ///< (B, H, Nk, d)
    T* o;        ///< (B, H, Nq, d)
    float* lse;  ///< (B, H, Nq)
    int64_t q_sb;  ///< batch stride of q (the feature stride is 1)
    int64_t q_sh;  ///< head stride of q
    int64_t q_sn;  ///< row stride of q
    int64_t k_sb;  ///< batch stride of k
    int64_t k_sh;  ///< head stride of k
    int64_t k_sn;  ///< row stride of k
    int64_t v_sb;  ///< batch stride of v
    int64_t v_sh;  ///< head stride of v
    int64_t v_sn;  ///< row stride of v
    int64_t o_sb;  ///< batch stride of o
    int64_t o_sh;  ///< head stride of o
    int64_t o_sn;  ///< row stride of o
    int64_t lse_sb;  ///< batch stride of lse
    int64_t lse_sh;  ///< head stride of lse
    int64_t lse_sn;  ///< row stride of lse
    int heads;        ///< H
    int batch_heads;  ///< B * H
    int q_tiles;      ///< query tiles per (batch, head): ceil(Nq / Br)
    int group_heads;  ///< step 6 on, causal: (batch, head) pairs per group of the block order (schedule.hpp)
    int seq_q;        ///< Nq
    int seq_k;        ///< Nk
    bool causal;      ///< bottom-right aligned causal mask
    bool negate_s;    ///< the scale is negative: S's sign is flipped and |scale| used (exact)
    float scale;      ///< |softmax scale| (at least FLT_MIN)
    float scale_log2; ///< |softmax scale| * log2(e)
    unsigned* work_counter;  ///< persistent grid: the next work item to hand out (zero at launch)
    fa::cuda::TimelineMark* timeline;  ///< instrumented build: warpgroups x kTimelineMarks marks, written by one block
    int timeline_block;                ///< instrumented build: the block that records
};

/// Shape constants of one kernel instance.
template <class T, int D, class Step>
struct Shape {
    static constexpr Features kF = Step::value.at_head_dim(D);  ///< the step's switches at this d
    static_assert(sizeof(T) == 2, "wgmma operands are 16-bit here");
    static_assert(D == 64 || D == 128, "d is 64 or 128 (whole 64-column swizzled boxes; the S and O accumulators fit)");
    static_assert(kF.bc % 16 == 0 && kF.bc >= 16 && kF.bc <= 256, "Bc is a wgmma N for S and a multiple of P V's k");
    static_assert(!kF.ping_pong || kF.producer, "ping-pong passes turns between consumer warpgroups of a producer step");
    static_assert(!kF.overlap || kF.ping_pong, "the overlap inside a warpgroup is written on the rotated loop of ping-pong");
    static_assert(!kF.tma_store || kF.producer, "the TMA-store epilogue synchronizes one consumer warpgroup at a time");
    static_assert(kF.consumers <= 4, "named barriers: 1..4 pass the turns, 5..8 order the epilogues");
    static_assert(!kF.timeline || kF.producer, "the timeline records a producer warpgroup and its consumers");
    static_assert(!kF.persistent || (kF.ping_pong && !kF.tma_store),
                  "the persistent grid passes the turns from item to item, and Q's buffer is not free for O");
    static_assert(!kF.wide_stores || kF.persistent, "the wide stores rearrange the persistent grid's plain-store epilogue");
    static_assert(!kF.producer ||
                      kF.producer_registers + kF.consumers * kF.consumer_registers <= (kF.consumers + 1) * kF.launch_registers(),
                  "setmaxnreg: the warpgroups' registers fit what the block is launched with (64 K per SM, shared by its blocks)");
    static_assert(kF.blocks_per_sm == 1 || kF.persistent, "several blocks per SM: written for the persistent grid");
    static_assert(!kF.split_ring || kF.persistent, "K and V on rings of their own: written for the persistent grid");
    static constexpr int kBr = kF.br();            ///< query rows per block
    static constexpr int kBc = kF.bc;              ///< keys per tile
    static constexpr int kThreads = kF.threads();  ///< threads per block
    static constexpr int kQBytes = kBr * D * 2;    ///< the Q tile
    static constexpr int kKVBytes = kBc * D * 2;   ///< one K (or V) tile
    static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "every tile starts on a 1024-byte boundary (the swizzle's atom)");
    /// Step 12: the ints of one mailbox entry, an item decoded (head b and h, first row, key tiles
    /// full and end: five, and one to keep entries 8-byte aligned).
    static constexpr int kEntryInts = 6;
    /// The persistent grid's mailbox in 8-byte words: two entries, each an item's number, or from
    /// step 12 each an item decoded.
    static constexpr int kMailboxWords = kF.claim_ahead ? kEntryInts : 2;
    //! [split_ring]
    /// Slots with a full and an empty barrier each: a slot holds K and V (`stages`), or with
    /// step 15's split ring K's `stages` slots come first and V's after them.
    static constexpr int kSlots = kF.split_ring ? 2 * kF.stages : kF.stages;
    /// Byte offset in the ring of the K tile of the ring's tile `k` (the block's K/V tiles counted
    /// from its first item): slot k % stages, K then V in one slot, or K's ring then V's.
    __host__ __device__ static constexpr int k_offset(int k) { return (kF.split_ring ? 1 : 2) * (k % kF.stages) * kKVBytes; }
    /// Byte offset in the ring of the V tile of the ring's tile `k`.
    __host__ __device__ static constexpr int v_offset(int k) {
        return kF.split_ring ? (kF.stages + k % kF.stages) * kKVBytes : k_offset(k) + kKVBytes;
    }
    /// The full barrier of the ring's K tile `k` (barrier 0 is Q's).
    __host__ __device__ static constexpr int k_full(int k) { return 1 + k % kF.stages; }
    /// The full barrier of the ring's V tile `k`: K's, unless the ring is split.
    __host__ __device__ static constexpr int v_full(int k) { return kF.split_ring ? 1 + kF.stages + k % kF.stages : k_full(k); }
    /// The empty barrier of the ring's K tile `k`: kSlots after its full one.
    __host__ __device__ static constexpr int k_empty(int k) { return 1 + kSlots + k % kF.stages; }
    /// The empty barrier of the ring's V tile `k`.
    __host__ __device__ static constexpr int v_empty(int k) { return 1 + kSlots + (kF.split_ring ? kF.stages : 0) + k % kF.stages; }
    /// The phase of round k / stages of a slot: what a wait on its full barrier (or, one round on, its empty one) waits for.
    __host__ __device__ static constexpr uint32_t round_parity(int k) { return uint32_t((k / kF.stages) & 1); }
    //! [split_ring]
    /// The mbarriers: Q's, a full and an empty one per slot; the persistent grid's Q empty, its
    /// mailbox's item-full and item-empty pairs, and the mailbox.
    static constexpr int kBarrierBytes = 8 * (1 + 2 * kSlots + (kF.persistent ? 5 + kMailboxWords : 0));
    /// Shared memory without O's buffer: 1024 bytes of slack to align, Q, stages x (K, V), the barriers.
    static constexpr size_t kSmemBytesWithoutO = 1024 + size_t(kQBytes) + 2 * size_t(kF.stages) * kKVBytes + kBarrierBytes;
    //! [staged_buffer]
    /// Step 13: O's own buffer (a [Br, d] tile, as Q's) where the SM's 228 KB holds blocks_per_sm
    /// blocks with it, each with the 1 KB the hardware keeps per block (not the small blocks, three
    /// to an SM).
    static constexpr bool kStaged =
        kF.staged_store && kF.persistent && (kSmemBytesWithoutO + kQBytes + 1024) * kF.blocks_per_sm <= 228 * 1024;
    static constexpr int kOBytes = kStaged ? kQBytes : 0;  ///< O's buffer: Br rows of d
    //! [staged_buffer]
    /// Shared memory: the slack, Q, the ring, O's buffer (step 13) between the ring and the barriers.
    static constexpr size_t kSmemBytes = kSmemBytesWithoutO + size_t(kOBytes);
};

//! [key_tiles]
/// The key tiles of the query tile `[q0, q0 + br)`: `[0, full)` every row sees in full (no
/// mask), `[full, end)` some row sees in part (masked), the rest no row sees (skipped).
__host__ __device__ inline void key_tiles(int q0, int br, int bc, int seq_q, int seq_k, bool causal, int& full, int& end) {
    const int q_last = (q0 + br < seq_q ? q0 + br : seq_q) - 1;
    const int fewest = int(visible_key_end(q0, seq_q, seq_k, causal));
    const int most = int(visible_key_end(q_last, seq_q, seq_k, causal));
    full = fewest / bc;
    end = (most + bc - 1) / bc;
}
//! [key_tiles]

namespace detail {

using namespace fa::cuda::ptx;
namespace wl = fa::cuda::wgmma_layout;

/// Copies rows `[row0, row0 + kRows)` of a [n_rows, D] global matrix into a shared tile in the
/// layout the TMA would leave (D / 64 swizzled boxes of [kRows, 64], wgmma_layout::tile_offset)
/// with 16-byte cp.async copies spread over `threads` threads; rows past `n_rows` are zero.
template <class T, int D, int kRows>
__device__ __forceinline__ void load_tile_cp_async(unsigned char* tile, const T* gmem, int64_t row_stride, int row0, int n_rows,
                                                   int thread, int threads) {
    constexpr int kChunksPerRow = D / 8;
    const uint32_t base = smem_address(tile);
    for (int i = thread; i < kRows * kChunksPerRow; i += threads) {
        const int r = i / kChunksPerRow, c = (i % kChunksPerRow) * 8;
        const bool valid = row0 + r < n_rows;
        const T* src = valid ? gmem + int64_t(row0 + r) * row_stride + c : gmem;
        cp_async_16(base + wl::tile_offset(kRows, r, c), src, valid);
    }
}

// A row of the wgmma accumulator lives in one quad of lanes, as in mma.sync's C fragment (see
// wgmma_layout.hpp): its max and sum are fa::cuda::quad_max and quad_sum (fa/cuda/fragments.cuh).
using fa::cuda::quad_max;
using fa::cuda::quad_sum;

/// What one consumer warpgroup keeps in registers across the K/V tiles (per thread).
template <int D>
struct ConsumerState {
    float o[D / 2];  ///< O_c accumulator, unnormalized (wgmma_layout::accumulator_element)
    float m[2];      ///< running max of the raw scores of this thread's rows g and g + 8
    float l[2];      ///< running sum of P over this thread's columns of those rows

    /// The state before the first K/V tile: O = 0, m = -inf, l = 0.
    __device__ __forceinline__ void clear() {
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.0f;
    }
};

// Named barriers (0 is __syncthreads').
constexpr uint32_t kTurnBarrier = 1;      ///< consumer warpgroup c waits for its turn on named barrier kTurnBarrier + c
constexpr uint32_t kTurnThreads = 256;    ///< threads on a turn barrier: the warpgroup that waits and the one that opens it
constexpr uint32_t kEpilogueBarrier = 5;  ///< consumer warpgroup c orders its epilogue's shared-memory writes on kEpilogueBarrier + c

/// The named barrier on which consumer warpgroup `consumer` waits for its turn.
__device__ __forceinline__ uint32_t turn_barrier(int consumer) { return kTurnBarrier + uint32_t(consumer); }

//! [gemms]
/// Issues S = Q_c K_j^T (not committed): d/16 wgmma, each 64 x Bc x 16, both operands K-major
/// from shared memory (SS). `s` belongs to the tensor cores until the group is waited for.
template <class T, int D, class Step>
__device__ __forceinline__ void issue_s(float (&s)[Shape<T, D, Step>::kBc / 2], uint32_t q_rows, uint32_t k_tile) {
    using S = Shape<T, D, Step>;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
        wgmma_m64nNk16_ss<S::kBc, T>(s, wl::k_major_descriptor(q_rows, S::kBr, ks), wl::k_major_descriptor(k_tile, S::kBc, ks),
                                     ks > 0, false);
    }
}

/// Issues O_c += P V_j (not committed): Bc/16 wgmma, each 64 x d x 16; P from registers (RS),
/// V [keys, d] as B stored MN-major (read transposed).
template <class T, int D, class Step>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&p)[Shape<T, D, Step>::kBc / 16][4], uint32_t v_tile) {
    using S = Shape<T, D, Step>;
#pragma unroll
    for (int kk = 0; kk < S::kBc / 16; ++kk) wgmma_m64nNk16_rs<D, T>(o, p[kk], wl::mn_major_descriptor(v_tile, S::kBc, kk), true, true);
}
//! [gemms]

//! [softmax]
/// The online softmax of one tile of scores, in place: `s` (this thread's part of S_ij) becomes
/// exp2(S*scale*log2e - m_new*scale*log2e); m_i and l_i are updated, and `alpha` receives the
/// factor O must be rescaled by (rescale_o). O itself is not touched, so this may run while a
/// wgmma still accumulates into O (step 5).
/// kMask: compare every key with its row's visible end (diagonal tiles and the last tile).
/// Returns whether O must be rescaled: always, except with step 17's lazy rescale, where it is
/// false when no row of the warp changed its maximum (alpha = 1 for all of them); the value is
/// the same in every lane of the warp.
template <class T, int D, class Step, bool kMask>
__device__ __forceinline__ bool online_softmax(ConsumerState<D>& st, float (&s)[Shape<T, D, Step>::kBc / 2], float (&alpha)[2],
                                               int row_lo, int kv0, const Args<T>& a, int thread) {
    constexpr int kBc = Shape<T, D, Step>::kBc;
    constexpr Features kF = Shape<T, D, Step>::kF;
    constexpr bool kLazy = kF.lazy_rescale;
    bool moved = false;  // step 17: some row of this thread took a new maximum
    const int t = (thread % 32) % 4;
    if (a.negate_s) {  // scale < 0: S * scale = (-S) * |scale|, and flipping a sign is exact
#pragma unroll
        for (int i = 0; i < kBc / 2; ++i) s[i] = -s[i];
    }
    if constexpr (kMask) {
        // Row of register pair h: row_lo + 8h. Key of register 4i + 2h + e: kv0 + 8i + 2t + e.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row_lo + 8 * h;
            const int visible = int(visible_key_end(row, a.seq_q, a.seq_k, a.causal));
#pragma unroll
            for (int i = 0; i < kBc / 8; ++i)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (kv0 + 8 * i + 2 * t + e >= visible) s[4 * i + 2 * h + e] = -INFINITY;
        }
    }
    // Row by row: a quad (4 lanes) holds a whole row of S.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float row_max = st.m[h];
#pragma unroll
        for (int i = 0; i < kBc / 8; ++i) row_max = fmaxf(row_max, fmaxf(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]));
        row_max = quad_max(row_max);
        //! [lazy_rescale]
        if constexpr (kLazy) {
            // Step 17: the row keeps its maximum unless the tile's exceeds it by more than the slack
            // (in exp2's units). A row that has seen no key (m = -inf) takes any finite maximum:
            // inf > slack. Both -inf: NaN > slack is false, and -inf stays.
            if (!((row_max - st.m[h]) * a.scale_log2 > float(kF.rescale_slack_log2))) row_max = st.m[h];
            moved = moved || row_max != st.m[h];
        }
        //! [lazy_rescale]
        // A row that has seen no key keeps m = -inf; subtracting 0 keeps exp2(-inf) = 0, not NaN.
        const float m_scaled = (row_max == -INFINITY ? 0.0f : row_max) * a.scale_log2;
        alpha[h] = kLazy && row_max == st.m[h] ? 1.0f : ex2(st.m[h] * a.scale_log2 - m_scaled);
        float row_sum = 0.0f;
#pragma unroll
        for (int i = 0; i < kBc / 8; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& x = s[4 * i + 2 * h + e];
                x = ex2(fmaf(x, a.scale_log2, -m_scaled));
                row_sum += x;
            }
        st.m[h] = row_max;
        st.l[h] = st.l[h] * alpha[h] + row_sum;  // this lane's columns; the quad sums at the end
    }
    if constexpr (kLazy) return __any_sync(0xffffffffu, moved);  // one value for the warp: its branch stays uniform
    return true;
}

/// O_c *= alpha, row by row (registers 4i + 2h + e belong to row pair h).
template <int D>
__device__ __forceinline__ void rescale_o(ConsumerState<D>& st, const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) st.o[4 * i + e] *= alpha[e / 2];
}

/// P as the A operand: the accumulator of 16 keys is, register for register, the A layout of
/// one k-slice (wgmma_layout::accumulator_index_for_a): round and pack, no shuffle.
template <class T, int kBc>
__device__ __forceinline__ void pack_p(const float (&s)[kBc / 2], uint32_t (&p)[kBc / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) p[kk][r] = pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}
//! [softmax]

//! [consume_tile]
/// One K/V tile for one consumer warpgroup, one thing after the other: S = Q_c K_j^T, the
/// online softmax, O_c += P V_j. `q_rows`: shared address of this warpgroup's 64 rows of Q;
/// `k_tile`, `v_tile`: the slot.
/// `marks` records the instrumented build's timeline (timeline.hpp); tile `tile` is the K/V tile.
template <class T, int D, class Step, bool kMask, class Marks>
__device__ __forceinline__ void consume_tile(ConsumerState<D>& st, uint32_t q_rows, uint32_t k_tile, uint32_t v_tile,
                                             int row_lo, int tile, const Args<T>& a, int thread, Marks& marks) {
    constexpr int kBc = Shape<T, D, Step>::kBc;
    float s[kBc / 2];
    wgmma_fence();  // the registers of s are free for the wgmma to write
    issue_s<T, D, Step>(s, q_rows, k_tile);
    wgmma_commit_group();
    marks.mark(kMarkIssued, tile);
    wgmma_wait_group<0>();  // S is in registers
    warpgroup_fence_operands(s);
    marks.mark(kMarkSReady, tile);

    float alpha[2];
    online_softmax<T, D, Step, kMask>(st, s, alpha, row_lo, tile * kBc, a, thread);
    marks.mark(kMarkSoftmax, tile);
    rescale_o(st, alpha);
    uint32_t p[kBc / 16][4];
    pack_p<T, kBc>(s, p);
    marks.mark(kMarkRescaled, tile);

    wgmma_fence();  // O was rescaled and P written by ordinary instructions
    issue_pv<T, D, Step>(st.o, p, v_tile);
    wgmma_commit_group();
    marks.mark(kMarkIssued, tile);
    wgmma_wait_group<0>();  // O is in registers, and the K and V slots are no longer read
    warpgroup_fence_operands(st.o);
    marks.mark(kMarkPVDone, tile);
}
//! [consume_tile]

/// Writes the LSE of row `row` of head (b, h) from its running max `m` (raw score) and its
/// whole sum `l`: LSE = ln(sum_j exp(scale*s_j)) = m*|scale| + ln(l), natural-log units; -inf for
/// a row that saw no key.
template <class T>
__device__ __forceinline__ void store_lse(const Args<T>& a, int b, int h, int row, float m, float l) {
    a.lse[b * a.lse_sb + h * a.lse_sh + row * a.lse_sn] = l > 0.0f ? m * a.scale + logf(l) : -INFINITY;
}

//! [wide_stores]
/// Step 10's words for one run of four 8-column blocks (4k to 4k + 3) of this thread's row pair
/// `hh`: its two columns of each block, times `inv` and rounded, then transposed inside the quad,
/// after which words[j] is lane j's two columns of block 4k + t (this lane's whole block, in order).
template <class T, int D>
__device__ __forceinline__ void wide_words(const ConsumerState<D>& st, int hh, int k, float inv, int t, uint32_t (&words)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int i = 4 * k + j;
        words[j] = pack2<T>(st.o[4 * i + 2 * hh] * inv, st.o[4 * i + 2 * hh + 1] * inv);
    }
    fa::cuda::quad_transpose(words, t);
}

/// Normalizes O, writes this warpgroup's rows of O and their LSE (rows past Nq are skipped).
///
/// Lane t of a quad holds columns 2t and 2t + 1 of every 8-column block of its two rows. Without
/// `kWide` each lane stores those two columns (4 bytes) per block. With `kWide` (step 10) the quad
/// first transposes the words it holds for each run of four blocks (fa::cuda::quad_transpose),
/// after which lane t holds the whole block 4k + t, eight columns in order, and stores them at once
/// (16 bytes). Every lane shuffles, rows past Nq included; only the stores are skipped for those
/// rows.
template <class T, int D, bool kWide = false>
__device__ __forceinline__ void write_output(ConsumerState<D>& st, const Args<T>& a, int b, int h, int row_lo, int thread) {
    const int t = (thread % 32) % 4;
    T* o_head = a.o + b * a.o_sb + h * a.o_sh;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const float l = quad_sum(st.l[hh]);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // l = 0: the row saw no key, O = 0
        const int row = row_lo + 8 * hh;
        if constexpr (kWide) {
            T* o_row = o_head + int64_t(row) * a.o_sn;
#pragma unroll
            for (int k = 0; k < D / 32; ++k) {
                uint32_t words[4];
                wide_words<T, D>(st, hh, k, inv, t, words);  // words[j]: lane j's two columns of block 4k + t
                if (row < a.seq_q) {
                    *reinterpret_cast<uint4*>(o_row + 8 * (4 * k + t)) = make_uint4(words[0], words[1], words[2], words[3]);
                }
            }
            if (t == 0 && row < a.seq_q) store_lse(a, b, h, row, st.m[hh], l);
        } else if (row < a.seq_q) {
            T* o_row = o_head + int64_t(row) * a.o_sn;
#pragma unroll
            for (int i = 0; i < D / 8; ++i) {
                *reinterpret_cast<uint32_t*>(o_row + 8 * i + 2 * t) =
                    pack2<T>(st.o[4 * i + 2 * hh] * inv, st.o[4 * i + 2 * hh + 1] * inv);
            }
            if (t == 0) store_lse(a, b, h, row, st.m[hh], l);
        }
    }
}
//! [wide_stores]

//! [batched_epilogue]
/// Step 14: write_output()'s wide stores in one batch. Both rows' sums and normalization, then
/// the quad transposes of both rows (independent shuffles, whose latencies overlap), then the
/// stores, then the LSE (one lane of four, under a branch that no longer splits the work).
template <class T, int D>
__device__ __forceinline__ void write_output_batched(ConsumerState<D>& st, const Args<T>& a, int b, int h, int row_lo, int thread) {
    const int t = (thread % 32) % 4;
    T* o_head = a.o + b * a.o_sb + h * a.o_sh;
    float l[2], inv[2];
    uint32_t words[2][D / 32][4];  // words[hh][k][j]: after the transpose, lane j's two columns of block 4k + t
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        l[hh] = quad_sum(st.l[hh]);
        inv[hh] = l[hh] > 0.0f ? 1.0f / l[hh] : 0.0f;  // l = 0: the row saw no key, O = 0
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int k = 0; k < D / 32; ++k) wide_words<T, D>(st, hh, k, inv[hh], t, words[hh][k]);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int row = row_lo + 8 * hh;
        T* o_row = o_head + int64_t(row) * a.o_sn;
        if (row < a.seq_q) {
#pragma unroll
            for (int k = 0; k < D / 32; ++k) {
                *reinterpret_cast<uint4*>(o_row + 8 * (4 * k + t)) =
                    make_uint4(words[hh][k][0], words[hh][k][1], words[hh][k][2], words[hh][k][3]);
            }
        }
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int row = row_lo + 8 * hh;
        if (t == 0 && row < a.seq_q) store_lse(a, b, h, row, st.m[hh], l[hh]);
    }
}
//! [batched_epilogue]

/// Runs tiles [0, end) for one consumer warpgroup, the masked ones from `full` on; `slot_ready`
/// (tile) blocks until the tile's K and V are in their slot, `slot_done(tile)` says they have
/// been read.
template <class T, int D, class Step, class Ready, class Done, class Marks>
__device__ __forceinline__ void consume_tiles(ConsumerState<D>& st, uint32_t q_tile, unsigned char* kv_ring, int full, int end,
                                              int row_lo, const Args<T>& a, int thread, Ready slot_ready, Done slot_done,
                                              Marks& marks) {
    using S = Shape<T, D, Step>;
    for (int tile = 0; tile < end; ++tile) {
        slot_ready(tile);
        marks.mark(kMarkSlotFull, tile);
        const int slot = tile % S::kF.stages;
        const uint32_t k_tile = smem_address(kv_ring + 2 * slot * S::kKVBytes);
        const uint32_t v_tile = k_tile + S::kKVBytes;
        if (tile < full) {
            consume_tile<T, D, Step, false>(st, q_tile, k_tile, v_tile, row_lo, tile, a, thread, marks);
        } else {
            consume_tile<T, D, Step, true>(st, q_tile, k_tile, v_tile, row_lo, tile, a, thread, marks);
        }
        slot_done(tile);
    }
}

//! [consume_pipelined]
/// Steps 4 and 5: the loop of consume_tiles, rotated so that the GEMMs between two softmaxes of
/// this warpgroup, S_j = Q K_j^T and P_{j-1} V_{j-1}, are issued together in one *turn*:
///
///     turn: S_0                          softmax 0
///     turn: S_1, P_0 V_0                 softmax 1     (step 5: while P_0 V_0 still runs)
///     ...
///     turn: P_{end-1} V_{end-1}
///
/// Warpgroup c waits on named barrier kTurnBarrier + c before issuing, and opens the next
/// warpgroup's barrier once its wgmma are issued: the tensor cores take the warpgroups' GEMMs in
/// turn, and each one's softmax runs while the next one's GEMMs keep the tensor cores busy.
/// Every consumer takes end + 1 turns, so the turns stay matched.
///
/// The persistent grid (step 9) runs this once per work item with the turns passed on from item to
/// item: warpgroup 0 opens its own first turn only on the block's first item (`first_item`), and
/// the last warpgroup's last turn always opens warpgroup 0's next one (run_persistent() takes the
/// one left open when the items run out). K/V tile `tile` of
/// the item is the block's tile `ring_base + tile` in the ring; `q_done()` runs once S_{end-1},
/// the item's last read of Q, is in registers.
///
/// `slot_ready(tile)` blocks until the tile's K (and V, in one slot) have landed, `v_ready(tile)`
/// until its V has (step 15: V_j is waited for at the turn that reads it, one after K_j's),
/// `k_read(tile)` runs once S_tile is in registers (K_tile's last read: step 15 frees its slot
/// there), `slot_done(tile)` once P_tile V_tile is done (the slot of V, or of K and V, is free).
template <class T, int D, class Step, class Ready, class VReady, class KRead, class Done, class Marks, class QDone>
__device__ __forceinline__ void consume_tiles_pipelined(ConsumerState<D>& st, uint32_t q_rows, unsigned char* kv_ring, int full,
                                                        int end, int row_lo, const Args<T>& a, int thread, int consumer,
                                                        Ready slot_ready, VReady v_ready, KRead k_read, Done slot_done,
                                                        Marks& marks, int ring_base, bool first_item, QDone q_done) {
    using S = Shape<T, D, Step>;
    constexpr Features kF = S::kF;
    constexpr int kBc = S::kBc;
    const auto k_tile = [&](int tile) { return smem_address(kv_ring + S::k_offset(ring_base + tile)); };
    const auto v_tile = [&](int tile) {
        // S::kF, not the local kF: nvcc does not take a local read inside a lambda as a constant.
        if constexpr (S::kF.split_ring) return smem_address(kv_ring + S::v_offset(ring_base + tile));
        return k_tile(tile) + uint32_t(S::kKVBytes);  // V follows K in its slot
    };
    const uint32_t my_turn = turn_barrier(consumer), next_turn = turn_barrier((consumer + 1) % kF.consumers);
    // This warpgroup's GEMMs wait until the previous warpgroup has issued its own. A block of one
    // consumer (step 11's small blocks) takes no turns: the blocks an SM holds interleave instead.
    constexpr bool kTurns = kF.consumers > 1;
    const auto turn_begin = [&] {
        if constexpr (kTurns) named_barrier_sync(my_turn, kTurnThreads);
    };
    // Issued: the next warpgroup may issue. The last turn of the last warpgroup opens nothing
    // (except in the persistent grid, where the next item follows), so no barrier is left
    // half-arrived when the block ends.
    const auto turn_end = [&](bool last) {
        if constexpr (kTurns) {
            if (!(last && !kF.persistent && consumer == kF.consumers - 1)) named_barrier_arrive(next_turn, kTurnThreads);
        }
    };
    // Returns whether O must be rescaled (online_softmax()).
    const auto softmax = [&](float (&s)[kBc / 2], float (&alpha)[2], int tile) {
        if (tile < full) return online_softmax<T, D, Step, false>(st, s, alpha, row_lo, tile * kBc, a, thread);
        return online_softmax<T, D, Step, true>(st, s, alpha, row_lo, tile * kBc, a, thread);
    };

    float s[kBc / 2];       // S_j, then P_j in float32
    uint32_t p[kBc / 16][4];  // P_{j-1}, the A operand of the turn's P V
    float alpha[2];
    if (kTurns && consumer == 0 && first_item) named_barrier_arrive(my_turn, kTurnThreads);  // warpgroup 0 takes the first turn

    slot_ready(0);
    marks.mark(kMarkSlotFull, 0);
    turn_begin();
    marks.mark(kMarkTurn, 0);
    wgmma_fence();  // s is free for the wgmma to write
    issue_s<T, D, Step>(s, q_rows, k_tile(0));
    wgmma_commit_group();
    turn_end(false);
    marks.mark(kMarkIssued, 0);
    wgmma_wait_group<0>();  // S_0 is in registers
    warpgroup_fence_operands(s);
    marks.mark(kMarkSReady, 0);
    k_read(0);               // K_0 is no longer read (step 15 frees its slot)
    if (end == 1) q_done();  // Q's last reader has finished
    const bool rescale_0 = softmax(s, alpha, 0);
    marks.mark(kMarkSoftmax, 0);
    if (rescale_0) rescale_o(st, alpha);  // O is 0; kept so that every tile does the same
    pack_p<T, kBc>(s, p);
    marks.mark(kMarkRescaled, 0);

    for (int tile = 1; tile < end; ++tile) {
        slot_ready(tile);
        v_ready(tile - 1);
        marks.mark(kMarkSlotFull, tile);
        turn_begin();
        marks.mark(kMarkTurn, tile);
        wgmma_fence();  // O was rescaled, P and s written by ordinary instructions
        issue_s<T, D, Step>(s, q_rows, k_tile(tile));
        wgmma_commit_group();  // group 1: S_j
        issue_pv<T, D, Step>(st.o, p, v_tile(tile - 1));
        wgmma_commit_group();  // group 2: P_{j-1} V_{j-1}
        turn_end(false);
        marks.mark(kMarkIssued, tile);
        //! [overlap]
        if constexpr (kF.overlap) {
            wgmma_wait_group<1>();  // S_j is in registers; P_{j-1} V_{j-1} may still run
        } else {
            wgmma_wait_group<0>();  // both are done
        }
        warpgroup_fence_operands(s);
        marks.mark(kMarkSReady, tile);
        k_read(tile);                   // K_j is no longer read
        if (tile == end - 1) q_done();  // Q's last reader has finished
        float alpha_j[2];
        const bool rescale = softmax(s, alpha_j, tile);  // touches s, m_i, l_i: not O, not p
        marks.mark(kMarkSoftmax, tile);
        if constexpr (kF.overlap) {
            wgmma_wait_group<0>();  // P_{j-1} V_{j-1} is done: O and p are free
            marks.mark(kMarkPVDone, tile - 1);
        }
        //! [overlap]
        // O and P_j are computed from values read after the wait: neither is written while
        // P_{j-1} V_{j-1} may still read p and accumulate into O.
        warpgroup_fence_operands(st.o);
        warpgroup_fence_operands(s);
        slot_done(tile - 1);  // V_{j-1} (and K_{j-1}) are no longer read
        if (rescale) rescale_o(st, alpha_j);  // step 17: only when a row of the warp took a new maximum
        pack_p<T, kBc>(s, p);
        marks.mark(kMarkRescaled, tile);
    }

    v_ready(end - 1);
    turn_begin();
    marks.mark(kMarkTurn, end);
    wgmma_fence();  // O was rescaled and P written by ordinary instructions
    issue_pv<T, D, Step>(st.o, p, v_tile(end - 1));
    wgmma_commit_group();
    turn_end(true);
    marks.mark(kMarkIssued, end);
    wgmma_wait_group<0>();  // O is complete
    warpgroup_fence_operands(st.o);
    marks.mark(kMarkPVDone, end - 1);
    slot_done(end - 1);
}
//! [consume_pipelined]

//! [pass_turns]
/// Step 16: an item's K/V tiles for a consumer warpgroup whose 64 rows all lie past Nq. It waits for
/// the same tiles, takes the same end + 1 turns and arrives on the same barriers as
/// consume_tiles_pipelined(), in the same order, so that every barrier's count and phase are what
/// the other warpgroups and the producer expect; but it issues no GEMM and computes no softmax, so
/// each of its turns opens the next warpgroup's as soon as it begins. Persistent grid only (its
/// last turn opens the next item's), and never warpgroup 0, whose rows start the item before Nq
/// (so it never opens a block's first turn).
template <int kConsumers, class Ready, class VReady, class KRead, class Done, class QDone>
__device__ __forceinline__ void pass_turns(int end, int consumer, Ready slot_ready, VReady v_ready, KRead k_read, Done slot_done,
                                           QDone q_done) {
    const uint32_t my_turn = turn_barrier(consumer), next_turn = turn_barrier((consumer + 1) % kConsumers);
    for (int turn = 0; turn <= end; ++turn) {  // turn j would issue S_j = Q K_j^T and P_{j-1} V_{j-1}
        if (turn < end) slot_ready(turn);
        if (turn > 0) v_ready(turn - 1);
        named_barrier_sync(my_turn, kTurnThreads);
        named_barrier_arrive(next_turn, kTurnThreads);
        if (turn < end) {
            k_read(turn);
            if (turn == end - 1) q_done();
        }
        if (turn > 0) slot_done(turn - 1);
    }
}
//! [pass_turns]

//! [tma_store]
/// Step 7's epilogue: normalizes O and rounds it into this warpgroup's 64 rows of the Q tile,
/// swizzled as the TMA would load them (Q is no longer read: the last S = Q K^T has finished),
/// then one thread stores each [64, 64] box with the TMA, which leaves out the rows past Nq.
/// LSE goes straight to global memory, one float per row.
template <class T, int D, class Step, bool kStaged = false>
__device__ __forceinline__ void write_output_tma(ConsumerState<D>& st, const Args<T>& a, int b, int h, int q0, int consumer,
                                                 unsigned char* q_tile, int thread) {
    using S = Shape<T, D, Step>;
    const int warp = thread / 32, g = (thread % 32) / 4, t = (thread % 32) % 4;
    unsigned char* rows = q_tile + consumer * 64 * wl::kSwizzleBytes;  // row 64c of box 0; box k is k * Br * 128 further
    if constexpr (kStaged) {
        // Step 13: O's own buffer. The store this warpgroup left running at its last item has read
        // these rows before any thread writes them again.
        if (thread == 0) bulk_wait_group_read<0>();
        named_barrier_sync(kEpilogueBarrier + uint32_t(consumer), 128);
    } else {
        fence_proxy_async();  // the wgmma's reads of these Q rows (async proxy) come before the plain stores below
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const float l = quad_sum(st.l[hh]);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // l = 0: the row saw no key, O = 0
        const int r = 16 * warp + g + 8 * hh;           // row in the warpgroup's 64
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
            const int col = 8 * i + 2 * t;
            // A warp's 32 lanes write 8 rows x 16 bytes; the swizzle puts them in 32 distinct banks.
            *reinterpret_cast<uint32_t*>(rows + (col / 64) * S::kBr * wl::kSwizzleBytes + wl::swizzle128_offset(r, col % 64)) =
                pack2<T>(st.o[4 * i + 2 * hh] * inv, st.o[4 * i + 2 * hh + 1] * inv);
        }
        const int row = q0 + 64 * consumer + r;
        if (t == 0 && row < a.seq_q) store_lse(a, b, h, row, st.m[hh], l);
    }
    fence_proxy_async();  // this thread's plain stores are visible to the TMA (the async proxy) ...
    named_barrier_sync(kEpilogueBarrier + uint32_t(consumer), 128);  // ... and every thread of the warpgroup has written
    if (thread == 0) {
#pragma unroll
        for (int box = 0; box < D / 64; ++box) {
            tma_store_4d(&a.o_map, smem_address(rows + box * S::kBr * wl::kSwizzleBytes), 64 * box, q0 + 64 * consumer, h, b);
        }
        bulk_commit_group();
        // The boxes have been read: shared memory may go away with the block (step 13: the next
        // epilogue, or the block's end, waits instead).
        if constexpr (!kStaged) bulk_wait_group_read<0>();
    }
}
//! [tma_store]

/// Initializes the barriers of a producer step's ring (one thread): barrier 0, Q's (one arrival and
/// the bytes), then per slot s a *full* barrier 1 + s (one arrival and the bytes) and an *empty*
/// barrier 1 + stages + s (every consumer thread arrives once it has read the slot).
template <int kStages, int kConsumers, class Bar>
__device__ __forceinline__ void init_ring_barriers(Bar bar) {
    mbarrier_init(bar(0), 1);
    for (int s = 0; s < kStages; ++s) {
        mbarrier_init(bar(1 + s), 1);
        mbarrier_init(bar(1 + kStages + s), 128 * kConsumers);
    }
}

//! [tma_loads]
/// One thread issues the TMA copies of K/V tile `tile` of head (b, h) into `k_dst` (K, then V
/// kKVBytes further; d/64 boxes each) and arms barrier `full_bar` with their bytes. The tensor
/// maps are the kernel parameter's (`&a.k_map`, `&a.v_map`).
template <class T, int D, class Step>
__device__ __forceinline__ void tma_load_kv_tile(const CUtensorMap* k_map, const CUtensorMap* v_map, unsigned char* k_dst,
                                                 uint32_t full_bar, int tile, int h, int b) {
    using S = Shape<T, D, Step>;
    mbarrier_arrive_expect_tx(full_bar, 2u * S::kKVBytes);  // bytes the TMA delivers per K/V tile
#pragma unroll
    for (int box = 0; box < D / 64; ++box) {
        tma_load_4d(smem_address(k_dst + box * S::kBc * 128), k_map, full_bar, 64 * box, tile * S::kBc, h, b);
        tma_load_4d(smem_address(k_dst + S::kKVBytes + box * S::kBc * 128), v_map, full_bar, 64 * box, tile * S::kBc, h, b);
    }
}

/// One thread issues the TMA copies of a [kRows, D] tile of one matrix (`map`: &a.q_map, &a.k_map
/// or &a.v_map), rows [row0, row0 + kRows) of head (b, h), into `dst` (d/64 boxes [kRows, 64]), and
/// arms barrier `bar` with its bytes: the Q tile, or step 15's K or V tile on a barrier of its own.
template <int D, int kRows>
__device__ __forceinline__ void tma_load_tile(const CUtensorMap* map, unsigned char* dst, uint32_t bar, int row0, int h, int b) {
    mbarrier_arrive_expect_tx(bar, uint32_t(kRows * D * 2));
#pragma unroll
    for (int box = 0; box < D / 64; ++box) tma_load_4d(smem_address(dst + box * kRows * 128), map, bar, 64 * box, row0, h, b);
}
//! [tma_loads]

/// The recorder of this thread: with the instrumentation, thread 0 of each warpgroup of block
/// a.timeline_block records (warpgroup w's marks from a.timeline + w * kTimelineMarks), every
/// other thread holds a null recorder; without it, NoTimeline.
template <class Marks, class T>
__device__ __forceinline__ Marks make_marks(const Args<T>& a, int thread) {
    if constexpr (std::is_same_v<Marks, fa::cuda::NoTimeline>) {
        return Marks{};
    } else {
        const bool records = int(blockIdx.x) == a.timeline_block && thread % 128 == 0;
        return Marks(records ? a.timeline + (thread / 128) * kTimelineMarks : nullptr, kTimelineMarks);
    }
}

//! [persistent]
/// Step 9: the whole kernel of a persistent block. The blocks take work items (a query tile of a
/// (batch, head), numbered as the grid of the steps before numbers its blocks) from a counter in
/// global memory, `atomicAdd(a.work_counter, 1)`, in that order: a block that finishes early takes
/// the next item, as the hardware hands a new block to a free SM in the steps before (a fixed
/// share per block, items b, b + grid, ..., measured 0.78x of step 8 under a causal mask: the
/// heaviest-first order gives the low-numbered blocks the heavy item of every stride).
///
/// The producer thread fetches the items and passes each to the consumers through a two-entry
/// mailbox in shared memory (an item-full and an item-empty barrier per entry); a number past
/// the last item tells everyone to stop. Producer and consumers count the items with keys
/// (`rounds`) and their K/V tiles (`ring`) alike, so both sides agree on every barrier's phase:
/// Q's buffer fills on barrier 0 (phase rounds & 1) and empties on the Q-empty barrier once every
/// consumer thread has its item's last S = Q K^T; K/V tile `ring` goes to slot ring % stages as
/// in the steps before. The consumers' turns run on from item to item (consume_tiles_pipelined()).
template <class T, int D, class Step, class Marks>
__device__ __forceinline__ void run_persistent(const Args<T>& a, unsigned char* q_tile, unsigned char* kv_ring, uint64_t* barriers,
                                               Marks& marks, unsigned char* o_tile) {
    using S = Shape<T, D, Step>;
    constexpr Features kF = S::kF;
    const auto bar = [&](int i) { return smem_address(barriers + i); };
    // Barriers after the ring's: Q empty, item full (2), item empty (2); then the mailbox's two entries.
    constexpr int kQEmpty = 1 + 2 * S::kSlots, kItemFull = kQEmpty + 1, kItemEmpty = kQEmpty + 3;
    const uint32_t q_full = bar(0), q_empty = bar(kQEmpty);
    volatile unsigned* mailbox = reinterpret_cast<volatile unsigned*>(barriers + kQEmpty + 5);
    volatile int* posted = reinterpret_cast<volatile int*>(barriers + kQEmpty + 5);  // step 12: entry e at posted + kEntryInts * e
    const int thread = int(threadIdx.x);
    const unsigned items = unsigned(a.q_tiles) * unsigned(a.batch_heads);
    const int group = kF.heaviest_first_grid && a.causal ? a.group_heads : 1;
    // What item w computes: its head, its first query row and its key tiles (as the kernel of the
    // steps before computes them for block w).
    struct Item {
        int b, h, q0, full, end;
    };
    const auto item = [&](unsigned w) {
        const BlockWork work = block_work(w, a.q_tiles, a.batch_heads, a.causal, group);
        Item it{work.bh / a.heads, work.bh % a.heads, work.q_tile * S::kBr, 0, 0};
        key_tiles(it.q0, S::kBr, S::kBc, a.seq_q, a.seq_k, a.causal, it.full, it.end);
        return it;
    };
    const auto tiles_mark = [](int end) { return end < 0xffff ? end : 0xffff; };  // a mark's tile field is 16 bits

    if (thread == 0) {
        init_ring_barriers<S::kSlots, kF.consumers>(bar);  // Q full (barrier 0 = q_full), slots full and empty
        mbarrier_init(q_empty, 128 * kF.consumers);
        for (int e = 0; e < 2; ++e) {
            mbarrier_init(bar(kItemFull + e), 1);
            mbarrier_init(bar(kItemEmpty + e), 128 * kF.consumers);
        }
        fence_mbarrier_init();  // the TMA unit sees the initialized barriers
    }
    __syncthreads();  // the barriers are initialized before either side uses them

    if (thread < 128) {
        setmaxnreg_dec<kF.producer_registers>();  // the producer needs few registers
        if (thread == 0) {
            marks.mark(kMarkStart, 0, true);
            int rounds = 0, ring = 0;
            //! [early_claim]
            // Step 12: the number of the next item, claimed while the current one's last tile loads.
            unsigned claimed = kF.claim_ahead ? atomicAdd(a.work_counter, 1u) : 0u;
            for (int r = 0;; ++r) {
                // The next item nobody has taken (step 12: taken already).
                const unsigned w = kF.claim_ahead ? claimed : atomicAdd(a.work_counter, 1u);
                const int e = r & 1;
                if (r >= 2) mbarrier_wait_parity(bar(kItemEmpty + e), uint32_t((r / 2 - 1) & 1));  // entry e was read
                Item it{0, 0, 0, 0, -1};  // end = -1: no item left
                if constexpr (kF.claim_ahead) {  // step 12: the item decoded here, once for every consumer
                    if (w < items) it = item(w);
                    volatile int* entry = posted + S::kEntryInts * e;
                    entry[0] = it.b, entry[1] = it.h, entry[2] = it.q0, entry[3] = it.full, entry[4] = it.end;
                } else {
                    mailbox[e] = w;
                }
                mbarrier_arrive(bar(kItemFull + e));  // release: the consumers' wait sees the entry
            //! [early_claim]
                if (w >= items) break;
                if constexpr (!kF.claim_ahead) it = item(w);
                marks.mark(kMarkItem, tiles_mark(it.end));
                if (it.end == 0) {  // no key for any row: nothing to load
                    if constexpr (kF.claim_ahead) claimed = atomicAdd(a.work_counter, 1u);
                    continue;
                }
                if (rounds > 0) {
                    mbarrier_wait_parity(q_empty, uint32_t((rounds - 1) & 1));  // every consumer has read the last Q
                    marks.mark(kMarkQEmpty);
                }
                tma_load_tile<D, S::kBr>(&a.q_map, q_tile, q_full, it.q0, it.h, it.b);
                marks.mark(kMarkQIssued);
                ++rounds;
                for (int tile = 0; tile < it.end; ++tile, ++ring) {
                    const int slot = ring % kF.stages;
                    //! [claim_at_last_tile]
                    // Step 12: the atomic's round trip runs while this thread waits for the slot
                    // and the consumers finish the item; its result is first read next round.
                    if constexpr (kF.claim_ahead) {
                        if (tile == it.end - 1) claimed = atomicAdd(a.work_counter, 1u);
                    }
                    //! [claim_at_last_tile]
                    // Round ring / stages refills a slot after round - 1 was consumed: the empty
                    // barrier's phase of the round before.
                    if constexpr (kF.split_ring) {  // step 15: K's slot and V's, each freed on its own
                        const uint32_t emptied = uint32_t((ring / kF.stages - 1) & 1);
                        if (ring >= kF.stages) mbarrier_wait_parity(bar(S::k_empty(ring)), emptied);
                        tma_load_tile<D, S::kBc>(&a.k_map, kv_ring + S::k_offset(ring), bar(S::k_full(ring)), tile * S::kBc, it.h,
                                                 it.b);
                        if (ring >= kF.stages) {
                            mbarrier_wait_parity(bar(S::v_empty(ring)), emptied);
                            marks.mark(kMarkSlotEmpty, tile);
                        }
                        tma_load_tile<D, S::kBc>(&a.v_map, kv_ring + S::v_offset(ring), bar(S::v_full(ring)), tile * S::kBc, it.h,
                                                 it.b);
                    } else {  // steps 9-14: K and V in one slot, on one pair of barriers
                        if (ring >= kF.stages) {
                            mbarrier_wait_parity(bar(1 + kF.stages + slot), uint32_t((ring / kF.stages - 1) & 1));
                            marks.mark(kMarkSlotEmpty, tile);
                        }
                        tma_load_kv_tile<T, D, Step>(&a.k_map, &a.v_map, kv_ring + 2 * slot * S::kKVBytes, bar(1 + slot), tile, it.h,
                                                     it.b);
                    }
                    marks.mark(kMarkLoadIssued, tile);
                }
            }
            marks.mark(kMarkEnd, 0, true);
        }
        return;  // the producer has nothing to write
    }

    setmaxnreg_inc<kF.consumer_registers>();  // the consumers get the registers back
    marks.mark(kMarkStart, 0, true);
    const int consumer = thread / 128 - 1, ct = thread % 128;
    const uint32_t q_rows = smem_address(q_tile) + uint32_t(consumer) * 64 * 128;  // this group's 64 rows
    int rounds = 0, ring = 0;
    for (int r = 0;; ++r) {
        const int e = r & 1;
        mbarrier_wait_parity(bar(kItemFull + e), uint32_t((r / 2) & 1));  // the producer has posted item r
        Item it;
        if constexpr (kF.claim_ahead) {  // step 12: the producer has decoded the item
            volatile int* entry = posted + S::kEntryInts * e;
            it = Item{entry[0], entry[1], entry[2], entry[3], entry[4]};
            mbarrier_arrive(bar(kItemEmpty + e));  // entry e may be written again
            if (it.end < 0) break;
        } else {
            const unsigned w = mailbox[e];
            mbarrier_arrive(bar(kItemEmpty + e));  // entry e may be written again
            if (w >= items) break;
            it = item(w);
        }
        marks.mark(kMarkItem, tiles_mark(it.end));
        const int row_lo = it.q0 + 64 * consumer + 16 * (ct / 32) + (ct % 32) / 4;  // row g of this warp; g + 8 is the other
        //! [idle_vote]
        // Step 16: this warpgroup's rows all lie past Nq (the item is a head's last query tile). Every
        // lane computes the same answer; the vote is for ptxas, which cannot see that: a branch on a
        // value it does not know to be equal across the warp may diverge, and around such a branch it
        // keeps the loop's ring counters and wgmma descriptors out of the uniform datapath (x0.92-0.99
        // in this step's first build, at d = 128 too, where no warpgroup was idle). __all_sync's result
        // is one value for the whole warp by definition, so the branch is uniform and the loop compiles
        // as before.
        const bool idle = kF.idle_past_nq && kF.consumers > 1 && __all_sync(0xffffffffu, it.q0 + 64 * consumer >= a.seq_q);
        //! [idle_vote]
        ConsumerState<D> st;
        st.clear();
        if (it.end > 0) {
            mbarrier_wait_parity(q_full, uint32_t(rounds & 1));  // this item's Q has landed
            marks.mark(kMarkQLanded);
            const int base = ring;
            //! [ring_hooks]
            const auto slot_ready = [&](int tile) {
                const int k = base + tile;
                mbarrier_wait_parity(bar(1 + k % kF.stages), uint32_t((k / kF.stages) & 1));
            };
            const auto v_ready = [&](int tile) {  // step 15: V_tile on its own barrier (else it landed with K_tile)
                if constexpr (S::kF.split_ring) mbarrier_wait_parity(bar(S::v_full(base + tile)), S::round_parity(base + tile));
            };
            const auto k_read = [&](int tile) {
                if constexpr (S::kF.split_ring) mbarrier_arrive(bar(S::k_empty(base + tile)));  // K's slot is free
            };
            const auto slot_done = [&](int tile) { mbarrier_arrive(bar(S::v_empty(base + tile))); };
            const auto q_done = [&] { mbarrier_arrive(q_empty); };
            //! [ring_hooks]
            if (idle) {
                pass_turns<kF.consumers>(it.end, consumer, slot_ready, v_ready, k_read, slot_done, q_done);
            } else {
                consume_tiles_pipelined<T, D, Step>(st, q_rows, kv_ring, it.full, it.end, row_lo, a, thread, consumer, slot_ready,
                                                    v_ready, k_read, slot_done, marks, base, rounds == 0, q_done);
            }
            ring += it.end;
            ++rounds;
        }
        if constexpr (S::kStaged) {
            write_output_tma<T, D, Step, true>(st, a, it.b, it.h, it.q0, consumer, o_tile, ct);
        } else if constexpr (kF.wide_stores && kF.batched_epilogue) {
            write_output_batched<T, D>(st, a, it.b, it.h, row_lo, ct);
        } else {
            write_output<T, D, kF.wide_stores>(st, a, it.b, it.h, row_lo, ct);
        }
        marks.mark(kMarkEpilogue);
    }
    // The last warpgroup's last turn opened warpgroup 0's for an item that never came: warpgroup 0
    // takes it, so that no named barrier is left half-arrived when the block ends.
    if (kF.consumers > 1 && consumer == 0 && rounds > 0) named_barrier_sync(turn_barrier(0), kTurnThreads);
    if constexpr (S::kStaged) {
        if (ct == 0) bulk_wait_group<0>();  // the last store has written O before the block ends
    }
    marks.mark(kMarkEnd, 0, true);
}
//! [persistent]

}  // namespace detail

//! [kernel]
/// The whole forward pass for one query tile of one (batch, head); grid: query tiles x B x H.
template <class T, int D, class Step>
__global__ void __launch_bounds__(Shape<T, D, Step>::kThreads, Shape<T, D, Step>::kF.blocks_per_sm) hopper_forward_kernel(const __grid_constant__ Args<T> a) {
    using S = Shape<T, D, Step>;
    constexpr Features kF = S::kF;
    extern __shared__ unsigned char smem_raw[];
    // The swizzle is a function of the address: tiles start on 1024-byte boundaries.
    unsigned char* smem = smem_raw + ((1024u - fa::cuda::ptx::smem_address(smem_raw) % 1024u) % 1024u);
    unsigned char* q_tile = smem;                    // [Br, d]: d/64 swizzled boxes [Br, 64]
    unsigned char* kv_ring = q_tile + S::kQBytes;    // stages x (K [Bc, d], V [Bc, d]), each d/64 boxes [Bc, 64] (step 15: Ks, then Vs)
    unsigned char* o_tile = kv_ring + 2 * kF.stages * S::kKVBytes;  // step 13: O's buffer (kOBytes, 0 before)
    uint64_t* barriers = reinterpret_cast<uint64_t*>(o_tile + S::kOBytes);
    // barriers[0]: Q landed; [1 + s]: slot s full; [1 + kSlots + s]: slot s empty (producer step)
    const auto bar = [&](int i) { return fa::cuda::ptx::smem_address(barriers + i); };

    using Marks = std::conditional_t<kF.timeline, fa::cuda::TimelineRecorder, fa::cuda::NoTimeline>;
    if constexpr (kF.persistent) {  // step 9: one block per SM, looping over the work (detail::run_persistent)
        Marks marks = detail::make_marks<Marks>(a, int(threadIdx.x));
        detail::run_persistent<T, D, Step>(a, q_tile, kv_ring, barriers, marks, o_tile);
        return;
    }

    // Causal problems start with the last query tiles: they see the most keys. Head by head
    // (each head's tiles from the heaviest), or, from step 6 under a causal mask, rank by rank
    // across a group of heads whose K and V stay in L2 together (schedule.hpp).
    const BlockWork work =
        block_work(blockIdx.x, a.q_tiles, a.batch_heads, a.causal, kF.heaviest_first_grid && a.causal ? a.group_heads : 1);
    const int q0 = work.q_tile * S::kBr;
    const int bh = work.bh;
    const int b = bh / a.heads, h = bh % a.heads;
    const int thread = int(threadIdx.x);
    int full, end;
    key_tiles(q0, S::kBr, S::kBc, a.seq_q, a.seq_k, a.causal, full, end);

    // The consumer warpgroup of this thread (its 64 rows), and its thread index in it.
    const int consumer = kF.producer ? int(threadIdx.x) / 128 - 1 : int(threadIdx.x) / 128;
    const int ct = thread % 128;
    const int row_lo = q0 + 64 * consumer + 16 * (ct / 32) + (ct % 32) / 4;  // row g of this warp; g + 8 is the other
    const uint32_t q_rows = fa::cuda::ptx::smem_address(q_tile) + uint32_t(consumer) * 64 * 128;  // this group's 64 rows

    //! [timeline_marks]
    // The instrumented build: thread 0 of each warpgroup of block a.timeline_block writes that
    // warpgroup's marks (warpgroup w's list starts at mark w * kTimelineMarks); other builds record nothing.
    Marks marks = detail::make_marks<Marks>(a, thread);
    //! [timeline_marks]

    detail::ConsumerState<D> st;
    st.clear();

    const T* q_head = a.q + b * a.q_sb + h * a.q_sh;  // [Nq, d] global
    const T* k_head = a.k + b * a.k_sb + h * a.k_sh;  // [Nk, d] global
    const T* v_head = a.v + b * a.v_sb + h * a.v_sh;  // [Nk, d] global

    // One thread issues the TMA copies of tile `tile` (K and V, d/64 boxes each) onto its slot's barrier.
    const uint32_t kv_tx = 2u * S::kKVBytes;          // bytes the TMA delivers per K/V tile
    const auto tma_load_kv = [&](int tile) {
        const int slot = tile % kF.stages;
        unsigned char* k_dst = kv_ring + 2 * slot * S::kKVBytes;
        const uint32_t full_bar = bar(1 + slot);
        fa::cuda::ptx::mbarrier_arrive_expect_tx(full_bar, kv_tx);
#pragma unroll
        for (int box = 0; box < D / 64; ++box) {
            fa::cuda::ptx::tma_load_4d(fa::cuda::ptx::smem_address(k_dst + box * S::kBc * 128), &a.k_map, full_bar, 64 * box,
                                       tile * S::kBc, h, b);
            fa::cuda::ptx::tma_load_4d(fa::cuda::ptx::smem_address(k_dst + S::kKVBytes + box * S::kBc * 128), &a.v_map,
                                       full_bar, 64 * box, tile * S::kBc, h, b);
        }
    };
    const auto tma_load_q = [&] {
        fa::cuda::ptx::mbarrier_arrive_expect_tx(bar(0), uint32_t(S::kQBytes));
#pragma unroll
        for (int box = 0; box < D / 64; ++box) {
            fa::cuda::ptx::tma_load_4d(fa::cuda::ptx::smem_address(q_tile + box * S::kBr * 128), &a.q_map, bar(0), 64 * box, q0, h, b);
        }
    };

    if (end > 0) {
        if constexpr (!kF.tma) {
            //! [step1_loads]
            // Step 1: every thread copies with cp.async, as in stage 07; a ring of kStages slots.
            const auto load_kv = [&](int tile) {
                unsigned char* k_dst = kv_ring + 2 * (tile % kF.stages) * S::kKVBytes;
                detail::load_tile_cp_async<T, D, S::kBc>(k_dst, k_head, a.k_sn, tile * S::kBc, a.seq_k, thread, S::kThreads);
                detail::load_tile_cp_async<T, D, S::kBc>(k_dst + S::kKVBytes, v_head, a.v_sn, tile * S::kBc, a.seq_k, thread,
                                                         S::kThreads);
            };
            detail::load_tile_cp_async<T, D, S::kBr>(q_tile, q_head, a.q_sn, q0, a.seq_q, thread, S::kThreads);
#pragma unroll
            for (int i = 0; i < kF.stages - 1; ++i) {
                if (i < end) load_kv(i);
                fa::cuda::ptx::cp_async_commit();  // Q travels in group 0; empty groups keep the count uniform
            }
            detail::consume_tiles<T, D, Step>(
                st, q_rows, kv_ring, full, end, row_lo, a, thread,
                [&](int tile) {
                    fa::cuda::ptx::cp_async_wait<kF.stages - 2>();  // this thread's copies of tile `tile` have landed
                    fa::cuda::ptx::fence_proxy_async();  // ... and are visible to wgmma's reads (the async proxy)
                    // Every thread's copies of `tile` are in before any wgmma reads them, and every
                    // wgmma of tile-1 has finished (wait_group 0) before its slot is refilled below.
                    __syncthreads();
                    const int next = tile + kF.stages - 1;
                    if (next < end) load_kv(next);
                    fa::cuda::ptx::cp_async_commit();
                },
                [](int) {}, marks);
            fa::cuda::ptx::cp_async_wait<0>();  // nothing may still be landing when the block exits
            //! [step1_loads]
        } else if constexpr (!kF.producer) {
            //! [step2_loads]
            // Step 2: thread 0 issues TMA copies; each slot's mbarrier says when its bytes are in.
            if (thread == 0) {
                fa::cuda::ptx::mbarrier_init(bar(0), 1);
                for (int s = 0; s < kF.stages; ++s) fa::cuda::ptx::mbarrier_init(bar(1 + s), 1);
                fa::cuda::ptx::fence_mbarrier_init();  // the TMA unit sees the initialized barriers
            }
            __syncthreads();  // every thread sees them initialized before waiting on them
            if (thread == 0) {
                tma_load_q();
                for (int i = 0; i < kF.stages - 1 && i < end; ++i) tma_load_kv(i);
            }
            fa::cuda::ptx::mbarrier_wait_parity(bar(0), 0);  // Q has landed
            detail::consume_tiles<T, D, Step>(
                st, q_rows, kv_ring, full, end, row_lo, a, thread,
                [&](int tile) {
                    // Every thread has finished tile-1 (its wgmma waited), so its slot may be refilled.
                    if (tile > 0) __syncthreads();
                    const int next = tile + kF.stages - 1;
                    if (thread == 0 && next < end) tma_load_kv(next);
                    // The slot's phase (tile / stages) completes when its bytes have landed.
                    fa::cuda::ptx::mbarrier_wait_parity(bar(1 + tile % kF.stages), uint32_t((tile / kF.stages) & 1));
                },
                [](int) {}, marks);
            //! [step2_loads]
        } else {
            //! [step3_roles]
            // Step 3: warpgroup 0 produces, warpgroups 1.. consume. Slot s is *full* when the TMA
            // delivered its bytes (1 arrival + bytes), *empty* when every consumer thread has
            // finished reading it (128 x consumers arrivals).
            if (thread == 0) {
                detail::init_ring_barriers<kF.stages, kF.consumers>(bar);
                fa::cuda::ptx::fence_mbarrier_init();  // the TMA unit sees the initialized barriers
            }
            __syncthreads();  // the barriers are initialized before either side uses them
            if (thread < 128) {
                fa::cuda::ptx::setmaxnreg_dec<kF.producer_registers>();  // the producer needs few registers
                if (thread == 0) {
                    marks.mark(kMarkStart, 0, true);
                    tma_load_q();
                    marks.mark(kMarkQIssued);
                    for (int tile = 0; tile < end; ++tile) {
                        const int slot = tile % kF.stages;
                        // Round r = tile / stages refills the slot after round r-1 was consumed.
                        if (tile >= kF.stages) {
                            fa::cuda::ptx::mbarrier_wait_parity(bar(1 + kF.stages + slot), uint32_t((tile / kF.stages - 1) & 1));
                            marks.mark(kMarkSlotEmpty, tile);
                        }
                        tma_load_kv(tile);
                        marks.mark(kMarkLoadIssued, tile);
                    }
                    marks.mark(kMarkEnd, 0, true);
                }
                return;  // the producer has nothing to write
            }
            fa::cuda::ptx::setmaxnreg_inc<kF.consumer_registers>();  // the consumers get the registers back
            marks.mark(kMarkStart, 0, true);
            fa::cuda::ptx::mbarrier_wait_parity(bar(0), 0);  // Q has landed
            marks.mark(kMarkQLanded);
            const auto slot_full = [&](int tile) {
                fa::cuda::ptx::mbarrier_wait_parity(bar(1 + tile % kF.stages), uint32_t((tile / kF.stages) & 1));
            };
            const auto slot_empty = [&](int tile) {
                // This thread's wgmma on the slot have completed (a wait_group 0 came first).
                fa::cuda::ptx::mbarrier_arrive(bar(1 + kF.stages + tile % kF.stages));
            };
            if constexpr (!kF.ping_pong) {
                detail::consume_tiles<T, D, Step>(st, q_rows, kv_ring, full, end, row_lo, a, thread, slot_full, slot_empty, marks);
            } else {
                detail::consume_tiles_pipelined<T, D, Step>(st, q_rows, kv_ring, full, end, row_lo, a, thread, consumer, slot_full,
                                                            [](int) {}, [](int) {}, slot_empty, marks, 0, true, [] {});
            }
            //! [step3_roles]
        }
    } else if constexpr (kF.producer) {
        if (thread < 128) return;  // no key for any row: the producer has nothing to load
    }
    if constexpr (kF.tma_store) {
        detail::write_output_tma<T, D, Step>(st, a, b, h, q0, consumer, q_tile, ct);
    } else {
        detail::write_output<T, D>(st, a, b, h, row_lo, ct);
    }
    marks.mark(kMarkEpilogue);
    marks.mark(kMarkEnd, 0, true);
}
//! [kernel]

}  // namespace fa::stage11
