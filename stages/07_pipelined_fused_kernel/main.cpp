// Stage 07 executable: the tensor-core kernel in bf16 or fp16, checked against stage 06 (float32
// on the GPU), stage 04 (CPU tiling) and the float64 reference.
#include <string>

#include <CLI/CLI.hpp>

#include "../04_cpu_tiling/attention.hpp"
#include "../06_causal_masking/attention.cuh"
#include "attention.cuh"
#include "fa/cuda/device.hpp"
#include "fa/cuda/half.hpp"
#include "fa/cuda/stage.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/cuda/timing.hpp"
#include "fa/stage.hpp"

namespace {

fa::cuda::DType g_dtype = fa::cuda::DType::BF16;
int g_step = -1;  // the final kernel

// --bench: the 16-bit copies of the inputs are made once, then the kernel alone is timed.
template <class T>
fa::TimingStats bench_half(const fa::Problem& p, const fa::Inputs& in, const fa::CommonOptions& opt) {
    const fa::HostTensor o(p.batch, p.heads, p.seq_q, p.head_dim, opt.layout);
    const std::vector<float> lse(size_t(p.lse_elems()));
    fa::cuda::DeviceTensors dev(p, in.q.cview(), in.k.cview(), in.v.cview(), o.cview(),
                                fa::make_view3(lse.data(), p.batch, p.heads, p.seq_q));
    fa::cuda::HalfTensors<T> half(p, opt.layout);
    half.load(dev.q, dev.k, dev.v);
    return fa::cuda::time_on_gpu(
        [&](cudaStream_t s) { fa::stage07::attention_device(p, half.q, half.k, half.v, half.o, dev.lse, s, g_step); },
        std::max(opt.warmup, 1), opt.repeat);
}

}  // namespace

int main(int argc, char** argv) {
    fa::StageSpec spec;
    spec.number = "07";
    spec.title = "pipelined fused tensor-core kernel";
    spec.description =
        "Stage 06's algorithm on the tensor cores (mma.sync m16n8k16) in bf16 or fp16 with float32 accumulation:\n"
        "ldmatrix from XOR-swizzled shared memory, a cp.async pipeline two K/V tiles deep, each warp owning its\n"
        "query rows, P kept in registers. d = 32, 64, 128, 256. Checked against stage 06 (float32 GPU), stage 04\n"
        "(CPU tiling) and the float64 reference by the low-precision rule. --step runs an earlier step of the road.";
    spec.run = [](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                  fa::View4<float> o, fa::View3<float> lse) { fa::stage07::host_entry(g_dtype, g_step)(p, q, k, v, o, lse); };
    spec.check_supported = [](const fa::Problem& p) { fa::stage07::check_supported(p, g_step); };
    spec.describe_config = [](const fa::Problem& p) {
        return fa::cuda::to_string(g_dtype) + ", " + fa::stage07::describe_config(p, g_step);
    };
    spec.intermediate_what = "16-bit copies of q, k, v, o on the device; S_ij, P_ij, m_i, l_i and O_i stay on chip";
    spec.intermediate_bytes = [](const fa::Problem& p) { return 2.0 * (2.0 * double(p.q_elems()) + 2.0 * double(p.kv_elems())); };
    spec.needs_gpu = true;
    spec.gpu_unavailable_reason = fa::cuda::gpu_unavailable_reason;
    spec.add_options = [](CLI::App& app) {
        app.add_option_function<std::string>(
               "--dtype", [](const std::string& s) { g_dtype = s == "fp16" ? fa::cuda::DType::FP16 : fa::cuda::DType::BF16; },
               "16-bit type of the inputs and of O: bf16 (range of float32, 8 significant bits) or fp16 (11 bits, max 65504)")
            ->check(CLI::IsMember({"bf16", "fp16"}))
            ->default_str("bf16");
        app.add_option("--step", g_step, fa::road_help(fa::stage07::road()))->check(CLI::Range(0, int(fa::stage07::road().size()) - 1));
    };
    spec.precision = [] { return g_dtype == fa::cuda::DType::BF16 ? fa::Precision::BFloat16 : fa::Precision::Float16; };
    spec.bench = [](const fa::Problem& p, const fa::Inputs& in, const fa::CommonOptions& opt) {
        return g_dtype == fa::cuda::DType::BF16 ? bench_half<__nv_bfloat16>(p, in, opt) : bench_half<__half>(p, in, opt);
    };
    spec.after_bench = fa::cuda::print_tensor_core_report;
    // Stage 06 is built for d = 32, 64, 128; at d = 256 stage 04 and the float64 reference check alone.
    spec.checked_against.push_back({"stage 06 (float32 GPU)", fa::stage06::attention,
                                    [](const fa::Problem& p) { return p.head_dim <= 128; }});
    spec.checked_against.push_back({"stage 04 (CPU tiling)", fa::stage04::attention, {}});
    return fa::run_stage(argc, argv, spec);
}
