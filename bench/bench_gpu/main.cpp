// bench_gpu's command line and the sweep's order (bench_gpu.hpp says what it times and writes):
// the options, the steps and points they name, the header lines, then for every shape and causal
// value the stages in course order, each in its own file; the records last.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "../../stages/05_shared_memory_kernel/attention.cuh"
#include "../../stages/07_pipelined_fused_kernel/attention.cuh"
#include "bench_gpu.hpp"
#include "fa/cli.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/timing.hpp"
#include "fa/error.hpp"
#include "fa/json.hpp"
#ifdef FA_HAVE_STAGE11
#include "../../stages/11_hopper_kernel/attention.cuh"
#include "fa/cuda/hopper.hpp"
#endif

namespace {

using bench::Settings;

void add_options(CLI::App& app, Settings& s) {
    app.add_option("--sizes", s.sizes, "sequence lengths N (Nq = Nk)")->capture_default_str();
    app.add_option("--head-dims", s.head_dims, "head dimensions d")->capture_default_str();
    app.add_option("--stages", s.stages,
                   "stages to time: 05, 06 (float32), 07 (bf16/fp16), 09 (bf16/fp16: stage 07's forward, stage 09's "
                   "backward with atomic and deterministic dQ, and the two as one pair), 11 (bf16/fp16: the Hopper "
                   "kernel, on an sm_90 GPU only, checked against stage 07's final kernel)")
        ->check(CLI::IsMember({"05", "06", "07", "09", "11"}))
        ->capture_default_str();
    app.add_option("--dtypes", s.dtypes, "16-bit types stages 07, 09 and 11 run in")->check(CLI::IsMember({"bf16", "fp16"}))->capture_default_str();
    app.add_option("--steps", s.step_args,
                   "stage 07 steps to time: indices into its road (see stage07 --help), or all / road for every step, "
                   "with the tuning candidates of a -DFA_STAGE07_TUNING=ON build (default: the final kernel)");
    app.add_option("--steps11", s.step11_args,
                   "with stage 11: steps of its road to time (see stage11_hopper_kernel --help), as numbers "
                   "(comma-separated or not), or all / road for every step; 0 is stage 07's final kernel. Rows "
                   "stage11_step<i>, the final kernel's row stage11 (default: the final kernel alone)")
        ->delimiter(',');
    app.add_flag("--road05", s.road05,
                 "with stage 05: time every step of its road (see stage05 --help), each checked against the final "
                 "kernel's output; rows stage05_step<i>, the final kernel's row stage05");
    app.add_option("--steps09", s.steps09,
                   "with stage 09: main kernels of its road (see stage09 --help) timed beside the default one, rows "
                   "stage09_step<i> (backward with atomic dQ, fwd+bwd) and stage09_step<i>_deterministic (backward with "
                   "deterministic dQ; --steps09-backward-only: the first alone), each checked by the guard")
        ->check(CLI::Range(0, int(fa::stage09::road().size()) - 1));
    app.add_flag("--steps09-backward-only", s.steps09_backward_only,
                 "with --steps09: time each of those steps' backward with atomic dQ alone (rows stage09_step<i>, pass "
                 "backward), without its fwd+bwd and deterministic rows; the guard still runs on each step");
    app.add_option("--model07", s.model07_args,
                   "stage 10's switches: stage 07's final kernel with them and, with stage 09 among --stages, stage 09's "
                   "backward with them (backward alone and fwd+bwd), beside the plain causal kernels at each point "
                   "(rows stage10_causal): GROUP/LEFT/RIGHT[/SOFTCAP[/DROPOUT]] (Hk = H / GROUP; window (LEFT, RIGHT), "
                   "-1 unbounded; soft cap c, 0 off; dropout p, 0 off), e.g. 8/-1/0 (GQA 8:1, causal: rows stage10_gqa8), "
                   "1/4095/0 (a 4096-key causal window: stage10_window4095) or 1/-1/0/0/0.1 (causal with dropout 0.1: "
                   "stage10_dropout0.1); TFLOP/s of the visible pairs; a pass an entry point refuses is a row without "
                   "times whose note says why; repeatable");
    app.add_option("--varlen07", s.varlen07,
                   "stage 10's packed batch: stage 07 (and, with stage 09 among --stages, stage 09's backward) on one "
                   "packed batch of sequences of these lengths (comma-separated; causal, H = width / d; rows "
                   "stage10_varlen), beside a uniform batch of the same tokens packed (stage10_varlen_uniform) and dense "
                   "(stage10_dense_uniform), for each d and dtype, before the sweep; N of these rows is the tokens in all")
        ->delimiter(',');
    app.add_option("--causal", s.causal_mode, "no, yes or both")->check(CLI::IsMember({"no", "yes", "both"}))->capture_default_str();
    app.add_option("--tokens", s.tokens, "B * N: batch = tokens / N")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--width", s.width, "H * d: heads = width / d")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--repeat", s.repeat, "timed runs per point (the median is reported)")->check(CLI::Range(1, 10000))->capture_default_str();
    app.add_option("--warmup", s.warmup, "untimed runs before timing")->check(CLI::Range(0, 1000))->capture_default_str();
    app.add_option("--check", s.check,
                   "check every point: stage 05 against stage 06, stage 07 against stage 06's float32 output (d <= 128), "
                   "stage 09's gradients by its guard (both dQ modes agree; sum_j dV_j = sum_i dO_i; sum_j dK_j = 0)")
        ->capture_default_str();
    app.add_option("--schedule-ablation", s.schedule_ablation,
                   "for causal stage 06 points, also time both orders of the query tiles (heaviest first, in order)")
        ->capture_default_str();
    app.add_option("--mma-ceiling-tflops", s.mma_ceiling_tflops,
                   "the mma.sync bf16 rate mma_ceiling measured: stage 07 points then print their fraction of it")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--wgmma-ceiling-tflops", s.wgmma_ceiling_tflops,
                   "the dense wgmma bf16 rate wgmma_ceiling measured: stage 11 points then print their fraction of it")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--json", s.json_path, "where to write the results as JSON")->capture_default_str();
    app.add_option("--csv", s.csv_path, "where to write the results as CSV")->capture_default_str();
}

