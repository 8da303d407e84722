// Tests of the backward references (fa/reference_backward.hpp): the float64 reference_backward()
// against central finite differences of a float64 forward, on every element of dQ, dK and dV;
// its independence from the memory layout; the naive backward in float32, bf16 and fp16 against
// it; rows that see no key; the flop count.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/precision.hpp"
#include "fa/problem.hpp"
#include "fa/reference.hpp"
#include "fa/reference_backward.hpp"
#include "fa/tensor.hpp"
#include "support.hpp"

using namespace fa;
using test::make_problem;

namespace {

// ----------------------------------------------------------------------------------------------
// A float64 forward in plain loops, to differentiate numerically.

// q, k, v and dO of one problem in logical (b, h, n, x) order, in double.
struct Tensors {
    std::vector<double> q, k, v, dout;
};

std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// O = softmax(scale Q K^T, causal mask) V in double, logical order; rows that see no key get 0.
// Written independently of reference_attention() (no Eigen, no blocks) so the finite differences
// do not share a bug with the code under test; checked against it once in each case.
std::vector<double> forward(const Problem& p, const Tensors& t) {
    const int64_t d = p.head_dim;
    const double scale = p.softmax_scale();
    std::vector<double> o(static_cast<size_t>(p.q_elems()), 0.0);
    std::vector<double> s(static_cast<size_t>(p.seq_k));
    for (int64_t bh = 0; bh < p.batch * p.heads; ++bh) {
        const double* q = &t.q[size_t(bh * p.seq_q * d)];
        const double* k = &t.k[size_t(bh * p.seq_k * d)];
        const double* v = &t.v[size_t(bh * p.seq_k * d)];
        for (int64_t i = 0; i < p.seq_q; ++i) {
            const int64_t end = visible_key_end(i, p.seq_q, p.seq_k, p.causal);
            if (end == 0) continue;
            double m = -std::numeric_limits<double>::infinity();
            for (int64_t j = 0; j < end; ++j) {
                double dot = 0;
                for (int64_t x = 0; x < d; ++x) dot += q[i * d + x] * k[j * d + x];
                s[size_t(j)] = scale * dot;
                m = std::max(m, s[size_t(j)]);
            }
            double l = 0;
            for (int64_t j = 0; j < end; ++j) l += (s[size_t(j)] = std::exp(s[size_t(j)] - m));
            double* o_row = &o[size_t((bh * p.seq_q + i) * d)];
            for (int64_t j = 0; j < end; ++j)
                for (int64_t x = 0; x < d; ++x) o_row[x] += s[size_t(j)] / l * v[j * d + x];
        }
    }
    return o;
}

// The loss whose gradients reference_backward() returns: L = sum(O o dO), so dL/dO = dO.
double loss(const Problem& p, const Tensors& t) {
    const std::vector<double> o = forward(p, t);
    double sum = 0;
    for (size_t n = 0; n < o.size(); ++n) sum += o[n] * t.dout[n];
    return sum;
}

// dL/dx for every element x of `which` (q, k or v of `t`), by central differences with step h:
// error O(h^2) from the third derivative plus O(eps |L| / h) from rounding, both ~1e-10 here.
std::vector<double> numerical_gradient(const Problem& p, Tensors t, std::vector<double> Tensors::* which) {
    constexpr double h = 1e-5;
    std::vector<double>& x = t.*which;
    std::vector<double> grad(x.size());
    for (size_t n = 0; n < x.size(); ++n) {
        const double saved = x[n];
        x[n] = saved + h;
        const double up = loss(p, t);
        x[n] = saved - h;
        const double down = loss(p, t);
        x[n] = saved;
        grad[n] = (up - down) / (2 * h);
    }
    return grad;
}

double max_abs_of(const std::vector<double>& x) {
    double m = 0;
    for (double e : x) m = std::max(m, std::abs(e));
    return m;
}

// Checks every element of `analytic` against `numerical` within rel * max|analytic|.
void check_gradient(const std::string& name, const std::vector<double>& analytic, const std::vector<double>& numerical,
                    double rel) {
    REQUIRE(analytic.size() == numerical.size());
    const double limit = rel * max_abs_of(analytic);
    double worst = 0;
    size_t worst_at = 0;
    for (size_t n = 0; n < analytic.size(); ++n) {
        const double err = std::abs(analytic[n] - numerical[n]);
        if (err > worst) worst = err, worst_at = n;
    }
    INFO(name << ": worst |analytic - numerical| = " << worst << " at flat index " << worst_at << " (analytic "
              << analytic[worst_at] << ", numerical " << numerical[worst_at] << "), limit " << limit);
    CHECK(max_abs_of(analytic) > 0);  // an all-zero gradient would pass any relative limit
    CHECK(worst <= limit);
}

// The inputs of problem `p` drawn from `seed` (q, k, v from make_inputs, dO from
// make_output_gradient), in `layout`.
struct Drawn {
    Inputs in;
    HostTensor dout;
};

Drawn draw(const Problem& p, Layout layout, InputKind kind, uint64_t seed) {
    return {make_inputs(p, layout, kind, seed), make_output_gradient(p, layout, seed)};
}

// ----------------------------------------------------------------------------------------------

// One finite-difference case: a problem and its seed.
struct FdCase {
    Problem problem;
    uint64_t seed;
};

Problem with_scale(Problem p, double scale) {
    p.scale = scale;
    return p;
}

}  // namespace

