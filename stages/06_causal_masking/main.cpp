// Stage 06 executable: causal masking by tiles, checked against stage 05, stage 04 and the float64 reference.
#include "../04_cpu_tiling/attention.hpp"
#include "../05_shared_memory_kernel/attention.cuh"
#include "attention.cuh"
#include "fa/cuda/device.hpp"
#include "fa/cuda/stage.hpp"
#include "fa/stage.hpp"

int main(int argc, char** argv) {
    fa::StageSpec spec;
    spec.number = "06";
    spec.title = "causal masking";
    spec.description =
        "Stage 05's kernel with the causal mask applied by tiles: key tiles left of the diagonal run without\n"
        "a mask, tiles on it with the mask, tiles above it are skipped; query tiles start heaviest first.\n"
        "Checked against stage 05 (GPU), stage 04 (CPU tiling) and the float64 reference.";
    spec.run = fa::stage06::attention;
    spec.check_supported = fa::stage06::check_supported;
    spec.describe_config = fa::stage06::describe_config;
    spec.intermediate_what = "none in device memory: S_ij, m_i, l_i and O_i stay in registers and shared memory";
    spec.needs_gpu = true;
    spec.gpu_unavailable_reason = fa::cuda::gpu_unavailable_reason;
    spec.bench = fa::cuda::device_bench([](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k,
                                           fa::View4<const float> v, fa::View4<float> o, fa::View3<float> lse,
                                           cudaStream_t stream) { fa::stage06::attention_device(p, q, k, v, o, lse, stream); });
    spec.after_bench = fa::cuda::print_gpu_report;
    spec.checked_against.push_back({"stage 05 (every tile masked)", fa::stage05::attention, {}});
    spec.checked_against.push_back({"stage 04 (CPU tiling)", fa::stage04::attention, {}});
    return fa::run_stage(argc, argv, spec);
}
