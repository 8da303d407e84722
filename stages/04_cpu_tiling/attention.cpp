#include "attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include <Eigen/Dense>

#include "fa/eigen.hpp"
#include "fa/error.hpp"

namespace fa::stage04 {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// What one block of query rows carries while the key blocks stream past: the only memory the
// algorithm needs besides q, k, v and o.
struct Workspace {
    MatrixRM Q_i;         // [Br, d]  scale * Q rows of the current block
    MatrixRM S_ij;        // [Br, Bc] scores S_ij, overwritten in place by P_ij
    MatrixRM O_i;         // [Br, d]  output accumulator, not yet divided by l_i
    Eigen::VectorXf m_i;  // [Br]     running row maximum
    Eigen::VectorXf l_i;  // [Br]     running row sum of exp(s - m_i)

    Workspace(int64_t Br, int64_t Bc, int64_t d) : Q_i(Br, d), S_ij(Br, Bc), O_i(Br, d), m_i(Br), l_i(Br) {}
};

// How many leading columns of the key block [j0, j0 + cols) query row i may see (causal: a prefix).
int64_t visible_columns(const Problem& p, int64_t i, int64_t j0, int64_t cols) {
    return std::clamp<int64_t>(visible_key_end(i, p.seq_q, p.seq_k, p.causal) - j0, 0, cols);
}

//! [online_rows]
// Folds one score block into the running state of its rows (the online softmax of stage 03,
// a row of Bc scores at a time). On entry w.S_ij holds S_ij; on return it holds P_ij.
void online_softmax_rows(const Problem& p, int64_t i0, int64_t rows, int64_t j0, int64_t cols, Workspace& w) {
    for (int64_t r = 0; r < rows; ++r) {
        auto s = w.S_ij.row(r).head(cols);  // scores in, probabilities out
        const int64_t visible = visible_columns(p, i0 + r, j0, cols);
        if (visible == 0) {  // the row sees none of these keys: P = 0, its state is unchanged
            s.setZero();
            continue;
        }
        const float m_old = w.m_i(r);
        const float m_new = std::max(m_old, s.head(visible).maxCoeff());  // finite: visible >= 1
        s.head(visible) = (s.head(visible).array() - m_new).exp().matrix();
        s.tail(cols - visible).setZero();                  // keys the causal mask hides
        const float correction = std::exp(m_old - m_new);  // exp(-inf) = 0 on the row's first block
        w.l_i(r) = w.l_i(r) * correction + s.head(visible).sum();
        w.O_i.row(r) *= correction;  // O_i was summed against m_old; re-express it against m_new
        w.m_i(r) = m_new;
    }
}
//! [online_rows]

//! [local_rows]
// WRONG ON PURPOSE (--local-softmax): each block is normalized by its own row max and row sum,
// as if its Bc keys were the whole row, and nothing earlier is ever corrected. O_i then adds up
// Tc separately normalized averages: every block gets the same total weight 1, however small its
// scores are next to the other blocks'. Only this block's m and l survive, so the LSE is wrong too.
void local_softmax_rows(const Problem& p, int64_t i0, int64_t rows, int64_t j0, int64_t cols, Workspace& w) {
    for (int64_t r = 0; r < rows; ++r) {
        auto s = w.S_ij.row(r).head(cols);
        const int64_t visible = visible_columns(p, i0 + r, j0, cols);
        if (visible == 0) {
            s.setZero();
            continue;
        }
        const float m_local = s.head(visible).maxCoeff();
        s.head(visible) = (s.head(visible).array() - m_local).exp().matrix();
        const float l_local = s.head(visible).sum();
        s.head(visible) /= l_local;
        s.tail(cols - visible).setZero();
        w.m_i(r) = m_local;
        w.l_i(r) = l_local;
    }
}
//! [local_rows]

//! [finish]
// Writes the finished rows [i0, i0 + rows) of head (b, h), once: O = O_i / l_i and
// LSE = m_i + log(l_i). A row that saw no key has l_i = 0: O = 0 and LSE = -inf by contract.
void write_rows(const Problem& p, int64_t b, int64_t h, int64_t i0, int64_t rows, bool local_softmax,
                const Workspace& w, View4<float> o, View3<float> lse) {
    for (int64_t r = 0; r < rows; ++r) {
        const float l = w.l_i(r);
        // The block-local variant normalized every block already: it only adds them up.
        const float inv_l = l > 0.0f ? (local_softmax ? 1.0f : 1.0f / l) : 0.0f;
        for (int64_t x = 0; x < p.head_dim; ++x) o(b, h, i0 + r, x) = w.O_i(r, x) * inv_l;
        lse(b, h, i0 + r) = l > 0.0f ? w.m_i(r) + std::log(l) : kNegInf;
    }
}
//! [finish]

}  // namespace

