// Stage 11's Hopper kernel on the CPU, by the warp emulator (tools/warp_emulator: TMA loads that land
// late on mbarriers, wgmma that runs at its wait, named barriers, the persistent grid's counter): every
// step of the road, launched as the stage launches it (stages/11_hopper_kernel/launch.cuh: the
// instance chosen, the tensor maps and arguments built, the grid sized), against the float64
// reference by the low-precision rule (fa/tolerance.hpp: twice the error of naive attention in the
// same 16-bit type), as tests/test_stage11.cpp checks the GPU; and the standalone reading files of
// steps/ against their switch steps bit for bit, as tests/test_stage11_steps.cpp does. The emulated
// GPU has two SMs, so a persistent grid's first block takes (here, where blocks run one after the
// other) every work item, its ring and turns running on from item to item.
// No GPU is needed, so this runs in CI; the GPU tests remain the check of the compiled kernels.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "emulator.hpp"
#include "fa/precision.hpp"
#include "fa/reference.hpp"
#include "fa/tolerance.hpp"
#include "stages/11_hopper_kernel/launch.cuh"
#include "stages/11_hopper_kernel/steps/step1_wgmma.cu"
#include "stages/11_hopper_kernel/steps/step2_tma_ring.cu"
#include "stages/11_hopper_kernel/steps/step3_warp_roles.cu"
#include "stages/11_hopper_kernel/steps/step4_ping_pong.cu"
#include "stages/11_hopper_kernel/steps/step9_persistent.cu"
#include "support.hpp"

// The dynamic shared memory the kernels declare (`extern __shared__ ... smem_raw[]`), one per namespace.
namespace fa::stage11 {
alignas(128) unsigned char smem_raw[232448];
}
namespace fa::stage11::step1 {
alignas(128) unsigned char smem_raw[232448];
}
namespace fa::stage11::step2 {
alignas(128) unsigned char smem_raw[232448];
}
namespace fa::stage11::step3 {
alignas(128) unsigned char smem_raw[232448];
}
namespace fa::stage11::step4 {
alignas(128) unsigned char smem_raw[232448];
}
namespace fa::stage11::step9 {
alignas(128) unsigned char smem_raw[232448];
}

