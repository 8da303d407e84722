// Stage 02 (safe softmax) against stage 01 and the float64 reference.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "../stages/01_naive_attention/attention.hpp"
#include "../stages/02_safe_softmax/attention.hpp"
#include "fa/counts.hpp"
#include "support.hpp"

using namespace fa;

namespace {

const std::vector<int64_t> kHeadDims{1, 2, 7, 16, 64, 128, 200};

}  // namespace

TEST_CASE("stage 02 matches the float64 reference on every standard case, large inputs included") {
    for (const test::Case& c : test::standard_cases(kHeadDims)) test::check_against_reference(stage02::attention, c);
}

TEST_CASE("stage 02 matches stage 01 wherever stage 01 does not overflow") {
    for (const test::Case& c : test::standard_cases(kHeadDims)) {
        if (c.inputs == InputKind::Large) continue;  // stage 01 overflows there by design
        test::check_against_stage(stage02::attention, stage01::attention, c, "stage 01");
    }
}

TEST_CASE("stage 02 stays finite where stage 01 overflows") {
    const Problem p = test::make_problem(1, 2, 64, 80, 64, false);
    const Inputs in = make_inputs(p, Layout::BHND, InputKind::Large, 7);
    const test::Result naive = test::run(stage01::attention, p, in, Layout::BHND);
    const test::Result safe = test::run(stage02::attention, p, in, Layout::BHND);
    int64_t naive_nonfinite = 0, safe_nonfinite = 0;
    for (float x : naive.o) naive_nonfinite += !std::isfinite(x);
    for (float x : safe.o) safe_nonfinite += !std::isfinite(x);
    for (float x : safe.lse) safe_nonfinite += !std::isfinite(x);
    CHECK(naive_nonfinite > 0);  // the premise: these inputs do overflow exp(s)
    CHECK(safe_nonfinite == 0);
}

TEST_CASE("stage 02 reproduces the lesson's worked example softmax([3, 2, 5, 1])") {
    // One query q = e_0 and keys k_j = x_j e_0 with scale 1 make the scores exactly x = [3, 2, 5, 1];
    // values v_j = e_j make the output row the probabilities themselves.
    Problem p = test::make_problem(1, 1, 1, 4, 4, false);
    p.scale = 1.0;
    Inputs in{HostTensor(1, 1, 1, 4, Layout::BHND), HostTensor(1, 1, 4, 4, Layout::BHND), HostTensor(1, 1, 4, 4, Layout::BHND)};
    const float x[4] = {3, 2, 5, 1};
    in.q.view(0, 0, 0, 0) = 1.0f;
    for (int64_t j = 0; j < 4; ++j) {
        in.k.view(0, 0, j, 0) = x[j];
        in.v.view(0, 0, j, j) = 1.0f;
    }
    const test::Result got = test::run(stage02::attention, p, in, Layout::BHND);
    const double expected[4] = {0.11245721367093255, 0.04137069692096015, 0.8309526605439513, 0.015219428864155926};
    for (int j = 0; j < 4; ++j) CHECK(got.o[size_t(j)] == doctest::Approx(expected[j]).epsilon(1e-6));
    CHECK(got.lse[0] == doctest::Approx(5.185182452603812).epsilon(1e-6));  // 5 + log(1.2034...)
}

TEST_CASE("stage 02 gives O = 0 and LSE = -inf to rows that see no key") {
    const Problem p = test::make_problem(1, 1, 9, 4, 8, true);  // rows 0..4 see nothing
    const Inputs in = make_inputs(p, Layout::BNHD, InputKind::Normal, 3);
    const test::Result got = test::run(stage02::attention, p, in, Layout::BNHD);
    for (int64_t i = 0; i < 9; ++i) {
        const bool sees_nothing = i < 5;
        CHECK(std::isinf(got.lse[size_t(i)]) == sees_nothing);
        if (sees_nothing) {
            CHECK(got.lse[size_t(i)] < 0);
            for (int64_t x = 0; x < 8; ++x) CHECK(got.o[size_t(i * 8 + x)] == 0.0f);
        }
    }
    for (float x : got.o) CHECK(std::isfinite(x));
}

TEST_CASE("stage 02 gives the same logical result in both layouts") {
    const Problem p = test::make_problem(2, 3, 41, 59, 24, true);
    const test::Result a = test::run(stage02::attention, p, make_inputs(p, Layout::BHND, InputKind::Normal, 5), Layout::BHND);
    const test::Result b = test::run(stage02::attention, p, make_inputs(p, Layout::BNHD, InputKind::Normal, 5), Layout::BNHD);
    CHECK(a.o == b.o);  // the layout moves bytes, not arithmetic: bit for bit
    CHECK(a.lse == b.lse);
}

TEST_CASE("stage 02 holds half of stage 01's intermediate memory: P overwrites S") {
    const Problem p = test::make_problem(1, 1, 16384, 16384, 64, false);
    CHECK(stage02::intermediate_bytes(p) < 0.51 * stage01::intermediate_bytes(p));
    CHECK(stage02::intermediate_bytes(p) >= score_matrix_bytes(p));  // still one full Nq x Nk matrix
}
