// bench_gpu: times the GPU stages over a sweep of shapes and writes JSON and CSV.
//
// The sweep keeps the work per launch comparable across sequence lengths: B * N = 16384 tokens
// and H * d = 2048 features, so N = 512 runs 32 sequences and N = 16384 runs one. Each point is
// timed with CUDA events after warm-up runs, with the L2 flushed before every run, and the median
// of --repeat runs is reported, in TFLOP/s by fa::attention_flops (4 B H Nq Nk d, halved for
// causal).
//
// Stages 05 and 06 run in float32 on one set of inputs per shape; stage 07 runs in bf16 and/or
// fp16 on copies of the same inputs rounded once per shape, at the final kernel or at any steps
// of its road (--steps). Stage 09 (--stages 09) times both halves of a training step in the same
// types, each row with its `pass`:
//   forward   stage 07's final kernel, which writes the O and LSE the backward reads
//   backward  stage 09 alone: the three kernels its entry point queues, dQ added with float32
//             atomics ("stage09") and again in a fixed order ("stage09_deterministic")
//   fwd+bwd   the forward and the atomic backward timed as one pair (the L2 flushed before the
//             pair, not between its halves), not the sum of the two medians (printed beside it)
// with the FLOPs of fa::attention_flops_backward (2.5 times the forward's) and
// fa::attention_flops_fwd_bwd (3.5 times). One stage 09 workspace per shape, grown by an untimed
// call of each mode, so no timed call allocates. --steps09 adds other main kernels of stage 09's
// road: rows "stage09_step<i>" (backward with atomic dQ, and fwd+bwd) and
// "stage09_step<i>_deterministic" (backward with deterministic dQ), each step with its own guard;
// with --steps09-backward-only each of those steps times its backward with atomic dQ alone (one
// row "stage09_step<i>", the one a road table needs) and still runs its guard.
//
// Stage 10's switches (--model07 GROUP/LEFT/RIGHT[/SOFTCAP[/DROPOUT]], repeatable; --varlen07
// lengths) run once per shape in the same types: stage 07's final kernel with each point's
// ModelOptions (rows "stage10_<variant>": stage10_gqa8, stage10_window4095, stage10_dropout0.1, ...)
// and the plain causal kernel beside it (rows "stage10_causal"); with stage 09 among --stages also
// stage 09's backward with the same options, alone and as a pair with the forward (passes
// backward and fwd+bwd, as above). --varlen07 times one packed batch of sequences of mixed lengths
// ("stage10_varlen"), a packed batch of equal lengths with the same tokens
// ("stage10_varlen_uniform") and that batch dense ("stage10_dense_uniform"), forward and, with stage
// 09, backward (attention_varlen_device, attention_backward_varlen_device). These rows count the
// FLOPs of the visible (query, key) pairs only (a window's, each sequence's causal triangle), 4 d
// per pair forward and 2.5 and 3.5 times that for the backward and the pair; each prints its time
// over the plain causal kernel's at the same N (packed rows: their rate over the dense kernel's).
// A pass an entry point refuses (fa::InputError, e.g. dropout where stage 09 does not apply it)
// becomes a row without times whose note is "refused: " and the message, and the run goes on.
//
// After timing, every point is checked: stage 05 against stage 06 (both float32: they must agree
// to 1e-4), stage 07 against stage 06's float32 output (BAD above a relative L2 error of 2e-2 or
// on any NaN), stage 09's gradients by the guard of check_stage09 (both dQ modes against each
// other, and two sums the exact gradients obey). These guard against gross errors only; the
// tolerances that decide correctness live in the tests. A failed check is marked, the sweep goes
// on, and the exit code is 1.
//
// Stage 11 (--stages 11, the Hopper kernel; built for sm_90a, timed only on a Hopper GPU) runs in
// the same 16-bit types on the same rounded inputs as stage 07: its final kernel (rows "stage11")
// or any steps of its road (--steps11: rows "stage11_step<i>", step 0 being stage 07's final
// kernel, the road's point of departure). Every stage 11 row is checked on the device against
// stage 07's final kernel in the same type at the same point: O by its largest difference (a few
// roundings of the 16-bit type, scaled by the largest |O|) and its relative L2 error, LSE by its
// largest difference. On another GPU the stage 11 rows are skipped with one line saying why.
//
// The records (records.cpp). Every number a printed line shows is in bench_gpu.json, each where
// it belongs: the run's (the GPU, the method, each stage's road and the steps asked for, what was
// skipped) at the top, a point's in its row of "results". A figure one row's own fields give (a
// fraction of a ceiling: tflops over mma_ceiling_tflops or wgmma_ceiling_tflops; stage 06's gain
// from the order of its tiles: heavy_first_ms over in_order_ms) is left to the reader; one that
// joins two rows is written on the row it is printed under. bench_gpu.csv has one row per result
// with the columns impl,dtype,B,H,N,d,causal,median_ms,tflops,gpu,sm_clock_mhz,date,step,
// step_name,min_ms,max_ms,check,check_max_abs,check_rel_l2,pass,spec,note (the page generators
// read them by name); the other fields are in the JSON only.
//   top level   gpu, sm_count, max_sm_clock_mhz, fp32_peak_tflops, date, method (in words), and
//               as numbers warmup, repeat, l2_flush_bytes (the buffer written before each run);
//               compute_capability, memory_bytes, l2_bytes (the rest of the gpu line); dtypes
//               (the 16-bit stages' types); mma_ceiling_tflops, wgmma_ceiling_tflops when given;
//               stage07_final_step and stage07_road (every step: step, name, idea), with stage 07
//               stage07_steps (the steps timed); with stage 05 and --road05 stage05_final_step and
//               stage05_road; with stage 09 stage09_default_step, stage09_road, stage09_steps
//               (--steps09) and stage09_steps_backward_only; with stage 11 stage11_final_step,
//               stage11_road and stage11_steps; skipped (each kernel an entry point refused, and
//               stage 11 on a GPU without sm_90a: stage, dtype, step and d where they apply, and
//               the reason); results.
//   results     impl, dtype, B, H, N, d, causal, pass, median_ms, min_ms, max_ms, tflops (null on
//               a refused row), sm_clock_mhz; step and step_name (a road's rows); heavy_first_ms,
//               in_order_ms (stage 06, causal) and schedule_auto (the order Schedule::Auto chose:
//               heavy_first or in_order); check ("ok" or "BAD") with check_max_abs, check_rel_l2,
//               check_nonfinite (NaN and inf in the output checked), for stage 09 also
//               check_dv_sum_rel, check_dk_sum_ratio and check_zero_gradients (gradients that are
//               all zero), for stage 11 check_limit (O's bound on max_abs) and check_lse_max_abs;
//               stage 09's fwd+bwd rows sum_of_medians_ms (its forward's and backward's medians
//               added) and its deterministic rows time_over_atomic (their median over the atomic
//               backward's); stage 10's rows Hk (key/value heads), spec and note, time_over_causal
//               (--model07 rows: their median over the plain causal kernel's in the same pass),
//               rate_over_dense_uniform (the packed rows: their TFLOP/s over the dense uniform
//               batch's), longest (stage10_varlen: its longest sequence) and uniform_length (the
//               uniform batch's rows: each sequence's tokens).
//   Fields since the split into bench_gpu/: warmup, repeat, l2_flush_bytes, compute_capability,
//   memory_bytes, l2_bytes, dtypes, stage07_steps, stage05_*, stage09_*, stage11_steps, skipped;
//   in results Hk, schedule_auto, check_nonfinite, check_zero_gradients, check_limit,
//   check_lse_max_abs, sum_of_medians_ms, time_over_atomic, time_over_causal,
//   rate_over_dense_uniform, longest, uniform_length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "../../stages/09_backward_kernel/attention.cuh"
#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/half.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/problem.hpp"
#include "fa/tensor.hpp"
#include "fa/timing.hpp"
#include "fa/varlen.hpp"

