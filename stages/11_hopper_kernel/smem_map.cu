// Stage 11's shared-memory map (smem_map.hpp), computed on the host from kernel.cuh's Shape: the
// sizes are Shape's constants (kQBytes, kKVBytes, kOBytes, kBarrierBytes, kSmemBytes), the K and V
// tiles' places its k_offset() and v_offset(), the ring's barriers its k_full() ... v_empty(). No
// kernel is instantiated here: this file adds no device code.
#include "smem_map.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include <cuda_bf16.h>

#include "fa/json.hpp"
#include "kernel.cuh"

namespace fa::stage11 {

namespace {

// The road's steps, as attention.cu's `road` snippet builds them. They are repeated here because
// attention.cu keeps them in its anonymous namespace; tests/test_stage11_smem_map.cpp checks these
// against attention.cu's own (describe_config(): Br, Bc, warpgroups, ring, shared memory).
constexpr Features kMapStep1{};
constexpr Features kMapStep2 = kMapStep1.with_tma_ring(2);
constexpr Features kMapStep3 = kMapStep2.with_producer_warpgroup(2);
constexpr Features kMapStep4 = kMapStep3.with_ping_pong(3);
constexpr Features kMapStep5 = kMapStep4.with_softmax_overlap();
constexpr Features kMapStep6 = kMapStep5.with_heaviest_first_grid();
constexpr Features kMapStep7 = kMapStep6.with_tma_store();
constexpr Features kMapStep8 = kMapStep7.with_three_consumers_at_d64();
constexpr Features kMapStep9 = kMapStep8.with_persistent_grid();
constexpr Features kMapStep10 = kMapStep9.with_wide_stores();
constexpr Features kMapStep11 = kMapStep10.with_small_blocks_for_short_causal_heads();
constexpr Features kMapStep12 = kMapStep11.with_early_claim();
constexpr Features kMapStep13 = kMapStep12.with_staged_store();
constexpr Features kMapStep14 = kMapStep13.with_batched_epilogue();
constexpr Features kMapStep15 = kMapStep14.with_split_ring_at_d128(2);
constexpr Features kMapStep16 = kMapStep15.with_idle_warpgroups_past_nq();
constexpr Features kMapStep17 = kMapStep16.with_lazy_rescale(8);
constexpr Features kMapSteps[] = {kMapStep1,  kMapStep1,  kMapStep2,  kMapStep3,  kMapStep4,  kMapStep5,
                                  kMapStep6,  kMapStep7,  kMapStep8,  kMapStep9,  kMapStep10, kMapStep11,
                                  kMapStep12, kMapStep13, kMapStep14, kMapStep15, kMapStep16, kMapStep17};
constexpr int kMapLastStep = 17;

// As attention.cu: step 11's kernel is step 10's except on short causal heads at d = 64, and the
// small blocks step N runs are step 11's, 12's or 17's.
constexpr int map_kernel_step(int step) { return step == 11 ? 10 : step; }
constexpr int map_small_blocks_step(int step) { return step >= 17 ? 17 : step >= 12 ? 12 : 11; }

template <int N>
struct MapStepN {
    static constexpr Features value = kMapSteps[N];
};
template <int N>
struct MapSmallBlocksN {
    static constexpr Features value = kMapSteps[N].small_blocks();
};

/// The map of one instance: Shape<bf16, D, Step> (fp16's is the same: 16-bit elements both).
template <int D, class Step>
SmemMap map_of_shape(int step, int kernel_step, bool small_blocks) {
    using S = Shape<__nv_bfloat16, D, Step>;
    constexpr Features kF = S::kF;
    SmemMap m;
    m.step = step;
    m.head_dim = D;
    m.small_blocks = small_blocks;
    m.kernel_step = kernel_step;
    m.br = S::kBr;
    m.bc = S::kBc;
    m.consumers = kF.consumers;
    m.threads = S::kThreads;
    m.blocks_per_sm = kF.blocks_per_sm;
    m.stages = kF.stages;
    m.slots = S::kSlots;
    m.tma = kF.tma;
    m.producer = kF.producer;
    m.split_ring = kF.split_ring;
    m.persistent = kF.persistent;
    m.claim_ahead = kF.claim_ahead;
    m.o_in_q = kF.tma_store;
    m.o_buffer = S::kStaged;
    m.align_slack = 1024;  // kSmemBytesWithoutO's slack: the kernel rounds its base up to 1024
    m.smem_bytes = S::kSmemBytes;

    // hopper_forward_kernel's pointers: q_tile at the aligned base, kv_ring after Q, o_tile after
    // the ring (2 x stages tiles, one ring or two), the barriers after O's buffer.
    const int q_at = 0;
    const int ring_at = q_at + S::kQBytes;
    const int o_at = ring_at + 2 * kF.stages * S::kKVBytes;
    const int bars_at = o_at + S::kOBytes;
    static_assert(1024 + S::kQBytes + 2 * kF.stages * S::kKVBytes + S::kOBytes + S::kBarrierBytes == S::kSmemBytes,
                  "the kernel's regions, in this order, are its shared memory (Shape::kSmemBytes)");
    const auto add = [&m](std::string name, const char* kind, int offset, int bytes, bool used) {
        m.regions.push_back(SmemRegion{std::move(name), kind, offset, bytes, used});
    };
    add("Q", "tile", q_at, S::kQBytes, true);
    // Slot s of the ring holds the ring's tiles k with k % stages == s: k_offset(s) and v_offset(s).
    const auto slot_name = [](const char* what, int s) { return std::string(what) + " slot " + std::to_string(s); };
    if (kF.split_ring) {  // step 15: K's slots, then V's
        for (int s = 0; s < kF.stages; ++s) add(slot_name("K", s), "tile", ring_at + S::k_offset(s), S::kKVBytes, true);
        for (int s = 0; s < kF.stages; ++s) add(slot_name("V", s), "tile", ring_at + S::v_offset(s), S::kKVBytes, true);
    } else {  // K then V in each slot
        for (int s = 0; s < kF.stages; ++s) {
            add(slot_name("K", s), "tile", ring_at + S::k_offset(s), S::kKVBytes, true);
            add(slot_name("V", s), "tile", ring_at + S::v_offset(s), S::kKVBytes, true);
        }
    }
    if (S::kOBytes > 0) add("O", "tile", o_at, S::kOBytes, true);

    // The mbarriers, 8 bytes each, barrier i at barriers + i. Which ones a step touches: step 1
    // (cp.async) none; step 2 Q's and the full ones (one thread loads, __syncthreads frees a slot);
    // from step 3 (a producer) the empty ones too.
    const auto bar = [&](int i) { return bars_at + 8 * i; };
    add("Q full", "barrier", bar(0), 8, kF.tma);
    const auto ring_bar = [&](const std::string& what, int index, bool used) { add(what, "barrier", bar(index), 8, used); };
    for (int s = 0; s < kF.stages; ++s) {
        if (kF.split_ring) {
            ring_bar("K full " + std::to_string(s), S::k_full(s), true);
        } else {
            ring_bar("K/V full " + std::to_string(s), S::k_full(s), kF.tma);
        }
    }
    if (kF.split_ring) {
        for (int s = 0; s < kF.stages; ++s) ring_bar("V full " + std::to_string(s), S::v_full(s), true);
        for (int s = 0; s < kF.stages; ++s) ring_bar("K empty " + std::to_string(s), S::k_empty(s), true);
        for (int s = 0; s < kF.stages; ++s) ring_bar("V empty " + std::to_string(s), S::v_empty(s), true);
    } else {
        for (int s = 0; s < kF.stages; ++s) ring_bar("K/V empty " + std::to_string(s), S::k_empty(s), kF.producer);
    }
    if constexpr (kF.persistent) {
        // run_persistent()'s barriers after the ring's (its local kQEmpty, kItemFull, kItemEmpty),
        // then the mailbox: two entries, each an item's number (unsigned) or, from step 12, an item
        // decoded (Shape::kEntryInts ints).
        constexpr int kQEmpty = 1 + 2 * S::kSlots, kItemFull = kQEmpty + 1, kItemEmpty = kQEmpty + 3, kMailbox = kQEmpty + 5;
        static_assert(8 * (kMailbox + S::kMailboxWords) == S::kBarrierBytes, "the mailbox ends the barrier area (Shape::kBarrierBytes)");
        add("Q empty", "barrier", bar(kQEmpty), 8, true);
        for (int e = 0; e < 2; ++e) add("item full " + std::to_string(e), "barrier", bar(kItemFull + e), 8, true);
        for (int e = 0; e < 2; ++e) add("item empty " + std::to_string(e), "barrier", bar(kItemEmpty + e), 8, true);
        const int entry_bytes = kF.claim_ahead ? 4 * S::kEntryInts : 4;
        for (int e = 0; e < 2; ++e) add("mailbox entry " + std::to_string(e), "mailbox", bar(kMailbox) + e * entry_bytes, entry_bytes, true);
    }
    return m;
}

/// The map of step `step`, whose instance is step N's (N of the list equal to `kernel_step`); with
/// `small_blocks`, step N's small blocks at d = 64.
template <bool kSmall, int... N>
SmemMap find_map(std::integer_sequence<int, N...>, int step, int kernel_step, int head_dim) {
    SmemMap found;
    const auto one = [&](auto n) {
        constexpr int K = decltype(n)::value;
        if constexpr (kSmall) {
            found = map_of_shape<64, MapSmallBlocksN<K>>(step, K, true);
        } else {
            found = head_dim == 64 ? map_of_shape<64, MapStepN<K>>(step, K, false) : map_of_shape<128, MapStepN<K>>(step, K, false);
        }
        return true;
    };
    (void)((kernel_step == N && one(std::integral_constant<int, N>{})) || ...);
    return found;
}

}  // namespace

SmemMap smem_map(int step, int head_dim, bool small_blocks) {
    if (step < 1 || step > kMapLastStep || (head_dim != 64 && head_dim != 128) ||
        (small_blocks && !(head_dim == 64 && kMapSteps[step].small_blocks_short_causal))) {
        throw std::invalid_argument("stage 11 smem_map: no instance for step " + std::to_string(step) + ", d = " +
                                    std::to_string(head_dim) + (small_blocks ? ", small blocks" : ""));
    }
    const int kernel_step = small_blocks ? map_small_blocks_step(step) : map_kernel_step(step);
    // attention.cu's KernelSteps and SmallBlocksSteps: the instances that are built.
    if (small_blocks) return find_map<true>(std::integer_sequence<int, 11, 12, 17>{}, step, kernel_step, head_dim);
    return find_map<false>(std::integer_sequence<int, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17>{}, step, kernel_step,
                           head_dim);
}

std::vector<SmemMap> smem_maps() {
    std::vector<SmemMap> maps;
    for (const int d : {64, 128})
        for (int step = 1; step <= kMapLastStep; ++step) maps.push_back(smem_map(step, d));
    for (int step = 1; step <= kMapLastStep; ++step)
        if (kMapSteps[step].small_blocks_short_causal) maps.push_back(smem_map(step, 64, true));
    return maps;
}

std::string smem_maps_json() {
    fa::Json maps = fa::Json::array();
    for (const SmemMap& m : smem_maps()) {
        fa::Json regions = fa::Json::array();
        for (const SmemRegion& g : m.regions) {
            regions.push_back({{"name", g.name}, {"kind", g.kind}, {"offset", g.offset}, {"bytes", g.bytes}, {"used", g.used}});
        }
        maps.push_back({{"step", m.step}, {"head_dim", m.head_dim}, {"small_blocks", m.small_blocks}, {"kernel_step", m.kernel_step},
                        {"br", m.br}, {"bc", m.bc}, {"consumers", m.consumers}, {"threads", m.threads},
                        {"blocks_per_sm", m.blocks_per_sm}, {"stages", m.stages}, {"slots", m.slots}, {"tma", m.tma},
                        {"producer", m.producer}, {"split_ring", m.split_ring}, {"persistent", m.persistent},
                        {"claim_ahead", m.claim_ahead}, {"o_in_q", m.o_in_q}, {"o_buffer", m.o_buffer},
                        {"align_slack", m.align_slack}, {"smem_bytes", m.smem_bytes}, {"regions", regions}});
    }
    const fa::Json file = {
        {"what", "stage 11: each step's dynamic shared memory, from kernel.cuh's Shape (stages/11_hopper_kernel/smem_map.cu; "
                 "regenerate: test_stage11_smem_map --write FILE)"},
        {"offsets", "bytes from the block's 1024-byte-aligned base; smem_bytes adds align_slack before it"},
        {"maps", maps}};
    return fa::json_text(file) + "\n";
}

}  // namespace fa::stage11
