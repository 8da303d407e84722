// Stage 05 executable: the shared-memory CUDA kernel, checked against stage 04 and the float64 reference.
#include <string>

#include <CLI/CLI.hpp>

#include "../04_cpu_tiling/attention.hpp"
#include "attention.cuh"
#include "fa/cuda/device.hpp"
#include "fa/cuda/stage.hpp"
#include "fa/stage.hpp"

namespace {

int g_step = -1;  // the final kernel

}  // namespace

int main(int argc, char** argv) {
    fa::StageSpec spec;
    spec.number = "05";
    spec.title = "shared-memory CUDA kernel";
    spec.description =
        "One thread block per (batch, head, 64 query rows): Q stays in shared memory, K and V stream through it\n"
        "64 rows at a time, scores and the online softmax stay in registers. float32, d = 32, 64 or 128.\n"
        "Checked against stage 04 (CPU tiling) and the float64 reference. --bench times it with CUDA events.\n"
        "--step runs an earlier step of the road, from one thread per query row to the final kernel.";
    spec.run = [](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                  fa::View4<float> o, fa::View3<float> lse) { fa::stage05::attention_step(p, q, k, v, o, lse, g_step); };
    spec.check_supported = [](const fa::Problem& p) { fa::stage05::check_supported(p, g_step); };
    spec.describe_config = [](const fa::Problem&) { return fa::stage05::describe_config(g_step); };
    spec.intermediate_what = "none in device memory: S_ij, m_i, l_i and O_i stay in registers and shared memory";
    spec.needs_gpu = true;
    spec.gpu_unavailable_reason = fa::cuda::gpu_unavailable_reason;
    spec.add_options = [](CLI::App& app) {
        app.add_option("--step", g_step, fa::road_help(fa::stage05::road()))->check(CLI::Range(0, fa::stage05::final_step()));
    };
    spec.bench = fa::cuda::device_bench([](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k,
                                           fa::View4<const float> v, fa::View4<float> o, fa::View3<float> lse,
                                           cudaStream_t s) { fa::stage05::attention_device(p, q, k, v, o, lse, s, g_step); });
    spec.after_bench = fa::cuda::print_gpu_report;
    spec.checked_against.push_back({"stage 04 (CPU tiling)", fa::stage04::attention, {}});
    return fa::run_stage(argc, argv, spec);
}