TEST_CASE("reference_backward matches central finite differences of the float64 forward") {
    const FdCase cases[] = {
        {make_problem(1, 2, 5, 7, 3), 11},                   // non-causal, Nq < Nk
        {make_problem(1, 1, 8, 3, 4), 12},                   // non-causal, Nq > Nk
        {make_problem(2, 1, 6, 6, 4, true), 13},             // causal, Nq == Nk, B > 1
        {make_problem(1, 2, 9, 4, 3, true), 14},             // causal, Nq > Nk: rows 0..4 see no key
        {make_problem(1, 1, 3, 8, 5, true), 15},             // causal, Nq < Nk
        {make_problem(1, 2, 4, 5, 1, true), 16},             // d = 1
        {with_scale(make_problem(1, 1, 6, 5, 7), 0.9), 17},  // odd d, custom scale
        {with_scale(make_problem(1, 1, 5, 8, 3, true), -0.7), 18},  // negative scale: the softmax favours low scores
        {make_problem(1, 1, 131, 6, 2), 19},                 // more rows than one 128-row block
        {make_problem(1, 1, 133, 9, 1, true), 20},           // causal across the block edge: rows 0..123 see no key
    };
    for (const FdCase& c : cases) {
        const Problem& p = c.problem;
        INFO(p.describe() << " seed=" << c.seed);
        const Drawn drawn = draw(p, Layout::BHND, InputKind::Normal, c.seed);
        const Tensors t{to_double(drawn.in.q.logical()), to_double(drawn.in.k.logical()), to_double(drawn.in.v.logical()),
                        to_double(drawn.dout.logical())};

        // The local forward is the forward the course defines: same mask alignment and scale.
        const Reference fwd = reference_attention(p, drawn.in.q.cview(), drawn.in.k.cview(), drawn.in.v.cview());
        const std::vector<double> o = forward(p, t);
        for (size_t n = 0; n < o.size(); ++n) REQUIRE(std::abs(o[n] - fwd.o[n]) <= 1e-12);

        const ReferenceGradients g =
            reference_backward(p, drawn.in.q.cview(), drawn.in.k.cview(), drawn.in.v.cview(), drawn.dout.cview());
        REQUIRE(g.dq.size() == size_t(p.q_elems()));
        REQUIRE(g.dk.size() == size_t(p.kv_elems()));
        REQUIRE(g.dv.size() == size_t(p.kv_elems()));
        check_gradient("dQ", g.dq, numerical_gradient(p, t, &Tensors::q), 1e-6);
        check_gradient("dK", g.dk, numerical_gradient(p, t, &Tensors::k), 1e-6);
        check_gradient("dV", g.dv, numerical_gradient(p, t, &Tensors::v), 1e-6);

        // A row that sees no key does not enter the loss: its dQ is exactly 0, not merely small.
        int64_t empty_rows = 0;
        for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
            for (int64_t i = 0; i < p.seq_q; ++i) {
                if (visible_key_end(i, p.seq_q, p.seq_k, p.causal) != 0) continue;
                ++empty_rows;
                for (int64_t x = 0; x < p.head_dim; ++x) CHECK(g.dq[size_t((bh * p.seq_q + i) * p.head_dim + x)] == 0.0);
            }
        if (p.causal && p.seq_q > p.seq_k) CHECK(empty_rows == p.batch * p.heads * (p.seq_q - p.seq_k));
        // No key-side counterpart exists to check: with the mask aligned bottom-right the last
        // query row sees every key, so no row of dK or dV is zero by construction; their values
        // are checked above through the finite differences, element by element.
    }
}