namespace {

using namespace fa;
using namespace fa::stage11;

// The emulated GPU's SMs: a persistent grid has two blocks.
constexpr int kSms = 2;

/// A 16-bit copy of a float32 tensor with the same strides (so the same layout), rounded to T.
template <class T>
struct Half4 {
    std::vector<uint16_t> bits;
    View4<T> view;
    explicit Half4(View4<const float> x) : bits(size_t(span(x)), 0xffff), view{reinterpret_cast<T*>(bits.data()), x.shape, x.stride} {
        for (int64_t b = 0; b < x.shape[0]; ++b)
            for (int64_t h = 0; h < x.shape[1]; ++h)
                for (int64_t n = 0; n < x.shape[2]; ++n)
                    for (int64_t i = 0; i < x.shape[3]; ++i) bits[size_t(x.offset(b, h, n, i))] = emu::to_bits<T>(x(b, h, n, i));
    }
    static int64_t span(View4<const float> x) {
        int64_t s = 1;
        for (int i = 0; i < 4; ++i) s += (x.shape[i] - 1) * x.stride[i];
        return s;
    }
    /// Widens this tensor into `out` (same shape and strides).
    void widen(View4<float> out) const {
        for (int64_t b = 0; b < out.shape[0]; ++b)
            for (int64_t h = 0; h < out.shape[1]; ++h)
                for (int64_t n = 0; n < out.shape[2]; ++n)
                    for (int64_t i = 0; i < out.shape[3]; ++i) out(b, h, n, i) = emu::to_f<T>(bits[size_t(out.offset(b, h, n, i))]);
    }
};

/// The switch kernel's instance on the emulator: launch.cuh's find_launcher() picks it, as attention.cu's StreamLaunch.
template <class T, int D, class Step>
struct EmulatedLaunch {
    static void run(const Args<T>& a, cudaStream_t) {
        using S = Shape<T, D, Step>;
        REQUIRE(S::kSmemBytes <= sizeof fa::stage11::smem_raw);
        const unsigned blocks = grid_blocks(S::kF, a.q_tiles, a.batch_heads, kSms);
        emu::launch(long(blocks), S::kThreads, fa::stage11::smem_raw, S::kSmemBytes, [&] { hopper_forward_kernel<T, D, Step>(a); });
    }
};

/// Step `step` of the switch kernel on 16-bit views, as attention.cu's run_device() runs it (the
/// instance, the arguments, the persistent grid's counter); with `marks`, its instrumented build.
template <class T>
void run_switch(const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<T> o, View3<float> lse, int step,
                cuda::TimelineMark* marks = nullptr) {
    const LaunchFn<T> launcher = find_launcher<T, EmulatedLaunch>(p, step, marks != nullptr);
    const bool built = launcher != nullptr;
    REQUIRE(built);
    Args<T> a{};
    fill_args(a, p, features_of(step, p, marks != nullptr), q, k, v, o, lse);
    unsigned counter = 0;
    a.work_counter = &counter;
    a.timeline = marks;
    a.timeline_block = 0;
    launcher(a, nullptr);
}

/// A standalone step's kernel (steps/stepN_*.cu) on the emulator, from its fill_args() and on its
/// grid: a block per query tile and head, or for the persistent grid (step 9) a block per SM.
template <class S, class A, class T>
void run_reading(void (*fill)(A&, const Problem&, View4<const T>, View4<const T>, View4<const T>, View4<T>, View3<float>),
                 void (*kernel)(A), unsigned char* smem, const Problem& p, View4<const T> q, View4<const T> k,
                 View4<const T> v, View4<T> o, View3<float> lse) {
    A a{};
    fill(a, p, q, k, v, o, lse);
    long blocks = long(a.q_tiles) * p.batch * p.heads;
    unsigned counter = 0;
    if constexpr (requires { a.work_counter; }) {
        a.work_counter = &counter;
        blocks = std::min(blocks, long(kSms));
    }
    REQUIRE(size_t(S::kSmemBytes) <= sizeof fa::stage11::smem_raw);
    emu::launch(blocks, S::kThreads, smem, S::kSmemBytes, [&] { kernel(a); });
}

template <class T, int D>
void run_reading_step(int step, const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<T> o, View3<float> lse) {
    switch (step) {
        case 1: return run_reading<step1::Shape<D>>(step1::fill_args<T, D>, step1::attention_kernel<T, D>, step1::smem_raw, p, q, k,
                                                    v, o, lse);
        case 2: return run_reading<step2::Shape<D>>(step2::fill_args<T, D>, step2::attention_kernel<T, D>, step2::smem_raw, p, q, k,
                                                    v, o, lse);
        case 3: return run_reading<step3::Shape<D>>(step3::fill_args<T, D>, step3::attention_kernel<T, D>, step3::smem_raw, p, q, k,
                                                    v, o, lse);
        case 4: return run_reading<step4::Shape<D>>(step4::fill_args<T, D>, step4::attention_kernel<T, D>, step4::smem_raw, p, q, k,
                                                    v, o, lse);
        default: return run_reading<step9::Shape<D>>(step9::fill_args<T, D>, step9::attention_kernel<T, D>, step9::smem_raw, p, q,
                                                     k, v, o, lse);
    }
}

/// Runs `run(q, k, v, o, lse)` on 16-bit copies of the case's inputs (its layout); O widened back,
/// the outputs starting as NaN (O's 16-bit words all ones, LSE too), so unwritten elements show.
template <class T, class Run>
test::Result run_16bit(const Problem& p, const Inputs& in, Layout layout, Run run) {
    const Half4<T> q(in.q.cview()), k(in.k.cview()), v(in.v.cview());
    HostTensor o32(p.batch, p.heads, p.seq_q, p.head_dim, layout, std::nanf(""));
    Half4<T> o(o32.cview());
    std::vector<float> lse(size_t(p.lse_elems()), std::nanf(""));
    run(View4<const T>(q.view), View4<const T>(k.view), View4<const T>(v.view), o.view,
        make_view3(lse.data(), p.batch, p.heads, p.seq_q));
    o.widen(o32.view);
    return {o32.logical(), lse};
}

/// Every step (1 to the last) on case `c` in type T: each against the float64 reference by the
/// low-precision rule, rows that see no key O = 0 and LSE = -inf, and every output written.
template <class T>
void check_road(const test::Case& c) {
    const Problem& p = c.problem;
    const Precision precision = std::is_same_v<T, __half> ? Precision::Float16 : Precision::BFloat16;
    const Inputs in = make_inputs(p, c.layout, c.inputs, c.seed);
    const Reference ref = reference_attention(p, in.q.cview(), in.k.cview(), in.v.cview());
    const EmulatedAttention naive = naive_attention_emulated(precision, p, in.q.cview(), in.k.cview(), in.v.cview());
    const Tolerances tol = low_precision_tolerance(input_stats(p, in.q.cview(), in.k.cview(), in.v.cview()), precision,
                                                   compare(naive.o, ref.o), compare(naive.lse, ref.lse));
    for (int step = 1; step <= kLastStep; ++step) {
        const test::Result got = run_16bit<T>(p, in, c.layout, [&](auto q, auto k, auto v, auto o, auto lse) {
            run_switch<T>(p, q, k, v, o, lse, step);
        });
        const std::string what = c.name() + " " + to_string(precision) + " step " + std::to_string(step) +
                                 (small_blocks_for(step, p) ? " (small blocks)" : "") + " vs float64";
        test::check_close(got, ref.o, ref.lse, tol, what);
        INFO(what);
        test::check_rows_without_keys(p, got);
    }
}

/// O's 16-bit words and LSE's floats of one run, the outputs first filled with the byte `poison`.
struct Bits {
    std::vector<uint16_t> o;
    std::vector<float> lse;
};

template <class T, class Run>
Bits run_poisoned(const Problem& p, const Inputs& in, Layout layout, int poison, Run run) {
    const Half4<T> q(in.q.cview()), k(in.k.cview()), v(in.v.cview());
    const HostTensor o32(p.batch, p.heads, p.seq_q, p.head_dim, layout);
    Half4<T> o(o32.cview());
    Bits out{o.bits, std::vector<float>(size_t(p.lse_elems()))};
    std::memset(o.bits.data(), poison, o.bits.size() * 2);
    std::memset(out.lse.data(), poison, out.lse.size() * 4);
    run(View4<const T>(q.view), View4<const T>(k.view), View4<const T>(v.view), o.view,
        make_view3(out.lse.data(), p.batch, p.heads, p.seq_q));
    out.o = o.bits;
    return out;
}

/// Each reading file (steps 1, 2, 3, 4, 9) against its switch step on case `c`, bit for bit.
template <class T>
void check_reading_files(const test::Case& c) {
    const Problem& p = c.problem;
    const Inputs in = make_inputs(p, c.layout, c.inputs, c.seed);
    for (int step : {1, 2, 3, 4, 9}) {
        INFO(c.name() << " " << (std::is_same_v<T, __half> ? "fp16" : "bf16") << " step " << step);
        const Bits want = run_poisoned<T>(p, in, c.layout, 0xff, [&](auto q, auto k, auto v, auto o, auto lse) {
            run_switch<T>(p, q, k, v, o, lse, step);
        });
        const Bits got = run_poisoned<T>(p, in, c.layout, 0xfe, [&](auto q, auto k, auto v, auto o, auto lse) {
            p.head_dim == 64 ? run_reading_step<T, 64>(step, p, q, k, v, o, lse) : run_reading_step<T, 128>(step, p, q, k, v, o, lse);
        });
        CHECK(std::memcmp(got.o.data(), want.o.data(), want.o.size() * 2) == 0);
        CHECK(std::memcmp(got.lse.data(), want.lse.data(), want.lse.size() * 4) == 0);
    }
}

/// The cases: tails (no block divides N), Nq != Nk both ways, causal with rows that see no key
/// (Nq > Nk), both layouts, B x H > 1, large logits (rows whose maximum grows past step 17's slack),
/// a negative and a zero scale; small enough that the whole road runs in seconds here, large enough
/// that the rings wrap more than once and a persistent block loops over several items.
std::vector<test::Case> cases(int64_t d) {
    return test::cases_of({
        {1, 2, 130, 300, false, Layout::BHND, InputKind::Normal, {}},   // Nq < Nk, tails: three key tiles of 128
        {1, 1, 200, 130, true, Layout::BNHD, InputKind::Normal, {}},    // Nq > Nk, causal: the first 70 rows see no key
        {2, 1, 77, 77, true, Layout::BNHD, InputKind::Normal, -0.2},    // B = 2, causal, a negative scale
        {1, 3, 300, 200, false, Layout::BHND, InputKind::Large, {}},    // Nq > Nk, scores of order 400
        {1, 2, 257, 520, true, Layout::BHND, InputKind::Large, {}},     // causal, Nq < Nk: rings wrap twice and more
        {1, 1, 37, 61, true, Layout::BNHD, InputKind::Normal, 0.0},     // a zero scale: uniform weights
    }, d, 1100 + uint64_t(d));
}

}  // namespace

