/// \file stages/11_hopper_kernel/schedule.hpp
/// \brief Which query tile of which (batch, head) a thread block of stage 11 computes: plain
/// integer arithmetic, shared by the kernel and its host test (tests/test_stage11_schedule.cpp);
/// and, for the host alone, how long the persistent grid's busiest block works (busiest_block()).
///
/// The grid is flat: `q_tiles x batch_heads` blocks, handed out by the hardware roughly in block
/// order, about one wave of blocks per SM at a time. Which work a block number stands for decides
/// what runs together. The heads are taken in *groups* of `group_heads` consecutive (batch, head)
/// pairs, one group after the other. Inside a group, the blocks go rank by rank across its heads:
/// under a causal mask the first ranks are every head's heaviest tiles (the last ones, which see
/// every key), so the light tiles fill the end of the group's run instead of the heavy ones.
/// `group_heads = 1` is head by head; `group_heads = batch_heads` is all heads at once. The host
/// sizes a group so that its K and V stay in L2 while its blocks run (launch.cuh), because each
/// head's K and V are read once by every query tile of that head.
#pragma once

#include <cstddef>
#include <functional>
#include <queue>
#include <vector>

#include "fa/config.hpp"

namespace fa::stage11 {

/// One block's work: query tile `q_tile` (rows `q_tile * Br ...`, counted from the first row) of
/// (batch, head) `bh = b * H + h`.
struct BlockWork {
    int q_tile;  ///< the query tile, 0 for the first Br rows
    int bh;      ///< b * H + h
};

//! [grid_order]
/// The work of block `block` of `q_tiles x batch_heads`: groups of `group_heads` heads (the last
/// group may have fewer), and in a group all heads' tiles of one rank before the next rank. Under
/// a causal mask the ranks count from the last tile (the heaviest) down.
FA_HD inline BlockWork block_work(unsigned block, int q_tiles, int batch_heads, bool causal, int group_heads) {
    const unsigned group_blocks = unsigned(q_tiles) * unsigned(group_heads);
    const int first_head = int(block / group_blocks) * group_heads;  // the group's first (batch, head)
    const unsigned in_group = block % group_blocks;
    const int heads = group_heads < batch_heads - first_head ? group_heads : batch_heads - first_head;
    const int rank = int(in_group / unsigned(heads));
    const int bh = first_head + int(in_group % unsigned(heads));
    return {causal ? q_tiles - 1 - rank : rank, bh};
}
//! [grid_order]

/// Heads per group: as many (batch, head) pairs as have their K and V (`kv_bytes_per_head` each)
/// within `budget_bytes` together; at least 1, at most `batch_heads`.
FA_HD inline int heads_per_group(long long kv_bytes_per_head, long long budget_bytes, int batch_heads) {
    const long long fit = kv_bytes_per_head > 0 ? budget_bytes / kv_bytes_per_head : batch_heads;
    return fit < 1 ? 1 : fit > batch_heads ? batch_heads : int(fit);
}

//! [busiest_block]
/// The persistent grid's run, counted in work: `blocks` blocks take the items in the order given,
/// each item going to the block that is free first (as the counter hands them out), and item i
/// keeps its block busy for `costs[i]`. Returns the busiest block's total, which is what the run
/// lasts; the average block's is sum(costs) / blocks. Host only (the executable's config line).
inline double busiest_block(const std::vector<double>& costs, int blocks) {
    if (blocks < 1) return 0.0;
    std::priority_queue<double, std::vector<double>, std::greater<>> free_at;  // each block's busy time
    for (int b = 0; b < blocks; ++b) free_at.push(0.0);
    double busiest = 0.0;
    for (const double c : costs) {
        const double t = free_at.top() + c;
        free_at.pop();
        free_at.push(t);
        busiest = t > busiest ? t : busiest;
    }
    return busiest;
}
//! [busiest_block]

}  // namespace fa::stage11
