// How the backward tests run a stage's backward and judge its gradients, on the GPU (test_stage09,
// test_stage12: the forward's O and LSE, then the backward, with outputs poisoned with NaN) and on the
// warp emulator (test_stage12_emulated, judging only): dQ, dK and dV against the float64 reference backward (or
// another stage's gradients) by the gradient rule (fa::gradient_tolerance: twice the error of the
// naive backward in the same precision, plus a floor), and the contract for rows that see no key.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/precision.hpp"
#include "fa/problem.hpp"
#include "fa/reference_backward.hpp"
#include "fa/stage.hpp"
#include "fa/tolerance.hpp"

namespace fa::test {

/// The gradients of one run, in logical order: dq (B, H, Nq, d), dk and dv (B, H, Nk, d).
struct Grads {
    std::vector<float> dq, dk, dv;
};

/// O and LSE as a backward receives them, from a forward run on the same inputs.
struct Forward {
    HostTensor o;            ///< (B, H, Nq, d) in the inputs' layout
    std::vector<float> lse;  ///< (B, H, Nq)
    View3<const float> lse_view(const Problem& p) const { return make_view3<const float>(lse.data(), p.batch, p.heads, p.seq_q); }
};

/// The forward `fn` (a stage's forward in the backward's 16-bit type) on `in`, its outputs first NaN.
inline Forward run_forward(const AttentionFn& fn, const Problem& p, const Inputs& in, Layout layout) {
    Forward f{HostTensor(p.batch, p.heads, p.seq_q, p.head_dim, layout, std::nanf("")),
              std::vector<float>(size_t(p.lse_elems()), std::nanf(""))};
    fn(p, in.q.cview(), in.k.cview(), in.v.cview(), f.o.view, make_view3(f.lse.data(), p.batch, p.heads, p.seq_q));
    return f;
}

/// Runs the backward `fn` with its outputs poisoned with NaN, so unwritten elements fail.
inline Grads run_backward(const BackwardFn& fn, const Problem& p, const Inputs& in, const Forward& f, const HostTensor& dout,
                          Layout layout) {
    HostTensor dq(p.batch, p.heads, p.seq_q, p.head_dim, layout, std::nanf(""));
    HostTensor dk(p.batch, p.heads, p.seq_k, p.head_dim, layout, std::nanf(""));
    HostTensor dv(p.batch, p.heads, p.seq_k, p.head_dim, layout, std::nanf(""));
    fn(p, in.q.cview(), in.k.cview(), in.v.cview(), f.o.cview(), f.lse_view(p), dout.cview(), dq.view, dk.view, dv.view);
    return {dq.logical(), dk.logical(), dv.logical()};
}

/// The float64 gradients and the limits of the gradient rule in one precision.
struct Judge {
    ReferenceGradients ref;
    GradientTolerances tol;
};

/// The float64 backward of `in` and `dout`, and the rule's limits for a backward in `precision`
/// (measured on the naive backward in that precision).
inline Judge judge(const Problem& p, const Inputs& in, const HostTensor& dout, Precision precision) {
    Judge j{reference_backward(p, in.q.cview(), in.k.cview(), in.v.cview(), dout.cview()), {}};
    const EmulatedGradients naive = naive_backward_emulated(precision, p, in.q.cview(), in.k.cview(), in.v.cview(), dout.cview());
    j.tol = gradient_tolerance(input_stats(p, in.q.cview(), in.k.cview(), in.v.cview()), precision, p, naive, j.ref);
    return j;
}

/// Checks each gradient of `got` against `want_*` (the float64 reference's std::vector<double>, or
/// another run's std::vector<float>) within `tol`; a failure names the gradient, its errors, the
/// limits and the worst element.
template <class Want>
void check_gradients(const Grads& got, const Want& want_dq, const Want& want_dk, const Want& want_dv, const GradientTolerances& tol,
                     const std::string& what) {
    const char* names[3] = {"dQ", "dK", "dV"};
    const std::vector<float>* g[3] = {&got.dq, &got.dk, &got.dv};
    const Want* w[3] = {&want_dq, &want_dk, &want_dv};
    const Tolerance* lim[3] = {&tol.dq, &tol.dk, &tol.dv};
    for (int i = 0; i < 3; ++i) {
        const Metrics m = compare(*g[i], *w[i]);
        INFO(what);
        INFO(names[i] << ": max_abs=" << m.max_abs << " rel_l2=" << m.rel_l2 << " nonfinite=" << m.nonfinite << " (limits "
                      << lim[i]->max_abs << ", " << lim[i]->rel_l2 << "), worst at flat index " << m.worst_index);
        INFO(tol.rule);
        CHECK(passes(m, *lim[i]));
    }
}

/// Checks `got` against the float64 gradients of `j` within its limits.
inline void check_gradients(const Grads& got, const Judge& j, const std::string& what) {
    check_gradients(got, j.ref.dq, j.ref.dk, j.ref.dv, j.tol, what);
}

/// The contract for rows that see no key: every gradient element written and finite (the outputs
/// start as NaN), and dQ of a row that sees no key exactly 0 (its P is 0, so every term of its dQ is 0).
inline void check_rows_without_keys(const Problem& p, const Grads& g, const std::string& what) {
    INFO(what);
    int64_t nonfinite = 0, nonzero = 0;
    for (const std::vector<float>* x : {&g.dq, &g.dk, &g.dv})
        for (float v : *x) nonfinite += std::isfinite(v) ? 0 : 1;
    CHECK(nonfinite == 0);
    for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
        for (int64_t i = 0; i < p.seq_q; ++i) {
            if (visible_key_end(i, p.seq_q, p.seq_k, p.causal) != 0) continue;
            for (int64_t x = 0; x < p.head_dim; ++x) nonzero += g.dq[size_t((bh * p.seq_q + i) * p.head_dim + x)] == 0.0f ? 0 : 1;
        }
    CHECK(nonzero == 0);
}

}  // namespace fa::test
