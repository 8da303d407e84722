// Stage 07's layouts, checked on the host: the swizzle is a bijection that frees ldmatrix and
// cp.async of bank conflicts, the kernel's fragment addresses agree with it, and the fragment
// maps of mma.m16n8k16 cover their tiles (with the accumulator-to-operand identity P relies on).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <set>
#include <vector>

#include "layout.hpp"

using namespace fa::stage07;

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

// The kernel's address arithmetic: lane part ^ xor_bits(c0) + add_bits(r0, c0) == the layout.
template <int kCols, bool kSwizzle>
void check_fragment_addresses() {
    using L = TileLayout<kCols, kSwizzle>;
    for (int lane = 0; lane < 32; ++lane) {
        // The three ldmatrix patterns of the kernel: A (Q, P), K (B of S), V (B of O, .trans).
        const int patterns[3][2] = {{lane % 16, (lane / 16) * 8},
                                    {(lane / 16) * 8 + lane % 8, ((lane / 8) % 2) * 8},
                                    {((lane / 8) % 2) * 8 + lane % 8, (lane / 16) * 8}};
        for (const auto& pat : patterns) {
            const uint32_t lane_bytes = uint32_t(L::offset(pat[0], pat[1])) * 2;
            for (int r0 = 0; r0 + 16 <= kRows; r0 += 16)
                for (int c0 = 0; c0 + 16 <= kCols; c0 += 16)
                    CHECK(((lane_bytes ^ L::xor_bits(c0)) + L::add_bits(r0, c0)) == uint32_t(L::offset(r0 + pat[0], c0 + pat[1])) * 2);
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

TEST_CASE("the kernel's fragment addresses (one XOR, one immediate) agree with the layout") {
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
