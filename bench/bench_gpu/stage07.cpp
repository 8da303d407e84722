// bench_gpu's stage 07 at one point: every 16-bit type and step asked for, each checked against
// stage 06's float32 output (bench_gpu.hpp).
#include <cstdio>

#include "../../stages/06_causal_masking/attention.cuh"
#include "../../stages/07_pipelined_fused_kernel/attention.cuh"
#include "bench_gpu.hpp"
#include "fa/error.hpp"
#include "fa/metrics.hpp"

namespace bench {

namespace {

// Stage 07's steps in the type T (`half`: the point's q, k, v rounded into it). `reference`:
// stage 06's O of this point, or empty when there is none to check against.
template <class T>
void time_steps07(Sweep& sweep, ShapeTensors& shape, fa::cuda::HalfTensors<T>& half, const std::string& t,
                  const std::vector<float>& reference) {
    const fa::Problem& p = shape.p;
    for (int step : sweep.s.steps07) {
        const auto launch = [&](cudaStream_t stream) {
            fa::stage07::attention_device(p, half.q, half.k, half.v, half.o, shape.dev.lse, stream, step);
        };
        if (!sweep.supported({"07", t, step, p.head_dim, ""}, launch)) continue;
        const bool final_kernel = step == fa::stage07::final_step();
        Record r = make_record(final_kernel ? "stage07" : "stage07_step" + std::to_string(step), t, p, sweep.time(launch));
        r.step = step;
        r.step_name = fa::stage07::road()[size_t(step)].name;
        sweep.progress(r);
        if (!reference.empty()) {
            // A fresh run into an output poisoned with NaN, so an element this step forgets is not
            // hidden by what the timed runs left there.
            FA_CUDA_CHECK(cudaMemset(half.o.data, 0xff, size_t(p.q_elems()) * sizeof(T)));
            launch(nullptr);
            fa::cuda::convert(fa::View4<const T>(half.o), shape.o_other_view);
            FA_CUDA_CHECK(cudaDeviceSynchronize());
            const fa::Metrics m = fa::compare(to_host(shape.o_other.data(), p.q_elems()), reference);
            const bool ok = m.nonfinite == 0 && m.rel_l2 <= kStage07GrossRelL2;
            r.check = ok ? "ok" : "BAD";
            r.check_max_abs = m.max_abs;
            r.check_rel_l2 = m.rel_l2;
            r.check_nonfinite = m.nonfinite;
            sweep.verdict(ok);
            std::printf("          vs stage 06 (fp32): max_abs %.2e, rel_l2 %.2e%s%s\n", m.max_abs, m.rel_l2,
                        m.nonfinite ? (", " + std::to_string(m.nonfinite) + " NaN/inf").c_str() : "", ok ? "" : "  BAD");
        } else if (sweep.s.check) {
            std::printf("          not checked: stage 06 has no kernel for d=%lld\n", (long long)p.head_dim);
        }
        std::fflush(stdout);
        sweep.records.push_back(std::move(r));
    }
}

}  // namespace

void time_stage07(Sweep& sweep, ShapeTensors& shape, bool have_reference) {
    const Settings& s = sweep.s;
    if (!s.has07) return;
    const fa::Problem& p = shape.p;
    fa::cuda::DeviceTensors& dev = shape.dev;
    if (s.check && !have_reference) {
        try {
            fa::stage06::attention_device(p, dev.q, dev.k, dev.v, dev.o, dev.lse, nullptr);
            FA_CUDA_CHECK(cudaDeviceSynchronize());
            have_reference = true;
        } catch (const fa::InputError&) {
            // Stage 06 has no kernel for this d (256): stage 07 goes unchecked here.
        }
    }
    const std::vector<float> reference = s.check && have_reference ? to_host(dev.o.data, p.q_elems()) : std::vector<float>{};
    for (const std::string& t : s.dtypes) {
        if (t == "bf16") {
            time_steps07(sweep, shape, *shape.half.bf16, t, reference);
        } else {
            time_steps07(sweep, shape, *shape.half.fp16, t, reference);
        }
    }
}

}  // namespace bench