TEST_CASE("emulated stage 11: every step matches the float64 reference in bf16 at d = 64") {
    for (const test::Case& c : cases(64)) check_road<__nv_bfloat16>(c);
}

TEST_CASE("emulated stage 11: every step matches the float64 reference in fp16 at d = 64") {
    for (const test::Case& c : cases(64)) check_road<__half>(c);
}

TEST_CASE("emulated stage 11: every step matches the float64 reference in bf16 at d = 128") {
    for (const test::Case& c : cases(128)) check_road<__nv_bfloat16>(c);
}

TEST_CASE("emulated stage 11: every step matches the float64 reference in fp16 at d = 128") {
    for (const test::Case& c : cases(128)) check_road<__half>(c);
}

TEST_CASE("emulated stage 11: the reading files of steps 1, 2, 3, 4 and 9 give their switch steps' bits") {
    for (int64_t d : {64, 128}) {
        for (const test::Case& c : cases(d)) {
            check_reading_files<__nv_bfloat16>(c);
            check_reading_files<__half>(c);
        }
    }
}

TEST_CASE("emulated stage 11: the instrumented builds give their steps' bits and record each warpgroup's marks in order") {
    for (int64_t d : {64, 128}) {
        // Not causal: the instrumented build is the step's own kernel, and step 11's small blocks
        // (d = 64, causal, few keys), which have none, would not run here either.
        const test::Case c = cases(d)[3];
        const Problem& p = c.problem;
        const Inputs in = make_inputs(p, c.layout, c.inputs, c.seed);
        for (int step : {3, 4, 5, 8, 9, 10, 12, 17}) {
            INFO(c.name() << " step " << step);
            std::vector<cuda::TimelineMark> marks(size_t(5 * kTimelineMarks), cuda::TimelineMark{});
            const Bits want = run_poisoned<__nv_bfloat16>(p, in, c.layout, 0xff, [&](auto q, auto k, auto v, auto o, auto lse) {
                run_switch<__nv_bfloat16>(p, q, k, v, o, lse, step);
            });
            const Bits got = run_poisoned<__nv_bfloat16>(p, in, c.layout, 0xfe, [&](auto q, auto k, auto v, auto o, auto lse) {
                run_switch<__nv_bfloat16>(p, q, k, v, o, lse, step, marks.data());
            });
            CHECK(std::memcmp(got.o.data(), want.o.data(), want.o.size() * 2) == 0);
            CHECK(std::memcmp(got.lse.data(), want.lse.data(), want.lse.size() * 4) == 0);
            // Block 0 records: each warpgroup's list from its start to its end, in the order it made them.
            for (int w = 0; w <= features_of(step, p, true).consumers; ++w) {
                const cuda::TimelineMark* m = marks.data() + w * kTimelineMarks;
                int n = 0, unordered = 0;
                while (n < kTimelineMarks && m[n].cycle != 0) unordered += n > 0 && m[n].cycle <= m[n - 1].cycle, ++n;
                INFO("warpgroup " << w << ": " << n << " marks");
                REQUIRE(n >= 2);
                CHECK(m[0].what == kMarkStart);
                CHECK(m[n - 1].what == kMarkEnd);
                CHECK(unordered == 0);
            }
        }
    }
}
