// Stage 10 executable: what real models call. A packed batch of sequences of different lengths
// (cu_seqlens) with grouped-query heads, a sliding window, the soft cap and dropout, through stage
// 07's forward and stage 09's backward on the GPU; checked against the float64 reference by the
// low-precision rules and against the same kernels' dense calls, one sequence at a time.
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "fa/counts.hpp"
#include "fa/cuda/device.hpp"
#include "fa/error.hpp"
#include "fa/json.hpp"
#include "fa/npy.hpp"
#include "fa/reference_ext.hpp"
#include "fa/stage.hpp"
#include "fa/tolerance.hpp"
#include "options.hpp"
#include "runner.cuh"

namespace {

using namespace fa;

// The rows of a report's checks for O and LSE (and the gradients) of `got` against `want`.
template <class Ref>
void add_checks(std::vector<Check>& checks, const std::string& against, const stage10::RunResult& got, const Ref& o,
                const Ref& lse, const Tolerances& tol) {
    Check co{"O   vs " + against, compare(got.o, o), tol.o, false, "O"};
    Check cl{"LSE vs " + against, compare(got.lse, lse), tol.lse, false, "LSE"};
    for (Check* c : {&co, &cl}) c->ok = passes(c->metrics, c->tol), checks.push_back(*c);
}

template <class Ref>
void add_gradient_checks(std::vector<Check>& checks, const std::string& against, const stage10::RunResult& got,
                         const Ref& dq, const Ref& dk, const Ref& dv, const GradientTolerances& tol) {
    const std::vector<float>* g[3] = {&got.dq, &got.dk, &got.dv};
    const Ref* r[3] = {&dq, &dk, &dv};
    const Tolerance* t[3] = {&tol.dq, &tol.dk, &tol.dv};
    const char* names[3] = {"dQ", "dK", "dV"};
    for (int i = 0; i < 3; ++i) {
        Check c{std::string(names[i]) + "  vs " + against, compare(*g[i], *r[i]), *t[i], false, names[i]};
        c.ok = passes(c.metrics, c.tol);
        checks.push_back(c);
    }
}

double max_abs_of(const std::vector<float>& x) {
    double m = 0;
    for (float v : x)
        if (std::isfinite(v)) m = std::max(m, double(std::abs(v)));
    return m;
}

// The dense problem the tolerances' sizes are read from: the longest sequences, Hq heads.
Problem bounds_problem(const VarlenProblem& vp) {
    Problem p;
    p.batch = 1, p.heads = vp.heads_q, p.seq_q = std::max<int64_t>(1, vp.max_seq_q()), p.seq_k = std::max<int64_t>(1, vp.max_seq_k());
    p.head_dim = vp.head_dim, p.scale = vp.scale;
    return p;
}

std::string percent(double part, double whole) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%%", whole > 0 ? 100.0 * part / whole : 0.0);
    return buf;
}

void print_rule(const std::string& text) {
    std::string rule = text;  // one line per part of the rule, indented under the limits
    for (size_t at = rule.find('\n'); at != std::string::npos; at = rule.find('\n', at + 1)) rule.insert(at + 1, 11, ' ');
    std::printf("           %s\n", rule.c_str());
}

// Writes a packed float32 tensor (total, heads, d).
void save_packed(const std::string& path, const std::vector<float>& x, int64_t total, int64_t heads, int64_t d) {
    write_npy(path, {total, heads, d}, x);
}

