// Stage 11 (the Hopper kernel, bf16 and fp16) against the float64 reference and stage 07 by the
// low-precision rule; every step of the road; the awkward sizes; rows that see no key; any scale.
// Exits 77 (skipped) without a Hopper GPU.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "../stages/07_pipelined_fused_kernel/attention.cuh"
#include "../stages/11_hopper_kernel/attention.cuh"
#include "fa/cuda/device.hpp"
#include "fa/error.hpp"
#include "fa/precision.hpp"
#include "fa/reference.hpp"
#include "fa/tolerance.hpp"
#include "support.hpp"

using namespace fa;
using fa::cuda::DType;

namespace {

Precision precision_of(DType dtype) { return dtype == DType::BF16 ? Precision::BFloat16 : Precision::Float16; }

// The low-precision rule (fa::low_precision_tolerance): twice the error of naive attention in
// the same 16-bit type, plus a floor.
Tolerances low_precision_limits(const Problem& p, const Inputs& in, const Reference& ref, DType dtype) {
    const Precision precision = precision_of(dtype);
    const EmulatedAttention naive = naive_attention_emulated(precision, p, in.q.cview(), in.k.cview(), in.v.cview());
    return low_precision_tolerance(input_stats(p, in.q.cview(), in.k.cview(), in.v.cview()), precision,
                                   compare(naive.o, ref.o), compare(naive.lse, ref.lse));
}

// The steps under test: every step of the road after stage 07's (1 .. last), or the
// comma-separated list in FA_STAGE11_STEPS (so that a step that hangs on a new GPU can be left out
// while the others are checked).
std::vector<int> steps_under_test() {
    std::vector<int> steps;
    const char* env = std::getenv("FA_STAGE11_STEPS");
    if (env != nullptr && *env != '\0') {
        std::stringstream list(env);
        std::string item;
        while (std::getline(list, item, ',')) {
            if (!item.empty()) steps.push_back(std::stoi(item));
        }
    } else {
        for (int step = 1; step < int(stage11::road().size()); ++step) steps.push_back(step);
    }
    return steps;
}

bool under_test(int step) {
    for (int s : steps_under_test()) {
        if (s == step) return true;
    }
    MESSAGE("step " << step << " left out by FA_STAGE11_STEPS");
    return false;
}

void check_case(const test::Case& c, DType dtype, int step) {
    const Inputs in = make_inputs(c.problem, c.layout, c.inputs, c.seed);
    const test::Result got = test::run(stage11::host_entry(dtype, step), c.problem, in, c.layout);
    const Reference ref = reference_attention(c.problem, in.q.cview(), in.k.cview(), in.v.cview());
    test::check_close(got, ref.o, ref.lse, low_precision_limits(c.problem, in, ref, dtype),
                      c.name() + " dtype=" + cuda::to_string(dtype) + " step=" + std::to_string(step) + " vs float64");
}

}  // namespace

// One test case per step, so that a failure says which step of the road broke.
TEST_CASE("stage 11 step 1 (wgmma, cp.async) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(1)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 1);
        check_case(c, DType::FP16, 1);
    }
}

TEST_CASE("stage 11 step 2 (TMA ring on mbarriers) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(2)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 2);
        check_case(c, DType::FP16, 2);
    }
}

TEST_CASE("stage 11 step 3 (producer warpgroup, setmaxnreg) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(3)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 3);
        check_case(c, DType::FP16, 3);
    }
}

TEST_CASE("stage 11 step 4 (ping-pong, named barriers) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(4)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 4);
        check_case(c, DType::FP16, 4);
    }
}

TEST_CASE("stage 11 step 5 (softmax overlap inside a warpgroup) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(5)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 5);
        check_case(c, DType::FP16, 5);
    }
}

TEST_CASE("stage 11 step 6 (heaviest tiles first across groups of heads) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(6)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 6);
        check_case(c, DType::FP16, 6);
    }
}

TEST_CASE("stage 11 step 7 (TMA-store epilogue) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(7)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 7);
        check_case(c, DType::FP16, 7);
    }
}

TEST_CASE("stage 11 step 8 (three consumer warpgroups at d = 64) matches the float64 reference, bf16 and fp16, d = 64 and 128") {
    if (!under_test(8)) return;
    for (const test::Case& c : test::standard_cases({64, 128})) {
        check_case(c, DType::BF16, 8);
        check_case(c, DType::FP16, 8);
    }
}

TEST_CASE("stage 11's road: every step has a test case above, and the default step is on the road") {
    // A new step needs its own test case (a failure then names the step): update this count with it.
    CHECK(stage11::road().size() == 9);
    CHECK(stage11::final_step() >= 1);
    CHECK(stage11::final_step() < int(stage11::road().size()));
}

TEST_CASE("stage 11 handles the diagonal wherever it falls against its 64/128/192-row and 128-key tiles") {
    const int64_t sizes[][2] = {{128, 128}, {129, 128}, {128, 129}, {191, 257}, {257, 191}, {300, 64},
                                {64, 300},  {1, 500},   {500, 1},   {2, 3},     {383, 389}};
    for (int step : steps_under_test()) {
        uint64_t seed = 1100;
        for (int64_t d : {64, 128}) {
            for (const auto& s : sizes) {
                test::Case c;
                c.problem = test::make_problem(1, 2, s[0], s[1], d, true);
                c.layout = seed % 2 ? Layout::BNHD : Layout::BHND;
                c.seed = seed++;
                check_case(c, seed % 3 ? DType::BF16 : DType::FP16, step);
            }
        }
    }
}

