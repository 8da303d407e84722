// Stage 12 executable: the backward pass on Hopper (TMA, wgmma, dQ by bulk reduction) in bf16 or fp16,
// after stage 11's forward in the same type, checked against stage 09 (the backward on mma.sync) and
// the float64 reference by the gradient rule.
#include <algorithm>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "../09_backward_kernel/attention.cuh"
#include "../11_hopper_kernel/attention.cuh"
#include "attention.cuh"
#include "fa/cuda/backward_bench.hpp"
#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/half.hpp"
#include "fa/cuda/stage.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/cuda/timing.hpp"
#include "fa/stage.hpp"

namespace {

fa::stage12::Options g_options;

// --bench: the inputs are copied and rounded to 16 bits once, the workspace is allocated once,
// then the backward's kernels alone are timed.
template <class T>
fa::TimingStats bench_half(const fa::Problem& p, const fa::Inputs& in, fa::View4<const float> o, fa::View3<const float> lse,
                           fa::View4<const float> dout, const fa::CommonOptions& opt) {
    fa::stage12::Workspace workspace;
    return fa::cuda::time_backward_half<T>(p, in, o, lse, dout, opt, [&](const fa::cuda::BackwardViews<T>& b, cudaStream_t s) {
        fa::stage12::attention_backward_device(p, b.q, b.k, b.v, b.o, b.lse, b.dout, b.dq, b.dk, b.dv, s, &workspace,
                                               g_options.step, g_options.deterministic);
    });
}

}  // namespace

int main(int argc, char** argv) {
    fa::StageSpec spec;
    spec.number = "12";
    spec.title = "Hopper backward";
    spec.description =
        "The FlashAttention backward pass on Hopper's machinery (sm_90a: H100, H200), bf16 or fp16 with float32\n"
        "accumulation: D = rowsum(dO * O) first; then one block per key block K_j, V_j (loaded once by the TMA)\n"
        "streams the query tiles Q_i, dO_i, L_i, D_i past it on a ring of mbarrier slots; S^T = K Q^T and\n"
        "dP^T = V dO^T by wgmma from shared memory, dV += P^T dO and dK += dS^T Q by wgmma from registers,\n"
        "dQ_i = dS K_j from dS^T read transposed, added into a float32 accumulator by the TMA's bulk reduction.\n"
        "O and LSE come from stage 11's forward in the same --dtype. Checked against stage 09 (mma.sync) and the\n"
        "float64 reference by the gradient rule. --step 0 runs stage 09's default backward itself.";
    spec.run = [](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                  fa::View4<float> o, fa::View3<float> lse) { fa::stage11::host_entry(g_options.dtype)(p, q, k, v, o, lse); };
    spec.forward_name = "stage 11 (Hopper, same --dtype)";
    spec.run_backward = [](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                           fa::View4<const float> o, fa::View3<const float> lse, fa::View4<const float> dout,
                           fa::View4<float> dq, fa::View4<float> dk, fa::View4<float> dv) {
        fa::stage12::host_entry(g_options)(p, q, k, v, o, lse, dout, dq, dk, dv);
    };
    // Stage 09 in the same precision, on the same O and LSE (stage 11's): the rule's limits are
    // those of --dtype, so the earlier stage must round as this one does.
    spec.backward_checked_against.push_back(
        {"stage 09 (mma.sync, same --dtype)",
         [](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
            fa::View4<const float> o, fa::View3<const float> lse, fa::View4<const float> dout, fa::View4<float> dq,
            fa::View4<float> dk, fa::View4<float> dv) {
             fa::stage09::host_entry(fa::stage09::Options{g_options.dtype, g_options.deterministic, -1})(p, q, k, v, o, lse, dout, dq,
                                                                                                           dk, dv);
         },
         {},
         {}});
    spec.check_supported = [](const fa::Problem& p) {
        fa::stage12::check_supported(p, g_options.step, g_options.deterministic);
        fa::stage11::check_supported(p, -1);  // the forward that makes O and LSE
    };
    spec.describe_config = [](const fa::Problem& p) { return fa::stage12::describe_config(p, g_options); };
    spec.intermediate_what =
        "16-bit copies of q, k, v, o, dO, dQ, dK, dV on the device; L_i log2e, D_i and the float32 dQ accumulator; "
        "S_ij, P_ij, dP_ij stay on chip, dS_ij and each tile's dQ_i pass through shared memory";
    spec.intermediate_bytes = [](const fa::Problem& p) { return fa::stage12::intermediate_bytes(p, g_options); };
    spec.needs_gpu = true;
    spec.gpu_unavailable_reason = fa::stage12::gpu_unavailable_reason;
    spec.add_options = [](CLI::App& app) {
        app.add_option_function<std::string>(
               "--dtype",
               [](const std::string& s) { g_options.dtype = s == "fp16" ? fa::cuda::DType::FP16 : fa::cuda::DType::BF16; },
               "16-bit type of the inputs, O, dO and the gradients: bf16 (range of float32, 8 significant bits) or fp16 "
               "(11 bits, max 65504)")
            ->check(CLI::IsMember({"bf16", "fp16"}))
            ->default_str("bf16");
        app.add_option("--step", g_options.step, fa::road_help(fa::stage12::road(), fa::stage12::final_step()))
            ->check(CLI::Range(0, int(fa::stage12::road().size()) - 1));
        app.add_flag("--deterministic", g_options.deterministic,
                     "add the key blocks' dQ partials in a fixed order, the last key block first (bit-identical dq from run "
                     "to run): step 0, or step " +
                         std::to_string(fa::stage12::first_deterministic_step()) + " and later (their dQ writer waits for the "
                         "turns); otherwise float32 additions that race");
    };
    spec.precision = [] {
        return g_options.dtype == fa::cuda::DType::BF16 ? fa::Precision::BFloat16 : fa::Precision::Float16;
    };
    spec.bench_backward = [](const fa::Problem& p, const fa::Inputs& in, fa::View4<const float> o, fa::View3<const float> lse,
                             fa::View4<const float> dout, const fa::CommonOptions& opt) {
        return g_options.dtype == fa::cuda::DType::BF16 ? bench_half<__nv_bfloat16>(p, in, o, lse, dout, opt)
                                                        : bench_half<__half>(p, in, o, lse, dout, opt);
    };
    spec.after_bench = fa::cuda::print_tensor_core_report;
    return fa::run_stage(argc, argv, spec);
}
