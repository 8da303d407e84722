// read_ceiling: how many bytes per second this GPU can read from its memory, the ceiling stage 13's
// decoding is measured against (a decode step reads the whole cached K and V once and does little
// else, so its time is bounded below by bytes / this rate).
//
// Each kernel streams a buffer much larger than the L2 cache (--mib, default 4096) once, with
// 16-byte loads, several in flight per thread, and adds what it read into a value it stores only
// when a flag the compiler cannot see is set: every byte is loaded, nothing is written. Three forms:
//
//   grid_stride   a grid of a few blocks per SM, each thread loading 4 16-byte words per turn of a
//                 grid-stride loop (the form of a hand-written streaming kernel)
//   block_chunks  one contiguous chunk per block, more blocks than SMs, each warp reading whole
//                 128-byte lines in order (the form of stage 13's split kernel: one key range each)
//   bulk_ring     Hopper and later: two blocks per SM, each streaming its contiguous range through a
//                 ring of kRingStages shared-memory slots of kRingChunk bytes, each slot filled by one
//                 thread's bulk copy (cp.async.bulk, the TMA without a tensor map) completing on the
//                 slot's mbarrier; the threads read the slot, then the slot is refilled. No register
//                 holds a load in flight: the bytes in flight are the ring's.
//
// Timing: fa::cuda::time_on_gpu (CUDA events, warm-up, median). The buffer is read once per run,
// and it is many times the L2, so no run finds it cached. bench/session.py run ceiling13 writes
// the JSON lines that stage 13's sweep divides by.
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
#include "fa/cuda/mbarrier.cuh"
#include "fa/cuda/ptx.cuh"
#include "fa/cuda/tma.cuh"
#include "fa/cuda/timing.hpp"
#include "fa/error.hpp"
#include "fa/json.hpp"

#include "ceiling_record.hpp"

namespace {

// Adds the four words of a 16-byte load: cheap, and it makes every loaded byte matter.
__device__ unsigned fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

template <int Unroll>
__global__ void grid_stride_kernel(const uint4* __restrict__ in, int64_t words, int store, unsigned* out) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    unsigned acc = 0;
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i + (Unroll - 1) * stride < words; i += Unroll * stride) {
        uint4 v[Unroll];
#pragma unroll
        for (int u = 0; u < Unroll; ++u) v[u] = __ldcs(in + i + u * stride);  // streaming: evict first
#pragma unroll
        for (int u = 0; u < Unroll; ++u) acc += fold(v[u]);
    }
    for (; i < words; i += stride) acc += fold(__ldcs(in + i));
    if (store) out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

