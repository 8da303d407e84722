#include "fa/tolerance.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace fa {

namespace {

// A number for the report: 3 significant digits.
std::string num(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", x);
    return buf;
}

// The largest row norm of head (b, h) of t, in double.
double max_row_norm(View4<const float> t, int64_t b, int64_t h) {
    double largest = 0;
    for (int64_t n = 0; n < t.shape[2]; ++n) {
        double sq = 0;
        for (int64_t x = 0; x < t.shape[3]; ++x) sq += double(t(b, h, n, x)) * double(t(b, h, n, x));
        largest = std::max(largest, sq);
    }
    return std::sqrt(largest);
}

}  // namespace

InputStats input_stats(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v) {
    InputStats s;
    s.head_dim = p.head_dim;
    s.seq_k = p.seq_k;
    const double scale = std::abs(p.softmax_scale());
    // Per head: a query of one head never meets a key of another.
    for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t h = 0; h < p.heads; ++h) {
            s.score_bound = std::max(s.score_bound, scale * max_row_norm(q, b, h) * max_row_norm(k, b, h));
            for (int64_t n = 0; n < p.seq_k; ++n)
                for (int64_t x = 0; x < p.head_dim; ++x) s.max_abs_v = std::max(s.max_abs_v, double(std::abs(v(b, h, n, x))));
        }
    }
    return s;
}

InputStats input_stats_varlen(const VarlenProblem& p, View4<const float> q, View4<const float> k, View4<const float> v) {
    InputStats s;
    s.head_dim = p.head_dim;
    s.seq_k = p.max_seq_k();
    const double scale = std::abs(p.softmax_scale());
    // Per query head and the key/value head it reads; the bound over all sequences at once
    // (a row norm of any sequence bounds the scores of its own).
    for (int64_t h = 0; h < p.heads_q; ++h)
        s.score_bound = std::max(s.score_bound, scale * max_row_norm(q, 0, h) * max_row_norm(k, 0, p.kv_head(h)));
    for (int64_t h = 0; h < p.heads_k; ++h)
        for (int64_t n = 0; n < p.total_k; ++n)
            for (int64_t x = 0; x < p.head_dim; ++x) s.max_abs_v = std::max(s.max_abs_v, double(std::abs(v(0, h, n, x))));
    return s;
}

Tolerances rounding_tolerance(const InputStats& s, Precision precision) {
    const double u = unit_roundoff(Precision::Float32), u_p = unit_roundoff(precision);
    const double delta_s = (2.0 * u_p + std::sqrt(double(s.head_dim)) * u) * s.score_bound;
    const double E = 2.0 * delta_s + 8.0 * u * std::sqrt(double(s.seq_k)) + 2.0 * u_p;
    Tolerances t;
    t.o = Tolerance{E * s.max_abs_v, E};
    t.lse = Tolerance{E};
    t.error_unit = E;
    // (Built with a stream: GCC 12 warns falsely about long chains of std::string +.)
    const std::string P = to_string(precision), up = precision == Precision::Float32 ? "u" : "u_" + P;
    std::ostringstream rule;
    rule << P << " rounding rule: E = 2 delta_s + 8u sqrt(Nk) + 2" << up << " = " << num(E)
         << "; O max_abs <= E max|v|, O rel_l2 and LSE max_abs <= E\n"
         << "delta_s = (2" << up << " + sqrt(d) u) S = " << num(delta_s) << " with u = 2^-24";
    if (precision != Precision::Float32) rule << ", " << up << " = " << num(u_p);
    rule << ", S = " << num(s.score_bound) << " (bound on |score|), d = " << s.head_dim << ", Nk = " << s.seq_k
         << ", max|v| = " << num(s.max_abs_v);
    t.rule = rule.str();
    return t;
}

