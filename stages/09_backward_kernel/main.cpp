// Stage 09 executable: the backward pass on tensor cores in bf16 or fp16, after stage 07's forward
// in the same type, checked against stage 08 (the backward on the CPU) and the float64 reference
// by the gradient rule.
#include <algorithm>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "../07_pipelined_fused_kernel/attention.cuh"
#include "../04_cpu_tiling/attention.hpp"
#include "../08_cpu_backward/attention.hpp"
#include "attention.cuh"
#include "fa/cuda/backward_bench.hpp"
#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/half.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/cuda/timing.hpp"
#include "fa/stage.hpp"

namespace {

fa::stage09::Options g_options;

// --bench: the inputs are copied and rounded to 16 bits once, the workspace is allocated once,
// then the three backward kernels alone are timed.
template <class T>
fa::TimingStats bench_half(const fa::Problem& p, const fa::Inputs& in, fa::View4<const float> o, fa::View3<const float> lse,
                           fa::View4<const float> dout, const fa::CommonOptions& opt) {
    fa::stage09::Workspace workspace;
    return fa::cuda::time_backward_half<T>(p, in, o, lse, dout, opt, [&](const fa::cuda::BackwardViews<T>& b, cudaStream_t s) {
        fa::stage09::attention_backward_device(p, b.q, b.k, b.v, b.o, b.lse, b.dout, b.dq, b.dk, b.dv, g_options.deterministic, s,
                                               &workspace, g_options.step);
    });
}

// After --bench: the GPU and its clock (the driver already printed the backward's TFLOP/s).
void print_gpu(const fa::Problem&, const fa::TimingStats&) {
    const fa::cuda::GpuInfo gpu = fa::cuda::gpu_info();
    const int clock = fa::cuda::current_sm_clock_mhz();
    std::printf("gpu        %s\n", gpu.describe().c_str());
    if (clock > 0) {
        std::printf("clock      SM clock %d MHz right after the timed runs (NVML)\n", clock);
    } else {
        std::printf("clock      SM clock not readable here (no NVML); the device reports a %d MHz peak\n", gpu.max_sm_clock_mhz);
    }
}

}  // namespace

int main(int argc, char** argv) {
    fa::StageSpec spec;
    spec.number = "09";
    spec.title = "backward kernel";
    spec.description =
        "The FlashAttention-2 backward pass on tensor cores (mma.sync m16n8k16) in bf16 or fp16 with float32\n"
        "accumulation: D = rowsum(dO * O) first; then one thread block per key block K_j, V_j streams the query\n"
        "blocks past it through a cp.async pipeline, recomputes P from the saved LSE, and accumulates dK_j, dV_j in\n"
        "registers; dQ is added across key blocks in a float32 buffer (atomically, or in a fixed order with\n"
        "--deterministic). --step picks the main kernel: warps owning 16 keys each, or warps tiling every product\n"
        "(step 1; steps 2 and 3 with 128-key blocks at d = 128 too).\n"
        "O and LSE come from stage 07's forward in the same --dtype. Checked against stage 08 (the backward on the\n"
        "CPU) and the float64 reference by the gradient rule.";
    spec.run = [](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                  fa::View4<float> o, fa::View3<float> lse) { fa::stage07::host_entry(g_options.dtype)(p, q, k, v, o, lse); };
    spec.forward_name = "stage 07 (tensor cores, same --dtype)";
    spec.run_backward = [](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                           fa::View4<const float> o, fa::View3<const float> lse, fa::View4<const float> dout,
                           fa::View4<float> dq, fa::View4<float> dk, fa::View4<float> dv) {
        fa::stage09::host_entry(g_options)(p, q, k, v, o, lse, dout, dq, dk, dv);
    };
    // Stage 08 after its own float32 forward (stage 04's): the whole float32 pipeline.
    spec.backward_checked_against.push_back(
        {"stage 08 (CPU, after stage 04's forward)", fa::stage08::attention_backward, {}, fa::stage04::attention});
    spec.check_supported = [](const fa::Problem& p) {
        fa::stage09::check_supported(p, g_options.step);
        fa::stage07::check_supported(p, -1);  // the forward that makes O and LSE
    };
    spec.describe_config = [](const fa::Problem& p) { return fa::stage09::describe_config(p, g_options); };
    spec.intermediate_what =
        "16-bit copies of q, k, v, o, dO, dQ, dK, dV on the device; L_i, D_i and the float32 dQ accumulator; "
        "P_ij, dP_ij and dS_ij stay on chip";
    spec.intermediate_bytes = [](const fa::Problem& p) { return fa::stage09::intermediate_bytes(p, g_options); };
    spec.needs_gpu = true;
    spec.gpu_unavailable_reason = fa::cuda::gpu_unavailable_reason;
    spec.add_options = [](CLI::App& app) {
        app.add_option_function<std::string>(
               "--dtype",
               [](const std::string& s) { g_options.dtype = s == "fp16" ? fa::cuda::DType::FP16 : fa::cuda::DType::BF16; },
               "16-bit type of the inputs, O, dO and the gradients: bf16 (range of float32, 8 significant bits) or fp16 "
               "(11 bits, max 65504)")
            ->check(CLI::IsMember({"bf16", "fp16"}))
            ->default_str("bf16");
        app.add_option("--step", g_options.step, fa::road_help(fa::stage09::road(), fa::stage09::kDefaultStep))
            ->check(CLI::Range(0, int(fa::stage09::road().size()) - 1));
        app.add_flag("--deterministic", g_options.deterministic,
                     "add the key blocks' dQ contributions in a fixed order (bit-identical dq from run to run) "
                     "instead of float32 atomic additions");
    };
    spec.precision = [] {
        return g_options.dtype == fa::cuda::DType::BF16 ? fa::Precision::BFloat16 : fa::Precision::Float16;
    };
    spec.bench_backward = [](const fa::Problem& p, const fa::Inputs& in, fa::View4<const float> o, fa::View3<const float> lse,
                             fa::View4<const float> dout, const fa::CommonOptions& opt) {
        return g_options.dtype == fa::cuda::DType::BF16 ? bench_half<__nv_bfloat16>(p, in, o, lse, dout, opt)
                                                        : bench_half<__half>(p, in, o, lse, dout, opt);
    };
    spec.after_bench = print_gpu;
    return fa::run_stage(argc, argv, spec);
}
