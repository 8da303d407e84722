#include "attention.hpp"

#include <cmath>

#include <Eigen/Dense>

#include "fa/eigen.hpp"

namespace fa::stage01 {

void attention(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v,
               View4<float> o, View3<float> lse) {
    const float scale = static_cast<float>(p.softmax_scale());
    for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t h = 0; h < p.heads; ++h) {
            const MatrixRM Q = load_head(q, b, h);  // [Nq, d]
            const MatrixRM K = load_head(k, b, h);  // [Nk, d]
            const MatrixRM V = load_head(v, b, h);  // [Nk, d]

            //! [naive]
            // S = scale * Q K^T: the full Nq x Nk score matrix of this head.
            const MatrixRM S = (Q * K.transpose()) * scale;  // [Nq, Nk]
            // P = exp(S) / rowsum(exp(S)): the textbook softmax, no max subtracted.
            MatrixRM P = S.array().exp().matrix();  // [Nq, Nk], overflows once s > 88.7
            // The causal mask gives future keys a weight of exactly 0. (Setting their scores to
            // -inf before exp() says the same in math, but a vectorized exp need not return an
            // exact 0 for -inf: Eigen's SSE path returns 2.9e-39.)
            for (int64_t i = 0; i < p.seq_q; ++i)
                for (int64_t j = visible_key_end(i, p.seq_q, p.seq_k, p.causal); j < p.seq_k; ++j) P(i, j) = 0.0f;
            const Eigen::VectorXf row_sum = P.rowwise().sum();   // [Nq]
            for (int64_t i = 0; i < p.seq_q; ++i)
                if (row_sum(i) > 0) P.row(i) /= row_sum(i);
            const MatrixRM O = P * V;  // [Nq, d]
            //! [naive]

            for (int64_t i = 0; i < p.seq_q; ++i) {
                // A row that sees no key has an empty sum: O = 0 and LSE = log(0) = -inf by contract.
                for (int64_t x = 0; x < p.head_dim; ++x) o(b, h, i, x) = row_sum(i) > 0 ? O(i, x) : 0.0f;
                lse(b, h, i) = std::log(row_sum(i));
            }
        }
    }
}

double intermediate_bytes(const Problem& p) {
    // S and P of one head, plus dense copies of q, k, v and o of one head.
    return 4.0 * (2.0 * double(p.seq_q) * double(p.seq_k) + 2.0 * double(p.seq_q + p.seq_k) * double(p.head_dim));
}

}  // namespace fa::stage01