Tolerances low_precision_tolerance(const InputStats& s, Precision precision, const Metrics& naive_o,
                                   const Metrics& naive_lse) {
    const std::string name = to_string(precision);
    if (naive_o.nonfinite > 0 || naive_lse.nonfinite > 0) {
        Tolerances t = rounding_tolerance(s, precision);
        std::ostringstream why;
        why << "naive " << name << " attention is not finite on these inputs (" << naive_o.nonfinite << " of O, "
            << naive_lse.nonfinite << " of LSE NaN or inf where float64 is finite), so it cannot set limits;\n"
            << "the a priori bound applies instead: ";
        t.rule.insert(0, why.str());
        return t;
    }
    const Tolerances floor = rounding_tolerance(s, Precision::Float32);
    const double u_p = unit_roundoff(precision);
    Tolerances t;
    t.o = Tolerance{2.0 * naive_o.max_abs + floor.o.max_abs + u_p * s.max_abs_v, 2.0 * naive_o.rel_l2 + floor.o.rel_l2 + u_p};
    t.lse = Tolerance{2.0 * naive_lse.max_abs + floor.lse.max_abs};
    t.error_unit = t.o.rel_l2;
    std::ostringstream rule;
    rule << name << " rule: 2 x the error of naive " << name << " attention vs float64 + the float32 limits + one " << name
         << " rounding of O (u_" << name << " = " << num(u_p) << ")\n"
         << "naive " << name << ": O max_abs " << num(naive_o.max_abs) << ", rel_l2 " << num(naive_o.rel_l2)
         << "; LSE max_abs " << num(naive_lse.max_abs) << "; float32 limits: O " << num(floor.o.max_abs) << ", "
         << num(floor.o.rel_l2) << "; LSE " << num(floor.lse.max_abs);
    t.rule = rule.str();
    return t;
}

namespace {

// The a priori gradient limits; `why` (in parentheses after the rule's name) and `hint` (at the
// end) say why no baseline sets them and what would.
GradientTolerances gradient_a_priori(const InputStats& s, Precision precision, const Problem& p, const double (&other_max_abs)[3],
                                     const std::string& why, const std::string& hint) {
    const double E = rounding_tolerance(s, precision).error_unit;
    const double grow = 4.0 * std::sqrt(double(std::max(p.seq_q, p.seq_k)));
    GradientTolerances t;
    t.dq = Tolerance{grow * E * other_max_abs[0], grow * E};
    t.dk = Tolerance{grow * E * other_max_abs[1], grow * E};
    t.dv = Tolerance{grow * E * other_max_abs[2], grow * E};
    std::ostringstream rule;
    rule << "a priori gradient rule (" << why << "): 4 sqrt(N) E max|g| with E = " << num(E) << " (the forward's "
         << to_string(precision) << " rule), N = " << std::max(p.seq_q, p.seq_k) << "\nloose: it catches gross errors only" << hint;
    t.rule = rule.str();
    return t;
}

}  // namespace

