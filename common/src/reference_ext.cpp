#include "fa/reference_ext.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include <Eigen/Dense>

#include "fa/error.hpp"
#include "fa/npy.hpp"
#include "fa/philox.hpp"
#include "rows.hpp"

namespace fa {

namespace {

using detail::load_rows;
using detail::MatrixXdR;

// Refuses a view whose shape is not (1, heads, rows, d).
void check_shape(const char* name, View4<const float> t, int64_t heads, int64_t rows, int64_t d) {
    const std::array<int64_t, 4> want{1, heads, rows, d};
    if (t.shape == want) return;
    std::ostringstream msg;
    msg << name << " has shape (" << t.shape[0] << ", " << t.shape[1] << ", " << t.shape[2] << ", " << t.shape[3]
        << ") but the packed problem needs (1, " << heads << ", " << rows << ", " << d
        << "): a packed (total, heads, d) tensor viewed by make_packed_view()";
    throw InputError(msg.str());
}

void check_inputs(const VarlenProblem& p, View4<const float> q, View4<const float> k, View4<const float> v) {
    p.validate();
    check_shape("q", q, p.heads_q, p.total_q, p.head_dim);
    check_shape("k", k, p.heads_k, p.total_k, p.head_dim);
    check_shape("v", v, p.heads_k, p.total_k, p.head_dim);
}

// The scores of one block after the scale: S = c tanh(S_raw / c) when the cap c is positive, and
// tanh(S_raw / c) kept in `T` for the backward's derivative 1 - T^2.
struct Scores {
    MatrixXdR raw;     // [rows, Nk], scale Q K^T
    MatrixXdR capped;  // [rows, Nk], c tanh(raw / c); empty without a cap
    MatrixXdR T;       // [rows, Nk], tanh(raw / c); empty without a cap
    const MatrixXdR& S() const { return capped.size() ? capped : raw; }
};

Scores scores(const MatrixXdR& Q, const MatrixXdR& K, double scale, double softcap) {
    Scores s{(Q * K.transpose()) * scale, {}, {}};
    if (softcap > 0 && s.raw.size() > 0) {
        s.T = (s.raw.array() / softcap).tanh().matrix();
        s.capped = softcap * s.T;
    }
    return s;
}

// The keep bits of row i of query head h of sequence b, columns [0, Nk), into out[0..Nk): one
// Philox call per group of 16 scores (fa/philox.hpp), of which this row uses its 8.
void keep_row(const Dropout& dropout, int64_t b, int64_t h, int64_t i, int64_t Nk, uint8_t* out) {
    const uint32_t t = dropout_threshold(dropout.p);
    for (int64_t j0 = 0; j0 < Nk; j0 += 32)
        for (uint32_t q = 0; q < 4; ++q) {
            const uint32_t bits = dropout_keep16(dropout.seed, dropout.offset, uint32_t(b), uint32_t(h), uint32_t(i),
                                                 uint32_t(j0) + 2 * q, t);
            for (uint32_t u = 0; u < 4; ++u)
                for (uint32_t e = 0; e < 2; ++e) {
                    const int64_t j = j0 + 8 * u + 2 * q + e;
                    if (j < Nk) out[j] = uint8_t((bits >> dropout_byte(uint32_t(i), uint32_t(j))) & 1u);
                }
        }
}

// Z of one block: 1/(1-p') (dropout_keep_scale) where row i0 + r, column j of head h of sequence b
// is kept, else 0.
MatrixXdR dropout_scale(const Dropout& dropout, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t Nk) {
    const double kept = dropout_keep_scale(dropout.p);
    MatrixXdR Z(rows, Nk);
    std::vector<uint8_t> bits(static_cast<size_t>(Nk));
    for (int64_t r = 0; r < rows; ++r) {
        keep_row(dropout, b, h, i0 + r, Nk, bits.data());
        for (int64_t j = 0; j < Nk; ++j) Z(r, j) = bits[size_t(j)] ? kept : 0.0;
    }
    return Z;
}

constexpr int64_t kRowsPerBlock = 128;  // as reference.cpp: bounds S and P at 128 x Nk doubles

}  // namespace

VarlenReference reference_attention_varlen(const VarlenProblem& p, View4<const float> q, View4<const float> k,
                                           View4<const float> v) {
    check_inputs(p, q, k, v);
    const int64_t d = p.head_dim, Hq = p.heads_q;
    const double scale = p.softmax_scale();
    const double neg_inf = -std::numeric_limits<double>::infinity();
    VarlenReference ref{std::vector<double>(size_t(p.total_q * Hq * d), 0.0), std::vector<double>(size_t(Hq * p.total_q))};
    for (int64_t b = 0; b < p.batch(); ++b) {
        const int64_t Nq = p.seq_q(b), Nk = p.seq_k(b);
        const int64_t q0 = p.cu_seqlens_q[size_t(b)], k0 = p.cu_seqlens_k[size_t(b)];  // first packed rows
        for (int64_t h = 0; h < Hq; ++h) {
            const int64_t g = p.kv_head(h);                    // the key/value head this query head reads
            const MatrixXdR K = load_rows(k, 0, g, k0, Nk);  // [Nk, d]
            const MatrixXdR V = load_rows(v, 0, g, k0, Nk);  // [Nk, d]
            for (int64_t r0 = 0; r0 < Nq; r0 += kRowsPerBlock) {
                const int64_t rows = std::min(kRowsPerBlock, Nq - r0);
                const MatrixXdR Q = load_rows(q, 0, h, q0 + r0, rows);  // [rows, d]
                const Scores sc = scores(Q, K, scale, p.softcap);      // [rows, Nk]
                const MatrixXdR& S = sc.S();
                const MatrixXdR Z = p.dropout.enabled() ? dropout_scale(p.dropout, b, h, r0, rows, Nk) : MatrixXdR();
                for (int64_t r = 0; r < rows; ++r) {
                    const int64_t i = r0 + r;
                    const KeyRange keys = visible_key_range(i, Nq, Nk, p.window);
                    double* o_row = &ref.o[size_t(((q0 + i) * Hq + h) * d)];
                    double& lse = ref.lse[size_t(h * p.total_q + q0 + i)];
                    if (keys.empty()) {  // no visible key: O = 0 (already), LSE = -inf by contract
                        lse = neg_inf;
                        continue;
                    }
                    auto s = S.row(r).segment(keys.begin, keys.size());
                    const double m = s.maxCoeff();
                    Eigen::RowVectorXd P = (s.array() - m).exp().matrix();  // safe softmax numerator
                    const double l = P.sum();                               // before dropout: the LSE's sum
                    if (p.dropout.enabled()) P.array() *= Z.row(r).segment(keys.begin, keys.size()).array();
                    const Eigen::RowVectorXd o = (P * V.middleRows(keys.begin, keys.size())) / l;  // [1, d]
                    std::copy(o.data(), o.data() + d, o_row);
                    lse = m + std::log(l);
                }
            }
        }
    }
    return ref;
}

VarlenGradients reference_backward_varlen(const VarlenProblem& p, View4<const float> q, View4<const float> k,
                                          View4<const float> v, View4<const float> dout) {
    check_inputs(p, q, k, v);
    check_shape("dO", dout, p.heads_q, p.total_q, p.head_dim);
    const int64_t d = p.head_dim, Hq = p.heads_q, Hk = p.heads_k, G = p.group_size();
    const double scale = p.softmax_scale();
    VarlenGradients g{std::vector<double>(size_t(p.total_q * Hq * d), 0.0), std::vector<double>(size_t(p.total_k * Hk * d), 0.0),
                      std::vector<double>(size_t(p.total_k * Hk * d), 0.0)};
    for (int64_t b = 0; b < p.batch(); ++b) {
        const int64_t Nq = p.seq_q(b), Nk = p.seq_k(b);
        const int64_t q0 = p.cu_seqlens_q[size_t(b)], k0 = p.cu_seqlens_k[size_t(b)];
        if (Nq == 0 || Nk == 0) continue;  // no (query, key) pair: every gradient of the sequence is 0
        for (int64_t kv = 0; kv < Hk; ++kv) {
            const MatrixXdR K = load_rows(k, 0, kv, k0, Nk);  // [Nk, d]
            const MatrixXdR V = load_rows(v, 0, kv, k0, Nk);  // [Nk, d]
            // dK and dV sum over every query row of every query head of the group.
            MatrixXdR dK = MatrixXdR::Zero(Nk, d);  // [Nk, d]
            MatrixXdR dV = MatrixXdR::Zero(Nk, d);  // [Nk, d]
            for (int64_t h = kv * G; h < (kv + 1) * G; ++h) {
                for (int64_t r0 = 0; r0 < Nq; r0 += kRowsPerBlock) {
                    const int64_t rows = std::min(kRowsPerBlock, Nq - r0);
                    const MatrixXdR Q = load_rows(q, 0, h, q0 + r0, rows);      // [rows, d]
                    const MatrixXdR dO = load_rows(dout, 0, h, q0 + r0, rows);  // [rows, d]
                    const Scores sc = scores(Q, K, scale, p.softcap);          // [rows, Nk]
                    const MatrixXdR& S = sc.S();
                    // P keeps 0 outside each row's window and on rows that see no key: such entries
                    // contribute nothing to O, dV or dS, with no special case below.
                    MatrixXdR P = MatrixXdR::Zero(rows, Nk);  // [rows, Nk]
                    for (int64_t r = 0; r < rows; ++r) {
                        const KeyRange keys = visible_key_range(r0 + r, Nq, Nk, p.window);
                        if (keys.empty()) continue;
                        auto s = S.row(r).segment(keys.begin, keys.size());
                        const double m = s.maxCoeff();
                        auto p_row = P.row(r).segment(keys.begin, keys.size());
                        p_row = (s.array() - m).exp().matrix();
                        p_row /= p_row.sum();
                    }
                    // Dropout: P~ = P o Z feeds O and dV; dP~ = dO V^T comes back through Z.
                    const bool drop = p.dropout.enabled();
                    const MatrixXdR Z = drop ? dropout_scale(p.dropout, b, h, r0, rows, Nk) : MatrixXdR();
                    const MatrixXdR P_dropped = drop ? MatrixXdR(P.cwiseProduct(Z)) : MatrixXdR();
                    const MatrixXdR& Pd = drop ? P_dropped : P;  // [rows, Nk]
                    const MatrixXdR O = Pd * V;                  // [rows, d], recomputed
                    // D_i = sum_x dO_ix O_ix = sum_j P_ij dP_ij (O is the dropped output).
                    const Eigen::VectorXd D = (dO.array() * O.array()).rowwise().sum();  // [rows]
                    MatrixXdR dP = dO * V.transpose();                                    // [rows, Nk]
                    if (drop) dP.array() *= Z.array();
                    MatrixXdR dS = (P.array() * (dP.colwise() - D).array()).matrix();  // [rows, Nk]
                    if (p.softcap > 0) dS.array() *= 1.0 - sc.T.array().square();    // d(c tanh(x/c))/dx
                    const MatrixXdR dQ = (dS * K) * scale;                             // [rows, d]
                    dK.noalias() += (dS.transpose() * Q) * scale;
                    dV.noalias() += Pd.transpose() * dO;
                    for (int64_t r = 0; r < rows; ++r)
                        std::copy(dQ.row(r).data(), dQ.row(r).data() + d, &g.dq[size_t(((q0 + r0 + r) * Hq + h) * d)]);
                }
            }
            for (int64_t j = 0; j < Nk; ++j) {
                std::copy(dK.row(j).data(), dK.row(j).data() + d, &g.dk[size_t(((k0 + j) * Hk + kv) * d)]);
                std::copy(dV.row(j).data(), dV.row(j).data() + d, &g.dv[size_t(((k0 + j) * Hk + kv) * d)]);
            }
        }
    }
    return g;
}

std::vector<uint8_t> dropout_keep_mask(const VarlenProblem& p, int64_t max_elements) {
    p.validate();
    const int64_t B = p.batch(), H = p.heads_q, Nq = p.max_seq_q(), Nk = p.max_seq_k();
    const double elements = double(B) * double(H) * double(Nq) * double(Nk);
    if (elements > double(max_elements)) {
        std::ostringstream msg;
        msg << "the dropout mask would hold " << elements << " entries (B=" << B << " x Hq=" << H << " x max Nq=" << Nq
            << " x max Nk=" << Nk << "), more than the " << max_elements << " written for small problems";
        throw InputError(msg.str());
    }
    std::vector<uint8_t> mask(size_t(B * H * Nq * Nk), 0);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < p.seq_q(b); ++i) keep_row(p.dropout, b, h, i, p.seq_k(b), &mask[size_t(((b * H + h) * Nq + i) * Nk)]);
    return mask;
}

void write_dropout_mask_npy(const std::string& path, const VarlenProblem& p, int64_t max_elements) {
    write_npy(path, {p.batch(), p.heads_q, p.max_seq_q(), p.max_seq_k()}, dropout_keep_mask(p, max_elements));
}

double reference_varlen_flops(const VarlenProblem& p) {
    double pairs = 0;
    for (int64_t b = 0; b < p.batch(); ++b) pairs += double(p.seq_q(b)) * double(p.seq_k(b));
    return 4.0 * pairs * double(p.heads_q) * double(p.head_dim);
}

}  // namespace fa
