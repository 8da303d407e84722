#include "fa/stage.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include <CLI/CLI.hpp>

#include "fa/counts.hpp"
#include "fa/error.hpp"
#include "fa/json.hpp"
#include "fa/metrics.hpp"
#include "fa/npy.hpp"
#include "fa/reference.hpp"
#include "fa/reference_backward.hpp"
#include "fa/tolerance.hpp"

namespace fa {

namespace {

constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();

struct Outputs {
    HostTensor o;            // (B, H, Nq, d) in the chosen layout
    std::vector<float> lse;  // (B, H, Nq) dense
    View3<float> lse_view(const Problem& p) { return make_view3(lse.data(), p.batch, p.heads, p.seq_q); }
};

// Outputs filled with NaN, so an element the stage forgets to write cannot pass.
Outputs make_outputs(const Problem& p, Layout layout) {
    return {HostTensor(p.batch, p.heads, p.seq_q, p.head_dim, layout, kPoison),
            std::vector<float>(static_cast<size_t>(p.lse_elems()), kPoison)};
}

void run_into(const AttentionFn& fn, const Problem& p, const Inputs& in, Outputs& out) {
    fn(p, in.q.cview(), in.k.cview(), in.v.cview(), out.o.view, out.lse_view(p));
}

// Loads one .npy input into a tensor of the chosen layout.
HostTensor load_input(const std::string& dir, const char* name, Layout layout, std::vector<int64_t>& shape) {
    const std::string path = dir + "/" + name + ".npy";
    NpyArray a = read_npy(path);
    if (a.shape.size() != 4) {
        throw InputError(path + ": expected 4 dimensions (B, H, N, d), got " + std::to_string(a.shape.size()));
    }
    for (int64_t s : a.shape)
        if (s < 1) throw InputError(path + ": every dimension must be at least 1");
    shape = a.shape;
    HostTensor t(shape[0], shape[1], shape[2], shape[3], layout);
    const View4<const float> src = make_view<const float>(a.data.data(), shape[0], shape[1], shape[2], shape[3], Layout::BHND);
    for (int64_t b = 0; b < shape[0]; ++b)
        for (int64_t h = 0; h < shape[1]; ++h)
            for (int64_t n = 0; n < shape[2]; ++n)
                for (int64_t x = 0; x < shape[3]; ++x) t.view(b, h, n, x) = src(b, h, n, x);
    require_finite(t.cview(), path);
    return t;
}

std::string shape_text(const std::vector<int64_t>& s) {
    std::string out = "(";
    for (size_t i = 0; i < s.size(); ++i) out += std::to_string(s[i]) + (i + 1 < s.size() ? ", " : "");
    return out + ")";
}

Inputs load_inputs(CLI::App& app, CommonOptions& opt) {
    std::vector<int64_t> qs, ks, vs;
    Inputs in{load_input(opt.load_dir, "q", opt.layout, qs), load_input(opt.load_dir, "k", opt.layout, ks),
              load_input(opt.load_dir, "v", opt.layout, vs)};
    if (ks != vs) throw InputError("k.npy has shape " + shape_text(ks) + " but v.npy has " + shape_text(vs) + ": they must match");
    if (qs[0] != ks[0] || qs[1] != ks[1] || qs[3] != ks[3]) {
        throw InputError("q.npy " + shape_text(qs) + " and k.npy " + shape_text(ks) +
                         " must agree in B, H and d (dimensions 0, 1 and 3)");
    }
    // The files define the shape; an explicit option that disagrees is an error, not a silent override.
    const std::pair<const char*, int64_t> given[] = {
        {"--batch", qs[0]}, {"--heads", qs[1]}, {"--seq-q", qs[2]}, {"--seq-k", ks[2]}, {"--head-dim", qs[3]}};
    Problem& p = opt.problem;
    int64_t* fields[] = {&p.batch, &p.heads, &p.seq_q, &p.seq_k, &p.head_dim};
    for (size_t i = 0; i < 5; ++i) {
        if (app.count(given[i].first) && *fields[i] != given[i].second) {
            throw InputError(std::string(given[i].first) + " " + std::to_string(*fields[i]) + " disagrees with the loaded files (" +
                             std::to_string(given[i].second) + "): leave it out when using --load");
        }
        *fields[i] = given[i].second;
    }
    return in;
}

void save_outputs(const std::string& dir, const Problem& p, const Inputs& in, const Outputs& out) {
    const std::vector<int64_t> qshape{p.batch, p.heads, p.seq_q, p.head_dim};
    const std::vector<int64_t> kshape{p.batch, p.heads, p.seq_k, p.head_dim};
    write_npy(dir + "/q.npy", qshape, in.q.logical());
    write_npy(dir + "/k.npy", kshape, in.k.logical());
    write_npy(dir + "/v.npy", kshape, in.v.logical());
    write_npy(dir + "/o.npy", qshape, out.o.logical());
    write_npy(dir + "/lse.npy", {p.batch, p.heads, p.seq_q}, out.lse);
}

// Refuses a problem whose host buffers cannot fit before anything is allocated.
void check_host_memory(const Problem& p, const StageSpec& spec, size_t output_sets, bool reference, bool emulation) {
    const double io = 4.0 * (2.0 * double(p.q_elems()) + 2.0 * double(p.kv_elems()) + double(p.lse_elems()));
    double need = io + 4.0 * (double(p.q_elems()) + double(p.lse_elems())) * double(output_sets - 1);
    if (spec.intermediate_bytes) need += spec.intermediate_bytes(p);
    // The float64 reference and the low-precision emulation: their outputs, one head's K and V,
    // and a 128-row block of scores.
    const double per_head = double(p.q_elems()) + double(p.lse_elems()) + 2.0 * double(p.seq_k) * double(p.head_dim) +
                            2.0 * 128.0 * double(p.seq_k);
    if (reference) need += 8.0 * per_head;
    if (emulation) need += 4.0 * per_head;
    if (spec.run_backward) {
        // dO, then dQ, dK, dV for this stage and each comparison; with the reference, its
        // gradients in float64 and the naive backward's in float32 with one head's P and dS.
        const double grads = double(p.q_elems()) + 2.0 * double(p.kv_elems());
        need += 4.0 * double(p.q_elems()) + 4.0 * grads * double(2 + spec.backward_checked_against.size());
        if (reference) need += 12.0 * grads + 8.0 * double(p.seq_q) * double(p.seq_k) + 8.0 * per_head;
    }
    const int64_t available = available_memory_bytes();
    if (available > 0 && need > 0.9 * double(available)) {
        throw InputError("the problem " + p.describe() + " needs about " + format_bytes(need) + " of host memory but only " +
                         format_bytes(double(available)) + " is available: use smaller sizes");
    }
}

std::string cpu_name() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("model name", 0) == 0) {
            const size_t colon = line.find(':');
            if (colon != std::string::npos) return line.substr(colon + 2);
        }
    }
    return "unknown CPU";
}

