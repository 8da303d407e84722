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
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>

#include "../stages/05_shared_memory_kernel/attention.cuh"
#include "../stages/06_causal_masking/attention.cuh"
#include "../stages/07_pipelined_fused_kernel/attention.cuh"
#include "../stages/09_backward_kernel/attention.cuh"
#ifdef FA_HAVE_STAGE11
#include "../stages/11_hopper_kernel/attention.cuh"
#include "fa/cuda/hopper.hpp"
#endif
#include "fa/cli.hpp"
#include "fa/counts.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/buffer.hpp"
#include "fa/cuda/half.hpp"
#include "fa/cuda/stage.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/cuda/timing.hpp"
#include "fa/error.hpp"
#include "fa/metrics.hpp"
#include "fa/varlen.hpp"

namespace {

// Stage 07 against stage 06: bf16 rounding of q, k, v, P and O leaves a relative L2 error of a
// few 1e-3 on these inputs; 2e-2 is far above that and far below what a wrong tile or a missed
// rescale gives.
constexpr double kStage07GrossRelL2 = 2e-2;
// Stage 05 against stage 06: the same float32 arithmetic in a different order.
constexpr double kFp32MaxAbs = 1e-4;
// Stage 09's guard (check_stage09). Deterministic against atomic dQ: the same float32 products
// added in another order, then rounded to 16 bits; dK and dV do not depend on the mode.
constexpr double kStage09ModesRelL2 = 1e-2;
// sum_j dV_j against sum_i dO_i: the rounding of P and dV leaves about 3e-4 in bf16 and 5e-5 in
// fp16 on these inputs (a model of the kernels' roundings; every point prints what it measured);
// a wrong mask or LSE, or a lost tile, moves the sum by the size of what it drops.
constexpr double kStage09DvSumRel = 1e-2;
// |sum_j dK_j| against the sum of Nk unrelated rows of dK's size: the rounding of O (in D_i), dS
// and dK leaves about 3e-3 in bf16 and 4e-4 in fp16 by the same model; a backward that drops D_i
// gives about 1.
constexpr double kStage09DkSumRatio = 5e-2;
// dO of the stage 09 points: normal, standard deviation 1, from its own seed (q, k, v use 1234).
constexpr uint64_t kDoutSeed = 4321;
// Stage 11 against stage 07's final kernel, both in the same 16-bit type from the same rounded
// inputs: each rounds O once to 16 bits (at most one unit in the last place apart, 2u |O|) and
// rounds P to 16 bits before P V (about u per weight, mostly cancelling). Eight unit roundoffs u of
// the type times the largest |O| (at least 1) is well above that and below what a lost tile or a
// wrong mask does to the rows it touches; the relative L2 bound is stage 07's gross one.
constexpr double kStage11MaxAbsUnits = 8;
constexpr double kStage11RelL2 = kStage07GrossRelL2;
// The LSE of both: float32 sums of the same exponentials in another order (about 1e-6 here).
constexpr double kStage11LseMaxAbs = 1e-2;

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
    std::string check;           // "ok", "BAD", or "" when not checked
    // Stage 07: against stage 06. Stage 11: O against stage 07's final kernel. Stage 09's backward
    // rows: deterministic against atomic, the worst of dq, dk, dv.
    double check_max_abs = -1, check_rel_l2 = -1;
    double dv_sum_rel = -1, dk_sum_ratio = -1;  // stage 09's backward rows: the two sums of the guard
    std::string spec;  // stage 10's --model07 rows: the point as given (GROUP/LEFT/RIGHT[/SOFTCAP[/DROPOUT]])
    std::string note;  // stage 10's rows: what the row measured beyond its columns, or "refused: " and why
};

std::string today() {
    const std::time_t now = std::time(nullptr);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
    return buf;
}

// A string as a JSON literal.
std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out + "\"";
}

// A string as a CSV field: quoted when it holds a comma or a quote.
std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string out = "\"";
    for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    return out + "\"";
}

// A non-negative figure with six significant digits, or "" for the -1 of "not measured".
std::string optional_number(double x) {
    if (x < 0) return "";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", x);
    return buf;
}

// A time or rate as a JSON value: null for the -1 of a refused row.
std::string json_time(double x) { return x < 0 ? "null" : optional_number(x); }

