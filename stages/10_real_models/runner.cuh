/// \file stages/10_real_models/runner.cuh
/// \brief Stage 10 on the GPU: a packed call through stage 07's forward and stage 09's backward
/// (their stage 10 switches), the same batch one sequence at a time through their dense calls,
/// and the timings of the packed call against the batch padded to its longest sequences.
///
/// Every tensor crosses the boundary in float32 in the packed orders of fa/reference_ext.hpp (q,
/// o, dO, dQ (total_q, Hq, d); k, v, dK, dV (total_k, Hk, d); the LSE (Hq, total_q)) and is
/// rounded to the 16-bit type on the device, as stage 09's host entry point does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fa/inputs.hpp"
#include "fa/precision.hpp"
#include "fa/tensor.hpp"
#include "fa/timing.hpp"
#include "fa/varlen.hpp"

namespace fa::stage10 {

/// The query and key tile of stage 07's final kernel at head dimension `d` (Br, Bc).
struct TileShape {
    int br = 0;  ///< query rows per block
    int bc = 0;  ///< keys per tile
};

/// Stage 07's tile at head dimension `d` (32, 64, 128, 256).
TileShape forward_tile(int64_t d);

/// Head dimensions of stage 07's forward and of stage 09's backward.
const std::vector<int>& forward_head_dims();
/// \copydoc forward_head_dims()
const std::vector<int>& backward_head_dims();

/// Stage 09's refusals of a packed call (stage09::resolve_varlen_backward(): InputError for
/// dropout while its backward does not apply it). Host code: runs without a GPU.
void check_backward(const VarlenProblem& problem);

/// What one run gives back, in float32, in the packed orders.
struct RunResult {
    std::vector<float> o;    ///< (total_q, Hq, d)
    std::vector<float> lse;  ///< (Hq, total_q)
    std::vector<float> dq;   ///< (total_q, Hq, d); empty without the backward
    std::vector<float> dk;   ///< (total_k, Hk, d)
    std::vector<float> dv;   ///< (total_k, Hk, d)
};

/// How a run goes: the type, the backward or not, and its dQ mode.
struct RunSettings {
    Precision precision = Precision::BFloat16;  ///< BFloat16 or Float16
    bool backward = true;                       ///< run stage 09's backward after the forward
    bool deterministic = false;                 ///< dQ in a fixed order
};

/// The packed call: stage07::attention_varlen_device(), then (with `backward`)
/// stage09::attention_backward_varlen_device() on its O and LSE with `dout` (1, Hq, total_q, d).
RunResult run_packed(const VarlenProblem& problem, const Inputs& in, const HostTensor& dout, const RunSettings& settings);

/// The same batch one sequence at a time, as a framework without packed calls runs it: for each
/// sequence with queries and keys, stage 07's and stage 09's dense calls on a batch of one (views
/// into the packed buffers, no copy), with K and V repeated per query head (Hk = Hq: the plain
/// multi-head call) and the window and the cap of `problem`; dK and dV of the repeated heads are
/// summed over each group. Rows of sequences without keys get O = 0, LSE = -inf and dQ = 0, keys
/// of sequences without queries dK = dV = 0 (a dense call needs at least one of each). No dropout:
/// a dense call's mask counts batch entries, a packed one's sequences.
RunResult run_per_sequence(const VarlenProblem& problem, const Inputs& in, const HostTensor& dout,
                           const RunSettings& settings);

/// --bench: CUDA-event medians of the packed forward and backward, and of the dense calls on the
/// same batch padded to its longest sequences (B, Hq, max Nq, max Nk; the same options, windows
/// aligned to the padded lengths).
struct PackedTimes {
    TimingStats forward;                  ///< packed forward
    std::optional<TimingStats> backward;  ///< packed backward alone (with `backward`)
    TimingStats padded_forward;           ///< padded forward
    std::optional<TimingStats> padded_backward;  ///< padded backward alone
};

/// Times the packed and padded calls of `problem` (see PackedTimes).
PackedTimes bench_packed(const VarlenProblem& problem, const Inputs& in, const HostTensor& dout, const RunSettings& settings,
                         int warmup, int repeat);

/// The GPU and its SM clock, one line each, for the report after --bench.
std::string describe_gpu();

}  // namespace fa::stage10
