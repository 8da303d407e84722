// Stage 07 (tensor-core kernel, bf16 and fp16) against the float64 reference and stage 06, by the
// low-precision rule; every step of the road; the contract for rows that see no key; any scale.
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "../stages/06_causal_masking/attention.cuh"
#include "../stages/07_pipelined_fused_kernel/attention.cuh"
#include "fa/error.hpp"
#include "fa/precision.hpp"
#include "fa/reference.hpp"
#include "fa/tolerance.hpp"
#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "model_cases.hpp"
#include "gpu_support.hpp"
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

using test::to_float;

// A case of tests/model_cases.hpp through stage07::attention_device with its ModelOptions, in T:
// packed (total, H, d) buffers on the device read as (B, H, N, d) views, as a packed batch of equal
// sequences would be. Which instance ran is not visible from here (the emulated test checks it).
template <class T>
std::optional<bool> run_model_on_gpu(const test::ModelCase& c, const test::RoundedInputs& in, std::vector<float>& o,
                                     std::vector<float>& lse) {
    const auto to_device = [](const std::vector<float>& x) { return test::to_device<T>(x); };
    const cuda::DeviceBuffer<T> q = to_device(in.q), k = to_device(in.k), v = to_device(in.v);
    cuda::DeviceBuffer<T> od(o.size());
    cuda::DeviceBuffer<float> ld(lse.size());
    FA_CUDA_CHECK(cudaMemset(od.data(), 0xff, od.bytes()));  // NaN: what the kernel forgets to write shows
    FA_CUDA_CHECK(cudaMemset(ld.data(), 0xff, ld.bytes()));
    const int64_t D = c.d, total_q = int64_t(c.B) * c.Nq;
    const auto view = [&](const cuda::DeviceBuffer<T>& x, int64_t h, int64_t n) {
        return View4<const T>{x.data(), {c.B, h, n, D}, {n * h * D, D, h * D, 1}};
    };
    const View4<T> ov{od.data(), {c.B, c.Hq, c.Nq, D}, {int64_t(c.Nq) * c.Hq * D, D, int64_t(c.Hq) * D, 1}};
    const View3<float> lv{ld.data(), {c.B, c.Hq, c.Nq}, {c.Nq, total_q, 1}};
    stage07::attention_device(c.problem(), c.options(), view(q, c.Hq, c.Nq), view(k, c.Hk, c.Nk), view(v, c.Hk, c.Nk), ov,
                              lv, nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> oh(o.size());
    od.copy_to_host(oh.data(), oh.size());
    for (size_t i = 0; i < o.size(); ++i) o[i] = to_float(oh[i]);
    ld.copy_to_host(lse.data(), lse.size());
    return std::nullopt;
}

std::optional<bool> run_model_case(const test::ModelCase& c, const test::RoundedInputs& in, std::vector<float>& o,
                                   std::vector<float>& lse) {
    return c.precision == Precision::BFloat16 ? run_model_on_gpu<__nv_bfloat16>(c, in, o, lse)
                                              : run_model_on_gpu<__half>(c, in, o, lse);
}

// A packed call of tests/model_cases.hpp through stage07::attention_varlen_device, in T: the
// packed (total, H, d) buffers and cu_seqlens on the device, max lengths `max`.
template <class T>
std::optional<bool> run_varlen_on_gpu(const VarlenProblem& vp, const stage07::MaxSeqlens& max, const test::RoundedInputs& in,
                                      std::vector<float>& o, std::vector<float>& lse) {
    const auto to_device = [](const std::vector<float>& x) { return test::to_device<T>(x); };
    const cuda::DeviceBuffer<T> q = to_device(in.q), k = to_device(in.k), v = to_device(in.v);
    const cuda::DeviceBuffer<int32_t> cu_q = test::ints_to_device(vp.cu_seqlens_q), cu_k = test::ints_to_device(vp.cu_seqlens_k);
    cuda::DeviceBuffer<int32_t> schedule(size_t(stage07::varlen_schedule_ints(vp)));
    cuda::DeviceBuffer<T> od(o.size());
    cuda::DeviceBuffer<float> ld(lse.size());
    if (od.bytes() > 0) FA_CUDA_CHECK(cudaMemset(od.data(), 0xff, od.bytes()));  // NaN: what the kernel forgets shows
    if (ld.bytes() > 0) FA_CUDA_CHECK(cudaMemset(ld.data(), 0xff, ld.bytes()));
    const int64_t d = vp.head_dim;
    const auto packed = [&](const cuda::DeviceBuffer<T>& x, int64_t total, int64_t heads) {
        return make_packed_view(static_cast<const T*>(x.data()), total, heads, d);
    };
    const View3<float> lv{ld.data(), {1, vp.heads_q, vp.total_q}, {vp.heads_q * vp.total_q, vp.total_q, 1}};
    stage07::attention_varlen_device(vp, max, packed(q, vp.total_q, vp.heads_q), packed(k, vp.total_k, vp.heads_k),
                                     packed(v, vp.total_k, vp.heads_k), make_packed_view(od.data(), vp.total_q, vp.heads_q, d),
                                     lv, stage07::VarlenDeviceArrays{cu_q.data(), cu_k.data(), schedule.data()}, nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> oh(o.size());
    if (!oh.empty()) od.copy_to_host(oh.data(), oh.size());
    for (size_t i = 0; i < o.size(); ++i) o[i] = to_float(oh[i]);
    if (!lse.empty()) ld.copy_to_host(lse.data(), lse.size());
    return std::nullopt;
}

void check_varlen_on_gpu(const test::VarlenCase& c, uint64_t seed) {
    const VarlenProblem vp = c.problem();
    const stage07::MaxSeqlens max{vp.max_seq_q() + c.extra_max, vp.max_seq_k() + c.extra_max};
    test::check_packed_case(vp, c.precision, InputKind::Normal, seed, true,
                            [&](const test::RoundedInputs& in, std::vector<float>& o, std::vector<float>& lse) {
                                return c.precision == Precision::BFloat16
                                           ? run_varlen_on_gpu<__nv_bfloat16>(vp, max, in, o, lse)
                                           : run_varlen_on_gpu<__half>(vp, max, in, o, lse);
                            });
}

}  // namespace

TEST_CASE("stage 07 on packed batches of different lengths matches the float64 reference") {
    // The cases of tests/model_cases.hpp (also run on the CPU by test_stage07_emulated), and larger
    // ones: a long sequence among short ones with many tiles on both sides of a window, d = 32 and
    // 256 too.
    uint64_t seed = 9100;
    for (const test::VarlenCase& c : test::varlen_cases()) check_varlen_on_gpu(c, ++seed);
    const Precision bf16 = Precision::BFloat16, fp16 = Precision::Float16;
    const test::VarlenCase large[] = {
        {128, bf16, {2000, 1, 0, 300, 129, 7}, {2000, 5, 3, 300, 64, 900}, 8, 2, Window::causal(), 0.0, 0.088},
        {64, fp16, {1500, 3, 257, 1024}, {1700, 3, 257, 1024}, 16, 2, Window{255, 0}, 0.0, 0.125},
        {256, bf16, {600, 1, 31}, {600, 40, 31}, 4, 1, Window{300, 50}, 30.0, 0.0625},
        {32, fp16, {129, 0, 1000}, {129, 1, 1000}, 4, 4, Window::full(), 0.0, 0.17},
    };
    for (const test::VarlenCase& c : large) check_varlen_on_gpu(c, ++seed);
}

TEST_CASE("stage 07 refuses a packed call whose lengths exceed the longest given, naming them") {
    VarlenProblem vp;
    vp.cu_seqlens_q = {0, 3, 10}, vp.cu_seqlens_k = {0, 4, 9};
    vp.total_q = 10, vp.total_k = 9;
    CHECK_THROWS_WITH_AS(stage07::attention_varlen_device(vp, stage07::MaxSeqlens{6, 5}, View4<const __half>{},
                                                          View4<const __half>{}, View4<const __half>{}, View4<__half>{},
                                                          View3<float>{}, stage07::VarlenDeviceArrays{}, nullptr),
                         doctest::Contains("sequence 1 length 7, more than max_seqlen_q = 6"), InputError);
}

TEST_CASE("stage 07 with grouped-query heads, sliding windows and the soft cap matches the float64 reference") {
    // The cases of tests/model_cases.hpp (also run on the CPU by test_stage07_emulated), and the
    // same at sizes the emulator cannot afford: many tiles on both sides of each window.
    for (const test::ModelCase& c : test::model_cases()) test::check_model_case(c, run_model_case);
    const Precision bf16 = Precision::BFloat16, fp16 = Precision::Float16;
    const test::ModelCase large[] = {
        {128, bf16, 2, 8, 1, 1000, 1000, true, Window{255, -1}, 0.0, 0.088, true},
        {64, fp16, 1, 16, 2, 777, 2049, false, Window{300, 100}, 0.0, 0.125, true},
        {256, bf16, 1, 4, 2, 600, 600, true, Window{4096, -1}, 50.0, 0.0625, true},
        {64, bf16, 3, 6, 3, 1500, 1100, false, Window::full(), 0.0, 0.125, true},
    };
    for (const test::ModelCase& c : large) test::check_model_case(c, run_model_case);
}

TEST_CASE("stage 07 with dropout, dense and packed, matches the float64 reference given the same mask") {
    // The cases of tests/model_cases.hpp (also run on the CPU by test_stage07_emulated), and larger
    // ones: many key tiles and query tiles, so that every (m-tile, 32-key group) coordinate of the
    // map is exercised far from 0, batch entries and sequences past the first.
    for (const test::ModelCase& c : test::dropout_model_cases()) test::check_model_case(c, run_model_case);
    uint64_t seed = 9300;
    for (const test::VarlenCase& c : test::dropout_varlen_cases()) check_varlen_on_gpu(c, ++seed);
    const Precision bf16 = Precision::BFloat16, fp16 = Precision::Float16;
    const auto dropped = [](test::ModelCase c, double p, uint64_t s, uint32_t offset) {
        c.dropout = Dropout{p, s, offset};
        return c;
    };
    const test::ModelCase large[] = {
        dropped({128, bf16, 2, 8, 2, 1000, 1000, true, Window::full(), 0.0, 0.088, true}, 0.1, 1234, 0),
        dropped({64, fp16, 1, 16, 16, 777, 2049, false, Window{300, 100}, 0.0, 0.125, true}, 0.5, 0xfedcba9876543210ull, 7),
        dropped({256, bf16, 1, 4, 2, 600, 600, true, Window::full(), 50.0, 0.0625, true}, 0.2, 99, 1),
        dropped({32, fp16, 3, 6, 3, 500, 1100, false, Window::full(), 0.0, 0.17, true}, 0.1, 5, 123),
    };
    for (const test::ModelCase& c : large) test::check_model_case(c, run_model_case);
    const test::VarlenCase large_packed[] = {
        {128, bf16, {2000, 1, 0, 300, 129, 7}, {2000, 5, 3, 300, 64, 900}, 8, 2, Window::causal(), 0.0, 0.088, 0,
         Dropout{0.1, 77, 0}},
        {64, fp16, {1500, 3, 257, 1024}, {1700, 3, 257, 1024}, 16, 2, Window{255, 0}, 0.0, 0.125, 0, Dropout{0.5, 3, 9}},
    };
    for (const test::VarlenCase& c : large_packed) check_varlen_on_gpu(c, ++seed);
}

TEST_CASE("stage 07 refuses a dropout probability that would drop everything, naming the option") {
    Problem p = test::make_problem(1, 2, 16, 16, 64);
    stage07::ModelOptions options;
    options.dropout.p = 0.999;
    CHECK_THROWS_WITH_AS(stage07::attention_device(p, options, View4<const __half>{}, View4<const __half>{},
                                                   View4<const __half>{}, View4<__half>{}, View3<float>{}, nullptr),
                         doctest::Contains("--dropout 0.999 would drop every entry"), InputError);
    VarlenProblem vp;
    vp.dropout.p = 1.0;
    CHECK_THROWS_WITH_AS(stage07::attention_varlen_device(vp, stage07::MaxSeqlens{1, 1}, View4<const __half>{},
                                                          View4<const __half>{}, View4<const __half>{}, View4<__half>{},
                                                          View3<float>{}, stage07::VarlenDeviceArrays{}, nullptr),
                         doctest::Contains("--dropout 1 is outside [0, 1)"), InputError);
}

TEST_CASE("stage 07 refuses query heads that its key/value heads do not divide, naming both") {
    Problem p = test::make_problem(1, 6, 16, 16, 64);
    stage07::ModelOptions options;
    options.kv_heads = 4;
    CHECK_THROWS_WITH_AS(stage07::attention_device(p, options, View4<const __nv_bfloat16>{}, View4<const __nv_bfloat16>{},
                                                   View4<const __nv_bfloat16>{}, View4<__nv_bfloat16>{}, View3<float>{},
                                                   nullptr),
                         doctest::Contains("--heads 6 is not a multiple of --kv-heads 4"), InputError);
}

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
    const std::vector<std::array<int64_t, 2>> sizes = {{128, 128}, {129, 128}, {128, 129}, {191, 257}, {257, 191},
                                                       {300, 64},  {64, 300},  {1, 500},   {500, 1}};
    for (const test::Case& c : test::diagonal_cases(sizes, {32, 64, 128, 256}, 900)) check_case(c, DType::BF16);
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
    for (const test::Case& c : test::scale_cases(1000)) check_case(c, DType::BF16);
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
