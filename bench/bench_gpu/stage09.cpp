// bench_gpu's stage 09 at one point: stage 07's forward, stage 09's backward with atomic and with
// deterministic dQ, the two as one pair, the guard of check_stage09; then the other main kernels of
// --steps09 (bench_gpu.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "../../stages/07_pipelined_fused_kernel/attention.cuh"
#include "bench_gpu.hpp"
#include "fa/metrics.hpp"

namespace bench {

namespace {

// Deterministic against atomic dQ: the same float32 products added in another order, then rounded
// to 16 bits; dK and dV do not depend on the mode.
constexpr double kStage09ModesRelL2 = 1e-2;
// sum_j dV_j against sum_i dO_i: the rounding of P and dV leaves about 3e-4 in bf16 and 5e-5 in
// fp16 on these inputs (a model of the kernels' roundings; every point prints what it measured);
// a wrong mask or LSE, or a lost tile, moves the sum by the size of what it drops.
constexpr double kStage09DvSumRel = 1e-2;
// |sum_j dK_j| against the sum of Nk unrelated rows of dK's size: the rounding of O (in D_i), dS
// and dK leaves about 3e-3 in bf16 and 4e-4 in fp16 by the same model; a backward that drops D_i
// gives about 1.
constexpr double kStage09DkSumRatio = 5e-2;

// A 16-bit device tensor, dense (B, H, N, d), widened to float32 in `scratch` (at least as many
// floats) and copied to the host.
template <class T>
std::vector<float> widen_to_host(fa::View4<const T> src, float* scratch) {
    const auto& s = src.shape;
    fa::cuda::convert(src, fa::make_view(scratch, s[0], s[1], s[2], s[3], fa::Layout::BHND));
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    return to_host(scratch, src.numel());
}

// A host array dense in (B, H, N, d) summed over its N rows: one double per (b, h, feature).
std::vector<double> sum_over_rows(const std::vector<float>& x, int64_t rows, int64_t d) {
    std::vector<double> sum(x.size() / size_t(rows), 0.0);
    const size_t heads = sum.size() / size_t(d);
    for (size_t bh = 0; bh < heads; ++bh) {
        double* out = sum.data() + bh * size_t(d);
        for (int64_t n = 0; n < rows; ++n) {
            const float* row = x.data() + (bh * size_t(rows) + size_t(n)) * size_t(d);
            for (int64_t f = 0; f < d; ++f) out[f] += row[f];
        }
    }
    return sum;
}

// Root mean square of an array.
template <class F>
double rms(const std::vector<F>& x) {
    double sq = 0;
    for (F v : x) sq += double(v) * double(v);
    return x.empty() ? 0.0 : std::sqrt(sq / double(x.size()));
}

// ||a - ref||_2 / ||ref||_2.
double rel_l2(const std::vector<double>& a, const std::vector<double>& ref) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        diff += (a[i] - ref[i]) * (a[i] - ref[i]);
        norm += ref[i] * ref[i];
    }
    return std::sqrt(diff / norm);
}

// What the guard found on one stage 09 point.
struct Stage09Check {
    int64_t nonfinite = 0;     // NaN or inf among dq, dk, dv of both modes
    int zero = 0;              // gradients (of the six) that hold no nonzero finite value
    double modes_rel_l2 = 0;   // deterministic against atomic: the worst relative L2 of dq, dk, dv
    double modes_max_abs = 0;  // and the largest |difference|
    double dv_sum_rel = 0;     // sum_j dV_j against sum_i dO_i: relative L2 over (b, h, feature)
    double dk_sum_ratio = 0;   // RMS of sum_j dK_j over sqrt(Nk) times the RMS of dK

    bool ok() const {
        return nonfinite == 0 && zero == 0 && modes_rel_l2 <= kStage09ModesRelL2 && dv_sum_rel <= kStage09DvSumRel &&
               dk_sum_ratio <= kStage09DkSumRatio;
    }
    // The verdict and the figures, on a backward row.
    void mark(Record& r) const {
        r.check = ok() ? "ok" : "BAD";
        r.check_max_abs = modes_max_abs;
        r.check_rel_l2 = modes_rel_l2;
        r.check_nonfinite = nonfinite;
        r.dv_sum_rel = dv_sum_rel;
        r.dk_sum_ratio = dk_sum_ratio;
        r.zero_gradients = zero;
    }
};

