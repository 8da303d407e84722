// Each Hopper wrapper alone on the warp emulator (tools/warp_emulator: fa/cuda/{tma,mbarrier,
// wgmma,warpgroup}.cuh there, async_units.hpp), as tests/test_hopper_wrappers.cpp checks the real
// ones on the GPU: the TMA's box and its swizzle against the host map (fa/cuda/wgmma_layout.hpp),
// its zero fill, both layouts through the tensor map's strides (fa::cuda::make_tensor_map_bhnd,
// the host code the stage runs, on the emulated driver), the TMA store and the float32 bulk
// reductions; an mbarrier's phases and transaction bytes; named barriers, setmaxnreg and
// elect.sync; wgmma in each form against the float32 product. Then what the emulator keeps of the
// hardware's asynchrony (operands read at the wait, loads landing late, stores reading their source
// at wait_group.read), and that a wait nothing can end stops it with a message naming the wait.
// No GPU is needed: this runs in CI.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "emulator.hpp"
#include "fa/cuda/fragments.cuh"
#include "fa/cuda/mbarrier.cuh"
#include "fa/cuda/tensor_map.hpp"
#include "fa/cuda/tma.cuh"
#include "fa/cuda/warpgroup.cuh"
#include "fa/cuda/wgmma.cuh"
#include "fa/cuda/wgmma_layout.hpp"

