// Stage 07 (tensor-core kernel, bf16 and fp16) against the float64 reference and stage 06, by the
// low-precision rule; every step of the road; the contract for rows that see no key.
#include <cmath>
#include <string>

#include "../stages/06_causal_masking/attention.cuh"
#include "../stages/07_pipelined_fused_kernel/attention.cuh"
#include "fa/error.hpp"
#include "support.hpp"

using namespace fa;
using fa::cuda::DType;

namespace {

// Interim limits for 16-bit inputs: bf16 keeps 8 significant bits (relative rounding 2^-9), fp16 11.
void check_low_precision(const test::Result& got, const Reference& ref, DType dtype, const std::string& what) {
    const Metrics mo = compare(got.o, ref.o);
    const Metrics ml = compare(got.lse, ref.lse);
    const double o_rel = dtype == DType::BF16 ? 1.5e-2 : 3e-3, o_abs = dtype == DType::BF16 ? 6e-2 : 1.5e-2;
    INFO(what);
    INFO("O: max_abs=" << mo.max_abs << " rel_l2=" << mo.rel_l2 << " nonfinite=" << mo.nonfinite);
    INFO("LSE: max_abs=" << ml.max_abs << " rel_l2=" << ml.rel_l2 << " nonfinite=" << ml.nonfinite);
    CHECK(mo.nonfinite == 0);
    CHECK(ml.nonfinite == 0);
    CHECK(mo.rel_l2 <= o_rel);
    CHECK(mo.max_abs <= o_abs);
    CHECK(ml.rel_l2 <= 1e-2);
}

void check_case(const test::Case& c, DType dtype, int step = -1) {
    const Inputs in = make_inputs(c.problem, c.layout, c.inputs, c.seed);
    const test::Result got = test::run(stage07::host_entry(dtype, step), c.problem, in, c.layout);
    const Reference ref = reference_attention(c.problem, in.q.cview(), in.k.cview(), in.v.cview());
    check_low_precision(got, ref, dtype, c.name() + " dtype=" + cuda::to_string(dtype) + " step=" + std::to_string(step));
}

}  // namespace

TEST_CASE("stage 07 matches the float64 reference on the standard cases, bf16 and fp16, d = 32, 64, 128, 256") {
    for (const test::Case& c : test::standard_cases({32, 64, 128, 256})) {
        if (c.inputs == InputKind::Large) continue;  // scores of order 400: see the large-input case below
        check_case(c, DType::BF16);
        check_case(c, DType::FP16);
    }
}

TEST_CASE("every step of stage 07's road computes the same attention, d = 64 and 128") {
    for (int step = 0; step < int(stage07::road().size()); ++step) {
        for (const test::Case& c : test::standard_cases({64, 128})) {
            if (c.inputs == InputKind::Large || c.problem.seq_q * c.problem.seq_k > 20000) continue;
            check_case(c, DType::BF16, step);
        }
    }
}

TEST_CASE("stage 07 handles the diagonal wherever it falls against its 128-row and 64-key tiles") {
    const int64_t sizes[][2] = {{128, 128}, {129, 128}, {128, 129}, {191, 257}, {257, 191}, {300, 64}, {64, 300}, {1, 500}, {500, 1}};
    uint64_t seed = 900;
    for (int64_t d : {32, 64, 128, 256}) {
        for (const auto& s : sizes) {
            test::Case c;
            c.problem = test::make_problem(1, 2, s[0], s[1], d, true);
            c.layout = seed % 2 ? Layout::BNHD : Layout::BHND;
            c.seed = seed++;
            check_case(c, DType::BF16);
        }
    }
}

TEST_CASE("stage 07 writes every output; rows and whole query tiles that see no key get O = 0, LSE = -inf") {
    for (int64_t d : {32, 64, 128, 256}) {
        for (DType dtype : {DType::BF16, DType::FP16}) {
            const Problem p = test::make_problem(2, 1, 300, 100, d, true);
            const Inputs in = make_inputs(p, Layout::BNHD, InputKind::Normal, 13);
            const test::Result got = test::run(stage07::host_entry(dtype), p, in, Layout::BNHD);
            for (float x : got.o) REQUIRE(std::isfinite(x));  // outputs start as NaN: every element was written
            for (int64_t b = 0; b < 2; ++b) {
                for (int64_t i = 0; i < 300; ++i) {
                    const float lse = got.lse[size_t(b * 300 + i)];
                    if (i < 200) {
                        CHECK((std::isinf(lse) && lse < 0));
                        for (int64_t x = 0; x < d; ++x) CHECK(got.o[size_t((b * 300 + i) * d + x)] == 0.0f);
                    } else {
                        CHECK(std::isfinite(lse));
                    }
                }
            }
        }
    }
}

TEST_CASE("stage 07 takes any finite scale: negative, zero, large") {
    uint64_t seed = 1000;
    for (double scale : {-0.3, 0.0, 2.0}) {
        for (bool causal : {false, true}) {
            test::Case c;
            c.problem = test::make_problem(1, 2, 150, 170, 64, causal);
            c.problem.scale = scale;
            c.seed = seed++;
            check_case(c, DType::BF16);
        }
    }
}

TEST_CASE("stage 07 agrees with stage 06 (float32) within the 16-bit rounding") {
    for (const test::Case& c : test::standard_cases({64, 128})) {
        if (c.inputs == InputKind::Large) continue;
        const Inputs in = make_inputs(c.problem, c.layout, c.inputs, c.seed);
        const test::Result got = test::run(stage07::attention, c.problem, in, c.layout);
        const test::Result want = test::run(stage06::attention, c.problem, in, c.layout);
        const Metrics mo = compare(got.o, want.o);
        INFO(c.name() << " O vs stage 06: rel_l2=" << mo.rel_l2 << " max_abs=" << mo.max_abs);
        CHECK(mo.nonfinite == 0);
        CHECK(mo.rel_l2 <= 1.5e-2);
    }
}

TEST_CASE("stage 07 refuses what it cannot do, naming the option") {
    const Problem p = test::make_problem(1, 1, 16, 16, 96);
    const Inputs in = make_inputs(p, Layout::BHND, InputKind::Normal, 1);
    CHECK_THROWS_WITH_AS(test::run(stage07::attention, p, in, Layout::BHND), doctest::Contains("--head-dim 96"), InputError);
    const Problem p32 = test::make_problem(1, 1, 16, 16, 32);
    CHECK_THROWS_WITH_AS(stage07::check_supported(p32, 0), doctest::Contains("use 64, 128"), InputError);
    CHECK_THROWS_WITH_AS(stage07::check_supported(p32, 99), doctest::Contains("--step 99"), InputError);
}
