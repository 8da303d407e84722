// Stage 01 (naive attention) against the float64 reference.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "attention.hpp"
#include "support.hpp"

using namespace fa;

TEST_CASE("stage 01 matches the float64 reference on normal inputs") {
    for (const test::Case& c : test::standard_cases({1, 3, 16, 64, 128})) {
        if (c.inputs == InputKind::Large) continue;  // overflow there is the lesson, tested below
        test::check_against_reference(stage01::attention, c);
    }
}

TEST_CASE("stage 01's naive softmax overflows on large inputs, by design") {
    test::Case c;
    c.problem = test::make_problem(1, 1, 40, 50, 64, false);
    c.inputs = InputKind::Large;
    const Inputs in = make_inputs(c.problem, c.layout, c.inputs, 7);
    const test::Result got = test::run(stage01::attention, c.problem, in, c.layout);
    int64_t nonfinite = 0;
    for (float x : got.o) nonfinite += !std::isfinite(x);
    CHECK(nonfinite > 0);
}

TEST_CASE("stage 01 gives O = 0 and LSE = -inf to rows that see no key") {
    const Problem p = test::make_problem(1, 1, 9, 4, 8, true);  // rows 0..4 see nothing
    const Inputs in = make_inputs(p, Layout::BHND, InputKind::Normal, 3);
    const test::Result got = test::run(stage01::attention, p, in, Layout::BHND);
    for (int64_t i = 0; i < 5; ++i) {
        CHECK(std::isinf(got.lse[size_t(i)]));
        CHECK(got.lse[size_t(i)] < 0);
        for (int64_t x = 0; x < 8; ++x) CHECK(got.o[size_t(i * 8 + x)] == 0.0f);
    }
    CHECK(std::isfinite(got.lse[5]));
}
