#include "fa/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <Eigen/Dense>

#include "rows.hpp"

namespace fa {

using detail::load_rounded;
using detail::load_rows;
using detail::MatrixXdR;
using detail::MatrixXfR;

Reference reference_attention(const Problem& p, View4<const float> q, View4<const float> k,
                              View4<const float> v) {
    const int64_t d = p.head_dim;
    const double scale = p.softmax_scale();
    const double neg_inf = -std::numeric_limits<double>::infinity();
    Reference ref{std::vector<double>(static_cast<size_t>(p.q_elems())),
                  std::vector<double>(static_cast<size_t>(p.lse_elems()))};
    constexpr int64_t kRowsPerBlock = 128;  // bounds the score block at 128 x Nk doubles
    for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t h = 0; h < p.heads; ++h) {
            const MatrixXdR K = load_rows(k, b, h, 0, p.seq_k);  // [Nk, d]
            const MatrixXdR V = load_rows(v, b, h, 0, p.seq_k);  // [Nk, d]
            for (int64_t r0 = 0; r0 < p.seq_q; r0 += kRowsPerBlock) {
                const int64_t rows = std::min(kRowsPerBlock, p.seq_q - r0);
                const MatrixXdR Q = load_rows(q, b, h, r0, rows);    // [rows, d]
                MatrixXdR S = (Q * K.transpose()) * scale;           // [rows, Nk]
                for (int64_t r = 0; r < rows; ++r) {
                    const int64_t i = r0 + r;
                    const int64_t end = visible_key_end(i, p.seq_q, p.seq_k, p.causal);
                    const size_t row_index = static_cast<size_t>((b * p.heads + h) * p.seq_q + i);
                    double* o_row = &ref.o[row_index * static_cast<size_t>(d)];
                    if (end == 0) {  // no visible key: O = 0, LSE = -inf by contract
                        std::fill(o_row, o_row + d, 0.0);
                        ref.lse[row_index] = neg_inf;
                        continue;
                    }
                    auto s = S.row(r).head(end);
                    const double m = s.maxCoeff();
                    Eigen::RowVectorXd P = (s.array() - m).exp().matrix();  // safe softmax numerator
                    const double l = P.sum();
                    const Eigen::RowVectorXd o = (P * V.topRows(end)) / l;  // [1, d]
                    std::copy(o.data(), o.data() + d, o_row);
                    ref.lse[row_index] = m + std::log(l);
                }
            }
        }
    }
    return ref;
}

EmulatedAttention naive_attention_emulated(Precision precision, const Problem& p, View4<const float> q,
                                           View4<const float> k, View4<const float> v) {
    const int64_t d = p.head_dim;
    const float scale = static_cast<float>(p.softmax_scale());
    EmulatedAttention out{std::vector<float>(static_cast<size_t>(p.q_elems())),
                          std::vector<float>(static_cast<size_t>(p.lse_elems()))};
    constexpr int64_t kRowsPerBlock = 128;  // bounds S and P at 128 x Nk floats
    for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t h = 0; h < p.heads; ++h) {
            const MatrixXfR K = load_rounded(k, b, h, 0, p.seq_k, precision);  // [Nk, d]
            const MatrixXfR V = load_rounded(v, b, h, 0, p.seq_k, precision);  // [Nk, d]
            for (int64_t r0 = 0; r0 < p.seq_q; r0 += kRowsPerBlock) {
                const int64_t rows = std::min(kRowsPerBlock, p.seq_q - r0);
                const MatrixXfR Q = load_rounded(q, b, h, r0, rows, precision);  // [rows, d]
                MatrixXfR S = Q * K.transpose();                                 // [rows, Nk], float32 sums
                S *= scale;
                MatrixXfR P = MatrixXfR::Zero(rows, p.seq_k);  // masked keys keep 0
                for (int64_t r = 0; r < rows; ++r) {
                    const int64_t i = r0 + r;
                    const int64_t end = visible_key_end(i, p.seq_q, p.seq_k, p.causal);
                    const size_t row_index = static_cast<size_t>((b * p.heads + h) * p.seq_q + i);
                    if (end == 0) {
                        out.lse[row_index] = -std::numeric_limits<float>::infinity();
                        continue;
                    }
                    const float m = S.row(r).head(end).maxCoeff();
                    float l = 0.0f;
                    for (int64_t j = 0; j < end; ++j) {
                        P(r, j) = std::exp(S(r, j) - m);
                        l += P(r, j);
                    }
                    for (int64_t j = 0; j < end; ++j) P(r, j) = round_to(precision, P(r, j) / l);
                    out.lse[row_index] = m + std::log(l);
                }
                const MatrixXfR O = P * V;  // [rows, d], float32 sums
                for (int64_t r = 0; r < rows; ++r) {
                    float* o_row = &out.o[static_cast<size_t>(((b * p.heads + h) * p.seq_q + r0 + r) * d)];
                    for (int64_t x = 0; x < d; ++x) o_row[x] = round_to(precision, O(r, x));
                }
            }
        }
    }
    return out;
}

double reference_flops(const Problem& p) {
    return 4.0 * double(p.batch) * double(p.heads) * double(p.seq_q) * double(p.seq_k) * double(p.head_dim);
}

}  // namespace fa
