// The tolerance rules (fa/tolerance.hpp) on real stages and on deliberately broken ones: correct
// float32 stages pass at every magnitude of q and k from 1e-3 to 100 (scores up to about 1e5),
// on inputs shaped like real activations and on long rows; a dropped or repeated key tile fails
// at every magnitude, a skipped rescale wherever it changes the result. The low-precision rule:
// a stage computing in bf16 or fp16 passes within twice the error of naive attention in that
// precision, and the same faults fail, in both precisions.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <cmath>
#include <string>
#include <vector>

#include "../stages/01_naive_attention/attention.hpp"
#include "../stages/02_safe_softmax/attention.hpp"
#include "../stages/03_online_softmax/attention.hpp"
#include "../stages/04_cpu_tiling/attention.hpp"
#include "support.hpp"
#include "variants.hpp"

using namespace fa;

namespace {

// Magnitudes of the entries of q and k: the scores scale with their square, from about 1e-6 to 1e5.
const double kMagnitudes[] = {1e-3, 1e-2, 0.1, 1, 10, 30, 100};

// Standard normal inputs with q and k multiplied by `magnitude` (and shifted by `qk_offset`
// before that, so that they share a direction as real activations often do) and v shifted by
// `v_offset`.
Inputs scaled_inputs(const Problem& p, uint64_t seed, double magnitude, double qk_offset = 0, double v_offset = 0) {
    Inputs in = make_inputs(p, Layout::BHND, InputKind::Normal, seed);
    for (float& x : in.q.storage) x = float(magnitude * (x + qk_offset));
    for (float& x : in.k.storage) x = float(magnitude * (x + qk_offset));
    for (float& x : in.v.storage) x = float(x + v_offset);
    return in;
}

std::string name_of(const Problem& p, double magnitude) {
    return p.describe() + " magnitude " + std::to_string(magnitude);
}

AttentionFn tiled(int64_t Br, int64_t Bc) {
    stage04::Tiling t;
    t.Br = Br;
    t.Bc = Bc;
    return [t](const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<float> o,
               View3<float> lse) { stage04::attention_tiled(p, q, k, v, o, lse, t); };
}

// True when `got` meets `tol` against the reference, O and LSE both.
bool within(const test::Result& got, const Reference& ref, const Tolerances& tol) {
    return passes(compare(got.o, ref.o), tol.o) && passes(compare(got.lse, ref.lse), tol.lse);
}

}  // namespace

TEST_CASE("input_stats: S bounds every score of its own head, V is the largest |v|") {
    const Problem p = test::make_problem(2, 3, 37, 41, 16);
    Inputs in = scaled_inputs(p, 4, 3.0);
    // Head (0, 0) gets long queries, head (1, 2) long keys: S pairs them only within a head.
    for (int64_t n = 0; n < 37; ++n)
        for (int64_t x = 0; x < 16; ++x) in.q.view(0, 0, n, x) *= 10;
    for (int64_t n = 0; n < 41; ++n)
        for (int64_t x = 0; x < 16; ++x) in.k.view(1, 2, n, x) *= 10;
    const InputStats s = input_stats(p, in.q.cview(), in.k.cview(), in.v.cview());
    double largest_score = 0, largest_v = 0, largest_q = 0, largest_k = 0;
    for (int64_t b = 0; b < 2; ++b)
        for (int64_t h = 0; h < 3; ++h)
            for (int64_t i = 0; i < 37; ++i)
                for (int64_t j = 0; j < 41; ++j) {
                    double dot = 0, qq = 0, kk = 0;
                    for (int64_t x = 0; x < 16; ++x) {
                        dot += double(in.q.view(b, h, i, x)) * in.k.view(b, h, j, x);
                        qq += double(in.q.view(b, h, i, x)) * in.q.view(b, h, i, x);
                        kk += double(in.k.view(b, h, j, x)) * in.k.view(b, h, j, x);
                        largest_v = std::max(largest_v, double(std::abs(in.v.view(b, h, j, x))));
                    }
                    largest_score = std::max(largest_score, std::abs(dot) * p.softmax_scale());
                    largest_q = std::max(largest_q, std::sqrt(qq));
                    largest_k = std::max(largest_k, std::sqrt(kk));
                }
    CHECK(s.score_bound >= largest_score);
    CHECK(s.score_bound < 0.5 * largest_q * largest_k * p.softmax_scale());  // per head, not across heads
    CHECK(s.max_abs_v == largest_v);
    CHECK(s.head_dim == 16);
    CHECK(s.seq_k == 41);
}

