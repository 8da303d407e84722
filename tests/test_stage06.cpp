// Stage 06 (causal masking by tiles) against the float64 reference, stage 05 and stage 04.
#include <cmath>

#include "../stages/04_cpu_tiling/attention.hpp"
#include "../stages/05_shared_memory_kernel/attention.cuh"
#include "../stages/06_causal_masking/attention.cuh"
#include "fa/cuda/stage.hpp"
#include "fa/error.hpp"
#include "support.hpp"

using namespace fa;

TEST_CASE("stage 06 matches the float64 reference on the standard cases, d = 32, 64, 128") {
    for (const test::Case& c : test::standard_cases({32, 64, 128})) test::check_against_reference(stage06::attention, c);
}

TEST_CASE("stage 06 matches stage 05 without the mask and stage 04 with it") {
    for (const test::Case& c : test::standard_cases({64, 128})) {
        if (c.problem.causal) {
            test::check_against_stage(stage06::attention, stage04::attention, c, "stage 04");
        } else {
            test::check_against_stage(stage06::attention, stage05::attention, c, "stage 05");
        }
    }
}

TEST_CASE("stage 06 handles the diagonal wherever it falls: Nq and Nk around the 64-row blocks") {
    const int64_t sizes[][2] = {{64, 64}, {65, 64}, {64, 65}, {127, 129}, {129, 127}, {256, 200}, {200, 256}, {1, 300}, {300, 1}};
    uint64_t seed = 700;
    for (int64_t d : {32, 64, 128}) {
        for (const auto& s : sizes) {
            test::Case c;
            c.problem = test::make_problem(1, 2, s[0], s[1], d, true);
            c.layout = seed % 2 ? Layout::BNHD : Layout::BHND;
            c.seed = seed++;
            test::check_against_reference(stage06::attention, c);
        }
    }
}

TEST_CASE("stage 06 writes every output element; rows and whole query tiles that see no key get O = 0, LSE = -inf") {
    // Nq = 300 > Nk = 100, causal: rows 0..199 see nothing, so query tiles 0..2 skip every key
    // tile and tile 3 (rows 192..255) mixes blind rows with seeing ones.
    for (int64_t d : {32, 64, 128}) {
        const Problem p = test::make_problem(2, 1, 300, 100, d, true);
        const Inputs in = make_inputs(p, Layout::BNHD, InputKind::Normal, 13);
        const test::Result got = test::run(stage06::attention, p, in, Layout::BNHD);
        test::check_rows_without_keys(p, got);
    }
}

TEST_CASE("stage 06 counts the key tiles it computes, masks and skips") {
    // Nq = Nk = 256, causal, 64 x 64 tiles: query tile t sees key tiles 0..t-1 in full and tile t
    // in part, so 0+1+2+3 = 6 tiles unmasked, 4 on the diagonal, 6 skipped.
    stage06::TileCounts c = stage06::count_tiles(test::make_problem(1, 1, 256, 256, 64, true));
    CHECK(c.total == 16);
    CHECK(c.unmasked == 6);
    CHECK(c.masked == 4);
    CHECK(c.skipped == 6);
    // Without the mask only the partial last key tile (keys 192..199) needs one.
    c = stage06::count_tiles(test::make_problem(1, 1, 256, 200, 64, false));
    CHECK(c.unmasked == 12);
    CHECK(c.masked == 4);
    CHECK(c.skipped == 0);
    // At N = 8192 nearly half the tiles are skipped.
    c = stage06::count_tiles(test::make_problem(1, 1, 8192, 8192, 64, true));
    CHECK(c.skipped == 128 * 127 / 2);
    CHECK(c.masked == 128);
}

TEST_CASE("stage 06 on a larger causal problem with large magnitudes") {
    test::Case c;
    c.problem = test::make_problem(1, 2, 1500, 1300, 128, true);
    c.inputs = InputKind::Large;
    c.seed = 31;
    test::check_against_reference(stage06::attention, c);
}

TEST_CASE("stage 06 refuses head dimensions it has no kernel for") {
    CHECK_THROWS_WITH_AS(stage06::check_supported(test::make_problem(1, 1, 16, 16, 96, false)),
                         "head_dim 96 is not supported by stage 06: use 32, 64 or 128", InputError);
}

TEST_CASE("stage 06 gives the same result whichever order the query tiles run in") {
    for (bool causal : {true, false}) {
        const Problem p = test::make_problem(3, 2, 333, 301, 64, causal);
        const Inputs in = make_inputs(p, Layout::BNHD, InputKind::Normal, 17);
        test::Result by_order[2];
        const stage06::Schedule orders[2] = {stage06::Schedule::HeavyFirst, stage06::Schedule::InOrder};
        for (int k = 0; k < 2; ++k) {
            const stage06::Schedule order = orders[k];
            by_order[k] = test::run(
                [order](const Problem& pr, View4<const float> q, View4<const float> kk, View4<const float> v, View4<float> o,
                        View3<float> lse) {
                    cuda::run_on_device(
                        [order](const Problem& pd, View4<const float> dq, View4<const float> dk, View4<const float> dv,
                                View4<float> dout, View3<float> dlse,
                                cudaStream_t s) { stage06::attention_device(pd, dq, dk, dv, dout, dlse, s, order); },
                        pr, q, kk, v, o, lse);
                },
                p, in, Layout::BNHD);
        }
        CHECK(by_order[0].o == by_order[1].o);  // each query tile is computed the same way wherever it runs
        CHECK(by_order[0].lse == by_order[1].lse);
    }
}