namespace {

using namespace fa::cuda::ptx;
namespace wl = fa::cuda::wgmma_layout;

alignas(128) unsigned char smem[232448];  // the blocks' shared memory

// A distinct, nonzero 16-bit word per (row, col): zero fill and misplaced words both show.
uint16_t word(int row, int col) { return uint16_t(0x8000u | uint32_t(row * 64 + col) % 0x7FFFu) | 1u << 14; }

// One thread loads `boxes` boxes of `box_bytes` each onto one mbarrier (box i at column 64 i, then
// the other coordinates); every thread waits for the phase; returns the boxes' shared memory.
std::vector<uint16_t> tma_load_boxes(const CUtensorMap& map, int rank, int boxes, int box_bytes, int c1, int c2 = 0, int c3 = 0) {
    std::vector<uint16_t> out(size_t(boxes * box_bytes / 2));
    const uint32_t bar = 64, tile = 1024;
    emu::launch(1, 128, smem, size_t(tile + boxes * box_bytes), [&] {
        if (threadIdx.x == 0) {
            mbarrier_init(bar, 1);
            fence_mbarrier_init();
        }
        __syncthreads();  // the barrier is initialized before anyone waits on it
        if (threadIdx.x == 0) {
            mbarrier_arrive_expect_tx(bar, uint32_t(boxes * box_bytes));
            for (int i = 0; i < boxes; ++i) {
                const uint32_t dst = tile + uint32_t(i * box_bytes);
                if (rank == 2) tma_load_2d(dst, &map, bar, 64 * i, c1);
                else tma_load_4d(dst, &map, bar, 64 * i, c1, c2, c3);
            }
        }
        mbarrier_wait_parity(bar, 0);  // phase 0 completes when every byte has landed
        for (size_t i = threadIdx.x; i < out.size(); i += 128) std::memcpy(&out[i], smem + tile + 2 * i, 2);
    });
    return out;
}

// Compares a box in shared memory with the host swizzle map, element by element.
void check_box(const std::vector<uint16_t>& got, int box_rows, int cols, const std::function<uint16_t(int, int)>& want,
               const std::string& what) {
    int bad = 0;
    std::ostringstream first;
    for (int r = 0; r < box_rows; ++r)
        for (int c = 0; c < cols; ++c) {
            const uint32_t off = wl::tile_offset(box_rows, r, c) / 2;
            if (got[off] != want(r, c)) {
                if (bad++ < 8) {
                    first << "  (" << r << ", " << c << ") at word " << off << ": got 0x" << std::hex << got[off] << ", want 0x"
                          << want(r, c) << std::dec << "\n";
                }
            }
        }
    INFO(what << ": " << bad << " of " << box_rows * cols << " elements differ; first ones:\n" << first.str());
    CHECK(bad == 0);
}

// Random multiples of 1/64 in [-2, 2], exact in bf16 and fp16 (seeded).
std::vector<float> random_values(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<float> x(n);
    for (float& v : x) v = float(int(rng() % 257) - 128) / 64.0f;
    return x;
}

template <class T>
uint16_t bits(float x) {
    return emu::to_bits<T>(x);
}

// D (64 x n) = A (64 x k) B on one warpgroup, as tests/hopper_wrapper_kernels.cu's wgmma_kernel
// does on the GPU: the tiles stored by plain stores at the host map's swizzled offsets, A from
// shared memory (SS) or from registers placed by the host's A map (RS), D read back through the
// host's accumulator map. `b` is [n, k] (K-major) or, with trans_b, [k, n] (MN-major).
// `swap_b_offsets`: B's descriptor with LBO and SBO exchanged.
template <class T, int N>
std::vector<float> wgmma_product(int k, bool rs, bool trans_b, const std::vector<float>& a, const std::vector<float>& b,
                                 bool swap_b_offsets = false) {
    std::vector<float> d_out(size_t(64) * N, -1.0f);
    const uint32_t a_tile = 1024, b_tile = a_tile + 64 * 128 * 2;  // [64, k] and B, k / 64 (or n / 64) boxes each
    emu::launch(1, 128, smem, b_tile + 128 * 128 * 2, [&] {
        const int tid = int(threadIdx.x);
        for (int i = tid; i < 64 * k; i += 128) {
            const uint16_t h = bits<T>(a[size_t(i)]);
            std::memcpy(smem + a_tile + wl::tile_offset(64, i / k, i % k), &h, 2);
        }
        const int b_rows = trans_b ? k : N, b_cols = trans_b ? N : k;
        for (int i = tid; i < b_rows * b_cols; i += 128) {
            const uint16_t h = bits<T>(b[size_t(i)]);
            std::memcpy(smem + b_tile + wl::tile_offset(b_rows, i / b_cols, i % b_cols), &h, 2);
        }
        fence_proxy_async();  // the plain stores are visible to the wgmma
        __syncthreads();      // ... every thread's
        float d[N / 2];
        for (float& x : d) x = 0.0f;
        uint32_t a_regs[8][4];
        if (rs) {
            for (int ks = 0; ks < k / 16; ++ks)
                for (int reg = 0; reg < 4; ++reg) {
                    const wl::Element e = wl::a_operand_element(tid, reg, 0);
                    a_regs[ks][reg] = pack2<T>(a[size_t(e.row * k + 16 * ks + e.col)], a[size_t(e.row * k + 16 * ks + e.col + 1)]);
                }
        }
        wgmma_fence();  // the accumulators and A registers above are ready for wgmma
        for (int ks = 0; ks < k / 16; ++ks) {
            uint64_t desc_b = trans_b ? wl::mn_major_descriptor(b_tile, k, ks) : wl::k_major_descriptor(b_tile, N, ks);
            if (swap_b_offsets) {
                const wl::Descriptor f = wl::decode_descriptor(desc_b);
                desc_b = wl::encode_descriptor(f.start_address, f.stride_byte_offset, f.leading_byte_offset, f.swizzle);
            }
            if (rs) wgmma_m64nNk16_rs<N, T>(d, a_regs[ks], desc_b, ks > 0, trans_b);
            else wgmma_m64nNk16_ss<N, T>(d, wl::k_major_descriptor(a_tile, 64, ks), desc_b, ks > 0, trans_b);
        }
        wgmma_commit_group();
        wgmma_wait_group<0>();  // the product is in the accumulators
        warpgroup_fence_operands(d);
        for (int i = 0; i < N / 2; ++i) {
            const wl::Element e = wl::accumulator_element(tid, i);
            d_out[size_t(e.row * N + e.col)] = d[i];
        }
    });
    return d_out;
}

// The float32 product the emulator promises: the 16-bit values widened, summed k in order by fmaf.
std::vector<float> float32_product(int n, int k, bool trans_b, const std::vector<float>& a, const std::vector<float>& b) {
    std::vector<float> d(size_t(64) * n);
    for (int i = 0; i < 64; ++i)
        for (int j = 0; j < n; ++j) {
            float s = 0.0f;
            for (int kk = 0; kk < k; ++kk) {
                s = std::fma(a[size_t(i * k + kk)], trans_b ? b[size_t(kk * n + j)] : b[size_t(j * k + kk)], s);
            }
            d[size_t(i * n + j)] = s;
        }
    return d;
}

template <class T>
std::vector<float> rounded(std::vector<float> x) {
    for (float& v : x) v = emu::to_f<T>(bits<T>(v));
    return x;
}

template <class T, int N>
void check_product(int k, bool rs, bool trans_b, unsigned seed) {
    const std::vector<float> a = rounded<T>(random_values(size_t(64) * k, seed));
    const std::vector<float> b = rounded<T>(random_values(size_t(N) * k, seed + 1));
    const std::vector<float> got = wgmma_product<T, N>(k, rs, trans_b, a, b), want = float32_product(N, k, trans_b, a, b);
    int bad = 0;
    std::ostringstream first;
    for (int i = 0; i < 64 * N; ++i) {
        if (got[size_t(i)] != want[size_t(i)] && bad++ < 8) {
            first << "  D(" << i / N << ", " << i % N << "): got " << got[size_t(i)] << ", want " << want[size_t(i)] << "\n";
        }
    }
    INFO("wgmma m64n" << N << "k16 x " << k / 16 << (rs ? " RS" : " SS") << (trans_b ? ", B MN-major" : ", B K-major") << ", "
                      << (std::is_same_v<T, __half> ? "fp16" : "bf16") << ": " << bad << " of " << 64 * N << " differ\n"
                      << first.str());
    CHECK(bad == 0);
}

// Runs `fn` in a child process; returns what it wrote to stderr, and whether it stopped by abort().
struct Death {
    bool aborted;
    std::string message;
};
Death run_to_death(const std::function<void()>& fn) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        std::signal(SIGABRT, SIG_DFL);  // not doctest's handler: the parent reads how the child ended
        fn();
        _exit(0);
    }
    close(fds[1]);
    std::string text;
    char buf[512];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
    close(fds[0]);
    int status = 0;
    waitpid(child, &status, 0);
    return {WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, text};
}

