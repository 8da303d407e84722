/// \file cli.hpp
/// \brief The command line every stage executable shares (CLI11).
#pragma once

#include <cstdint>
#include <string>

#include "fa/inputs.hpp"
#include "fa/problem.hpp"
#include "fa/tensor.hpp"

// CLI11's own header costs some six seconds of compile time a file: the files that build a command
// line (cli.cpp, stage.cpp, the stages' main.cpp) include it, the rest see these names alone.
namespace CLI {
class App;
class Validator;
}  // namespace CLI

namespace fa {

/// When the float64 golden reference runs.
enum class ReferenceMode {
    Auto,    ///< when it costs at most kReferenceFlopBudget operations
    Always,  ///< always, however long it takes
    Never,   ///< never
};

/// Largest reference cost that ReferenceMode::Auto accepts (a few seconds on one core).
inline constexpr double kReferenceFlopBudget = 2e10;

/// The problem an executable solves when no size option is given: B=1, H=4, Nq=Nk=512, d=64.
inline Problem default_problem() {
    Problem p;
    p.heads = 4;
    p.seq_q = 512;
    p.seq_k = 512;
    p.head_dim = 64;
    return p;
}

/// Values of the options shared by all stages.
struct CommonOptions {
    /// --batch --heads --seq-q --seq-k --head-dim --scale --causal; a default problem small
    /// enough for every stage to run in well under a second.
    Problem problem = default_problem();
    Layout layout = Layout::BHND;             ///< --layout
    InputKind inputs = InputKind::Normal;     ///< --inputs
    uint64_t seed = 42;                       ///< --seed
    std::string load_dir;                     ///< --load: read q.npy k.npy v.npy from here
    std::string save_dir;                     ///< --save: write q k v o lse .npy here
    bool bench = false;                       ///< --bench: time with warm-up and a median
    int repeat = 20;                          ///< --repeat: timed repetitions for --bench
    int warmup = 3;                           ///< --warmup: untimed repetitions for --bench
    ReferenceMode reference = ReferenceMode::Auto;  ///< --reference
    std::string json_path;                    ///< --json: append one result record (JSON Lines)
};

/// Registers the shared options on `app` with their ranges, writing into `options`: the problem's
/// (--batch --heads --seq-q --seq-k --head-dim --scale --causal --layout --load --save) and
/// add_run_options()'s.
void add_common_options(CLI::App& app, CommonOptions& options);

/// Registers the options of how a stage runs, whatever its problem: --seed --inputs --bench
/// --repeat --warmup --reference --json. A stage whose problem is not one dense (B, H, N, d) block
/// (stage 10's packed batches) takes these and describes its problem with options of its own.
void add_run_options(CLI::App& app, CommonOptions& options);

/// A CLI11 check that the text is a finite number (--scale, --softcap): "must be a finite number,
/// got 'nan'".
CLI::Validator finite_number();

/// Parses `argv` with `app`. Returns -1 when the program should continue; otherwise the exit
/// code to return: 0 after --help, kExitBadInput after an error, with the message printed
/// (the message names the option and the allowed values).
int parse_command_line(CLI::App& app, int argc, char** argv);

}  // namespace fa