// Stage 09's gross-error guard on one point, independent of any other implementation: a fresh
// forward, then the backward in both dQ modes into gradients poisoned with NaN. Every gradient
// must be finite and not all zero, the modes must agree, and the atomic mode's dK and dV must
// obey two sums that hold for the exact gradients of any inputs, because every row of P sums to 1
// and so every row of dS = P o (dP - D) sums to 0 (for rows that see a key: all of them when
// Nq = Nk, as in the sweep):
//   sum_j dV_j = sum_j sum_i P_ij dO_i          = sum_i dO_i
//   sum_j dK_j = scale sum_i (sum_j dS_ij) Q_i  = 0
// The dK sum is held against sqrt(Nk) times the RMS of dK: what a sum of Nk unrelated rows of that
// size would give.
template <class T>
Stage09Check check_stage09(const fa::Problem& p, const HalfBackward<T>& g, float* scratch,
                           const std::function<void(cudaStream_t)>& forward,
                           const std::function<void(bool, cudaStream_t)>& backward) {
    forward(nullptr);
    std::vector<float> grads[2][3];  // [atomic, deterministic][dq, dk, dv], widened to float32
    for (int mode = 0; mode < 2; ++mode) {
        g.poison_gradients();
        backward(mode == 1, nullptr);
        grads[mode][0] = widen_to_host(fa::View4<const T>(g.dq), scratch);
        grads[mode][1] = widen_to_host(fa::View4<const T>(g.dk), scratch);
        grads[mode][2] = widen_to_host(fa::View4<const T>(g.dv), scratch);
    }
    Stage09Check c;
    for (const auto& mode : grads) {
        for (const std::vector<float>& x : mode) {
            bool nonzero = false;
            for (float v : x) {
                if (!std::isfinite(v)) {
                    ++c.nonfinite;
                } else if (v != 0.0f) {
                    nonzero = true;
                }
            }
            c.zero += nonzero ? 0 : 1;
        }
    }
    for (int i = 0; i < 3; ++i) {
        const fa::Metrics m = fa::compare(grads[1][i], grads[0][i]);
        c.modes_rel_l2 = std::max(c.modes_rel_l2, m.rel_l2);
        c.modes_max_abs = std::max(c.modes_max_abs, m.max_abs);
    }
    const int64_t d = p.head_dim;
    const std::vector<double> dout_sum = sum_over_rows(widen_to_host(g.dout, scratch), p.seq_q, d);
    c.dv_sum_rel = rel_l2(sum_over_rows(grads[0][2], p.seq_k, d), dout_sum);
    c.dk_sum_ratio = rms(sum_over_rows(grads[0][1], p.seq_k, d)) / (std::sqrt(double(p.seq_k)) * rms(grads[0][1]));
    return c;
}

// One point of stage 09 in the 16-bit type T, with what it runs on (`in`: stage 07's tensors of
// that type, `g`: stage 09's, one workspace for every call at this shape, the guard's scratch).
template <class T>
struct Point09 {
    Sweep& sweep;
    const fa::Problem& p;
    const std::string& t;
    const fa::cuda::HalfTensors<T>& in;
    const HalfBackward<T>& g;
    fa::stage09::Workspace& workspace;
    float* scratch;

    void forward(cudaStream_t stream) const { fa::stage07::attention_device(p, in.q, in.k, in.v, in.o, g.lse, stream); }
    // Stage 09's backward at main kernel `step` (-1: the default one).
    void backward(int step, bool deterministic, cudaStream_t stream) const {
        fa::stage09::attention_backward_device(p, in.q, in.k, in.v, fa::View4<const T>(in.o), fa::View3<const float>(g.lse), g.dout,
                                               g.dq, g.dk, g.dv, deterministic, stream, &workspace, step);
    }
    // Times `launch` as a row of `impl` in `pass`, prints it and keeps it; returns its index.
    size_t row(const std::string& impl, const std::string& pass, const std::string& label, int step,
               const std::function<void(cudaStream_t)>& launch) const {
        Record r = make_record(impl, t, p, sweep.time(launch), pass);
        r.label = label;
        if (step >= 0) {
            r.step = step;
            r.step_name = fa::stage09::road()[size_t(step)].name;
        }
        sweep.progress(r);
        sweep.records.push_back(std::move(r));
        return sweep.records.size() - 1;
    }
    // The guard on main kernel `step`; its verdict and figures go on the rows `marked`.
    Stage09Check guard(int step, std::initializer_list<size_t> marked) const {
        const Stage09Check c = check_stage09<T>(
            p, g, scratch, [&](cudaStream_t s) { forward(s); }, [&](bool det, cudaStream_t s) { backward(step, det, s); });
        for (size_t i : marked) c.mark(sweep.records[i]);
        sweep.verdict(c.ok());
        return c;
    }
};

