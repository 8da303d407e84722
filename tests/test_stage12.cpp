// Stage 12 (the Hopper backward, bf16 and fp16, sm_90a) against the float64 reference backward by the
// gradient rule (fa::gradient_tolerance: twice the error of the naive backward in the same precision,
// plus a floor), with O and LSE from stage 11's forward in the same precision, as the executable does;
// and against stage 09 (mma.sync) on the same O and LSE by the same rule. Every awkward size, both
// layouts, d = 64 and 128; rows that see no key get exactly zero dQ; any scale; the device entry point
// with a kept workspace; what the stage refuses. Every test runs each step of the road (0: stage 09's
// kernels, through stage 12's entry points). gpu_main.cpp skips it (exit 77) without a Hopper GPU.
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../stages/09_backward_kernel/attention.cuh"
#include "../stages/11_hopper_kernel/attention.cuh"
#include "../stages/12_hopper_backward/attention.cuh"
#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/half.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/error.hpp"
#include "fa/precision.hpp"
#include "fa/reference_backward.hpp"
#include "fa/tolerance.hpp"
#include "backward_check.hpp"
#include "support.hpp"

using namespace fa;
using fa::cuda::DType;
using fa::test::Forward;
using fa::test::Grads;
using fa::test::Judge;
using fa::test::run_backward;

