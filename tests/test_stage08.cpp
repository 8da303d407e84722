// Stage 08 (the backward on the CPU) against the float64 reference backward and a naive float64
// backward written here, over the standard cases and many block sizes; its block counts, its
// handling of rows that see no key, of layouts and strides, and of bad block sizes.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <algorithm>
#include <cmath>

#include <Eigen/Dense>

#include "../stages/04_cpu_tiling/attention.hpp"
#include "../stages/08_cpu_backward/attention.hpp"
#include "fa/error.hpp"
#include "fa/reference_backward.hpp"
#include "support.hpp"

using namespace fa;

namespace {

const std::vector<int64_t> kHeadDims{1, 7, 16, 64, 128};

stage08::Tiling tiling(int64_t Br, int64_t Bc) {
    stage08::Tiling t;
    t.Br = Br;
    t.Bc = Bc;
    return t;
}

std::string name(const test::Case& c, const stage08::Tiling& t) {
    return c.name() + " Br=" + std::to_string(t.Br) + " Bc=" + std::to_string(t.Bc);
}

// Everything the backward reads: q, k, v and dO drawn from the case's seed, and O and the LSE
// from stage 04's forward (what a training step would have saved).
struct Setup {
    Problem p;
    Layout layout;
    Inputs in;
    HostTensor dout;          // (B, H, Nq, d)
    HostTensor o;             // (B, H, Nq, d)
    std::vector<float> lse;   // (B, H, Nq)
    View3<const float> lse_view() const { return make_view3(lse.data(), p.batch, p.heads, p.seq_q); }
};

Setup prepare(const test::Case& c) {
    const Problem& p = c.problem;
    Setup s{p, c.layout, make_inputs(p, c.layout, c.inputs, c.seed), make_output_gradient(p, c.layout, c.seed),
            HostTensor(p.batch, p.heads, p.seq_q, p.head_dim, c.layout), std::vector<float>(size_t(p.lse_elems()))};
    stage04::attention(p, s.in.q.cview(), s.in.k.cview(), s.in.v.cview(), s.o.view,
                       make_view3(s.lse.data(), p.batch, p.heads, p.seq_q));
    return s;
}

// Stage 08's gradients, in logical order.
struct Gradients {
    std::vector<float> dq, dk, dv;
    stage08::BlockCounts counts;
};

// Runs stage 08 with its outputs poisoned with NaN, so an element never written (or a dq never
// zeroed before it is accumulated into) fails every comparison.
Gradients backward(const Setup& s, const stage08::Tiling& t) {
    const Problem& p = s.p;
    const float nan = std::nanf("");
    HostTensor dq(p.batch, p.heads, p.seq_q, p.head_dim, s.layout, nan);
    HostTensor dk(p.batch, p.heads, p.seq_k, p.head_dim, s.layout, nan);
    HostTensor dv(p.batch, p.heads, p.seq_k, p.head_dim, s.layout, nan);
    Gradients g;
    g.counts = stage08::attention_backward_tiled(p, s.in.q.cview(), s.in.k.cview(), s.in.v.cview(), s.o.cview(),
                                                 s.lse_view(), s.dout.cview(), dq.view, dk.view, dv.view, t);
    g.dq = dq.logical();
    g.dk = dk.logical();
    g.dv = dv.logical();
    return g;
}

// The textbook backward in float64, one head at a time with the whole Nq x Nk matrices: the
// formulas of fa/reference_backward.hpp written as directly as possible, from q, k, v and dO
// alone (S, P and O recomputed here, not taken from any stage).
ReferenceGradients naive_backward_f64(const Problem& p, const Inputs& in, const HostTensor& dout) {
    using Matrix = Eigen::MatrixXd;
    const int64_t Nq = p.seq_q, Nk = p.seq_k, d = p.head_dim;
    const double scale = p.softmax_scale();
    const std::vector<float> q = in.q.logical(), k = in.k.logical(), v = in.v.logical(), g = dout.logical();
    ReferenceGradients out;
    out.dq.resize(q.size());
    out.dk.resize(k.size());
    out.dv.resize(v.size());
    // Head `bh` of a logical (B, H, N, d) vector as an [N, d] double matrix.
    auto head = [d](const std::vector<float>& t, int64_t bh, int64_t N) {
        Matrix m(N, d);
        for (int64_t n = 0; n < N; ++n)
            for (int64_t x = 0; x < d; ++x) m(n, x) = double(t[size_t((bh * N + n) * d + x)]);
        return m;
    };
    auto store = [d](const Matrix& m, std::vector<double>& t, int64_t bh) {
        for (int64_t n = 0; n < m.rows(); ++n)
            for (int64_t x = 0; x < d; ++x) t[size_t((bh * m.rows() + n) * d + x)] = m(n, x);
    };
    for (int64_t bh = 0; bh < p.batch * p.heads; ++bh) {
        const Matrix Q = head(q, bh, Nq), K = head(k, bh, Nk), V = head(v, bh, Nk), dO = head(g, bh, Nq);
        const Matrix S = scale * Q * K.transpose();
        Matrix P = Matrix::Zero(Nq, Nk);  // a row that sees no key keeps P = 0
        for (int64_t i = 0; i < Nq; ++i) {
            const int64_t end = visible_key_end(i, Nq, Nk, p.causal);
            if (end == 0) continue;
            const double m = S.row(i).head(end).maxCoeff();
            P.row(i).head(end) = (S.row(i).head(end).array() - m).exp().matrix();
            P.row(i).head(end) /= P.row(i).head(end).sum();
        }
        const Matrix O = P * V;
        const Matrix dP = dO * V.transpose();
        const Eigen::VectorXd D = (dO.array() * O.array()).rowwise().sum().matrix();
        const Matrix dS = (P.array() * (dP.colwise() - D).array()).matrix();
        store(scale * dS * K, out.dq, bh);
        store(scale * dS.transpose() * Q, out.dk, bh);
        store(P.transpose() * dO, out.dv, bh);
    }
    return out;
}

// The float64 reference backward of the project (fa/reference_backward.hpp) on a setup.
ReferenceGradients reference(const Setup& s) {
    return reference_backward(s.p, s.in.q.cview(), s.in.k.cview(), s.in.v.cview(), s.dout.cview());
}

// The naive float64 backward above on a setup.
ReferenceGradients naive(const Setup& s) { return naive_backward_f64(s.p, s.in, s.dout); }

double max_abs_of(const std::vector<double>& t) {
    double m = 0;
    for (double x : t) m = std::max(m, std::abs(x));
    return m;
}

double max_abs_of(const std::vector<float>& t) {
    double m = 0;
    for (float x : t) m = std::max(m, double(std::abs(x)));
    return m;
}

// The limits. Both the relative L2 error and max|error| / max|g_ref| of every gradient must stay
// within kErrorUnits * E, where E is the float32 forward's error unit on these inputs
// (fa::rounding_tolerance(): what the rounding of a score does to a softmax weight). The
// gradients' errors start in the same rounded scores and grow with them, as E does: E is 8e-7
// to 9e-5 on the normal inputs here (d = 1 to 128) and 2e-3 to 1e-2 on InputKind::Large.
// Measured over every case of this file (2026-11, x86-64 with AVX-512): largest error 4.3e-6
// on normal inputs (dQ, d = 128, 45 x 83 causal) and 3.8e-4 on large ones (dV, d = 128);
// largest ratio error / E 0.19 (dQ, d = 7, 1 x 37 causal), so 2 E leaves a margin of 10 or
// more. Wrong gradients (a missing D, an unscaled dS, a dropped or unmasked block) err by the
// size of the gradient itself, and an LSE off by 1e-3 already fails (a test below).
constexpr double kErrorUnits = 2.0;

// Relative errors of the three gradients, each judged by the limit above.
struct GradientErrors {
    Metrics m[3];       // dQ, dK, dV against the reference
    double g_max[3]{};  // max|g_ref| of each
    double E = 0;       // the forward's error unit on these inputs
};

GradientErrors measure(const Gradients& got, const ReferenceGradients& ref, const Setup& s) {
    GradientErrors e;
    const std::vector<float>* out[3] = {&got.dq, &got.dk, &got.dv};
    const std::vector<double>* want[3] = {&ref.dq, &ref.dk, &ref.dv};
    for (int g = 0; g < 3; ++g) {
        e.m[g] = compare(*out[g], *want[g]);
        e.g_max[g] = max_abs_of(*want[g]);
    }
    e.E = test::tolerances_for(s.p, s.in).error_unit;
    return e;
}

// Checks stage 08's gradients against a float64 reference (of the same q, k, v and dO).
void check_gradients(const Gradients& got, const ReferenceGradients& ref, const Setup& s, const std::string& what) {
    INFO(what);
    const GradientErrors e = measure(got, ref, s);
    const char* labels[3] = {"dQ", "dK", "dV"};
    for (int g = 0; g < 3; ++g) {
        const Metrics& m = e.m[g];
        INFO(labels[g] << ": max_abs=" << m.max_abs << " (max|g_ref|=" << e.g_max[g] << ") rel_l2=" << m.rel_l2
                       << " nonfinite=" << m.nonfinite << "; limit " << kErrorUnits << " E = " << kErrorUnits * e.E);
        CHECK(m.nonfinite == 0);
        if (s.p.seq_k == 1 && g < 2) {
            // One key per row: P = 1 and dP = D, so dS = 0 and the exact dQ and dK are 0, where a
            // relative error means nothing. Float32 leaves the rounding of dP - D: two sums of d
            // products, each off by about u d |dO| |V| at most, per entry of dS; dQ_i = scale dS_i0
            // K_0 holds one such entry, dK_0 = scale sum_i dS_i0 Q_i the Nq of them. Measured: at
            // most 0.09 of this bound (dQ, d = 7, 37 x 1).
            const double u = std::ldexp(1.0, -24);
            const double dS_error =
                2.0 * u * double(s.p.head_dim) * max_abs_of(s.dout.logical()) * max_abs_of(s.in.v.logical());
            const double bound = g == 0 ? std::abs(s.p.softmax_scale()) * dS_error * max_abs_of(s.in.k.logical())
                                        : std::abs(s.p.softmax_scale()) * dS_error * double(s.p.seq_q) *
                                              max_abs_of(s.in.q.logical());
            CHECK(m.max_abs <= bound);
            continue;
        }
        CHECK(m.rel_l2 <= kErrorUnits * e.E);
        CHECK(m.max_abs <= kErrorUnits * e.E * e.g_max[g]);
    }
}

// A dense (B, H, N, d) buffer stored as (B, H, d, N): the feature axis has stride N, not 1.
struct FeatureMajor {
    std::vector<float> storage;
    View4<float> view;
    FeatureMajor(int64_t B, int64_t H, int64_t N, int64_t d)
        : storage(size_t(B * H * N * d), std::nanf("")), view{storage.data(), {B, H, N, d}, {H * d * N, d * N, 1, N}} {}
    // Copies the logical contents of `t`.
    explicit FeatureMajor(View4<const float> t) : FeatureMajor(t.shape[0], t.shape[1], t.shape[2], t.shape[3]) {
        for (int64_t b = 0; b < t.shape[0]; ++b)
            for (int64_t h = 0; h < t.shape[1]; ++h)
                for (int64_t n = 0; n < t.shape[2]; ++n)
                    for (int64_t x = 0; x < t.shape[3]; ++x) view(b, h, n, x) = t(b, h, n, x);
    }
};

}  // namespace

