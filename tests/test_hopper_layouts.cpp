// Hopper's layouts, checked on the host (fa/cuda/wgmma_layout.hpp): the bit fields of wgmma's
// shared-memory matrix descriptor, the 128-byte swizzle of TMA boxes and wgmma operands, the
// m64nN accumulator fragment and its repacking into the A operand of the RS form.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <set>
#include <utility>
#include <vector>

#include "fa/cuda/wgmma_layout.hpp"

using namespace fa::cuda::wgmma_layout;

TEST_CASE("each field of the wgmma descriptor sits where the PTX ISA puts it") {
    // One field at a time, its lowest encoded bit: start address bit 0, LBO bit 16, SBO bit 32,
    // base offset bit 49, swizzle bits 62-63 (128 B = 1, 64 B = 2, 32 B = 3).
    CHECK(encode_descriptor(16, 0, 0, Swizzle::None) == 1ull);
    CHECK(encode_descriptor(0, 16, 0, Swizzle::None) == 1ull << 16);
    CHECK(encode_descriptor(0, 0, 16, Swizzle::None) == 1ull << 32);
    CHECK(encode_descriptor(0, 0, 0, Swizzle::None, 1) == 1ull << 49);
    CHECK(encode_descriptor(0, 0, 0, Swizzle::B128) == 1ull << 62);
    CHECK(encode_descriptor(0, 0, 0, Swizzle::B64) == 2ull << 62);
    CHECK(encode_descriptor(0, 0, 0, Swizzle::B32) == 3ull << 62);
    // Each field is 14 bits of (bytes >> 4), and fields never spill into each other.
    CHECK(encode_descriptor(0x3FFF0, 0, 0, Swizzle::None) == 0x3FFFull);
    CHECK(encode_descriptor(0, 0x3FFF0, 0, Swizzle::None) == 0x3FFFull << 16);
    CHECK(encode_descriptor(0, 0, 0x3FFF0, Swizzle::None) == 0x3FFFull << 32);
    // The bits no field uses stay zero.
    const uint64_t all = encode_descriptor(0x3FFF0, 0x3FFF0, 0x3FFF0, Swizzle::B32, 7);
    const uint64_t unused = (3ull << 14) | (3ull << 30) | (7ull << 46) | (0x3FFull << 52);
    CHECK((all & unused) == 0);
}

TEST_CASE("the descriptor decodes to what was encoded") {
    for (uint32_t start : {0u, 16u, 1024u, 49152u, 0x3FFF0u})
        for (uint32_t lbo : {0u, 16u, 8192u, 16384u})
            for (uint32_t sbo : {16u, 1024u, 2048u})
                for (Swizzle sw : {Swizzle::None, Swizzle::B128, Swizzle::B64, Swizzle::B32}) {
                    const Descriptor d = decode_descriptor(encode_descriptor(start, lbo, sbo, sw));
                    INFO("start " << start << " lbo " << lbo << " sbo " << sbo << " swizzle " << int(sw));
                    CHECK(d.start_address == start);
                    CHECK(d.leading_byte_offset == lbo);
                    CHECK(d.stride_byte_offset == sbo);
                    CHECK(d.base_offset == 0);
                    CHECK(d.swizzle == sw);
                }
}

TEST_CASE("the operand descriptors of the stage: k-slices inside and across 64-column boxes") {
    const uint32_t tile = 3 * 1024;  // a tile address on a 1024-byte boundary
    for (int rows : {64, 128}) {
        for (int k16 = 0; k16 < 8; ++k16) {  // d = 128: slices 0-3 in box 0, 4-7 in box 1
            const Descriptor a = decode_descriptor(k_major_descriptor(tile, rows, k16));
            INFO("rows " << rows << " k16 " << k16);
            CHECK(a.start_address == tile + uint32_t(k16 / 4 * rows * 128 + (k16 % 4) * 32));
            CHECK(a.stride_byte_offset == 1024);
            CHECK(a.swizzle == Swizzle::B128);
            const Descriptor v = decode_descriptor(mn_major_descriptor(tile, rows, k16 % (rows / 16)));
            CHECK(v.start_address == tile + uint32_t((k16 % (rows / 16)) * 2048));
            CHECK(v.leading_byte_offset == uint32_t(rows * 128));
            CHECK(v.stride_byte_offset == 1024);
        }
    }
}

TEST_CASE("the 128-byte swizzle permutes 16-byte chunks within each row, by the row's index mod 8") {
    for (int rows : {8, 64, 128, 256}) {
        std::vector<int> hits(size_t(rows) * 64, 0);
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < 64; ++c) {
                const uint32_t off = swizzle128_offset(r, c);
                INFO("row " << r << " col " << c << " offset " << off);
                REQUIRE(off % 2 == 0);
                REQUIRE(off < uint32_t(rows) * 128);
                CHECK(off / 128 == uint32_t(r));                        // a row stays in its 128 bytes
                CHECK((off % 128) / 16 == uint32_t((c / 8) ^ (r % 8)));  // chunk c goes to c ^ (r % 8)
                CHECK(off % 16 == uint32_t(c % 8) * 2);                 // inside a chunk, nothing moves
                CHECK(off == swizzle128_address(uint32_t(r * 128 + c * 2)));  // the same map on addresses
                ++hits[off / 2];
            }
        for (size_t i = 0; i < hits.size(); ++i) {
            INFO("rows " << rows << ": element slot " << i << " holds " << hits[i] << " elements");
            CHECK(hits[i] == 1);  // the inverse covers the box exactly once
        }
    }
}

