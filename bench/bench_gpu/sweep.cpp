// bench_gpu's sweep as it goes: each row's record, the refusals, the progress lines, the tensors
// of one shape (bench_gpu.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bench_gpu.hpp"
#include "fa/counts.hpp"
#include "fa/cuda/timing.hpp"
#include "fa/error.hpp"

namespace bench {

Record make_record(std::string impl, std::string dtype, const fa::Problem& p, const fa::TimingStats& t, std::string pass) {
    Record r;
    r.impl = std::move(impl), r.dtype = std::move(dtype), r.problem = p, r.pass = std::move(pass);
    r.median_ms = t.median_ms, r.min_ms = t.min_ms, r.max_ms = t.max_ms;
    const double flops = r.pass == "backward" ? fa::attention_flops_backward(p)
                         : r.pass == "fwd+bwd" ? fa::attention_flops_fwd_bwd(p)
                                               : fa::attention_flops(p);
    r.tflops = flops / (t.median_ms * 1e-3) * 1e-12;
    r.sm_clock_mhz = fa::cuda::current_sm_clock_mhz();
    return r;
}

std::string Skip::text() const {
    return "stage" + stage + (dtype.empty() ? "" : " " + dtype) + (step >= 0 ? " step " + std::to_string(step) : "") + " d=" +
           std::to_string(head_dim);
}

fa::TimingStats Sweep::time(const std::function<void(cudaStream_t)>& launch) const {
    return fa::cuda::time_on_gpu(launch, s.warmup, s.repeat);
}

bool Sweep::supported(Skip what, const std::function<void(cudaStream_t)>& launch, size_t planned) {
    try {
        launch(nullptr);
        return true;
    } catch (const fa::InputError& e) {
        const std::string key = what.text();
        const bool first = std::none_of(skipped.begin(), skipped.end(), [&](const Skip& k) { return k.text() == key; });
        if (first) {
            std::printf("          skipped %s: %s\n", key.c_str(), e.what());
            what.reason = e.what();
            skipped.push_back(std::move(what));
        }
        points -= planned;
        return false;
    }
}

void Sweep::progress(const Record& r) {
    ++done;
    const fa::Problem& p = r.problem;
    std::printf("[%3zu/%3zu] %-15s %-4s d=%-3lld N=%-5lld B=%-2lld H=%-2lld %-10s %9.3f ms  %6.2f TFLOP/s", done, points,
                (r.label.empty() ? r.impl : r.label).c_str(), r.dtype.c_str(), (long long)p.head_dim, (long long)p.seq_q,
                (long long)p.batch, (long long)p.heads, p.causal ? "causal" : "non-causal", r.median_ms, r.tflops);
    const bool hopper_row = r.impl.rfind("stage11", 0) == 0 && r.step != 0;  // step 0 is stage 07's mma.sync kernel
    if (r.step >= 0 && r.dtype != "fp32" && hopper_row && s.wgmma_ceiling_tflops > 0) {
        std::printf("  %4.1f%% of wgmma", 100.0 * r.tflops / s.wgmma_ceiling_tflops);
    } else if (r.step >= 0 && r.dtype != "fp32" && !hopper_row && s.mma_ceiling_tflops > 0) {
        std::printf("  %4.1f%% of mma", 100.0 * r.tflops / s.mma_ceiling_tflops);
    }
    std::printf("  (min %.3f, max %.3f; SM %d MHz)%s\n", r.min_ms, r.max_ms, r.sm_clock_mhz,
                r.step >= 0 ? ("  step " + std::to_string(r.step) + " " + r.step_name).c_str() : "");
    std::fflush(stdout);
}

ShapeTensors::ShapeTensors(const fa::Problem& shape, const Settings& s)
    : p(shape),
      dev(p, fa::Layout::BHND, 1234),
      o_other(size_t(p.q_elems())),
      o_other_view(fa::make_view(o_other.data(), p.batch, p.heads, p.seq_q, p.head_dim, fa::Layout::BHND)),
      o11_ref(s.has11 && s.check ? size_t(p.q_elems()) : 0),
      lse11_ref(s.has11 && s.check ? size_t(p.lse_elems()) : 0),
      scratch09(s.has09 && s.check ? size_t(std::max(p.q_elems(), p.kv_elems())) : 0) {
    for (const std::string& t : s.has07 || s.has09 || s.has11 ? s.dtypes : std::vector<std::string>{}) {
        if (t == "bf16") {
            half.bf16.emplace(p, fa::Layout::BHND);
            half.bf16->load(dev.q, dev.k, dev.v);
        } else {
            half.fp16.emplace(p, fa::Layout::BHND);
            half.fp16->load(dev.q, dev.k, dev.v);
        }
    }
    if (s.has09) {
        fa::cuda::DeviceBuffer<float> dout_f32(size_t(p.q_elems()));
        fa::cuda::fill_normal(dout_f32.data(), p.q_elems(), kDoutSeed, 1.0f);
        const fa::View4<const float> dout_view = fa::make_view(dout_f32.data(), p.batch, p.heads, p.seq_q, p.head_dim, fa::Layout::BHND);
        for (const std::string& t : s.dtypes) {
            if (t == "bf16") {
                grads.bf16.emplace(p, dout_view);
            } else {
                grads.fp16.emplace(p, dout_view);
            }
        }
        FA_CUDA_CHECK(cudaDeviceSynchronize());  // the roundings have read dout_f32 before it is freed
    }
}

std::vector<float> to_host(const float* device, int64_t n) {
    std::vector<float> host(static_cast<size_t>(n));
    FA_CUDA_CHECK(cudaMemcpy(host.data(), device, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}

double max_abs_diff(const float* a, const float* b, int64_t n) {
    const std::vector<float> ha = to_host(a, n), hb = to_host(b, n);
    double worst = 0;
    for (size_t i = 0; i < ha.size(); ++i) {
        const double d = std::fabs(double(ha[i]) - double(hb[i]));
        if (!(d <= worst)) worst = d;  // NaN counts as the worst
    }
    return worst;
}

}  // namespace bench
