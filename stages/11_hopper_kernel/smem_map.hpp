/// \file stages/11_hopper_kernel/smem_map.hpp
/// \brief Stage 11's shared-memory map: where each step's kernel keeps Q, the K/V ring, O's buffer
/// and its mbarriers, computed from the kernel's own layout constants (kernel.cuh's Shape).
///
/// The lesson's picture of the map (docs/make_stage11_pictures.py) is drawn from
/// docs/results/stage11_smem_map.json, which smem_maps_json() writes; tests/test_stage11_smem_map.cpp
/// checks that the committed file is what the code computes now, so the picture cannot drift from
/// the kernel. Plain host code: no GPU is needed.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace fa::stage11 {

/// One region of a kernel instance's dynamic shared memory.
struct SmemRegion {
    std::string name;  ///< "Q", "K slot 0", "V slot 1", "O", "Q full", "K/V empty 2", "mailbox entry 0", ...
    std::string kind;  ///< "tile" (Q, K, V, O: swizzled boxes), "barrier" (an mbarrier) or "mailbox" (an entry)
    int offset = 0;    ///< bytes from the block's 1024-byte-aligned base (the kernel's `smem`)
    int bytes = 0;     ///< its size in bytes
    bool used = true;  ///< false: allocated, but this step never touches it (step 1's barriers, step 2's empty ones)
};

/// The shared memory of the kernel instance that one step runs at one head dimension.
struct SmemMap {
    int step = 0;               ///< the road's step (1 to 17)
    int head_dim = 0;           ///< d: 64 or 128
    bool small_blocks = false;  ///< step 11 on, d = 64, short causal heads: Features::small_blocks()' instance
    int kernel_step = 0;        ///< the step whose instance runs (step 11: step 10's; small blocks: 11, 12 or 17)
    int br = 0;                 ///< query rows per block
    int bc = 0;                 ///< keys per K/V tile
    int consumers = 0;          ///< consumer warpgroups
    int threads = 0;            ///< threads per block
    int blocks_per_sm = 0;      ///< blocks an SM holds at once
    int stages = 0;             ///< slots of the ring (of each ring, when split)
    int slots = 0;              ///< slots with a full and an empty barrier (2 x stages when split)
    bool tma = false;           ///< tiles loaded by the TMA onto mbarriers
    bool producer = false;      ///< a producer warpgroup (full and empty barriers)
    bool split_ring = false;    ///< step 15 at d = 128: K and V on rings of their own
    bool persistent = false;    ///< step 9 on: Q empty, the mailbox and its barriers
    bool claim_ahead = false;   ///< step 12 on: mailbox entries hold an item decoded
    bool o_in_q = false;        ///< steps 7 and 8: the epilogue stages O in Q's buffer
    bool o_buffer = false;      ///< Shape::kStaged: O has a buffer of its own
    int align_slack = 0;        ///< bytes asked for beyond the regions, to align the base to 1024
    std::size_t smem_bytes = 0; ///< Shape::kSmemBytes: the dynamic shared memory the launch asks for
    std::vector<SmemRegion> regions;  ///< in address order
};

/// The map of step `step` (1 to 17) at head dimension `head_dim` (64 or 128); with `small_blocks`
/// (step 11 on, d = 64) the instance it runs on short causal heads. Throws std::invalid_argument
/// for another combination.
SmemMap smem_map(int step, int head_dim, bool small_blocks = false);

/// Every map: steps 1 to 17 at d = 64 and 128, then the small blocks of steps 11 to 17.
std::vector<SmemMap> smem_maps();

/// smem_maps() as the text of docs/results/stage11_smem_map.json (fa::json_text(): one line per region).
std::string smem_maps_json();

}  // namespace fa::stage11