TEST_CASE("stage 11 writes every output; rows and whole query tiles that see no key get O = 0, LSE = -inf") {
    for (int step : steps_under_test()) {
        for (int64_t d : {64, 128}) {
            for (DType dtype : {DType::BF16, DType::FP16}) {
                const Problem p = test::make_problem(2, 1, 300, 100, d, true);
                const Inputs in = make_inputs(p, Layout::BNHD, InputKind::Normal, 13);
                INFO("step " << step << " d " << d << " " << cuda::to_string(dtype));
                const test::Result got = test::run(stage11::host_entry(dtype, step), p, in, Layout::BNHD);
                test::check_rows_without_keys(p, got);
            }
        }
    }
}

TEST_CASE("stage 11 takes any finite scale: negative, zero, large") {
    for (int step : steps_under_test()) {
        uint64_t seed = 1200;
        for (double scale : {-0.3, 0.0, 2.0}) {
            for (bool causal : {false, true}) {
                test::Case c;
                c.problem = test::make_problem(1, 2, 150, 170, 64, causal);
                c.problem.scale = scale;
                c.seed = seed++;
                check_case(c, DType::BF16, step);
            }
        }
    }
}

TEST_CASE("stage 11 agrees with stage 07 by the same rule, every step") {
    for (int step : steps_under_test()) {
        for (const test::Case& c : test::standard_cases({64, 128})) {
            if (c.problem.seq_q * c.problem.seq_k > 20000) continue;
            for (DType dtype : {DType::BF16, DType::FP16}) {
                const Inputs in = make_inputs(c.problem, c.layout, c.inputs, c.seed);
                const test::Result got = test::run(stage11::host_entry(dtype, step), c.problem, in, c.layout);
                const test::Result want = test::run(stage07::host_entry(dtype), c.problem, in, c.layout);
                const Reference ref = reference_attention(c.problem, in.q.cview(), in.k.cview(), in.v.cview());
                test::check_close(got, want.o, want.lse, low_precision_limits(c.problem, in, ref, dtype),
                                  c.name() + " dtype=" + cuda::to_string(dtype) + " step=" + std::to_string(step) +
                                      " vs stage 07");
            }
        }
    }
}

TEST_CASE("stage 11 on longer sequences and several heads, both layouts") {
    uint64_t seed = 1300;
    for (int step : steps_under_test()) {
        for (bool causal : {false, true}) {
            test::Case c;
            c.problem = test::make_problem(2, 3, 1000, 1000, step % 2 ? 128 : 64, causal);
            c.layout = step % 2 ? Layout::BNHD : Layout::BHND;
            c.seed = seed++;
            check_case(c, DType::BF16, step);
        }
    }
}

TEST_CASE("stage 11's causal block order in several groups of heads (a 1 MiB budget) and in one group (the default)") {
    // K and V of a head: 2 x 1024 x d x 2 bytes, 256 KiB at d = 64 and 512 KiB at d = 128: with a
    // 1 MiB budget, groups of 4 and of 2 heads over 6 (batch, head) pairs, the last group short
    // at d = 64. Every step from 6 on orders its blocks so; steps before it ignore the budget.
    uint64_t seed = 1400;
    for (const char* mib : {"1", ""}) {
        setenv("FA_STAGE11_GROUP_MIB", mib, 1);
        for (int step : steps_under_test()) {
            for (int64_t d : {64, 128}) {
                test::Case c;
                c.problem = test::make_problem(2, 3, 1000, 1024, d, true);
                c.layout = d == 64 ? Layout::BNHD : Layout::BHND;
                c.seed = seed++;
                INFO("FA_STAGE11_GROUP_MIB=" << mib);
                INFO(stage11::describe_config(c.problem, step));
                check_case(c, step % 2 ? DType::FP16 : DType::BF16, step);
            }
        }
    }
    setenv("FA_STAGE11_GROUP_MIB", "0", 1);
    CHECK_THROWS_WITH_AS(stage11::describe_config(test::make_problem(1, 2, 64, 64, 64, true), 6),
                         doctest::Contains("FA_STAGE11_GROUP_MIB=0"), InputError);
    unsetenv("FA_STAGE11_GROUP_MIB");
    CHECK(stage11::describe_config(test::make_problem(2, 3, 1000, 1024, 128, true), 6).find("groups of 6 heads") != std::string::npos);
}

TEST_CASE("stage 11 refuses what it cannot do, naming the option") {
    const Problem p = test::make_problem(1, 1, 16, 16, 96);
    const Inputs in = make_inputs(p, Layout::BHND, InputKind::Normal, 1);
    CHECK_THROWS_WITH_AS(test::run(stage11::attention, p, in, Layout::BHND), doctest::Contains("--head-dim 96"), InputError);
    CHECK_THROWS_WITH_AS(stage11::check_supported(test::make_problem(1, 1, 16, 16, 256), 1), doctest::Contains("use 64, 128"),
                         InputError);
    CHECK_THROWS_WITH_AS(stage11::check_supported(test::make_problem(1, 1, 16, 16, 64), 99), doctest::Contains("--step 99"),
                         InputError);
}