namespace bench {

// Stage 07 against stage 06: bf16 rounding of q, k, v, P and O leaves a relative L2 error of a
// few 1e-3 on these inputs; 2e-2 is far above that and far below what a wrong tile or a missed
// rescale gives. Stage 11's relative L2 bound against stage 07 is the same.
constexpr double kStage07GrossRelL2 = 2e-2;
// dO of the stage 09 and stage 10 points: normal, standard deviation 1, from its own seed (q, k,
// v use 1234).
constexpr uint64_t kDoutSeed = 4321;

// One --model07 point: query heads per key/value head, the window, the soft cap, the dropout p.
struct Model07 {
    std::string spec;  // as given: GROUP/LEFT/RIGHT[/SOFTCAP[/DROPOUT]]
    int64_t group = 1;
    fa::Window window = fa::Window::causal();
    double softcap = 0.0;
    double dropout = 0.0;

    // What its rows are called after "stage10_": the switches it turns on, joined by "_": "gqa8"
    // (Hq / Hk), "window4095" (LEFT; a right bound other than 0 adds "r" and it, "all" for -1),
    // "softcap50", "dropout0.1"; "causal" when none is on (the plain causal call).
    std::string variant() const;
};

// Parses one --model07 value; throws fa::InputError naming it when it is not one.
Model07 parse_model07(const std::string& spec);

// What the command line asks for (main.cpp's add_options), and what main.cpp settles from it
// before the sweep: the steps, the stage 10 points, the causal values, the stages that run.
struct Settings {
    std::vector<int64_t> sizes{512, 1024, 2048, 4096, 8192, 16384};
    std::vector<int64_t> head_dims{64, 128};
    std::vector<std::string> stages{"05", "06", "07"};
    std::vector<std::string> dtypes{"bf16", "fp16"};
    std::vector<std::string> step_args, step11_args, model07_args;  // --steps, --steps11, --model07 as given
    bool road05 = false;
    std::vector<int> steps09;
    bool steps09_backward_only = false;
    std::vector<int64_t> varlen07;
    std::string causal_mode = "both";
    int64_t tokens = 16384, width = 2048;
    int repeat = 30, warmup = 5;
    bool check = true;
    bool schedule_ablation = true;
    double mma_ceiling_tflops = 0;
    double wgmma_ceiling_tflops = 0;
    std::string json_path = "bench_gpu.json", csv_path = "bench_gpu.csv";