// A device array of floats, copied to the host.
std::vector<float> to_host(const float* device, int64_t n) {
    std::vector<float> host(static_cast<size_t>(n));
    FA_CUDA_CHECK(cudaMemcpy(host.data(), device, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}

// Largest |a - b| over two equally long device arrays.
double max_abs_diff(const float* a, const float* b, int64_t n) {
    const std::vector<float> ha = to_host(a, n), hb = to_host(b, n);
    double worst = 0;
    for (size_t i = 0; i < ha.size(); ++i) {
        const double d = std::fabs(double(ha[i]) - double(hb[i]));
        if (!(d <= worst)) worst = d;  // NaN counts as the worst
    }
    return worst;
}

// The steps an option (--steps for stage 07, --steps11 for stage 11) names: indices into the
// stage's road, or every step for "all" / "road"; the final kernel when none is named. Throws
// fa::InputError naming the bad value and the steps there are.
std::vector<int> resolve_steps(const std::vector<std::string>& args, const std::vector<fa::RoadStep>& road, int final_step,
                               const std::string& option, const std::string& stage) {
    if (args.empty()) return {final_step};
    std::vector<int> steps;
    for (const std::string& a : args) {
        if (a == "all" || a == "road") {
            for (int i = 0; i < int(road.size()); ++i) steps.push_back(i);
            continue;
        }
        size_t used = 0;
        int step = -1;
        try {
            step = std::stoi(a, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != a.size() || step < 0 || step >= int(road.size())) {
            std::string list;
            for (size_t i = 0; i < road.size(); ++i) list += "\n  " + std::to_string(i) + " " + road[i].name;
            throw fa::InputError(option + " " + a + " is not a step of stage " + stage + ": use all, road, or numbers from 0 to " +
                                 std::to_string(road.size() - 1) + ":" + list);
        }
        steps.push_back(step);
    }
    std::sort(steps.begin(), steps.end());
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    return steps;
}

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
        r.dv_sum_rel = dv_sum_rel;
        r.dk_sum_ratio = dk_sum_ratio;
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

}  // namespace

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
    std::string variant() const {
        const auto bound = [](int64_t b) { return b < 0 ? std::string("all") : std::to_string(b); };
        const auto number = [](double x) {
            char buf[32];
            std::snprintf(buf, sizeof buf, "%g", x);
            return std::string(buf);
        };
        std::string out;
        const auto add = [&](const std::string& part) { out += (out.empty() ? "" : "_") + part; };
        if (group > 1) add("gqa" + std::to_string(group));
        if (window.left >= 0 || window.right != 0) {
            add("window" + bound(window.left) + (window.right != 0 ? "r" + bound(window.right) : ""));
        }
        if (softcap > 0) add("softcap" + number(softcap));
        if (dropout > 0) add("dropout" + number(dropout));
        return out.empty() ? "causal" : out;
    }
};

Model07 parse_model07(const std::string& spec) {
    std::vector<double> x;
    size_t start = 0;
    while (start <= spec.size()) {
        const size_t slash = spec.find('/', start);
        const std::string part = spec.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
        try {
            size_t used = 0;
            x.push_back(std::stod(part, &used));
            if (used != part.size()) throw std::invalid_argument(part);
        } catch (const std::exception&) {
            throw fa::InputError("--model07 " + spec + ": expected GROUP/LEFT/RIGHT[/SOFTCAP[/DROPOUT]], numbers");
        }
        if (slash == std::string::npos) break;
        start = slash + 1;
    }
    if (x.size() < 3 || x.size() > 5 || x[0] < 1) {
        throw fa::InputError("--model07 " + spec + ": expected GROUP/LEFT/RIGHT[/SOFTCAP[/DROPOUT]] with GROUP >= 1");
    }
    return {spec, int64_t(x[0]), fa::Window{int64_t(x[1]), int64_t(x[2])}, x.size() >= 4 ? x[3] : 0.0, x.size() == 5 ? x[4] : 0.0};
}

// FLOPs of `pairs` visible (query, key) pairs, summed over heads and batch entries, at head
// dimension d in one pass: 4 d per pair forward (two products of 2 d), times the ratio of
// fa::attention_flops_backward (fa::attention_flops_fwd_bwd) to fa::attention_flops for the
// backward (the pair). Masked pairs, windows' and padding's, are not counted.
double visible_flops(double pairs, int64_t d, const std::string& pass) {
    const fa::Problem any;  // the ratios do not depend on the shape
    const double per_forward = pass == "backward"  ? fa::attention_flops_backward(any) / fa::attention_flops(any)
                               : pass == "fwd+bwd" ? fa::attention_flops_fwd_bwd(any) / fa::attention_flops(any)
                                                   : 1.0;
    return 4.0 * double(d) * pairs * per_forward;
}

// A stage 10 row: `impl` on problem `p` (its causal flag: the window's right bound is 0) in one
// pass, in TFLOP/s of `pairs` visible pairs (visible_flops); `t` null: the entry point refused the
// point, and `note` says why (the times are then -1, written as empty fields and null).
Record stage10_record(const std::string& impl, const std::string& dtype, const fa::Problem& p, const std::string& pass,
                      double pairs, const fa::TimingStats* t, const std::string& spec, const std::string& note) {
    Record r;
    r.impl = impl, r.dtype = dtype, r.problem = p, r.pass = pass, r.spec = spec, r.note = note;
    if (t == nullptr) {
        r.median_ms = r.min_ms = r.max_ms = r.tflops = -1;
        return r;
    }
    r.median_ms = t->median_ms, r.min_ms = t->min_ms, r.max_ms = t->max_ms;
    r.tflops = visible_flops(pairs, p.head_dim, pass) / (t->median_ms * 1e-3) * 1e-12;
    r.sm_clock_mhz = fa::cuda::current_sm_clock_mhz();
    return r;
}

// One stage 10 point in every pass it has: the forward alone and, with a `backward` (not empty),
// the backward alone after one forward and the two timed as one pair (the L2 flushed before the
// pair, not between its halves). Each runs once untimed first (a stage 09 workspace grows there).
// An entry point that refuses the point (fa::InputError: dropout in a backward that does not
// apply it yet, a head dimension without a kernel) gives rows without times whose note is
// "refused: " and its message; the other passes go on. The forward's row comes first.
std::vector<Record> time_stage10(const std::string& impl, const std::string& dtype, const fa::Problem& p, double pairs,
                                 const std::string& spec, const std::string& note,
                                 const std::function<void(cudaStream_t)>& forward,
                                 const std::function<void(cudaStream_t)>& backward, int warmup, int repeat) {
    std::vector<Record> rows;
    const auto refused = [&](std::initializer_list<const char*> passes, const fa::InputError& e) {
        for (const char* pass : passes) {
            rows.push_back(stage10_record(impl, dtype, p, pass, pairs, nullptr, spec, std::string("refused: ") + e.what()));
        }
    };
    try {
        forward(nullptr);
    } catch (const fa::InputError& e) {
        backward ? refused({"forward", "backward", "fwd+bwd"}, e) : refused({"forward"}, e);
        return rows;
    }
    const fa::TimingStats f = fa::cuda::time_on_gpu(forward, warmup, repeat);
    rows.push_back(stage10_record(impl, dtype, p, "forward", pairs, &f, spec, note));
    if (!backward) return rows;
    try {
        backward(nullptr);
    } catch (const fa::InputError& e) {
        refused({"backward", "fwd+bwd"}, e);
        return rows;
    }
    const fa::TimingStats b = fa::cuda::time_on_gpu(backward, warmup, repeat);
    const fa::TimingStats fb = fa::cuda::time_on_gpu(
        [&](cudaStream_t s) {
            forward(s);
            backward(s);
        },
        warmup, repeat);
    rows.push_back(stage10_record(impl, dtype, p, "backward", pairs, &b, spec, note));
    rows.push_back(stage10_record(impl, dtype, p, "fwd+bwd", pairs, &fb, spec, note));
    return rows;
}

// One line per stage 10 row; `base` (may be null): the row of the same pass its time is held against.
void print_stage10(const Record& r, const Record* base, const char* base_name) {
    const fa::Problem& p = r.problem;
    std::printf("stage10 %-20s %s %-7s d=%-3lld N=%-5lld B=%-2lld Hq=%-2lld ", r.impl.substr(8).c_str(), r.dtype.c_str(),
                r.pass.c_str(), (long long)p.head_dim, (long long)p.seq_q, (long long)p.batch, (long long)p.heads);
    if (r.median_ms < 0) {
        std::printf("%s\n", r.note.c_str());
    } else {
        std::printf("%9.3f ms %6.1f TFLOP/s (visible pairs)", r.median_ms, r.tflops);
        if (base != nullptr && base->median_ms > 0) std::printf("; %.3f times the %s", r.median_ms / base->median_ms, base_name);
        std::printf("%s%s\n", r.note.empty() ? "" : "; ", r.note.c_str());
    }
    std::fflush(stdout);
}

// Stage 10's switches at one dense point (--model07), rows "stage10_<variant>" (Model07::variant()):
// stage 07's final kernel with each point's ModelOptions, and with `g` (stage 09 among --stages)
// stage 09's backward with the same options, beside the plain causal kernels of both on the same q
// (B, H, N, d) (rows "stage10_causal"). k and v (and dk, dv) are read as their first H / group
// heads, in place. TFLOP/s of the visible (query, key) pairs only; `lse`: the forward's when there
// is no backward (with one, g->lse).
template <class T>
void stage10_points(const fa::Problem& dense, const std::string& dtype, fa::cuda::HalfTensors<T>& half, fa::View3<float> lse,
                    HalfBackward<T>* g, fa::stage09::Workspace* workspace, const std::vector<Model07>& points, int warmup,
                    int repeat, std::vector<Record>& records) {
    fa::Problem causal = dense, windowed = dense;
    causal.causal = true;
    windowed.causal = false;  // the window says which keys each query sees
    const fa::View3<float> out_lse = g != nullptr ? g->lse : lse;
    const auto pairs_of = [&](fa::Window w) {
        int64_t pairs = 0;
        for (int64_t i = 0; i < dense.seq_q; ++i) pairs += fa::visible_key_range(i, dense.seq_q, dense.seq_k, w).size();
        return double(pairs) * double(dense.batch * dense.heads);
    };
    std::function<void(cudaStream_t)> plain_backward;
    if (g != nullptr) {
        plain_backward = [&](cudaStream_t s) {
            fa::stage09::attention_backward_device(causal, half.q, half.k, half.v, fa::View4<const T>(half.o),
                                                   fa::View3<const float>(g->lse), g->dout, g->dq, g->dk, g->dv, false, s, workspace);
        };
    }
    const std::vector<Record> base = time_stage10(
        "stage10_causal", dtype, causal, pairs_of(fa::Window::causal()), "", "",
        [&](cudaStream_t s) { fa::stage07::attention_device(causal, half.q, half.k, half.v, half.o, out_lse, s); }, plain_backward,
        warmup, repeat);
    const auto base_of = [&](const std::string& pass) -> const Record* {
        for (const Record& r : base) {
            if (r.pass == pass) return &r;
        }
        return nullptr;
    };
    for (const Record& r : base) print_stage10(r, nullptr, "");
    records.insert(records.end(), base.begin(), base.end());
    for (const Model07& m : points) {
        if (m.variant() == "causal") continue;  // the plain causal kernels, timed above
        fa::stage07::ModelOptions options;
        options.kv_heads = std::max<int64_t>(1, dense.heads / m.group), options.window = m.window, options.softcap = m.softcap;
        options.dropout = fa::Dropout{m.dropout, 2024, 0};  // p = 0: no dropout (the seed is then unused)
        fa::View4<const T> k = half.k, v = half.v;
        k.shape[1] = v.shape[1] = options.kv_heads;
        std::function<void(cudaStream_t)> backward;
        if (g != nullptr) {
            backward = [&, k, v](cudaStream_t s) {
                fa::View4<T> dk = g->dk, dv = g->dv;
                dk.shape[1] = dv.shape[1] = options.kv_heads;
                fa::stage09::attention_backward_device(windowed, options, half.q, k, v, fa::View4<const T>(half.o),
                                                       fa::View3<const float>(g->lse), g->dout, g->dq, dk, dv, false, s, workspace);
            };
        }
        fa::Problem shown = dense;  // the rows' problem: causal when no key after the diagonal is seen
        shown.causal = m.window.right == 0;
        const std::vector<Record> rows = time_stage10(
            "stage10_" + m.variant(), dtype, shown, pairs_of(m.window), m.spec, "Hk " + std::to_string(options.kv_heads),
            [&](cudaStream_t s) { fa::stage07::attention_device(windowed, options, half.q, k, v, half.o, out_lse, s); }, backward,
            warmup, repeat);
        for (const Record& r : rows) print_stage10(r, base_of(r.pass), "plain causal kernel's");
        records.insert(records.end(), rows.begin(), rows.end());
    }
}

// --varlen07: a packed batch of sequences of the given lengths (causal, each sequence aligned
// bottom-right, Hq = Hk = H) through stage 07's attention_varlen_device (rows "stage10_varlen"),
// beside the same kernel on a packed batch of B equal lengths (the same tokens, up to B - 1
// dropped: "stage10_varlen_uniform") and the dense causal kernel on that uniform batch
// ("stage10_dense_uniform"); with `backward`, stage 09's attention_backward_varlen_device and its
// dense call after each. Every row's problem is B sequences of H heads with N the mixed batch's
// tokens (its note gives the uniform batch's shape); TFLOP/s of the visible (query, key) pairs
// only. The packed calls' times include what the call does on the host (checking cu_seqlens,
// building and copying the schedule).
template <class T>
void stage10_varlen(const std::vector<int64_t>& lengths, int64_t heads, int64_t d, const std::string& dtype, bool backward,
                    int warmup, int repeat, std::vector<Record>& records) {
    const auto packed_problem = [&](const std::vector<int64_t>& lens) {
        fa::VarlenProblem vp;
        vp.cu_seqlens_q = vp.cu_seqlens_k = fa::cu_seqlens_from_lengths(lens);
        vp.total_q = vp.total_k = vp.cu_seqlens_q.back();
        vp.heads_q = vp.heads_k = heads, vp.head_dim = d, vp.window = fa::Window::causal();
        return vp;
    };
    const fa::VarlenProblem mixed = packed_problem(lengths);
    const int64_t total = mixed.total_q, batch = mixed.batch(), n = std::max<int64_t>(1, total / batch);
    const fa::VarlenProblem uniform = packed_problem(std::vector<int64_t>(size_t(batch), n));
    const int64_t rows = std::max(total, uniform.total_q);
    // q, k, v and dO: normal, standard deviation 1, drawn on the device (seeds 1, 2, 3 and dO's),
    // packed (rows, H, d) in T. The gradients and the workspace only with a backward.
    const auto draw = [&](uint64_t seed) {
        fa::cuda::DeviceBuffer<float> f(size_t(rows * heads * d));
        fa::cuda::fill_normal(f.data(), rows * heads * d, seed, 1.0f);
        fa::cuda::DeviceBuffer<T> h(size_t(rows * heads * d));
        fa::cuda::convert(fa::make_packed_view(static_cast<const float*>(f.data()), rows, heads, d),
                          fa::make_packed_view(h.data(), rows, heads, d));
        FA_CUDA_CHECK(cudaDeviceSynchronize());  // the rounding has read f before it is freed
        return h;
    };
    const fa::cuda::DeviceBuffer<T> q = draw(1), k = draw(2), v = draw(3);
    const fa::cuda::DeviceBuffer<T> dout = backward ? draw(kDoutSeed) : fa::cuda::DeviceBuffer<T>(0);
    const size_t grad_elems = backward ? size_t(rows * heads * d) : 0;
    fa::cuda::DeviceBuffer<T> o(size_t(rows * heads * d)), dq(grad_elems), dk(grad_elems), dv(grad_elems);
    fa::cuda::DeviceBuffer<float> lse(size_t(rows * heads));
    fa::stage09::Workspace workspace;
    fa::Problem shown;  // what the rows say: B sequences, H heads, N tokens in all
    shown.batch = batch, shown.heads = heads, shown.seq_q = shown.seq_k = total, shown.head_dim = d, shown.causal = true;
    const auto time_packed = [&](const fa::VarlenProblem& vp, const std::string& impl, const std::string& note) {
        fa::cuda::DeviceBuffer<int32_t> cu(vp.cu_seqlens_q.size());
        cu.copy_from_host(vp.cu_seqlens_q.data(), vp.cu_seqlens_q.size());
        fa::cuda::DeviceBuffer<int32_t> schedule(size_t(fa::stage07::varlen_schedule_ints(vp)));
        fa::cuda::DeviceBuffer<int32_t> schedule09(backward ? size_t(fa::stage09::varlen_backward_schedule_ints(vp)) : 0);
        const auto in_view = [&](const fa::cuda::DeviceBuffer<T>& x) {
            return fa::make_packed_view(static_cast<const T*>(x.data()), vp.total_q, heads, d);
        };
        const auto out_view = [&](fa::cuda::DeviceBuffer<T>& x) { return fa::make_packed_view(x.data(), vp.total_q, heads, d); };
        const fa::View3<float> lv{lse.data(), {1, heads, vp.total_q}, {heads * vp.total_q, vp.total_q, 1}};
        const fa::stage07::MaxSeqlens max{vp.max_seq_q(), vp.max_seq_k()};
        std::function<void(cudaStream_t)> bwd;
        if (backward) {
            bwd = [&](cudaStream_t s) {
                fa::stage09::attention_backward_varlen_device(vp, max, in_view(q), in_view(k), in_view(v), in_view(o),
                                                              fa::View3<const float>(lv), in_view(dout), out_view(dq),
                                                              out_view(dk), out_view(dv),
                                                              fa::stage09::VarlenBackwardArrays{cu.data(), cu.data(), schedule09.data()},
                                                              false, s, &workspace);
            };
        }
        return time_stage10(
            impl, dtype, shown, double(vp.visible_pairs_per_head()) * double(heads), "", note,
            [&](cudaStream_t s) {
                fa::stage07::attention_varlen_device(vp, max, in_view(q), in_view(k), in_view(v), out_view(o), lv,
                                                     fa::stage07::VarlenDeviceArrays{cu.data(), cu.data(), schedule.data()}, s);
            },
            bwd, warmup, repeat);
    };
    const std::string uniform_note = std::to_string(batch) + " x " + std::to_string(n) + " tokens";
    std::vector<std::vector<Record>> all;
    all.push_back(time_packed(mixed, "stage10_varlen", "longest " + std::to_string(mixed.max_seq_q())));
    all.push_back(time_packed(uniform, "stage10_varlen_uniform", uniform_note + ", packed"));
    // The uniform packed rows read as (B, H, N, d) by the dense kernels.
    fa::Problem p;
    p.batch = batch, p.heads = heads, p.seq_q = p.seq_k = n, p.head_dim = d, p.causal = true;
    const auto dense = [&](const fa::cuda::DeviceBuffer<T>& x) {
        return fa::View4<const T>{x.data(), {batch, heads, n, d}, {n * heads * d, d, heads * d, 1}};
    };
    const auto dense_out = [&](fa::cuda::DeviceBuffer<T>& x) {
        return fa::View4<T>{x.data(), {batch, heads, n, d}, {n * heads * d, d, heads * d, 1}};
    };
    const fa::View3<float> ld{lse.data(), {batch, heads, n}, {heads * n, n, 1}};
    std::function<void(cudaStream_t)> dense_bwd;
    if (backward) {
        dense_bwd = [&](cudaStream_t s) {
            fa::stage09::attention_backward_device(p, dense(q), dense(k), dense(v), dense(o), fa::View3<const float>(ld), dense(dout),
                                                   dense_out(dq), dense_out(dk), dense_out(dv), false, s, &workspace);
        };
    }
    all.push_back(time_stage10(
        "stage10_dense_uniform", dtype, shown, double(uniform.visible_pairs_per_head()) * double(heads), "", uniform_note + ", dense",
        [&](cudaStream_t s) { fa::stage07::attention_device(p, dense(q), dense(k), dense(v), dense_out(o), ld, s); }, dense_bwd,
        warmup, repeat));
    // Each row against the dense kernel's on the uniform batch in the same pass, by rate (the
    // batches' visible pairs differ).
    for (const std::vector<Record>& rows_of : all) {
        for (const Record& r : rows_of) {
            const Record* base = nullptr;
            for (const Record& b : all.back()) base = b.pass == r.pass && b.median_ms > 0 ? &b : base;
            print_stage10(r, nullptr, "");
            if (base != nullptr && r.median_ms > 0 && &rows_of != &all.back()) {
                std::printf("          rate over the dense kernel's on the uniform batch: %.3f\n", r.tflops / base->tflops);
            }
            records.push_back(r);
        }
    }
}

int main(int argc, char** argv) {
    CLI::App app{"flashcourse bench_gpu: GPU stages 05, 06 (float32), 07 (bf16, fp16), 09 (the backward after stage "
                 "07's forward, bf16, fp16) and 11 (the Hopper kernel, bf16, fp16) over a sweep of shapes, timed with CUDA events"};
    std::vector<int64_t> sizes{512, 1024, 2048, 4096, 8192, 16384};
    std::vector<int64_t> head_dims{64, 128};
    std::vector<std::string> stages{"05", "06", "07"};
    std::vector<std::string> dtypes{"bf16", "fp16"};
    std::vector<std::string> step_args;
    std::vector<std::string> step11_args;
    bool road05 = false;
    std::vector<int> steps09;
    bool steps09_backward_only = false;
    std::vector<std::string> model07_args;
    std::string causal_mode = "both";
    int64_t tokens = 16384, width = 2048;
    int repeat = 30, warmup = 5;
    bool check = true;
    bool schedule_ablation = true;
    double mma_ceiling_tflops = 0;
    double wgmma_ceiling_tflops = 0;
    std::string json_path = "bench_gpu.json", csv_path = "bench_gpu.csv";
    std::vector<Model07> model07;
    std::vector<int64_t> varlen07;
    app.add_option("--sizes", sizes, "sequence lengths N (Nq = Nk)")->capture_default_str();
    app.add_option("--head-dims", head_dims, "head dimensions d")->capture_default_str();
    app.add_option("--stages", stages,
                   "stages to time: 05, 06 (float32), 07 (bf16/fp16), 09 (bf16/fp16: stage 07's forward, stage 09's "
                   "backward with atomic and deterministic dQ, and the two as one pair), 11 (bf16/fp16: the Hopper "
                   "kernel, on an sm_90 GPU only, checked against stage 07's final kernel)")
        ->check(CLI::IsMember({"05", "06", "07", "09", "11"}))
        ->capture_default_str();
    app.add_option("--dtypes", dtypes, "16-bit types stages 07, 09 and 11 run in")->check(CLI::IsMember({"bf16", "fp16"}))->capture_default_str();
    app.add_option("--steps", step_args,
                   "stage 07 steps to time: indices into its road (see stage07 --help), or all / road for every step, "
                   "with the tuning candidates of a -DFA_STAGE07_TUNING=ON build (default: the final kernel)");
    app.add_option("--steps11", step11_args,
                   "with stage 11: steps of its road to time (see stage11_hopper_kernel --help), as numbers "
                   "(comma-separated or not), or all / road for every step; 0 is stage 07's final kernel. Rows "
                   "stage11_step<i>, the final kernel's row stage11 (default: the final kernel alone)")
        ->delimiter(',');
    app.add_flag("--road05", road05,
                 "with stage 05: time every step of its road (see stage05 --help), each checked against the final "
                 "kernel's output; rows stage05_step<i>, the final kernel's row stage05");
    app.add_option("--steps09", steps09,
                   "with stage 09: main kernels of its road (see stage09 --help) timed beside the default one, rows "
                   "stage09_step<i> (backward with atomic dQ, fwd+bwd) and stage09_step<i>_deterministic (backward with "
                   "deterministic dQ; --steps09-backward-only: the first alone), each checked by the guard")
        ->check(CLI::Range(0, int(fa::stage09::road().size()) - 1));
    app.add_flag("--steps09-backward-only", steps09_backward_only,
                 "with --steps09: time each of those steps' backward with atomic dQ alone (rows stage09_step<i>, pass "
                 "backward), without its fwd+bwd and deterministic rows; the guard still runs on each step");
    app.add_option("--model07", model07_args,
                   "stage 10's switches: stage 07's final kernel with them and, with stage 09 among --stages, stage 09's "
                   "backward with them (backward alone and fwd+bwd), beside the plain causal kernels at each point "
                   "(rows stage10_causal): GROUP/LEFT/RIGHT[/SOFTCAP[/DROPOUT]] (Hk = H / GROUP; window (LEFT, RIGHT), "
                   "-1 unbounded; soft cap c, 0 off; dropout p, 0 off), e.g. 8/-1/0 (GQA 8:1, causal: rows stage10_gqa8), "
                   "1/4095/0 (a 4096-key causal window: stage10_window4095) or 1/-1/0/0/0.1 (causal with dropout 0.1: "
                   "stage10_dropout0.1); TFLOP/s of the visible pairs; a pass an entry point refuses is a row without "
                   "times whose note says why; repeatable");
    app.add_option("--varlen07", varlen07,
                   "stage 10's packed batch: stage 07 (and, with stage 09 among --stages, stage 09's backward) on one "
                   "packed batch of sequences of these lengths (comma-separated; causal, H = width / d; rows "
                   "stage10_varlen), beside a uniform batch of the same tokens packed (stage10_varlen_uniform) and dense "
                   "(stage10_dense_uniform), for each d and dtype, before the sweep; N of these rows is the tokens in all")
        ->delimiter(',');
    app.add_option("--causal", causal_mode, "no, yes or both")->check(CLI::IsMember({"no", "yes", "both"}))->capture_default_str();
    app.add_option("--tokens", tokens, "B * N: batch = tokens / N")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--width", width, "H * d: heads = width / d")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--repeat", repeat, "timed runs per point (the median is reported)")->check(CLI::Range(1, 10000))->capture_default_str();
    app.add_option("--warmup", warmup, "untimed runs before timing")->check(CLI::Range(0, 1000))->capture_default_str();
    app.add_option("--check", check,
                   "check every point: stage 05 against stage 06, stage 07 against stage 06's float32 output (d <= 128), "
                   "stage 09's gradients by its guard (both dQ modes agree; sum_j dV_j = sum_i dO_i; sum_j dK_j = 0)")
        ->capture_default_str();
    app.add_option("--schedule-ablation", schedule_ablation,
                   "for causal stage 06 points, also time both orders of the query tiles (heaviest first, in order)")
        ->capture_default_str();
    app.add_option("--mma-ceiling-tflops", mma_ceiling_tflops,
                   "the mma.sync bf16 rate mma_ceiling measured: stage 07 points then print their fraction of it")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--wgmma-ceiling-tflops", wgmma_ceiling_tflops,
                   "the dense wgmma bf16 rate wgmma_ceiling measured: stage 11 points then print their fraction of it")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--json", json_path, "where to write the results as JSON")->capture_default_str();
    app.add_option("--csv", csv_path, "where to write the results as CSV")->capture_default_str();
    // Every argument error exits with kExitBadInput (2) and a message naming the option.
    if (const int rc = fa::parse_command_line(app, argc, argv); rc >= 0) return rc;

    std::vector<int> steps07, steps11;
    try {
        steps07 = resolve_steps(step_args, fa::stage07::road(), fa::stage07::final_step(), "--steps", "07");
        for (const std::string& spec : model07_args) model07.push_back(parse_model07(spec));
        if (!varlen07.empty()) fa::cu_seqlens_from_lengths(varlen07);  // lengths >= 0, totals that fit: checked before any GPU work
#ifdef FA_HAVE_STAGE11
        steps11 = resolve_steps(step11_args, fa::stage11::road(), fa::stage11::final_step(), "--steps11", "11");
#endif
    } catch (const fa::InputError& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return fa::kExitBadInput;
    }
    const std::string reason = fa::cuda::gpu_unavailable_reason();
    if (!reason.empty()) {
        std::printf("skipped: bench_gpu needs a CUDA GPU (%s)\n", reason.c_str());
        return fa::kExitSkipped;
    }
    // Course order, whatever the command line's: stage 06's output is then the reference stage 07 meets.
    std::sort(stages.begin(), stages.end());
    stages.erase(std::unique(stages.begin(), stages.end()), stages.end());
    const bool has05 = std::count(stages.begin(), stages.end(), "05") > 0;
    const bool has06 = std::count(stages.begin(), stages.end(), "06") > 0;
    const bool has07 = std::count(stages.begin(), stages.end(), "07") > 0;
    const bool has09 = std::count(stages.begin(), stages.end(), "09") > 0;
    // Stage 11 runs where it was built and the GPU has Hopper's instructions; otherwise one line says why not.
    bool has11 = std::count(stages.begin(), stages.end(), "11") > 0;
