#include "fa/reference_backward.hpp"

#include <algorithm>
#include <cmath>

#include <Eigen/Dense>

#include "rows.hpp"

namespace fa {

namespace {

using detail::load_rows;
using detail::MatrixXdR;
using detail::MatrixXfR;
using detail::round_all;

// Copies all N rows of head (b, h), each value rounded to `precision`: the operand a stage
// computing in that precision actually multiplies.
MatrixXfR load_head_rounded(View4<const float> t, int64_t b, int64_t h, Precision precision) {
    return detail::load_rounded(t, b, h, 0, t.shape[2], precision);
}

// Writes the [rows, d] matrix `m` as rows [row0, row0 + rows) of head (b, h) of a logical-order
// (B, H, N, d) vector `out` with `heads` heads of `seq` rows.
template <class T, class Matrix>
void store_rows(std::vector<T>& out, const Matrix& m, int64_t heads, int64_t seq, int64_t b, int64_t h, int64_t row0) {
    const int64_t d = m.cols();
    for (int64_t r = 0; r < m.rows(); ++r) {
        T* row = &out[static_cast<size_t>(((b * heads + h) * seq + row0 + r) * d)];
        for (int64_t x = 0; x < d; ++x) row[x] = static_cast<T>(m(r, x));
    }
}

}  // namespace

ReferenceGradients reference_backward(const Problem& p, View4<const float> q, View4<const float> k,
                                      View4<const float> v, View4<const float> dout) {
    const double scale = p.softmax_scale();
    ReferenceGradients g{std::vector<double>(static_cast<size_t>(p.q_elems())),
                         std::vector<double>(static_cast<size_t>(p.kv_elems())),
                         std::vector<double>(static_cast<size_t>(p.kv_elems()))};
    constexpr int64_t kRowsPerBlock = 128;  // bounds S, P, dP and dS at 128 x Nk doubles each
    for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t h = 0; h < p.heads; ++h) {
            const MatrixXdR K = load_rows(k, b, h, 0, p.seq_k);  // [Nk, d]
            const MatrixXdR V = load_rows(v, b, h, 0, p.seq_k);  // [Nk, d]
            // dK and dV sum contributions from every query row, so they live across the blocks.
            MatrixXdR dK = MatrixXdR::Zero(p.seq_k, p.head_dim);  // [Nk, d]
            MatrixXdR dV = MatrixXdR::Zero(p.seq_k, p.head_dim);  // [Nk, d]
            for (int64_t r0 = 0; r0 < p.seq_q; r0 += kRowsPerBlock) {
                const int64_t rows = std::min(kRowsPerBlock, p.seq_q - r0);
                const MatrixXdR Q = load_rows(q, b, h, r0, rows);      // [rows, d]
                const MatrixXdR dO = load_rows(dout, b, h, r0, rows);  // [rows, d]
                const MatrixXdR S = (Q * K.transpose()) * scale;       // [rows, Nk]
                // P keeps 0 on masked keys and on whole rows that see no key: such entries then
                // contribute nothing to O, dV, dS and so to any gradient, with no special case below.
                MatrixXdR P = MatrixXdR::Zero(rows, p.seq_k);  // [rows, Nk]
                for (int64_t r = 0; r < rows; ++r) {
                    const int64_t end = visible_key_end(r0 + r, p.seq_q, p.seq_k, p.causal);
                    if (end == 0) continue;
                    auto s = S.row(r).head(end);
                    const double m = s.maxCoeff();  // safe softmax: every exponent <= 0
                    auto p_row = P.row(r).head(end);
                    p_row = (s.array() - m).exp().matrix();
                    p_row /= p_row.sum();
                }
                const MatrixXdR O = P * V;  // [rows, d], recomputed: no stage's O is trusted
                // D_i = sum_x dO_ix O_ix equals sum_j P_ij dP_ij: the softmax Jacobian's
                // rank-one part, computed from O because it costs d per row instead of Nk.
                const Eigen::VectorXd D = (dO.array() * O.array()).rowwise().sum();  // [rows]
                const MatrixXdR dP = dO * V.transpose();                              // [rows, Nk]
                const MatrixXdR dS = (P.array() * (dP.colwise() - D).array()).matrix();  // [rows, Nk]
                const MatrixXdR dQ = (dS * K) * scale;  // [rows, d]
                dK.noalias() += (dS.transpose() * Q) * scale;
                dV.noalias() += P.transpose() * dO;
                store_rows(g.dq, dQ, p.heads, p.seq_q, b, h, r0);
            }
            store_rows(g.dk, dK, p.heads, p.seq_k, b, h, 0);
            store_rows(g.dv, dV, p.heads, p.seq_k, b, h, 0);
        }
    }
    return g;
}

