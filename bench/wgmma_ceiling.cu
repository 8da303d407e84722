// wgmma_ceiling: the dense rate of Hopper's warpgroup MMA on the GPU at hand, the ceiling stage
// 11 is measured against (as mma_ceiling measures mma.sync's for stage 07).
//
// Each warpgroup issues `wgmma.mma_async.m64n256k16` back to back on one accumulator (128 float32
// registers per thread), its operands read from shared memory tiles written once before the
// loop, with no global memory traffic inside the timed loop:
//
//   wgmma_ss_bf16, wgmma_ss_fp16   A and B from shared memory (the form of S = Q K^T)
//   wgmma_rs_bf16, wgmma_rs_fp16   A from registers, B from shared memory (the form of O += P V)
//
// Groups of kPerGroup instructions are committed and at most one group is left in flight
// (wgmma.wait_group 1), as a GEMM's main loop does. Results are stored only when a flag the
// compiler cannot see is set. Timing: fa::cuda::time_on_gpu (CUDA events, warm-up, median),
// the loop length calibrated to about --target-ms per run. Build: sm_90a only.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/hopper.hpp"
#include "fa/cuda/mbarrier.cuh"
#include "fa/cuda/ptx.cuh"
#include "fa/cuda/timing.hpp"
#include "fa/cuda/wgmma.cuh"
#include "fa/cuda/wgmma_layout.hpp"
#include "fa/error.hpp"
#include "fa/json.hpp"

#include "ceiling_record.hpp"

namespace {

namespace ptx = fa::cuda::ptx;
namespace wl = fa::cuda::wgmma_layout;

constexpr int kN = 256;       // the widest wgmma: most work per instruction and per operand byte
constexpr int kPerGroup = 8;  // wgmma per commit group

//! [wgmma_loop]
template <class T, bool kRS>
__global__ void __launch_bounds__(384, 1) wgmma_loop_kernel(int iters, int store, float* out) {
    // A [64, 16] and B [256, 16] K-major, one 128-byte swizzled box each (64 columns wide;
    // only the first 16 are read); every warpgroup reads the same tiles.
    __shared__ __align__(1024) unsigned char a_tile[64 * 128];
    __shared__ __align__(1024) unsigned char b_tile[kN * 128];
    for (int i = int(threadIdx.x); i < 64 * 64; i += int(blockDim.x))
        reinterpret_cast<T*>(a_tile)[i] = T(0.001f * float(i % 61 + 1));
    for (int i = int(threadIdx.x); i < kN * 64; i += int(blockDim.x))
        reinterpret_cast<T*>(b_tile)[i] = T(-0.001f * float(i % 53 + 1));
    ptx::fence_proxy_async();  // the plain stores above are visible to wgmma's reads
    __syncthreads();           // ... from every thread

    const uint64_t desc_a = wl::k_major_descriptor(ptx::smem_address(a_tile), 64, 0);
    const uint64_t desc_b = wl::k_major_descriptor(ptx::smem_address(b_tile), kN, 0);
    uint32_t a_regs[4];
    for (int r = 0; r < 4; ++r) a_regs[r] = ptx::pack2<T>(0.001f * float(threadIdx.x % 7 + r), 0.002f);
    float d[kN / 2];
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) d[i] = 0.0f;
    for (int it = 0; it < iters; ++it) {
        // Orders the registers' earlier accesses before this group's wgmma, as a GEMM's main loop
        // does at each step (without it ptxas inserts the same fence itself, with an info C7519).
        ptx::wgmma_fence();
#pragma unroll
        for (int j = 0; j < kPerGroup; ++j) {
            if constexpr (kRS) {
                ptx::wgmma_m64nNk16_rs<kN, T>(d, a_regs, desc_b, true, false);
            } else {
                ptx::wgmma_m64nNk16_ss<kN, T>(d, desc_a, desc_b, true, false);
            }
        }
        ptx::wgmma_commit_group();
        ptx::wgmma_wait_group<1>();  // one group may still run while the next is issued
    }
    ptx::wgmma_wait_group<0>();
    ptx::warpgroup_fence_operands(d);
    float sum = 0;
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) sum += d[i];
    if (store) out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
//! [wgmma_loop]

using LoopKernel = void (*)(int, int, float*);

