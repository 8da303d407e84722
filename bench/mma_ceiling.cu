// mma_ceiling: the ceilings stage 07 is measured against, on the GPU at hand.
//
// Each kernel issues one instruction back to back from registers, with no memory traffic inside
// the timed loop, so its rate is the most a real kernel could get out of that unit:
//
//   mma_bf16, mma_fp16   mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32, the
//                        instruction of stage 07's two matrix products (4096 FLOP each)
//   ex2                  ex2.approx.ftz.f32, the one special-function instruction per score of
//                        stage 07's softmax
//   ffma                 fma.rn.f32, the unit stages 05 and 06 run on (2 FLOP per lane)
//
// Every warp keeps kChains independent accumulator chains, so while one mma (or ex2) waits for
// its result the next chain's can issue; the grid holds several blocks of several warps on every
// SM, so each of the SM's four schedulers always has a warp ready. Results are stored only when
// a flag the compiler cannot see is set, so nothing is optimized away and nothing is written.
// Timing: fa::cuda::time_on_gpu (CUDA events, warm-up, median), the loop length calibrated to
// about --target-ms per run. What it measured on the course's H100 is in
// docs/results/mma_ceiling.jsonl (written by bench/session.py run ceiling); the lessons and the
// results page read their figures from that file.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/ptx.cuh"
#include "fa/cuda/timing.hpp"
#include "fa/error.hpp"
#include "fa/json.hpp"

#include "ceiling_record.hpp"

namespace {

namespace ptx = fa::cuda::ptx;

// Independent chains per thread: enough to cover the latency of an mma (about 30 cycles) or an
// ex2 with one warp per scheduler; several warps per scheduler then cover it many times over.
constexpr int kChains = 8;

// A value per lane that the compiler cannot fold, small and nonzero (zeros could let the
// hardware save power and clock higher than on real data).
__device__ float lane_value(int i) { return 0.001f * float((threadIdx.x + 7 * i) % 64 + 1); }

//! [mma_loop]
template <class T>
__global__ void mma_loop_kernel(int iters, int store, float* out) {
    uint32_t a[4], b[2];  // A (16 x 16) and B (16 x 8) fragments, the same for every mma
    for (int i = 0; i < 4; ++i) a[i] = ptx::pack2<T>(lane_value(i), -lane_value(i + 4));
    for (int i = 0; i < 2; ++i) b[i] = ptx::pack2<T>(lane_value(i + 8), lane_value(i + 10));
    float acc[kChains][4] = {};  // kChains accumulators (16 x 8 float32 each), one chain each
#pragma unroll 4
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < kChains; ++c) ptx::mma_m16n8k16<T>(acc[c], a, b, acc[c]);
    }
    float sum = 0;
    for (int c = 0; c < kChains; ++c) sum += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
    if (store) out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
//! [mma_loop]

__global__ void ex2_loop_kernel(int iters, int store, float* out) {
    float x[kChains];
    for (int c = 0; c < kChains; ++c) x[c] = lane_value(c);
#pragma unroll 4
    for (int it = 0; it < iters; ++it) {
        // 2^-x maps [0, inf) into (0, 1]: the chain stays finite however long it runs.
#pragma unroll
        for (int c = 0; c < kChains; ++c) x[c] = ptx::ex2(-x[c]);
    }
    float sum = 0;
    for (int c = 0; c < kChains; ++c) sum += x[c];
    if (store) out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

__global__ void ffma_loop_kernel(int iters, int store, float* out) {
    float x[kChains];
    for (int c = 0; c < kChains; ++c) x[c] = lane_value(c);
    const float m = 1.0f - lane_value(1) * 1e-3f, s = lane_value(2);  // x -> m x + s converges: stays finite
#pragma unroll 8
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < kChains; ++c) x[c] = fmaf(x[c], m, s);
    }
    float sum = 0;
    for (int c = 0; c < kChains; ++c) sum += x[c];
    if (store) out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

using LoopKernel = void (*)(int, int, float*);