TEST_CASE("reference_backward reads through the views: both layouts and arbitrary strides agree exactly") {
    for (bool causal : {false, true}) {
        Problem p = make_problem(2, 3, 37, 53, 8, causal);
        p.scale = 0.4;
        const uint64_t seed = causal ? 31 : 30;
        INFO(p.describe() << " seed=" << seed);
        const Drawn a = draw(p, Layout::BHND, InputKind::Normal, seed);
        const Drawn b = draw(p, Layout::BNHD, InputKind::Normal, seed);
        REQUIRE(a.in.q.logical() == b.in.q.logical());  // the same logical tensors, stored differently
        REQUIRE(a.dout.logical() == b.dout.logical());

        // A third storage: the feature axis slowest, heads fastest, with padding between batches,
        // so no stride is the dense one of either layout.
        const auto scatter = [](const HostTensor& t, std::vector<float>& buffer) {
            const auto& s = t.view.shape;
            const std::array<int64_t, 4> stride{s[1] + 1, 1, s[0] * (s[1] + 1), s[2] * s[0] * (s[1] + 1) + 3};
            buffer.assign(size_t(stride[3] * s[3]), std::nanf(""));  // padding that would poison any stray read
            const View4<float> view{buffer.data(), s, stride};
            for (int64_t b0 = 0; b0 < s[0]; ++b0)
                for (int64_t h = 0; h < s[1]; ++h)
                    for (int64_t n = 0; n < s[2]; ++n)
                        for (int64_t x = 0; x < s[3]; ++x) view(b0, h, n, x) = t.view(b0, h, n, x);
            return View4<const float>(view);
        };
        std::vector<float> bq, bk, bv, bd;
        const View4<const float> sq = scatter(a.in.q, bq), sk = scatter(a.in.k, bk), sv = scatter(a.in.v, bv),
                                 sd = scatter(a.dout, bd);

        const ReferenceGradients ga = reference_backward(p, a.in.q.cview(), a.in.k.cview(), a.in.v.cview(), a.dout.cview());
        const ReferenceGradients gb = reference_backward(p, b.in.q.cview(), b.in.k.cview(), b.in.v.cview(), b.dout.cview());
        const ReferenceGradients gs = reference_backward(p, sq, sk, sv, sd);
        CHECK(ga.dq == gb.dq);
        CHECK(ga.dk == gb.dk);
        CHECK(ga.dv == gb.dv);
        CHECK(ga.dq == gs.dq);
        CHECK(ga.dk == gs.dk);
        CHECK(ga.dv == gs.dv);

        for (Precision precision : {Precision::Float32, Precision::BFloat16}) {
            INFO(to_string(precision));
            const EmulatedGradients na =
                naive_backward_emulated(precision, p, a.in.q.cview(), a.in.k.cview(), a.in.v.cview(), a.dout.cview());
            const EmulatedGradients nb =
                naive_backward_emulated(precision, p, b.in.q.cview(), b.in.k.cview(), b.in.v.cview(), b.dout.cview());
            const EmulatedGradients ns = naive_backward_emulated(precision, p, sq, sk, sv, sd);
            CHECK(na.dq == nb.dq);
            CHECK(na.dk == nb.dk);
            CHECK(na.dv == nb.dv);
            CHECK(na.dq == ns.dq);
            CHECK(na.dk == ns.dk);
            CHECK(na.dv == ns.dv);
        }
    }
}

namespace {

// Metrics of the naive backward in `precision` against the float64 reference: dQ, dK, dV.
struct NaiveErrors {
    Metrics m[3];
};

NaiveErrors naive_errors(const EmulatedGradients& naive, const ReferenceGradients& ref) {
    return {{compare(naive.dq, ref.dq), compare(naive.dk, ref.dk), compare(naive.dv, ref.dv)}};
}

// How many values of `x` are not exactly representable in `precision`.
int64_t unrepresentable(Precision precision, const std::vector<float>& x) {
    int64_t bad = 0;
    for (float e : x) bad += round_to(precision, e) != e;
    return bad;
}

const std::string kNames[3] = {"dQ", "dK", "dV"};

}  // namespace

