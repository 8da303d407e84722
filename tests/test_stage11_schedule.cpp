// Stage 11's block order (stages/11_hopper_kernel/schedule.hpp) and its key-tile classes are
// plain integer arithmetic: checked here on the CPU, for every block of small and awkward grids.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "schedule.hpp"

using fa::stage11::block_work;
using fa::stage11::BlockWork;

namespace {

// Every block's work, in block order.
std::vector<BlockWork> order(int q_tiles, int batch_heads, bool causal, bool across_heads) {
    std::vector<BlockWork> out;
    for (unsigned block = 0; block < unsigned(q_tiles * batch_heads); ++block)
        out.push_back(block_work(block, q_tiles, batch_heads, causal, across_heads));
    return out;
}

}  // namespace

TEST_CASE("stage 11's grid gives every (query tile, head) to exactly one block, in every order") {
    for (const auto& [q_tiles, batch_heads] : {std::pair{1, 1}, {1, 7}, {5, 1}, {22, 16}, {3, 128}, {128, 3}}) {
        for (const bool causal : {false, true}) {
            for (const bool across_heads : {false, true}) {
                CAPTURE(q_tiles);
                CAPTURE(batch_heads);
                CAPTURE(causal);
                CAPTURE(across_heads);
                std::set<std::pair<int, int>> seen;
                for (const BlockWork& w : order(q_tiles, batch_heads, causal, across_heads)) {
                    REQUIRE(w.q_tile >= 0);
                    REQUIRE(w.q_tile < q_tiles);
                    REQUIRE(w.bh >= 0);
                    REQUIRE(w.bh < batch_heads);
                    seen.insert({w.q_tile, w.bh});
                }
                CHECK(seen.size() == size_t(q_tiles * batch_heads));
            }
        }
    }
}

TEST_CASE("head by head, the blocks of one head are neighbours; causal ones start from the heaviest tile") {
    const int q_tiles = 6, batch_heads = 4;
    const std::vector<BlockWork> plain = order(q_tiles, batch_heads, false, false);
    const std::vector<BlockWork> causal = order(q_tiles, batch_heads, true, false);
    for (int block = 0; block < q_tiles * batch_heads; ++block) {
        CHECK(plain[size_t(block)].bh == block / q_tiles);
        CHECK(plain[size_t(block)].q_tile == block % q_tiles);
        CHECK(causal[size_t(block)].bh == block / q_tiles);
        CHECK(causal[size_t(block)].q_tile == q_tiles - 1 - block % q_tiles);  // the last rows see the most keys
    }
}

TEST_CASE("across heads, the first batch_heads blocks take every head's heaviest tile, then the next rank") {
    const int q_tiles = 5, batch_heads = 7;
    const std::vector<BlockWork> w = order(q_tiles, batch_heads, true, true);
    for (int rank = 0; rank < q_tiles; ++rank) {
        std::set<int> heads;
        for (int i = 0; i < batch_heads; ++i) {
            const BlockWork& b = w[size_t(rank * batch_heads + i)];
            CHECK(b.q_tile == q_tiles - 1 - rank);  // every block of this rank has the same weight
            heads.insert(b.bh);
        }
        CHECK(heads.size() == size_t(batch_heads));  // ... one per head
    }
    // Weights (keys seen, for Nq = Nk) never grow along the block order: the light tiles come last.
    for (size_t i = 1; i < w.size(); ++i) CHECK(w[i].q_tile <= w[i - 1].q_tile);
}

TEST_CASE("block_work is the order the kernel computed inline before (steps 1 to 5, and step 6 on)") {
    for (const auto& [q_tiles, batch_heads] : {std::pair{1, 1}, {4, 3}, {22, 16}, {7, 1}}) {
        for (const bool causal : {false, true}) {
            for (const bool heaviest_first_grid : {false, true}) {
                const bool across_heads = heaviest_first_grid && causal;
                for (unsigned block = 0; block < unsigned(q_tiles * batch_heads); ++block) {
                    const int index = int(across_heads ? block / unsigned(batch_heads) : block % unsigned(q_tiles));
                    const int bh = int(across_heads ? block % unsigned(batch_heads) : block / unsigned(q_tiles));
                    const BlockWork w = block_work(block, q_tiles, batch_heads, causal, across_heads);
                    CHECK(w.q_tile == (causal ? q_tiles - 1 - index : index));
                    CHECK(w.bh == bh);
                }
            }
        }
    }
}