#ifdef FA_HAVE_STAGE11
    const std::string no_hopper = fa::cuda::hopper_unavailable_reason();
#else
    const std::string no_hopper = "this build has no stage 11 (it is built with CUDA, for sm_90a)";
#endif
    if (has11 && !no_hopper.empty()) {
        std::printf("skipped    stage 11: it needs a Hopper GPU (sm_90a): %s\n", no_hopper.c_str());
        has11 = false;
    }
    std::vector<bool> causal_values;
    if (causal_mode != "yes") causal_values.push_back(false);
    if (causal_mode != "no") causal_values.push_back(true);
    const fa::cuda::GpuInfo gpu = fa::cuda::gpu_info();
    const std::string date = today();
    const auto& road = fa::stage07::road();
    std::printf("gpu        %s\n", gpu.describe().c_str());
    std::printf("method     CUDA events, %d warm-up runs, L2 flushed (%zu MiB written) before each of %d timed runs, median\n",
                warmup, fa::cuda::l2_flush_bytes() >> 20, repeat);
    if (has07) {
        std::printf("stage 07   %s; steps:", [&] {
            std::string s;
            for (const std::string& t : dtypes) s += (s.empty() ? "" : " and ") + t;
            return s;
        }().c_str());
        for (int s : steps07) std::printf(" %d (%s)", s, road[size_t(s)].name.c_str());
        std::printf("%s\n", int(road.size()) > fa::stage07::final_step() + 1 ? "; tuning build" : "");
    }