// What one run measured, for its --json record.
struct RunFigures {
    double first_ms;            // the first run, wall clock
    double median_ms;           // --bench's median; without --bench, the first run's time
    double flops;               // the work of the pass that ran (forward or backward)
    int64_t rss_before;         // resident memory before the run
    int64_t peak_rss;           // and its peak during the run
    double intermediate_bytes;  // StageSpec::intermediate_bytes
    bool pass;                  // the verdict
};

// Appends the run's record to --json's file as one line; docs/make_results.py reads these lines
// back (docs/results/cpu_sweep.jsonl). A backward stage's record says so (pass_direction) and adds
// what the naive backward would hold, P and dS (naive_bytes).
void append_run_record(const StageSpec& spec, const CommonOptions& opt, const Problem& p, const RunFigures& f) {
    Json r;
    r["stage"] = spec.number;
    r["title"] = spec.title;
    if (spec.run_backward) r["pass_direction"] = "backward";
    r["B"] = p.batch, r["H"] = p.heads, r["Nq"] = p.seq_q, r["Nk"] = p.seq_k, r["d"] = p.head_dim;
    r["causal"] = p.causal;
    r["layout"] = to_string(opt.layout);
    r["first_ms"] = f.first_ms;
    r["median_ms"] = f.median_ms;
    r["gflops"] = f.flops / f.median_ms * 1e-6;
    r["peak_rss_bytes"] = f.peak_rss;
    r["rss_before_bytes"] = f.rss_before;
    r["intermediate_bytes"] = f.intermediate_bytes;
    if (spec.run_backward) r["naive_bytes"] = 2.0 * score_matrix_bytes(p);
    r["pass"] = f.pass;
    r["machine"] = cpu_name();
    r["date"] = record_date();
    append_json_line(opt.json_path, r);
}

// How many elements of `out` are NaN or inf where `ref` is finite.
template <class Ref>
int64_t count_overflow(const std::vector<float>& out, const std::vector<Ref>& ref) {
    int64_t n = 0;
    for (size_t i = 0; i < std::min(out.size(), ref.size()); ++i) n += !std::isfinite(out[i]) && std::isfinite(double(ref[i]));
    return n;
}