TEST_CASE("a [rows, 128] tile is two swizzled boxes, together covering the tile once") {
    const int rows = 64;
    std::vector<int> hits(size_t(rows) * 128, 0);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < 128; ++c) {
            const uint32_t off = tile_offset(rows, r, c);
            CHECK(off / uint32_t(rows * 128) == uint32_t(c / 64));
            ++hits[off / 2];
        }
    for (int h : hits) CHECK(h == 1);
}

TEST_CASE("moving a K-major operand's start by 32 bytes reads the next 16 columns of the swizzled rows") {
    // wgmma computes each element's address as (start + plain row-major offset), then swizzles
    // the address bits. With the tile on a 1024-byte boundary, start + 32 k reaches element
    // (r, 16 k + c) where the TMA put it: the 16 columns never cross a 128-byte row.
    const uint32_t tile = 5 * 1024;
    for (int k = 0; k < 4; ++k)
        for (int r = 0; r < 64; ++r)
            for (int c = 0; c < 16; ++c) {
                const uint32_t plain = uint32_t(r / 8) * 1024 + uint32_t(r % 8) * 128 + uint32_t(c) * 2;  // SBO = 1024
                const uint32_t read = swizzle128_address(tile + uint32_t(k) * 32 + plain) - tile;
                INFO("k " << k << " row " << r << " col " << c);
                CHECK(read == swizzle128_offset(r, 16 * k + c));
            }
}

TEST_CASE("an MN-major operand (V as B, transposed) finds (key, feature) where the TMA put it") {
    // B of O += P V is V [keys, d]: k = key along the rows, n = feature along the columns. The
    // canonical MN-major layout with the 128-byte swizzle: n inside a 128-byte row (64 features),
    // the next 64 features LBO further, 8 keys per atom, the next 8 keys SBO further.
    const int rows = 128;
    const uint32_t tile = 2 * 1024;
    for (int k16 = 0; k16 < rows / 16; ++k16) {
        const Descriptor v = decode_descriptor(mn_major_descriptor(tile, rows, k16));
        for (int k = 0; k < 16; ++k)
            for (int n = 0; n < 128; ++n) {
                const uint32_t plain = uint32_t(n / 64) * v.leading_byte_offset + uint32_t(k / 8) * v.stride_byte_offset +
                                       uint32_t(k % 8) * 128 + uint32_t(n % 64) * 2;
                const uint32_t read = swizzle128_address(v.start_address + plain) - tile;
                INFO("k16 " << k16 << " key " << k << " feature " << n);
                CHECK(read == tile_offset(rows, 16 * k16 + k, n));
            }
    }
}

TEST_CASE("the m64nN accumulator covers its tile once; a row lives in the four lanes of one quad") {
    for (int n : {16, 64, 128, 256}) {
        std::set<std::pair<int, int>> seen;
        for (int thread = 0; thread < 128; ++thread)
            for (int i = 0; i < n / 2; ++i) {
                const Element e = accumulator_element(thread, i);
                INFO("n " << n << " thread " << thread << " register " << i << " -> (" << e.row << ", " << e.col << ")");
                REQUIRE(e.row >= 0);
                REQUIRE(e.row < 64);
                REQUIRE(e.col >= 0);
                REQUIRE(e.col < n);
                CHECK(e.row / 16 == thread / 32);                  // warp w: rows 16w..16w+15
                CHECK(e.row % 8 == (thread % 32) / 4);             // lane group g: rows g and g + 8
                CHECK(seen.insert({e.row, e.col}).second);
            }
        CHECK(seen.size() == size_t(64 * n));
    }
    // The PTX ISA's picture for one warp, first 8 columns: lane 0 holds (0,0) (0,1) (8,0) (8,1),
    // lane 5 holds (1,2) (1,3) (9,2) (9,3); warp 2 starts at row 32; group 1 is 8 columns right.
    CHECK(accumulator_element(0, 0).row == 0);
    CHECK(accumulator_element(5, 1).row == 1);
    CHECK(accumulator_element(5, 1).col == 3);
    CHECK(accumulator_element(5, 2).row == 9);
    CHECK(accumulator_element(5, 2).col == 2);
    CHECK(accumulator_element(64, 0).row == 32);
    CHECK(accumulator_element(0, 4).col == 8);
}

TEST_CASE("the RS A operand covers 64 x 16 once, and an accumulator repacks into it in place") {
    std::set<std::pair<int, int>> seen;
    for (int thread = 0; thread < 128; ++thread)
        for (int reg = 0; reg < 4; ++reg)
            for (int half = 0; half < 2; ++half) {
                const Element a = a_operand_element(thread, reg, half);
                CHECK(seen.insert({a.row, a.col}).second);
                // P for k-slice k: columns 16k..16k+15 of S, held by the same thread.
                for (int k = 0; k < 8; ++k) {
                    const Element s = accumulator_element(thread, accumulator_index_for_a(k, reg, half));
                    INFO("thread " << thread << " reg " << reg << " half " << half << " k " << k);
                    CHECK(s.row == a.row);
                    CHECK(s.col == a.col + 16 * k);
                }
            }
    CHECK(seen.size() == size_t(64 * 16));
}