TEST_CASE("stage 08 with its default blocks matches the float64 reference backward on every standard case") {
    for (const test::Case& c : test::standard_cases(kHeadDims)) {
        const Setup s = prepare(c);
        check_gradients(backward(s, stage08::Tiling{}), reference(s), s,
                        c.name() + " default blocks vs reference_backward");
    }
}

TEST_CASE("stage 08 matches the naive float64 backward on every standard case, with blocks that cut every row") {
    for (const test::Case& c : test::standard_cases(kHeadDims)) {
        const Setup s = prepare(c);
        const ReferenceGradients ref = naive(s);
        for (const stage08::Tiling& t : {stage08::Tiling{}, tiling(16, 32), tiling(29, 13)})
            check_gradients(backward(s, t), ref, s, name(c, t) + " vs naive float64 backward");
    }
}

TEST_CASE("stage 08 is right for any Br and Bc: unequal, 1 x 1, larger than N, dividing nothing") {
    const stage08::Tiling tilings[] = {tiling(1, 1),   tiling(1, 13),   tiling(13, 1),  tiling(3, 5),
                                       tiling(5, 3),   tiling(16, 16),  tiling(17, 29), tiling(32, 64),
                                       tiling(64, 32), tiling(128, 512), tiling(1000, 1000), tiling(4096, 2)};
    const int64_t sizes[][2] = {{1, 1}, {1, 37}, {37, 1}, {61, 67}, {97, 131}, {130, 70}};
    uint64_t seed = 800;
    for (int64_t d : {1, 7, 64, 128}) {
        for (const auto& sz : sizes) {
            for (bool causal : {false, true}) {
                test::Case c;
                c.problem = test::make_problem(1, 2, sz[0], sz[1], d, causal);
                c.layout = seed % 2 ? Layout::BNHD : Layout::BHND;
                c.seed = seed++;
                const Setup s = prepare(c);
                const ReferenceGradients ref = naive(s);
                for (const stage08::Tiling& t : tilings)
                    check_gradients(backward(s, t), ref, s, name(c, t) + " vs naive float64 backward");
            }
        }
    }
}

