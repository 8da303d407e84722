/// \file stages/11_hopper_kernel/schedule.hpp
/// \brief Which query tile of which (batch, head) a thread block of stage 11 computes: plain
/// integer arithmetic, shared by the kernel and its host test (tests/test_stage11_schedule.cpp).
///
/// The grid is flat: `q_tiles x batch_heads` blocks, handed out by the hardware roughly in block
/// order, about one wave of blocks per SM at a time. Which work a block number stands for decides
/// what runs together: head by head (the blocks of one head share its K and V in L2), or, for
/// causal problems from step 6 on, tile by tile across all heads, so that the first wave holds
/// every head's heaviest query tile (the last one, which sees every key) and the light tiles
/// fill the end of the run instead of the heavy ones.
#pragma once

#include "fa/config.hpp"

namespace fa::stage11 {

/// One block's work: query tile `q_tile` (rows `q_tile * Br ...`, counted from the first row) of
/// (batch, head) `bh = b * H + h`.
struct BlockWork {
    int q_tile;  ///< the query tile, 0 for the first Br rows
    int bh;      ///< b * H + h
};

//! [grid_order]
/// The work of block `block` of `q_tiles x batch_heads`. Under a causal mask the tiles are taken
/// from the last (the heaviest) down; `across_heads` walks all heads' tiles of one rank before
/// the next rank, instead of one head's tiles before the next head.
FA_HD inline BlockWork block_work(unsigned block, int q_tiles, int batch_heads, bool causal, bool across_heads) {
    const int rank = int(across_heads ? block / unsigned(batch_heads) : block % unsigned(q_tiles));
    const int bh = int(across_heads ? block % unsigned(batch_heads) : block / unsigned(q_tiles));
    return {causal ? q_tiles - 1 - rank : rank, bh};
}
//! [grid_order]

}  // namespace fa::stage11