TEST_CASE("the rule's numbers, as the stage 01 lesson works them out") {
    // E = 2 (2 + sqrt(d)) u S + 8 u sqrt(Nk) + 2u with u = 2^-24.
    InputStats s;
    s.head_dim = 64;
    s.seq_k = 512;
    s.max_abs_v = 4.5;
    s.score_bound = 10;  // normal inputs: |q|, |k| about 8, scale 1/8
    Tolerances t = rounding_tolerance(s);
    CHECK(t.error_unit == doctest::Approx(2.28e-5).epsilon(0.01));
    CHECK(t.o.max_abs == doctest::Approx(1.03e-4).epsilon(0.01));
    CHECK(t.o.rel_l2 == t.error_unit);
    CHECK(t.lse.max_abs == t.error_unit);
    s.score_bound = 1e4;  // entries of magnitude about 30: scores in the thousands
    t = rounding_tolerance(s);
    CHECK(t.error_unit == doctest::Approx(1.19e-2).epsilon(0.01));
    CHECK(t.o.max_abs == doctest::Approx(5.37e-2).epsilon(0.01));
    // The floor: tiny scores still leave the float32 sums over Nk keys.
    s.score_bound = 1e-6;
    CHECK(rounding_tolerance(s).error_unit == doctest::Approx((8 * std::sqrt(512.0) + 2) * 0x1p-24).epsilon(1e-3));
    // The same arithmetic with inputs rounded to bf16 is bounded far more loosely.
    s.score_bound = 10;
    CHECK(rounding_tolerance(s, Precision::BFloat16).error_unit > 1000 * rounding_tolerance(s).error_unit);
}

TEST_CASE("correct float32 stages pass at every magnitude from 1e-3 to 100 (scores up to about 1e5)") {
    uint64_t seed = 300;
    for (int64_t d : {1, 16, 64, 128, 200}) {
        for (bool causal : {false, true}) {
            for (double magnitude : kMagnitudes) {
                const Problem p = test::make_problem(1, 2, 96, 256, d, causal);
                const Inputs in = scaled_inputs(p, seed++, magnitude);
                const Reference ref = reference_attention(p, in.q.cview(), in.k.cview(), in.v.cview());
                const Tolerances tol = test::tolerances_for(p, in);
                const std::string name = name_of(p, magnitude);
                // Stage 01 is checked where exp(s) cannot overflow; beyond, overflowing is its lesson.
                if (input_stats(p, in.q.cview(), in.k.cview(), in.v.cview()).score_bound < kExpOverflowScore)
                    test::check_close(test::run(stage01::attention, p, in, Layout::BHND), ref.o, ref.lse, tol, name + " stage 01");
                test::check_close(test::run(stage02::attention, p, in, Layout::BHND), ref.o, ref.lse, tol, name + " stage 02");
                const test::Result s03 = test::run(stage03::attention, p, in, Layout::BHND);
                test::check_close(s03, ref.o, ref.lse, tol, name + " stage 03");
                test::check_close(test::run(stage04::attention, p, in, Layout::BHND), ref.o, ref.lse, tol, name + " stage 04");
                const test::Result s04 = test::run(tiled(16, 32), p, in, Layout::BHND);
                test::check_close(s04, ref.o, ref.lse, tol, name + " stage 04, Br=16 Bc=32");
                test::check_close(s04, s03.o, s03.lse, tol, name + " stage 04, Br=16 Bc=32 vs stage 03");
                test::check_close(test::run(test::variant_fn({}), p, in, Layout::BHND), ref.o, ref.lse, tol,
                                  name + " the correct tiled variant");
            }
        }
    }
}