int run(const stage10::Options& opt, const CLI::App& app) {
    // Everything that can be refused is refused before a GPU is looked for, so that the refusals
    // read the same on every machine.
    stage10::PackedInputs pin;
    if (!opt.load_dir.empty()) {
        pin = stage10::load_packed(opt, app);
    } else {
        pin.problem = stage10::make_problem(opt, app);
    }
    const VarlenProblem& vp = pin.problem;
    stage10::check_supported(vp, opt.forward_only, stage10::forward_head_dims(), stage10::backward_head_dims());
    if (!opt.forward_only) stage10::check_backward(vp);
    if (const std::string reason = cuda::gpu_unavailable_reason(); !reason.empty()) {
        std::printf("skipped: stage 10 needs a CUDA GPU (%s)\n", reason.c_str());
        return kExitSkipped;
    }
    if (opt.load_dir.empty()) pin = stage10::make_packed(opt, app);  // the same problem, now with its inputs
    const bool backward = !opt.forward_only;
    const HostTensor dout = pin.dout ? *pin.dout : make_varlen_output_gradient(vp, opt.run.seed);
    require_finite(dout.cview(), "dO");
    const Precision precision = opt.precision;
    const stage10::RunSettings settings{precision, backward, opt.deterministic};

    std::printf("problem    %s\n", vp.describe().c_str());
    std::printf("inputs     %s\n", pin.how.c_str());
    std::printf("kernels    stage 07's packed forward%s, in %s\n",
                backward ? (std::string(" and stage 09's packed backward (dQ ") + (opt.deterministic ? "in a fixed order)" : "by atomic additions)")).c_str()
                         : " alone (--forward-only)",
                to_string(precision).c_str());
    if (backward) std::printf("gradient   dO %s\n", pin.dout ? ("loaded from " + opt.load_dir + "/do.npy").c_str()
                                                          : ("standard normal random, seed " + std::to_string(opt.run.seed)).c_str());

    // The work: the real pairs against what the sequences' full blocks and the padded batch cost.
    const stage10::PairCounts pairs = stage10::count_pairs(vp);
    const double per_pair = 4.0 * double(vp.head_dim) * double(vp.heads_q);  // forward FLOPs of one (query, key) pair
    const double real = per_pair * double(pairs.visible), padded = per_pair * double(pairs.padded);
    std::printf("work       forward %s on the %lld (query, key) pairs each head sees (4 d Hq per pair; backward 2.5x);\n"
                "           %s if every sequence were padded to the longest (B max Nq max Nk = %lld pairs): %s of that is padding\n"
                "           or masked, %s padding alone\n",
                format_flops(real).c_str(), (long long)pairs.visible, format_flops(padded).c_str(), (long long)pairs.padded,
                percent(double(pairs.padded - pairs.visible), double(pairs.padded)).c_str(),
                percent(double(pairs.padded - pairs.packed), double(pairs.padded)).c_str());
    const stage10::TileShape tile = stage10::forward_tile(vp.head_dim);
    const stage10::TileCounts tiles = stage10::count_tiles(vp, tile.br, tile.bc);
    std::printf("tiles      stage 07's %d x %d tiles of every sequence and head: %lld full, %lld masked, %lld skipped (the window\n"
                "           and causality) of %lld; the padded batch would have %lld\n",
                tile.br, tile.bc, (long long)tiles.full, (long long)tiles.masked, (long long)tiles.skipped, (long long)tiles.total(),
                (long long)(vp.batch() * vp.heads_q * ceil_div(vp.max_seq_q(), int64_t(tile.br)) * ceil_div(vp.max_seq_k(), int64_t(tile.bc))));

    const stage10::RunResult got = stage10::run_packed(vp, pin.in, dout, settings);

    std::optional<stage10::PackedTimes> times;
    if (opt.run.bench) {
        times = stage10::bench_packed(vp, pin.in, dout, settings, std::max(opt.run.warmup, 1), opt.run.repeat);
        const auto line = [&](const char* what, const TimingStats& packed, const TimingStats& pad, double flops) {
            std::printf("bench      %s: packed %.4f ms (%.1f TFLOP/s of real work), padded %.4f ms: padded / packed = %.2f\n", what,
                        packed.median_ms, flops / packed.median_ms * 1e-9, pad.median_ms, pad.median_ms / packed.median_ms);
        };
        line("forward ", times->forward, times->padded_forward, real);
        if (times->backward && times->padded_backward) line("backward", *times->backward, *times->padded_backward, 2.5 * real);
        std::printf("           medians of %d runs after %d warm-up, CUDA events, L2 flushed\n", opt.run.repeat, std::max(opt.run.warmup, 1));
        std::printf("%s\n", stage10::describe_gpu().c_str());
    }

    // The float64 reference, where affordable, sets the limits through the naive 16-bit baselines.
    const double ref_cost = reference_varlen_flops(vp) * (backward ? 3.5 : 1.0);
    const bool run_reference = opt.run.reference == ReferenceMode::Always ||
                               (opt.run.reference == ReferenceMode::Auto && ref_cost <= kReferenceFlopBudget);
    const View4<const float> q = pin.in.q.cview(), k = pin.in.k.cview(), v = pin.in.v.cview(), dov = dout.cview();
    const InputStats stats = input_stats_varlen(vp, q, k, v);
    std::vector<Check> checks;
    std::vector<std::string> notes;
    Tolerances tol;
    GradientTolerances gtol;
    if (run_reference) {
        const VarlenReference ref = reference_attention_varlen(vp, q, k, v);
        const EmulatedAttention naive = naive_attention_varlen_emulated(precision, vp, q, k, v);
        tol = low_precision_tolerance(stats, precision, compare(naive.o, ref.o), compare(naive.lse, ref.lse));
        add_checks(checks, "float64 reference", got, ref.o, ref.lse, tol);
        if (backward) {
            const VarlenGradients g = reference_backward_varlen(vp, q, k, v, dov);
            const EmulatedGradients ng = naive_backward_varlen_emulated(precision, vp, q, k, v, dov);
            gtol = gradient_tolerance(stats, precision, bounds_problem(vp), ng, ReferenceGradients{g.dq, g.dk, g.dv});
            add_gradient_checks(checks, "float64 reference", got, g.dq, g.dk, g.dv, gtol);
        }
    } else {
        tol = rounding_tolerance(stats, precision);
        if (backward) {
            const double most[3] = {max_abs_of(got.dq), max_abs_of(got.dk), max_abs_of(got.dv)};
            gtol = gradient_tolerance_a_priori(stats, precision, bounds_problem(vp), most);
        }
        notes.push_back(opt.run.reference == ReferenceMode::Never
                            ? "float64 reference skipped (--reference never): the a priori limits apply, far looser"
                            : "float64 reference skipped: it would cost " + format_flops(ref_cost) +
                                  " (budget 2e10; --reference always forces it): the a priori limits apply, far looser");
    }
    // The same kernels' dense calls, one sequence at a time, K and V repeated per query head.
    if (vp.dropout.enabled()) {
        notes.push_back("no per-sequence comparison with dropout: a dense call's mask counts batch entries, a packed call's "
                        "sequences, so their masks differ (the float64 reference regenerates the packed one)");
    } else {
        const stage10::RunResult dense = stage10::run_per_sequence(vp, pin.in, dout, settings);
        const std::string name = "stages 07/09 per sequence, K/V repeated";
        add_checks(checks, name, got, dense.o, dense.lse, tol);
        if (backward) add_gradient_checks(checks, name, got, dense.dq, dense.dk, dense.dv, gtol);
    }

    print_checks(checks);
    bool all_ok = true;
    for (const Check& c : checks) all_ok = all_ok && c.ok;
    for (const std::string& n : notes) std::printf("  note: %s\n", n.c_str());
    std::printf("tolerance  O: max_abs <= %.1e and rel_l2 <= %.1e; LSE: max_abs <= %.1e\n", tol.o.max_abs, tol.o.rel_l2, tol.lse.max_abs);
    print_rule(tol.rule);
    if (backward) {
        std::printf("tolerance  dQ: max_abs <= %.1e, rel_l2 <= %.1e; dK: %.1e, %.1e; dV: %.1e, %.1e\n", gtol.dq.max_abs,
                    gtol.dq.rel_l2, gtol.dk.max_abs, gtol.dk.rel_l2, gtol.dv.max_abs, gtol.dv.rel_l2);
        print_rule(gtol.rule);
    }

    if (!opt.save_dir.empty()) {
        const std::string& dir = opt.save_dir;
        const int64_t d = vp.head_dim;
        save_packed(dir + "/q.npy", pin.in.q.storage, vp.total_q, vp.heads_q, d);
        save_packed(dir + "/k.npy", pin.in.k.storage, vp.total_k, vp.heads_k, d);
        save_packed(dir + "/v.npy", pin.in.v.storage, vp.total_k, vp.heads_k, d);
        save_packed(dir + "/o.npy", got.o, vp.total_q, vp.heads_q, d);
        write_npy(dir + "/lse.npy", {vp.heads_q, vp.total_q}, got.lse);
        const std::vector<int64_t> cu_shape{vp.batch() + 1};
        write_npy(dir + "/cu_seqlens_q.npy", cu_shape, vp.cu_seqlens_q);
        write_npy(dir + "/cu_seqlens_k.npy", cu_shape, vp.cu_seqlens_k);
        std::string saved = "q k v o lse cu_seqlens_q cu_seqlens_k";
        if (backward) {
            save_packed(dir + "/do.npy", dout.storage, vp.total_q, vp.heads_q, d);
            save_packed(dir + "/dq.npy", got.dq, vp.total_q, vp.heads_q, d);
            save_packed(dir + "/dk.npy", got.dk, vp.total_k, vp.heads_k, d);
            save_packed(dir + "/dv.npy", got.dv, vp.total_k, vp.heads_k, d);
            saved += " do dq dk dv";
        }
        if (vp.dropout.enabled()) {
            const double elements = double(vp.batch()) * double(vp.heads_q) * double(vp.max_seq_q()) * double(vp.max_seq_k());
            constexpr int64_t kMaskLimit = int64_t(1) << 26;  // 64 MiB of uint8
            if (elements <= double(kMaskLimit)) {
                write_dropout_mask_npy(dir + "/dropout_mask.npy", vp, kMaskLimit);
                saved += " dropout_mask";
            } else {
                std::printf("  note: dropout_mask.npy not written: (B, Hq, max Nq, max Nk) = %.3g entries, more than 2^26\n", elements);
            }
        }
        std::printf("saved      %s (.npy) to %s\n", saved.c_str(), dir.c_str());
    }
    if (!opt.run.json_path.empty()) {
        Json r = {{"stage", "10"}, {"title", "what real models call"}, {"problem", vp.describe()}, {"dtype", to_string(precision)},
                  {"backward", backward}, {"deterministic", opt.deterministic}, {"real_flops", real}, {"padded_flops", padded}};
        if (times) {
            r["forward_ms"] = times->forward.median_ms, r["padded_forward_ms"] = times->padded_forward.median_ms;
            if (times->backward) r["backward_ms"] = times->backward->median_ms;
            if (times->padded_backward) r["padded_backward_ms"] = times->padded_backward->median_ms;
            r["gpu"] = cuda::gpu_info().describe();
        }
        r["pass"] = all_ok;
        append_json_line(opt.run.json_path, r);
    }
    if (all_ok) {
        std::printf("verdict    PASS: %zu comparisons within tolerance\n", checks.size());
        return kExitPass;
    }
    std::printf("verdict    MISMATCH: see the rows marked FAIL\n");
    return kExitMismatch;
}

}  // namespace