TEST_CASE("stage 08 takes the scale as given: a custom one, and a negative one") {
    for (double scale : {0.05, -0.2, 1.5}) {
        for (bool causal : {false, true}) {
            test::Case c;
            c.problem = test::make_problem(2, 2, 75, 53, 16, causal);
            c.problem.scale = scale;
            c.seed = 31;
            const Setup s = prepare(c);
            const Gradients got = backward(s, tiling(16, 8));
            check_gradients(got, naive(s), s, c.name() + " Br=16 Bc=8 vs naive float64 backward");
            check_gradients(got, reference(s), s, c.name() + " Br=16 Bc=8 vs reference_backward");
        }
    }
}

TEST_CASE("stage 08 stays finite and right on large inputs across many blocks") {
    for (bool causal : {false, true}) {
        for (Layout layout : {Layout::BHND, Layout::BNHD}) {
            test::Case c;
            c.problem = test::make_problem(1, 2, 150, 170, 64, causal);
            c.inputs = InputKind::Large;
            c.layout = layout;
            c.seed = 21;
            const Setup s = prepare(c);
            const Gradients got = backward(s, tiling(32, 24));
            check_gradients(got, naive(s), s, c.name() + " vs naive float64 backward");
            check_gradients(got, reference(s), s, c.name() + " vs reference_backward");
        }
    }
}

