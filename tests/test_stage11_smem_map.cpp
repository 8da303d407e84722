// Stage 11's shared-memory map (stages/11_hopper_kernel/smem_map.hpp) on the CPU: the committed
// docs/results/stage11_smem_map.json, which the lesson's picture is drawn from, is what the kernel's
// layout constants give now; every map is a layout the hardware accepts (no overlap, tiles on the
// swizzle's 1024-byte atoms, mbarriers on 8 bytes, within the launch's shared memory and the SM's);
// and the map's steps are attention.cu's (describe_config()).
//
//   test_stage11_smem_map                      the checks (no GPU needed; with a Hopper GPU, the
//                                              persistent steps' describe_config() too)
//   test_stage11_smem_map --write FILE         writes the JSON (docs/results/stage11_smem_map.json)
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "attention.cuh"
#include "fa/cuda/hopper.hpp"
#include "smem_map.hpp"

#ifndef FA_SMEM_MAP_JSON
#error "FA_SMEM_MAP_JSON: the path of docs/results/stage11_smem_map.json (tests/CMakeLists.txt sets it)"
#endif

using fa::stage11::smem_map;
using fa::stage11::smem_maps;
using fa::stage11::SmemMap;
using fa::stage11::SmemRegion;

namespace {

/// The shared memory an SM has for its blocks (228 KB), the most one block may ask for (227 KB),
/// and what the hardware keeps per block (1 KB), on Hopper (H100, H200).
constexpr std::size_t kSmPerSm = 228 * 1024, kSmPerBlock = 227 * 1024, kReservedPerBlock = 1024;

std::string what(const SmemMap& m) {
    return "step " + std::to_string(m.step) + ", d = " + std::to_string(m.head_dim) + (m.small_blocks ? ", small blocks" : "");
}

}  // namespace