// The steps an option (--steps for stage 07, --steps11 for stage 11) names: indices into the
// stage's road, or every step for "all" / "road"; the final kernel when none is named. Throws
// fa::InputError naming the bad value and the steps there are.
std::vector<int> resolve_steps(const std::vector<std::string>& args, const std::vector<fa::RoadStep>& road, int final_step,
                               const std::string& option, const std::string& stage) {
    if (args.empty()) return {final_step};
    std::vector<int> steps;
    for (const std::string& a : args) {
        if (a == "all" || a == "road") {
            for (int i = 0; i < int(road.size()); ++i) steps.push_back(i);
            continue;
        }
        size_t used = 0;
        int step = -1;
        try {
            step = std::stoi(a, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != a.size() || step < 0 || step >= int(road.size())) {
            std::string list;
            for (size_t i = 0; i < road.size(); ++i) list += "\n  " + std::to_string(i) + " " + road[i].name;
            throw fa::InputError(option + " " + a + " is not a step of stage " + stage + ": use all, road, or numbers from 0 to " +
                                 std::to_string(road.size() - 1) + ":" + list);
        }
        steps.push_back(step);
    }
    std::sort(steps.begin(), steps.end());
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    return steps;
}

// What the options name, checked before any GPU work: the steps, the --model07 points, the
// --varlen07 lengths (>= 0, totals that fit). Throws fa::InputError naming the bad value.
void resolve_options(Settings& s) {
    s.steps07 = resolve_steps(s.step_args, fa::stage07::road(), fa::stage07::final_step(), "--steps", "07");
    for (const std::string& spec : s.model07_args) s.model07.push_back(bench::parse_model07(spec));
    if (!s.varlen07.empty()) fa::cu_seqlens_from_lengths(s.varlen07);
#ifdef FA_HAVE_STAGE11
    s.steps11 = resolve_steps(s.step11_args, fa::stage11::road(), fa::stage11::final_step(), "--steps11", "11");
#endif
}

// The stages in course order, whatever the command line's (stage 06's output is then the reference
// stage 07 meets), which of them run, and the causal values. Stage 11 runs where it was built and
// the GPU has Hopper's instructions; otherwise one line (and one entry of `skipped`) says why not.
void settle_stages(Settings& s, std::vector<bench::Skip>& skipped) {
    std::sort(s.stages.begin(), s.stages.end());
    s.stages.erase(std::unique(s.stages.begin(), s.stages.end()), s.stages.end());
    const auto has = [&](const char* stage) { return std::count(s.stages.begin(), s.stages.end(), stage) > 0; };
    s.has05 = has("05"), s.has06 = has("06"), s.has07 = has("07"), s.has09 = has("09"), s.has11 = has("11");
#ifdef FA_HAVE_STAGE11
    const std::string no_hopper = fa::cuda::hopper_unavailable_reason();
#else
    const std::string no_hopper = "this build has no stage 11 (it is built with CUDA, for sm_90a)";
#endif
    if (s.has11 && !no_hopper.empty()) {
        std::printf("skipped    stage 11: it needs a Hopper GPU (sm_90a): %s\n", no_hopper.c_str());
        skipped.push_back({"11", "", -1, -1, no_hopper});
        s.has11 = false;
    }
    if (s.causal_mode != "yes") s.causal_values.push_back(false);
    if (s.causal_mode != "no") s.causal_values.push_back(true);
}

// The lines before the sweep: the GPU, the method, and what each 16-bit stage runs.
void print_header(const Settings& s, const fa::cuda::GpuInfo& gpu) {
    const auto& road = fa::stage07::road();
    const std::string final07 = std::to_string(fa::stage07::final_step()) + " (" + road[size_t(fa::stage07::final_step())].name + ")";
    std::string types;
    for (const std::string& t : s.dtypes) types += (types.empty() ? "" : " and ") + t;
    std::printf("gpu        %s\n", gpu.describe().c_str());
    std::printf("method     CUDA events, %d warm-up runs, L2 flushed (%zu MiB written) before each of %d timed runs, median\n",
                s.warmup, fa::cuda::l2_flush_bytes() >> 20, s.repeat);
    if (s.has07) {
        std::printf("stage 07   %s; steps:", types.c_str());
        for (int step : s.steps07) std::printf(" %d (%s)", step, road[size_t(step)].name.c_str());
        std::printf("%s\n", int(road.size()) > fa::stage07::final_step() + 1 ? "; tuning build" : "");
    }
#ifdef FA_HAVE_STAGE11
    if (s.has11) {
        std::printf("stage 11   %s; steps:", types.c_str());
        for (int step : s.steps11) std::printf(" %d (%s)", step, fa::stage11::road()[size_t(step)].name.c_str());
        std::printf("; each checked against stage 07 step %s in its type\n", final07.c_str());
    }
#endif
    if (s.has09) {
        std::printf("stage 09   forward: stage 07 step %s; backward: dQ by atomics and deterministic; "
                    "fwd+bwd: the two timed as one pair\n",
                    final07.c_str());
        std::printf("stage 09   main kernel: step %d (%s)", fa::stage09::kDefaultStep,
                    fa::stage09::road()[size_t(fa::stage09::kDefaultStep)].name.c_str());
        for (int step : s.steps09) std::printf("; beside it step %d (%s)", step, fa::stage09::road()[size_t(step)].name.c_str());
        std::printf("%s\n", !s.steps09.empty() && s.steps09_backward_only ? "; those steps: the backward with atomic dQ alone" : "");
    }
}

// The progress lines the sweep will print (a refused kernel takes its own out as it goes).
size_t planned_points(const Settings& s) {
    const size_t per_point = (s.has05 ? (s.road05 ? size_t(fa::stage05::final_step()) + 1 : 1) : 0) + (s.has06 ? 1 : 0) +
                             (s.has07 ? s.dtypes.size() * s.steps07.size() : 0) +
                             (s.has09 ? s.dtypes.size() * (4 + bench::rows_per_step09(s) * s.steps09.size()) : 0) +
                             (s.has11 ? s.dtypes.size() * s.steps11.size() : 0);
    return s.sizes.size() * s.head_dims.size() * s.causal_values.size() * per_point;
}

// Stage 10's packed batch first, then every shape (B * N = --tokens, H * d = --width) and causal
// value, its stages in course order: 05 and 06 (whose output stage 07 is checked against), 07,
// stage 10's switches, 11, then 09 (the backward after stage 07's forward).
void run_sweep(bench::Sweep& sweep) {
    const Settings& s = sweep.s;
    bench::time_stage10_varlen(sweep);
    for (int64_t d : s.head_dims) {
        for (int64_t n : s.sizes) {
            fa::Problem p;
            p.batch = std::max<int64_t>(1, s.tokens / n);
            p.heads = std::max<int64_t>(1, s.width / d);
            p.seq_q = p.seq_k = n;
            p.head_dim = d;
            bench::ShapeTensors shape(p, s);
            for (bool causal : s.causal_values) {
                shape.p.causal = causal;
                const bool have_reference = bench::time_fp32(sweep, shape);
                bench::time_stage07(sweep, shape, have_reference);
                bench::time_stage10_points(sweep, shape);
                bench::time_stage11(sweep, shape);
                bench::time_stage09(sweep, shape);
            }
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"flashcourse bench_gpu: GPU stages 05, 06 (float32), 07 (bf16, fp16), 09 (the backward after stage "
                 "07's forward, bf16, fp16) and 11 (the Hopper kernel, bf16, fp16) over a sweep of shapes, timed with CUDA events"};
    Settings s;
    add_options(app, s);
    // Every argument error exits with kExitBadInput (2) and a message naming the option.
    if (const int rc = fa::parse_command_line(app, argc, argv); rc >= 0) return rc;
    try {
        resolve_options(s);
    } catch (const fa::InputError& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return fa::kExitBadInput;
    }
    const std::string reason = fa::cuda::gpu_unavailable_reason();
    if (!reason.empty()) {
        std::printf("skipped: bench_gpu needs a CUDA GPU (%s)\n", reason.c_str());
        return fa::kExitSkipped;
    }
    std::vector<bench::Skip> skipped;
    settle_stages(s, skipped);
    const fa::cuda::GpuInfo gpu = fa::cuda::gpu_info();
    const std::string date = fa::record_date();
    print_header(s, gpu);

    bench::Sweep sweep(s);
    sweep.skipped = std::move(skipped);
    sweep.points = planned_points(s);
    try {
        run_sweep(sweep);
    } catch (const fa::InputError& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return fa::kExitBadInput;
    } catch (const fa::cuda::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return fa::kExitMismatch;
    }
    if (!bench::write_records(sweep, gpu, date)) return fa::kExitBadInput;
    std::printf("wrote      %s and %s (%zu points)\n", s.json_path.c_str(), s.csv_path.c_str(), sweep.records.size());
    if (sweep.any_bad) {
        std::printf("FAILED     at least one point failed its check (marked BAD or MISMATCH above)\n");
        return fa::kExitMismatch;
    }
    return fa::kExitPass;
}
