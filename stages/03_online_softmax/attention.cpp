#include "attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <Eigen/Dense>

#include "fa/eigen.hpp"

namespace fa::stage03 {

void attention(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v,
               View4<float> o, View3<float> lse) {
    const float scale = static_cast<float>(p.softmax_scale());
    const float neg_inf = -std::numeric_limits<float>::infinity();
    Eigen::RowVectorXf acc(p.head_dim);  // [d], the running output of one query row
    for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t h = 0; h < p.heads; ++h) {
            const MatrixRM Q = load_head(q, b, h);  // [Nq, d]
            const MatrixRM K = load_head(k, b, h);  // [Nk, d]
            const MatrixRM V = load_head(v, b, h);  // [Nk, d]
            for (int64_t i = 0; i < p.seq_q; ++i) {
                const int64_t end = visible_key_end(i, p.seq_q, p.seq_k, p.causal);
                //! [online]
                // Invariant after key j: m = max(s_0..s_j), l = sum exp(s_t - m),
                // acc = sum exp(s_t - m) v_t, all over t <= j.
                float m = neg_inf;
                float l = 0.0f;
                acc.setZero();
                for (int64_t j = 0; j < end; ++j) {
                    const float s = scale * Q.row(i).dot(K.row(j));  // one score, then forgotten
                    const float m_new = std::max(m, s);
                    // exp(m - m_new) <= 1 re-expresses the old sums against the new maximum;
                    // it is 1 when the maximum did not move, and exp(-inf) = 0 for the first key.
                    const float correction = std::exp(m - m_new);
                    const float p_j = std::exp(s - m_new);  // <= 1: never overflows
                    l = l * correction + p_j;
                    acc = acc * correction + p_j * V.row(j);
                    m = m_new;
                }
                //! [online]
                //! [finish]
                // A row that saw no key has l = 0: O = 0 and LSE = log(0) = -inf by contract.
                const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
                for (int64_t x = 0; x < p.head_dim; ++x) o(b, h, i, x) = acc(x) * inv_l;
                lse(b, h, i) = l > 0.0f ? m + std::log(l) : neg_inf;
                //! [finish]
            }
        }
    }
}

double intermediate_bytes(const Problem& p) {
    // Dense copies of one head's q, k and v, and the running output row.
    return 4.0 * ((double(p.seq_q) + 2.0 * double(p.seq_k)) * double(p.head_dim) + double(p.head_dim));
}

}  // namespace fa::stage03
