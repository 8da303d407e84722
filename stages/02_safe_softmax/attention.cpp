#include "attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <Eigen/Dense>

#include "fa/eigen.hpp"

namespace fa::stage02 {

namespace {

//! [safe_softmax_row]
// Safe softmax of one row of scores, in place: s[0, end) becomes P, s[end, Nk) (keys the causal
// mask hides) becomes 0. Returns the row's log-sum-exp, -inf when it sees no key (end == 0).
float safe_softmax_row(float* s, int64_t end, int64_t Nk) {
    std::fill(s + end, s + Nk, 0.0f);
    if (end == 0) return -std::numeric_limits<float>::infinity();  // log(0): no key to weigh
    Eigen::Map<Eigen::ArrayXf> row(s, end);  // the visible scores, in place
    // Pass 1: the row maximum m. Every exponent below is then s_j - m <= 0.
    const float m = row.maxCoeff();
    // Pass 2: exp(s_j - m), and their sum l. Each term is in (0, 1] and the largest one is
    // exactly 1, so l lies in [1, end]: it can neither overflow nor be 0.
    row = (row - m).exp();
    const float l = row.sum();
    // Pass 3: normalize.
    row /= l;
    // log(sum_j exp(s_j)) = m + log(sum_j exp(s_j - m)), finite whenever the scores are.
    return m + std::log(l);
}
//! [safe_softmax_row]

}  // namespace

void attention(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v,
               View4<float> o, View3<float> lse) {
    const float scale = static_cast<float>(p.softmax_scale());
    for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t h = 0; h < p.heads; ++h) {
            const MatrixRM Q = load_head(q, b, h);  // [Nq, d]
            const MatrixRM K = load_head(k, b, h);  // [Nk, d]
            const MatrixRM V = load_head(v, b, h);  // [Nk, d]

            //! [safe]
            // S = scale * Q K^T, the full Nq x Nk score matrix of this head, as in stage 01.
            MatrixRM S(p.seq_q, p.seq_k);  // [Nq, Nk], row-major: each row contiguous
            S.noalias() = (scale * Q) * K.transpose();  // written straight into S: no temporary
            // Row by row, S becomes P = softmax(S). No -inf is written for the causal mask: the
            // softmax simply stops at the row's first hidden key.
            for (int64_t i = 0; i < p.seq_q; ++i) {
                const int64_t end = visible_key_end(i, p.seq_q, p.seq_k, p.causal);
                lse(b, h, i) = safe_softmax_row(&S(i, 0), end, p.seq_k);
            }
            const MatrixRM O = S * V;  // [Nq, d]; a row that sees no key is all-zero P, so O = 0
            //! [safe]

            for (int64_t i = 0; i < p.seq_q; ++i)
                for (int64_t x = 0; x < p.head_dim; ++x) o(b, h, i, x) = O(i, x);
        }
    }
}

double intermediate_bytes(const Problem& p) {
    // S (then P, in place) of one head, plus dense copies of q, k, v and o of one head.
    return 4.0 * (double(p.seq_q) * double(p.seq_k) + 2.0 * double(p.seq_q + p.seq_k) * double(p.head_dim));
}

}  // namespace fa::stage02
