// Stage 09 (the backward kernel, bf16 and fp16) against the float64 reference backward by the
// gradient rule (fa::gradient_tolerance: twice the error of the naive backward in the same
// precision, plus a floor), with O and LSE from stage 07's forward in the same precision, as the
// executable does. Every awkward size, both layouts, d = 32, 64, 128; rows and whole query blocks
// that see no key get exactly zero gradients; any scale; the deterministic mode is bit-identical
// from run to run; the device entry point with a kept workspace; what the stage refuses. Every
// test runs each main kernel of the stage's road (every --step of road()).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../stages/07_pipelined_fused_kernel/attention.cuh"
#include "../stages/09_backward_kernel/attention.cuh"
#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/half.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/error.hpp"
#include "fa/precision.hpp"
#include "fa/reference_backward.hpp"
#include "fa/tolerance.hpp"
#include "backward_check.hpp"
#include "backward_model_cases.hpp"
#include "gpu_support.hpp"
#include "support.hpp"

using namespace fa;
using fa::cuda::DType;
using fa::test::Forward;
using fa::test::Grads;
using fa::test::Judge;
using fa::test::run_backward;

namespace {

Precision precision_of(DType dtype) { return dtype == DType::BF16 ? Precision::BFloat16 : Precision::Float16; }

std::string describe(DType dtype, bool deterministic, int step) {
    return " dtype=" + cuda::to_string(dtype) + (deterministic ? " deterministic" : " atomic") + " step=" + std::to_string(step);
}

// The main kernels of the road, every one of which each test runs.
std::vector<int> steps() {
    std::vector<int> s;
    for (int i = 0; i < int(stage09::road().size()); ++i) s.push_back(i);
    return s;
}

// O and LSE as the backward receives them: from stage 07's forward in the same 16-bit type.
Forward forward(const Problem& p, const Inputs& in, Layout layout, DType dtype) {
    return test::run_forward(stage07::host_entry(dtype), p, in, layout);
}

// Runs stage 09 on `c` in `dtype` and checks it against the float64 reference; returns the gradients.
Grads check_case(const test::Case& c, DType dtype, bool deterministic, int step) {
    const Problem& p = c.problem;
    const Inputs in = make_inputs(p, c.layout, c.inputs, c.seed);
    const HostTensor dout = make_output_gradient(p, c.layout, c.seed);
    const Forward f = forward(p, in, c.layout, dtype);
    const Grads got = run_backward(stage09::host_entry({dtype, deterministic, step}), p, in, f, dout, c.layout);
    const Judge j = test::judge(p, in, dout, precision_of(dtype));
    const std::string what = c.name() + describe(dtype, deterministic, step);
    test::check_gradients(got, j, what + " vs float64 reference");
    test::check_rows_without_keys(p, got, what);
    return got;
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("stage 09 matches the float64 reference backward on the standard cases, bf16 and fp16, d = 32, 64, 128") {
    for (int step : steps()) {
        for (const test::Case& c : test::standard_cases({32, 64, 128})) {
            check_case(c, DType::BF16, false, step);
            check_case(c, DType::FP16, false, step);
        }
    }
}

TEST_CASE("stage 09 handles the diagonal wherever it falls against its query blocks and key blocks (64 and 128)") {
    const int64_t sizes[][2] = {{64, 64},  {65, 64},  {64, 65},  {128, 192}, {192, 128}, {191, 257}, {257, 191},
                                {300, 64}, {64, 300}, {1, 500},  {500, 1},   {129, 1},   {63, 127},  {127, 63}};
    uint64_t seed = 900;
    for (int64_t d : {32, 64, 128}) {
        for (const auto& s : sizes) {
            for (bool causal : {true, false}) {
                if (!causal && d != 64) continue;  // the causal mask is what the sizes are about
                test::Case c;
                c.problem = test::make_problem(1, 2, s[0], s[1], d, causal);
                c.layout = seed % 2 ? Layout::BNHD : Layout::BHND;
                c.seed = seed++;
                for (int step : steps()) check_case(c, seed % 3 == 0 ? DType::FP16 : DType::BF16, false, step);
            }
        }
    }
}

TEST_CASE("stage 09: rows and whole query blocks that see no key get dQ = 0 exactly, every gradient finite") {
    uint64_t seed = 1200;
    for (int64_t d : {32, 64, 128}) {
        for (DType dtype : {DType::BF16, DType::FP16}) {
            for (bool deterministic : {false, true}) {
                // Rows 0-199 see no key: with 64-row query blocks, blocks 0-2 are never visited and
                // block 3 only in part; with 128-row blocks, block 0 never and block 1 in part.
                test::Case c;
                c.problem = test::make_problem(2, 1, 300, 100, d, true);
                c.layout = Layout::BNHD;
                c.seed = seed++;
                for (int step : steps()) check_case(c, dtype, deterministic, step);
            }
        }
    }
}

TEST_CASE("stage 09 takes any finite scale: negative, zero, large") {
    for (const test::Case& c : test::scale_cases(1000)) {
        for (int step : steps()) {
            check_case(c, DType::BF16, false, step);
            check_case(c, DType::FP16, true, step);
        }
    }
}

TEST_CASE("stage 09's deterministic mode gives bit-identical gradients over runs, within the rule of the atomic mode") {
    struct Shape {
        int64_t B, H, Nq, Nk, d;
        bool causal;
    };
    // Many key blocks add into the same dQ rows: 7, 11 and 5 key blocks of 64 (4, 6, 3 of 128).
    const Shape shapes[] = {{2, 3, 517, 389, 64, true}, {1, 2, 300, 700, 128, false}, {1, 2, 700, 300, 32, true},
                            {1, 1, 1000, 1000, 128, true}};
    uint64_t seed = 1300;
    for (const Shape& s : shapes) {
        for (DType dtype : {DType::BF16, DType::FP16}) {
            for (int step : steps()) {
                test::Case c;
                c.problem = test::make_problem(s.B, s.H, s.Nq, s.Nk, s.d, s.causal);
                c.layout = seed % 2 ? Layout::BNHD : Layout::BHND;
                c.seed = seed++;
                const Problem& p = c.problem;
                const Inputs in = make_inputs(p, c.layout, c.inputs, c.seed);
                const HostTensor dout = make_output_gradient(p, c.layout, c.seed);
                const Forward f = forward(p, in, c.layout, dtype);
                const BackwardFn det = stage09::host_entry({dtype, true, step});
                const Grads first = run_backward(det, p, in, f, dout, c.layout);
                for (int run = 1; run < 3; ++run) {
                    const Grads again = run_backward(det, p, in, f, dout, c.layout);
                    INFO(c.name() << describe(dtype, true, step) << ", run " << run + 1 << " against run 1");
                    CHECK(bit_identical(again.dq, first.dq));
                    CHECK(bit_identical(again.dk, first.dk));
                    CHECK(bit_identical(again.dv, first.dv));
                }
                const Grads atomic = run_backward(stage09::host_entry({dtype, false, step}), p, in, f, dout, c.layout);
                const Judge j = test::judge(p, in, dout, precision_of(dtype));
                const std::string what = c.name() + " dtype=" + cuda::to_string(dtype) + " step=" + std::to_string(step);
                test::check_gradients(first, j, what + " deterministic vs float64 reference");
                test::check_gradients(atomic, j, what + " atomic vs float64 reference");
                test::check_gradients(first, atomic.dq, atomic.dk, atomic.dv, j.tol, what + " deterministic vs atomic");
                // dK and dV never leave their block: the two modes compute them identically.
                CHECK(bit_identical(first.dk, atomic.dk));
                CHECK(bit_identical(first.dv, atomic.dv));
            }
        }
    }
}

namespace {

// The device entry point, as a benchmark or a PyTorch extension calls it: 16-bit device tensors
// (made here the way the host entry point makes them), a stream, a workspace kept across calls.
template <class T>
Grads run_device(const Problem& p, const Inputs& in, const Forward& f, const HostTensor& dout, Layout layout,
                 bool deterministic, int step, cudaStream_t stream, stage09::Workspace& workspace) {
    cuda::DeviceTensors dev(p, in.q.cview(), in.k.cview(), in.v.cview(), f.o.cview(), f.lse_view(p));
    cuda::HalfTensors<T> half(p, layout);
    half.load(dev.q, dev.k, dev.v);
    cuda::convert(View4<const float>(dev.o), half.o);
    cuda::DeviceBuffer<float> dout_f32(size_t(p.q_elems()));
    dout_f32.copy_from_host(dout.storage.data(), dout_f32.size());
    const auto view16 = [&](cuda::DeviceBuffer<T>& b, int64_t n) { return make_view<T>(b.data(), p.batch, p.heads, n, p.head_dim, layout); };
    cuda::DeviceBuffer<T> dout16(size_t(p.q_elems())), dq16(size_t(p.q_elems())), dk16(size_t(p.kv_elems())),
        dv16(size_t(p.kv_elems()));
    cuda::convert(View4<const float>{dout_f32.data(), dout.view.shape, dout.view.stride}, view16(dout16, p.seq_q));
    stage09::attention_backward_device(p, half.q, half.k, half.v, View4<const T>(half.o), View3<const float>(dev.lse),
                                       View4<const T>(view16(dout16, p.seq_q)), view16(dq16, p.seq_q), view16(dk16, p.seq_k),
                                       view16(dv16, p.seq_k), deterministic, stream, &workspace, step);
    FA_CUDA_CHECK(cudaStreamSynchronize(stream));
    HostTensor dq(p.batch, p.heads, p.seq_q, p.head_dim, layout), dk(p.batch, p.heads, p.seq_k, p.head_dim, layout),
        dv(p.batch, p.heads, p.seq_k, p.head_dim, layout);
    const std::pair<cuda::DeviceBuffer<T>*, HostTensor*> outs[3] = {{&dq16, &dq}, {&dk16, &dk}, {&dv16, &dv}};
    for (const auto& [src, dst] : outs) {
        cuda::DeviceBuffer<float> wide(dst->storage.size());
        cuda::convert(View4<const T>(view16(*src, dst->view.shape[2])), View4<float>{wide.data(), dst->view.shape, dst->view.stride});
        FA_CUDA_CHECK(cudaDeviceSynchronize());
        wide.copy_to_host(dst->storage.data(), wide.size());
    }
    return {dq.logical(), dk.logical(), dv.logical()};
}

}  // namespace

TEST_CASE("stage 09's device entry point runs on a stream with a workspace kept across problems of several sizes") {
    cudaStream_t stream = nullptr;
    FA_CUDA_CHECK(cudaStreamCreate(&stream));
    stage09::Workspace workspace;
    // Small, then larger (the workspace grows), then small again (it is reused as it is); the
    // steps alternate, so one workspace also serves both kernels' block shapes.
    const Problem problems[] = {test::make_problem(1, 2, 70, 90, 64, true), test::make_problem(2, 2, 333, 257, 128, false),
                                test::make_problem(1, 3, 129, 65, 32, true), test::make_problem(1, 2, 70, 90, 64, true)};
    uint64_t seed = 1400;
    for (const Problem& p : problems) {
        for (DType dtype : {DType::BF16, DType::FP16}) {
            const int step = int(seed % 2);
            const Layout layout = (seed / 2) % 2 ? Layout::BNHD : Layout::BHND;
            const Inputs in = make_inputs(p, layout, InputKind::Normal, seed);
            const HostTensor dout = make_output_gradient(p, layout, seed);
            ++seed;
            const Forward f = forward(p, in, layout, dtype);
            const Grads got = dtype == DType::BF16
                                  ? run_device<__nv_bfloat16>(p, in, f, dout, layout, true, step, stream, workspace)
                                  : run_device<__half>(p, in, f, dout, layout, true, step, stream, workspace);
            const std::string what =
                p.describe() + " layout=" + to_string(layout) + describe(dtype, true, step) + " (device entry)";
            // The same kernels on the same 16-bit values as the host entry point: the same bits.
            const Grads host = run_backward(stage09::host_entry({dtype, true, step}), p, in, f, dout, layout);
            INFO(what);
            CHECK(bit_identical(got.dq, host.dq));
            CHECK(bit_identical(got.dk, host.dk));
            CHECK(bit_identical(got.dv, host.dv));
            const Judge j = test::judge(p, in, dout, precision_of(dtype));
            test::check_gradients(got, j, what + " vs float64 reference");
        }
    }
    CHECK(workspace.floats.size() > 0);
    CHECK(workspace.turns.size() > 0);
    FA_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST_CASE("stage 09 refuses what it cannot do, naming the option and what is allowed") {
    for (int64_t d : {16, 96, 256}) {
        const Problem p = test::make_problem(1, 1, 16, 16, d);
        const std::string option = "--head-dim " + std::to_string(d);
        CHECK_THROWS_WITH_AS(stage09::check_supported(p), doctest::Contains(option.c_str()), InputError);
        CHECK_THROWS_WITH_AS(stage09::check_supported(p), doctest::Contains("use 32, 64, 128"), InputError);
        const Inputs in = make_inputs(p, Layout::BHND, InputKind::Normal, 1);
        const HostTensor dout = make_output_gradient(p, Layout::BHND, 1);
        const Forward f{HostTensor(p.batch, p.heads, p.seq_q, p.head_dim, Layout::BHND, 0.5f), std::vector<float>(16, 1.0f)};
        CHECK_THROWS_WITH_AS(run_backward(stage09::attention_backward, p, in, f, dout, Layout::BHND),
                             doctest::Contains(option.c_str()), InputError);
    }
    // Device views the kernels cannot read with 16-byte copies are refused before any launch.
    const Problem p = test::make_problem(1, 1, 16, 16, 64);
    View4<__nv_bfloat16> strided{nullptr, {1, 1, 16, 64}, {16 * 128, 16 * 128, 128, 2}};
    View4<__nv_bfloat16> dense{nullptr, {1, 1, 16, 64}, {16 * 64, 16 * 64, 64, 1}};
    const View3<const float> lse{nullptr, {1, 1, 16}, {16, 16, 1}};
    CHECK_THROWS_WITH_AS(stage09::attention_backward_device(p, strided, dense, dense, dense, lse, dense, dense, dense, dense,
                                                            false, nullptr),
                         doctest::Contains("contiguous features"), InputError);
    // Blocks per step at d = 64: step 0's are 64 x 64, the warp-tiled steps' 128 x 128; the default
    // is a step of the road.
    stage09::Options first;
    first.step = 0;
    const std::string config0 = stage09::describe_config(test::make_problem(1, 1, 300, 200, 64, true), first);
    CHECK(config0.find("Br=64 Bc=64") != std::string::npos);
    stage09::Options tiled;
    tiled.step = 1;
    const std::string config1 = stage09::describe_config(test::make_problem(1, 1, 300, 200, 64, true), tiled);
    CHECK(config1.find("Br=128 Bc=128") != std::string::npos);
    CHECK(stage09::kDefaultStep >= 0);
    CHECK(stage09::kDefaultStep < int(stage09::road().size()));
    // A step that does not exist is refused with the steps that do.
    const int last = int(stage09::road().size()) - 1;
    const std::string allowed = "steps 0 to " + std::to_string(last);
    for (int step : {-2, last + 1}) {
        CHECK_THROWS_WITH_AS(stage09::check_supported(p, step), doctest::Contains(allowed.c_str()), InputError);
    }
}

namespace {

using test::to_float;

// A case of tests/backward_model_cases.hpp through stage09::attention_backward_device with its
// ModelOptions, in T: the packed (total, H, d) buffers of BackwardModelData on the device, read as
// (B, H, N, d) views (B equal sequences); the gradients start as NaN, so what the kernels forget
// shows. k and v may be given with Hq heads (the repeated problem: `c` says Hk).
template <class T>
test::ModelGradients run_model_on_gpu(const test::ModelCase& c, const std::vector<float>& q, const std::vector<float>& k,
                                      const std::vector<float>& v, const std::vector<float>& o,
                                      const std::vector<float>& lse, const std::vector<float>& dout, bool deterministic) {
    const auto to_device = [](const std::vector<float>& x) { return test::to_device<T>(x); };
    const cuda::DeviceBuffer<T> qd = to_device(q), kd = to_device(k), vd = to_device(v), od = to_device(o), dod = to_device(dout);
    cuda::DeviceBuffer<T> dqd(q.size()), dkd(k.size()), dvd(v.size());
    for (cuda::DeviceBuffer<T>* b : {&dqd, &dkd, &dvd}) FA_CUDA_CHECK(cudaMemset(b->data(), 0xff, b->bytes()));
    cuda::DeviceBuffer<float> lsed(lse.size());
    lsed.copy_from_host(lse.data(), lse.size());
    const int64_t D = c.d;
    const auto view = [&](const cuda::DeviceBuffer<T>& x, int64_t h, int64_t n) {
        return View4<const T>{x.data(), {c.B, h, n, D}, {n * h * D, D, h * D, 1}};
    };
    const auto out = [&](cuda::DeviceBuffer<T>& x, int64_t h, int64_t n) {
        return View4<T>{x.data(), {c.B, h, n, D}, {n * h * D, D, h * D, 1}};
    };
    const View3<const float> lv{lsed.data(), {c.B, c.Hq, c.Nq}, {c.Nq, int64_t(c.B) * c.Nq, 1}};
    stage09::attention_backward_device(c.problem(), c.options(), view(qd, c.Hq, c.Nq), view(kd, c.Hk, c.Nk),
                                       view(vd, c.Hk, c.Nk), view(od, c.Hq, c.Nq), lv, view(dod, c.Hq, c.Nq),
                                       out(dqd, c.Hq, c.Nq), out(dkd, c.Hk, c.Nk), out(dvd, c.Hk, c.Nk), deterministic,
                                       nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    const auto back = [](const cuda::DeviceBuffer<T>& x) {
        std::vector<T> h(x.size());
        x.copy_to_host(h.data(), h.size());
        std::vector<float> f(h.size());
        for (size_t i = 0; i < h.size(); ++i) f[i] = to_float(h[i]);
        return f;
    };
    return {back(dqd), back(dkd), back(dvd)};
}

test::ModelGradients run_model_case(const test::ModelCase& c, const test::BackwardModelData& data, const std::vector<float>& k,
                                    const std::vector<float>& v, bool deterministic) {
    return c.precision == Precision::BFloat16
               ? run_model_on_gpu<__nv_bfloat16>(c, data.q, k, v, data.o, data.lse, data.dout, deterministic)
               : run_model_on_gpu<__half>(c, data.q, k, v, data.o, data.lse, data.dout, deterministic);
}

// The group split's override FA_STAGE09_GROUP_SPLIT set to `split` while this lives, then restored.
class GroupSplitOverride {
public:
    explicit GroupSplitOverride(int split) {
        const char* now = std::getenv(kName);
        had_ = now != nullptr;
        if (had_) before_ = now;
        setenv(kName, std::to_string(split).c_str(), 1);
    }
    ~GroupSplitOverride() {
        if (had_) {
            setenv(kName, before_.c_str(), 1);
        } else {
            unsetenv(kName);
        }
    }
    GroupSplitOverride(const GroupSplitOverride&) = delete;
    GroupSplitOverride& operator=(const GroupSplitOverride&) = delete;

private:
    static constexpr const char* kName = "FA_STAGE09_GROUP_SPLIT";
    bool had_ = false;
    std::string before_;
};

// Case `c` in both dQ modes against the float64 gradients (tests/backward_model_cases.hpp); the
// deterministic mode twice, bit for bit; dK, dV the same bits in both modes where both give each
// key block's group to one block (atomic dQ with the group split S = 1: a split's float32
// partials are added in another order); with grouped heads,
// the problem with K and V repeated per query head gives the same dQ (deterministic: the same
// additions in the same order) and, summed over each group, the same dK and dV to the rounding
// of the per-head sums.
void check_model_case(const test::ModelCase& c) {
    const test::BackwardModelData data = test::backward_model_data(c);
    const test::ModelGradients atomic = run_model_case(c, data, data.k, data.v, false);  // the split's rule
    const test::ModelGradients fixed = run_model_case(c, data, data.k, data.v, true);
    const test::ModelGradients again = run_model_case(c, data, data.k, data.v, true);
    test::check_backward_gradients(c, data, atomic, "atomic (GPU)");
    test::check_backward_gradients(c, data, fixed, "deterministic (GPU)");
    INFO(c.describe());
    CHECK(bit_identical(fixed.dq, again.dq));
    CHECK(bit_identical(fixed.dk, again.dk));
    CHECK(bit_identical(fixed.dv, again.dv));
    {
        const GroupSplitOverride one(1);
        const test::ModelGradients unsplit = c.Hk == c.Hq ? atomic : run_model_case(c, data, data.k, data.v, false);
        CHECK(bit_identical(fixed.dk, unsplit.dk));
        CHECK(bit_identical(fixed.dv, unsplit.dv));
    }
    if (c.Hk == c.Hq) return;
    const test::ModelCase rc = test::repeated_case(c);
    const test::ModelGradients rep = run_model_case(rc, data, test::repeat_heads(data.k, c.Hk, c.Hq, c.d),
                                                    test::repeat_heads(data.v, c.Hk, c.Hq, c.d), true);
    CHECK(bit_identical(fixed.dq, rep.dq));
    const bool bf16 = c.precision == Precision::BFloat16;
    int64_t nonfinite = 0;
    const double ek = test::relative_max_error(fixed.dk, test::sum_over_groups(rep.dk, c.Hk, c.Hq, c.d), nonfinite);
    const double ev = test::relative_max_error(fixed.dv, test::sum_over_groups(rep.dv, c.Hk, c.Hq, c.d), nonfinite);
    INFO("against K and V repeated per query head: dK " << ek << ", dV " << ev);
    CHECK(nonfinite == 0);
    CHECK(ek <= (bf16 ? 1.6e-2 : 2e-3));
    CHECK(ev <= (bf16 ? 1.6e-2 : 2e-3));
}

}  // namespace

TEST_CASE("stage 09 with stage 10's switches matches the float64 gradients, deterministic bit for bit, GQA as K, V repeated") {
    // The cases of tests/backward_model_cases.hpp (also run on the CPU by test_stage09_model_emulated),
    // and larger ones: many key blocks and query blocks on both sides of every edge.
    std::vector<test::ModelCase> cases = test::backward_model_cases();
    const Precision bf16 = Precision::BFloat16, fp16 = Precision::Float16;
    const std::vector<test::ModelCase> large = {
        {128, bf16, 2, 8, 2, 1000, 1000, true, Window::full(), 0.0, 0.088, true},   // Hq/Hk = 4, causal
        {64, fp16, 1, 6, 1, 700, 1300, false, Window::full(), 0.0, 0.125, true},    // MQA, 6 heads on one
        {32, bf16, 2, 4, 2, 517, 389, true, Window::full(), 0.0, 0.17, true},       // d = 32, Nq > Nk
        {64, bf16, 2, 4, 2, 2048, 2048, false, Window{256, 0}, 0.0, 0.125, true},   // a 257-key causal window, 16 key blocks
        {128, fp16, 1, 4, 1, 1000, 700, false, Window{100, 50}, 0.0, 0.088, true},  // both bounds, Nq > Nk
        {64, fp16, 1, 2, 2, 1, 1500, true, Window{300, -1}, 0.0, 0.125, true},     // one query row: 11 of 12 key blocks unseen
        {32, bf16, 1, 2, 1, 900, 900, false, Window{-1, 40}, 0.0, 0.17, true},     // a right bound only
        {128, bf16, 2, 4, 1, 1024, 1024, true, Window::full(), 30.0, 0.088, true, InputKind::Large},  // the soft cap, MQA
        {64, fp16, 1, 4, 2, 600, 800, false, Window{128, 64}, 10.0, -0.5, true},  // the cap with a window, scale < 0
        // the causal mask said as the window (-1, 0), not as causal, with no other switch: the plain call, causal
        {64, bf16, 2, 4, 4, 300, 500, false, Window{-1, 0}, 0.0, 0.125, true},
        // a window that a short sequence turns into the causal mask (its left bound reaches past the keys)
        {128, fp16, 1, 2, 2, 3, 3, false, Window{40, 0}, 0.0, 0.088, true},
    };
    cases.insert(cases.end(), large.begin(), large.end());
    for (const test::ModelCase& c : cases) check_model_case(c);
}

TEST_CASE("stage 09 refuses stage 10's options it cannot apply, naming what is allowed") {
    const Problem p = test::make_problem(1, 4, 64, 64, 64);
    View4<const __nv_bfloat16> in{nullptr, {1, 4, 64, 64}, {4 * 64 * 64, 64 * 64, 64, 1}};
    View4<__nv_bfloat16> out{nullptr, {1, 4, 64, 64}, {4 * 64 * 64, 64 * 64, 64, 1}};
    const View3<const float> lse{nullptr, {1, 4, 64}, {4 * 64, 64, 1}};
    const auto message = [&](const stage09::ModelOptions& o, int step = -1) -> std::string {
        try {
            stage09::attention_backward_device(p, o, in, in, in, in, lse, in, out, out, out, false, nullptr, nullptr, step);
        } catch (const InputError& e) {
            return e.what();
        }
        return "(nothing thrown)";
    };
    stage09::ModelOptions o;
    o.kv_heads = 3;  // does not divide 4
    CHECK(message(o).find("--heads 4 is not a multiple of --kv-heads 3") != std::string::npos);
    o.kv_heads = 2;
    CHECK(message(o, 0).find("default main kernel only (--step " + std::to_string(stage09::kDefaultStep) + "), not on step 0") != std::string::npos);
    // k and v with Hq heads where Hk = 2 is asked for: the shapes are named.
    CHECK(message(o).find("k must be (B, Hk, Nk, d) = (1, 2, 64, 64); got (1, 4, 64, 64)") != std::string::npos);
    o.kv_heads = 4, o.dropout.p = 0.1;  // dropout runs on the default main kernel, and on it alone
    CHECK(message(o, 3).find("dropout run on the default main kernel only (--step " + std::to_string(stage09::kDefaultStep) + "), not on step 3") != std::string::npos);
    o.dropout.p = 1.0;
    CHECK(message(o).find("--dropout 1 is outside [0, 1)") != std::string::npos);
    o.kv_heads = 2, o.dropout.p = 0.0;
    o.window = Window{-2, 0};
    CHECK(message(o).find("--window -2,0") != std::string::npos);
}

namespace {

// A packed case through stage09::attention_backward_varlen_device, in T: the packed buffers of
// BackwardModelData and cu_seqlens on the device, max lengths `max`; the gradients start as NaN.
template <class T>
test::ModelGradients run_varlen_on_gpu(const test::BackwardModelData& data, const stage09::MaxSeqlens& max,
                                       bool deterministic) {
    const VarlenProblem& vp = data.vp;
    const auto to_device = [](const std::vector<float>& x) { return test::to_device<T>(x); };
    const cuda::DeviceBuffer<T> qd = to_device(data.q), kd = to_device(data.k), vd = to_device(data.v),
                                od = to_device(data.o), dod = to_device(data.dout);
    cuda::DeviceBuffer<T> dqd(data.q.size()), dkd(data.k.size()), dvd(data.v.size());
    for (cuda::DeviceBuffer<T>* b : {&dqd, &dkd, &dvd})
        if (b->bytes() > 0) FA_CUDA_CHECK(cudaMemset(b->data(), 0xff, b->bytes()));
    cuda::DeviceBuffer<float> lsed(data.lse.size());
    if (!data.lse.empty()) lsed.copy_from_host(data.lse.data(), data.lse.size());
    const cuda::DeviceBuffer<int32_t> cu_q = test::ints_to_device(vp.cu_seqlens_q), cu_k = test::ints_to_device(vp.cu_seqlens_k);
    cuda::DeviceBuffer<int32_t> schedule(size_t(std::max<int64_t>(1, stage09::varlen_backward_schedule_ints(vp))));
    const int64_t d = vp.head_dim;
    const auto in = [&](const cuda::DeviceBuffer<T>& x, int64_t total, int64_t heads) {
        return make_packed_view(static_cast<const T*>(x.data()), total, heads, d);
    };
    const auto out = [&](cuda::DeviceBuffer<T>& x, int64_t total, int64_t heads) { return make_packed_view(x.data(), total, heads, d); };
    const View3<const float> lv{lsed.data(), {1, vp.heads_q, vp.total_q}, {vp.heads_q * vp.total_q, vp.total_q, 1}};
    stage09::attention_backward_varlen_device(
        vp, max, in(qd, vp.total_q, vp.heads_q), in(kd, vp.total_k, vp.heads_k), in(vd, vp.total_k, vp.heads_k),
        in(od, vp.total_q, vp.heads_q), lv, in(dod, vp.total_q, vp.heads_q), out(dqd, vp.total_q, vp.heads_q),
        out(dkd, vp.total_k, vp.heads_k), out(dvd, vp.total_k, vp.heads_k),
        stage09::VarlenBackwardArrays{cu_q.data(), cu_k.data(), schedule.data()}, deterministic, nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    const auto back = [](const cuda::DeviceBuffer<T>& x) {
        std::vector<T> h(x.size());
        if (!h.empty()) x.copy_to_host(h.data(), h.size());
        std::vector<float> f(h.size());
        for (size_t i = 0; i < h.size(); ++i) f[i] = to_float(h[i]);
        return f;
    };
    return {back(dqd), back(dkd), back(dvd)};
}

// Packed case `c` (inputs drawn with `seed`) in both dQ modes against the float64 gradients; the
// deterministic mode twice, bit for bit; dK, dV the same bits in both modes with the group split
// S = 1 (check_model_case).
void check_varlen_case(const test::VarlenCase& c, uint64_t seed) {
    const test::BackwardModelData data = test::backward_data(c.problem(), c.precision, InputKind::Normal, seed);
    const stage09::MaxSeqlens max{data.vp.max_seq_q() + c.extra_max, data.vp.max_seq_k() + c.extra_max};
    const auto run = [&](bool deterministic) {
        return c.precision == Precision::BFloat16 ? run_varlen_on_gpu<__nv_bfloat16>(data, max, deterministic)
                                                  : run_varlen_on_gpu<__half>(data, max, deterministic);
    };
    const test::ModelGradients atomic = run(false), fixed = run(true), again = run(true);
    test::check_backward_gradients(c.precision, data, atomic, "packed, atomic (GPU)");
    test::check_backward_gradients(c.precision, data, fixed, "packed, deterministic (GPU)");
    INFO(data.vp.describe());
    CHECK(bit_identical(fixed.dq, again.dq));
    const GroupSplitOverride one(1);
    const test::ModelGradients unsplit = data.vp.heads_q == data.vp.heads_k ? atomic : run(false);
    CHECK(bit_identical(fixed.dk, unsplit.dk));
    CHECK(bit_identical(fixed.dv, unsplit.dv));
}

}  // namespace

TEST_CASE("stage 09 on packed batches of different lengths matches the float64 gradients, deterministic bit for bit") {
    // The cases of tests/backward_model_cases.hpp (also run on the CPU by test_stage09_model_emulated),
    // and larger ones: long sequences beside short ones, many key blocks per sequence.
    std::vector<test::VarlenCase> cases = test::backward_varlen_cases();
    const Precision bf16 = Precision::BFloat16, fp16 = Precision::Float16;
    cases.push_back({128, bf16, {1000, 3, 517, 0, 64}, {1000, 700, 517, 5, 129}, 8, 2, Window::causal(), 0.0, 0.088});
    cases.push_back({64, fp16, {2048, 1, 300}, {2048, 1, 900}, 4, 1, Window{256, 0}, 30.0, 0.125, 17});
    cases.push_back({32, bf16, {129, 257, 1}, {300, 1, 64}, 2, 2, Window::full(), 0.0, 0.17});
    uint64_t seed = 9700;
    for (const test::VarlenCase& c : cases) check_varlen_case(c, seed++);
}

namespace {


// The group split S = 1, 2 and G forced (atomic dQ) on `run(deterministic)`: each against the
// float64 gradients; S = 2 twice, dK and dV bit for bit (the partials are added in a fixed
// order); the deterministic mode under the override keeps one block per group (S = 1): the same
// bits as without it.
template <class RunFn>
void check_group_splits(int group, Precision precision, const test::BackwardModelData& data, const std::string& what,
                        const RunFn& run) {
    const test::ModelGradients fixed = run(true);
    for (const int split : {1, 2, group}) {
        const GroupSplitOverride override_split(split);
        const std::string label = what + ", group split " + std::to_string(split) + " of " + std::to_string(group) + " (GPU)";
        const test::ModelGradients atomic = run(false);
        test::check_backward_gradients(precision, data, atomic, label);
        INFO(label);
        if (split == 2) {
            const test::ModelGradients again = run(false);
            CHECK(bit_identical(atomic.dk, again.dk));
            CHECK(bit_identical(atomic.dv, again.dv));
        }
        const test::ModelGradients fixed_here = run(true);
        CHECK(bit_identical(fixed.dk, fixed_here.dk));
        CHECK(bit_identical(fixed.dq, fixed_here.dq));
    }
}

}  // namespace

TEST_CASE("stage 09 group split: S = 1, 2 and G blocks per group of query heads, dense and packed, bf16 and fp16") {
    const Precision bf16 = Precision::BFloat16, fp16 = Precision::Float16;
    // Dense, causal: 8:1 (S = 1, 2, 8), 4:1 with Nq > Nk and tails (S = 1, 2, 4), MQA over 6 heads (S = 1, 2, 6).
    const std::vector<test::ModelCase> dense = {
        {128, bf16, 1, 16, 2, 1000, 1000, true, Window::full(), 0.0, 0.088, true},
        {64, fp16, 2, 8, 2, 777, 500, true, Window::full(), 0.0, 0.125, true},
        {32, bf16, 1, 6, 1, 300, 700, true, Window::full(), 0.0, 0.17, true},
        {64, bf16, 2, 8, 2, 2048, 2048, false, Window{256, 0}, 0.0, 0.125, true},  // a window, key blocks outer
    };
    for (const test::ModelCase& c : dense) {
        const test::BackwardModelData data = test::backward_model_data(c);
        check_group_splits(c.Hq / c.Hk, c.precision, data, c.describe(),
                           [&](bool deterministic) { return run_model_case(c, data, data.k, data.v, deterministic); });
    }
    // Packed, causal per sequence: lengths 1 and primes (131, 257), a sequence without keys, Nq != Nk.
    const std::vector<test::VarlenCase> packed = {
        {128, bf16, {1000, 1, 517, 0, 131}, {1000, 700, 517, 5, 131}, 8, 2, Window::causal(), 0.0, 0.088},
        {64, fp16, {1, 257, 131, 64}, {1, 300, 131, 0}, 8, 1, Window::causal(), 0.0, 0.125},
    };
    uint64_t seed = 9950;
    for (const test::VarlenCase& c : packed) {
        const test::BackwardModelData data = test::backward_data(c.problem(), c.precision, InputKind::Normal, seed++);
        const stage09::MaxSeqlens max{data.vp.max_seq_q(), data.vp.max_seq_k()};
        check_group_splits(c.Hq / c.Hk, c.precision, data, "packed " + data.vp.describe(), [&](bool deterministic) {
            return c.precision == Precision::BFloat16 ? run_varlen_on_gpu<__nv_bfloat16>(data, max, deterministic)
                                                      : run_varlen_on_gpu<__half>(data, max, deterministic);
        });
    }
}

TEST_CASE("stage 09 group split: a split that does not divide the group is refused, naming the divisors") {
    const Problem p = test::make_problem(1, 8, 64, 64, 64);
    View4<const __nv_bfloat16> q{nullptr, {1, 8, 64, 64}, {8 * 64 * 64, 64 * 64, 64, 1}};
    View4<const __nv_bfloat16> kv{nullptr, {1, 2, 64, 64}, {2 * 64 * 64, 64 * 64, 64, 1}};
    View4<__nv_bfloat16> dq{nullptr, {1, 8, 64, 64}, {8 * 64 * 64, 64 * 64, 64, 1}};
    View4<__nv_bfloat16> dkv{nullptr, {1, 2, 64, 64}, {2 * 64 * 64, 64 * 64, 64, 1}};
    const View3<const float> lse{nullptr, {1, 8, 64}, {8 * 64, 64, 1}};
    stage09::ModelOptions o;
    o.kv_heads = 2;
    const GroupSplitOverride override_split(3);
    CHECK_THROWS_WITH_AS(stage09::attention_backward_device(p, o, q, kv, kv, q, lse, q, dq, dkv, dkv, false, nullptr),
                         doctest::Contains("does not divide the 4 query heads per K/V head: use 0 (the rule) or one of 1, 2, 4"),
                         InputError);
}

TEST_CASE("stage 09 with dropout matches the float64 gradients, dense and packed, deterministic bit for bit") {
    // The cases of tests/backward_model_cases.hpp (also run on the CPU by test_stage09_model_emulated).
    for (const test::ModelCase& c : test::backward_dropout_cases()) check_model_case(c);
    uint64_t seed = 9900;
    for (const test::VarlenCase& c : test::backward_dropout_varlen_cases()) check_varlen_case(c, seed++);
}

// A case of its own so that compute-sanitizer's slower tools (racecheck) can run the small cases
// above alone: these take minutes under them.
TEST_CASE("larger problems with dropout: stage 09 matches the float64 gradients, dense and packed, deterministic bit for bit") {
    // Many key and query blocks, every switch beside dropout.
    const Precision bf16 = Precision::BFloat16, fp16 = Precision::Float16;
    const std::vector<test::ModelCase> large = {
        {128, bf16, 2, 8, 2, 1000, 1000, true, Window::full(), 0.0, 0.088, true, InputKind::Normal, Dropout{0.1, 11, 0}},
        {64, fp16, 1, 6, 1, 700, 1300, false, Window::full(), 0.0, 0.125, true, InputKind::Normal, Dropout{0.5, 12, 1}},
        {32, bf16, 2, 4, 2, 517, 389, true, Window::full(), 0.0, 0.17, true, InputKind::Normal, Dropout{0.9, 13, 2}},
        {64, bf16, 2, 4, 2, 2048, 2048, false, Window{256, 0}, 0.0, 0.125, true, InputKind::Normal, Dropout{0.2, 14, 3}},
        {128, bf16, 2, 4, 1, 1024, 1024, true, Window::full(), 30.0, 0.088, true, InputKind::Large, Dropout{0.5, 15, 4}},
        {64, fp16, 1, 4, 2, 600, 800, false, Window{128, 64}, 10.0, -0.5, true, InputKind::Normal, Dropout{0.3, 16, 5}},
    };
    for (const test::ModelCase& c : large) check_model_case(c);
    std::vector<test::VarlenCase> packed;
    packed.push_back({128, bf16, {1000, 3, 517, 0, 64}, {1000, 700, 517, 5, 129}, 8, 2, Window::causal(), 0.0, 0.088, 0,
                      Dropout{0.1, 21, 0}});
    packed.push_back({64, fp16, {2048, 1, 300}, {2048, 1, 900}, 4, 1, Window{256, 0}, 30.0, 0.125, 17, Dropout{0.5, 22, 9}});
    packed.push_back({32, bf16, {129, 257, 1}, {300, 1, 64}, 2, 2, Window::full(), 0.0, 0.17, 0, Dropout{0.9, 23, 1}});
    uint64_t seed = 9900 + test::backward_dropout_varlen_cases().size();  // the seeds after the small cases
    for (const test::VarlenCase& c : packed) check_varlen_case(c, seed++);
}

namespace {

// Stage 07's forward of the probe with V = probe.v(part), bf16, on the GPU: O in the packed order.
// `dense`: a dense call of B equal sequences (the map's b the batch entry), else the packed call.
std::vector<float> probe_forward(const test::DropoutProbe& probe, int part, bool dense) {
    using T = __nv_bfloat16;
    const VarlenProblem& vp = probe.vp;
    const int64_t d = vp.head_dim;
    const auto to_device = [](const std::vector<float>& x) { return test::to_device<T>(x); };
    const cuda::DeviceBuffer<T> qd = to_device(probe.q), kd = to_device(probe.k), vd = to_device(probe.v(part));
    cuda::DeviceBuffer<T> od(probe.q.size());
    FA_CUDA_CHECK(cudaMemset(od.data(), 0xff, od.bytes()));
    cuda::DeviceBuffer<float> lsed(size_t(vp.heads_q * vp.total_q));
    if (dense) {
        const int64_t batch = vp.batch(), nq = vp.seq_q(0), nk = vp.seq_k(0);
        const Problem p = test::make_problem(batch, vp.heads_q, nq, nk, d);
        stage07::ModelOptions options;
        options.kv_heads = vp.heads_k, options.dropout = vp.dropout;
        const auto view = [&](const cuda::DeviceBuffer<T>& x, int64_t h, int64_t n) {
            return View4<const T>{x.data(), {batch, h, n, d}, {n * h * d, d, h * d, 1}};
        };
        const View4<T> ov{od.data(), {batch, vp.heads_q, nq, d}, {nq * vp.heads_q * d, d, vp.heads_q * d, 1}};
        stage07::attention_device(p, options, view(qd, vp.heads_q, nq), view(kd, vp.heads_k, nk), view(vd, vp.heads_k, nk),
                                  ov, View3<float>{lsed.data(), {batch, vp.heads_q, nq}, {nq, batch * nq, 1}}, nullptr);
    } else {
        cuda::DeviceBuffer<int32_t> cu_q(vp.cu_seqlens_q.size()), cu_k(vp.cu_seqlens_k.size());
        cu_q.copy_from_host(vp.cu_seqlens_q.data(), cu_q.size());
        cu_k.copy_from_host(vp.cu_seqlens_k.data(), cu_k.size());
        cuda::DeviceBuffer<int32_t> schedule(size_t(std::max<int64_t>(1, stage07::varlen_schedule_ints(vp))));
        const auto in = [&](const cuda::DeviceBuffer<T>& x, int64_t total, int64_t heads) {
            return make_packed_view(static_cast<const T*>(x.data()), total, heads, d);
        };
        stage07::attention_varlen_device(
            vp, stage07::MaxSeqlens{vp.max_seq_q(), vp.max_seq_k()}, in(qd, vp.total_q, vp.heads_q),
            in(kd, vp.total_k, vp.heads_k), in(vd, vp.total_k, vp.heads_k), make_packed_view(od.data(), vp.total_q, vp.heads_q, d),
            View3<float>{lsed.data(), {1, vp.heads_q, vp.total_q}, {vp.heads_q * vp.total_q, vp.total_q, 1}},
            stage07::VarlenDeviceArrays{cu_q.data(), cu_k.data(), schedule.data()}, nullptr);
    }
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> h(od.size());
    od.copy_to_host(h.data(), h.size());
    std::vector<float> o(h.size());
    for (size_t i = 0; i < h.size(); ++i) o[i] = to_float(h[i]);
    return o;
}

// The probe (tests/backward_model_cases.hpp) through stage 07's forward (every part of the keys)
// and stage 09's backward (both dQ modes), bf16, dense or packed: both masks must be the map's
// (fa/philox.hpp), every score of every sequence and query head, bit for bit.
void check_mask_probe(const VarlenProblem& vp, bool dense) {
    const test::DropoutProbe probe = test::dropout_probe(vp);
    test::check_dropout_probe(
        probe, dense ? "(dense, GPU)" : "(packed, GPU)", [&](int part) { return probe_forward(probe, part, dense); },
        [&](const test::BackwardModelData& data, bool deterministic) {
            if (dense) return run_model_case(test::dense_probe_case(vp), data, data.k, data.v, deterministic).dv;
            return run_varlen_on_gpu<__nv_bfloat16>(data, stage09::MaxSeqlens{vp.max_seq_q(), vp.max_seq_k()}, deterministic).dv;
        });
}

// A dense probe of B sequences of Nq queries and Nk keys as a packed problem.
VarlenProblem dense_probe_problem(int64_t batch, int64_t hq, int64_t hk, int64_t nq, int64_t nk, int64_t d, Dropout dropout) {
    VarlenProblem vp;
    vp.cu_seqlens_q = cu_seqlens_from_lengths(std::vector<int64_t>(size_t(batch), nq));
    vp.cu_seqlens_k = cu_seqlens_from_lengths(std::vector<int64_t>(size_t(batch), nk));
    vp.total_q = batch * nq, vp.total_k = batch * nk;
    vp.heads_q = hq, vp.heads_k = hk, vp.head_dim = d, vp.dropout = dropout;
    return vp;
}

}  // namespace

TEST_CASE("stage 09 regenerates stage 07's dropout mask bit for bit, dense and packed") {
    // Every score's keep bit read back from stage 07's O and from stage 09's dV (DropoutProbe): a
    // single bit that differs fails. d = 128 (P^T through shared memory), 64 and 32 (P^T in
    // registers); grouped heads (the map's h is the query head); many key blocks.
    check_mask_probe(dense_probe_problem(3, 4, 2, 64, 700, 128, Dropout{0.5, 0x0123456789abcdefull, 77}), true);
    check_mask_probe(dense_probe_problem(2, 3, 3, 64, 1000, 64, Dropout{0.1, 31, 0}), true);
    check_mask_probe(dense_probe_problem(2, 2, 2, 32, 300, 32, Dropout{0.9, 32, 1}), true);
    VarlenProblem packed;
    packed.cu_seqlens_q = cu_seqlens_from_lengths({64, 1, 37, 0, 64});
    packed.cu_seqlens_k = cu_seqlens_from_lengths({700, 5, 129, 3, 1});
    packed.total_q = packed.cu_seqlens_q.back(), packed.total_k = packed.cu_seqlens_k.back();
    packed.heads_q = 4, packed.heads_k = 2, packed.head_dim = 128, packed.dropout = Dropout{0.3, 42, 5};
    check_mask_probe(packed, false);
    packed.cu_seqlens_q = cu_seqlens_from_lengths({50, 64, 3});
    packed.cu_seqlens_k = cu_seqlens_from_lengths({1000, 64, 257});
    packed.total_q = packed.cu_seqlens_q.back(), packed.total_k = packed.cu_seqlens_k.back();
    packed.heads_q = 2, packed.heads_k = 2, packed.head_dim = 64, packed.dropout = Dropout{0.5, 43, 6};
    check_mask_probe(packed, false);
}