void check_dies_with(const std::function<void()>& fn, const std::string& expected) {
    const Death d = run_to_death(fn);
    INFO("stderr: " << d.message);
    CHECK(d.aborted);
    CHECK(d.message.find(expected) != std::string::npos);
}

}  // namespace

TEST_CASE("emulated TMA: one [64, 64] box lands 128-byte swizzled, as the host map says") {
    const int rows = 200, stride = 64;
    std::vector<uint16_t> m(size_t(rows) * stride);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < 64; ++c) m[size_t(r * stride + c)] = word(r, c);
    CUtensorMap map;
    fa::cuda::make_tensor_map_2d(map, m.data(), fa::cuda::DType::BF16, rows, 64, stride, 64, 64, true, "test matrix");
    const int row0 = 40;
    check_box(tma_load_boxes(map, 2, 1, 64 * 128, row0), 64, 64, [&](int r, int c) { return word(row0 + r, c); },
              "cp.async.bulk.tensor.2d, box at row 40");
}

TEST_CASE("emulated TMA: rows past the end of the tensor are filled with zeros, and their bytes counted") {
    const int rows = 100, stride = 72;  // a row stride that is not the box width
    std::vector<uint16_t> m(size_t(rows) * stride, 0xFFFF);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < 64; ++c) m[size_t(r * stride + c)] = word(r, c);
    CUtensorMap map;
    fa::cuda::make_tensor_map_2d(map, m.data(), fa::cuda::DType::BF16, rows, 64, stride, 64, 64, true, "test matrix");
    for (int row0 : {70, -10}) {  // rows 100..133, and -10..-1, lie outside
        check_box(tma_load_boxes(map, 2, 1, 64 * 128, row0), 64, 64,
                  [&](int r, int c) { return row0 + r >= 0 && row0 + r < rows ? word(row0 + r, c) : uint16_t(0); },
                  "cp.async.bulk.tensor.2d, box at row " + std::to_string(row0) + " of 100");
    }
}

TEST_CASE("emulated TMA: a (B, H, N, 128) tensor in either layout, read through the tensor map's strides") {
    const int64_t B = 2, H = 3, N = 77, d = 128;
    for (bool bnhd : {false, true}) {
        const int64_t sn = bnhd ? H * d : d, sh = bnhd ? d : N * d, sb = N * H * d;
        std::vector<uint16_t> t(size_t(B * H * N * d));
        const auto value = [](int b, int h, int n, int c) { return uint16_t(1 + ((b * 3 + h) * 131 + n * 17 + c) % 30000); };
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < H; ++h)
                for (int n = 0; n < N; ++n)
                    for (int c = 0; c < d; ++c) t[size_t(b * sb + h * sh + n * sn + c)] = value(b, h, n, c);
        CUtensorMap map;
        const int b = 1, h = 2, row0 = 64, box_rows = 64;  // rows 64..76 exist: the rest is zero, not the next head
        fa::cuda::make_tensor_map_bhnd(map, t.data(), fa::cuda::DType::BF16, B, H, N, d, sb, sh, sn, box_rows, "test tensor");
        check_box(tma_load_boxes(map, 4, 2, box_rows * 128, row0, h, b), box_rows, 128,
                  [&](int r, int c) { return row0 + r < N ? value(b, h, row0 + r, c) : uint16_t(0); },
                  std::string("cp.async.bulk.tensor.4d, layout ") + (bnhd ? "bnhd" : "bhnd") + ", two 64-feature boxes");
    }
}