    // Settled from the above.
    std::vector<int> steps07, steps11;  // indices into the roads of stages 07 and 11
    std::vector<Model07> model07;
    std::vector<bool> causal_values;  // false, true or both, in that order
    bool has05 = false, has06 = false, has07 = false, has09 = false;
    bool has11 = false;  // asked for, built, and the GPU has Hopper's instructions
};

// The rows of each --steps09 step at a point: the backward with atomic dQ, the pair and the
// deterministic backward, or the first alone (--steps09-backward-only).
inline size_t rows_per_step09(const Settings& s) { return s.steps09_backward_only ? 1 : 3; }

// One row of the records: one implementation at one point in one pass.
struct Record {
    std::string impl;       // "stage05", "stage06", "stage07" (the final kernel), "stage07_step<i>",
                            // "stage09", "stage09_deterministic", "stage09_step<i>", "stage11" (the
                            // final kernel), "stage11_step<i>", "stage10_<variant>" (stage 10's switches)
    std::string pass = "forward";  // "forward"; stage 09 also "backward" and "fwd+bwd"
    std::string label;      // how the progress line names it; the impl when empty
    std::string dtype;      // "fp32", "bf16", "fp16"
    int step = -1;          // stage 07 (11): index into fa::stage07::road() (stage11::road()); -1 for the float32 stages
    std::string step_name;  // stage 07, 11 or, with --road05, stage 05: road()[step].name
    fa::Problem problem;
    double median_ms = 0, min_ms = 0, max_ms = 0, tflops = 0;
    int sm_clock_mhz = -1;
    double heavy_first_ms = -1;  // stage 06, causal: the same run with the query tiles heaviest first
    double in_order_ms = -1;     // stage 06, causal: and in order
    std::string schedule_auto;   // stage 06, causal: the order Schedule::Auto picks ("heavy_first", "in_order")
    std::string check;           // "ok", "BAD", or "" when not checked
    // Stage 07: against stage 06. Stage 11: O against stage 07's final kernel. Stage 09's backward
    // rows: deterministic against atomic, the worst of dq, dk, dv.
    double check_max_abs = -1, check_rel_l2 = -1;
    int64_t check_nonfinite = -1;  // NaN and inf in what was checked; -1: not counted
    double check_limit = -1;       // stage 11: the bound O's max_abs is held to
    double check_lse_max_abs = -1; // stage 11: LSE against stage 07's
    double dv_sum_rel = -1, dk_sum_ratio = -1;  // stage 09's backward rows: the two sums of the guard
    int zero_gradients = -1;                    // and how many gradients held no nonzero value
    double sum_of_medians_ms = -1;  // stage 09's fwd+bwd rows: the forward's median plus the backward's
    double time_over_atomic = -1;   // stage 09's deterministic rows: their median over the atomic backward's
    int64_t kv_heads = -1;          // stage 10's rows: Hk
    std::string spec;  // stage 10's --model07 rows: the point as given (GROUP/LEFT/RIGHT[/SOFTCAP[/DROPOUT]])
    std::string note;  // stage 10's rows: what the row measured beyond its columns, or "refused: " and why
    double time_over_causal = -1;         // stage 10's --model07 rows: median over the plain causal kernel's
    double rate_over_dense_uniform = -1;  // stage 10's packed rows: TFLOP/s over the dense uniform batch's
    int64_t longest = -1;                 // stage10_varlen: its longest sequence
    int64_t uniform_length = -1;          // the uniform batch's rows: tokens per sequence
};

// A row of `impl` at problem `p` timed by `t`, its TFLOP/s from fa::attention_flops for `pass`
// (the backward's and the pair's multiples for "backward" and "fwd+bwd"), the SM clock read now.
Record make_record(std::string impl, std::string dtype, const fa::Problem& p, const fa::TimingStats& t,
                   std::string pass = "forward");

// A kernel an entry point refused (a head dimension or step without a kernel), or stage 11 left out
// on a GPU without sm_90a: bench_gpu.json's "skipped".
struct Skip {
    std::string stage;      // "05", "06", "07", "09" or "11"
    std::string dtype;      // "" for the float32 stages and the whole of stage 11
    int step = -1;          // the step asked for; -1: the stage's default kernel
    int64_t head_dim = -1;  // -1: every point (stage 11 without a Hopper GPU)
    std::string reason;

