// Stage 05 (shared-memory CUDA kernel) against the float64 reference and stage 04.
#include <cmath>
#include <string>

#include "../stages/04_cpu_tiling/attention.hpp"
#include "../stages/05_shared_memory_kernel/attention.cuh"
#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/timing.hpp"
#include "fa/error.hpp"
#include "support.hpp"

using namespace fa;

TEST_CASE("stage 05 matches the float64 reference on the standard cases, d = 32, 64, 128") {
    for (const test::Case& c : test::standard_cases({32, 64, 128})) test::check_against_reference(stage05::attention, c);
}

TEST_CASE("stage 05 matches stage 04 (CPU tiling)") {
    for (const test::Case& c : test::standard_cases({64})) test::check_against_stage(stage05::attention, stage04::attention, c, "stage 04");
}

TEST_CASE("stage 05 handles every tail: sizes just below, at and above the 64-row blocks") {
    const int64_t sizes[][2] = {{64, 64}, {63, 65}, {65, 63}, {128, 1}, {1, 128}, {129, 191}, {192, 127}, {2, 3}};
    uint64_t seed = 500;
    for (int64_t d : {32, 64, 128}) {
        for (const auto& s : sizes) {
            for (bool causal : {false, true}) {
                test::Case c;
                c.problem = test::make_problem(2, 1, s[0], s[1], d, causal);
                c.layout = seed % 2 ? Layout::BNHD : Layout::BHND;
                c.seed = seed++;
                test::check_against_reference(stage05::attention, c);
            }
        }
    }
}

TEST_CASE("stage 05 gives the same result in both layouts, and the same result twice") {
    const Problem p = test::make_problem(2, 3, 150, 170, 64, true);
    const Inputs a = make_inputs(p, Layout::BHND, InputKind::Normal, 9);
    const Inputs b = make_inputs(p, Layout::BNHD, InputKind::Normal, 9);
    const test::Result ra = test::run(stage05::attention, p, a, Layout::BHND);
    const test::Result ra2 = test::run(stage05::attention, p, a, Layout::BHND);
    const test::Result rb = test::run(stage05::attention, p, b, Layout::BNHD);
    CHECK(ra.o == ra2.o);  // bitwise: a data race would make repeated runs differ
    CHECK(ra.lse == ra2.lse);
    CHECK(ra.o == rb.o);   // the layout changes addresses only, not the arithmetic
    CHECK(ra.lse == rb.lse);
}

TEST_CASE("stage 05 writes every output element, including rows and whole query tiles that see no key") {
    // Causal with Nq = 300 > Nk = 100: rows 0..199 see no key, so query tiles 0..2 (rows 0..191)
    // see nothing at all and tile 3 is partly blind.
    const Problem p = test::make_problem(1, 2, 300, 100, 64, true);
    const Inputs in = make_inputs(p, Layout::BHND, InputKind::Normal, 11);
    const test::Result got = test::run(stage05::attention, p, in, Layout::BHND);
    test::check_rows_without_keys(p, got);
    test::Case c;
    c.problem = p;
    c.seed = 11;
    test::check_against_reference(stage05::attention, c);
}

TEST_CASE("stage 05 on a larger problem, causal, with large magnitudes") {
    test::Case c;
    c.problem = test::make_problem(1, 2, 1500, 1300, 128, true);
    c.inputs = InputKind::Large;
    c.seed = 21;
    test::check_against_reference(stage05::attention, c);
    c.problem = test::make_problem(2, 2, 1000, 1000, 64, false);
    c.inputs = InputKind::Normal;
    c.layout = Layout::BNHD;
    test::check_against_reference(stage05::attention, c);
}

// The road: every earlier step is checked like the final kernel (which the cases above cover).
AttentionFn step_fn(int step) {
    return [step](const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<float> o,
                  View3<float> lse) { stage05::attention_step(p, q, k, v, o, lse, step); };
}

TEST_CASE("every step of stage 05's road matches the float64 reference and stage 04, d = 32, 64, 128") {
    REQUIRE(stage05::road().size() == 7);
    for (int step = 0; step < stage05::final_step(); ++step) {
        INFO("step " << step << " (" << stage05::road()[size_t(step)].name << ")");
        for (const test::Case& c : test::standard_cases({32, 64, 128})) test::check_against_reference(step_fn(step), c);
        for (const test::Case& c : test::standard_cases({64})) test::check_against_stage(step_fn(step), stage04::attention, c, "stage 04");
    }
}