TEST_CASE("emulated TMA: maps the driver would refuse are refused, by the host code's checks or the emulated driver") {
    std::vector<uint16_t> m(64 * 72);
    CUtensorMap map;
    CHECK_THROWS(fa::cuda::make_tensor_map_2d(map, m.data() + 1, fa::cuda::DType::BF16, 64, 64, 72, 64, 64, true, "misaligned"));
    CHECK_THROWS(fa::cuda::make_tensor_map_2d(map, m.data(), fa::cuda::DType::BF16, 64, 64, 68, 64, 64, true, "stride of 136 B"));
    const cuuint64_t dims[2] = {64, 64}, strides[1] = {144};
    const cuuint32_t box[2] = {72, 64}, ones[2] = {1, 1};  // a swizzled row of 144 bytes
    CHECK(cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, m.data(), dims, strides, box, ones,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("emulated TMA store: a box goes back to global memory, rows past the end not written") {
    const int rows = 100;
    std::vector<uint16_t> m(size_t(rows) * 64), out(size_t(rows) * 64, 0x1234);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < 64; ++c) m[size_t(r * 64 + c)] = word(r, c);
    CUtensorMap in_map, out_map;
    fa::cuda::make_tensor_map_2d(in_map, m.data(), fa::cuda::DType::BF16, rows, 64, 64, 64, 64, true, "store source");
    fa::cuda::make_tensor_map_2d(out_map, out.data(), fa::cuda::DType::BF16, rows, 64, 64, 64, 64, true, "store target");
    const int row0 = 10, dst_row0 = 50;  // rows 50..99 written from rows 10..59; 100..113 clipped
    const uint32_t bar = 64, tile = 1024;
    emu::launch(1, 32, smem, tile + 64 * 128, [&] {
        if (threadIdx.x == 0) {
            mbarrier_init(bar, 1);
            fence_mbarrier_init();
            mbarrier_arrive_expect_tx(bar, 64 * 128);
            tma_load_2d(tile, &in_map, bar, 0, row0);
            mbarrier_wait_parity(bar, 0);  // the box is in shared memory
            fence_proxy_async();
            tma_store_2d(&out_map, tile, 0, dst_row0);
            bulk_commit_group();
            bulk_wait_group<0>();  // the writes are done
        }
    });
    int bad = 0;
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < 64; ++c) {
            bad += out[size_t(r * 64 + c)] != (r >= dst_row0 ? word(r - dst_row0 + row0, c) : uint16_t(0x1234));
        }
    INFO("cp.async.bulk.tensor.2d.global.shared::cta (store): " << bad << " words differ");
    CHECK(bad == 0);
}

