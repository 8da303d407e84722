// Each Hopper wrapper alone on the GPU (tests/hopper_wrapper_kernels.cu): the TMA's box and its
// swizzle against the host map, its zero fill, both layouts through a tensor map's strides, the
// TMA store; an mbarrier's phases; wgmma against a CPU product in each form stage 11 uses. A
// failure names the instruction, and prints what it compared. Exits 77 without a Hopper GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "fa/cuda/device.hpp"
#include "fa/cuda/hopper.hpp"
#include "fa/cuda/wgmma_layout.hpp"
#include "hopper_wrapper_kernels.hpp"

using namespace fa::test::hopper;
namespace wl = fa::cuda::wgmma_layout;

namespace {

// A distinct, nonzero 16-bit word per (row, col): zero fill and misplaced words both show.
uint16_t word(int row, int col) { return uint16_t(0x8000u | uint32_t(row * 64 + col) % 0x7FFFu) | 1u << 14; }

// Compares a box the TMA wrote into shared memory with the host swizzle map, element by element;
// reports the first mismatches with their place in the box and in shared memory.
void check_box(const std::vector<uint16_t>& smem, int box_rows, int cols, const std::function<uint16_t(int, int)>& want,
               const std::string& what) {
    int bad = 0;
    std::ostringstream first;
    for (int r = 0; r < box_rows; ++r)
        for (int c = 0; c < cols; ++c) {
            const uint32_t off = wl::tile_offset(box_rows, r, c) / 2;
            if (smem[off] != want(r, c)) {
                if (bad < 8) {
                    first << "  (" << r << ", " << c << ") at shared word " << off << ": got 0x" << std::hex << smem[off]
                          << ", want 0x" << want(r, c) << std::dec << "\n";
                }
                ++bad;
            }
        }
    INFO(what << ": " << bad << " of " << box_rows * cols << " elements differ; first ones:\n" << first.str());
    CHECK(bad == 0);
}

std::vector<float> small_values(size_t n, int seed) {
    // Multiples of 1/8 in [-1, 1]: exact in bf16 and fp16, and their products' sums exact in float32.
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = float(int((i * 7 + size_t(seed) * 13) % 17) - 8) / 8.0f;
    return x;
}

// Elements of D = A B (A [64, k], B [n, k] or, transposed, [k, n]) that differ from the CPU product.
int count_wrong(const std::vector<float>& d, const std::vector<float>& a, const std::vector<float>& b, int n, int k, bool trans_b) {
    int bad = 0;
    for (int i = 0; i < 64; ++i)
        for (int j = 0; j < n; ++j) {
            double want = 0;
            for (int kk = 0; kk < k; ++kk) want += double(a[size_t(i * k + kk)]) * (trans_b ? b[size_t(kk * n + j)] : b[size_t(j * k + kk)]);
            bad += !(std::fabs(d[size_t(i * n + j)] - want) <= 1e-4 * (1 + std::fabs(want)));
        }
    return bad;
}

void check_product(fa::cuda::DType dtype, int n, int k, bool rs, bool trans_b) {
    const std::vector<float> a = small_values(size_t(64) * k, 1), b = small_values(size_t(n) * k, 2);
    const std::vector<float> d = wgmma_product(dtype, n, k, rs, trans_b, a, b);
    int bad = 0;
    std::ostringstream first;
    for (int i = 0; i < 64; ++i)
        for (int j = 0; j < n; ++j) {
            double want = 0;
            for (int kk = 0; kk < k; ++kk) want += double(a[size_t(i * k + kk)]) * (trans_b ? b[size_t(kk * n + j)] : b[size_t(j * k + kk)]);
            const float got = d[size_t(i * n + j)];
            if (!(std::fabs(got - want) <= 1e-4 * (1 + std::fabs(want)))) {
                if (bad < 8) {
                    // The thread and register that held it, to tell a layout error from an arithmetic one.
                    int thread = -1, reg = -1;
                    for (int t = 0; t < 128 && thread < 0; ++t)
                        for (int r = 0; r < n / 2; ++r)
                            if (wl::accumulator_element(t, r).row == i && wl::accumulator_element(t, r).col == j) thread = t, reg = r;
                    first << "  D(" << i << ", " << j << ") thread " << thread << " register " << reg << ": got " << got
                          << ", want " << want << "\n";
                }
                ++bad;
            }
        }
    INFO("wgmma m64n" << n << "k16 x " << k / 16 << (rs ? " RS (A from registers)" : " SS") << ", B "
                      << (trans_b ? "MN-major [k, n], transposed (as V)" : "K-major [n, k] (as K)") << ", "
                      << fa::cuda::to_string(dtype) << ": " << bad << " of " << 64 * n << " elements differ; first ones:\n"
                      << first.str());
    if (bad > 0) {
        // Diagnostic: the same product with B's LBO and SBO exchanged; if that one is right, the
        // descriptor reads the two offsets the other way round from wgmma_layout's.
        const int swapped = count_wrong(wgmma_product(dtype, n, k, rs, trans_b, a, b, true), a, b, n, k, trans_b);
        MESSAGE("diagnostic: with B's LBO and SBO exchanged, " << swapped << " of " << 64 * n << " elements differ");
    }
    CHECK(bad == 0);
}

}  // namespace

