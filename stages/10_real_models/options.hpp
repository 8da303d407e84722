/// \file stages/10_real_models/options.hpp
/// \brief Stage 10's command line and inputs, host code only: a packed call as a model makes it
/// (sequence lengths, grouped heads, a window, the soft cap, dropout), read from options or from
/// .npy files, checked before any GPU is touched.
///
/// The kernels are stage 07's and stage 09's (their stage 10 switches); what this file adds is
/// the problem they are called with and the counts the report gives: the work a packed call does
/// against the same batch padded to its longest sequence, and the tiles a window skips.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fa/cli.hpp"
#include "fa/inputs.hpp"
#include "fa/precision.hpp"
#include "fa/tensor.hpp"
#include "fa/varlen.hpp"

namespace fa::stage10 {

/// The default batch: five sequences of different lengths (one of a single token), as a server
/// packs them.
inline constexpr const char* kDefaultSeqlens = "300,41,700,1,128";

/// Everything the command line says.
struct Options {
    CommonOptions run;                     ///< --seed --inputs --bench --repeat --warmup --reference --json
    std::string seqlens = kDefaultSeqlens;  ///< --seqlens: queries per sequence
    std::string seqlens_k;                 ///< --seqlens-k: keys per sequence ("": as --seqlens)
    int64_t heads = 8;                     ///< --heads: Hq
    int64_t kv_heads = 2;                  ///< --kv-heads: Hk, dividing Hq
    int64_t head_dim = 64;                 ///< --head-dim: d
    std::optional<double> scale;           ///< --scale (default 1/sqrt(d))
    Precision precision = Precision::BFloat16;  ///< --dtype bf16|fp16
    bool causal = false;                   ///< --causal: the window (-1, 0)
    std::string window;                    ///< --window L,R ("": none)
    double softcap = 0.0;                  ///< --softcap C
    double dropout = 0.0;                  ///< --dropout P
    uint64_t dropout_seed = 0;             ///< --dropout-seed S (required with --dropout)
    uint32_t dropout_offset = 0;           ///< --dropout-offset
    bool deterministic = false;            ///< --deterministic: dQ added in a fixed order
    bool forward_only = false;             ///< --forward-only: stage 07's forward alone
    std::string load_dir;                  ///< --load DIR
    std::string save_dir;                  ///< --save DIR
};

/// Registers stage 10's options on `app`, writing into `options`.
void add_options(CLI::App& app, Options& options);

/// The lengths of a comma-separated list ("100,2000,1"): at least one, each a whole number from 0
/// to 2^31 - 1. InputError naming `option` and what is allowed otherwise.
std::vector<int64_t> parse_lengths(const std::string& text, const std::string& option);

/// The window of "L,R" (-1: unbounded on that side). InputError naming --window otherwise.
Window parse_window(const std::string& text);

/// A packed call's problem and its inputs, from the options or from --load.
struct PackedInputs {
    VarlenProblem problem;           ///< lengths, heads, d and the model's options
    Inputs in;                       ///< q (1, Hq, total_q, d), k, v (1, Hk, total_k, d), BNHD: packed buffers
    std::optional<HostTensor> dout;  ///< do.npy when --load had one: (1, Hq, total_q, d)
    std::string how;                 ///< where the inputs came from, for the report
};

/// The packed problem the options describe (lengths from --seqlens and --seqlens-k, or `loaded`
/// cu_seqlens when given), with the window (causal folded in), the cap and dropout. Throws
/// InputError naming the option for anything that cannot apply: lists of different counts, --dropout
/// without --dropout-seed, --dropout-seed without --dropout, a window with --causal whose right
/// bound is not 0; then VarlenProblem::validate().
VarlenProblem make_problem(const Options& options, const CLI::App& app);

/// Reads DIR/q.npy (total_q, Hq, d), k.npy and v.npy (total_k, Hk, d), do.npy when present (like
/// q), and cu_seqlens_q.npy / cu_seqlens_k.npy (int32, B+1) when present; without them the lengths
/// come from --seqlens (and --seqlens-k), which must then add up to the files' rows. Options that
/// disagree with the files (--heads, --kv-heads, --head-dim) are refused, not overridden. Values
/// must be finite. InputError naming the file and what it should be otherwise.
PackedInputs load_packed(const Options& options, const CLI::App& app);

/// Seeded random inputs for the options' problem (make_varlen_inputs()).
PackedInputs make_packed(const Options& options, const CLI::App& app);

/// Checks what the kernels take: the head dimension among `forward_dims` (stage 07's
/// supported_head_dims()) and, unless `forward_only`, `backward_dims` (stage 09's), and stage 07's
/// resolve_varlen() (Hk dividing Hq, the window, the cap, dropout's p). The backward's own
/// refusals (stage 09's resolve_varlen_backward()) are checked by check_backward() (runner.cuh).
void check_supported(const VarlenProblem& problem, bool forward_only, const std::vector<int>& forward_dims,
                     const std::vector<int>& backward_dims);

/// Tile classes of stage 06 for a packed call with query tiles of `br` rows and key tiles of `bc`
/// keys, counted over every sequence and query head: a tile whose keys no row of it sees is
/// skipped, one where every row sees every key is full (no mask), the others are masked.
struct TileCounts {
    int64_t skipped = 0;  ///< never loaded
    int64_t masked = 0;   ///< computed with the mask
    int64_t full = 0;     ///< computed without a mask
    /// All tiles of the per-sequence grids.
    int64_t total() const { return skipped + masked + full; }
};

/// Counts the tiles of `problem` (see TileCounts).
TileCounts count_tiles(const VarlenProblem& problem, int64_t br, int64_t bc);

/// The work of a packed call and of the same batch padded to its longest sequences, per query
/// head, in (query, key) pairs: the real ones (visible_pairs_per_head()), all pairs of every
/// sequence (sum of Nq Nk, what a kernel without masks computes), and B max Nq max Nk.
struct PairCounts {
    int64_t visible = 0;  ///< pairs the window lets through
    int64_t packed = 0;   ///< sum over sequences of Nq Nk
    int64_t padded = 0;   ///< B max Nq max Nk
};

/// Counts the pairs of `problem` (see PairCounts).
PairCounts count_pairs(const VarlenProblem& problem);

}  // namespace fa::stage10