TEST_CASE("naive_backward_emulated: float32 matches the reference, bf16 and fp16 err more but boundedly") {
    const Problem problems[] = {make_problem(1, 2, 150, 170, 32), make_problem(1, 2, 150, 170, 32, true),
                                make_problem(1, 2, 170, 150, 32, true), with_scale(make_problem(2, 1, 97, 131, 16), 0.3)};
    uint64_t seed = 40;
    for (const Problem& p : problems) {
        ++seed;
        INFO(p.describe() << " seed=" << seed);
        const Drawn in = draw(p, Layout::BNHD, InputKind::Normal, seed);
        const ReferenceGradients ref = reference_backward(p, in.in.q.cview(), in.in.k.cview(), in.in.v.cview(), in.dout.cview());
        const auto naive = [&](Precision precision) {
            return naive_backward_emulated(precision, p, in.in.q.cview(), in.in.k.cview(), in.in.v.cview(), in.dout.cview());
        };
        const EmulatedGradients f32 = naive(Precision::Float32), bf16 = naive(Precision::BFloat16),
                                fp16 = naive(Precision::Float16);
        const NaiveErrors e32 = naive_errors(f32, ref), ebf = naive_errors(bf16, ref), ehf = naive_errors(fp16, ref);
        for (int n = 0; n < 3; ++n) {
            INFO(kNames[n] << " rel_l2: float32 " << e32.m[n].rel_l2 << ", bf16 " << ebf.m[n].rel_l2 << ", fp16 "
                           << ehf.m[n].rel_l2);
            CHECK(e32.m[n].nonfinite == 0);
            CHECK(ebf.m[n].nonfinite == 0);
            CHECK(ehf.m[n].nonfinite == 0);
            CHECK(e32.m[n].rel_l2 < 1e-5);
            // Rounding every operand to 8 significant bits costs far more than float32's 24: if
            // the bf16 result came close to float32's, the rounding would not be happening.
            CHECK(ebf.m[n].rel_l2 > 30 * e32.m[n].rel_l2);
            CHECK(ebf.m[n].rel_l2 < 2e-2);
            // fp16 keeps 11 significant bits: between the two.
            CHECK(ehf.m[n].rel_l2 > 4 * e32.m[n].rel_l2);
            CHECK(ehf.m[n].rel_l2 < ebf.m[n].rel_l2);
        }
        // Outputs stored in the precision, as a stage in that precision would store them.
        CHECK(unrepresentable(Precision::BFloat16, bf16.dq) == 0);
        CHECK(unrepresentable(Precision::BFloat16, bf16.dk) == 0);
        CHECK(unrepresentable(Precision::BFloat16, bf16.dv) == 0);
        CHECK(unrepresentable(Precision::Float16, fp16.dq) == 0);
        CHECK(unrepresentable(Precision::Float16, fp16.dk) == 0);
        CHECK(unrepresentable(Precision::Float16, fp16.dv) == 0);
    }
}