#ifdef FA_HAVE_STAGE11
    const auto& road11 = fa::stage11::road();
    if (has11) {
        std::printf("stage 11   %s; steps:", [&] {
            std::string s;
            for (const std::string& t : dtypes) s += (s.empty() ? "" : " and ") + t;
            return s;
        }().c_str());
        for (int s : steps11) std::printf(" %d (%s)", s, road11[size_t(s)].name.c_str());
        std::printf("; each checked against stage 07 step %d (%s) in its type\n", fa::stage07::final_step(),
                    road[size_t(fa::stage07::final_step())].name.c_str());
    }
#endif
    if (has09) {
        std::printf("stage 09   forward: stage 07 step %d (%s); backward: dQ by atomics and deterministic; "
                    "fwd+bwd: the two timed as one pair\n",
                    fa::stage07::final_step(), road[size_t(fa::stage07::final_step())].name.c_str());
        std::printf("stage 09   main kernel: step %d (%s)", fa::stage09::kDefaultStep,
                    fa::stage09::road()[size_t(fa::stage09::kDefaultStep)].name.c_str());
        for (int s : steps09) std::printf("; beside it step %d (%s)", s, fa::stage09::road()[size_t(s)].name.c_str());
        std::printf("%s\n", !steps09.empty() && steps09_backward_only ? "; those steps: the backward with atomic dQ alone" : "");
    }

    const auto stage06_with = [](fa::stage06::Schedule schedule) -> fa::cuda::DeviceAttentionFn {
        return [schedule](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                          fa::View4<float> o, fa::View3<float> lse, cudaStream_t stream) {
            fa::stage06::attention_device(p, q, k, v, o, lse, stream, schedule);
        };
    };
    const auto stage05_step = [](int step) -> fa::cuda::DeviceAttentionFn {
        return [step](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                      fa::View4<float> o, fa::View3<float> lse, cudaStream_t stream) {
            fa::stage05::attention_device(p, q, k, v, o, lse, stream, step);
        };
    };
    std::vector<Record> records;
    // Rows of each --steps09 step at a point: the backward with atomic dQ, the pair and the
    // deterministic backward, or the first alone (--steps09-backward-only).
    const size_t rows_per_step09 = steps09_backward_only ? 1 : 3;
    size_t points = sizes.size() * head_dims.size() * causal_values.size() *
                    ((has05 ? (road05 ? size_t(fa::stage05::final_step()) + 1 : 1) : 0) + (has06 ? 1 : 0) + (has07 ? dtypes.size() * steps07.size() : 0) +
                     (has09 ? dtypes.size() * (4 + rows_per_step09 * steps09.size()) : 0) + (has11 ? dtypes.size() * steps11.size() : 0));
    size_t done = 0;
    bool any_bad = false;
    std::set<std::string> skipped;  // (stage, dtype, step, d) already reported as unsupported

    // Runs `launch` once untimed; false (with one line, once per `key`) when the entry point refuses
    // the problem (a head dimension or step that has no kernel), so the sweep goes on without the
    // `planned` points that launch stands for.
    const auto supported = [&](const std::string& key, const std::function<void(cudaStream_t)>& launch, size_t planned = 1) {
        try {
            launch(nullptr);
            return true;
        } catch (const fa::InputError& e) {
            if (skipped.insert(key).second) std::printf("          skipped %s: %s\n", key.c_str(), e.what());
            points -= planned;
            return false;
        }
    };
    const auto print_point = [&](const Record& r) {
        const fa::Problem& p = r.problem;
        std::printf("[%3zu/%3zu] %-15s %-4s d=%-3lld N=%-5lld B=%-2lld H=%-2lld %-10s %9.3f ms  %6.2f TFLOP/s", done, points,
                    (r.label.empty() ? r.impl : r.label).c_str(), r.dtype.c_str(), (long long)p.head_dim, (long long)p.seq_q, (long long)p.batch,
                    (long long)p.heads, p.causal ? "causal" : "non-causal", r.median_ms, r.tflops);
        const bool hopper_row = r.impl.rfind("stage11", 0) == 0 && r.step != 0;  // step 0 is stage 07's mma.sync kernel
        if (r.step >= 0 && r.dtype != "fp32" && hopper_row && wgmma_ceiling_tflops > 0) {
            std::printf("  %4.1f%% of wgmma", 100.0 * r.tflops / wgmma_ceiling_tflops);
        } else if (r.step >= 0 && r.dtype != "fp32" && !hopper_row && mma_ceiling_tflops > 0) {
            std::printf("  %4.1f%% of mma", 100.0 * r.tflops / mma_ceiling_tflops);
        }
        std::printf("  (min %.3f, max %.3f; SM %d MHz)%s\n", r.min_ms, r.max_ms, r.sm_clock_mhz,
                    r.step >= 0 ? ("  step " + std::to_string(r.step) + " " + r.step_name).c_str() : "");
        std::fflush(stdout);
    };
    const auto make_record = [&](std::string impl, std::string dtype, const fa::Problem& p, const fa::TimingStats& t,
                                 std::string pass = "forward") {
        Record r;
        r.impl = std::move(impl), r.dtype = std::move(dtype), r.problem = p, r.pass = std::move(pass);
        r.median_ms = t.median_ms, r.min_ms = t.min_ms, r.max_ms = t.max_ms;
        const double flops = r.pass == "backward" ? fa::attention_flops_backward(p)
                             : r.pass == "fwd+bwd" ? fa::attention_flops_fwd_bwd(p)
                                                   : fa::attention_flops(p);
        r.tflops = flops / (t.median_ms * 1e-3) * 1e-12;
        r.sm_clock_mhz = fa::cuda::current_sm_clock_mhz();
        return r;
    };

    // Stage 09 at one point in one 16-bit type (`in`: stage 07's HalfTensors, `g`: HalfBackward of
    // the same type): four rows (the forward, the backward with atomic and with deterministic dQ
    // additions, the pair), then the guard, whose verdict both backward rows carry. A point it
    // refuses is also one where the --steps09 rows (stage09_steps) are not timed.
    const auto stage09_points = [&](const fa::Problem& p, const std::string& t, const auto& in, const auto& g,
                                    fa::stage09::Workspace& workspace, float* scratch) {
        using T = typename std::decay_t<decltype(g)>::value_type;
        const auto forward = [&](cudaStream_t stream) { fa::stage07::attention_device(p, in.q, in.k, in.v, in.o, g.lse, stream); };
        const auto backward_step = [&](int step, bool deterministic, cudaStream_t stream) {
            fa::stage09::attention_backward_device(p, in.q, in.k, in.v, fa::View4<const T>(in.o), fa::View3<const float>(g.lse),
                                                   g.dout, g.dq, g.dk, g.dv, deterministic, stream, &workspace, step);
        };
        const auto backward = [&](bool deterministic, cudaStream_t stream) { backward_step(-1, deterministic, stream); };
        // One untimed run of each: the workspace grows here to what both modes need.
        const std::string key = "stage09 " + t + " d=" + std::to_string(p.head_dim);
        if (!supported(key, [&](cudaStream_t stream) {
                forward(stream);
                backward(false, stream);
                backward(true, stream);
                for (int s : steps09) backward_step(s, true, stream);
            }, 4 + rows_per_step09 * steps09.size())) {
            return false;
        }
        const auto point = [&](const std::string& impl, const std::string& pass, const std::string& label,
                               const std::function<void(cudaStream_t)>& launch) {
            Record r = make_record(impl, t, p, fa::cuda::time_on_gpu(launch, warmup, repeat), pass);
            r.label = label;
            ++done;
            print_point(r);
            records.push_back(std::move(r));
            return records.size() - 1;
        };
        const size_t fwd = point("stage09", "forward", "stage09 fwd", forward);
        const size_t atomic = point("stage09", "backward", "stage09 bwd", [&](cudaStream_t stream) { backward(false, stream); });
        const size_t fixed = point("stage09_deterministic", "backward", "stage09 bwd det",
                                   [&](cudaStream_t stream) { backward(true, stream); });
        const size_t pair = point("stage09", "fwd+bwd", "stage09 fwd+bwd", [&](cudaStream_t stream) {
            forward(stream);
            backward(false, stream);
        });
        std::printf("          forward + backward medians %.3f ms (the pair: %.3f ms); deterministic dQ costs the backward %+.1f%%\n",
                    records[fwd].median_ms + records[atomic].median_ms, records[pair].median_ms,
                    100.0 * (records[fixed].median_ms / records[atomic].median_ms - 1.0));
        if (!check) return true;
        const Stage09Check c = check_stage09<T>(p, g, scratch, forward, backward);
        for (size_t i : {atomic, fixed}) c.mark(records[i]);
        any_bad = any_bad || !c.ok();
        std::printf("          guard: deterministic vs atomic rel_l2 %.2e (max_abs %.2e); sum dV vs sum dO rel_l2 %.2e; "
                    "|sum dK| / (sqrt(Nk) rms dK) %.2e%s%s%s\n",
                    c.modes_rel_l2, c.modes_max_abs, c.dv_sum_rel, c.dk_sum_ratio,
                    c.nonfinite ? (", " + std::to_string(c.nonfinite) + " NaN/inf").c_str() : "",
                    c.zero ? (", " + std::to_string(c.zero) + " gradient(s) all zero").c_str() : "", c.ok() ? "" : "  BAD");
        std::fflush(stdout);
        return true;
    };

    // Other main kernels of stage 09 (--steps09) at the same point: the backward with atomic dQ, the
    // fwd+bwd pair and the backward with deterministic dQ (rows stage09_step<i>_deterministic), or
    // the first alone with --steps09-backward-only; then the guard run on that kernel alone, which
    // runs both dQ modes either way.
    const auto stage09_steps = [&](const fa::Problem& p, const std::string& t, const auto& in, const auto& g,
                                   fa::stage09::Workspace& workspace, float* scratch) {
        using T = typename std::decay_t<decltype(g)>::value_type;
        const auto forward = [&](cudaStream_t stream) { fa::stage07::attention_device(p, in.q, in.k, in.v, in.o, g.lse, stream); };
        for (int step : steps09) {
            const auto backward = [&](bool deterministic, cudaStream_t stream) {
                fa::stage09::attention_backward_device(p, in.q, in.k, in.v, fa::View4<const T>(in.o),
                                                       fa::View3<const float>(g.lse), g.dout, g.dq, g.dk, g.dv, deterministic,
                                                       stream, &workspace, step);
            };
            const std::string impl = "stage09_step" + std::to_string(step);
            const auto point = [&](const std::string& pass, const std::function<void(cudaStream_t)>& launch) {
                Record r = make_record(impl, t, p, fa::cuda::time_on_gpu(launch, warmup, repeat), pass);
                r.label = impl + (pass == "backward" ? " bwd" : " fwd+bwd");
                r.step = step;
                r.step_name = fa::stage09::road()[size_t(step)].name;
                ++done;
                print_point(r);
                records.push_back(std::move(r));
                return records.size() - 1;
            };
            const size_t bwd = point("backward", [&](cudaStream_t stream) { backward(false, stream); });
            if (!steps09_backward_only) {
                point("fwd+bwd", [&](cudaStream_t stream) {
                    forward(stream);
                    backward(false, stream);
                });
                Record r = make_record(impl + "_deterministic", t, p,
                                       fa::cuda::time_on_gpu([&](cudaStream_t stream) { backward(true, stream); }, warmup, repeat),
                                       "backward");
                r.label = impl + " bwd det";
                r.step = step;
                r.step_name = fa::stage09::road()[size_t(step)].name;
                ++done;
                print_point(r);
                std::printf("          %s: deterministic dQ costs the backward %+.1f%%\n", impl.c_str(),
                            100.0 * (r.median_ms / records[bwd].median_ms - 1.0));
                records.push_back(std::move(r));
            }
            if (!check) continue;
            const Stage09Check c = check_stage09<T>(p, g, scratch, forward, backward);
            c.mark(records[bwd]);
            any_bad = any_bad || !c.ok();
            std::printf("          guard (%s): deterministic vs atomic rel_l2 %.2e; sum dV vs sum dO rel_l2 %.2e; "
                        "|sum dK| / (sqrt(Nk) rms dK) %.2e%s\n",
                        impl.c_str(), c.modes_rel_l2, c.dv_sum_rel, c.dk_sum_ratio, c.ok() ? "" : "  BAD");
            std::fflush(stdout);
        }
    };

