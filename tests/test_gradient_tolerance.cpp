// The backward's rule (fa::gradient_tolerance) held to both sides, like the forward's in
// test_tolerance.cpp: stage 08's gradients pass at every magnitude of q and k from 1e-2 to 100,
// with Nq != Nk and causal rows that see no key; three faults a backward can have fail at every
// magnitude — D left out of dS = P (dP - D), the last key block dropped, a stale LSE (P off by a
// factor 2).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <cmath>
#include <string>
#include <vector>

#include "../stages/04_cpu_tiling/attention.hpp"
#include "../stages/08_cpu_backward/attention.hpp"
#include "fa/reference_backward.hpp"
#include "support.hpp"

using namespace fa;

namespace {

const double kMagnitudes[] = {1e-2, 0.1, 1, 10, 30, 100};

// The ways a backward is run here: right, or with one fault.
enum class Fault { None, NoD, DroppedKeyBlock, StaleLse };

struct Gradients {
    std::vector<float> dq, dk, dv;
};

// Stage 08 on (q, k, v, dO) with the forward's O and LSE from stage 04, possibly broken by `fault`.
Gradients backward(const Problem& p, const Inputs& in, const HostTensor& dout, Fault fault, int64_t block) {
    HostTensor o(p.batch, p.heads, p.seq_q, p.head_dim, Layout::BHND);
    std::vector<float> lse(size_t(p.lse_elems()));
    stage04::attention(p, in.q.cview(), in.k.cview(), in.v.cview(), o.view, make_view3(lse.data(), p.batch, p.heads, p.seq_q));
    if (fault == Fault::NoD) o = HostTensor(p.batch, p.heads, p.seq_q, p.head_dim, Layout::BHND, 0.0f);  // D = rowsum(dO o) = 0
    if (fault == Fault::StaleLse)
        for (float& x : lse) x += std::log(2.0f);  // every P halved
    stage08::Tiling t;
    t.Br = block;
    t.Bc = block;
    HostTensor dq(p.batch, p.heads, p.seq_q, p.head_dim, Layout::BHND, std::nanf(""));
    HostTensor dk(p.batch, p.heads, p.seq_k, p.head_dim, Layout::BHND, 0.0f);
    HostTensor dv(p.batch, p.heads, p.seq_k, p.head_dim, Layout::BHND, 0.0f);
    Problem run = p;
    View4<const float> k = in.k.cview(), v = in.v.cview();
    View4<float> dk_view = dk.view, dv_view = dv.view;
    if (fault == Fault::DroppedKeyBlock) {
        // The last block of keys never visited: their dK, dV stay 0 and dQ misses their terms.
        // (The causal alignment shifts with Nk, so this fault is tried without the mask.)
        run.seq_k = p.seq_k - block;
        k.shape[2] = v.shape[2] = dk_view.shape[2] = dv_view.shape[2] = run.seq_k;
    }
    stage08::attention_backward_tiled(run, in.q.cview(), k, v, o.cview(), make_view3(lse.data(), p.batch, p.heads, p.seq_q),
                                      dout.cview(), dq.view, dk_view, dv_view, t);
    return {dq.logical(), dk.logical(), dv.logical()};
}

Inputs scaled_inputs(const Problem& p, uint64_t seed, double magnitude) {
    Inputs in = make_inputs(p, Layout::BHND, InputKind::Normal, seed);
    for (float& x : in.q.storage) x = float(magnitude * x);
    for (float& x : in.k.storage) x = float(magnitude * x);
    return in;
}

// The largest fraction of its limit any of the three gradients uses (max_abs and rel_l2 both;
// infinity when a value is not finite).
double worst_fraction(const Gradients& g, const ReferenceGradients& ref, const GradientTolerances& tol) {
    const std::vector<float>* got[3] = {&g.dq, &g.dk, &g.dv};
    const std::vector<double>* want[3] = {&ref.dq, &ref.dk, &ref.dv};
    const Tolerance* lim[3] = {&tol.dq, &tol.dk, &tol.dv};
    double worst = 0;
    for (int i = 0; i < 3; ++i) {
        const Metrics m = compare(*got[i], *want[i]);
        if (m.nonfinite > 0) return INFINITY;
        worst = std::max({worst, m.max_abs / lim[i]->max_abs, m.rel_l2 / lim[i]->rel_l2});
    }
    return worst;
}

struct Setting {
    Problem problem;
    Inputs in;
    HostTensor dout;
    ReferenceGradients ref;
    GradientTolerances tol;
};

Setting setting(const Problem& p, double magnitude, uint64_t seed) {
    Inputs in = scaled_inputs(p, seed, magnitude);
    HostTensor dout = make_output_gradient(p, Layout::BHND, seed);
    ReferenceGradients ref = reference_backward(p, in.q.cview(), in.k.cview(), in.v.cview(), dout.cview());
    const EmulatedGradients naive =
        naive_backward_emulated(Precision::Float32, p, in.q.cview(), in.k.cview(), in.v.cview(), dout.cview());
    const InputStats stats = input_stats(p, in.q.cview(), in.k.cview(), in.v.cview());
    GradientTolerances tol = gradient_tolerance(stats, Precision::Float32, p, naive, ref);
    return {p, std::move(in), std::move(dout), std::move(ref), std::move(tol)};
}

}  // namespace

TEST_CASE("correct stage 08 gradients pass at every magnitude, with room to spare") {
    const Problem problems[] = {test::make_problem(1, 2, 150, 150, 64), test::make_problem(1, 1, 97, 203, 32, true),
                                test::make_problem(2, 1, 131, 70, 16, true)};
    for (const Problem& p : problems) {
        for (double magnitude : kMagnitudes) {
            const Setting s = setting(p, magnitude, 11);
            for (int64_t block : {16, 64}) {
                const double f = worst_fraction(backward(p, s.in, s.dout, Fault::None, block), s.ref, s.tol);
                INFO(p.describe() << " magnitude " << magnitude << " block " << block << ": " << f << " of the limits");
                CHECK(f < 0.7);
            }
        }
    }
}

TEST_CASE("a backward without D, with a dropped key block or with a stale LSE fails at every magnitude") {
    const Problem p = test::make_problem(1, 2, 150, 150, 64);
    const Problem causal = test::make_problem(1, 2, 150, 150, 64, true);
    for (double magnitude : kMagnitudes) {
        const Setting s = setting(p, magnitude, 12), c = setting(causal, magnitude, 12);
        for (const Setting* st : {&s, &c}) {
            INFO(st->problem.describe() << " magnitude " << magnitude);
            CHECK(worst_fraction(backward(st->problem, st->in, st->dout, Fault::NoD, 32), st->ref, st->tol) > 3);
            CHECK(worst_fraction(backward(st->problem, st->in, st->dout, Fault::StaleLse, 32), st->ref, st->tol) > 3);
        }
        INFO("dropped key block, magnitude " << magnitude);
        CHECK(worst_fraction(backward(p, s.in, s.dout, Fault::DroppedKeyBlock, 32), s.ref, s.tol) > 3);
    }
}