TEST_CASE("correct stages pass on inputs like real activations: q and k sharing a direction, v off zero, long rows") {
    struct Shape {
        int64_t Nq, Nk, d;
        double magnitude, qk_offset, v_offset;
    };
    const Shape shapes[] = {{64, 512, 128, 1, 3, 0},   {64, 512, 200, 10, 3, 0},  {64, 512, 64, 30, 2, 0},
                            {64, 2048, 64, 1, 0, 10},  {16, 4096, 64, 1e-3, 0, 10}, {16, 4096, 128, 1e-3, 3, 10},
                            {16, 4096, 64, 1, 0, 0},   {4, 16384, 64, 1e-3, 0, 0}, {4, 16384, 64, 1, 0, 0}};
    uint64_t seed = 700;
    for (const Shape& s : shapes) {
        for (bool causal : {false, true}) {
            const Problem p = test::make_problem(1, 1, s.Nq, s.Nk, s.d, causal);
            const Inputs in = scaled_inputs(p, seed++, s.magnitude, s.qk_offset, s.v_offset);
            const Reference ref = reference_attention(p, in.q.cview(), in.k.cview(), in.v.cview());
            const Tolerances tol = test::tolerances_for(p, in);
            const std::string name = name_of(p, s.magnitude) + " qk offset " + std::to_string(s.qk_offset) + " v offset " +
                                     std::to_string(s.v_offset);
            test::check_close(test::run(stage02::attention, p, in, Layout::BHND), ref.o, ref.lse, tol, name + " stage 02");
            test::check_close(test::run(stage03::attention, p, in, Layout::BHND), ref.o, ref.lse, tol, name + " stage 03");
            test::check_close(test::run(stage04::attention, p, in, Layout::BHND), ref.o, ref.lse, tol, name + " stage 04");
        }
    }
}

TEST_CASE("a dropped or repeated key tile fails at every magnitude") {
    uint64_t seed = 900;
    for (int64_t d : {16, 64, 128}) {
        for (bool causal : {false, true}) {
            for (double magnitude : kMagnitudes) {
                const Problem p = test::make_problem(1, 2, 96, 256, d, causal);
                const Inputs in = scaled_inputs(p, seed++, magnitude);
                const Reference ref = reference_attention(p, in.q.cview(), in.k.cview(), in.v.cview());
                const Tolerances tol = test::tolerances_for(p, in);
                INFO(name_of(p, magnitude));
                CHECK(within(test::run(test::variant_fn({}), p, in, Layout::BHND), ref, tol));
                CHECK_FALSE(within(test::run(test::variant_fn({test::Fault::DropKeyTile}), p, in, Layout::BHND), ref, tol));
                CHECK_FALSE(within(test::run(test::variant_fn({test::Fault::RepeatKeyTile}), p, in, Layout::BHND), ref, tol));
            }
        }
    }
}

TEST_CASE("a skipped rescale fails at every magnitude where it changes the result: 1e-2 up") {
    uint64_t seed = 1100;
    for (int64_t d : {16, 64, 128, 200}) {
        for (bool causal : {false, true}) {
            for (double magnitude : kMagnitudes) {
                const Problem p = test::make_problem(1, 2, 96, 256, d, causal);
                const Inputs in = scaled_inputs(p, seed++, magnitude);
                const Reference ref = reference_attention(p, in.q.cview(), in.k.cview(), in.v.cview());
                const Tolerances tol = test::tolerances_for(p, in);
                INFO(name_of(p, magnitude));
                const test::Result skipped = test::run(test::variant_fn({test::Fault::SkipRescale}), p, in, Layout::BHND);
                if (magnitude >= 1e-2) {
                    CHECK_FALSE(within(skipped, ref, tol));
                } else {
                    // Scores of about 1e-6 make every rescale factor exp(m_old - m_new) equal to 1
                    // within about 1e-6: skipping it moves the result no further than float32 rounding
                    // does, so no rule that passes every correct float32 stage can see it (and it does
                    // no harm). It stays within the limits of the correct variant's own result.
                    const test::Result correct = test::run(test::variant_fn({}), p, in, Layout::BHND);
                    CHECK(passes(compare(skipped.o, correct.o), tol.o));
                    CHECK(passes(compare(skipped.lse, correct.lse), tol.lse));
                }
            }
        }
    }
}

TEST_CASE("naive attention emulated in bf16 and fp16: the inputs, P and O rounded, everything else float32") {
    // One query, two keys, d = 1, scale 1: scores q k_j, computed from the rounded inputs.
    Problem p = test::make_problem(1, 1, 1, 2, 1);
    p.scale = 1.0;
    const float q[] = {1.0f + 0x1p-10f}, k[] = {1.0f, 2.0f}, v[] = {1.0f + 0x1p-9f, 3.0f};
    const auto view = [](const float* data, int64_t n) { return make_view<const float>(data, 1, 1, n, 1, Layout::BHND); };
    for (Precision precision : {Precision::BFloat16, Precision::Float16}) {
        const EmulatedAttention e = naive_attention_emulated(precision, p, view(q, 1), view(k, 2), view(v, 2));
        const float qr = round_to(precision, q[0]), v0 = round_to(precision, v[0]);
        const float s0 = qr * 1.0f, s1 = qr * 2.0f, m = std::max(s0, s1);
        const float e0 = std::exp(s0 - m), e1 = std::exp(s1 - m), l = e0 + e1;
        const float o = round_to(precision, round_to(precision, e0 / l) * v0 + round_to(precision, e1 / l) * 3.0f);
        CHECK(e.o[0] == o);
        CHECK(e.lse[0] == m + std::log(l));
        CHECK(round_to(precision, e.o[0]) == e.o[0]);  // O is representable in the precision
    }
    // Rows that see no key: O = 0, LSE = -inf, as in every stage.
    const Problem c = test::make_problem(1, 1, 5, 2, 8, true);
    const Inputs in = make_inputs(c, Layout::BHND, InputKind::Normal, 2);
    const EmulatedAttention e = naive_attention_emulated(Precision::BFloat16, c, in.q.cview(), in.k.cview(), in.v.cview());
    CHECK(std::isinf(e.lse[0]));
    CHECK(e.o[0] == 0.0f);
    CHECK(std::isfinite(e.lse[4]));
}