TEST_CASE("stage 08 gives dQ = 0 to rows that see no key, and skips the query blocks made only of them") {
    // Nq = 300, Nk = 100, causal: rows 0..199 see no key, LSE = -inf. With Br = 64 the query
    // blocks 0..2 (rows 0..191) see nothing at all; block 3 (rows 192..255) mixes rows that see
    // nothing with rows that do, and must not turn exp(-inf - (-inf)) into NaN.
    test::Case c;
    c.problem = test::make_problem(1, 1, 300, 100, 16, true);
    c.seed = 8;
    const Setup s = prepare(c);
    const Gradients got = backward(s, tiling(64, 32));
    for (int64_t i = 0; i < 300; ++i) {
        for (int64_t x = 0; x < 16; ++x) {
            const float g = got.dq[size_t(i * 16 + x)];
            REQUIRE(std::isfinite(g));
            if (i < 200) CHECK(g == 0.0f);
        }
    }
    // Tr = 5, Tc = 4. Key block j (keys 32j..32j+31) is first seen by row 200 + 32j, so it meets
    // the query blocks from (200 + 32j) / 64 on: 3, 3, 4, 4, i.e. 2 + 2 + 1 + 1 = 6 blocks. Of
    // these, only query block 4 against key block 0 needs no mask: its first row, 256, already
    // sees keys 0..56. The 14 others, query blocks 0..2 among them, are never computed.
    CHECK(got.counts.total == 20);
    CHECK(got.counts.computed == 6);
    CHECK(got.counts.masked == 5);
    CHECK(got.counts.skipped == 14);
    check_gradients(got, naive(s), s, c.name() + " Br=64 Bc=32 vs naive");
    check_gradients(got, reference(s), s, c.name() + " Br=64 Bc=32 vs reference_backward");
}

