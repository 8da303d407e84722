#include "attention.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include <Eigen/Dense>

#include "../04_cpu_tiling/attention.hpp"
#include "fa/eigen.hpp"
#include "fa/error.hpp"

namespace fa::stage08 {

namespace {

// A writable [N, d] row-major matrix whose rows lie an outer stride apart: one head of dq.
using HeadMapMut = Eigen::Map<MatrixRM, 0, Eigen::OuterStride<>>;

//! [workspace]
// What one key/value block carries while the query blocks stream past: the only memory the
// backward needs besides its inputs and outputs (and D, one float per query row).
struct Workspace {
    MatrixRM S_ij;   // [Br, Bc] scores S_ij, overwritten in place by P_ij
    MatrixRM dP_ij;  // [Br, Bc] dO_i V_j^T, overwritten in place by scale * dS_ij
    MatrixRM dK_j;   // [Bc, d]  accumulator of scale * sum_i dS_ij^T Q_i
    MatrixRM dV_j;   // [Bc, d]  accumulator of sum_i P_ij^T dO_i

    Workspace(int64_t Br, int64_t Bc, int64_t d) : S_ij(Br, Bc), dP_ij(Br, Bc), dK_j(Bc, d), dV_j(Bc, d) {}
};
//! [workspace]

// How many leading columns of the key block [j0, j0 + cols) query row i may see (causal: a prefix).
int64_t visible_columns(const Problem& p, int64_t i, int64_t j0, int64_t cols) {
    return std::clamp<int64_t>(visible_key_end(i, p.seq_q, p.seq_k, p.causal) - j0, 0, cols);
}

// Head (b, h) of the output `t` as a writable [N, d] matrix: in place when its features are
// contiguous (both layouts), otherwise `scratch`, which scatter_head() copies back at the end.
HeadMapMut output_head(View4<float> t, int64_t b, int64_t h, MatrixRM& scratch) {
    const int64_t N = t.shape[2], d = t.shape[3];
    if (t.stride[3] == 1) return HeadMapMut(t.row(b, h, 0), N, d, Eigen::OuterStride<>(t.stride[2]));
    scratch.resize(N, d);
    return HeadMapMut(scratch.data(), N, d, Eigen::OuterStride<>(d));
}

// Copies `scratch` back into head (b, h) of `t` when output_head() had to use it.
void scatter_head(View4<float> t, int64_t b, int64_t h, const MatrixRM& scratch) {
    if (t.stride[3] == 1) return;
    for (int64_t n = 0; n < t.shape[2]; ++n)
        for (int64_t x = 0; x < t.shape[3]; ++x) t(b, h, n, x) = scratch(n, x);
}

// Writes the finished [cols, d] block `M` into rows [j0, j0 + cols) of head (b, h) of `t`, any
// strides. Once per key block: Bc x d stores against the Tr block products that made them.
void write_block(View4<float> t, int64_t b, int64_t h, int64_t j0, const MatrixRM& M, int64_t cols) {
    for (int64_t r = 0; r < cols; ++r)
        for (int64_t x = 0; x < t.shape[3]; ++x) t(b, h, j0 + r, x) = M(r, x);
}

//! [recompute_p]
// Recomputes P_ij from the scores and the forward's LSE, in place in w.S_ij: for row r,
// P = exp(scale * s - LSE_r), already normalized because the LSE is the log of the row's full
// softmax denominator. No running max, no rescaling: the forward did that work once and kept
// its result in one float per row. Keys the causal mask hides get P = 0, by the mask and not by
// the arithmetic: a row that sees no key at all has LSE = -inf, and exp(s - LSE) would be
// exp(-inf - (-inf)) = NaN. Such a row has visible = 0 in every block, so it computes no
// exponential and its whole row is zeroed. `masked` is false for blocks entirely below the
// diagonal: every row sees every column.
void recompute_probabilities(const Problem& p, View3<const float> lse, int64_t b, int64_t h, int64_t i0, int64_t rows,
                             int64_t j0, int64_t cols, bool masked, float scale, Workspace& w) {
    for (int64_t r = 0; r < rows; ++r) {
        auto s = w.S_ij.row(r).head(cols);  // scores in, probabilities out
        const int64_t visible = masked ? visible_columns(p, i0 + r, j0, cols) : cols;
        const float lse_r = lse(b, h, i0 + r);  // finite whenever visible > 0
        s.head(visible) = (s.head(visible).array() * scale - lse_r).exp().matrix();
        s.tail(cols - visible).setZero();
    }
}
//! [recompute_p]

}  // namespace

void check_tiling(const Tiling& t) {
    // The same limits, and the same messages, as stage 04's blocks.
    stage04::Tiling same;
    same.Br = t.Br;
    same.Bc = t.Bc;
    stage04::check_tiling(same);
}

std::string describe(const Tiling& t, const Problem& p) {
    std::ostringstream out;
    out << "Br=" << t.Br << " Bc=" << t.Bc << " (Tc=" << ceil_div(p.seq_k, std::min(t.Bc, p.seq_k))
        << " key blocks outside, Tr=" << ceil_div(p.seq_q, std::min(t.Br, p.seq_q))
        << " query blocks inside, per head)";
    return out.str();
}

void attention_backward(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v,
                        View4<const float> o, View3<const float> lse, View4<const float> dout, View4<float> dq,
                        View4<float> dk, View4<float> dv) {
    attention_backward_tiled(p, q, k, v, o, lse, dout, dq, dk, dv, Tiling{});
}

BlockCounts attention_backward_tiled(const Problem& p, View4<const float> q, View4<const float> k,
                                     View4<const float> v, View4<const float> o, View3<const float> lse,
                                     View4<const float> dout, View4<float> dq, View4<float> dk, View4<float> dv,
                                     const Tiling& tiling) {
    check_tiling(tiling);
    const float scale = static_cast<float>(p.softmax_scale());
    const int64_t d = p.head_dim;
    const int64_t Br = std::min(tiling.Br, p.seq_q), Bc = std::min(tiling.Bc, p.seq_k);
    const int64_t Tr = ceil_div(p.seq_q, Br), Tc = ceil_div(p.seq_k, Bc);
    Workspace w(Br, Bc, d);
    Eigen::VectorXf D(p.seq_q);  // [Nq] D_i = dO_i . O_i of the current head
    // Used only by views whose feature axis is not contiguous (never by bhnd or bnhd).
    MatrixRM q_copy, k_copy, v_copy, o_copy, do_copy, dq_copy;
    BlockCounts counts;
    counts.total = p.batch * p.heads * Tr * Tc;

    for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t h = 0; h < p.heads; ++h) {
            const HeadMap Q = head_matrix(q, b, h, q_copy);      // [Nq, d]
            const HeadMap K = head_matrix(k, b, h, k_copy);      // [Nk, d]
            const HeadMap V = head_matrix(v, b, h, v_copy);      // [Nk, d]
            const HeadMap O = head_matrix(o, b, h, o_copy);      // [Nq, d]
            const HeadMap dO = head_matrix(dout, b, h, do_copy);  // [Nq, d]
            HeadMapMut dQ = output_head(dq, b, h, dq_copy);      // [Nq, d], accumulated over the K/V blocks
            dQ.setZero();

            //! [d_rows]
            // dS_ij = P_ij o (dP_ij - D_i) needs D_i = sum_j P_ij dP_ij, a sum over the whole row
            // that no single block sees. But sum_j P_ij (dO_i . V_j) = dO_i . sum_j P_ij V_j =
            // dO_i . O_i: the forward's output already holds it, one pass over dO and O away.
            D = (dO.array() * O.array()).rowwise().sum().matrix();
            //! [d_rows]

            //! [tiles]
            for (int64_t j0 = 0; j0 < p.seq_k; j0 += Bc) {  // outer loop: the Tc key/value blocks K_j, V_j
                const int64_t cols = std::min(Bc, p.seq_k - j0);
                const auto K_j = K.middleRows(j0, cols);  // [cols, d]
                const auto V_j = V.middleRows(j0, cols);  // [cols, d]
                auto dK_j = w.dK_j.topRows(cols);
                auto dV_j = w.dV_j.topRows(cols);
                dK_j.setZero();
                dV_j.setZero();
                // The first query row that sees key j0 is j0 - (Nk - Nq) (causal); query blocks
                // that end before it lie entirely above the diagonal and are never computed.
                const int64_t first_row = p.causal ? std::clamp<int64_t>(j0 - (p.seq_k - p.seq_q), 0, p.seq_q) : 0;
                for (int64_t i0 = first_row / Br * Br; i0 < p.seq_q; i0 += Br) {  // inner loop: Q_i, dO_i stream past
                    const int64_t rows = std::min(Br, p.seq_q - i0);
                    const auto Q_i = Q.middleRows(i0, rows);    // [rows, d]
                    const auto dO_i = dO.middleRows(i0, rows);  // [rows, d]
                    auto dQ_i = dQ.middleRows(i0, rows);        // [rows, d]
                    auto P_ij = w.S_ij.topLeftCorner(rows, cols);    // [rows, cols]: S_ij, then P_ij
                    auto dS_ij = w.dP_ij.topLeftCorner(rows, cols);  // [rows, cols]: dP_ij, then scale * dS_ij
                    // Masked when even the block's first row cannot see all of its columns.
                    const bool masked = visible_columns(p, i0, j0, cols) < cols;

                    // S_ij without its scale, which recompute_probabilities() applies with the LSE.
                    P_ij.noalias() = Q_i * K_j.transpose();  // [rows, cols] = [rows, d] x [d, cols]
                    recompute_probabilities(p, lse, b, h, i0, rows, j0, cols, masked, scale, w);
                    dV_j.noalias() += P_ij.transpose() * dO_i;  // [cols, d] += [cols, rows] x [rows, d]
                    dS_ij.noalias() = dO_i * V_j.transpose();   // dP_ij: [rows, cols] = [rows, d] x [d, cols]
                    // dS_ij = P_ij o (dP_ij - D_i), with the scale of S = scale * Q K^T folded in
                    // once here instead of into both products below. Hidden entries have P = 0,
                    // so they get dS = 0 and add nothing to dQ_i or dK_j.
                    dS_ij.array().colwise() -= D.segment(i0, rows).array();
                    dS_ij.array() *= P_ij.array() * scale;
                    dQ_i.noalias() += dS_ij * K_j;              // [rows, d] += [rows, cols] x [cols, d]
                    dK_j.noalias() += dS_ij.transpose() * Q_i;  // [cols, d] += [cols, rows] x [rows, d]
                    ++counts.computed;
                    counts.masked += masked;
                }
                write_block(dk, b, h, j0, w.dK_j, cols);  // dK_j and dV_j are complete: every query
                write_block(dv, b, h, j0, w.dV_j, cols);  // block that sees them has streamed past
            }
            //! [tiles]
            scatter_head(dq, b, h, dq_copy);
        }
    }
    counts.skipped = counts.total - counts.computed;
    return counts;
}

double intermediate_bytes(const Problem& p, const Tiling& t) {
    const double Br = double(std::min(t.Br, p.seq_q)), Bc = double(std::min(t.Bc, p.seq_k));
    return 4.0 * (double(p.seq_q) + 2.0 * Br * Bc + 2.0 * Bc * double(p.head_dim));
}

double naive_backward_bytes(const Problem& p) {
    return 4.0 * 2.0 * double(p.batch) * double(p.heads) * double(p.seq_q) * double(p.seq_k);
}

}  // namespace fa::stage08