namespace {

// The naive backward's recipe again, written as scalar loops in float (one head at a time, sums
// in index order): where naive_backward_emulated() rounds, this rounds too. Only the order of
// the float32 sums differs from Eigen's, which moves results by float32 rounding (~1e-7) plus
// the odd 16-bit rounding that lands on the other side of a tie; a rounding step missing or
// added in either moves them by the precision's own rounding (~1e-3 for bf16).
EmulatedGradients scalar_naive_backward(Precision precision, const Problem& p, const Drawn& drawn) {
    const int64_t Nq = p.seq_q, Nk = p.seq_k, d = p.head_dim;
    const float scale = static_cast<float>(p.softmax_scale());
    const auto rounded = [&](const HostTensor& t) {
        std::vector<float> x = t.logical();
        for (float& e : x) e = round_to(precision, e);
        return x;
    };
    const std::vector<float> q = rounded(drawn.in.q), k = rounded(drawn.in.k), v = rounded(drawn.in.v),
                             dout = rounded(drawn.dout);
    EmulatedGradients g{std::vector<float>(q.size()), std::vector<float>(k.size()), std::vector<float>(v.size())};
    std::vector<float> P(size_t(Nq * Nk)), dS(size_t(Nq * Nk)), O(size_t(Nq * d));
    for (int64_t bh = 0; bh < p.batch * p.heads; ++bh) {
        const float* Q = &q[size_t(bh * Nq * d)];
        const float* K = &k[size_t(bh * Nk * d)];
        const float* V = &v[size_t(bh * Nk * d)];
        const float* dO = &dout[size_t(bh * Nq * d)];
        std::fill(P.begin(), P.end(), 0.0f);
        for (int64_t i = 0; i < Nq; ++i) {
            const int64_t end = visible_key_end(i, Nq, Nk, p.causal);
            float m = -std::numeric_limits<float>::infinity(), l = 0;
            for (int64_t j = 0; j < end; ++j) {
                float dot = 0;
                for (int64_t x = 0; x < d; ++x) dot += Q[i * d + x] * K[j * d + x];
                P[size_t(i * Nk + j)] = dot * scale;
                m = std::max(m, P[size_t(i * Nk + j)]);
            }
            for (int64_t j = 0; j < end; ++j) l += (P[size_t(i * Nk + j)] = std::exp(P[size_t(i * Nk + j)] - m));
            for (int64_t j = 0; j < end; ++j) P[size_t(i * Nk + j)] /= l;
            for (int64_t x = 0; x < d; ++x) {
                float o = 0;
                for (int64_t j = 0; j < Nk; ++j) o += round_to(precision, P[size_t(i * Nk + j)]) * V[j * d + x];
                O[size_t(i * d + x)] = round_to(precision, o);
            }
            float D = 0;
            for (int64_t x = 0; x < d; ++x) D += dO[i * d + x] * O[size_t(i * d + x)];
            for (int64_t j = 0; j < Nk; ++j) {
                float dP = 0;
                for (int64_t x = 0; x < d; ++x) dP += dO[i * d + x] * V[j * d + x];
                dS[size_t(i * Nk + j)] = round_to(precision, P[size_t(i * Nk + j)] * (dP - D));
            }
        }
        for (int64_t i = 0; i < Nq; ++i)
            for (int64_t x = 0; x < d; ++x) {
                float dq = 0;
                for (int64_t j = 0; j < Nk; ++j) dq += dS[size_t(i * Nk + j)] * K[j * d + x];
                g.dq[size_t((bh * Nq + i) * d + x)] = round_to(precision, dq * scale);
            }
        for (int64_t j = 0; j < Nk; ++j)
            for (int64_t x = 0; x < d; ++x) {
                float dk = 0, dv = 0;
                for (int64_t i = 0; i < Nq; ++i) {
                    dk += dS[size_t(i * Nk + j)] * Q[i * d + x];
                    dv += round_to(precision, P[size_t(i * Nk + j)]) * dO[i * d + x];
                }
                g.dk[size_t((bh * Nk + j) * d + x)] = round_to(precision, dk * scale);
                g.dv[size_t((bh * Nk + j) * d + x)] = round_to(precision, dv);
            }
    }
    return g;
}

}  // namespace

TEST_CASE("naive_backward_emulated rounds where its recipe says: a scalar emulation agrees") {
    const Problem problems[] = {make_problem(1, 2, 40, 50, 16, true), make_problem(2, 1, 57, 33, 8)};
    uint64_t seed = 70;
    for (const Problem& p : problems) {
        ++seed;
        const Drawn drawn = draw(p, Layout::BNHD, InputKind::Normal, seed);
        for (Precision precision : {Precision::Float32, Precision::BFloat16, Precision::Float16}) {
            INFO(p.describe() << " seed=" << seed << " " << to_string(precision));
            const EmulatedGradients got = naive_backward_emulated(precision, p, drawn.in.q.cview(), drawn.in.k.cview(),
                                                                  drawn.in.v.cview(), drawn.dout.cview());
            const EmulatedGradients want = scalar_naive_backward(precision, p, drawn);
            const Metrics m[3] = {compare(got.dq, want.dq), compare(got.dk, want.dk), compare(got.dv, want.dv)};
            for (int n = 0; n < 3; ++n) {
                INFO(kNames[n] << ": rel_l2 " << m[n].rel_l2);
                CHECK(m[n].nonfinite == 0);
                CHECK(m[n].rel_l2 < 2e-4);
            }
        }
    }
}