TEST_CASE("stage 08 skips the blocks above the causal diagonal and masks only those crossing it") {
    const auto counts = [](const Problem& p, stage08::Tiling t) {
        test::Case c;
        c.problem = p;
        c.seed = 2;
        return backward(prepare(c), t).counts;
    };
    // Br = Bc = 64 on 512 x 512: Tr = Tc = 8; key block j meets query blocks j..7, of which
    // block j (on the diagonal) is masked: 8 + 7 + ... + 1 = 36 computed, 8 masked.
    Problem p = test::make_problem(1, 1, 512, 512, 8, true);
    stage08::BlockCounts c = counts(p, tiling(64, 64));
    CHECK(c.total == 64);
    CHECK(c.computed == 36);
    CHECK(c.masked == 8);
    CHECK(c.skipped == 28);
    // Br = 64, Bc = 128: key block j is first seen by row 128 j, query block 2 j; blocks 2j and
    // 2j + 1 cross the diagonal. 8 + 6 + 4 + 2 = 20 computed, 8 masked.
    c = counts(p, tiling(64, 128));
    CHECK(c.total == 32);
    CHECK(c.computed == 20);
    CHECK(c.masked == 8);
    CHECK(c.skipped == 12);
    // Every head counts: B = 2, H = 3 multiply every figure by 6.
    Problem heads = test::make_problem(2, 3, 512, 512, 8, true);
    c = counts(heads, tiling(64, 64));
    CHECK(c.total == 6 * 64);
    CHECK(c.computed == 6 * 36);
    CHECK(c.masked == 6 * 8);
    CHECK(c.skipped == 6 * 28);
    // Nq < Nk: the diagonal moves right by Nk - Nq = 256. Key block j of 64 (j = 0..11) is first
    // seen by row 64 j - 256, so blocks 0..4 meet all 8 query blocks and blocks 5..11 meet 7..1:
    // 5 * 8 + 28 = 68 computed out of 96, one masked per key block from j = 4 on: 8.
    Problem wide = test::make_problem(1, 1, 512, 768, 8, true);
    c = counts(wide, tiling(64, 64));
    CHECK(c.total == 96);
    CHECK(c.computed == 68);
    CHECK(c.masked == 8);
    CHECK(c.skipped == 28);
    // Without the mask every block is computed and none is masked.
    p.causal = false;
    c = counts(p, tiling(64, 64));
    CHECK(c.computed == c.total);
    CHECK(c.masked == 0);
    CHECK(c.skipped == 0);
}

TEST_CASE("stage 08 reads the LSE it is given: shifted by 1e-3, every P is 0.1% off and the check fails") {
    test::Case c;
    c.problem = test::make_problem(1, 2, 97, 131, 64, true);
    c.seed = 12;
    Setup s = prepare(c);
    const ReferenceGradients ref = naive(s);
    check_gradients(backward(s, tiling(32, 32)), ref, s, c.name() + " with stage 04's LSE");
    for (float& l : s.lse) l += 1e-3f;  // -inf stays -inf
    const GradientErrors e = measure(backward(s, tiling(32, 32)), ref, s);
    INFO("dV rel_l2 " << e.m[2].rel_l2 << ", limit " << kErrorUnits * e.E);
    CHECK(e.m[2].rel_l2 > 10 * kErrorUnits * e.E);  // P e^(-0.001) in dV = P^T dO: 1e-3 relative
}

TEST_CASE("stage 08 gives the same logical result in both layouts, and reads and writes any strides") {
    const Problem p = test::make_problem(2, 3, 70, 90, 24, true);
    const stage08::Tiling t = tiling(16, 32);
    test::Case c;
    c.problem = p;
    c.seed = 5;
    c.layout = Layout::BHND;
    const Setup bhnd = prepare(c);
    c.layout = Layout::BNHD;
    const Gradients a = backward(bhnd, t);
    const Gradients b = backward(prepare(c), t);
    CHECK(a.dq == b.dq);  // the layout moves bytes, not arithmetic: bit for bit
    CHECK(a.dk == b.dk);
    CHECK(a.dv == b.dv);

    // Every tensor with its feature axis at stride N (a "transposed" head), and the LSE stored as
    // (B, N, H): stage 08 gathers the inputs once per head and scatters dQ back.
    const FeatureMajor q(bhnd.in.q.cview()), k(bhnd.in.k.cview()), v(bhnd.in.v.cview()), o(bhnd.o.cview()),
        dout(bhnd.dout.cview());
    FeatureMajor dq(2, 3, 70, 24), dk(2, 3, 90, 24), dv(2, 3, 90, 24);
    std::vector<float> lse_bnh(bhnd.lse.size());
    const View3<float> lse{lse_bnh.data(), {2, 3, 70}, {70 * 3, 1, 3}};
    for (int64_t b = 0; b < 2; ++b)
        for (int64_t h = 0; h < 3; ++h)
            for (int64_t n = 0; n < 70; ++n) lse(b, h, n) = bhnd.lse_view()(b, h, n);
    stage08::attention_backward_tiled(p, q.view, k.view, v.view, o.view, lse, dout.view, dq.view, dk.view, dv.view, t);
    CHECK(to_logical(View4<const float>(dq.view)) == a.dq);
    CHECK(to_logical(View4<const float>(dk.view)) == a.dk);
    CHECK(to_logical(View4<const float>(dv.view)) == a.dv);
}