    // How the progress line names it: "stage07 bf16 step 3 d=256", "stage05 d=64".
    std::string text() const;
};

// The sweep as it goes: its settings, the rows so far, the progress counter and the verdict.
class Sweep {
public:
    explicit Sweep(const Settings& settings) : s(settings) {}

    const Settings& s;
    std::vector<Record> records;
    std::vector<Skip> skipped;
    size_t points = 0;  // the progress lines planned: a refused kernel takes its own out
    size_t done = 0;    // and those printed
    bool any_bad = false;

    // fa::cuda::time_on_gpu with the sweep's warm-up and repeat.
    fa::TimingStats time(const std::function<void(cudaStream_t)>& launch) const;
    // Runs `launch` once untimed; false (with one line and one entry of `skipped`, once per kind)
    // when the entry point refuses the problem (fa::InputError: a head dimension or step that has
    // no kernel), so the sweep goes on without the `planned` points that launch stands for.
    bool supported(Skip what, const std::function<void(cudaStream_t)>& launch, size_t planned = 1);
    // Counts `r` done and prints its progress line (with its fraction of the ceiling asked for).
    void progress(const Record& r);
    // Notes a check's verdict: one failure makes the exit code 1.
    void verdict(bool ok) { any_bad = any_bad || !ok; }
};

// Stage 07's inputs in both 16-bit types, rounded once per shape from the float32 inputs.
struct HalfInputs {
    std::optional<fa::cuda::HalfTensors<__nv_bfloat16>> bf16;
    std::optional<fa::cuda::HalfTensors<__half>> fp16;
};

// What stage 09 needs at one shape in the 16-bit type T besides stage 07's q, k, v and o
// (HalfTensors): the forward's LSE, the upstream gradient dO and the three gradients, dense (B, H, N, d).
template <class T>
struct HalfBackward {
    using value_type = T;
    fa::cuda::DeviceBuffer<float> lse_buf;
    fa::cuda::DeviceBuffer<T> dout_buf, dq_buf, dk_buf, dv_buf;
    fa::View3<float> lse;     // (B, H, Nq): written by the forward, read by the backward
    fa::View4<const T> dout;  // (B, H, Nq, d)
    fa::View4<T> dq;          // (B, H, Nq, d)
    fa::View4<T> dk, dv;      // (B, H, Nk, d)