struct Ceiling {
    std::string name;         // key of the JSON line: mma_bf16, mma_fp16, ex2, ffma
    std::string instruction;  // the PTX instruction it issues
    LoopKernel kernel;
    double ops_per_warp_instruction;  // FLOP (or ex2) one warp-wide instruction does
    std::string unit;                 // what the rate counts
};

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"flashcourse mma_ceiling: peak rates of mma.sync m16n8k16 (bf16, fp16), ex2.approx and fp32 FMA"};
    int blocks_per_sm = 4, warps = 8, repeat = 30, warmup = 3;
    double target_ms = 10;
    std::string json_path;
    app.add_option("--blocks-per-sm", blocks_per_sm, "blocks per SM (grid = SMs x this)")->check(CLI::Range(1, 32))->capture_default_str();
    app.add_option("--warps", warps, "warps per block")->check(CLI::Range(1, 32))->capture_default_str();
    app.add_option("--repeat", repeat, "timed runs per kernel (the median is reported)")->check(CLI::Range(20, 10000))->capture_default_str();
    app.add_option("--warmup", warmup, "untimed runs before timing")->check(CLI::Range(1, 1000))->capture_default_str();
    app.add_option("--target-ms", target_ms, "length of one timed run; the loop count is calibrated to it")
        ->check(CLI::Range(1.0, 1000.0))
        ->capture_default_str();
    app.add_option("--json", json_path, "also write one JSON object per ceiling to this file (JSON lines)");
    CLI11_PARSE(app, argc, argv);

    const std::string reason = fa::cuda::gpu_unavailable_reason();
    if (!reason.empty()) {
        std::printf("skipped: mma_ceiling needs a CUDA GPU (%s)\n", reason.c_str());
        return fa::kExitSkipped;
    }
    const std::vector<Ceiling> ceilings = {
        {"mma_bf16", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", mma_loop_kernel<__nv_bfloat16>, 2.0 * 16 * 8 * 16,
         "TFLOP/s"},
        {"mma_fp16", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", mma_loop_kernel<__half>, 2.0 * 16 * 8 * 16, "TFLOP/s"},
        {"ex2", "ex2.approx.ftz.f32", ex2_loop_kernel, 32, "T ex2/s"},
        {"ffma", "fma.rn.f32", ffma_loop_kernel, 2.0 * 32, "TFLOP/s"},
    };
    std::ofstream json;
    if (!fa::bench::open_record(json, json_path)) return fa::kExitBadInput;
    try {
        const fa::cuda::GpuInfo gpu = fa::cuda::gpu_info();
        const std::string date = fa::record_date();
        const unsigned blocks = unsigned(gpu.sm_count * blocks_per_sm), threads = unsigned(32 * warps);
        fa::cuda::DeviceBuffer<float> out(size_t(blocks) * threads);
        std::printf("gpu        %s\n", gpu.describe().c_str());
        std::printf("method     %u blocks (%d per SM) of %d warps, %d independent chains per thread; CUDA events, "
                    "%d warm-up runs, median of %d runs of about %.0f ms\n",
                    blocks, blocks_per_sm, warps, kChains, warmup, repeat, target_ms);
        for (const Ceiling& c : ceilings) {
            const auto run = [&](int iters) {
                return [&, iters](cudaStream_t stream) {
                    c.kernel<<<blocks, threads, 0, stream>>>(iters, 0, out.data());
                    FA_CUDA_CHECK_LAUNCH(c.name + " loop kernel");
                };
            };
            // Calibrate: time a short loop, then scale the count to the target length.
            const int probe = 2048;
            const double probe_ms = fa::cuda::time_on_gpu(run(probe), 1, 3).median_ms;
            const int iters = int(std::min(1e9, std::max(double(probe), probe * target_ms / std::max(probe_ms, 1e-3))));
            const fa::TimingStats t = fa::cuda::time_on_gpu(run(iters), warmup, repeat);
            const int clock = fa::cuda::current_sm_clock_mhz();
            const double ops = double(blocks) * warps * double(iters) * kChains * c.ops_per_warp_instruction;
            const double rate = ops / (t.median_ms * 1e-3) * 1e-12;
            // Per SM and clock: the figure that does not change with the clock the run happened to get.
            const int clock_for_per_cycle = clock > 0 ? clock : gpu.max_sm_clock_mhz;
            const double per_sm_cycle = ops / (t.median_ms * 1e-3) / (double(gpu.sm_count) * clock_for_per_cycle * 1e6);
            std::printf("%-9s  %8.1f %-8s %s  (median %.3f ms, min %.3f, max %.3f; %.0f per SM per clock at %d MHz; SM %d MHz)\n",
                        c.name.c_str(), rate, c.unit.c_str(), c.instruction.c_str(), t.median_ms, t.min_ms, t.max_ms,
                        per_sm_cycle, clock_for_per_cycle, clock);
            std::fflush(stdout);
            if (json) {
                const fa::Json record = {{"name", c.name}, {"instruction", c.instruction}, {"value", rate}, {"unit", c.unit},
                                         {"per_sm_per_clock", per_sm_cycle}, {"median_ms", t.median_ms}, {"min_ms", t.min_ms},
                                         {"max_ms", t.max_ms}, {"iters", iters}, {"blocks", blocks}, {"warps_per_block", warps},
                                         {"chains", kChains}, {"sm_clock_mhz", clock}, {"max_sm_clock_mhz", gpu.max_sm_clock_mhz},
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