TEST_CASE("stage 08 with the default Tiling is attention_backward()") {
    test::Case c;
    c.problem = test::make_problem(1, 2, 200, 129, 32, true);
    c.seed = 3;
    const Setup s = prepare(c);
    const Gradients want = backward(s, stage08::Tiling{});
    HostTensor dq(1, 2, 200, 32, Layout::BHND), dk(1, 2, 129, 32, Layout::BHND), dv(1, 2, 129, 32, Layout::BHND);
    stage08::attention_backward(c.problem, s.in.q.cview(), s.in.k.cview(), s.in.v.cview(), s.o.cview(), s.lse_view(),
                                s.dout.cview(), dq.view, dk.view, dv.view);
    CHECK(dq.logical() == want.dq);
    CHECK(dk.logical() == want.dk);
    CHECK(dv.logical() == want.dv);
}

TEST_CASE("stage 08 refuses block sizes out of range, naming the option") {
    test::Case c;
    c.problem = test::make_problem(1, 1, 8, 8, 4, false);
    const Setup s = prepare(c);
    for (const stage08::Tiling& bad : {tiling(0, 64), tiling(64, 0), tiling(-3, 8), tiling(8, -1),
                                       tiling(stage08::kMaxBlock + 1, 8), tiling(8, stage08::kMaxBlock + 1)}) {
        CHECK_THROWS_AS(stage08::check_tiling(bad), InputError);
        CHECK_THROWS_AS(backward(s, bad), InputError);
    }
    CHECK_THROWS_WITH(stage08::check_tiling(tiling(0, 64)), doctest::Contains("--block-m"));
    CHECK_THROWS_WITH(stage08::check_tiling(tiling(64, 0)), doctest::Contains("--block-n"));
    CHECK_THROWS_WITH(stage08::check_tiling(tiling(64, 5000)), doctest::Contains("[1, 4096]"));
    CHECK_NOTHROW(stage08::check_tiling(tiling(1, stage08::kMaxBlock)));
    CHECK_NOTHROW(stage08::check_tiling(tiling(stage08::kMaxBlock, 1)));
}

TEST_CASE("stage 08 describes its blocks in one line, clamped to the problem") {
    const Problem p = test::make_problem(1, 1, 1000, 300, 64, true);
    CHECK(stage08::describe(tiling(64, 128), p) ==
          "Br=64 Bc=128 (Tc=3 key blocks outside, Tr=16 query blocks inside, per head)");
    CHECK(stage08::describe(tiling(4096, 4096), p) ==
          "Br=4096 Bc=4096 (Tc=1 key blocks outside, Tr=1 query blocks inside, per head)");
}

TEST_CASE("stage 08's memory does not grow with Nq x Nk: at N = 16384 it is under 1% of the naive backward's") {
    const stage08::Tiling t = tiling(64, 128);
    // D (Nq floats), S_ij/P_ij and dP_ij/dS_ij (Br x Bc each), dK_j and dV_j (Bc x d each).
    CHECK(stage08::intermediate_bytes(test::make_problem(1, 1, 1000, 500, 64, false), t) ==
          4.0 * (1000 + 2 * 64 * 128 + 2 * 128 * 64));
    // Blocks larger than the problem are clamped to it.
    CHECK(stage08::intermediate_bytes(test::make_problem(1, 1, 10, 20, 8, false), tiling(4096, 4096)) ==
          4.0 * (10 + 2 * 10 * 20 + 2 * 20 * 8));
    // The naive backward keeps P and dS, Nq x Nk floats each, for every head.
    CHECK(stage08::naive_backward_bytes(test::make_problem(2, 3, 100, 50, 64, false)) == 4.0 * 2 * 6 * 100 * 50);
    const Problem big = test::make_problem(1, 1, 16384, 16384, 64, false);
    CHECK(stage08::intermediate_bytes(big, t) < 0.01 * stage08::naive_backward_bytes(big));
    // Only D grows with N: four more bytes per query row.
    const Problem bigger = test::make_problem(1, 1, 65536, 65536, 64, false);
    CHECK(stage08::intermediate_bytes(bigger, t) - stage08::intermediate_bytes(big, t) == 4.0 * (65536 - 16384));
}