void check_tiling(const Tiling& t) {
    auto check = [](const char* option, const char* name, int64_t value) {
        if (value < 1 || value > kMaxBlock) {
            std::ostringstream msg;
            msg << option << " (" << name << ") is " << value << ": it must be in [1, " << kMaxBlock << "]";
            throw InputError(msg.str());
        }
    };
    check("--block-m", "Br, query rows per block", t.Br);
    check("--block-n", "Bc, key rows per block", t.Bc);
}

std::string describe(const Tiling& t, const Problem& p) {
    std::ostringstream out;
    out << "Br=" << t.Br << " Bc=" << t.Bc << " (Tr=" << ceil_div(p.seq_q, t.Br) << " x Tc=" << ceil_div(p.seq_k, t.Bc)
        << " blocks per head), "
        << (t.local_softmax ? "BLOCK-LOCAL softmax: each S_ij normalized on its own, wrong on purpose" : "online softmax");
    return out.str();
}

void attention(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v,
               View4<float> o, View3<float> lse) {
    attention_tiled(p, q, k, v, o, lse, Tiling{});
}

BlockCounts attention_tiled(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v,
                            View4<float> o, View3<float> lse, const Tiling& tiling) {
    check_tiling(tiling);
    const float scale = static_cast<float>(p.softmax_scale());
    const int64_t d = p.head_dim;
    const int64_t Br = std::min(tiling.Br, p.seq_q), Bc = std::min(tiling.Bc, p.seq_k);
    const int64_t Tr = ceil_div(p.seq_q, Br), Tc = ceil_div(p.seq_k, Bc);
    Workspace w(Br, Bc, d);
    MatrixRM q_copy, k_copy, v_copy;  // used only by views whose feature axis is not contiguous
    BlockCounts counts;
    counts.total = p.batch * p.heads * Tr * Tc;

    for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t h = 0; h < p.heads; ++h) {
            const HeadMap Q = head_matrix(q, b, h, q_copy);  // [Nq, d]
            const HeadMap K = head_matrix(k, b, h, k_copy);  // [Nk, d]
            const HeadMap V = head_matrix(v, b, h, v_copy);  // [Nk, d]

            //! [tiles]
            for (int64_t i0 = 0; i0 < p.seq_q; i0 += Br) {  // outer loop: the Tr query blocks Q_i
                const int64_t rows = std::min(Br, p.seq_q - i0);
                w.Q_i.topRows(rows) = Q.middleRows(i0, rows) * scale;  // the scale, folded in once
                w.m_i.head(rows).setConstant(kNegInf);
                w.l_i.head(rows).setZero();
                w.O_i.topRows(rows).setZero();
                // The block's last row sees the most keys: [0, kv_end). Key blocks starting at or
                // after kv_end lie entirely above the causal diagonal and are never computed.
                const int64_t kv_end = visible_key_end(i0 + rows - 1, p.seq_q, p.seq_k, p.causal);
                for (int64_t j0 = 0; j0 < kv_end; j0 += Bc) {  // inner loop: K_j, V_j stream past
                    const int64_t cols = std::min(Bc, kv_end - j0);
                    auto S_ij = w.S_ij.topLeftCorner(rows, cols);  // [rows, cols]
                    S_ij.noalias() = w.Q_i.topRows(rows) * K.middleRows(j0, cols).transpose();
                    if (tiling.local_softmax) {
                        local_softmax_rows(p, i0, rows, j0, cols, w);
                    } else {
                        online_softmax_rows(p, i0, rows, j0, cols, w);
                    }
                    w.O_i.topRows(rows).noalias() += S_ij * V.middleRows(j0, cols);  // S_ij holds P_ij
                    ++counts.computed;
                    // Masked when even the block's first row cannot see all of its columns.
                    counts.masked += visible_columns(p, i0, j0, cols) < cols;
                }
                write_rows(p, b, h, i0, rows, tiling.local_softmax, w, o, lse);
            }
            //! [tiles]
        }
    }
    counts.skipped = counts.total - counts.computed;
    return counts;
}

double intermediate_bytes(const Problem& p, const Tiling& t) {
    const double Br = double(std::min(t.Br, p.seq_q)), Bc = double(std::min(t.Bc, p.seq_k));
    return 4.0 * (Br * Bc + 2.0 * Br * double(p.head_dim) + 2.0 * Br);
}

}  // namespace fa::stage04
