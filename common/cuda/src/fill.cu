#include "fa/cuda/check.hpp"
#include "fa/cuda/tensors.hpp"

namespace fa::cuda {

namespace {

// SplitMix64: a counter-based generator, so element i gets the same value whatever the launch shape.
__device__ uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// One normal value per element by the Box-Muller transform of two uniform values.
__global__ void fill_normal_kernel(float* data, int64_t count, uint64_t seed, float stddev) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
        const uint64_t bits = splitmix64(seed ^ splitmix64(uint64_t(i)));
        // Two 24-bit uniforms in (0, 1]; the +1 keeps log() away from 0.
        const float u1 = (float((bits >> 40) & 0xffffff) + 1.0f) * (1.0f / 16777216.0f);
        const float u2 = float((bits >> 8) & 0xffffff) * (1.0f / 16777216.0f);
        data[i] = stddev * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    }
}

}  // namespace

void fill_normal(float* data, int64_t count, uint64_t seed, float stddev, cudaStream_t stream) {
    if (count <= 0) return;
    const int threads = 256;
    const int64_t wanted = (count + threads - 1) / threads;
    const int blocks = int(wanted < 65536 ? wanted : 65536);
    fill_normal_kernel<<<blocks, threads, 0, stream>>>(data, count, seed, stddev);
    FA_CUDA_CHECK_LAUNCH("fill_normal_kernel");
}

}  // namespace fa::cuda
