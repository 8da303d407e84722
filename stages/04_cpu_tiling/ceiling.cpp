// The GEMM ceilings stage 04 is measured against (see measure_gemm_ceiling() in attention.hpp).
#include <algorithm>
#include <sstream>

#include <Eigen/Dense>

#include "attention.hpp"
#include "fa/timing.hpp"

namespace fa::stage04 {

GemmCeiling measure_gemm_ceiling(const Problem& p, const Tiling& tiling, int repeat) {
    using MatrixRM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    GemmCeiling ceiling;
    repeat = std::max(repeat, 1);

    // (1) The machine's GEMM rate: one large square product, the shape GEMM libraries are tuned for.
    constexpr int64_t n = 1024;
    const MatrixRM A = MatrixRM::Random(n, n), B = MatrixRM::Random(n, n);
    MatrixRM C(n, n);
    const TimingStats square = time_host([&] { C.noalias() = A * B; }, 1, repeat);
    ceiling.square_gflops = 2.0 * double(n) * double(n) * double(n) / square.median_ms * 1e-6;

    // (2) The products of stage 04's loop over one head, with nothing between them. Random values:
    // the time of a product does not depend on them.
    const int64_t d = p.head_dim;
    const int64_t Br = std::min(tiling.Br, p.seq_q), Bc = std::min(tiling.Bc, p.seq_k);
    const MatrixRM Q = MatrixRM::Random(p.seq_q, d), K = MatrixRM::Random(p.seq_k, d), V = MatrixRM::Random(p.seq_k, d);
    MatrixRM S(Br, Bc), O(Br, d);
    const TimingStats blocks = time_host(
        [&] {
            for (int64_t i0 = 0; i0 < p.seq_q; i0 += Br) {
                const int64_t rows = std::min(Br, p.seq_q - i0);
                O.setZero();
                for (int64_t j0 = 0; j0 < p.seq_k; j0 += Bc) {
                    const int64_t cols = std::min(Bc, p.seq_k - j0);
                    auto S_ij = S.topLeftCorner(rows, cols);
                    S_ij.noalias() = Q.middleRows(i0, rows) * K.middleRows(j0, cols).transpose();
                    O.topRows(rows).noalias() += S_ij * V.middleRows(j0, cols);
                }
            }
        },
        1, repeat);
    ceiling.blocks_gflops = 4.0 * double(p.seq_q) * double(p.seq_k) * double(d) / blocks.median_ms * 1e-6;
    std::ostringstream shape;
    shape << "[" << Br << " x " << d << "] x [" << d << " x " << Bc << "] then [" << Br << " x " << Bc << "] x [" << Bc
          << " x " << d << "]";
    ceiling.blocks_shape = shape.str();
    return ceiling;
}

}  // namespace fa::stage04
