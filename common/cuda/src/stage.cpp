#include "fa/cuda/stage.hpp"

#include <cstdio>

#include "fa/counts.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/cuda/timing.hpp"
#include "fa/error.hpp"

namespace fa::cuda {

void run_on_device(const DeviceAttentionFn& device_entry, const Problem& p, View4<const float> q, View4<const float> k,
                   View4<const float> v, View4<float> o, View3<float> lse) {
    DeviceTensors dev(p, q, k, v, o, lse);
    device_entry(p, dev.q, dev.k, dev.v, dev.o, dev.lse, nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    dev.copy_outputs_to(o, lse);
}

std::function<TimingStats(const Problem&, const Inputs&, const CommonOptions&)> device_bench(DeviceAttentionFn device_entry) {
    return [device_entry](const Problem& p, const Inputs& in, const CommonOptions& opt) {
        const HostTensor o(p.batch, p.heads, p.seq_q, p.head_dim, opt.layout);
        const std::vector<float> lse(size_t(p.lse_elems()));
        DeviceTensors dev(p, in.q.cview(), in.k.cview(), in.v.cview(), o.cview(),
                          make_view3(lse.data(), p.batch, p.heads, p.seq_q));
        return time_on_gpu([&](cudaStream_t s) { device_entry(p, dev.q, dev.k, dev.v, dev.o, dev.lse, s); },
                           std::max(opt.warmup, 1), opt.repeat);
    };
}

namespace {

// The GPU and its SM clock right after the timed runs.
GpuInfo print_gpu_and_clock() {
    const GpuInfo gpu = gpu_info();
    const int clock = current_sm_clock_mhz();
    std::printf("gpu        %s\n", gpu.describe().c_str());
    if (clock > 0) {
        std::printf("clock      SM clock %d MHz right after the timed runs (NVML)\n", clock);
    } else {
        std::printf("clock      SM clock not readable here (no NVML); the device reports a %d MHz peak\n", gpu.max_sm_clock_mhz);
    }
    return gpu;
}

}  // namespace

void print_gpu_report(const Problem& p, const TimingStats& stats) {
    const GpuInfo gpu = print_gpu_and_clock();
    const double rate = attention_flops(p) / (stats.median_ms * 1e-3);
    std::printf("rate       %.2f TFLOP/s = %.0f%% of the %.1f TFLOP/s float32 FMA peak (%d SMs x 128 lanes x 2 x %d MHz)\n",
                rate * 1e-12, 100.0 * rate / gpu.fp32_peak_flops(), gpu.fp32_peak_flops() * 1e-12, gpu.sm_count,
                gpu.max_sm_clock_mhz);
}

void print_tensor_core_report(const Problem& p, const TimingStats& stats) {
    print_gpu_and_clock();
    const double rate = attention_flops(p) / (stats.median_ms * 1e-3);
    std::printf("rate       %.2f TFLOP/s on the tensor cores; bench/mma_ceiling measures what mma.sync can do on this GPU\n"
                "           (the course's H100: docs/results/mma_ceiling.jsonl)\n",
                rate * 1e-12);
}

}  // namespace fa::cuda