TEST_CASE("naive_backward_emulated on large inputs: the safe softmax keeps float32 gradients finite and close") {
    // Scores of order 400 (InputKind::Large): exp without the max subtracted would overflow.
    for (bool causal : {false, true}) {
        const Problem p = make_problem(1, 2, 70, 90, 16, causal);
        const uint64_t seed = causal ? 51 : 50;
        INFO(p.describe() << " inputs=large seed=" << seed);
        const Drawn in = draw(p, Layout::BHND, InputKind::Large, seed);
        const ReferenceGradients ref = reference_backward(p, in.in.q.cview(), in.in.k.cview(), in.in.v.cview(), in.dout.cview());
        for (const auto* r : {&ref.dq, &ref.dk, &ref.dv})
            for (double x : *r) REQUIRE(std::isfinite(x));
        const EmulatedGradients f32 =
            naive_backward_emulated(Precision::Float32, p, in.in.q.cview(), in.in.k.cview(), in.in.v.cview(), in.dout.cview());
        const NaiveErrors e = naive_errors(f32, ref);
        for (int n = 0; n < 3; ++n) {
            INFO(kNames[n] << ": rel_l2 " << e.m[n].rel_l2 << ", nonfinite " << e.m[n].nonfinite);
            CHECK(e.m[n].nonfinite == 0);
            // The scores' float32 rounding grows with their size (|S| ~ 400): looser than on
            // normal inputs, still far from a wrong result.
            CHECK(e.m[n].rel_l2 < 1e-3);
        }
    }
}

TEST_CASE("rows that see no key get exactly zero gradients in every precision, never NaN") {
    // Causal with Nq > Nk: rows 0 .. Nq - Nk - 1 see no key.
    for (InputKind kind : {InputKind::Normal, InputKind::Large}) {
        const Problem p = make_problem(2, 2, 40, 16, 8, true);
        const uint64_t seed = kind == InputKind::Normal ? 60 : 61;
        INFO(p.describe() << " inputs=" << to_string(kind) << " seed=" << seed);
        const Drawn in = draw(p, Layout::BNHD, kind, seed);
        for (Precision precision : {Precision::Float32, Precision::BFloat16, Precision::Float16}) {
            INFO(to_string(precision));
            const EmulatedGradients g =
                naive_backward_emulated(precision, p, in.in.q.cview(), in.in.k.cview(), in.in.v.cview(), in.dout.cview());
            for (const auto* t : {&g.dq, &g.dk, &g.dv})
                for (float x : *t) REQUIRE(std::isfinite(x));
            for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
                for (int64_t i = 0; i < p.seq_q; ++i) {
                    bool all_zero = true;
                    for (int64_t x = 0; x < p.head_dim; ++x) all_zero &= g.dq[size_t((bh * p.seq_q + i) * p.head_dim + x)] == 0.0f;
                    const int64_t end = visible_key_end(i, p.seq_q, p.seq_k, p.causal);
                    INFO("row " << i << " of head " << bh << " sees " << end << " keys");
                    if (end == 0) CHECK(all_zero);
                    // The zeros above must come from the mask, not from a dQ that is zero
                    // everywhere. A row with one key has P = 1 whatever its score, so its true dQ
                    // is 0 too (and may come out as rounding noise); from two keys on, with scores
                    // of order 1, it is not.
                    if (end >= 2 && kind == InputKind::Normal) CHECK(!all_zero);
                }
        }
    }
}

TEST_CASE("reference_backward_flops: 14 B H Nq Nk d, with no causal halving") {
    const Problem p = make_problem(2, 3, 5, 7, 11);
    CHECK(reference_backward_flops(p) == 14.0 * 2 * 3 * 5 * 7 * 11);
    const Problem causal = make_problem(2, 3, 5, 7, 11, true);
    CHECK(reference_backward_flops(causal) == reference_backward_flops(p));
    // 3.5 times the forward reference's count: two forward products and five backward ones.
    const Problem big = make_problem(4, 16, 4096, 8192, 128);
    CHECK(reference_backward_flops(big) == 3.5 * reference_flops(big));
}
