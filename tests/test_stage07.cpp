// Stage 07 (tensor-core kernel, bf16 and fp16) against the float64 reference and stage 06, by the
// low-precision rule; every step of the road; the contract for rows that see no key; any scale.
#include <cmath>
#include <string>

#include "../stages/06_causal_masking/attention.cuh"
#include "../stages/07_pipelined_fused_kernel/attention.cuh"
#include "fa/error.hpp"
#include "fa/precision.hpp"
#include "fa/reference.hpp"
#include "fa/tolerance.hpp"
#include "support.hpp"

using namespace fa;
using fa::cuda::DType;

namespace {

Precision precision_of(DType dtype) { return dtype == DType::BF16 ? Precision::BFloat16 : Precision::Float16; }

// The low-precision rule (fa::low_precision_tolerance): the error against float64 may be twice
// that of naive attention computed in the same 16-bit type, plus a floor.
Tolerances low_precision_limits(const Problem& p, const Inputs& in, const Reference& ref, DType dtype) {
    const Precision precision = precision_of(dtype);
    const EmulatedAttention naive = naive_attention_emulated(precision, p, in.q.cview(), in.k.cview(), in.v.cview());
    return low_precision_tolerance(input_stats(p, in.q.cview(), in.k.cview(), in.v.cview()), precision,
                                   compare(naive.o, ref.o), compare(naive.lse, ref.lse));
}

void check_case(const test::Case& c, DType dtype, int step = -1) {
    const Inputs in = make_inputs(c.problem, c.layout, c.inputs, c.seed);
    const test::Result got = test::run(stage07::host_entry(dtype, step), c.problem, in, c.layout);
    const Reference ref = reference_attention(c.problem, in.q.cview(), in.k.cview(), in.v.cview());
    test::check_close(got, ref.o, ref.lse, low_precision_limits(c.problem, in, ref, dtype),
                      c.name() + " dtype=" + cuda::to_string(dtype) + " step=" + std::to_string(step) + " vs float64");
}

}  // namespace

TEST_CASE("stage 07 matches the float64 reference on the standard cases, bf16 and fp16, d = 32, 64, 128, 256") {
    for (const test::Case& c : test::standard_cases({32, 64, 128, 256})) {
        check_case(c, DType::BF16);
        check_case(c, DType::FP16);
    }
}

TEST_CASE("every step of stage 07's road computes the same attention, d = 64 and 128") {
    for (int step = 0; step < int(stage07::road().size()); ++step) {
        for (const test::Case& c : test::standard_cases({64, 128})) {
            if (c.problem.seq_q * c.problem.seq_k > 20000) continue;
            check_case(c, DType::BF16, step);
        }
    }
}

TEST_CASE("the configuration line counts skipped key tiles exactly for the steps that skip them") {
    // Steps 0 to 6 visit (and mask) every key tile of a causal problem; step 7 switches skipping on.
    const Problem p = test::make_problem(1, 2, 1024, 1024, 64, true);
    for (int step = 0; step <= stage07::final_step(); ++step) {
        const std::string line = stage07::describe_config(p, step);
        INFO("step " << step << ": " << line);
        CHECK((line.find(", 0 skipped") == std::string::npos) == (step >= 7));
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
            test::check_rows_without_keys(p, got);
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

TEST_CASE("stage 07 agrees with stage 06 (float32) by the same rule") {
    for (const test::Case& c : test::standard_cases({64, 128})) {
        for (DType dtype : {DType::BF16, DType::FP16}) {
            const Inputs in = make_inputs(c.problem, c.layout, c.inputs, c.seed);
            const test::Result got = test::run(stage07::host_entry(dtype), c.problem, in, c.layout);
            const test::Result want = test::run(stage06::attention, c.problem, in, c.layout);
            const Reference ref = reference_attention(c.problem, in.q.cview(), in.k.cview(), in.v.cview());
            test::check_close(got, want.o, want.lse, low_precision_limits(c.problem, in, ref, dtype),
                              c.name() + " dtype=" + cuda::to_string(dtype) + " vs stage 06");
        }
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