// Says where the worst element of a failed check sits.
void print_worst(const Check& c, const Problem& p, const std::vector<float>& out) {
    if (c.metrics.worst_index < 0) return;
    const int64_t idx = c.metrics.worst_index;
    const bool is_o = std::string(c.tensor) == "O";
    const int64_t d = is_o ? p.head_dim : 1;
    const int64_t x = idx % d, n = (idx / d) % p.seq_q, h = (idx / d / p.seq_q) % p.heads, b = idx / d / p.seq_q / p.heads;
    // The LSE has no feature index: print ", x=..." for O only.
    const std::string x_part = is_o ? ", x=" + std::to_string(x) : "";
    // "vs stage 03 (online softmax)": which comparison, when several fail on the same element.
    const std::string against = c.what.substr(std::min(c.what.find("vs "), c.what.size()));
    std::printf("    worst %s element %s at (b=%lld, h=%lld, n=%lld%s): got %.8g, off by %.3g\n", c.tensor, against.c_str(),
                (long long)b, (long long)h, (long long)n, x_part.c_str(), double(out[size_t(idx)]), c.metrics.max_abs);
}

// ---------------------------------------------------------------- backward stages

// The gradients a backward stage writes, in the chosen layout, filled with NaN.
struct Gradients {
    HostTensor dq, dk, dv;
};

Gradients make_gradients(const Problem& p, Layout layout) {
    return {HostTensor(p.batch, p.heads, p.seq_q, p.head_dim, layout, kPoison),
            HostTensor(p.batch, p.heads, p.seq_k, p.head_dim, layout, kPoison),
            HostTensor(p.batch, p.heads, p.seq_k, p.head_dim, layout, kPoison)};
}

void run_backward_into(const BackwardFn& fn, const Problem& p, const Inputs& in, Outputs& fwd, const HostTensor& dout,
                       Gradients& g) {
    fn(p, in.q.cview(), in.k.cview(), in.v.cview(), fwd.o.cview(), fwd.lse_view(p), dout.cview(), g.dq.view, g.dk.view,
       g.dv.view);
}

// dO: loaded from DIR/do.npy when --load gave a directory that has one, seeded random otherwise.
HostTensor make_or_load_output_gradient(const CommonOptions& opt, const Problem& p, std::string& how) {
    const std::string path = opt.load_dir + "/do.npy";
    if (!opt.load_dir.empty() && std::ifstream(path).good()) {
        std::vector<int64_t> shape;
        HostTensor dout = load_input(opt.load_dir, "do", opt.layout, shape);
        const std::vector<int64_t> want{p.batch, p.heads, p.seq_q, p.head_dim};
        if (shape != want) throw InputError(path + " has shape " + shape_text(shape) + " but o is " + shape_text(want) + ": they must match");
        how = "loaded from " + path;
        return dout;
    }
    how = "standard normal random, seed " + std::to_string(opt.seed) +
          (opt.load_dir.empty() ? "" : " (no do.npy in " + opt.load_dir + ")");
    HostTensor dout = make_output_gradient(p, opt.layout, opt.seed);
    require_finite(dout.cview(), "generated dO (seed " + std::to_string(opt.seed) + ")");
    return dout;
}

double max_abs_of(const std::vector<float>& x) {
    double m = 0;
    for (float v : x)
        if (std::isfinite(v)) m = std::max(m, double(std::abs(v)));
    return m;
}

// Says where the worst element of a failed gradient check sits.
void print_worst_gradient(const Check& c, const Problem& p, const std::vector<float>& out) {
    if (c.metrics.worst_index < 0) return;
    const int64_t idx = c.metrics.worst_index, d = p.head_dim;
    const int64_t rows = std::string(c.tensor) == "dQ" ? p.seq_q : p.seq_k;
    const int64_t x = idx % d, n = (idx / d) % rows, h = (idx / d / rows) % p.heads, b = idx / d / rows / p.heads;
    const std::string against = c.what.substr(std::min(c.what.find("vs "), c.what.size()));
    std::printf("    worst %s element %s at (b=%lld, h=%lld, n=%lld, x=%lld): got %.8g, off by %.3g\n", c.tensor, against.c_str(),
                (long long)b, (long long)h, (long long)n, (long long)x, double(out[size_t(idx)]), c.metrics.max_abs);
}