#ifdef FA_HAVE_STAGE11
    // Stage 11 at one point in one 16-bit type (`in`: stage 07's HalfTensors of that type, `lse`:
    // the point's float32 LSE): each step asked for, timed, then run again into an O and LSE
    // poisoned with NaN and compared with stage 07's final kernel, which runs first into the same
    // tensors (its O widened into `o_ref`, its LSE copied into `lse_ref`; both null: no check).
    // `o32`: a float32 scratch of O's shape, dense (B, H, N, d).
    const auto stage11_points = [&](const fa::Problem& p, const std::string& t, const auto& in, const fa::View3<float>& lse,
                                    float* o_ref, float* lse_ref, const fa::View4<float>& o32) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(in.o.data)>>;
        const fa::View4<float> o_ref_view = fa::make_view(o_ref, p.batch, p.heads, p.seq_q, p.head_dim, fa::Layout::BHND);
        const size_t lse_bytes = size_t(p.lse_elems()) * sizeof(float);
        const double unit = std::is_same_v<T, __nv_bfloat16> ? 1.0 / 256 : 1.0 / 2048;  // unit roundoff u: 2^-8, 2^-11
        double o_scale = -1;  // the largest |O| of stage 07's output (at least 1); -1 until it ran
        for (int step : steps11) {
            const auto launch = [&](cudaStream_t stream) {
                fa::stage11::attention_device(p, in.q, in.k, in.v, in.o, lse, stream, step);
            };
            const std::string key = "stage11 " + t + " step " + std::to_string(step) + " d=" + std::to_string(p.head_dim);
            if (!supported(key, launch)) continue;
            const bool final_kernel = step == fa::stage11::final_step();
            Record r = make_record(final_kernel ? "stage11" : "stage11_step" + std::to_string(step), t, p,
                                   fa::cuda::time_on_gpu(launch, warmup, repeat));
            r.step = step;
            r.step_name = road11[size_t(step)].name;
            ++done;
            print_point(r);
            if (o_ref != nullptr) {
                if (o_scale < 0) {  // stage 07's final kernel at this point, once for every step
                    fa::stage07::attention_device(p, in.q, in.k, in.v, in.o, lse, nullptr);
                    fa::cuda::convert(fa::View4<const T>(in.o), o_ref_view);
                    FA_CUDA_CHECK(cudaMemcpy(lse_ref, lse.data, lse_bytes, cudaMemcpyDeviceToDevice));
                    FA_CUDA_CHECK(cudaDeviceSynchronize());
                    o_scale = 1;
                    for (float x : to_host(o_ref, p.q_elems())) o_scale = std::max(o_scale, double(std::fabs(x)));
                }
                // A fresh run into outputs poisoned with NaN, so an element this step forgets is not
                // hidden by what the timed runs (or stage 07) left there.
                FA_CUDA_CHECK(cudaMemset(in.o.data, 0xff, size_t(p.q_elems()) * sizeof(T)));
                FA_CUDA_CHECK(cudaMemset(lse.data, 0xff, lse_bytes));
                launch(nullptr);
                fa::cuda::convert(fa::View4<const T>(in.o), o32);
                FA_CUDA_CHECK(cudaDeviceSynchronize());
                const fa::Metrics m = fa::compare(to_host(o32.data, p.q_elems()), to_host(o_ref, p.q_elems()));
                const double lse_diff = max_abs_diff(lse.data, lse_ref, p.lse_elems());
                const double limit = kStage11MaxAbsUnits * unit * o_scale;
                const bool ok = m.nonfinite == 0 && m.max_abs <= limit && m.rel_l2 <= kStage11RelL2 && lse_diff <= kStage11LseMaxAbs;
                r.check = ok ? "ok" : "BAD";
                r.check_max_abs = m.max_abs;
                r.check_rel_l2 = m.rel_l2;
                any_bad = any_bad || !ok;
                std::printf("          vs stage 07 (%s): O max_abs %.2e (limit %.2e), rel_l2 %.2e; LSE max_abs %.2e%s%s\n", t.c_str(),
                            m.max_abs, limit, m.rel_l2, lse_diff,
                            m.nonfinite ? (", " + std::to_string(m.nonfinite) + " NaN/inf").c_str() : "", ok ? "" : "  BAD");
            }
            std::fflush(stdout);
            records.push_back(std::move(r));
        }
    };
