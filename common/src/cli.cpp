#include "fa/cli.hpp"

#include <cmath>

#include <CLI/CLI.hpp>

#include "fa/error.hpp"

namespace fa {

CLI::Validator finite_number() {
    return CLI::Validator(
        [](std::string& text) {
            try {
                size_t used = 0;
                const double value = std::stod(text, &used);
                if (used == text.size() && std::isfinite(value)) return std::string();
            } catch (const std::exception&) {
            }
            return "must be a finite number, got '" + text + "'";
        },
        "FINITE", "finite");
}

void add_run_options(CLI::App& app, CommonOptions& o) {
    app.add_option("--seed", o.seed, "seed of the random inputs")->capture_default_str();
    app.add_option_function<std::string>(
           "--inputs", [&o](const std::string& v) { o.inputs = v == "large" ? InputKind::Large : InputKind::Normal; },
           "input values: normal (N(0,1)) or large (N(0,1) * 20, so scores overflow exp in float32); default normal")
        ->check(CLI::IsMember({"normal", "large"}))
        ->type_name("normal|large");
    app.add_flag("--bench", o.bench, "time the stage: warm-up runs, then the median of --repeat runs");
    app.add_option("--repeat", o.repeat, "timed repetitions for --bench")->check(CLI::Range(1, 10000))->capture_default_str();
    app.add_option("--warmup", o.warmup, "untimed repetitions before timing")->check(CLI::Range(0, 1000))->capture_default_str();
    app.add_option_function<std::string>(
           "--reference",
           [&o](const std::string& v) {
               o.reference = v == "always" ? ReferenceMode::Always : v == "never" ? ReferenceMode::Never : ReferenceMode::Auto;
           },
           "run the float64 golden reference: auto (when it costs <= 2e10 FLOP), always or never; default auto")
        ->check(CLI::IsMember({"auto", "always", "never"}))
        ->type_name("auto|always|never");
    app.add_option("--json", o.json_path, "append one JSON line with the problem, time and memory to this file");
}

void add_common_options(CLI::App& app, CommonOptions& o) {
    app.add_option("--batch", o.problem.batch, "B: independent sequences")->check(CLI::Range(int64_t{1}, int64_t{65536}))->capture_default_str();
    app.add_option("--heads", o.problem.heads, "H: attention heads")->check(CLI::Range(int64_t{1}, int64_t{4096}))->capture_default_str();
    app.add_option("--seq-q", o.problem.seq_q, "Nq: query rows per head")->check(CLI::Range(int64_t{1}, int64_t{1} << 24))->capture_default_str();
    app.add_option("--seq-k", o.problem.seq_k, "Nk: key/value rows per head")->check(CLI::Range(int64_t{1}, int64_t{1} << 24))->capture_default_str();
    app.add_option("--head-dim", o.problem.head_dim, "d: features per head (the stage may allow fewer values)")->check(CLI::Range(int64_t{1}, int64_t{65536}))->capture_default_str();
    app.add_option_function<double>(
           "--scale", [&o](const double& s) { o.problem.scale = s; },
           "softmax scale applied to Q K^T (default 1/sqrt(head_dim))")
        ->check(finite_number());
    app.add_flag("--causal", o.problem.causal, "causal mask, bottom-right aligned: query i sees key j iff j <= i + Nk - Nq");
    app.add_option_function<std::string>(
           "--layout", [&o](const std::string& v) { o.layout = v == "bnhd" ? Layout::BNHD : Layout::BHND; },
           "memory layout of q, k, v, o: bhnd (PyTorch) or bnhd (flash-attn); default bhnd")
        ->check(CLI::IsMember({"bhnd", "bnhd"}))
        ->type_name("bhnd|bnhd");
    app.add_option("--load", o.load_dir, "read q.npy k.npy v.npy (float32 or float16, shapes (B,H,N,d)) from this directory")
        ->check(CLI::ExistingDirectory);
    app.add_option("--save", o.save_dir, "write q.npy k.npy v.npy o.npy lse.npy (float32, (B,H,N,d)) to this directory")
        ->check(CLI::ExistingDirectory);
    add_run_options(app, o);
}

int parse_command_line(CLI::App& app, int argc, char** argv) {
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        app.exit(e);  // prints the message naming the option
        return kExitBadInput;
    }
    return -1;
}

}  // namespace fa