// Four rows (the forward, the backward with atomic and with deterministic dQ additions, the pair),
// then the guard, whose verdict both backward rows carry. A point it refuses is also one where the
// --steps09 rows (default_rows09's caller) are not timed: false.
template <class T>
bool default_rows09(const Point09<T>& at) {
    Sweep& sweep = at.sweep;
    const std::vector<int>& steps09 = sweep.s.steps09;
    // One untimed run of each: the workspace grows here to what both modes need.
    if (!sweep.supported({"09", at.t, -1, at.p.head_dim, ""},
                         [&](cudaStream_t stream) {
                             at.forward(stream);
                             at.backward(-1, false, stream);
                             at.backward(-1, true, stream);
                             for (int s : steps09) at.backward(s, true, stream);
                         },
                         4 + rows_per_step09(sweep.s) * steps09.size())) {
        return false;
    }
    const size_t fwd = at.row("stage09", "forward", "stage09 fwd", -1, [&](cudaStream_t s) { at.forward(s); });
    const size_t atomic = at.row("stage09", "backward", "stage09 bwd", -1, [&](cudaStream_t s) { at.backward(-1, false, s); });
    const size_t fixed = at.row("stage09_deterministic", "backward", "stage09 bwd det", -1,
                                [&](cudaStream_t s) { at.backward(-1, true, s); });
    const size_t pair = at.row("stage09", "fwd+bwd", "stage09 fwd+bwd", -1, [&](cudaStream_t s) {
        at.forward(s);
        at.backward(-1, false, s);
    });
    std::vector<Record>& rows = sweep.records;
    rows[pair].sum_of_medians_ms = rows[fwd].median_ms + rows[atomic].median_ms;
    rows[fixed].time_over_atomic = rows[fixed].median_ms / rows[atomic].median_ms;
    std::printf("          forward + backward medians %.3f ms (the pair: %.3f ms); deterministic dQ costs the backward %+.1f%%\n",
                rows[pair].sum_of_medians_ms, rows[pair].median_ms, 100.0 * (rows[fixed].time_over_atomic - 1.0));
    if (!sweep.s.check) return true;
    const Stage09Check c = at.guard(-1, {atomic, fixed});
    std::printf("          guard: deterministic vs atomic rel_l2 %.2e (max_abs %.2e); sum dV vs sum dO rel_l2 %.2e; "
                "|sum dK| / (sqrt(Nk) rms dK) %.2e%s%s%s\n",
                c.modes_rel_l2, c.modes_max_abs, c.dv_sum_rel, c.dk_sum_ratio,
                c.nonfinite ? (", " + std::to_string(c.nonfinite) + " NaN/inf").c_str() : "",
                c.zero ? (", " + std::to_string(c.zero) + " gradient(s) all zero").c_str() : "", c.ok() ? "" : "  BAD");
    std::fflush(stdout);
    return true;
}

// Other main kernels of stage 09 (--steps09) at the same point: the backward with atomic dQ, the
// fwd+bwd pair and the backward with deterministic dQ (rows stage09_step<i>_deterministic), or
// the first alone with --steps09-backward-only; then the guard run on that kernel alone, which
// runs both dQ modes either way.
template <class T>
void step_rows09(const Point09<T>& at) {
    Sweep& sweep = at.sweep;
    for (int step : sweep.s.steps09) {
        const std::string impl = "stage09_step" + std::to_string(step);
        const size_t bwd = at.row(impl, "backward", impl + " bwd", step, [&](cudaStream_t s) { at.backward(step, false, s); });
        if (!sweep.s.steps09_backward_only) {
            at.row(impl, "fwd+bwd", impl + " fwd+bwd", step, [&](cudaStream_t s) {
                at.forward(s);
                at.backward(step, false, s);
            });
            const size_t det = at.row(impl + "_deterministic", "backward", impl + " bwd det", step,
                                      [&](cudaStream_t s) { at.backward(step, true, s); });
            Record& r = sweep.records[det];
            r.time_over_atomic = r.median_ms / sweep.records[bwd].median_ms;
            std::printf("          %s: deterministic dQ costs the backward %+.1f%%\n", impl.c_str(), 100.0 * (r.time_over_atomic - 1.0));
        }
        if (!sweep.s.check) continue;
        const Stage09Check c = at.guard(step, {bwd});
        std::printf("          guard (%s): deterministic vs atomic rel_l2 %.2e; sum dV vs sum dO rel_l2 %.2e; "
                    "|sum dK| / (sqrt(Nk) rms dK) %.2e%s\n",
                    impl.c_str(), c.modes_rel_l2, c.dv_sum_rel, c.dk_sum_ratio, c.ok() ? "" : "  BAD");
        std::fflush(stdout);
    }
}

}  // namespace

void time_stage09(Sweep& sweep, ShapeTensors& shape) {
    if (!sweep.s.has09) return;
    for (const std::string& t : sweep.s.dtypes) {
        if (t == "bf16") {
            const Point09<__nv_bfloat16> at{sweep, shape.p, t, *shape.half.bf16, *shape.grads.bf16, shape.workspace09,
                                            shape.scratch09.data()};
            if (default_rows09(at)) step_rows09(at);
        } else {
            const Point09<__half> at{sweep, shape.p, t, *shape.half.fp16, *shape.grads.fp16, shape.workspace09, shape.scratch09.data()};
            if (default_rows09(at)) step_rows09(at);
        }
    }
}

}  // namespace bench