#endif

    try {
        for (int64_t d : (has07 || has09) && !varlen07.empty() ? head_dims : std::vector<int64_t>{}) {
            for (const std::string& t : dtypes) {
                const int64_t heads = std::max<int64_t>(1, width / d);
                if (t == "bf16") {
                    stage10_varlen<__nv_bfloat16>(varlen07, heads, d, t, has09, warmup, repeat, records);
                } else {
                    stage10_varlen<__half>(varlen07, heads, d, t, has09, warmup, repeat, records);
                }
            }
        }
        for (int64_t d : head_dims) {
            for (int64_t n : sizes) {
                fa::Problem p;
                p.batch = std::max<int64_t>(1, tokens / n);
                p.heads = std::max<int64_t>(1, width / d);
                p.seq_q = p.seq_k = n;
                p.head_dim = d;
                fa::cuda::DeviceTensors dev(p, fa::Layout::BHND, 1234);
                // A second float32 output: stage 05's final kernel while its road or stage 06 runs, stage 07's widened result.
                fa::cuda::DeviceBuffer<float> o_other(size_t(p.q_elems()));
                const fa::View4<float> o_other_view = fa::make_view(o_other.data(), p.batch, p.heads, p.seq_q, p.head_dim, fa::Layout::BHND);
                // Stage 11's reference: stage 07's final kernel's O (widened to float32) and LSE at each point.
                fa::cuda::DeviceBuffer<float> o11_ref(has11 && check ? size_t(p.q_elems()) : 0);
                fa::cuda::DeviceBuffer<float> lse11_ref(has11 && check ? size_t(p.lse_elems()) : 0);
                HalfInputs half;
                for (const std::string& t : has07 || has09 || has11 ? dtypes : std::vector<std::string>{}) {
                    if (t == "bf16") {
                        half.bf16.emplace(p, fa::Layout::BHND);
                        half.bf16->load(dev.q, dev.k, dev.v);
                    } else {
                        half.fp16.emplace(p, fa::Layout::BHND);
                        half.fp16->load(dev.q, dev.k, dev.v);
                    }
                }
                // Stage 09: dO rounded into each type beside the LSE and gradients, one workspace for
                // every call at this shape, and a float32 scratch where the guard widens the gradients.
                HalfGradients grads;
                fa::stage09::Workspace workspace09;
                fa::cuda::DeviceBuffer<float> scratch09(has09 && check ? size_t(std::max(p.q_elems(), p.kv_elems())) : 0);
                if (has09) {
                    fa::cuda::DeviceBuffer<float> dout_f32(size_t(p.q_elems()));
                    fa::cuda::fill_normal(dout_f32.data(), p.q_elems(), kDoutSeed, 1.0f);
                    const fa::View4<const float> dout_view =
                        fa::make_view(dout_f32.data(), p.batch, p.heads, p.seq_q, p.head_dim, fa::Layout::BHND);
                    for (const std::string& t : dtypes) {
                        if (t == "bf16") {
                            grads.bf16.emplace(p, dout_view);
                        } else {
                            grads.fp16.emplace(p, dout_view);
                        }
                    }
                    FA_CUDA_CHECK(cudaDeviceSynchronize());  // the roundings have read dout_f32 before it is freed
                }
                for (bool causal : causal_values) {
                    p.causal = causal;
                    // ---- float32 stages: 05 then 06; 06's output stays in dev.o as stage 07's reference.
                    bool have05_output = false;  // stage 05's output of this point waits in o_other
                    bool have_reference = false;  // stage 06's output of this point is in dev.o
                    if (has05 && road05) {
                        // Stage 05's road: every earlier step, timed, then checked against the final
                        // kernel's output on an output poisoned with NaN (the final kernel's own row
                        // comes with the float32 stages below).
                        bool have_final05 = false;  // the final kernel's output of this point is in o_other
                        for (int step = 0; step < fa::stage05::final_step(); ++step) {
                            const fa::cuda::DeviceAttentionFn entry = stage05_step(step);
                            const auto launch = [&](cudaStream_t stream) { entry(p, dev.q, dev.k, dev.v, dev.o, dev.lse, stream); };
                            if (!supported("stage05 step " + std::to_string(step) + " d=" + std::to_string(d), launch)) continue;
                            Record r = make_record("stage05_step" + std::to_string(step), "fp32", p,
                                                   fa::cuda::time_on_gpu(launch, warmup, repeat));
                            r.step = step;
                            r.step_name = fa::stage05::road()[size_t(step)].name;
                            ++done;
                            print_point(r);
                            if (check) {
                                if (!have_final05) {
                                    stage05_step(fa::stage05::final_step())(p, dev.q, dev.k, dev.v, o_other_view, dev.lse, nullptr);
                                    have_final05 = true;
                                }
                                FA_CUDA_CHECK(cudaMemset(dev.o.data, 0xff, size_t(p.q_elems()) * sizeof(float)));
                                launch(nullptr);
                                const double diff = max_abs_diff(dev.o.data, o_other.data(), p.q_elems());
                                const bool ok = diff <= kFp32MaxAbs;
                                r.check = ok ? "ok" : "BAD";
                                r.check_max_abs = diff;
                                any_bad = any_bad || !ok;
                                std::printf("          stage 05 step %d vs the final kernel: max |diff| = %.2e%s\n", step, diff,
                                            ok ? "" : "  MISMATCH");
                            }
                            records.push_back(r);
                        }
                    }
                    for (const std::string& s : stages) {
                        if (s != "05" && s != "06") continue;
                        const fa::cuda::DeviceAttentionFn entry =
                            s == "05" ? stage05_step(fa::stage05::final_step()) : stage06_with(fa::stage06::Schedule::Auto);
                        const auto launch = [&](cudaStream_t stream) { entry(p, dev.q, dev.k, dev.v, dev.o, dev.lse, stream); };
                        if (!supported("stage" + s + " d=" + std::to_string(d), launch)) continue;
                        records.push_back(make_record("stage" + s, "fp32", p, fa::cuda::time_on_gpu(launch, warmup, repeat)));
                        if (s == "05" && road05) {
                            records.back().step = fa::stage05::final_step();
                            records.back().step_name = fa::stage05::road().back().name;
                        }
                        ++done;
                        print_point(records.back());
                        if (s == "06" && causal && schedule_ablation) {
                            // Both orders of the query tiles, to see what the order is worth and whether
                            // the rule of Schedule::Auto picked the faster one.
                            const bool auto_heavy = fa::stage06::chosen_schedule(p) == fa::stage06::Schedule::HeavyFirst;
                            double ms[2] = {0, 0};
                            const fa::stage06::Schedule orders[2] = {fa::stage06::Schedule::HeavyFirst, fa::stage06::Schedule::InOrder};
                            for (int k = 0; k < 2; ++k) {
                                const fa::cuda::DeviceAttentionFn entry_k = stage06_with(orders[k]);
                                ms[k] = fa::cuda::time_on_gpu(
                                    [&](cudaStream_t stream) { entry_k(p, dev.q, dev.k, dev.v, dev.o, dev.lse, stream); }, warmup, repeat)
                                            .median_ms;
                            }
                            records.back().heavy_first_ms = ms[0];
                            records.back().in_order_ms = ms[1];
                            std::printf("          stage06 query tiles heaviest first %.3f ms, in order %.3f ms (heaviest first %+.1f%%); "
                                        "Auto picks %s\n",
                                        ms[0], ms[1], 100.0 * (ms[0] / ms[1] - 1.0), auto_heavy ? "heaviest first" : "in order");
                        }
                        if (!check) continue;
                        if (s == "05" && has06) {
                            FA_CUDA_CHECK(cudaMemcpy(o_other.data(), dev.o.data, o_other.bytes(), cudaMemcpyDeviceToDevice));
                            have05_output = true;
                        } else if (s == "06" && have05_output) {
                            const double diff = max_abs_diff(o_other.data(), dev.o.data, p.q_elems());
                            const bool ok = diff <= kFp32MaxAbs;
                            records.back().check = ok ? "ok" : "BAD";
                            records.back().check_max_abs = diff;
                            any_bad = any_bad || !ok;
                            std::printf("          stage 05 vs stage 06 outputs: max |diff| = %.2e%s\n", diff, ok ? "" : "  MISMATCH");
                        }
                        have_reference = have_reference || s == "06";
                    }
                    // ---- stage 07: every dtype and step asked for, checked against stage 06 in float32.
                    if (has07 && check && !have_reference) {
                        try {
                            fa::stage06::attention_device(p, dev.q, dev.k, dev.v, dev.o, dev.lse, nullptr);
                            FA_CUDA_CHECK(cudaDeviceSynchronize());
                            have_reference = true;
                        } catch (const fa::InputError&) {
                            // Stage 06 has no kernel for this d (256): stage 07 goes unchecked here.
                        }
                    }
                    const std::vector<float> reference =
                        has07 && check && have_reference ? to_host(dev.o.data, p.q_elems()) : std::vector<float>{};
                    for (const std::string& t : has07 ? dtypes : std::vector<std::string>{}) {
                        for (int step : steps07) {
                            const bool bf = t == "bf16";
                            const auto launch = [&](cudaStream_t stream) {
                                if (bf) {
                                    fa::stage07::attention_device(p, half.bf16->q, half.bf16->k, half.bf16->v, half.bf16->o, dev.lse, stream, step);
                                } else {
                                    fa::stage07::attention_device(p, half.fp16->q, half.fp16->k, half.fp16->v, half.fp16->o, dev.lse, stream, step);
                                }
                            };
                            const std::string key = "stage07 " + t + " step " + std::to_string(step) + " d=" + std::to_string(d);
                            if (!supported(key, launch)) continue;
                            const bool final_kernel = step == fa::stage07::final_step();
                            Record r = make_record(final_kernel ? "stage07" : "stage07_step" + std::to_string(step), t, p,
                                                   fa::cuda::time_on_gpu(launch, warmup, repeat));
                            r.step = step;
                            r.step_name = road[size_t(step)].name;
                            ++done;
                            print_point(r);
                            if (!reference.empty()) {
                                // A fresh run into an output poisoned with NaN, so an element this step
                                // forgets is not hidden by what the timed runs left there.
                                void* o16 = bf ? static_cast<void*>(half.bf16->o.data) : static_cast<void*>(half.fp16->o.data);
                                FA_CUDA_CHECK(cudaMemset(o16, 0xff, size_t(p.q_elems()) * 2));
                                launch(nullptr);
                                if (bf) {
                                    fa::cuda::convert(fa::View4<const __nv_bfloat16>(half.bf16->o), o_other_view);
                                } else {
                                    fa::cuda::convert(fa::View4<const __half>(half.fp16->o), o_other_view);
                                }
                                FA_CUDA_CHECK(cudaDeviceSynchronize());
                                const fa::Metrics m = fa::compare(to_host(o_other.data(), p.q_elems()), reference);
                                const bool ok = m.nonfinite == 0 && m.rel_l2 <= kStage07GrossRelL2;
                                r.check = ok ? "ok" : "BAD";
                                r.check_max_abs = m.max_abs;
                                r.check_rel_l2 = m.rel_l2;
                                any_bad = any_bad || !ok;
                                std::printf("          vs stage 06 (fp32): max_abs %.2e, rel_l2 %.2e%s%s\n", m.max_abs, m.rel_l2,
                                            m.nonfinite ? (", " + std::to_string(m.nonfinite) + " NaN/inf").c_str() : "",
                                            ok ? "" : "  BAD");
                            } else if (check) {
                                std::printf("          not checked: stage 06 has no kernel for d=%lld\n", (long long)d);
                            }
                            std::fflush(stdout);
                            records.push_back(std::move(r));
                        }
                    }

                    // ---- stage 10's switches (--model07): stage 07's forward, with stage 09 its backward,
                    // beside their plain causal kernels. Once per shape (the window carries the causal
                    // mask: (-1, 0) is causal), at the last causal value.
                    const bool last_causal_value = causal == causal_values.back();
                    for (const std::string& t : (has07 || has09) && !model07.empty() && last_causal_value ? dtypes : std::vector<std::string>{}) {
                        if (t == "bf16") {
                            stage10_points(p, t, *half.bf16, dev.lse, has09 ? &*grads.bf16 : nullptr, &workspace09, model07, warmup,
                                           repeat, records);
                        } else {
                            stage10_points(p, t, *half.fp16, dev.lse, has09 ? &*grads.fp16 : nullptr, &workspace09, model07, warmup,
                                           repeat, records);
                        }
                    }

#ifdef FA_HAVE_STAGE11
                    // ---- stage 11: every dtype and step asked for, checked against stage 07's final kernel.
                    for (const std::string& t : has11 ? dtypes : std::vector<std::string>{}) {
                        if (t == "bf16") {
                            stage11_points(p, t, *half.bf16, dev.lse, o11_ref.data(), lse11_ref.data(), o_other_view);
                        } else {
                            stage11_points(p, t, *half.fp16, dev.lse, o11_ref.data(), lse11_ref.data(), o_other_view);
                        }
                    }
#endif

                    // ---- stage 09: stage 07's forward, the backward in both dQ modes, the pair; the guard.
                    for (const std::string& t : has09 ? dtypes : std::vector<std::string>{}) {
                        if (t == "bf16") {
                            if (stage09_points(p, t, *half.bf16, *grads.bf16, workspace09, scratch09.data())) {
                                stage09_steps(p, t, *half.bf16, *grads.bf16, workspace09, scratch09.data());
                            }
                        } else if (stage09_points(p, t, *half.fp16, *grads.fp16, workspace09, scratch09.data())) {
                            stage09_steps(p, t, *half.fp16, *grads.fp16, workspace09, scratch09.data());
                        }
                    }
                }
            }
        }
    } catch (const fa::InputError& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return fa::kExitBadInput;
    } catch (const fa::cuda::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return fa::kExitMismatch;
    }

    std::ofstream json(json_path), csv(csv_path);
    if (!json || !csv) {
        std::fprintf(stderr, "error: cannot write %s or %s\n", json_path.c_str(), csv_path.c_str());
        return fa::kExitBadInput;
    }
    json << "{\n  \"gpu\": " << json_string(gpu.name) << ",\n  \"sm_count\": " << gpu.sm_count << ",\n  \"max_sm_clock_mhz\": "
         << gpu.max_sm_clock_mhz << ",\n  \"fp32_peak_tflops\": " << gpu.fp32_peak_flops() * 1e-12 << ",\n  \"date\": \"" << date
         << "\",\n  \"method\": \"CUDA events, " << warmup << " warm-up, L2 flushed, median of " << repeat << "\",\n";
    if (mma_ceiling_tflops > 0) json << "  \"mma_ceiling_tflops\": " << mma_ceiling_tflops << ",\n";
    // Stage 07's road as this build has it: what each step number means (the tuning build adds candidates).
    json << "  \"stage07_final_step\": " << fa::stage07::final_step() << ",\n  \"stage07_road\": [\n";
    for (size_t i = 0; i < road.size(); ++i) {
        json << "    {\"step\": " << i << ", \"name\": " << json_string(road[i].name) << ", \"idea\": " << json_string(road[i].idea)
             << "}" << (i + 1 < road.size() ? ",\n" : "\n");
    }
    json << "  ],\n";