TEST_CASE("TMA: one [64, 64] box lands 128-byte swizzled, as the host map says") {
    const int rows = 200, stride = 64;
    std::vector<uint16_t> m(size_t(rows) * stride);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < 64; ++c) m[size_t(r * stride + c)] = word(r, c);
    const int row0 = 40;
    check_box(tma_load_box(m, rows, stride, row0), 64, 64, [&](int r, int c) { return word(row0 + r, c); },
              "cp.async.bulk.tensor.2d, box at row 40");
}

TEST_CASE("TMA: rows past the end of the tensor are filled with zeros") {
    const int rows = 100, stride = 72;  // a row stride that is not the box width
    std::vector<uint16_t> m(size_t(rows) * stride, 0xFFFF);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < 64; ++c) m[size_t(r * stride + c)] = word(r, c);
    const int row0 = 70;  // rows 70..99 exist, 100..133 do not
    check_box(tma_load_box(m, rows, stride, row0), 64, 64,
              [&](int r, int c) { return row0 + r < rows ? word(row0 + r, c) : uint16_t(0); },
              "cp.async.bulk.tensor.2d, box at row 70 of 100 (34 rows outside)");
}

TEST_CASE("TMA: a (B, H, N, 128) tensor in either layout, read through the tensor map's strides") {
    const int64_t B = 2, H = 3, N = 77, d = 128;
    for (bool bnhd : {false, true}) {
        const int64_t sn = bnhd ? H * d : d, sh = bnhd ? d : N * d, sb = N * H * d;
        std::vector<uint16_t> t(size_t(B * H * N * d));
        const auto value = [](int b, int h, int n, int c) { return uint16_t(1 + ((b * 3 + h) * 131 + n * 17 + c) % 30000); };
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < H; ++h)
                for (int n = 0; n < N; ++n)
                    for (int c = 0; c < d; ++c) t[size_t(b * sb + h * sh + n * sn + c)] = value(b, h, n, c);
        const int b = 1, h = 2, row0 = 64, box_rows = 64;  // rows 64..76 exist: the rest is zero, not the next head
        check_box(tma_load_bhnd(t, B, H, N, sb, sh, sn, b, h, row0, box_rows), box_rows, 128,
                  [&](int r, int c) { return row0 + r < N ? value(b, h, row0 + r, c) : uint16_t(0); },
                  std::string("cp.async.bulk.tensor.4d, layout ") + (bnhd ? "bnhd" : "bhnd") + ", two 64-feature boxes");
    }
}

TEST_CASE("TMA store: a box goes back to global memory, rows past the end not written") {
    const int rows = 100;
    std::vector<uint16_t> m(size_t(rows) * 64), out(size_t(rows) * 64, 0x1234);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < 64; ++c) m[size_t(r * 64 + c)] = word(r, c);
    const int row0 = 10, dst_row0 = 50;  // rows 50..99 written from rows 10..59; 100..113 clipped
    const std::vector<uint16_t> got = tma_store_box(m, out, rows, row0, dst_row0);
    int bad = 0;
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < 64; ++c) {
            const uint16_t want = r >= dst_row0 ? word(r - dst_row0 + row0, c) : uint16_t(0x1234);
            bad += got[size_t(r * 64 + c)] != want;
        }
    INFO("cp.async.bulk.tensor.2d.global.shared::cta (store): " << bad << " words differ");
    CHECK(bad == 0);
}