    // Allocates the tensors and rounds `dout_f32` (device, any strides) into dO.
    HalfBackward(const fa::Problem& p, fa::View4<const float> dout_f32)
        : lse_buf(size_t(p.lse_elems())), dout_buf(size_t(p.q_elems())), dq_buf(size_t(p.q_elems())),
          dk_buf(size_t(p.kv_elems())), dv_buf(size_t(p.kv_elems())) {
        const auto dense = [&](T* data, int64_t rows) {
            return fa::make_view(data, p.batch, p.heads, rows, p.head_dim, fa::Layout::BHND);
        };
        lse = fa::make_view3(lse_buf.data(), p.batch, p.heads, p.seq_q);
        fa::cuda::convert(dout_f32, dense(dout_buf.data(), p.seq_q));
        dout = dense(dout_buf.data(), p.seq_q);
        dq = dense(dq_buf.data(), p.seq_q);
        dk = dense(dk_buf.data(), p.seq_k);
        dv = dense(dv_buf.data(), p.seq_k);
    }
    // Fills dq, dk and dv with NaN (all bits set), so an element the backward forgets stays NaN.
    void poison_gradients() const {
        for (const fa::cuda::DeviceBuffer<T>* b : {&dq_buf, &dk_buf, &dv_buf}) FA_CUDA_CHECK(cudaMemset(b->data(), 0xff, b->bytes()));
    }
};

// Stage 09's tensors in both 16-bit types.
struct HalfGradients {
    std::optional<HalfBackward<__nv_bfloat16>> bf16;
    std::optional<HalfBackward<__half>> fp16;
};

// The device tensors of one shape (B, H, N, d), made once and shared by every stage timed there.
struct ShapeTensors {
    fa::Problem p;                // the shape; its causal flag is set point by point
    fa::cuda::DeviceTensors dev;  // float32 q, k, v (normal, seed 1234), o, lse: stages 05 and 06
    // A second float32 output: stage 05's final kernel while its road or stage 06 runs, stage 07's
    // and stage 11's results widened for their checks.
    fa::cuda::DeviceBuffer<float> o_other;
    fa::View4<float> o_other_view;  // (B, H, Nq, d) dense
    // Stage 11's reference: stage 07's final kernel's O (widened to float32) and LSE at each point.
    fa::cuda::DeviceBuffer<float> o11_ref, lse11_ref;
    HalfInputs half;  // q, k, v rounded into each of --dtypes, for stages 07, 09, 10 and 11
    // Stage 09: dO rounded into each type beside the LSE and gradients, one workspace for every
    // call at this shape, and a float32 scratch where the guard widens the gradients.
    HalfGradients grads;
    fa::stage09::Workspace workspace09;
    fa::cuda::DeviceBuffer<float> scratch09;

    ShapeTensors(const fa::Problem& shape, const Settings& s);
};

// A device array of floats, copied to the host.
std::vector<float> to_host(const float* device, int64_t n);

// Largest |a - b| over two equally long device arrays (NaN counts as the worst).
double max_abs_diff(const float* a, const float* b, int64_t n);

// The stages' parts of a point, in the order the sweep runs them (main.cpp). Each times its
// rows, prints their lines and checks them.
//
// Stages 05 and 06 in float32 (and stage 05's road with --road05); true when stage 06's output of
// this point is left in dev.o, the reference stage 07 is checked against.
bool time_fp32(Sweep& sweep, ShapeTensors& shape);
// Stage 07's steps in each 16-bit type, checked against stage 06's float32 output.
void time_stage07(Sweep& sweep, ShapeTensors& shape, bool have_reference);
// Stage 10's --model07 points beside the plain causal kernels (forward; with stage 09 the backward).
void time_stage10_points(Sweep& sweep, ShapeTensors& shape);
// Stage 10's --varlen07 batch at each head dimension and type, before the sweep.
void time_stage10_varlen(Sweep& sweep);
// Stage 11's steps in each 16-bit type, checked against stage 07's final kernel.
void time_stage11(Sweep& sweep, ShapeTensors& shape);
// Stage 09: the forward, the backward in both dQ modes, the pair, the guard; then --steps09.
void time_stage09(Sweep& sweep, ShapeTensors& shape);

// Writes bench_gpu.json and bench_gpu.csv (--json, --csv) of the run on `gpu` that began on `date`;
// false (and one line) when either cannot be written.
bool write_records(const Sweep& sweep, const fa::cuda::GpuInfo& gpu, const std::string& date);

}  // namespace bench