TEST_CASE("the committed docs/results/stage11_smem_map.json is what the kernel's constants give now") {
    std::ifstream in(FA_SMEM_MAP_JSON, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot read " FA_SMEM_MAP_JSON);
    const std::string committed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string now = fa::stage11::smem_maps_json();
    CHECK_MESSAGE(committed == now, "kernel.cuh's layout changed: regenerate with `test_stage11_smem_map --write " FA_SMEM_MAP_JSON
                                    "` and commit the file (the lesson's picture is drawn from it)");
}

TEST_CASE("every step's map: regions in address order, no overlap, aligned as TMA, wgmma and mbarriers need, within its shared memory") {
    const std::vector<SmemMap> maps = smem_maps();
    CHECK(maps.size() == 2 * 17 + 7);  // steps 1-17 at d = 64 and 128, the small blocks of steps 11-17
    for (const SmemMap& m : maps) {
        CAPTURE(what(m));
        REQUIRE(!m.regions.empty());
        CHECK(m.regions.front().name == "Q");
        CHECK(m.regions.front().offset == 0);
        int end = 0, tiles = 0, barriers = 0, barrier_bytes = 0;
        for (const SmemRegion& r : m.regions) {
            CAPTURE(r.name);
            CHECK(r.bytes > 0);
            CHECK(r.offset >= end);  // in address order, and no region overlaps the one before
            end = r.offset + r.bytes;
            if (r.kind == "tile") {
                ++tiles;
                // The 128-byte swizzle is a function of the address bits: TMA and wgmma read a
                // swizzled tile correctly only from a 1024-byte boundary (its 8 rows x 128 bytes).
                CHECK(r.offset % 1024 == 0);
                CHECK(r.bytes % 1024 == 0);
            } else if (r.kind == "barrier") {
                ++barriers;
                CHECK(r.bytes == 8);
                CHECK(r.offset % 8 == 0);  // an mbarrier is a 64-bit word, 8-byte aligned
                barrier_bytes += r.bytes;
            } else {
                REQUIRE(r.kind == "mailbox");
                CHECK(r.offset % 4 == 0);  // unsigned or int entries
                barrier_bytes += r.bytes;
            }
        }
        // Every byte the launch asks for is accounted for: the 1024 bytes of slack the kernel uses
        // to align its base, then the regions up to the last byte of the barrier area (the persistent
        // grid's mailbox without step 12 uses 8 of its 16 bytes).
        CHECK(std::size_t(m.align_slack) + std::size_t(end) <= m.smem_bytes);
        CHECK(m.smem_bytes - std::size_t(m.align_slack) - std::size_t(end) < 16);
        CHECK(m.align_slack == 1024);
        // One block fits, and blocks_per_sm blocks fit in an SM together.
        CHECK(m.smem_bytes <= kSmPerBlock);
        CHECK((m.smem_bytes + kReservedPerBlock) * std::size_t(m.blocks_per_sm) <= kSmPerSm);
        // Q, two tiles per ring slot, O where it has a buffer of its own.
        CHECK(tiles == 1 + 2 * m.stages + (m.o_buffer ? 1 : 0));
        CHECK(m.slots == (m.split_ring ? 2 * m.stages : m.stages));
        CHECK(barriers == 1 + 2 * m.slots + (m.persistent ? 5 : 0));
        CHECK(barrier_bytes <= 8 * (1 + 2 * m.slots + (m.persistent ? 5 + (m.claim_ahead ? 6 : 2) : 0)));
        CHECK(m.regions.front().bytes == m.br * m.head_dim * 2);
    }
}

TEST_CASE("the maps follow the road: a ring per slot, split at step 15 (d = 128), O's buffer from steps 13 and 15") {
    // Step 1 copies with cp.async: its barriers are allocated, never used; step 2 uses Q's and the
    // full ones; from step 3 every barrier is used.
    for (const int d : {64, 128}) {
        CAPTURE(d);
        for (const SmemRegion& r : smem_map(1, d).regions) CHECK((r.kind != "barrier" || !r.used));
        for (const SmemRegion& r : smem_map(2, d).regions)
            if (r.kind == "barrier") CHECK(r.used == (r.name.find("empty") == std::string::npos));
        for (int step = 3; step <= 17; ++step)
            for (const SmemRegion& r : smem_map(step, d).regions) CHECK(r.used);
        for (int step = 1; step <= 17; ++step) {
            const SmemMap m = smem_map(step, d);
            CAPTURE(step);
            CHECK(m.o_in_q == (step == 7 || step == 8));
            CHECK(m.o_buffer == (step >= (d == 64 ? 13 : 15)));
            CHECK(m.split_ring == (d == 128 && step >= 15));
            CHECK(m.persistent == (step >= 9));
        }
    }
    // Step 15 at d = 128: K's slots first, then V's, then O.
    const SmemMap m = smem_map(15, 128);
    std::vector<std::string> tiles;
    for (const SmemRegion& r : m.regions)
        if (r.kind == "tile") tiles.push_back(r.name);
    CHECK(tiles == std::vector<std::string>{"Q", "K slot 0", "K slot 1", "V slot 0", "V slot 1", "O"});
    CHECK_THROWS(smem_map(0, 64));
    CHECK_THROWS(smem_map(18, 64));
    CHECK_THROWS(smem_map(4, 96));
    CHECK_THROWS(smem_map(10, 64, true));
    CHECK_THROWS(smem_map(12, 128, true));
}

TEST_CASE("the map's steps are attention.cu's: describe_config() gives the same Br, Bc, warpgroups, ring and shared memory") {
    // describe_config() asks the GPU for its SM count for the persistent grid (steps 9 on): those
    // are checked where a Hopper GPU answers (the GPU session's test run), steps 1-8 everywhere.
    const bool gpu = fa::cuda::hopper_unavailable_reason().empty();
    const std::regex pattern(R"(Br=(\d+) Bc=(\d+), (\d+) consumer warpgroup.*, (\d+)-slot ring.*, (\d+) B shared memory;)");
    for (const SmemMap& m : smem_maps()) {
        if (m.persistent && !gpu) continue;
        CAPTURE(what(m));
        fa::Problem p;
        p.heads = 2;
        p.seq_q = p.seq_k = 1024;  // at most 1024 keys: a causal d = 64 head takes the small blocks from step 11 on
        p.head_dim = m.head_dim;
        p.causal = m.small_blocks;
        REQUIRE(fa::stage11::runs_small_blocks(p, m.step) == m.small_blocks);
        const std::string text = fa::stage11::describe_config(p, m.step);
        CAPTURE(text);
        std::smatch got;
        REQUIRE(std::regex_search(text, got, pattern));
        CHECK(std::stoi(got[1]) == m.br);
        CHECK(std::stoi(got[2]) == m.bc);
        CHECK(std::stoi(got[3]) == m.consumers);
        CHECK(std::stoi(got[4]) == m.stages);
        CHECK(std::stoull(got[5]) == m.smem_bytes);
        CHECK((text.find("rings of K and of V") != std::string::npos) == m.split_ring);  // "2-slot rings of K and of V"
    }
}

int main(int argc, char** argv) {
    if (argc == 3 && std::strcmp(argv[1], "--write") == 0) {
        std::ofstream out(argv[2], std::ios::binary);
        out << fa::stage11::smem_maps_json();
        if (!out.good()) {
            std::fprintf(stderr, "cannot write %s\n", argv[2]);
            return 1;
        }
        std::printf("wrote %s\n", argv[2]);
        return 0;
    }
    doctest::Context context(argc, argv);
    return context.run();
}
