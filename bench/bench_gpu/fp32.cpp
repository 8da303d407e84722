// bench_gpu's float32 stages at one point: stage 05 (and, with --road05, every earlier step of its
// road, each checked against its final kernel), stage 06 with both orders of its query tiles on
// causal points, stage 05 checked against stage 06 (bench_gpu.hpp).
#include <cstdio>

#include "../../stages/05_shared_memory_kernel/attention.cuh"
#include "../../stages/06_causal_masking/attention.cuh"
#include "bench_gpu.hpp"
#include "fa/cuda/stage.hpp"

namespace bench {

namespace {

// Stage 05 against stage 06, and stage 05's steps against its final kernel: the same float32
// arithmetic in a different order.
constexpr double kFp32MaxAbs = 1e-4;

fa::cuda::DeviceAttentionFn stage06_with(fa::stage06::Schedule schedule) {
    return [schedule](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                      fa::View4<float> o, fa::View3<float> lse, cudaStream_t stream) {
        fa::stage06::attention_device(p, q, k, v, o, lse, stream, schedule);
    };
}

fa::cuda::DeviceAttentionFn stage05_step(int step) {
    return [step](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                  fa::View4<float> o, fa::View3<float> lse, cudaStream_t stream) {
        fa::stage05::attention_device(p, q, k, v, o, lse, stream, step);
    };
}

// Stage 05's road: every earlier step, timed, then checked against the final kernel's output on
// an output poisoned with NaN (the final kernel's own row comes with the float32 stages).
void time_road05(Sweep& sweep, ShapeTensors& shape) {
    const fa::Problem& p = shape.p;
    fa::cuda::DeviceTensors& dev = shape.dev;
    bool have_final05 = false;  // the final kernel's output of this point is in o_other
    for (int step = 0; step < fa::stage05::final_step(); ++step) {
        const fa::cuda::DeviceAttentionFn entry = stage05_step(step);
        const auto launch = [&](cudaStream_t stream) { entry(p, dev.q, dev.k, dev.v, dev.o, dev.lse, stream); };
        if (!sweep.supported({"05", "", step, p.head_dim, ""}, launch)) continue;
        Record r = make_record("stage05_step" + std::to_string(step), "fp32", p, sweep.time(launch));
        r.step = step;
        r.step_name = fa::stage05::road()[size_t(step)].name;
        sweep.progress(r);
        if (sweep.s.check) {
            if (!have_final05) {
                stage05_step(fa::stage05::final_step())(p, dev.q, dev.k, dev.v, shape.o_other_view, dev.lse, nullptr);
                have_final05 = true;
            }
            FA_CUDA_CHECK(cudaMemset(dev.o.data, 0xff, size_t(p.q_elems()) * sizeof(float)));
            launch(nullptr);
            const double diff = max_abs_diff(dev.o.data, shape.o_other.data(), p.q_elems());
            const bool ok = diff <= kFp32MaxAbs;
            r.check = ok ? "ok" : "BAD";
            r.check_max_abs = diff;
            sweep.verdict(ok);
            std::printf("          stage 05 step %d vs the final kernel: max |diff| = %.2e%s\n", step, diff, ok ? "" : "  MISMATCH");
        }
        sweep.records.push_back(r);
    }
}

// Both orders of stage 06's query tiles on a causal point, to see what the order is worth and
// whether the rule of Schedule::Auto picked the faster one; on `r`, stage 06's row.
void time_orders06(Sweep& sweep, ShapeTensors& shape, Record& r) {
    const fa::Problem& p = shape.p;
    fa::cuda::DeviceTensors& dev = shape.dev;
    const bool auto_heavy = fa::stage06::chosen_schedule(p) == fa::stage06::Schedule::HeavyFirst;
    double ms[2] = {0, 0};
    const fa::stage06::Schedule orders[2] = {fa::stage06::Schedule::HeavyFirst, fa::stage06::Schedule::InOrder};
    for (int k = 0; k < 2; ++k) {
        const fa::cuda::DeviceAttentionFn entry_k = stage06_with(orders[k]);
        ms[k] = sweep.time([&](cudaStream_t stream) { entry_k(p, dev.q, dev.k, dev.v, dev.o, dev.lse, stream); }).median_ms;
    }
    r.heavy_first_ms = ms[0];
    r.in_order_ms = ms[1];
    r.schedule_auto = auto_heavy ? "heavy_first" : "in_order";
    std::printf("          stage06 query tiles heaviest first %.3f ms, in order %.3f ms (heaviest first %+.1f%%); "
                "Auto picks %s\n",
                ms[0], ms[1], 100.0 * (ms[0] / ms[1] - 1.0), auto_heavy ? "heaviest first" : "in order");
}

}  // namespace

bool time_fp32(Sweep& sweep, ShapeTensors& shape) {
    const Settings& s = sweep.s;
    const fa::Problem& p = shape.p;
    fa::cuda::DeviceTensors& dev = shape.dev;
    bool have05_output = false;   // stage 05's output of this point waits in o_other
    bool have_reference = false;  // stage 06's output of this point is in dev.o
    if (s.has05 && s.road05) time_road05(sweep, shape);
    for (const std::string& stage : s.stages) {
        if (stage != "05" && stage != "06") continue;
        const fa::cuda::DeviceAttentionFn entry =
            stage == "05" ? stage05_step(fa::stage05::final_step()) : stage06_with(fa::stage06::Schedule::Auto);
        const auto launch = [&](cudaStream_t stream) { entry(p, dev.q, dev.k, dev.v, dev.o, dev.lse, stream); };
        if (!sweep.supported({stage, "", -1, p.head_dim, ""}, launch)) continue;
        sweep.records.push_back(make_record("stage" + stage, "fp32", p, sweep.time(launch)));
        Record& r = sweep.records.back();
        if (stage == "05" && s.road05) {
            r.step = fa::stage05::final_step();
            r.step_name = fa::stage05::road().back().name;
        }
        sweep.progress(r);
        if (stage == "06" && p.causal && s.schedule_ablation) time_orders06(sweep, shape, r);
        if (!s.check) continue;
        if (stage == "05" && s.has06) {
            FA_CUDA_CHECK(cudaMemcpy(shape.o_other.data(), dev.o.data, shape.o_other.bytes(), cudaMemcpyDeviceToDevice));
            have05_output = true;
        } else if (stage == "06" && have05_output) {
            const double diff = max_abs_diff(shape.o_other.data(), dev.o.data, p.q_elems());
            const bool ok = diff <= kFp32MaxAbs;
            r.check = ok ? "ok" : "BAD";
            r.check_max_abs = diff;
            sweep.verdict(ok);
            std::printf("          stage 05 vs stage 06 outputs: max |diff| = %.2e%s\n", diff, ok ? "" : "  MISMATCH");
        }
        have_reference = have_reference || stage == "06";
    }
    return have_reference;
}

}  // namespace bench