TEST_CASE("every step of stage 05's road handles the tails, rows that see no key, large magnitudes, and runs the same twice") {
    const int64_t sizes[][2] = {{63, 65}, {65, 63}, {128, 1}, {1, 128}, {129, 191}};
    for (int step = 0; step < stage05::final_step(); ++step) {
        INFO("step " << step << " (" << stage05::road()[size_t(step)].name << ")");
        uint64_t seed = 700;
        for (int64_t d : {32, 64, 128}) {
            for (const auto& s : sizes) {
                test::Case c;
                c.problem = test::make_problem(2, 1, s[0], s[1], d, seed % 2 == 0);
                c.layout = seed % 3 ? Layout::BNHD : Layout::BHND;
                c.seed = seed++;
                test::check_against_reference(step_fn(step), c);
            }
        }
        // Rows 0..199 see no key: O = 0 and LSE = -inf exactly.
        const Problem blind = test::make_problem(1, 2, 300, 100, 64, true);
        const Inputs in = make_inputs(blind, Layout::BHND, InputKind::Normal, 11);
        test::check_rows_without_keys(blind, test::run(step_fn(step), blind, in, Layout::BHND));
        test::Case large;
        large.problem = test::make_problem(1, 2, 700, 600, 128, true);
        large.inputs = InputKind::Large;
        large.seed = 21;
        test::check_against_reference(step_fn(step), large);
        // Bitwise the same twice: a data race would make repeated runs differ.
        const Problem p = test::make_problem(1, 3, 150, 170, 64, true);
        const Inputs a = make_inputs(p, Layout::BHND, InputKind::Normal, 9);
        const test::Result r1 = test::run(step_fn(step), p, a, Layout::BHND);
        const test::Result r2 = test::run(step_fn(step), p, a, Layout::BHND);
        CHECK(r1.o == r2.o);
        CHECK(r1.lse == r2.lse);
    }
}

TEST_CASE("stage 05 refuses a step that is not on its road") {
    const Problem p = test::make_problem(1, 1, 16, 16, 64, false);
    CHECK_THROWS_WITH_AS(stage05::check_supported(p, 7), "--step 7 is not a step of stage 05: use 0 to 6", InputError);
    CHECK_THROWS_AS(stage05::check_supported(p, -2), InputError);
    CHECK_NOTHROW(stage05::check_supported(p, 0));
}

TEST_CASE("stage 05 refuses head dimensions it has no kernel for, naming the allowed ones") {
    const Problem p = test::make_problem(1, 1, 16, 16, 96, false);
    CHECK_THROWS_WITH_AS(stage05::check_supported(p), "head_dim 96 is not supported by stage 05: use 32, 64 or 128", InputError);
    const Inputs in = make_inputs(p, Layout::BHND, InputKind::Normal, 1);
    CHECK_THROWS_AS(test::run(stage05::attention, p, in, Layout::BHND), InputError);
    for (int64_t d : {1, 16, 48, 256}) {
        CHECK_THROWS_AS(stage05::check_supported(test::make_problem(1, 1, 8, 8, d, false)), InputError);
    }
}

// The GPU toolkit the stages share (common/cuda), exercised where a GPU is present.
TEST_CASE("common/cuda: a failed CUDA call names the call, the file and the line") {
    std::string message;
    try {
        FA_CUDA_CHECK(cudaMemcpy(nullptr, nullptr, 16, cudaMemcpyHostToDevice));
    } catch (const cuda::Error& e) {
        message = e.what();
    }
    (void)cudaGetLastError();  // the failed call leaves an error behind for the next query
    CHECK(message.find("cudaMemcpy(nullptr, nullptr, 16, cudaMemcpyHostToDevice)") != std::string::npos);
    CHECK(message.find("test_stage05.cpp:") != std::string::npos);
    CHECK(message.find("cudaErrorInvalidValue") != std::string::npos);
}

TEST_CASE("common/cuda: a problem that does not fit in device memory is refused with its size") {
    CHECK_THROWS_AS(cuda::require_device_memory(1e18, "a huge problem"), InputError);
    try {
        cuda::require_device_memory(1e18, "a huge problem");
    } catch (const InputError& e) {
        CHECK(std::string(e.what()).find("needs about") != std::string::npos);
    }
    CHECK_NOTHROW(cuda::require_device_memory(1024.0, "a tiny problem"));
}

TEST_CASE("common/cuda: event timing returns one positive sample per timed run") {
    cuda::DeviceBuffer<float> buf(1 << 20);
    const TimingStats t = cuda::time_on_gpu(
        [&](cudaStream_t s) { FA_CUDA_CHECK(cudaMemsetAsync(buf.data(), 0, buf.bytes(), s)); }, 2, 21);
    CHECK(t.samples_ms.size() == 21);
    CHECK(t.min_ms > 0.0);
    CHECK(t.min_ms <= t.median_ms);
    CHECK(t.median_ms <= t.max_ms);
    CHECK(cuda::gpu_info().sm_count > 0);
    CHECK(cuda::l2_flush_bytes() >= 2 * size_t(cuda::gpu_info().l2_bytes));
}