TEST_CASE("mbarrier: arrivals complete a phase, its parity flips, the next phase waits") {
    const std::vector<int> f = mbarrier_round_trip();
    int bad = 0;
    std::ostringstream first;
    for (int t = 0; t < 64; ++t)
        for (int p = 0; p < 3; ++p) {
            const int* x = &f[size_t((t * 3 + p) * 4)];
            if (x[0] != 0 || x[1] != 1 || x[2] != 0 || x[3] != 1) {
                if (bad++ < 8)
                    first << "  thread " << t << " phase " << p << ": before arrive " << x[0] << " (want 0), after wait "
                          << x[1] << " (1), next parity " << x[2] << " (0), returned " << x[3] << " (1)\n";
            }
        }
    INFO("mbarrier.try_wait.parity: " << bad << " bad (thread, phase) pairs:\n" << first.str());
    CHECK(bad == 0);
}

TEST_CASE("quad_transpose: lane t of each quad ends with column t of the quad's 4 x 4 words") {
    std::vector<uint32_t> in(128);
    uint32_t x = 0x9e3779b9u;
    for (uint32_t& w : in) w = (x = x * 1664525u + 1013904223u);  // distinct words, none zero in practice
    const std::vector<uint32_t> out = quad_transpose_words(in);
    int bad = 0;
    for (int lane = 0; lane < 32; ++lane)
        for (int j = 0; j < 4; ++j) {
            // Lane 4q + t now holds word t of lane 4q + j at position j.
            const int quad = lane / 4, t = lane % 4;
            bad += out[size_t(4 * lane + j)] != in[size_t(4 * (4 * quad + j) + t)];
        }
    INFO(bad << " of 128 words misplaced");
    CHECK(bad == 0);
}

TEST_CASE("setmaxnreg, named barriers and elect.sync: one producer and two consumer warpgroups") {
    const std::vector<int> codes = warp_specialization_round_trip();
    const char* meaning[] = {"never got there", "ok", "bar.sync 2 saw no value from bar.arrive", "bar.sync 1 exchange wrong",
                             "not one elect.sync winner"};
    int bad = 0;
    std::ostringstream first;
    for (int t = 0; t < 384; ++t) {
        if (codes[size_t(t)] != 1 && bad++ < 8) {
            const int c = codes[size_t(t)];
            first << "  thread " << t << " (warpgroup " << t / 128 << "): " << (c >= 0 && c <= 4 ? meaning[c] : "?") << "\n";
        }
    }
    INFO("setmaxnreg.dec 24 / .inc 240, bar.arrive / bar.sync, elect.sync: " << bad << " threads off:\n" << first.str());
    CHECK(bad == 0);
}

TEST_CASE("wgmma SS m64n64k16: one instruction, then the k-slices of one 64-wide swizzled atom") {
    for (auto dtype : {fa::cuda::DType::BF16, fa::cuda::DType::FP16}) {
        check_product(dtype, 64, 16, false, false);
        check_product(dtype, 64, 64, false, false);
    }
}

TEST_CASE("wgmma SS across two 64-column boxes (d = 128) and with N = 128") {
    for (auto dtype : {fa::cuda::DType::BF16, fa::cuda::DType::FP16}) {
        check_product(dtype, 64, 128, false, false);
        check_product(dtype, 128, 128, false, false);
    }
}

TEST_CASE("wgmma RS: A from registers in the accumulator-shaped layout") {
    for (auto dtype : {fa::cuda::DType::BF16, fa::cuda::DType::FP16}) {
        check_product(dtype, 64, 16, true, false);
        check_product(dtype, 64, 128, true, false);
    }
}

TEST_CASE("wgmma with B transposed: V stored [keys, d] (MN-major), n = 64 and 128 (two boxes, LBO)") {
    for (auto dtype : {fa::cuda::DType::BF16, fa::cuda::DType::FP16}) {
        check_product(dtype, 64, 16, false, true);
        check_product(dtype, 64, 64, false, true);
        check_product(dtype, 128, 64, false, true);
        check_product(dtype, 64, 128, true, true);   // O += P V as stage 11 issues it: RS, V transposed
        check_product(dtype, 128, 128, true, true);
    }
}