// The report of a backward stage: the forward gives O and LSE, the backward is run, timed and
// its gradients checked. Called by run_stage() once the problem and the inputs are settled.
int run_backward_stage(const StageSpec& spec, const CommonOptions& opt, const Problem& p, const Inputs& in,
                       Precision precision, bool run_reference) {
    std::string dout_how;
    const HostTensor dout = make_or_load_output_gradient(opt, p, dout_how);
    std::printf("gradient   dO %s\n", dout_how.c_str());
    if (spec.describe_config) std::printf("config     %s\n", spec.describe_config(p).c_str());

    Outputs fwd = make_outputs(p, opt.layout);
    const auto f0 = std::chrono::steady_clock::now();
    run_into(spec.run, p, in, fwd);
    const double fwd_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - f0).count();
    std::printf("forward    O and LSE from %s (%.3f ms): the backward reads them, with dO\n", spec.forward_name.c_str(), fwd_ms);

    const double flops = attention_flops_backward(p);
    std::printf("work       %s (2.5 x the forward's 4*B*H*Nq*Nk*d%s: five products to its two), at least %s moved\n"
                "           (q, k, v, o, dO read once, lse read; dQ, dK, dV written once)\n",
                format_flops(flops).c_str(), p.causal && p.seq_q == p.seq_k ? ", / 2 for causal" : "",
                format_bytes(4.0 * (3.0 * double(p.q_elems()) + 4.0 * double(p.kv_elems()) + double(p.lse_elems()))).c_str());
    const double extra = spec.intermediate_bytes ? spec.intermediate_bytes(p) : 0.0;
    std::printf("memory     %s of intermediates%s%s; the naive backward holds P and dS, Nq x Nk per head: %s\n",
                format_bytes(extra).c_str(), spec.intermediate_what.empty() ? "" : ": ", spec.intermediate_what.c_str(),
                format_bytes(2.0 * score_matrix_bytes(p)).c_str());

    // The backward alone, so its peak memory is its own.
    Gradients g = make_gradients(p, opt.layout);
    const int64_t rss_before = current_rss_bytes();
    const bool peak_reset = reset_peak_rss();
    const auto t0 = std::chrono::steady_clock::now();
    run_backward_into(spec.run_backward, p, in, fwd, dout, g);
    const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const int64_t peak = peak_rss_bytes();
    std::printf("run        %.3f ms (backward, first run, wall clock, %.2f GFLOP/s)\n", first_ms, flops / first_ms * 1e-6);
    std::printf("peak RSS   %s during the backward (%s above the %s held before it%s)\n", format_bytes(double(peak)).c_str(),
                format_bytes(double(std::max<int64_t>(0, peak - rss_before))).c_str(), format_bytes(double(rss_before)).c_str(),
                peak_reset ? "" : "; peak not resettable, covers the whole process");

    std::optional<TimingStats> stats;
    if (opt.bench) {
        if (spec.bench_backward) {
            stats = spec.bench_backward(p, in, fwd.o.cview(), fwd.lse_view(p), dout.cview(), opt);
        } else {
            Gradients scratch = make_gradients(p, opt.layout);
            stats = time_host([&] { run_backward_into(spec.run_backward, p, in, fwd, dout, scratch); }, opt.warmup, opt.repeat);
        }
        const double rate = flops / (stats->median_ms * 1e-3);
        std::printf("bench      backward median %.4f ms over %d runs after %d warm-up (min %.4f, max %.4f): %.2f %s\n",
                    stats->median_ms, opt.repeat, opt.warmup, stats->min_ms, stats->max_ms,
                    rate >= 1e12 ? rate * 1e-12 : rate * 1e-9, rate >= 1e12 ? "TFLOP/s" : "GFLOP/s");
        if (spec.after_bench) spec.after_bench(p, *stats);
    }

    const char* names[3] = {"dQ", "dK", "dV"};
    const std::vector<float> got[3] = {g.dq.logical(), g.dk.logical(), g.dv.logical()};
    const InputStats in_stats = input_stats(p, in.q.cview(), in.k.cview(), in.v.cview());
    std::vector<std::string> notes;
    std::vector<Check> checks;
    GradientTolerances tol;
    const Tolerance* limits[3] = {&tol.dq, &tol.dk, &tol.dv};
    // Another backward, after its own forward when it names one (a float32 backward reading a
    // 16-bit forward's LSE would recompute P from scores that forward never saw).
    const auto run_comparison = [&](const BackwardComparison& c) {
        Gradients other = make_gradients(p, opt.layout);
        if (c.forward) {
            Outputs own = make_outputs(p, opt.layout);
            run_into(c.forward, p, in, own);
            run_backward_into(c.run, p, in, own, dout, other);
        } else {
            run_backward_into(c.run, p, in, fwd, dout, other);
        }
        return other;
    };
    std::optional<ReferenceGradients> ref;
    if (run_reference) {
        ref = reference_backward(p, in.q.cview(), in.k.cview(), in.v.cview(), dout.cview());
        const std::vector<double>* r[3] = {&ref->dq, &ref->dk, &ref->dv};
        // The baseline: the naive backward in this stage's precision, against the same reference.
        const EmulatedGradients naive = naive_backward_emulated(precision, p, in.q.cview(), in.k.cview(), in.v.cview(), dout.cview());
        tol = gradient_tolerance(in_stats, precision, p, naive, *ref);
        for (const BackwardComparison& c : spec.backward_checked_against) {
            if (c.applies && !c.applies(p)) continue;
            const Gradients other = run_comparison(c);
            const std::vector<float> o[3] = {other.dq.logical(), other.dk.logical(), other.dv.logical()};
            for (int i = 0; i < 3; ++i) {
                Check ck{std::string(names[i]) + "  vs " + c.name, compare(got[i], o[i]), *limits[i], false, names[i]};
                ck.ok = passes(ck.metrics, ck.tol);
                checks.push_back(ck);
            }
        }
        for (int i = 0; i < 3; ++i) {
            Check ck{std::string(names[i]) + "  vs float64 reference", compare(got[i], *r[i]), *limits[i], false, names[i]};
            ck.ok = passes(ck.metrics, ck.tol);
            checks.push_back(ck);
        }
    } else {
        notes.push_back(opt.reference == ReferenceMode::Never
                            ? "float64 reference skipped (--reference never)"
                            : "float64 reference skipped: it would cost " + format_flops(reference_backward_flops(p)) +
                                  " (budget 2e10; --reference always forces it)");
        for (const BackwardComparison& c : spec.backward_checked_against) {
            if (c.applies && !c.applies(p)) continue;
            const Gradients other = run_comparison(c);
            const std::vector<float> o[3] = {other.dq.logical(), other.dk.logical(), other.dv.logical()};
            const double other_max[3] = {max_abs_of(o[0]), max_abs_of(o[1]), max_abs_of(o[2])};
            tol = gradient_tolerance_a_priori(in_stats, precision, p, other_max);
            for (int i = 0; i < 3; ++i) {
                Check ck{std::string(names[i]) + "  vs " + c.name, compare(got[i], o[i]), *limits[i], false, names[i]};
                ck.ok = passes(ck.metrics, ck.tol);
                checks.push_back(ck);
            }
        }
    }

    print_checks(checks);
    bool all_ok = true;
    for (const Check& c : checks) all_ok = all_ok && c.ok;
    for (const std::string& n : notes) std::printf("  note: %s\n", n.c_str());
    if (!checks.empty()) {
        std::printf("tolerance  dQ: max_abs <= %.1e, rel_l2 <= %.1e; dK: %.1e, %.1e; dV: %.1e, %.1e\n", tol.dq.max_abs,
                    tol.dq.rel_l2, tol.dk.max_abs, tol.dk.rel_l2, tol.dv.max_abs, tol.dv.rel_l2);
        std::string rule = tol.rule;
        for (size_t at = rule.find('\n'); at != std::string::npos; at = rule.find('\n', at + 1)) rule.insert(at + 1, 11, ' ');
        std::printf("           %s\n", rule.c_str());
    }

    if (!opt.save_dir.empty()) {
        save_outputs(opt.save_dir, p, in, fwd);
        const std::vector<int64_t> qshape{p.batch, p.heads, p.seq_q, p.head_dim};
        const std::vector<int64_t> kshape{p.batch, p.heads, p.seq_k, p.head_dim};
        write_npy(opt.save_dir + "/do.npy", qshape, dout.logical());
        write_npy(opt.save_dir + "/dq.npy", qshape, got[0]);
        write_npy(opt.save_dir + "/dk.npy", kshape, got[1]);
        write_npy(opt.save_dir + "/dv.npy", kshape, got[2]);
        std::printf("saved      q.npy k.npy v.npy o.npy lse.npy do.npy dq.npy dk.npy dv.npy to %s\n", opt.save_dir.c_str());
    }
    if (!opt.json_path.empty()) {
        append_run_record(spec, opt, p, {first_ms, stats ? stats->median_ms : first_ms, flops, rss_before, peak, extra, all_ok});
    }

    if (checks.empty()) {
        std::printf("verdict    NOT CHECKED: no comparison could be made (see the notes)\n");
        return kExitPass;
    }
    if (all_ok) {
        std::printf("verdict    PASS: %zu comparisons within tolerance\n", checks.size());
        return kExitPass;
    }
    for (const Check& c : checks)
        if (!c.ok) print_worst_gradient(c, p, got[c.tensor[1] == 'Q' ? 0 : c.tensor[1] == 'K' ? 1 : 2]);
    std::printf("verdict    MISMATCH: see the rows marked FAIL\n");
    return kExitMismatch;
}

}  // namespace