#ifdef FA_HAVE_STAGE11
    // Stage 11's road, when its rows are here: what each of its step numbers means.
    if (has11) {
        json << "  \"stage11_final_step\": " << fa::stage11::final_step() << ",\n  \"stage11_road\": [\n";
        for (size_t i = 0; i < road11.size(); ++i) {
            json << "    {\"step\": " << i << ", \"name\": " << json_string(road11[i].name) << ", \"idea\": " << json_string(road11[i].idea)
                 << "}" << (i + 1 < road11.size() ? ",\n" : "\n");
        }
        json << "  ],\n";
    }
#endif
    if (wgmma_ceiling_tflops > 0) json << "  \"wgmma_ceiling_tflops\": " << wgmma_ceiling_tflops << ",\n";
    json << "  \"results\": [\n";
    // The first twelve columns are those of the first sweeps; the page generator reads them by name.
    // Later columns are added at the end: `pass` (forward, backward, fwd+bwd) came with stage 09,
    // `spec` and `note` with stage 10 (a refused row has empty times and its reason in the note).
    csv << "impl,dtype,B,H,N,d,causal,median_ms,tflops,gpu,sm_clock_mhz,date,step,step_name,min_ms,max_ms,check,check_max_abs,"
           "check_rel_l2,pass,spec,note\n";
    for (size_t i = 0; i < records.size(); ++i) {
        const Record& r = records[i];
        const fa::Problem& p = r.problem;
        json << "    {\"impl\": \"" << r.impl << "\", \"dtype\": \"" << r.dtype << "\", \"B\": " << p.batch << ", \"H\": " << p.heads
             << ", \"N\": " << p.seq_q << ", \"d\": " << p.head_dim << ", \"causal\": " << (p.causal ? "true" : "false")
             << ", \"pass\": \"" << r.pass << "\", \"median_ms\": " << json_time(r.median_ms) << ", \"min_ms\": " << json_time(r.min_ms)
             << ", \"max_ms\": " << json_time(r.max_ms) << ", \"tflops\": " << json_time(r.tflops) << ", \"sm_clock_mhz\": " << r.sm_clock_mhz;
        if (r.step >= 0) json << ", \"step\": " << r.step << ", \"step_name\": " << json_string(r.step_name);
        if (r.heavy_first_ms > 0) json << ", \"heavy_first_ms\": " << r.heavy_first_ms << ", \"in_order_ms\": " << r.in_order_ms;
        if (!r.check.empty()) json << ", \"check\": \"" << r.check << "\", \"check_max_abs\": " << r.check_max_abs;
        if (r.check_rel_l2 >= 0) json << ", \"check_rel_l2\": " << r.check_rel_l2;
        if (r.dv_sum_rel >= 0) json << ", \"check_dv_sum_rel\": " << r.dv_sum_rel << ", \"check_dk_sum_ratio\": " << r.dk_sum_ratio;
        if (!r.spec.empty()) json << ", \"spec\": " << json_string(r.spec);
        if (!r.note.empty()) json << ", \"note\": " << json_string(r.note);
        json << "}" << (i + 1 < records.size() ? ",\n" : "\n");
        csv << r.impl << "," << r.dtype << "," << p.batch << "," << p.heads << "," << p.seq_q << "," << p.head_dim << ","
            << (p.causal ? 1 : 0) << "," << optional_number(r.median_ms) << "," << optional_number(r.tflops) << ","
            << csv_field(gpu.name) << "," << r.sm_clock_mhz
            << "," << date << "," << (r.step >= 0 ? std::to_string(r.step) : "") << "," << csv_field(r.step_name) << ","
            << optional_number(r.min_ms) << "," << optional_number(r.max_ms) << "," << r.check << ","
            << optional_number(r.check_max_abs) << "," << optional_number(r.check_rel_l2) << "," << r.pass << "," << csv_field(r.spec) << "," << csv_field(r.note) << "\n";
    }
    json << "  ]\n}\n";
    std::printf("wrote      %s and %s (%zu points)\n", json_path.c_str(), csv_path.c_str(), records.size());
    if (any_bad) {
        std::printf("FAILED     at least one point failed its check (marked BAD or MISMATCH above)\n");
        return fa::kExitMismatch;
    }
    return fa::kExitPass;
}