int main(int argc, char** argv) {
    fa::stage10::Options opt;
    CLI::App app{
        "flashcourse stage 10: what real models call\n\n"
        "A packed batch of sequences of different lengths (cu_seqlens, as flash_attn_varlen_func takes it) with\n"
        "grouped-query heads (--kv-heads), a sliding window (--window, --causal), the soft cap (--softcap) and dropout\n"
        "(--dropout), through stage 07's forward and stage 09's backward on the GPU in bf16 or fp16. Checked against the\n"
        "float64 reference by the low-precision rules, and against the same kernels' dense calls run one sequence at a\n"
        "time with K and V repeated per query head. The report gives the work against the batch padded to its\n"
        "longest sequence, and the tiles the window skips."};
    app.get_formatter()->column_width(34);
    fa::stage10::add_options(app, opt);
    if (const int code = fa::parse_command_line(app, argc, argv); code >= 0) return code;
    std::printf("== flashcourse stage 10: what real models call ==\n");
    try {
        return run(opt, app);
    } catch (const fa::InputError& e) {
        std::fflush(stdout);  // the report so far, then the error, in that order
        std::fprintf(stderr, "error: %s\n", e.what());
        return fa::kExitBadInput;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "error: out of memory: use fewer or shorter sequences\n");
        return fa::kExitBadInput;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "error: %s\n", e.what());
        return fa::kExitMismatch;
    }
}
