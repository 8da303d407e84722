// Stage 03 (online softmax) against stage 02 and the float64 reference.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "../stages/02_safe_softmax/attention.hpp"
#include "../stages/03_online_softmax/attention.hpp"
#include "fa/counts.hpp"
#include "support.hpp"

using namespace fa;

namespace {

const std::vector<int64_t> kHeadDims{1, 2, 7, 16, 64, 128, 200};

}  // namespace

TEST_CASE("stage 03 matches stage 02 and the float64 reference on every standard case, large inputs included") {
    for (const test::Case& c : test::standard_cases(kHeadDims)) {
        const Inputs in = make_inputs(c.problem, c.layout, c.inputs, c.seed);
        const test::Result got = test::run(stage03::attention, c.problem, in, c.layout);
        const Reference ref = reference_attention(c.problem, in.q.cview(), in.k.cview(), in.v.cview());
        const Tolerances tol = test::tolerances_for(c.problem, in);
        test::check_close(got, ref.o, ref.lse, tol, c.name() + " vs float64 reference");
        const test::Result prev = test::run(stage02::attention, c.problem, in, c.layout);
        test::check_close(got, prev.o, prev.lse, tol, c.name() + " vs stage 02");
    }
}

TEST_CASE("stage 03 stays finite on large inputs, where the running maximum moves a lot") {
    for (bool causal : {false, true}) {
        const Problem p = test::make_problem(1, 2, 90, 120, 64, causal);
        const Inputs in = make_inputs(p, Layout::BHND, InputKind::Large, 11);
        const test::Result got = test::run(stage03::attention, p, in, Layout::BHND);
        for (float x : got.o) CHECK(std::isfinite(x));
        for (float x : got.lse) CHECK(std::isfinite(x));
    }
}

TEST_CASE("stage 03 handles a maximum that rises at every key") {
    // Scores 0, 1, 2, ..., 29: each key raises the running maximum, so every step rescales.
    Problem p = test::make_problem(1, 1, 1, 30, 1, false);
    p.scale = 1.0;
    Inputs in{HostTensor(1, 1, 1, 1, Layout::BHND), HostTensor(1, 1, 30, 1, Layout::BHND), HostTensor(1, 1, 30, 1, Layout::BHND)};
    in.q.view(0, 0, 0, 0) = 1.0f;
    for (int64_t j = 0; j < 30; ++j) {
        in.k.view(0, 0, j, 0) = float(j);
        in.v.view(0, 0, j, 0) = float(j);
    }
    const test::Result got = test::run(stage03::attention, p, in, Layout::BHND);
    const Reference ref = reference_attention(p, in.q.cview(), in.k.cview(), in.v.cview());
    CHECK(got.o[0] == doctest::Approx(ref.o[0]).epsilon(1e-6));
    CHECK(got.lse[0] == doctest::Approx(ref.lse[0]).epsilon(1e-6));
}

TEST_CASE("stage 03 gives O = 0 and LSE = -inf to rows that see no key") {
    const Problem p = test::make_problem(1, 2, 20, 6, 5, true);  // rows 0..13 see nothing
    const Inputs in = make_inputs(p, Layout::BHND, InputKind::Normal, 4);
    const test::Result got = test::run(stage03::attention, p, in, Layout::BHND);
    for (int64_t h = 0; h < 2; ++h) {
        for (int64_t i = 0; i < 20; ++i) {
            const float l = got.lse[size_t(h * 20 + i)];
            CHECK((std::isinf(l) && l < 0) == (i < 14));
            for (int64_t x = 0; x < 5; ++x) {
                const float y = got.o[size_t((h * 20 + i) * 5 + x)];
                CHECK(std::isfinite(y));
                if (i < 14) CHECK(y == 0.0f);
            }
        }
    }
}

TEST_CASE("stage 03 gives the same logical result in both layouts") {
    const Problem p = test::make_problem(2, 3, 41, 59, 24, true);
    const test::Result a = test::run(stage03::attention, p, make_inputs(p, Layout::BHND, InputKind::Normal, 5), Layout::BHND);
    const test::Result b = test::run(stage03::attention, p, make_inputs(p, Layout::BNHD, InputKind::Normal, 5), Layout::BNHD);
    CHECK(a.o == b.o);
    CHECK(a.lse == b.lse);
}

TEST_CASE("stage 03's memory does not grow with Nq * Nk") {
    const Problem p = test::make_problem(1, 1, 16384, 16384, 64, false);
    // O(N d): 12 MiB where the score matrix is 1 GiB; doubling N doubles it, not quadruples.
    CHECK(stage03::intermediate_bytes(p) < 0.02 * score_matrix_bytes(p));
    CHECK(stage03::intermediate_bytes(p) < 0.02 * stage02::intermediate_bytes(p));
    Problem twice = p;
    twice.seq_q = twice.seq_k = 2 * p.seq_q;
    CHECK(stage03::intermediate_bytes(twice) == doctest::Approx(2 * stage03::intermediate_bytes(p)).epsilon(1e-3));
}
