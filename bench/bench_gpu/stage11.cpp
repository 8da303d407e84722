// bench_gpu's stage 11 at one point: every 16-bit type and step asked for, each checked on the
// device against stage 07's final kernel in the same type (bench_gpu.hpp). Without stage 11 in the
// build (it is built with CUDA for sm_90a), it has no rows.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <type_traits>

#include "bench_gpu.hpp"

#ifdef FA_HAVE_STAGE11
#include "../../stages/07_pipelined_fused_kernel/attention.cuh"
#include "../../stages/11_hopper_kernel/attention.cuh"
#include "fa/metrics.hpp"
#endif

namespace bench {

#ifdef FA_HAVE_STAGE11
namespace {

// Stage 11 against stage 07's final kernel, both in the same 16-bit type from the same rounded
// inputs: each rounds O once to 16 bits (at most one unit in the last place apart, 2u |O|) and
// rounds P to 16 bits before P V (about u per weight, mostly cancelling). Eight unit roundoffs u of
// the type times the largest |O| (at least 1) is well above that and below what a lost tile or a
// wrong mask does to the rows it touches; the relative L2 bound is stage 07's gross one.
constexpr double kStage11MaxAbsUnits = 8;
constexpr double kStage11RelL2 = kStage07GrossRelL2;
// The LSE of both: float32 sums of the same exponentials in another order (about 1e-6 here).
constexpr double kStage11LseMaxAbs = 1e-2;

// Stage 11 in the type T (`in`: stage 07's HalfTensors of that type, `lse`: the point's float32
// LSE): each step asked for, timed, then run again into an O and LSE poisoned with NaN and compared
// with stage 07's final kernel, which runs first into the same tensors (its O widened into
// `o_ref`, its LSE copied into `lse_ref`; both null: no check). `o32`: a float32 scratch of O's
// shape, dense (B, H, N, d).
template <class T>
void time_steps11(Sweep& sweep, const fa::Problem& p, const std::string& t, const fa::cuda::HalfTensors<T>& in,
                  const fa::View3<float>& lse, float* o_ref, float* lse_ref, const fa::View4<float>& o32) {
    const fa::View4<float> o_ref_view = fa::make_view(o_ref, p.batch, p.heads, p.seq_q, p.head_dim, fa::Layout::BHND);
    const size_t lse_bytes = size_t(p.lse_elems()) * sizeof(float);
    const double unit = std::is_same_v<T, __nv_bfloat16> ? 1.0 / 256 : 1.0 / 2048;  // unit roundoff u: 2^-8, 2^-11
    double o_scale = -1;  // the largest |O| of stage 07's output (at least 1); -1 until it ran
    for (int step : sweep.s.steps11) {
        const auto launch = [&](cudaStream_t stream) { fa::stage11::attention_device(p, in.q, in.k, in.v, in.o, lse, stream, step); };
        if (!sweep.supported({"11", t, step, p.head_dim, ""}, launch)) continue;
        const bool final_kernel = step == fa::stage11::final_step();
        Record r = make_record(final_kernel ? "stage11" : "stage11_step" + std::to_string(step), t, p, sweep.time(launch));
        r.step = step;
        r.step_name = fa::stage11::road()[size_t(step)].name;
        sweep.progress(r);
        if (o_ref != nullptr) {
            if (o_scale < 0) {  // stage 07's final kernel at this point, once for every step
                fa::stage07::attention_device(p, in.q, in.k, in.v, in.o, lse, nullptr);
                fa::cuda::convert(fa::View4<const T>(in.o), o_ref_view);
                FA_CUDA_CHECK(cudaMemcpy(lse_ref, lse.data, lse_bytes, cudaMemcpyDeviceToDevice));
                FA_CUDA_CHECK(cudaDeviceSynchronize());
                o_scale = 1;
                for (float x : to_host(o_ref, p.q_elems())) o_scale = std::max(o_scale, double(std::fabs(x)));
            }
            // A fresh run into outputs poisoned with NaN, so an element this step forgets is not
            // hidden by what the timed runs (or stage 07) left there.
            FA_CUDA_CHECK(cudaMemset(in.o.data, 0xff, size_t(p.q_elems()) * sizeof(T)));
            FA_CUDA_CHECK(cudaMemset(lse.data, 0xff, lse_bytes));
            launch(nullptr);
            fa::cuda::convert(fa::View4<const T>(in.o), o32);
            FA_CUDA_CHECK(cudaDeviceSynchronize());
            const fa::Metrics m = fa::compare(to_host(o32.data, p.q_elems()), to_host(o_ref, p.q_elems()));
            const double lse_diff = max_abs_diff(lse.data, lse_ref, p.lse_elems());
            const double limit = kStage11MaxAbsUnits * unit * o_scale;
            const bool ok = m.nonfinite == 0 && m.max_abs <= limit && m.rel_l2 <= kStage11RelL2 && lse_diff <= kStage11LseMaxAbs;
            r.check = ok ? "ok" : "BAD";
            r.check_max_abs = m.max_abs;
            r.check_rel_l2 = m.rel_l2;
            r.check_nonfinite = m.nonfinite;
            r.check_limit = limit;
            r.check_lse_max_abs = lse_diff;
            sweep.verdict(ok);
            std::printf("          vs stage 07 (%s): O max_abs %.2e (limit %.2e), rel_l2 %.2e; LSE max_abs %.2e%s%s\n", t.c_str(),
                        m.max_abs, limit, m.rel_l2, lse_diff,
                        m.nonfinite ? (", " + std::to_string(m.nonfinite) + " NaN/inf").c_str() : "", ok ? "" : "  BAD");
        }
        std::fflush(stdout);
        sweep.records.push_back(std::move(r));
    }
}

}  // namespace
#endif

void time_stage11(Sweep& sweep, ShapeTensors& shape) {
    if (!sweep.s.has11) return;
#ifdef FA_HAVE_STAGE11
    for (const std::string& t : sweep.s.dtypes) {
        if (t == "bf16") {
            time_steps11(sweep, shape.p, t, *shape.half.bf16, shape.dev.lse, shape.o11_ref.data(), shape.lse11_ref.data(),
                         shape.o_other_view);
        } else {
            time_steps11(sweep, shape.p, t, *shape.half.fp16, shape.dev.lse, shape.o11_ref.data(), shape.lse11_ref.data(),
                         shape.o_other_view);
        }
    }
#else
    (void)shape;  // has11 is false without stage 11 in the build (main.cpp)
#endif
}

}  // namespace bench