// The header and one row per check, the labels padded to the longest so the columns line up.
void print_checks(const std::vector<Check>& checks) {
    int width = 38;
    for (const Check& c : checks) width = std::max(width, static_cast<int>(c.what.size()) - 2);
    std::printf("check      %-*s %9s %9s %9s %10s %9s %6s\n", width - 9, "", "max_abs", "mean_abs", "max_rel", "cosine",
                "rel_l2", "nonfin");
    for (const Check& c : checks)
        std::printf("  %-*s %9.2e %9.2e %9.2e %10.7f %9.2e %6lld  %s\n", width, c.what.c_str(), c.metrics.max_abs,
                    c.metrics.mean_abs, c.metrics.max_rel, c.metrics.cosine, c.metrics.rel_l2,
                    static_cast<long long>(c.metrics.nonfinite), c.ok ? "ok" : "FAIL");
}

int run_stage(int argc, char** argv, const StageSpec& spec) {
    CommonOptions opt;
    CLI::App app{"flashcourse stage " + spec.number + ": " + spec.title + "\n\n" + spec.description};
    app.get_formatter()->column_width(34);
    add_common_options(app, opt);
    if (spec.add_options) spec.add_options(app);
    if (const int code = parse_command_line(app, argc, argv); code >= 0) return code;

    std::printf("== flashcourse stage %s: %s ==\n", spec.number.c_str(), spec.title.c_str());
    if (spec.needs_gpu && spec.gpu_unavailable_reason) {
        const std::string reason = spec.gpu_unavailable_reason();
        if (!reason.empty()) {
            std::printf("skipped: stage %s needs a CUDA GPU (%s)\n", spec.number.c_str(), reason.c_str());
            return kExitSkipped;
        }
    }
    try {
        Problem& p = opt.problem;
        Inputs in;
        if (!opt.load_dir.empty()) {
            in = load_inputs(app, opt);
        }
        p.validate();
        const Precision precision = spec.precision ? spec.precision() : Precision::Float32;
        const double reference_cost = spec.run_backward ? reference_backward_flops(p) : reference_flops(p);
        const bool run_reference = opt.reference == ReferenceMode::Always ||
                                   (opt.reference == ReferenceMode::Auto && reference_cost <= kReferenceFlopBudget);
        // A problem this machine cannot hold is refused as such first, before any kernel's own limits.
        check_host_memory(p, spec, 2 + spec.checked_against.size(), run_reference, run_reference && precision != Precision::Float32);
        if (spec.check_supported) spec.check_supported(p);
        if (spec.validate_options) spec.validate_options(opt);
        if (opt.load_dir.empty()) {
            in = make_inputs(p, opt.layout, opt.inputs, opt.seed);
            const std::string how = " (--inputs " + to_string(opt.inputs) + ", seed " + std::to_string(opt.seed) + ")";
            require_finite(in.q.cview(), "generated q" + how);
            require_finite(in.k.cview(), "generated k" + how);
            require_finite(in.v.cview(), "generated v" + how);
        }

        std::printf("problem    %s, layout %s\n", p.describe().c_str(), to_string(opt.layout).c_str());
        std::printf("inputs     %s\n", opt.load_dir.empty()
                                           ? (to_string(opt.inputs) + " random, seed " + std::to_string(opt.seed)).c_str()
                                           : ("loaded from " + opt.load_dir).c_str());
        if (spec.run_backward) return run_backward_stage(spec, opt, p, in, precision, run_reference);
        if (spec.describe_config) std::printf("config     %s\n", spec.describe_config(p).c_str());
        const double flops = attention_flops(p);
        std::printf("work       %s (4*B*H*Nq*Nk*d%s), at least %s moved (q, k, v read once; o, lse written once)\n",
                    format_flops(flops).c_str(), p.causal && p.seq_q == p.seq_k ? " / 2 for causal" : "",
                    format_bytes(attention_min_bytes(p)).c_str());
        const double extra = spec.intermediate_bytes ? spec.intermediate_bytes(p) : 0.0;
        std::printf("memory     %s of intermediates%s%s; the full score matrix would be %s\n", format_bytes(extra).c_str(),
                    spec.intermediate_what.empty() ? "" : ": ", spec.intermediate_what.c_str(),
                    format_bytes(score_matrix_bytes(p)).c_str());

        // Run this stage first, alone, so its peak memory is its own.
        Outputs out = make_outputs(p, opt.layout);
        const int64_t rss_before = current_rss_bytes();
        const bool peak_reset = reset_peak_rss();
        const auto t0 = std::chrono::steady_clock::now();
        run_into(spec.run, p, in, out);
        const auto t1 = std::chrono::steady_clock::now();
        const int64_t peak = peak_rss_bytes();
        const double first_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
        std::printf("run        %.3f ms (first run, wall clock, %.2f GFLOP/s)\n", first_ms, flops / first_ms * 1e-6);
        std::printf("peak RSS   %s during the run (%s above the %s held before it%s)\n", format_bytes(double(peak)).c_str(),
                    format_bytes(double(std::max<int64_t>(0, peak - rss_before))).c_str(),
                    format_bytes(double(rss_before)).c_str(), peak_reset ? "" : "; peak not resettable, covers the whole process");

        std::optional<TimingStats> stats;
        if (opt.bench) {
            if (spec.bench) {
                stats = spec.bench(p, in, opt);
            } else {
                Outputs scratch = make_outputs(p, opt.layout);
                stats = time_host([&] { run_into(spec.run, p, in, scratch); }, opt.warmup, opt.repeat);
            }
            const double rate = flops / (stats->median_ms * 1e-3);  // FLOP/s
            std::printf("bench      median %.4f ms over %d runs after %d warm-up (min %.4f, max %.4f): %.2f %s\n",
                        stats->median_ms, opt.repeat, opt.warmup, stats->min_ms, stats->max_ms,
                        rate >= 1e12 ? rate * 1e-12 : rate * 1e-9, rate >= 1e12 ? "TFLOP/s" : "GFLOP/s");
            if (spec.after_bench) spec.after_bench(p, *stats);
        }

        const std::vector<float> o = out.o.logical();
        std::optional<Reference> ref;
        if (run_reference) ref = reference_attention(p, in.q.cview(), in.k.cview(), in.v.cview());
        // The limits follow what the arithmetic can promise on these inputs (fa/tolerance.hpp).
        const InputStats in_stats = input_stats(p, in.q.cview(), in.k.cview(), in.v.cview());
        std::vector<std::string> notes;
        Tolerances tol;
        if (precision == Precision::Float32) {
            tol = rounding_tolerance(in_stats);
        } else if (ref) {
            // bf16/fp16: twice the error of the same attention done naively in that precision.
            const EmulatedAttention naive = naive_attention_emulated(precision, p, in.q.cview(), in.k.cview(), in.v.cview());
            tol = low_precision_tolerance(in_stats, precision, compare(naive.o, ref->o), compare(naive.lse, ref->lse));
        } else {
            tol = rounding_tolerance(in_stats, precision);
            notes.push_back("naive " + to_string(precision) + " attention is emulated only with the float64 reference: the limits are " +
                            "the a priori " + to_string(precision) + " bound, far looser (--reference always gives the tight ones)");
        }

        std::vector<Check> checks;
        auto add_checks = [&](const std::string& against, const auto& o_ref, const auto& lse_ref) {
            Check co{"O   vs " + against, compare(o, o_ref), tol.o, false, "O"};
            co.ok = passes(co.metrics, tol.o);
            Check cl{"LSE vs " + against, compare(out.lse, lse_ref), tol.lse, false, "LSE"};
            cl.ok = passes(cl.metrics, tol.lse);
            checks.push_back(co);
            checks.push_back(cl);
        };
        for (const Comparison& c : spec.checked_against) {
            if (c.applies && !c.applies(p)) continue;
            Outputs prev = make_outputs(p, opt.layout);
            run_into(c.run, p, in, prev);
            const std::vector<float> prev_o = prev.o.logical();
            // A comparison that cannot be made is said, not failed: NaN or inf where the float64
            // reference (or, without it, this stage) is finite means the earlier stage overflowed.
            const int64_t overflowed = ref ? count_overflow(prev_o, ref->o) + count_overflow(prev.lse, ref->lse)
                                           : count_overflow(prev_o, o) + count_overflow(prev.lse, out.lse);
            if (overflowed > 0) {
                notes.push_back(c.name + " overflowed on these inputs (" + std::to_string(overflowed) +
                                " values of O and LSE are NaN or inf where " +
                                (ref ? "the float64 reference" : "this stage") + " is finite): not comparable");
                continue;
            }
            add_checks(c.name, prev_o, prev.lse);
        }
        if (ref) {
            add_checks("float64 reference", ref->o, ref->lse);
        } else {
            notes.push_back(opt.reference == ReferenceMode::Never
                                ? "float64 reference skipped (--reference never)"
                                : "float64 reference skipped: it would cost " + format_flops(reference_flops(p)) +
                                      " (budget 2e10; --reference always forces it)");
        }

        print_checks(checks);
        bool all_ok = true, finite_part_ok = true;
        int64_t nonfinite = 0;
        for (const Check& c : checks) {
            all_ok = all_ok && c.ok;
            nonfinite += c.metrics.nonfinite;
            // The values that are finite, judged alone (the metrics leave the others out).
            finite_part_ok = finite_part_ok && c.metrics.max_abs <= c.tol.max_abs && c.metrics.rel_l2 <= c.tol.rel_l2;
        }
        for (const std::string& n : notes) std::printf("  note: %s\n", n.c_str());
        std::printf("tolerance  O: max_abs <= %.1e and rel_l2 <= %.1e; LSE: max_abs <= %.1e\n", tol.o.max_abs, tol.o.rel_l2,
                    tol.lse.max_abs);
        std::string rule = tol.rule;  // one line per part of the rule, indented under the limits
        for (size_t at = rule.find('\n'); at != std::string::npos; at = rule.find('\n', at + 1)) rule.insert(at + 1, 11, ' ');
        std::printf("           %s\n", rule.c_str());
        if (tol.error_unit > 0.05) {
            std::printf("           (wide: on these inputs the arithmetic itself may move the softmax weights by %.0f%%, so the\n"
                        "           comparison still catches gross errors but no longer small ones)\n",
                        100.0 * tol.error_unit);
        }

        if (!opt.save_dir.empty()) {
            save_outputs(opt.save_dir, p, in, out);
            std::printf("saved      q.npy k.npy v.npy o.npy lse.npy to %s\n", opt.save_dir.c_str());
        }
        if (!opt.json_path.empty()) {
            append_run_record(spec, opt, p, {first_ms, stats ? stats->median_ms : first_ms, flops, rss_before, peak, extra, all_ok});
        }

        if (checks.empty()) {
            std::printf("verdict    NOT CHECKED: no comparison could be made (see the notes)\n");
            return kExitPass;
        }
        if (all_ok) {
            std::printf("verdict    PASS: %zu comparisons within tolerance\n", checks.size());
            return kExitPass;
        }
        // The naive softmax overflowing where scores can pass ln(FLT_MAX) is the lesson, not a
        // defect, as long as every value it did produce is right. Below that, NaN is a bug.
        if (spec.naive_softmax && nonfinite > 0 && finite_part_ok && in_stats.score_bound > kExpOverflowScore) {
            int64_t finite = 0;
            for (const Check& c : checks) finite += c.metrics.count;
            std::printf("verdict    OVERFLOW, as this stage teaches: exp(s) exceeds float32's largest value (3.4e38) once\n"
                        "           s > 88.7, and scores here may reach S = %.3g, so the naive softmax produced\n"
                        "           inf/inf = NaN in %lld values (%s). Stage 02 subtracts each row's\n"
                        "           maximum before exponentiating and has no such limit.\n",
                        in_stats.score_bound, static_cast<long long>(nonfinite),
                        finite > 0 ? (std::to_string(finite) + " finite values within tolerance").c_str() : "none is finite");
            return kExitPass;
        }
        for (const Check& c : checks)
            if (!c.ok) print_worst(c, p, std::string(c.tensor) == "O" ? o : out.lse);
        std::printf("verdict    MISMATCH: see the rows marked FAIL\n");
        return kExitMismatch;
    } catch (const InputError& e) {
        std::fflush(stdout);  // the report so far, then the error, in that order
        std::fprintf(stderr, "error: %s\n", e.what());
        return kExitBadInput;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "error: out of memory for %s: use smaller sizes\n", opt.problem.describe().c_str());
        return kExitBadInput;
    } catch (const std::exception& e) {
        // Anything else is a failure of the run itself (a CUDA call names its call, file and
        // line): say so and fail, rather than abort.
        std::fflush(stdout);
        std::fprintf(stderr, "error: %s\n", e.what());
        return kExitMismatch;
    }
}

}  // namespace fa