EmulatedGradients naive_backward_emulated(Precision precision, const Problem& p, View4<const float> q,
                                          View4<const float> k, View4<const float> v, View4<const float> dout) {
    const float scale = static_cast<float>(p.softmax_scale());
    EmulatedGradients g{std::vector<float>(static_cast<size_t>(p.q_elems())),
                        std::vector<float>(static_cast<size_t>(p.kv_elems())),
                        std::vector<float>(static_cast<size_t>(p.kv_elems()))};
    double terms_sq[2] = {0.0, 0.0};    // squared norms of T_Q and T_K over the heads
    double d_terms_sq[2] = {0.0, 0.0};  // squared norms of T^D_Q and T^D_K
    for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t h = 0; h < p.heads; ++h) {
            // The operands as they sit in memory in `precision`.
            const MatrixXfR Q = load_head_rounded(q, b, h, precision);      // [Nq, d]
            const MatrixXfR K = load_head_rounded(k, b, h, precision);      // [Nk, d]
            const MatrixXfR V = load_head_rounded(v, b, h, precision);      // [Nk, d]
            const MatrixXfR dO = load_head_rounded(dout, b, h, precision);  // [Nq, d]

            // Forward, as naive_attention_emulated() does it: S summed in float32 then scaled,
            // the softmax in float32. P is kept twice: in float32 for dS, and rounded to the
            // precision as the operand of the products P V and P^T dO.
            MatrixXfR P = Q * K.transpose();  // [Nq, Nk]: S, then P in place
            P *= scale;
            Eigen::VectorXf row_max = Eigen::VectorXf::Zero(p.seq_q);  // [Nq]: each row's largest score
            for (int64_t i = 0; i < p.seq_q; ++i) {
                const int64_t end = visible_key_end(i, p.seq_q, p.seq_k, p.causal);
                if (end == 0) {  // no visible key: P = 0, so every gradient of the row is 0
                    P.row(i).setZero();
                    continue;
                }
                const float m = P.row(i).head(end).maxCoeff();
                row_max(i) = m;
                float l = 0.0f;
                for (int64_t j = 0; j < end; ++j) {
                    P(i, j) = std::exp(P(i, j) - m);
                    l += P(i, j);
                }
                for (int64_t j = 0; j < end; ++j) P(i, j) /= l;
                P.row(i).tail(p.seq_k - end).setZero();  // masked keys
            }
            MatrixXfR P_low = P;  // [Nq, Nk], P rounded to the precision
            round_all(precision, P_low, g.overflowed);
            MatrixXfR O = P_low * V;  // [Nq, d], float32 sums, then stored in the precision
            round_all(precision, O, g.overflowed);

            // Backward.
            MatrixXfR dV = P_low.transpose() * dO;  // [Nk, d]
            const Eigen::VectorXf D = (dO.array() * O.array()).rowwise().sum();  // [Nq], float32
            MatrixXfR dS = dO * V.transpose();  // [Nq, Nk]: dP, then dS in place
            {
                // The magnitudes behind dP - D (see EmulatedGradients::terms_max_abs), in float32:
                // sums of non-negative terms need no care.
                const MatrixXfR A = (P.array() * (dS.array().abs().colwise() + D.array().abs())).matrix();  // [Nq, Nk]
                const MatrixXfR TQ = scale * (A * K.cwiseAbs());                                         // [Nq, d]
                const MatrixXfR TK = scale * (A.transpose() * Q.cwiseAbs());                             // [Nk, d]
                g.terms_max_abs[0] = std::max(g.terms_max_abs[0], double(TQ.maxCoeff()));
                g.terms_max_abs[1] = std::max(g.terms_max_abs[1], double(TK.maxCoeff()));
                terms_sq[0] += TQ.cast<double>().squaredNorm();
                terms_sq[1] += TK.cast<double>().squaredNorm();
                // D's share (see EmulatedGradients::d_terms_max_abs): Dbar_i = sum_x |dO_ix| (P |V|)_ix,
                // how far two roundings of O move D_i, on the rows whose P rounds to a single 1 and
                // whose largest score float32 holds no closer than half a unit of the precision.
                const double u = unit_roundoff(Precision::Float32), u_p = unit_roundoff(precision);
                Eigen::VectorXf Dbar = (dO.array().abs() * (P * V.cwiseAbs()).array()).rowwise().sum();  // [Nq]
                for (int64_t i = 0; i < p.seq_q; ++i)
                    if (P_low.row(i).maxCoeff() != 1.0f || u * (std::abs(double(row_max(i))) + 4.0) < 0.5 * u_p) Dbar(i) = 0.0f;
                const MatrixXfR TQ_D = scale * (Dbar.asDiagonal() * (P * K.cwiseAbs()));                       // [Nq, d]
                const MatrixXfR TK_D = scale * (P.transpose() * (Dbar.asDiagonal() * Q.cwiseAbs()));           // [Nk, d]
                g.d_terms_max_abs[0] = std::max(g.d_terms_max_abs[0], double(TQ_D.maxCoeff()));
                g.d_terms_max_abs[1] = std::max(g.d_terms_max_abs[1], double(TK_D.maxCoeff()));
                d_terms_sq[0] += TQ_D.cast<double>().squaredNorm();
                d_terms_sq[1] += TK_D.cast<double>().squaredNorm();
            }
            // dS = P (dP - D) with the float32 P: masked entries and empty rows have P = 0 and
            // come out exactly 0 (dP - D is finite), never NaN.
            dS = (P.array() * (dS.colwise() - D).array()).matrix();
            round_all(precision, dS, g.overflowed);  // the operand of dS K and dS^T Q
            MatrixXfR dQ = dS * K;  // [Nq, d], float32 sums, scaled after as S was
            dQ *= scale;
            MatrixXfR dK = dS.transpose() * Q;  // [Nk, d]
            dK *= scale;
            round_all(precision, dQ, g.overflowed);
            round_all(precision, dK, g.overflowed);
            round_all(precision, dV, g.overflowed);
            store_rows(g.dq, dQ, p.heads, p.seq_q, b, h, 0);
            store_rows(g.dk, dK, p.heads, p.seq_k, b, h, 0);
            store_rows(g.dv, dV, p.heads, p.seq_k, b, h, 0);
        }
    }
    g.terms_l2[0] = std::sqrt(terms_sq[0]);
    g.terms_l2[1] = std::sqrt(terms_sq[1]);
    g.d_terms_l2[0] = std::sqrt(d_terms_sq[0]);
    g.d_terms_l2[1] = std::sqrt(d_terms_sq[1]);
    return g;
}

double reference_backward_flops(const Problem& p) {
    // Counted as a FlashAttention backward run after its forward: the forward's two products
    // (S = Q K^T, O = P V) and the backward's five (S again, dP = dO V^T, dV = P^T dO, dQ = dS K,
    // dK = dS^T Q), 2 Nq Nk d flops each per head. The reference shares one S between the two,
    // so it does six: the figure is a budget, an upper bound on its work. No causal halving:
    // the reference computes every score, masked or not.
    return 14.0 * double(p.batch) * double(p.heads) * double(p.seq_q) * double(p.seq_k) * double(p.head_dim);
}

}  // namespace fa