template <int Unroll>
__global__ void block_chunks_kernel(const uint4* __restrict__ in, int64_t words, int64_t chunk, int store, unsigned* out) {
    const int64_t begin = int64_t(blockIdx.x) * chunk;
    const int64_t end = begin + chunk < words ? begin + chunk : words;
    unsigned acc = 0;
    int64_t i = begin + threadIdx.x;
    for (; i + (Unroll - 1) * int64_t(blockDim.x) < end; i += Unroll * int64_t(blockDim.x)) {
        uint4 v[Unroll];
#pragma unroll
        for (int u = 0; u < Unroll; ++u) v[u] = __ldcs(in + i + u * blockDim.x);
#pragma unroll
        for (int u = 0; u < Unroll; ++u) acc += fold(v[u]);
    }
    for (; i < end; i += blockDim.x) acc += fold(__ldcs(in + i));
    if (store) out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

constexpr int kRingStages = 6;           // slots of the bulk_ring form's ring
constexpr int kRingChunk = 16 * 1024;    // bytes one bulk copy brings
constexpr int kRingThreads = 256;
constexpr int kRingSmem = kRingStages * kRingChunk + kRingStages * 8;  // the slots, then their barriers

// The bulk_ring form: block x reads chunks [x per, (x + 1) per) of `bytes` / kRingChunk.
__global__ void __launch_bounds__(kRingThreads) bulk_ring_kernel(const unsigned char* __restrict__ in, int64_t bytes, int store,
                                                                  unsigned* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using namespace fa::cuda::ptx;
    extern __shared__ __align__(128) unsigned char ring[];
    uint64_t* full = reinterpret_cast<uint64_t*>(ring + kRingStages * kRingChunk);
    const int64_t chunks = bytes / kRingChunk, per = (chunks + gridDim.x - 1) / gridDim.x;
    const int64_t begin = int64_t(blockIdx.x) * per, end = begin + per < chunks ? begin + per : chunks;
    const int64_t count = end > begin ? end - begin : 0;
    const auto bar = [&](int s) { return smem_address(full + s); };
    if (threadIdx.x == 0) {
        for (int s = 0; s < kRingStages; ++s) mbarrier_init(bar(s), 1);
        fence_mbarrier_init();
    }
    __syncthreads();
    const auto issue = [&](int64_t n) {  // chunk begin + n into slot n % kRingStages
        const int s = int(n % kRingStages);
        mbarrier_arrive_expect_tx(bar(s), kRingChunk);
        bulk_load(smem_address(ring + s * kRingChunk), in + (begin + n) * kRingChunk, kRingChunk, bar(s));
    };
    if (threadIdx.x == 0)
        for (int64_t n = 0; n < kRingStages && n < count; ++n) issue(n);
    unsigned acc = 0;
    for (int64_t n = 0; n < count; ++n) {
        const int s = int(n % kRingStages);
        mbarrier_wait_parity(bar(s), uint32_t((n / kRingStages) & 1));
        const uint4* words = reinterpret_cast<const uint4*>(ring + s * kRingChunk);
#pragma unroll
        for (int i = int(threadIdx.x); i < kRingChunk / 16; i += kRingThreads) acc += fold(words[i]);
        __syncthreads();  // every thread has read slot s: it may be refilled
        if (threadIdx.x == 0 && n + kRingStages < count) issue(n + kRingStages);
    }
    if (store) out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
#else
    (void)in, (void)bytes, (void)store, (void)out;
#endif
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"flashcourse read_ceiling: the GPU's memory read rate (16-byte streaming loads over a buffer much larger than L2)"};
    int64_t mib = 4096;
    int repeat = 30, warmup = 3, threads = 512;
    std::string json_path;
    app.add_option("--mib", mib, "MiB read per run (the buffer); many times the L2")->check(CLI::Range(int64_t{256}, int64_t{65536}))->capture_default_str();
    app.add_option("--threads", threads, "threads per block")->check(CLI::IsMember({128, 256, 512, 1024}))->capture_default_str();
    app.add_option("--repeat", repeat, "timed runs per kernel (the median is reported)")->check(CLI::Range(20, 10000))->capture_default_str();
    app.add_option("--warmup", warmup, "untimed runs before timing")->check(CLI::Range(1, 1000))->capture_default_str();
    app.add_option("--json", json_path, "also write one JSON object per form to this file (JSON lines)");
    CLI11_PARSE(app, argc, argv);

    const std::string reason = fa::cuda::gpu_unavailable_reason();
    if (!reason.empty()) {
        std::printf("skipped: read_ceiling needs a CUDA GPU (%s)\n", reason.c_str());
        return fa::kExitSkipped;
    }
    std::ofstream json;
    if (!fa::bench::open_record(json, json_path)) return fa::kExitBadInput;
    try {
        const fa::cuda::GpuInfo gpu = fa::cuda::gpu_info();
        const std::string date = fa::record_date();
        const int64_t bytes = mib << 20, words = bytes / 16;
        fa::cuda::DeviceBuffer<uint4> in{size_t(words)};
        FA_CUDA_CHECK(cudaMemset(in.data(), 0x5a, size_t(bytes)));
        const int64_t chunk_blocks = int64_t(gpu.sm_count) * 16;  // 16 chunks per SM: the tail is short
        const int64_t chunk = (words + chunk_blocks - 1) / chunk_blocks;
        const unsigned grid = unsigned(gpu.sm_count * (2048 / threads));  // a full SM's worth of threads
        fa::cuda::DeviceBuffer<unsigned> out(size_t(std::max<int64_t>(grid, chunk_blocks)) * threads);
        std::printf("gpu        %s\n", gpu.describe().c_str());
        std::printf("method     %lld MiB read once per run with 16-byte loads (ld.global.cs), %d threads per block; CUDA "
                    "events, %d warm-up runs, median of %d runs\n",
                    (long long)mib, threads, warmup, repeat);
        struct Form {
            const char* name;
            std::string shape;
            std::function<void(cudaStream_t)> launch;
        };
        std::vector<Form> forms = {
            {"grid_stride", std::to_string(grid) + " blocks, 4 loads in flight per thread",
             [&](cudaStream_t s) {
                 grid_stride_kernel<4><<<grid, threads, 0, s>>>(in.data(), words, 0, out.data());
                 FA_CUDA_CHECK_LAUNCH("grid_stride read kernel");
             }},
            {"block_chunks", std::to_string(chunk_blocks) + " blocks of one contiguous chunk each, 4 loads in flight",
             [&](cudaStream_t s) {
                 block_chunks_kernel<4><<<unsigned(chunk_blocks), threads, 0, s>>>(in.data(), words, chunk, 0, out.data());
                 FA_CUDA_CHECK_LAUNCH("block_chunks read kernel");
             }},
        };
        const unsigned ring_grid = unsigned(gpu.sm_count * 2);
        // The ring needs sm_90 code: a build for older targets only (whose PTX the driver compiles
        // here) holds an empty kernel, which must not be timed as a read.
        cudaFuncAttributes ring_attributes{};
        FA_CUDA_CHECK(cudaFuncGetAttributes(&ring_attributes, bulk_ring_kernel));
        if (gpu.compute_major >= 9 && ring_attributes.ptxVersion >= 90) {
            FA_CUDA_CHECK(cudaFuncSetAttribute(bulk_ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingSmem));
            forms.push_back({"bulk_ring",
                             std::to_string(ring_grid) + " blocks of " + std::to_string(kRingThreads) + " threads, a ring of " +
                                 std::to_string(kRingStages) + " x " + std::to_string(kRingChunk / 1024) +
                                 " KiB filled by cp.async.bulk",
                             [&](cudaStream_t s) {
                                 bulk_ring_kernel<<<ring_grid, kRingThreads, kRingSmem, s>>>(
                                     reinterpret_cast<const unsigned char*>(in.data()), bytes, 0, out.data());
                                 FA_CUDA_CHECK_LAUNCH("bulk_ring read kernel");
                             }});
        } else {
            std::printf("bulk_ring     skipped: cp.async.bulk needs compute capability 9.0 and a build for it (this GPU: "
                        "%d.%d, the kernel's code: %d)\n",
                        gpu.compute_major, gpu.compute_minor, ring_attributes.ptxVersion);
        }
        for (const Form& f : forms) {
            const fa::TimingStats t = fa::cuda::time_on_gpu(f.launch, warmup, repeat);
            const double gbps = double(bytes) / (t.median_ms * 1e-3) * 1e-9;
            std::printf("%-12s  %7.0f GB/s  (median %.3f ms, min %.3f, max %.3f; %s)\n", f.name, gbps, t.median_ms, t.min_ms,
                        t.max_ms, f.shape.c_str());
            std::fflush(stdout);
            if (json) {
                const fa::Json record = {{"name", f.name},       {"value", gbps},        {"unit", "GB/s"},
                                         {"bytes", double(bytes)}, {"median_ms", t.median_ms}, {"min_ms", t.min_ms},
                                         {"max_ms", t.max_ms},   {"threads", threads},   {"shape", f.shape},
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
