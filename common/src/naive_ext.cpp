// The naive attention and backward of fa/reference_ext.hpp's packed problem in a 16-bit
// precision: the baselines the low-precision rules of fa/tolerance.hpp measure against float64.
#include <algorithm>
#include <cmath>
#include <limits>

#include <Eigen/Dense>

#include "fa/philox.hpp"
#include "fa/reference_ext.hpp"
#include "rows.hpp"

namespace fa {

namespace {

using detail::load_rounded;
using detail::MatrixXfR;
using detail::round_all;

// Rows [row0, row0 + rows) of a packed tensor's head h, [rows, d], rounded to `precision`.
MatrixXfR load_sequence(View4<const float> t, int64_t h, int64_t row0, int64_t rows, Precision precision) {
    return load_rounded(t, 0, h, row0, rows, precision);
}

// Adds (or stores) the [rows, d] matrix `m` as rows [row0, row0 + rows) of head h of a packed
// (total, heads, d) vector.
void store_packed(std::vector<float>& out, const MatrixXfR& m, int64_t heads, int64_t h, int64_t row0) {
    const int64_t d = m.cols();
    for (int64_t r = 0; r < m.rows(); ++r)
        for (int64_t x = 0; x < d; ++x) out[size_t(((row0 + r) * heads + h) * d + x)] = m(r, x);
}

// The forward of one sequence and query head in float32, as a naive implementation does it: S
// scaled (and capped, T = tanh(S_raw / c) kept for the backward), P the softmax over each row's
// visible keys (0 elsewhere; a row that sees no key is all 0), Z the dropout factors (0 or
// 1/(1-p')), and each row's largest score.
struct SequenceForward {
    MatrixXfR P;              // [Nq, Nk], float32
    MatrixXfR T;              // [Nq, Nk], tanh(S_raw / c); empty without a cap
    MatrixXfR Z;              // [Nq, Nk], keep / (1 - p'); empty without dropout
    Eigen::VectorXf row_max;  // [Nq], 0 on rows that see no key
    Eigen::VectorXf lse;      // [Nq], -inf on rows that see no key
};

SequenceForward sequence_forward(const VarlenProblem& vp, int64_t b, int64_t h, const MatrixXfR& Q, const MatrixXfR& K) {
    const int64_t nq = Q.rows(), nk = K.rows();
    const float scale = float(vp.softmax_scale()), cap = float(vp.softcap);
    SequenceForward f;
    f.P = Q * K.transpose();  // [Nq, Nk]: S, then P in place
    f.P *= scale;
    if (cap > 0.0f) {
        f.T = (f.P.array() / cap).tanh().matrix();
        f.P = cap * f.T;
    }
    f.row_max = Eigen::VectorXf::Zero(nq);
    f.lse = Eigen::VectorXf::Constant(nq, -std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < nq; ++i) {
        const KeyRange r = visible_key_range(i, nq, nk, vp.window);
        if (r.empty()) {
            f.P.row(i).setZero();
            continue;
        }
        const float m = f.P.row(i).segment(r.begin, r.size()).maxCoeff();
        float l = 0.0f;
        for (int64_t j = r.begin; j < r.end; ++j) l += (f.P(i, j) = std::exp(f.P(i, j) - m));
        for (int64_t j = 0; j < nk; ++j) f.P(i, j) = j >= r.begin && j < r.end ? f.P(i, j) / l : 0.0f;
        f.row_max(i) = m;
        f.lse(i) = m + std::log(l);
    }
    if (vp.dropout.enabled()) {
        const float keep_scale = float(dropout_keep_scale(vp.dropout.p));
        f.Z.resize(nq, nk);
        for (int64_t i = 0; i < nq; ++i)
            for (int64_t j = 0; j < nk; ++j)
                f.Z(i, j) = dropout_keep(vp.dropout.seed, vp.dropout.offset, uint32_t(b), uint32_t(h), uint32_t(i), uint32_t(j),
                                         vp.dropout.p)
                                ? keep_scale
                                : 0.0f;
    }
    return f;
}

}  // namespace

EmulatedAttention naive_attention_varlen_emulated(Precision precision, const VarlenProblem& vp, View4<const float> q,
                                                  View4<const float> k, View4<const float> v) {
    vp.validate();
    const int64_t hq = vp.heads_q, d = vp.head_dim;
    EmulatedAttention out{std::vector<float>(size_t(vp.total_q * hq * d)), std::vector<float>(size_t(hq * vp.total_q))};
    int64_t overflowed = 0;  // P <= 1 and |O| <= max |v|: nothing leaves the range
    for (int64_t b = 0; b < vp.batch(); ++b) {
        const int64_t nq = vp.seq_q(b), nk = vp.seq_k(b), q0 = vp.cu_seqlens_q[size_t(b)], k0 = vp.cu_seqlens_k[size_t(b)];
        if (nq == 0) continue;
        for (int64_t h = 0; h < hq; ++h) {
            const MatrixXfR Q = load_sequence(q, h, q0, nq, precision);                // [Nq, d]
            const MatrixXfR K = load_sequence(k, vp.kv_head(h), k0, nk, precision);    // [Nk, d]
            const MatrixXfR V = load_sequence(v, vp.kv_head(h), k0, nk, precision);    // [Nk, d]
            const SequenceForward f = sequence_forward(vp, b, h, Q, K);
            MatrixXfR P_low = f.Z.size() ? MatrixXfR(f.P.cwiseProduct(f.Z)) : f.P;  // [Nq, Nk], P~ rounded
            round_all(precision, P_low, overflowed);
            MatrixXfR O = P_low * V;  // [Nq, d]; rows that see no key are 0
            round_all(precision, O, overflowed);
            store_packed(out.o, O, hq, h, q0);
            for (int64_t i = 0; i < nq; ++i) out.lse[size_t(h * vp.total_q + q0 + i)] = f.lse(i);
        }
    }
    return out;
}

EmulatedGradients naive_backward_varlen_emulated(Precision precision, const VarlenProblem& vp, View4<const float> q,
                                                 View4<const float> k, View4<const float> v, View4<const float> dout) {
    vp.validate();
    const int64_t hq = vp.heads_q, hk = vp.heads_k, d = vp.head_dim;
    const float scale = float(vp.softmax_scale());
    EmulatedGradients g{std::vector<float>(size_t(vp.total_q * hq * d)), std::vector<float>(size_t(vp.total_k * hk * d)),
                        std::vector<float>(size_t(vp.total_k * hk * d))};
    double terms_sq[2] = {0.0, 0.0}, d_terms_sq[2] = {0.0, 0.0};
    const double u = unit_roundoff(Precision::Float32), u_p = unit_roundoff(precision);
    for (int64_t b = 0; b < vp.batch(); ++b) {
        const int64_t nq = vp.seq_q(b), nk = vp.seq_k(b), q0 = vp.cu_seqlens_q[size_t(b)], k0 = vp.cu_seqlens_k[size_t(b)];
        for (int64_t kh = 0; kh < hk; ++kh) {
            const MatrixXfR K = load_sequence(k, kh, k0, nk, precision);  // [Nk, d]
            const MatrixXfR V = load_sequence(v, kh, k0, nk, precision);  // [Nk, d]
            // dK and dV of this key/value head: float32 sums over the query heads of its group.
            MatrixXfR dK = MatrixXfR::Zero(nk, d), dV = MatrixXfR::Zero(nk, d);
            for (int64_t h = kh * vp.group_size(); h < (kh + 1) * vp.group_size(); ++h) {
                const MatrixXfR Q = load_sequence(q, h, q0, nq, precision);      // [Nq, d]
                const MatrixXfR dO = load_sequence(dout, h, q0, nq, precision);  // [Nq, d]
                const SequenceForward f = sequence_forward(vp, b, h, Q, K);
                const MatrixXfR& P = f.P;  // [Nq, Nk], float32, before dropout
                MatrixXfR P_low = f.Z.size() ? MatrixXfR(P.cwiseProduct(f.Z)) : P;  // P~ rounded: the operand of P~ V, P~^T dO
                round_all(precision, P_low, g.overflowed);
                MatrixXfR O = P_low * V;  // [Nq, d]
                round_all(precision, O, g.overflowed);
                dV += P_low.transpose() * dO;
                const Eigen::VectorXf D = (dO.array() * O.array()).rowwise().sum();  // [Nq]
                MatrixXfR dS = dO * V.transpose();  // [Nq, Nk]: dP~, then dP, then dS in place
                if (f.Z.size()) dS = dS.cwiseProduct(f.Z);
                {
                    // The magnitudes behind dP - D and D's share on one-hot rows, as
                    // naive_backward_emulated() measures them (EmulatedGradients).
                    const MatrixXfR A = (P.array() * (dS.array().abs().colwise() + D.array().abs())).matrix();
                    const MatrixXfR TQ = scale * (A * K.cwiseAbs());
                    const MatrixXfR TK = scale * (A.transpose() * Q.cwiseAbs());
                    if (TQ.size()) g.terms_max_abs[0] = std::max(g.terms_max_abs[0], double(TQ.cwiseAbs().maxCoeff()));
                    if (TK.size()) g.terms_max_abs[1] = std::max(g.terms_max_abs[1], double(TK.cwiseAbs().maxCoeff()));
                    terms_sq[0] += TQ.cast<double>().squaredNorm();
                    terms_sq[1] += TK.cast<double>().squaredNorm();
                    Eigen::VectorXf Dbar = (dO.array().abs() * (P * V.cwiseAbs()).array()).rowwise().sum();  // [Nq]
                    for (int64_t i = 0; i < nq; ++i)
                        if (nk == 0 || P_low.row(i).maxCoeff() != 1.0f || u * (std::abs(double(f.row_max(i))) + 4.0) < 0.5 * u_p)
                            Dbar(i) = 0.0f;
                    const MatrixXfR TQ_D = scale * (Dbar.asDiagonal() * (P * K.cwiseAbs()));
                    const MatrixXfR TK_D = scale * (P.transpose() * (Dbar.asDiagonal() * Q.cwiseAbs()));
                    if (TQ_D.size()) g.d_terms_max_abs[0] = std::max(g.d_terms_max_abs[0], double(TQ_D.cwiseAbs().maxCoeff()));
                    if (TK_D.size()) g.d_terms_max_abs[1] = std::max(g.d_terms_max_abs[1], double(TK_D.cwiseAbs().maxCoeff()));
                    d_terms_sq[0] += TQ_D.cast<double>().squaredNorm();
                    d_terms_sq[1] += TK_D.cast<double>().squaredNorm();
                }
                dS = (P.array() * (dS.colwise() - D).array()).matrix();  // masked entries and empty rows: exactly 0
                if (f.T.size()) dS = dS.cwiseProduct(MatrixXfR((1.0f - f.T.array().square()).matrix()));
                round_all(precision, dS, g.overflowed);
                MatrixXfR dQ = dS * K;  // [Nq, d]
                dQ *= scale;
                round_all(precision, dQ, g.overflowed);
                store_packed(g.dq, dQ, hq, h, q0);
                MatrixXfR dK_h = dS.transpose() * Q;  // [Nk, d]
                dK += scale * dK_h;
            }
            round_all(precision, dK, g.overflowed);
            round_all(precision, dV, g.overflowed);
            store_packed(g.dk, dK, hk, kh, k0);
            store_packed(g.dv, dV, hk, kh, k0);
        }
    }
    for (int i = 0; i < 2; ++i) g.terms_l2[i] = std::sqrt(terms_sq[i]), g.d_terms_l2[i] = std::sqrt(d_terms_sq[i]);
    return g;
}

}  // namespace fa