namespace {

Precision precision_of(DType dtype) { return dtype == DType::BF16 ? Precision::BFloat16 : Precision::Float16; }

std::string describe(DType dtype, int step) { return " dtype=" + cuda::to_string(dtype) + " step=" + std::to_string(step); }

// Every step of the road.
std::vector<int> steps() {
    std::vector<int> s;
    for (int i = 0; i < int(stage12::road().size()); ++i) s.push_back(i);
    return s;
}

// O and LSE as the backward receives them: from stage 11's forward in the same 16-bit type.
Forward forward(const Problem& p, const Inputs& in, Layout layout, DType dtype) {
    return test::run_forward(stage11::host_entry(dtype), p, in, layout);
}

// Stage 12 at `step` on `c` in `dtype`: against the float64 reference and against stage 09 on the
// same O and LSE. With `deterministic`, the step runs twice and must give the same bits.
Grads check_case(const test::Case& c, DType dtype, int step, bool deterministic = false) {
    const Problem& p = c.problem;
    const Inputs in = make_inputs(p, c.layout, c.inputs, c.seed);
    const HostTensor dout = make_output_gradient(p, c.layout, c.seed);
    const Forward f = forward(p, in, c.layout, dtype);
    const stage12::Options options{dtype, step, deterministic};
    const Grads got = run_backward(stage12::host_entry(options), p, in, f, dout, c.layout);
    const Judge j = test::judge(p, in, dout, precision_of(dtype));
    const std::string what = c.name() + describe(dtype, step) + (deterministic ? " deterministic" : "");
    test::check_gradients(got, j, what + " vs float64 reference");
    test::check_rows_without_keys(p, got, what);
    const Grads s09 = run_backward(stage09::host_entry({dtype, false, -1}), p, in, f, dout, c.layout);
    test::check_gradients(got, s09.dq, s09.dk, s09.dv, j.tol, what + " vs stage 09");
    if (deterministic) {
        const Grads again = run_backward(stage12::host_entry(options), p, in, f, dout, c.layout);
        INFO(what);
        CHECK(std::memcmp(again.dq.data(), got.dq.data(), got.dq.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(again.dk.data(), got.dk.data(), got.dk.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(again.dv.data(), got.dv.data(), got.dv.size() * sizeof(float)) == 0);
    }
    return got;
}

}  // namespace

TEST_CASE("stage 12 matches the float64 reference backward and stage 09 on the standard cases, bf16 and fp16, d = 64, 128") {
    for (int step : steps()) {
        for (const test::Case& c : test::standard_cases({64, 128})) {
            check_case(c, DType::BF16, step);
            check_case(c, DType::FP16, step);
        }
    }
}

TEST_CASE("stage 12 handles the diagonal wherever it falls against its query tiles and key blocks") {
    const std::vector<std::array<int64_t, 2>> sizes = {{64, 64},  {65, 64},  {64, 65}, {128, 192}, {192, 128}, {191, 257}, {257, 191},
                                                       {300, 64}, {64, 300}, {1, 500}, {500, 1},   {129, 1},   {63, 127},  {127, 63}};
    for (const test::Case& c : test::diagonal_cases(sizes, {64, 128}, 1900)) {
        for (int step : steps()) check_case(c, c.seed % 3 == 2 ? DType::FP16 : DType::BF16, step);  // every third case in fp16
    }
}

TEST_CASE("stage 12: rows and whole query tiles that see no key get dQ = 0 exactly, every gradient finite") {
    uint64_t seed = 2000;
    for (int64_t d : {64, 128}) {
        for (DType dtype : {DType::BF16, DType::FP16}) {
            // Rows 0-199 see no key: query tiles 0-2 never visit a key block, tile 3 in part.
            test::Case c;
            c.problem = test::make_problem(2, 1, 300, 100, d, true);
            c.layout = Layout::BNHD;
            c.seed = seed++;
            for (int step : steps()) check_case(c, dtype, step);
        }
    }
}

TEST_CASE("stage 12 takes any finite scale: negative, zero, large") {
    for (const test::Case& c : test::scale_cases(2100)) {
        for (int step : steps()) {
            check_case(c, DType::BF16, step);
            check_case(c, DType::FP16, step);
        }
    }
}

TEST_CASE("stage 12's device entry point runs on a stream with a workspace kept across problems of several sizes") {
    cudaStream_t stream = nullptr;
    FA_CUDA_CHECK(cudaStreamCreate(&stream));
    stage12::Workspace workspace;
    // Small, then larger (the workspace grows), then small again (it is reused as it is).
    const Problem problems[] = {test::make_problem(1, 2, 70, 90, 64, true), test::make_problem(2, 2, 333, 257, 128, false),
                                test::make_problem(1, 2, 70, 90, 64, true)};
    uint64_t seed = 2200;
    // Every Hopper step of the road, one workspace kept across them all.
    for (int step = 1; step < int(stage12::road().size()); ++step) {
        for (const Problem& p : problems) {
            const Layout layout = seed % 2 ? Layout::BNHD : Layout::BHND;
            const Inputs in = make_inputs(p, layout, InputKind::Normal, seed);
            const HostTensor dout = make_output_gradient(p, layout, seed);
            ++seed;
            const Forward f = forward(p, in, layout, DType::BF16);
            cuda::DeviceTensors dev(p, in.q.cview(), in.k.cview(), in.v.cview(), f.o.cview(), f.lse_view(p));
            cuda::HalfTensors<__nv_bfloat16> half(p, layout);
            half.load(dev.q, dev.k, dev.v);
            cuda::convert(View4<const float>(dev.o), half.o);
            const auto view16 = [&](cuda::DeviceBuffer<__nv_bfloat16>& b, int64_t n) {
                return make_view<__nv_bfloat16>(b.data(), p.batch, p.heads, n, p.head_dim, layout);
            };
            cuda::DeviceBuffer<float> dout_f32(dout.storage.size());
            dout_f32.copy_from_host(dout.storage.data(), dout_f32.size());
            cuda::DeviceBuffer<__nv_bfloat16> dout16(size_t(p.q_elems())), dq16(size_t(p.q_elems())), dk16(size_t(p.kv_elems())),
                dv16(size_t(p.kv_elems()));
            cuda::convert(View4<const float>{dout_f32.data(), dout.view.shape, dout.view.stride}, view16(dout16, p.seq_q));
            stage12::attention_backward_device(p, half.q, half.k, half.v, View4<const __nv_bfloat16>(half.o), View3<const float>(dev.lse),
                                               View4<const __nv_bfloat16>(view16(dout16, p.seq_q)), view16(dq16, p.seq_q),
                                               view16(dk16, p.seq_k), view16(dv16, p.seq_k), stream, &workspace, step);
            FA_CUDA_CHECK(cudaStreamSynchronize(stream));
            HostTensor dq(p.batch, p.heads, p.seq_q, p.head_dim, layout), dk(p.batch, p.heads, p.seq_k, p.head_dim, layout),
                dv(p.batch, p.heads, p.seq_k, p.head_dim, layout);
            const std::pair<cuda::DeviceBuffer<__nv_bfloat16>*, HostTensor*> outs[3] = {{&dq16, &dq}, {&dk16, &dk}, {&dv16, &dv}};
            for (const auto& [src, dst] : outs) {
                cuda::DeviceBuffer<float> wide(dst->storage.size());
                cuda::convert(View4<const __nv_bfloat16>(view16(*src, dst->view.shape[2])),
                              View4<float>{wide.data(), dst->view.shape, dst->view.stride});
                FA_CUDA_CHECK(cudaDeviceSynchronize());
                wide.copy_to_host(dst->storage.data(), wide.size());
            }
            const Grads got{dq.logical(), dk.logical(), dv.logical()};
            const Judge j = test::judge(p, in, dout, Precision::BFloat16);
            test::check_gradients(got, j, p.describe() + " (device entry, step " + std::to_string(step) + ")");
        }
    }
    CHECK(workspace.floats.size() > 0);
    FA_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST_CASE("stage 12's deterministic order (step 0 and steps 3 on) gives the same bits in every run, within the rule") {
    // Many key blocks per head add into every query tile, so that the turns are waited for: 2048
    // keys make 16 blocks of 128 (32 of stage 09's 64) taking their turns at each tile.
    std::vector<test::Case> cases = test::standard_cases({64, 128});
    uint64_t seed = 1500;
    for (int64_t d : {64, 128})
        for (bool causal : {false, true}) {
            test::Case c;
            c.problem = test::make_problem(1, 2, 700, 2048, d, causal);
            c.layout = d == 64 ? Layout::BNHD : Layout::BHND;
            c.seed = seed++;
            cases.push_back(c);
        }
    for (const test::Case& c : cases) {
        for (int step : steps()) {
            if (step != 0 && step < stage12::first_deterministic_step()) continue;
            check_case(c, c.seed % 2 ? DType::FP16 : DType::BF16, step, true);
        }
    }
}

TEST_CASE("stage 12 refuses what it cannot do, naming the option and what is allowed") {
    for (int64_t d : {32, 96, 256}) {
        const Problem p = test::make_problem(1, 1, 16, 16, d);
        const std::string option = "--head-dim " + std::to_string(d);
        CHECK_THROWS_WITH_AS(stage12::check_supported(p), doctest::Contains(option.c_str()), InputError);
        CHECK_THROWS_WITH_AS(stage12::check_supported(p), doctest::Contains("use 64 or 128"), InputError);
    }
    CHECK_THROWS_AS(stage12::check_supported(test::make_problem(1, 1, 16, 16, 64), 7), InputError);
    // The deterministic order needs a dQ writer (or stage 09's kernels at step 0).
    for (int step = 1; step < stage12::first_deterministic_step(); ++step) {
        CHECK_THROWS_WITH_AS(stage12::check_supported(test::make_problem(1, 1, 16, 16, 64), step, true),
                             doctest::Contains("--deterministic needs --step 0 or"), InputError);
    }
    CHECK_NOTHROW(stage12::check_supported(test::make_problem(1, 1, 16, 16, 64), 0, true));
    CHECK_NOTHROW(stage12::check_supported(test::make_problem(1, 1, 16, 16, 64), stage12::first_deterministic_step(), true));
}
