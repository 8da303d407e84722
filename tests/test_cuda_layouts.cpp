// The tensor-core layouts of fa/cuda/layouts.hpp (stages 07 and 09), checked on the host: the
// swizzle is a bijection that frees ldmatrix and cp.async of bank conflicts, the kernels' fragment
// addresses agree with it, the fragment maps of mma.m16n8k16 cover their tiles (with the
// accumulator-to-operand identity P relies on), and each ldmatrix lane pattern, run through
// ldmatrix as the PTX ISA defines it, delivers exactly the fragment mma.m16n8k16 reads.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <set>
#include <vector>

#include "fa/cuda/layouts.hpp"

using namespace fa::cuda;

namespace {

constexpr int kRows = 128;

// The 16-byte slot of shared memory (0..7 within a 128-byte bank line) an element offset falls in.
int bank_slot(int element_offset) { return (element_offset * 2 / 16) % 8; }

template <int kCols, bool kSwizzle>
void check_bijection() {
    std::vector<int> hits(size_t(kRows * kCols), 0);
    for (int r = 0; r < kRows; ++r)
        for (int c = 0; c < kCols; ++c) {
            const int off = TileLayout<kCols, kSwizzle>::offset(r, c);
            REQUIRE(off >= 0);
            REQUIRE(off < kRows * kCols);
            ++hits[size_t(off)];
            // Elements of one 16-byte chunk stay together and in order (16-byte copies still work).
            if (c % 8) CHECK(off == TileLayout<kCols, kSwizzle>::offset(r, c - c % 8) + c % 8);
        }
    for (int h : hits) CHECK(h == 1);
}

// Worst number of rows of one ldmatrix phase (the same 16-byte column of 8 consecutive rows)
// that share a bank slot: 1 means conflict-free.
template <int kCols, bool kSwizzle>
int ldmatrix_conflict_ways() {
    int worst = 0;
    for (int r0 = 0; r0 < kRows; r0 += 8)
        for (int c = 0; c < kCols; c += 8) {
            int count[8] = {};
            for (int r = r0; r < r0 + 8; ++r) ++count[bank_slot(TileLayout<kCols, kSwizzle>::offset(r, c))];
            for (int k : count) worst = std::max(worst, k);
        }
    return worst;
}

// cp.async: each quarter warp (8 threads) writes 8 consecutive 16-byte chunks of the tile.
template <int kCols, bool kSwizzle>
int cp_async_conflict_ways() {
    int worst = 0;
    constexpr int kChunksPerRow = kCols / 8;
    for (int first = 0; first < kRows * kChunksPerRow; first += 8) {
        int count[8] = {};
        for (int chunk = first; chunk < first + 8; ++chunk)
            ++count[bank_slot(TileLayout<kCols, kSwizzle>::offset(chunk / kChunksPerRow, (chunk % kChunksPerRow) * 8))];
        for (int k : count) worst = std::max(worst, k);
    }
    return worst;
}

// The kernels' address arithmetic: lane part ^ xor_bits(c0) + add_bits(r0, c0) == the layout.
template <int kCols, bool kSwizzle>
void check_fragment_addresses() {
    using L = TileLayout<kCols, kSwizzle>;
    for (int lane = 0; lane < 32; ++lane) {
        // The three ldmatrix patterns: A (Q, P; K_w, V_w), K (B of S; Q, dO in the backward),
        // V (B of O, .trans; dO, Q, K in the backward).
        const Element patterns[3] = {a_lane_element(lane), k_lane_element(lane), v_lane_element(lane)};
        const uint32_t lane_parts[3] = {a_lane_bytes<L>(lane), k_lane_bytes<L>(lane), v_lane_bytes<L>(lane)};
        for (int i = 0; i < 3; ++i) {
            const Element pat = patterns[i];
            CHECK(lane_parts[i] == uint32_t(L::offset(pat.row, pat.col)) * 2);
            for (int r0 = 0; r0 + 16 <= kRows; r0 += 16)
                for (int c0 = 0; c0 + 16 <= kCols; c0 += 16)
                    CHECK(fragment_address<L>(lane_parts[i], r0, c0) == uint32_t(L::offset(r0 + pat.row, c0 + pat.col)) * 2);
        }
    }
}

// ldmatrix.x4 as the PTX ISA defines it, on a shared tile given as 16-bit words: lanes 8m..8m+7
// give the byte addresses of rows 0..7 of matrix m; without .trans lane l receives, in register
// m, elements 2(l%4), 2(l%4)+1 of row l/4; with .trans, element l/4 of rows 2(l%4) and 2(l%4)+1.
using Registers = std::array<std::array<uint32_t, 4>, 32>;  // [lane][register]
Registers ldmatrix_x4(const std::vector<uint16_t>& smem, const uint32_t (&address)[32], bool trans) {
    Registers r{};
    for (int lane = 0; lane < 32; ++lane)
        for (int m = 0; m < 4; ++m) {
            const auto word = [&](int row, int element) { return uint32_t(smem[address[8 * m + row] / 2 + element]); };
            const int g = lane / 4, t = lane % 4;
            r[lane][m] = trans ? word(2 * t, g) | (word(2 * t + 1, g) << 16) : word(g, 2 * t) | (word(g, 2 * t + 1) << 16);
        }
    return r;
}

// A tile whose element (row, col) holds the value row * 256 + col (rows, cols < 256), stored
// through the layout; (half of) a register then names the element it holds.
template <class L>
std::vector<uint16_t> numbered_tile(int rows, int cols) {
    std::vector<uint16_t> smem(size_t(rows * cols));
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) smem[size_t(L::offset(r, c))] = uint16_t(r * 256 + c);
    return smem;
}
Element held(uint32_t reg, int half) {
    const uint32_t v = half ? reg >> 16 : reg & 0xffffu;
    return {int(v / 256), int(v % 256)};
}

