// Stage 11's standalone early steps (stages/11_hopper_kernel/steps/: steps 1, 2, 3, 4 and 9, one
// file each) against the switch kernel's same steps (stage11::attention_device(..., step)): on the
// same seeded random inputs, O and LSE must be the same bits. The arithmetic is the same on purpose
// (steps/common.cuh holds the one copy of a tile's softmax and of the epilogue; each file keeps its
// step's tile shape), so nothing is compared by tolerance here; test_stage11 checks the switch
// kernel's steps against the float64 reference. Exits 77 (skipped) without a Hopper GPU.
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../stages/11_hopper_kernel/attention.cuh"
#include "../stages/11_hopper_kernel/steps/steps.cuh"
#include "fa/cuda/check.hpp"
#include "fa/cuda/half.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/error.hpp"
#include "support.hpp"

using namespace fa;
using fa::cuda::DType;

namespace {

/// A standalone step's entry, for bf16 or fp16 views.
template <class T>
using StepFn = void (*)(const Problem&, View4<const T>, View4<const T>, View4<const T>, View4<T>, View3<float>, cudaStream_t);

/// The standalone steps, each with the switch kernel's step it must match.
template <class T>
std::vector<std::pair<int, StepFn<T>>> standalone_steps() {
    return {{1, stage11::step1::attention_device}, {2, stage11::step2::attention_device}, {3, stage11::step3::attention_device},
            {4, stage11::step4::attention_device}, {9, stage11::step9::attention_device}};
}

/// O (16-bit words) and LSE of one run, copied to the host. The outputs are first filled with the
/// byte `poison`: the two runs compared use different bytes, so an element either leaves unwritten
/// makes them differ.
struct Outputs {
    std::vector<uint16_t> o;
    std::vector<float> lse;
};

template <class T, class Run>
Outputs run_poisoned(const Problem& p, cuda::HalfTensors<T>& half, View3<float> lse, int poison, Run run) {
    const size_t o_elems = size_t(p.q_elems()), lse_elems = size_t(p.lse_elems());
    FA_CUDA_CHECK(cudaMemset(half.o.data, poison, o_elems * 2));
    FA_CUDA_CHECK(cudaMemset(lse.data, poison, lse_elems * 4));
    run();
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    Outputs out{std::vector<uint16_t>(o_elems), std::vector<float>(lse_elems)};
    FA_CUDA_CHECK(cudaMemcpy(out.o.data(), half.o.data, o_elems * 2, cudaMemcpyDeviceToHost));
    FA_CUDA_CHECK(cudaMemcpy(out.lse.data(), lse.data, lse_elems * 4, cudaMemcpyDeviceToHost));
    return out;
}

/// Runs every standalone step and its switch step on case `c` in type T; O and LSE bit for bit.
template <class T>
void check_case(const test::Case& c) {
    const Problem& p = c.problem;
    const Inputs in = make_inputs(p, c.layout, c.inputs, c.seed);
    const HostTensor o(p.batch, p.heads, p.seq_q, p.head_dim, c.layout);
    const std::vector<float> lse(size_t(p.lse_elems()));
    cuda::DeviceTensors dev(p, in.q.cview(), in.k.cview(), in.v.cview(), o.cview(), make_view3(lse.data(), p.batch, p.heads, p.seq_q));
    cuda::HalfTensors<T> half(p, c.layout);
    half.load(dev.q, dev.k, dev.v);
    for (const auto& [step, standalone] : standalone_steps<T>()) {
        INFO(c.name() << " " << (std::is_same_v<T, __half> ? "fp16" : "bf16") << " step " << step);
        const Outputs want = run_poisoned(p, half, dev.lse, 0xff, [&] {
            stage11::attention_device(p, half.q, half.k, half.v, half.o, dev.lse, nullptr, step);
        });
        const Outputs got = run_poisoned(p, half, dev.lse, 0xfe, [&, fn = standalone] {
            fn(p, half.q, half.k, half.v, half.o, dev.lse, nullptr);
        });
        CHECK(std::memcmp(got.o.data(), want.o.data(), want.o.size() * 2) == 0);
        CHECK(std::memcmp(got.lse.data(), want.lse.data(), want.lse.size() * 4) == 0);
    }
}

void check_cases(const std::vector<test::Case>& cases) {
    for (const test::Case& c : cases) {
        check_case<__nv_bfloat16>(c);
        check_case<__half>(c);
    }
}

}  // namespace