struct Ceiling {
    std::string name;         // key of the JSON line
    std::string instruction;  // the PTX instruction it issues
    LoopKernel kernel;
};

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"flashcourse wgmma_ceiling: peak rate of wgmma.mma_async m64n256k16 (bf16, fp16; A from shared memory or registers)"};
    int warpgroups = 2, repeat = 30, warmup = 3;
    double target_ms = 10;
    std::string json_path;
    app.add_option("--warpgroups", warpgroups, "warpgroups per block (one block per SM)")->check(CLI::Range(1, 3))->capture_default_str();
    app.add_option("--repeat", repeat, "timed runs per kernel (the median is reported)")->check(CLI::Range(20, 10000))->capture_default_str();
    app.add_option("--warmup", warmup, "untimed runs before timing")->check(CLI::Range(1, 1000))->capture_default_str();
    app.add_option("--target-ms", target_ms, "length of one timed run; the loop count is calibrated to it")
        ->check(CLI::Range(1.0, 1000.0))
        ->capture_default_str();
    app.add_option("--json", json_path, "also write one JSON object per ceiling to this file (JSON lines)");
    CLI11_PARSE(app, argc, argv);

    const std::string reason = fa::cuda::hopper_unavailable_reason();
    if (!reason.empty()) {
        std::printf("skipped: wgmma_ceiling needs a Hopper GPU (sm_90a): %s\n", reason.c_str());
        return fa::kExitSkipped;
    }
    const std::string shape = "m64n256k16.f32";
    const std::vector<Ceiling> ceilings = {
        {"wgmma_ss_bf16", "wgmma.mma_async.sync.aligned." + shape + ".bf16.bf16 (A, B in shared memory)", wgmma_loop_kernel<__nv_bfloat16, false>},
        {"wgmma_ss_fp16", "wgmma.mma_async.sync.aligned." + shape + ".f16.f16 (A, B in shared memory)", wgmma_loop_kernel<__half, false>},
        {"wgmma_rs_bf16", "wgmma.mma_async.sync.aligned." + shape + ".bf16.bf16 (A in registers)", wgmma_loop_kernel<__nv_bfloat16, true>},
        {"wgmma_rs_fp16", "wgmma.mma_async.sync.aligned." + shape + ".f16.f16 (A in registers)", wgmma_loop_kernel<__half, true>},
    };
    std::ofstream json;
    if (!fa::bench::open_record(json, json_path)) return fa::kExitBadInput;
    try {
        const fa::cuda::GpuInfo gpu = fa::cuda::gpu_info();
        const std::string date = fa::record_date();
        const unsigned blocks = unsigned(gpu.sm_count), threads = unsigned(128 * warpgroups);
        fa::cuda::DeviceBuffer<float> out(size_t(blocks) * threads);
        const double flop_per_wgmma = 2.0 * 64 * kN * 16;
        std::printf("gpu        %s\n", gpu.describe().c_str());
        std::printf("method     %u blocks (1 per SM) of %d warpgroups, %d wgmma per commit group, one group left in flight; "
                    "CUDA events, %d warm-up runs, median of %d runs of about %.0f ms\n",
                    blocks, warpgroups, kPerGroup, warmup, repeat, target_ms);
        for (const Ceiling& c : ceilings) {
            const auto run = [&](int iters) {
                return [&, iters](cudaStream_t stream) {
                    c.kernel<<<blocks, threads, 0, stream>>>(iters, 0, out.data());
                    FA_CUDA_CHECK_LAUNCH(c.name + " loop kernel");
                };
            };
            const int probe = 512;
            const double probe_ms = fa::cuda::time_on_gpu(run(probe), 1, 3).median_ms;
            const int iters = int(std::min(1e9, std::max(double(probe), probe * target_ms / std::max(probe_ms, 1e-3))));
            const fa::TimingStats t = fa::cuda::time_on_gpu(run(iters), warmup, repeat);
            const int clock = fa::cuda::current_sm_clock_mhz();
            const double flop = double(blocks) * warpgroups * double(iters) * kPerGroup * flop_per_wgmma;
            const double rate = flop / (t.median_ms * 1e-3) * 1e-12;
            const int clock_for_per_cycle = clock > 0 ? clock : gpu.max_sm_clock_mhz;
            const double per_sm_cycle = flop / (t.median_ms * 1e-3) / (double(gpu.sm_count) * clock_for_per_cycle * 1e6);
            std::printf("%-14s %8.1f TFLOP/s  %s  (median %.3f ms, min %.3f, max %.3f; %.0f FLOP per SM per clock at %d MHz; SM %d MHz)\n",
                        c.name.c_str(), rate, c.instruction.c_str(), t.median_ms, t.min_ms, t.max_ms, per_sm_cycle,
                        clock_for_per_cycle, clock);
            std::fflush(stdout);
            if (json) {
                const fa::Json record = {{"name", c.name}, {"instruction", c.instruction}, {"value", rate}, {"unit", "TFLOP/s"},
                                         {"per_sm_per_clock", per_sm_cycle}, {"median_ms", t.median_ms}, {"min_ms", t.min_ms},
                                         {"max_ms", t.max_ms}, {"iters", iters}, {"blocks", blocks}, {"warpgroups_per_block", warpgroups},
                                         {"sm_clock_mhz", clock}, {"max_sm_clock_mhz", gpu.max_sm_clock_mhz},
                                         {"sm_count", gpu.sm_count}, {"gpu", gpu.name}, {"date", date}};
                json << fa::json_line(record) << '\n';
            }
        }
    } catch (const fa::cuda::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return fa::kExitMismatch;
    }
    if (json) std::printf("wrote      %s\n", json_path.c_str());
    return fa::kExitPass;
}