GradientTolerances gradient_tolerance(const InputStats& s, Precision precision, const Problem& p,
                                      const EmulatedGradients& naive, const ReferenceGradients& reference) {
    const std::string name = to_string(precision);
    const char* names[3] = {"dQ", "dK", "dV"};
    const std::vector<float>* got[3] = {&naive.dq, &naive.dk, &naive.dv};
    const std::vector<double>* want[3] = {&reference.dq, &reference.dk, &reference.dv};
    Metrics m[3];
    double ref_max[3], ref_l2[3];
    for (int g = 0; g < 3; ++g) {
        m[g] = compare(*got[g], *want[g]);
        double largest = 0.0, sq = 0.0;
        for (double x : *want[g]) largest = std::max(largest, std::abs(x)), sq += x * x;
        ref_max[g] = largest;
        ref_l2[g] = std::sqrt(sq);
    }
    if (m[0].nonfinite + m[1].nonfinite + m[2].nonfinite > 0) {
        // Only a non-finite input or a float32 overflow gets here (naive_backward_emulated() keeps
        // values beyond the precision's range in float32): nothing measured can set limits.
        std::ostringstream why;
        why << "the naive " << name << " backward is not finite on these inputs (";
        for (int g = 0; g < 3; ++g) why << (g ? ", " : "") << m[g].nonfinite << " of " << names[g];
        why << " NaN or inf where float64 is finite), so it cannot set limits;\n";
        GradientTolerances t = gradient_a_priori(s, precision, p, ref_max, "applies instead", "");
        t.rule.insert(0, why.str());
        return t;
    }
    const double u_p = precision == Precision::Float32 ? 0.0 : unit_roundoff(precision);
    const double F = rounding_tolerance(s, Precision::Float32).error_unit + u_p;
    const double gamma = double(p.head_dim) * unit_roundoff(Precision::Float32);  // d u: a float32 sum of d products
    Tolerance* limits[3];
    GradientTolerances t;
    limits[0] = &t.dq, limits[1] = &t.dk, limits[2] = &t.dv;
    for (int g = 0; g < 3; ++g) {
        // compare() falls back to the absolute L2 error when the reference is all zero.
        const double norm = ref_l2[g] > 0.0 ? ref_l2[g] : 1.0;
        *limits[g] = Tolerance{2.0 * m[g].max_abs + F * ref_max[g] + gamma * naive.terms_max_abs[g] +
                                   2.0 * u_p * naive.d_terms_max_abs[g],
                               2.0 * m[g].rel_l2 + F + gamma * naive.terms_l2[g] / norm + 2.0 * u_p * naive.d_terms_l2[g] / norm};
    }
    std::ostringstream rule;
    rule << "gradient rule: 2 x the error of the naive " << name << " backward (stores P) vs float64 + F max|g|, F = float32 E";
    if (precision != Precision::Float32) rule << " + u_" << name;
    rule << " = " << num(F) << ",\n  + d u |terms of dP - D| for dQ, dK (d u = " << num(gamma) << "; terms up to "
         << num(naive.terms_max_abs[0]) << " in dQ, " << num(naive.terms_max_abs[1]) << " in dK)";
    if (naive.d_terms_max_abs[0] > 0.0 || naive.d_terms_max_abs[1] > 0.0) {
        // The rows EmulatedGradients::d_terms_max_abs counts: one-hot, largest score beyond this.
        const double score = 0.5 * u_p / unit_roundoff(Precision::Float32) - 4.0;
        rule << "\n  + 2 u_" << name << " |terms of D| for dQ, dK on one-hot rows with scores beyond " << num(score)
             << " (there the O of a forward in " << name << " is two roundings off a row of V, the naive one's exact; terms up to "
             << num(naive.d_terms_max_abs[0]) << " in dQ, " << num(naive.d_terms_max_abs[1]) << " in dK)";
    }
    rule << "\nnaive " << name << " backward: dQ max_abs " << num(m[0].max_abs) << ", rel_l2 " << num(m[0].rel_l2) << "; dK "
         << num(m[1].max_abs) << ", " << num(m[1].rel_l2) << "; dV " << num(m[2].max_abs) << ", " << num(m[2].rel_l2);
    if (naive.overflowed > 0) {
        rule << "\nthe naive " << name << " backward overflowed " << name << " (beyond "
             << (precision == Precision::Float16 ? "65504" : "3.39e38") << ") in " << naive.overflowed
             << " values of dS or the gradients: they stay in float32 there, as float32 accumulators hold them";
    }
    t.rule = rule.str();
    return t;
}

GradientTolerances gradient_tolerance_a_priori(const InputStats& s, Precision precision, const Problem& p,
                                               const double (&other_max_abs)[3]) {
    return gradient_a_priori(s, precision, p, other_max_abs, "no float64 reference, so no naive baseline",
                             " (--reference always gives the tight limits)");
}

}  // namespace fa