TEST_CASE("the low-precision rule: a bf16/fp16 stage within 2x naive passes, broken ones fail, both dtypes") {
    uint64_t seed = 1500;
    for (Precision precision : {Precision::BFloat16, Precision::Float16}) {
        for (int64_t d : {16, 64, 128}) {
            for (bool causal : {false, true}) {
                // From scores of order 0.01 to about 1000. Past that, bf16's own rounding of q and k
                // moves the scores by whole units, the naive error (and 2x it) approaches the size of
                // O, and a skipped rescale comes within 2x of the limit.
                for (double magnitude : {0.1, 1.0, 10.0}) {
                    const Problem p = test::make_problem(1, 2, 96, 256, d, causal);
                    const Inputs in = scaled_inputs(p, seed++, magnitude);
                    const Reference ref = reference_attention(p, in.q.cview(), in.k.cview(), in.v.cview());
                    const EmulatedAttention naive = naive_attention_emulated(precision, p, in.q.cview(), in.k.cview(), in.v.cview());
                    const InputStats stats = input_stats(p, in.q.cview(), in.k.cview(), in.v.cview());
                    const Tolerances tol =
                        low_precision_tolerance(stats, precision, compare(naive.o, ref.o), compare(naive.lse, ref.lse));
                    const std::string name = to_string(precision) + " " + name_of(p, magnitude);
                    INFO(name);
                    INFO(tol.rule);
                    test::Variant right;
                    right.precision = precision;
                    const test::Result got = test::run(test::variant_fn(right), p, in, Layout::BHND);
                    test::check_close(got, ref.o, ref.lse, tol, name + " vs float64");
                    // Against a float32 stage, with the same limits.
                    const test::Result s04 = test::run(stage04::attention, p, in, Layout::BHND);
                    test::check_close(got, s04.o, s04.lse, tol, name + " vs stage 04");
                    // The a priori bound is looser still, so the right stage passes it too.
                    test::check_close(got, ref.o, ref.lse, rounding_tolerance(stats, precision), name + " a priori");
                    for (test::Fault fault : {test::Fault::SkipRescale, test::Fault::DropKeyTile, test::Fault::RepeatKeyTile}) {
                        test::Variant broken = right;
                        broken.fault = fault;
                        CHECK_FALSE(within(test::run(test::variant_fn(broken), p, in, Layout::BHND), ref, tol));
                    }
                }
            }
        }
    }
}

TEST_CASE("the low-precision rule falls back to the a priori bound where naive fp16 overflows") {
    const Problem p = test::make_problem(1, 1, 8, 8, 16);
    Inputs in = scaled_inputs(p, 3, 1.0);
    in.v.view(0, 0, 3, 3) = 1e6f;  // beyond fp16's 65504: the rounded v is inf
    const Reference ref = reference_attention(p, in.q.cview(), in.k.cview(), in.v.cview());
    const EmulatedAttention naive = naive_attention_emulated(Precision::Float16, p, in.q.cview(), in.k.cview(), in.v.cview());
    const InputStats stats = input_stats(p, in.q.cview(), in.k.cview(), in.v.cview());
    const Tolerances tol = low_precision_tolerance(stats, Precision::Float16, compare(naive.o, ref.o), compare(naive.lse, ref.lse));
    CHECK(tol.rule.find("not finite on these inputs") != std::string::npos);
    CHECK(tol.rule.find("the a priori bound applies instead") != std::string::npos);  // as the gradient rule says it
    CHECK(tol.o.max_abs == rounding_tolerance(stats, Precision::Float16).o.max_abs);
}
