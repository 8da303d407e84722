// Stage 08 executable: the FlashAttention-2 backward pass on the CPU, checked against the float64
// reference backward by twice the error of the naive float32 backward.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "../04_cpu_tiling/attention.hpp"
#include "attention.hpp"
#include "fa/counts.hpp"
#include "fa/stage.hpp"

int main(int argc, char** argv) {
    fa::stage08::Tiling tiling;

    fa::StageSpec spec;
    spec.number = "08";
    spec.title = "backward on the CPU";
    spec.description =
        "The FlashAttention-2 backward pass on the CPU: D = rowsum(dO * O) first; then, for each block K_j, V_j\n"
        "(outer loop), the query blocks stream past (inner loop) and P_ij is recomputed from Q_i K_j^T and the\n"
        "saved LSE, never stored; dV_j and dK_j accumulate in the block, dQ_i across blocks. O and LSE come\n"
        "from stage 04's forward; dO is seeded random or do.npy from --load. Checked against the float64\n"
        "reference backward, within twice the error of the naive float32 backward that stores P.";
    spec.run = fa::stage04::attention;
    spec.forward_name = "stage 04 (CPU tiling)";
    spec.run_backward = [&tiling](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k,
                                  fa::View4<const float> v, fa::View4<const float> o, fa::View3<const float> lse,
                                  fa::View4<const float> dout, fa::View4<float> dq, fa::View4<float> dk, fa::View4<float> dv) {
        fa::stage08::attention_backward_tiled(p, q, k, v, o, lse, dout, dq, dk, dv, tiling);
    };
    spec.intermediate_bytes = [&tiling](const fa::Problem& p) { return fa::stage08::intermediate_bytes(p, tiling); };
    spec.intermediate_what = "D (Nq), S_ij/P_ij and dP_ij/dS_ij (Br x Bc), dK_j and dV_j (Bc x d)";
    spec.describe_config = [&tiling](const fa::Problem& p) { return fa::stage08::describe(tiling, p); };
    spec.add_options = [&tiling](CLI::App& app) {
        const auto range = CLI::Range(int64_t{1}, fa::stage08::kMaxBlock);
        app.add_option("--block-m", tiling.Br, "Br: query rows per block Q_i, dO_i, dQ_i (inner loop)")
            ->check(range)
            ->capture_default_str();
        app.add_option("--block-n", tiling.Bc, "Bc: key/value rows per block K_j, V_j, dK_j, dV_j (outer loop)")
            ->check(range)
            ->capture_default_str();
    };
    spec.validate_options = [&tiling](const fa::CommonOptions&) { fa::stage08::check_tiling(tiling); };
    spec.after_bench = [](const fa::Problem& p, const fa::TimingStats& stats) {
        // The same ceiling as stage 04: this core's Eigen float GEMM on a large square product.
        const double gflops = fa::attention_flops_backward(p) / stats.median_ms * 1e-6;
        const fa::stage04::GemmCeiling c = fa::stage04::measure_gemm_ceiling(p, fa::stage04::Tiling{}, 5);
        std::printf("ceiling    Eigen float GEMM on one core, 1024 x 1024 x 1024 square product: %.2f GFLOP/s\n"
                    "           -> the backward reaches %.0f%% of it\n",
                    c.square_gflops, 100.0 * gflops / c.square_gflops);
    };
    return fa::run_stage(argc, argv, spec);
}