// Each pattern at every 16 x 16 block of a tile: the registers are the fragments mma.m16n8k16 reads.
template <int kCols, bool kSwizzle>
void check_lane_patterns() {
    using L = TileLayout<kCols, kSwizzle>;
    constexpr int kTileRows = 64;
    const std::vector<uint16_t> smem = numbered_tile<L>(kTileRows, kCols);
    for (int r0 = 0; r0 < kTileRows; r0 += 16)
        for (int c0 = 0; c0 < kCols; c0 += 16) {
            uint32_t a[32], k[32], v[32];
            for (int lane = 0; lane < 32; ++lane) {
                a[lane] = fragment_address<L>(a_lane_bytes<L>(lane), r0, c0);
                k[lane] = fragment_address<L>(k_lane_bytes<L>(lane), r0, c0);
                v[lane] = fragment_address<L>(v_lane_bytes<L>(lane), r0, c0);
            }
            const Registers ra = ldmatrix_x4(smem, a, false), rk = ldmatrix_x4(smem, k, false),
                            rv = ldmatrix_x4(smem, v, true), rt = ldmatrix_x4(smem, k, true);
            for (int lane = 0; lane < 32; ++lane)
                for (int reg = 0; reg < 4; ++reg)
                    for (int half = 0; half < 2; ++half) {
                        // A (Q, P): the tile's block as it stands, A[i][j] = tile[r0 + i][c0 + j].
                        const Element ea = a_fragment_element(lane, reg, half), ha = held(ra[lane][reg], half);
                        CHECK(ha.row == r0 + ea.row);
                        CHECK(ha.col == c0 + ea.col);
                        // K: registers 0, 1 are the B fragment of n-tile 0 (rows r0..r0+7 of the
                        // tile), 2, 3 of n-tile 1; B[k][n] = K[n][k], K stored one n per row.
                        const Element eb = b_fragment_element(lane, reg % 2, half), hk = held(rk[lane][reg], half);
                        CHECK(hk.row == r0 + 8 * (reg / 2) + eb.col);
                        CHECK(hk.col == c0 + eb.row);
                        // V with .trans: B[k][n] = V[k][n], V stored one k per row; registers 2, 3
                        // are n-tile 1 (columns c0+8..).
                        const Element hv = held(rv[lane][reg], half);
                        CHECK(hv.row == r0 + eb.row);
                        CHECK(hv.col == c0 + 8 * (reg / 2) + eb.col);
                        // The K pattern with .trans: the A fragment of the tile's transpose,
                        // A[i][j] = tile[r0 + j][c0 + i] (stage 09's dS read from dS^T).
                        const Element ht = held(rt[lane][reg], half);
                        CHECK(ht.row == r0 + ea.col);
                        CHECK(ht.col == c0 + ea.row);
                    }
        }
}

}  // namespace

