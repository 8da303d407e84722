// Stage 11's block order (stages/11_hopper_kernel/schedule.hpp) is plain integer arithmetic:
// checked here on the CPU, for every block of small and awkward grids and every group size.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "schedule.hpp"

using fa::stage11::block_work;
using fa::stage11::busiest_block;
using fa::stage11::BlockWork;
using fa::stage11::heads_per_group;

namespace {

// Every block's work, in block order.
std::vector<BlockWork> order(int q_tiles, int batch_heads, bool causal, int group_heads) {
    std::vector<BlockWork> out;
    for (unsigned block = 0; block < unsigned(q_tiles * batch_heads); ++block)
        out.push_back(block_work(block, q_tiles, batch_heads, causal, group_heads));
    return out;
}

}  // namespace

TEST_CASE("stage 11's grid gives every (query tile, head) to exactly one block, for every group size") {
    for (const auto& [q_tiles, batch_heads] : {std::pair{1, 1}, {1, 7}, {5, 1}, {22, 16}, {3, 128}, {128, 3}, {6, 10}}) {
        for (const bool causal : {false, true}) {
            for (const int group_heads : {1, 2, 3, 4, 7, batch_heads}) {
                if (group_heads > batch_heads) continue;
                CAPTURE(q_tiles);
                CAPTURE(batch_heads);
                CAPTURE(causal);
                CAPTURE(group_heads);
                std::set<std::pair<int, int>> seen;
                for (const BlockWork& w : order(q_tiles, batch_heads, causal, group_heads)) {
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

TEST_CASE("groups of one head: head by head, the blocks of one head are neighbours; causal ones start from the heaviest tile") {
    const int q_tiles = 6, batch_heads = 4;
    const std::vector<BlockWork> plain = order(q_tiles, batch_heads, false, 1);
    const std::vector<BlockWork> causal = order(q_tiles, batch_heads, true, 1);
    for (int block = 0; block < q_tiles * batch_heads; ++block) {
        CHECK(plain[size_t(block)].bh == block / q_tiles);
        CHECK(plain[size_t(block)].q_tile == block % q_tiles);
        CHECK(causal[size_t(block)].bh == block / q_tiles);
        CHECK(causal[size_t(block)].q_tile == q_tiles - 1 - block % q_tiles);  // the last rows see the most keys
    }
}

TEST_CASE("one group of all heads: the first batch_heads blocks take every head's heaviest tile, then the next rank") {
    const int q_tiles = 5, batch_heads = 7;
    const std::vector<BlockWork> w = order(q_tiles, batch_heads, true, batch_heads);
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

TEST_CASE("groups of 3 of 10 heads: each group's blocks are neighbours, heaviest rank first; the last group has 1 head") {
    const int q_tiles = 4, batch_heads = 10, group = 3;
    const std::vector<BlockWork> w = order(q_tiles, batch_heads, true, group);
    size_t i = 0;
    for (int first = 0; first < batch_heads; first += group) {
        const int heads = std::min(group, batch_heads - first);
        CAPTURE(first);
        for (int rank = 0; rank < q_tiles; ++rank) {
            for (int k = 0; k < heads; ++k, ++i) {
                CHECK(w[i].bh == first + k);  // the group's heads, in order
                CHECK(w[i].q_tile == q_tiles - 1 - rank);
            }
        }
    }
    CHECK(i == w.size());
    // Non-causal: the same walk, from the first tile.
    const std::vector<BlockWork> plain = order(q_tiles, batch_heads, false, group);
    for (size_t j = 0; j < w.size(); ++j) {
        CHECK(plain[j].bh == w[j].bh);
        CHECK(plain[j].q_tile == q_tiles - 1 - w[j].q_tile);
    }
}

TEST_CASE("the group sizes at the limits are the orders the kernel computed inline before") {
    for (const auto& [q_tiles, batch_heads] : {std::pair{1, 1}, {4, 3}, {22, 16}, {7, 1}}) {
        for (const bool causal : {false, true}) {
            for (const bool across_heads : {false, true}) {
                for (unsigned block = 0; block < unsigned(q_tiles * batch_heads); ++block) {
                    const int index = int(across_heads ? block / unsigned(batch_heads) : block % unsigned(q_tiles));
                    const int bh = int(across_heads ? block % unsigned(batch_heads) : block / unsigned(q_tiles));
                    const BlockWork w = block_work(block, q_tiles, batch_heads, causal, across_heads ? batch_heads : 1);
                    CHECK(w.q_tile == (causal ? q_tiles - 1 - index : index));
                    CHECK(w.bh == bh);
                }
            }
        }
    }
}

TEST_CASE("heads_per_group: as many heads as fit the budget, at least one, at most all") {
    const long long mib = 1 << 20;
    // bf16, d = 128: K and V of a head are 2 x Nk x 128 x 2 bytes.
    CHECK(heads_per_group(2LL * 1024 * 128 * 2, 16 * mib, 256) == 32);   // Nk = 1024: 512 KiB a head
    CHECK(heads_per_group(2LL * 16384 * 128 * 2, 16 * mib, 16) == 2);    // Nk = 16384: 8 MiB a head
    CHECK(heads_per_group(2LL * 65536 * 128 * 2, 16 * mib, 16) == 1);    // a head larger than the budget: still one
    CHECK(heads_per_group(2LL * 128 * 64 * 2, 16 * mib, 24) == 24);      // all heads fit: one group
    CHECK(heads_per_group(0, 16 * mib, 5) == 5);                         // no keys: one group
}

TEST_CASE("busiest_block: items go to the block free first; alike items leave a last wave") {
    // 3, 3 on blocks 0 and 1; then 2 to block 0 (free at 3), 2 to block 1, 2 to block 0: 7 against 6.
    CHECK(busiest_block({3, 3, 2, 2, 2}, 2) == doctest::Approx(7));
    CHECK(busiest_block({}, 4) == doctest::Approx(0));
    CHECK(busiest_block({5}, 0) == doctest::Approx(0));
    // Alike items: the busiest block runs ceil(items / blocks) of them. Stage 11 at N = 1024 without the
    // mask on an H100: 3072 items (d = 64) or 2048 (d = 128) on 132 blocks, 23.27 or 15.52 a block.
    CHECK(busiest_block(std::vector<double>(3072, 1.0), 132) == doctest::Approx(24));
    CHECK(busiest_block(std::vector<double>(2048, 1.0), 132) == doctest::Approx(16));
    CHECK(busiest_block(std::vector<double>(264, 1.0), 132) == doctest::Approx(2));
    // Heaviest first, lengths 8, 7, ..., 1 on 3 blocks (36 in all, 12 on average): 8, 7, 6, then
    // 5 -> 6 + 5 = 11, 4 -> 7 + 4, 3 -> 8 + 3, 2 -> 11 + 2 = 13, 1 -> 11 + 1 = 12: 13.
    CHECK(busiest_block({8, 7, 6, 5, 4, 3, 2, 1}, 3) == doctest::Approx(13));
    // The light items first instead: 1, 2, 3, then 4 -> 1 + 4, 5 -> 2 + 5, 6 -> 3 + 6, 7 -> 5 + 7,
    // 8 -> 7 + 8 = 15: the order matters, heaviest first ends sooner.
    CHECK(busiest_block({1, 2, 3, 4, 5, 6, 7, 8}, 3) == doctest::Approx(15));
}