TEST_CASE("stage 11's standalone steps 1, 2, 3, 4 and 9 give their switch steps' bits on the standard cases, bf16 and fp16") {
    // N = 1, primes, Nq != Nk both ways, causal rows that see no key (Nq > Nk), both layouts, B x H > 1
    // with a custom scale, large logits; d = 64 and 128.
    check_cases(test::standard_cases({64, 128}));
}

TEST_CASE("stage 11's standalone steps give their switch steps' bits on long rows and many heads: the ring wraps, blocks loop") {
    // Many K/V tiles per item, so each ring's slots are refilled many rounds (every parity); more work
    // items than SMs, so each persistent block of step 9 runs several, some seeing no key (Nq > Nk,
    // causal), others whose last query tile leaves consumer warpgroups past Nq; any scale.
    const int64_t shapes[][4] = {{1, 4, 1000, 1100}, {2, 3, 517, 2048}, {4, 16, 1024, 1024}, {3, 20, 700, 900}, {2, 40, 1000, 300}};
    std::vector<test::Case> cases;
    uint64_t seed = 4800;
    for (const auto& s : shapes) {
        for (int64_t d : {64, 128}) {
            for (bool causal : {false, true}) {
                test::Case c;
                c.problem = test::make_problem(s[0], s[1], s[2], s[3], d, causal);
                c.layout = seed % 2 ? Layout::BNHD : Layout::BHND;
                c.seed = seed++;
                cases.push_back(c);
            }
        }
    }
    for (double scale : {-0.2, 0.0, 2.0}) {  // a negative scale flips S (exact); zero gives uniform weights
        test::Case c;
        c.problem = test::make_problem(1, 3, 333, 444, seed % 2 ? 64 : 128, true);
        c.problem.scale = scale;
        c.seed = seed++;
        cases.push_back(c);
    }
    check_cases(cases);
}

TEST_CASE("stage 11's standalone steps give their switch steps' bits on two small problems: the sanitizers' case") {
    // compute-sanitizer's racecheck runs a hundred times slower than the kernel: this case is the one
    // it can cover whole (bench/session.py run sanitize11r). Each file, type and head dimension on a
    // problem with tails and Nq < Nk, and on a causal one with Nq > Nk, whose first rows see no key.
    std::vector<test::Case> cases;
    uint64_t seed = 4900;
    for (int64_t d : {64, 128}) {
        for (const bool wide : {true, false}) {
            test::Case c;
            c.problem = wide ? test::make_problem(1, 2, 130, 200, d, false) : test::make_problem(1, 1, 200, 130, d, true);
            c.layout = wide ? Layout::BHND : Layout::BNHD;
            c.seed = seed++;
            cases.push_back(c);
        }
    }
    check_cases(cases);
}

TEST_CASE("stage 11's standalone steps refuse what they cannot do, naming it") {
    const Problem p = test::make_problem(1, 2, 40, 40, 32);
    const Problem ok = test::make_problem(1, 2, 40, 40, 64);
    const Inputs in = make_inputs(ok, Layout::BHND, InputKind::Normal, 1);
    const HostTensor o(ok.batch, ok.heads, ok.seq_q, ok.head_dim, Layout::BHND);
    const std::vector<float> lse(size_t(ok.lse_elems()));
    cuda::DeviceTensors dev(ok, in.q.cview(), in.k.cview(), in.v.cview(), o.cview(), make_view3(lse.data(), ok.batch, ok.heads, ok.seq_q));
    cuda::HalfTensors<__nv_bfloat16> half(ok, Layout::BHND);
    View4<const __nv_bfloat16> shifted = half.q;  // rows that do not start on 16 bytes
    shifted.data += 1;
    for (const auto& [step, fn] : standalone_steps<__nv_bfloat16>()) {
        INFO("step " << step);
        CHECK_THROWS_WITH_AS(fn(p, half.q, half.k, half.v, half.o, dev.lse, nullptr), doctest::Contains("d must be 64 or 128"), InputError);
        CHECK_THROWS_WITH_AS(fn(ok, shifted, half.k, half.v, half.o, dev.lse, nullptr), doctest::Contains("16-byte aligned"), InputError);
    }
}