TEST_CASE("emulated TMA reductions: global += shared in float32, a box (2d and 4d, clipped at the end) and a plain run") {
    // A [100, 32] float32 matrix; box [64, 32] (128-byte rows, 128-byte swizzle) at row 70: rows 70..99 added.
    const int rows = 100, cols = 32;
    std::vector<float> g(size_t(rows) * cols + 16);
    for (size_t i = 0; i < g.size(); ++i) g[i] = float(i % 97) * 0.5f;
    const std::vector<float> before = g;
    CUtensorMap map2, map4;
    const cuuint64_t dims2[2] = {cols, rows}, strides2[1] = {cols * 4};
    const cuuint32_t box2[2] = {cols, 64}, ones[4] = {1, 1, 1, 1};
    REQUIRE(cuTensorMapEncodeTiled(&map2, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, g.data(), dims2, strides2, box2, ones,
                                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS);
    // The same memory as (B = 1, H = 2, N = 50, 32): box [1, 1, 64, 32] of head 1 at row 20 (rows 70..99 again).
    const cuuint64_t dims4[4] = {cols, 50, 2, 1}, strides4[3] = {cols * 4, 50 * cols * 4, 100 * cols * 4};
    const cuuint32_t box4[4] = {cols, 64, 1, 1};
    REQUIRE(cuTensorMapEncodeTiled(&map4, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, g.data(), dims4, strides4, box4, ones,
                                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS);
    std::vector<float> plain(64, 1.0f);
    const uint32_t tile = 1024, run = tile + 64 * 128;
    const auto box_value = [](int r, int c) { return float(r * 32 + c) / 16.0f; };
    emu::launch(1, 32, smem, run + 256, [&] {
        if (threadIdx.x != 0) return;
        for (int r = 0; r < 64; ++r)
            for (int c = 0; c < cols; ++c) {
                const float x = box_value(r, c);
                std::memcpy(smem + tile + wl::swizzle128_address(uint32_t(r * 128 + c * 4)), &x, 4);
            }
        for (int i = 0; i < 64; ++i) {
            const float x = float(i) - 10.0f;
            std::memcpy(smem + run + 4 * i, &x, 4);
        }
        fence_proxy_async();  // the plain stores are visible to the bulk copies
        tma_reduce_add_2d(&map2, tile, 0, 70);
        tma_reduce_add_4d(&map4, tile, 0, 20, 1, 0);
        bulk_reduce_add_f32(plain.data(), run, 256);
        bulk_commit_group();
        bulk_wait_group<0>();
    });
    int bad = 0;
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
            const size_t i = size_t(r * cols + c);
            bad += g[i] != (r >= 70 ? before[i] + 2.0f * box_value(r - 70, c) : before[i]);
        }
    for (size_t i = size_t(rows) * cols; i < g.size(); ++i) bad += g[i] != before[i];  // nothing past the end
    for (int i = 0; i < 64; ++i) bad += plain[size_t(i)] != 1.0f + float(i) - 10.0f;
    CHECK(bad == 0);
}

TEST_CASE("emulated mbarrier: arrivals complete a phase, its parity flips, the next phase waits") {
    // tests/hopper_wrapper_kernels.cu's mbarrier_kernel: 64 threads, three phases.
    std::vector<int> f(64 * 3 * 4, 0x7F);
    const uint32_t bar = 0;
    emu::launch(1, 64, smem, 64, [&] {
        if (threadIdx.x == 0) {
            mbarrier_init(bar, blockDim.x);
            fence_mbarrier_init();
        }
        __syncthreads();  // initialized before use
        for (int p = 0; p < 3; ++p) {
            int* x = &f[size_t((threadIdx.x * 3 + unsigned(p)) * 4)];
            x[0] = mbarrier_try_wait_parity(bar, uint32_t(p % 2));  // cannot be complete: this thread has not arrived
            mbarrier_arrive(bar);
            mbarrier_wait_parity(bar, uint32_t(p % 2));
            x[1] = mbarrier_try_wait_parity(bar, uint32_t(p % 2));
            x[2] = mbarrier_try_wait_parity(bar, uint32_t((p + 1) % 2));  // the next phase lacks this thread
            x[3] = 1;
        }
    });
    int bad = 0;
    for (int t = 0; t < 64 * 3; ++t) {
        const int* x = &f[size_t(4 * t)];
        bad += x[0] != 0 || x[1] != 1 || x[2] != 0 || x[3] != 1;
    }
    INFO(bad << " bad (thread, phase) pairs");
    CHECK(bad == 0);
}

TEST_CASE("emulated mbarrier: a phase needs its arrivals and its transaction bytes; a load lands after its issue") {
    std::vector<uint16_t> m(64 * 64);
    for (int i = 0; i < 64 * 64; ++i) m[size_t(i)] = word(i / 64, i % 64);
    CUtensorMap map;
    fa::cuda::make_tensor_map_2d(map, m.data(), fa::cuda::DType::BF16, 64, 64, 64, 64, 64, true, "matrix");
    const uint32_t bar = 0, tile = 1024;
    int before_bytes = -1, before_second = -1, after = -1;
    uint16_t early = 0, late = 0;
    emu::launch(1, 64, smem, tile + 64 * 128, [&] {
        if (threadIdx.x == 0) mbarrier_init(bar, 2);  // two arrivals, and the bytes the first announces
        __syncthreads();
        if (threadIdx.x == 0) {
            mbarrier_arrive_expect_tx(bar, 64 * 128);
            tma_load_2d(tile, &map, bar, 0, 0);
            std::memcpy(&early, smem + tile, 2);  // issued, not landed: the block's garbage
        }
        __syncthreads();
        if (threadIdx.x == 32) {
            before_second = mbarrier_try_wait_parity(bar, 0);  // times out: the load lands, one arrival is missing
            mbarrier_arrive(bar);
            after = mbarrier_try_wait_parity(bar, 0);
            std::memcpy(&late, smem + tile, 2);
        }
    });
    emu::launch(1, 32, smem, tile + 64 * 128, [&] {
        if (threadIdx.x != 0) return;
        mbarrier_init(bar, 1);
        mbarrier_arrive_expect_tx(bar, 64 * 128);  // the arrival is in; the bytes are not
        before_bytes = mbarrier_try_wait_parity(bar, 0);
        tma_load_2d(tile, &map, bar, 0, 0);
        mbarrier_wait_parity(bar, 0);
    });
    CHECK(early == 0xABAB);
    CHECK(before_second == 0);
    CHECK(after == 1);
    CHECK(late == word(0, 0));
    CHECK(before_bytes == 0);
}

TEST_CASE("emulated quad_transpose: lane t of each quad ends with column t of the quad's 4 x 4 words") {
    std::vector<uint32_t> in(128), out(128);
    uint32_t x = 0x9e3779b9u;
    for (uint32_t& w : in) w = (x = x * 1664525u + 1013904223u);
    emu::launch(1, 32, smem, 0, [&] {
        const int lane = int(threadIdx.x);
        uint32_t v[4];
        for (int j = 0; j < 4; ++j) v[j] = in[size_t(4 * lane + j)];
        fa::cuda::quad_transpose(v, lane % 4);
        for (int j = 0; j < 4; ++j) out[size_t(4 * lane + j)] = v[j];
    });
    int bad = 0;
    for (int lane = 0; lane < 32; ++lane)
        for (int j = 0; j < 4; ++j) bad += out[size_t(4 * lane + j)] != in[size_t(4 * (4 * (lane / 4) + j) + lane % 4)];
    CHECK(bad == 0);
}

TEST_CASE("emulated setmaxnreg, named barriers and elect.sync: one producer and two consumer warpgroups") {
    // tests/hopper_wrapper_kernels.cu's warp_specialization_kernel, in shared memory of its own.
    std::vector<int> codes(384, 0);
    emu::launch(1, 384, smem, 2048, [&] {
        int& token = *reinterpret_cast<int*>(smem);
        int* exchange = reinterpret_cast<int*>(smem + 1024);
        const int tid = int(threadIdx.x), group = warpgroup_index();
        const unsigned elected = __ballot_sync(0xffffffffu, elect_one_sync());
        int code = __popc(elected) == 1 ? 1 : 4;
        if (group == 0) {
            setmaxnreg_dec<24>();
            if (tid < 32) {
                if (tid == 0) token = 42;
                named_barrier_arrive(2, 160);  // warp 0's write of `token` is ordered before warpgroup 1 reads it
            }
        } else {
            setmaxnreg_inc<240>();
            if (group == 1) {
                named_barrier_sync(2, 160);  // 32 arriving (warp 0) + 128 waiting (warpgroup 1)
                if (token != 42 && code == 1) code = 2;
            }
            exchange[tid - 128] = tid * 3;
            named_barrier_sync(1, 256);  // every consumer's write is ordered before the reads below
            const int other = tid % 256;
            if (exchange[other] != (other + 128) * 3 && code == 1) code = 3;
        }
        codes[size_t(tid)] = code;
    });
    int bad = 0;
    for (int c : codes) bad += c != 1;
    CHECK(bad == 0);
}

TEST_CASE("emulated wgmma: each operand address is where the host map put the element") {
    // The emulator decodes descriptors by the PTX ISA's canonical layouts; the stage builds them
    // with wgmma_layout's k_major_descriptor and mn_major_descriptor and stores tiles by tile_offset.
    const uint32_t tile = 3 * 1024;
    for (int rows : {64, 128})
        for (int k16 = 0; k16 < 8; ++k16) {  // d = 128: K-major slices 0-3 in box 0, 4-7 in box 1
            int bad = 0;
            for (int mn = 0; mn < rows; ++mn)
                for (int k = 0; k < 16; ++k)
                    bad += emu::hopper::operand_address(wl::k_major_descriptor(tile, rows, k16), false, mn, k) !=
                           tile + wl::tile_offset(rows, mn, 16 * k16 + k);
            for (int n = 0; n < 128; ++n)  // V [rows, 128] read transposed: k16 picks 16 keys
                for (int k = 0; k < 16; ++k)
                    bad += emu::hopper::operand_address(wl::mn_major_descriptor(tile, rows, k16 % (rows / 16)), true, n, k) !=
                           tile + wl::tile_offset(rows, 16 * (k16 % (rows / 16)) + k, n);
            INFO("rows " << rows << " k16 " << k16);
            CHECK(bad == 0);
        }
    for (uint32_t a = 0; a < 8192; a += 2) CHECK(emu::hopper::swizzle_address(a, 128) == wl::swizzle128_address(a));
}

TEST_CASE("emulated wgmma SS m64n64k16: one instruction, then the k-slices of one 64-wide swizzled atom") {
    check_product<__nv_bfloat16, 64>(16, false, false, 1);
    check_product<__half, 64>(64, false, false, 3);
}

TEST_CASE("emulated wgmma SS across two 64-column boxes (d = 128) and with N = 128, 256") {
    check_product<__nv_bfloat16, 64>(128, false, false, 5);
    check_product<__half, 128>(128, false, false, 7);
    check_product<__nv_bfloat16, 256>(32, false, false, 9);
}

TEST_CASE("emulated wgmma RS: A from registers in the accumulator-shaped layout") {
    check_product<__nv_bfloat16, 64>(16, true, false, 11);
    check_product<__half, 64>(128, true, false, 13);
}

TEST_CASE("emulated wgmma with B transposed: V stored [keys, d] (MN-major), n = 64 and 128 (two boxes, LBO)") {
    check_product<__half, 64>(16, false, true, 15);
    check_product<__nv_bfloat16, 64>(64, false, true, 17);
    check_product<__half, 128>(64, false, true, 19);
    check_product<__nv_bfloat16, 64>(128, true, true, 21);  // O += P V as stage 11 issues it: RS, V transposed
    check_product<__half, 128>(128, true, true, 23);
    // B's LBO and SBO exchanged: at n = 128 both matter, and the product must be wrong.
    const std::vector<float> a = rounded<__half>(random_values(64 * 64, 25)), b = rounded<__half>(random_values(128 * 64, 26));
    CHECK(wgmma_product<__half, 128>(64, true, true, a, b, true) != float32_product(128, 64, true, a, b));
}

TEST_CASE("emulated wgmma is asynchronous: operands are read, accumulators written, at wgmma.wait_group") {
    // On the GPU both are undefined between the issue and the wait; here they show as a product of
    // what was there at the wait, and accumulators that still hold what they held.
    const std::vector<float> a = random_values(64 * 16, 31), b = random_values(64 * 16, 32), b2 = random_values(64 * 16, 33);
    std::vector<float> got(64 * 64), before(128);
    const uint32_t a_tile = 1024, b_tile = a_tile + 64 * 128;
    emu::launch(1, 128, smem, b_tile + 64 * 128, [&] {
        const int tid = int(threadIdx.x);
        const auto store = [&](uint32_t tile, const std::vector<float>& x) {
            for (int i = tid; i < 64 * 16; i += 128) {
                const uint16_t h = bits<__nv_bfloat16>(x[size_t(i)]);
                std::memcpy(smem + tile + wl::tile_offset(64, i / 16, i % 16), &h, 2);
            }
        };
        store(a_tile, a), store(b_tile, b);
        __syncthreads();
        float d[32];
        for (float& x : d) x = 7.0f;
        wgmma_fence();
        wgmma_m64nNk16_ss<64, __nv_bfloat16>(d, wl::k_major_descriptor(a_tile, 64, 0), wl::k_major_descriptor(b_tile, 64, 0), false,
                                             false);
        wgmma_commit_group();
        before[size_t(tid)] = d[0];  // not yet written
        store(b_tile, b2);           // B overwritten before the wait
        __syncthreads();
        wgmma_wait_group<0>();
        for (int i = 0; i < 32; ++i) {
            const wl::Element e = wl::accumulator_element(tid, i);
            got[size_t(e.row * 64 + e.col)] = d[i];
        }
    });
    for (float x : before) CHECK(x == 7.0f);
    CHECK(got == float32_product(64, 16, false, rounded<__nv_bfloat16>(a), rounded<__nv_bfloat16>(b2)));
}

TEST_CASE("emulated bulk store: the source is read at wait_group.read, global memory written at wait_group") {
    std::vector<uint16_t> out(64 * 64, 0x1234);
    CUtensorMap map;
    fa::cuda::make_tensor_map_2d(map, out.data(), fa::cuda::DType::BF16, 64, 64, 64, 64, 64, true, "store target");
    int written_at_read = -1;
    const uint32_t tile = 1024;
    emu::launch(1, 32, smem, tile + 64 * 128, [&] {
        if (threadIdx.x != 0) return;
        const auto fill = [&](uint16_t w) {
            for (int i = 0; i < 64 * 64; ++i) std::memcpy(smem + tile + 2 * i, &w, 2);
        };
        fill(0x1111);
        fence_proxy_async();
        tma_store_2d(&map, tile, 0, 0);
        bulk_commit_group();
        fill(0x2222);  // too early on the GPU: the store may not have read its source
        bulk_wait_group_read<0>();
        written_at_read = out[0] != 0x1234;
        fill(0x3333);  // allowed now
        bulk_wait_group<0>();
    });
    CHECK(written_at_read == 0);
    int bad = 0;
    for (uint16_t w : out) bad += w != 0x2222;
    CHECK(bad == 0);
}

TEST_CASE("emulated waits that nothing can end stop the emulator with a message naming them") {
    const uint32_t bar = 8;
    check_dies_with([&] {
        emu::launch(1, 64, smem, 64, [&] {
            if (threadIdx.x == 0) mbarrier_init(bar, 2);
            __syncthreads();
            if (threadIdx.x == 0) mbarrier_arrive(bar);  // one of two
            mbarrier_wait_parity(bar, 0);
        });
    }, "64 at mbarrier.try_wait.parity 0 at shared 0x8: its phase 0 (parity 0) lacks 1 of 2 arrivals and 0 transaction bytes");
    check_dies_with([&] {
        emu::launch(1, 128, smem, 64, [&] {
            if (threadIdx.x < 96) named_barrier_sync(3, 128);  // warp 3 never comes
        });
    }, "96 at bar.sync 3, 128: 96 threads have arrived");
    check_dies_with([&] {
        emu::launch(1, 128, smem, 64, [&] {
            if (threadIdx.x < 64) named_barrier_arrive(2, 128);  // and nobody waits
        });
    }, "named barrier 2 half full: 64 of 128 threads arrived");
    // One wgmma issued and committed by a warpgroup, then `after()`.
    const auto one_wgmma = [&](const std::function<void()>& after) {
        emu::launch(1, 128, smem, 8192, [&] {
            float d[32] = {};
            wgmma_fence();
            wgmma_m64nNk16_ss<64, __half>(d, wl::k_major_descriptor(1024, 64, 0), wl::k_major_descriptor(4096, 64, 0), false, false);
            wgmma_commit_group();
            after();
        });
    };
    check_dies_with([&] {
        one_wgmma([] {
            if (threadIdx.x >= 32) wgmma_wait_group<0>();
            else named_barrier_sync(4, 64);  // warp 0 waits elsewhere, for nobody
        });
    }, "96 at wgmma.wait_group: group 0 of warpgroup 0");
    check_dies_with([&] { one_wgmma([] {}); }, "ended with wgmma groups it never waited for");  // no wait
    check_dies_with([&] {
        emu::launch(1, 32, smem, 64, [&] {
            if (threadIdx.x != 0) return;
            mbarrier_init(bar, 1);
            std::memset(smem + bar, 0, 8);  // a plain store over the barrier
            mbarrier_arrive(bar);
        });
    }, "whose 8 bytes ordinary stores have overwritten");
    std::vector<uint16_t> m(64 * 64);
    CUtensorMap map;
    fa::cuda::make_tensor_map_2d(map, m.data(), fa::cuda::DType::BF16, 64, 64, 64, 64, 64, true, "matrix");
    check_dies_with([&] {
        emu::launch(1, 32, smem, 1024 + 64 * 128, [&] {
            if (threadIdx.x != 0) return;
            mbarrier_init(bar, 1);
            mbarrier_arrive_expect_tx(bar, 64 * 128);
            tma_load_2d(1024, &map, bar, 0, 0);  // and the block ends without waiting
        });
    }, "ended with 1 TMA loads still landing");
    check_dies_with([&] {
        emu::launch(1, 32, smem, 1024 + 64 * 128, [&] {
            if (threadIdx.x != 0) return;
            tma_store_2d(&map, 1024, 0, 0);
            bulk_commit_group();  // and no wait_group.read
        });
    }, "ended before its bulk stores read shared memory");
}
