/// \file stage.hpp
/// \brief The driver shared by every stage executable: inputs, runs, checks, report, verdict.
///
/// A stage's main.cpp describes itself in a StageSpec and hands it to run_stage(). The driver
/// parses the shared command line, makes or loads the inputs, runs the stage, runs the stage(s)
/// it is checked against and the float64 reference where affordable, prints the report and
/// returns the exit code: 0 pass, 1 mismatch, 2 bad input, 77 no GPU. A backward stage (one that
/// sets StageSpec::run_backward) gets the same, for its gradients dQ, dK and dV.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "fa/cli.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/precision.hpp"
#include "fa/problem.hpp"
#include "fa/tensor.hpp"
#include "fa/timing.hpp"

namespace fa {

/// The entry point every stage offers on the host: read q, k, v; write o and lse.
using AttentionFn = std::function<void(const Problem&, View4<const float> q, View4<const float> k,
                                       View4<const float> v, View4<float> o, View3<float> lse)>;

/// The entry point every backward stage offers on the host: read q, k, v, the forward's o and
/// lse, and the upstream gradient dO; write dq, dk and dv.
using BackwardFn = std::function<void(const Problem&, View4<const float> q, View4<const float> k, View4<const float> v,
                                      View4<const float> o, View3<const float> lse, View4<const float> dout,
                                      View4<float> dq, View4<float> dk, View4<float> dv)>;

/// Another backward implementation a backward stage is checked against.
struct BackwardComparison {
    std::string name;                             ///< e.g. "stage 08 (backward on the CPU)"
    BackwardFn run;                               ///< its entry point
    std::function<bool(const Problem&)> applies;  ///< empty: always
    /// The forward whose O and LSE it reads; empty: the stage's own forward (StageSpec::run).
    /// A float32 backward checked against a 16-bit one needs its own float32 forward: it
    /// recomputes P from float32 scores, which must match the LSE it is given.
    AttentionFn forward;
};

/// Another implementation a stage is checked against. Where it returns NaN or inf and the
/// float64 reference (or, when the reference does not run, this stage) is finite, it overflowed
/// on these inputs (stage 01's naive softmax on large scores): the report says so and leaves it
/// out of the verdict, which rests on the other comparisons.
struct Comparison {
    std::string name;                             ///< e.g. "stage 03 (online softmax)"
    AttentionFn run;                              ///< its entry point
    std::function<bool(const Problem&)> applies;  ///< empty: always
};

/// Everything the driver needs to know about one stage.
struct StageSpec {
    std::string number;       ///< "04"
    std::string title;        ///< "CPU tiling"
    std::string description;  ///< one paragraph for --help
    /// This stage's entry point; for a backward stage, the forward that produces the O and LSE
    /// its backward reads (an earlier stage's, named in `forward_name`).
    AttentionFn run;
    /// Set for a backward stage: its gradients are what is run, timed and checked (against
    /// `backward_checked_against` and the float64 reference_backward()), by gradient_tolerance().
    BackwardFn run_backward;
    std::string forward_name;  ///< backward stages: whose forward `run` is, e.g. "stage 04 (CPU tiling)"
    std::vector<BackwardComparison> backward_checked_against;  ///< backward stages: earlier backward stage(s)
    std::vector<Comparison> checked_against;  ///< previous stage(s)
    /// Throws InputError if this stage cannot solve `problem` (unsupported head_dim, ...).
    std::function<void(const Problem&)> check_supported;
    /// Extra memory this stage allocates beyond its inputs and outputs (q, k, v, o, lse; and dO,
    /// dQ, dK, dV for a backward stage), in bytes.
    std::function<double(const Problem&)> intermediate_bytes;
    std::string intermediate_what;  ///< what that memory holds, e.g. "S and P, N x N per head"
    /// The stage's own settings for `problem` in one line (block sizes, tile counts, ...),
    /// printed in the report.
    std::function<std::string(const Problem&)> describe_config;
    /// exp of raw scores: where the scores can pass ln(FLT_MAX) ~ 88.7, overflow is the lesson
    /// (reported, exit 0), not a mismatch.
    bool naive_softmax = false;
    /// The precision this stage computes its products in, asked once the command line is parsed
    /// (a stage binds it to its own `--dtype` option); empty means Float32. For bf16 and fp16,
    /// every comparison (against earlier float32 stages too) is judged by
    /// low_precision_tolerance(), from naive attention emulated in that precision when the
    /// float64 reference runs, and by the looser a priori rounding_tolerance() when it does not.
    std::function<Precision()> precision;
    bool needs_gpu = false;         ///< skip with one line when no GPU is present
    /// Returns "" when a usable GPU is present, otherwise why not (one line).
    std::function<std::string()> gpu_unavailable_reason;
    /// Registers the stage's own options.
    std::function<void(CLI::App&)> add_options;
    /// Checks the stage's own options after parsing; throws InputError when out of range.
    std::function<void(const CommonOptions&)> validate_options;
    /// Custom timing (GPU stages time with CUDA events); empty means host wall clock.
    std::function<TimingStats(const Problem&, const Inputs&, const CommonOptions&)> bench;
    /// Backward stages: custom timing of the backward alone, given the forward's o and lse and
    /// dO (GPU stages time with CUDA events); empty means host wall clock.
    std::function<TimingStats(const Problem&, const Inputs&, View4<const float> o, View3<const float> lse,
                              View4<const float> dout, const CommonOptions&)>
        bench_backward;
    /// Extra lines printed after the benchmark (e.g. a GEMM ceiling to compare with).
    std::function<void(const Problem&, const TimingStats&)> after_bench;
};

/// One row of a stage's report: what was compared, how far apart, the limits, the verdict.
struct Check {
    std::string what;    ///< e.g. "O   vs float64 reference"
    Metrics metrics;     ///< the errors
    Tolerance tol;       ///< the limits
    bool ok;             ///< within them
    const char* tensor;  ///< "O", "LSE", "dQ", "dK" or "dV"
};

/// Prints the table of checks: a header, then one row per check with its metrics and "ok" or
/// "FAIL", the labels padded so the columns line up.
void print_checks(const std::vector<Check>& checks);

/// Runs the stage described by `spec` with the command line `argv`; returns the exit code.
int run_stage(int argc, char** argv, const StageSpec& spec);

}  // namespace fa