TEST_CASE("the tile layouts are bijections that keep 16-byte chunks whole") {
    check_bijection<32, false>();
    check_bijection<32, true>();
    check_bijection<64, false>();
    check_bijection<64, true>();
    check_bijection<128, true>();
    check_bijection<256, true>();
}

TEST_CASE("the swizzle frees ldmatrix and cp.async of bank conflicts; the plain layout does not") {
    // Plain rows of 128 bytes or more put a column of 8 rows in one bank slot: 8-way conflicts.
    CHECK(ldmatrix_conflict_ways<64, false>() == 8);
    CHECK(ldmatrix_conflict_ways<128, false>() == 8);
    CHECK(ldmatrix_conflict_ways<32, false>() == 4);  // 64-byte rows: two rows per 128-byte line
    CHECK(ldmatrix_conflict_ways<32, true>() == 1);
    CHECK(ldmatrix_conflict_ways<64, true>() == 1);
    CHECK(ldmatrix_conflict_ways<128, true>() == 1);
    CHECK(ldmatrix_conflict_ways<256, true>() == 1);
    CHECK(cp_async_conflict_ways<32, true>() == 1);
    CHECK(cp_async_conflict_ways<64, true>() == 1);
    CHECK(cp_async_conflict_ways<128, true>() == 1);
    CHECK(cp_async_conflict_ways<256, true>() == 1);
}

TEST_CASE("the kernels' fragment addresses (one XOR, one immediate) agree with the layout") {
    check_fragment_addresses<32, false>();
    check_fragment_addresses<32, true>();
    check_fragment_addresses<64, false>();
    check_fragment_addresses<64, true>();
    check_fragment_addresses<128, true>();
    check_fragment_addresses<256, true>();
}

TEST_CASE("the mma.m16n8k16 fragment maps cover their tiles exactly once") {
    std::set<std::pair<int, int>> a, b, c;
    for (int lane = 0; lane < 32; ++lane) {
        for (int reg = 0; reg < 4; ++reg)
            for (int half = 0; half < 2; ++half) {
                const Element e = a_fragment_element(lane, reg, half);
                CHECK(a.insert({e.row, e.col}).second);
            }
        for (int reg = 0; reg < 2; ++reg)
            for (int half = 0; half < 2; ++half) {
                const Element e = b_fragment_element(lane, reg, half);
                CHECK(b.insert({e.row, e.col}).second);
            }
        for (int i = 0; i < 4; ++i) {
            const Element e = c_fragment_element(lane, i);
            CHECK(c.insert({e.row, e.col}).second);
        }
    }
    CHECK(a.size() == 256);
    CHECK(b.size() == 128);
    CHECK(c.size() == 128);
    for (const auto& e : a) CHECK((e.first < 16 && e.second < 16));
    for (const auto& e : b) CHECK((e.first < 16 && e.second < 8));
    for (const auto& e : c) CHECK((e.first < 16 && e.second < 8));
}

TEST_CASE("two neighbouring accumulator tiles are, element for element, one A fragment (P stays in registers)") {
    // The kernel packs C tile 2k (keys 16k..16k+7) and C tile 2k+1 (keys 16k+8..) into A registers
    // a0 = C_2k{c0,c1}, a1 = C_2k{c2,c3}, a2 = C_2k+1{c0,c1}, a3 = C_2k+1{c2,c3}.
    for (int lane = 0; lane < 32; ++lane)
        for (int reg = 0; reg < 4; ++reg)
            for (int half = 0; half < 2; ++half) {
                const int tile = reg / 2;                     // which of the two C tiles
                const int index = (reg % 2) * 2 + half;       // which accumulator of it
                const Element from_c = c_fragment_element(lane, index);
                const Element as_a = a_fragment_element(lane, reg, half);
                CHECK(as_a.row == from_c.row);
                CHECK(as_a.col == from_c.col + 8 * tile);
            }
}

TEST_CASE("each ldmatrix lane pattern delivers the mma.m16n8k16 fragment it is named after, swizzled or not") {
    check_lane_patterns<32, false>();
    check_lane_patterns<32, true>();
    check_lane_patterns<64, false>();
    check_lane_patterns<64, true>();
    check_lane_patterns<128, true>();
    check_lane_patterns<256, true>();
}
