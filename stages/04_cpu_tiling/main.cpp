// Stage 04 executable: FlashAttention on the CPU, checked against stage 03 and the float64 reference.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "../03_online_softmax/attention.hpp"
#include "attention.hpp"
#include "fa/counts.hpp"
#include "fa/error.hpp"
#include "fa/stage.hpp"

int main(int argc, char** argv) {
    fa::stage04::Tiling tiling;

    fa::StageSpec spec;
    spec.number = "04";
    spec.title = "CPU tiling";
    spec.description =
        "FlashAttention on the CPU: Q in blocks of Br rows, K and V in blocks of Bc rows; S_ij = Q_i K_j^T and\n"
        "O_i += P_ij V_j are Eigen matrix products, the online softmax runs across key blocks, causal blocks\n"
        "above the diagonal are skipped. --local-softmax shows the wrong shortcut of normalizing each block\n"
        "on its own. With --bench it also measures this core's Eigen GEMM rate for comparison.";
    spec.run = [&tiling](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k,
                         fa::View4<const float> v, fa::View4<float> o, fa::View3<float> lse) {
        fa::stage04::attention_tiled(p, q, k, v, o, lse, tiling);
    };
    spec.checked_against.push_back({"stage 03 (online softmax)", fa::stage03::attention, {}});
    spec.intermediate_bytes = [&tiling](const fa::Problem& p) { return fa::stage04::intermediate_bytes(p, tiling); };
    spec.intermediate_what = "S_ij/P_ij (Br x Bc), Q_i and O_i (Br x d), m_i and l_i (Br)";
    spec.describe_config = [&tiling](const fa::Problem& p) { return fa::stage04::describe(tiling, p); };
    spec.add_options = [&tiling](CLI::App& app) {
        const auto range = CLI::Range(int64_t{1}, fa::stage04::kMaxBlock);
        app.add_option("--block-m", tiling.Br, "Br: query rows per block Q_i")->check(range)->capture_default_str();
        app.add_option("--block-n", tiling.Bc, "Bc: key/value rows per block K_j, V_j")->check(range)->capture_default_str();
        app.add_flag("--local-softmax", tiling.local_softmax,
                     "normalize each score block on its own (WRONG on purpose when Nk > Bc: the check fails)");
    };
    spec.validate_options = [&tiling](const fa::CommonOptions&) { fa::stage04::check_tiling(tiling); };
    spec.after_bench = [&tiling](const fa::Problem& p, const fa::TimingStats& stats) {
        const double gflops = fa::attention_flops(p) / stats.median_ms * 1e-6;
        // Ten timed repetitions of each, or three where one pass over the blocks is long.
        const int repeat = double(p.seq_q) * double(p.seq_k) * double(p.head_dim) <= 5e9 ? 10 : 3;
        const fa::stage04::GemmCeiling c = fa::stage04::measure_gemm_ceiling(p, tiling, repeat);
        std::printf("ceiling    Eigen float GEMM on one core, 1024 x 1024 x 1024 square product: %.2f GFLOP/s\n"
                    "           -> this stage reaches %.0f%% of it (target >= 50%%)\n"
                    "           the same block products as this stage with no softmax between them, one head,\n"
                    "           no mask (%s): %.2f GFLOP/s -> this stage reaches %.0f%% of it\n",
                    c.square_gflops, 100.0 * gflops / c.square_gflops, c.blocks_shape.c_str(), c.blocks_gflops,
                    100.0 * gflops / c.blocks_gflops);
    };

    const int code = fa::run_stage(argc, argv, spec);
    if (tiling.local_softmax && code == fa::kExitMismatch) {
        std::printf("why        --local-softmax divided each row of every S_ij block by that block's own sum, so each\n"
                    "           of the Tc key blocks got total weight 1 in O, however small its scores next to the\n"
                    "           other blocks'. The true softmax divides by one sum over the whole row. The online\n"
                    "           softmax gets it right by rescaling O_i and l_i with exp(m_old - m_new); see the lesson.\n");
    } else if (tiling.local_softmax && code == fa::kExitPass) {
        std::printf("why        --local-softmax passed because every row saw a single key block (Nk <= Bc): a block's\n"
                    "           own softmax is then the row's softmax. Use --block-n smaller than --seq-k to see it fail.\n");
    }
    return code;
}
