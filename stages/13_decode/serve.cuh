/// \file stages/13_decode/serve.cuh
/// \brief The serving loop on the GPU (`stage13_decode --serve`): the scheduler of serve.hpp
/// plans each step, and this runs it. Each admitted request's prompt (q, k, v from
/// serve_values.hpp) goes through the course's prefill kernel, causal (stage 11's forward on a
/// Hopper GPU, stage 07's elsewhere), and its K and V are written into its pages through its block
/// table; then the running batch decodes one token through decode_device(), which appends each new
/// K and V row into the pages in place. Every decode step is timed with CUDA events, the whole
/// loop on the wall clock; one step is read back for the closing check (ServeSample).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fa/precision.hpp"
#include "fa/timing.hpp"
#include "serve.hpp"

namespace fa::stage13 {

/// Which kernel computes the prompts' attention.
enum class PrefillKernel {
    Auto,     ///< stage 11 where the GPU runs sm_90a, stage 07 elsewhere
    Stage11,  ///< stage 11's forward (Hopper: TMA, wgmma); grouped heads repeated to Hq first
    Stage07,  ///< stage 07's forward (mma.sync), with stage 10's grouped heads
};

/// The heads and the 16-bit type of the loop.
struct ServeShape {
    int64_t heads_q = 32;   ///< Hq
    int64_t heads_k = 8;    ///< Hk, dividing Hq
    int64_t head_dim = 128; ///< d, 64 or 128
    Precision precision = Precision::BFloat16;  ///< bf16 or fp16
};

/// What the loop measured.
struct ServeResult {
    std::string prefill;            ///< the prefill kernel that ran, in words
    int64_t steps = 0;              ///< decode steps
    int64_t decode_tokens = 0;      ///< tokens decoded (one per running sequence and step)
    int64_t prefill_tokens = 0;     ///< prompt tokens written
    int64_t peak_running = 0;       ///< the largest batch
    int64_t peak_pages = 0;         ///< the most pages in use at once
    int64_t keys_at_peak = 0;       ///< the keys they held
    double wall_s = 0;              ///< the loop on the wall clock, the closing read-back left out
    double prefill_attention_ms = 0;  ///< CUDA events: the prompts' attention (and the head repeat for stage 11)
    double prefill_flops = 0;       ///< its FLOPs (causal: 2 Hq L^2 d per prompt)
    double page_write_ms = 0;       ///< CUDA events: the prompts' K and V written into their pages
    TimingStats attention;          ///< CUDA events per decode step (append, split kernel, combine)
    double attention_total_ms = 0;  ///< their sum
    double decode_kv_bytes = 0;     ///< K and V read by all decode steps (bf16/fp16)
    ServeSample sample;             ///< the step read back for the check
};

/// "" when `kernel` can run here; otherwise why not (stage 11 without sm_90a).
std::string prefill_unavailable_reason(PrefillKernel kernel);

/// Runs the loop. `config` and `shape` must be valid (ServeConfig::validate(), the heads checked by
/// make_decode_problem()); `progress` prints a line on stderr about once a second.
ServeResult run_serve(const ServeConfig& config, const ServeShape& shape, PrefillKernel kernel, bool progress);

/// Device bytes the loop allocates: the pool, one prompt's scratch, the step's tensors.
double serve_device_bytes(const ServeConfig& config, const ServeShape& shape);

}  // namespace fa::stage13
