// One small kernel per Hopper wrapper (see hopper_wrapper_kernels.hpp). Built for sm_90a only.
#include "hopper_wrapper_kernels.hpp"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/fragments.cuh"
#include "fa/cuda/mbarrier.cuh"
#include "fa/cuda/ptx.cuh"
#include "fa/cuda/tensor_map.hpp"
#include "fa/cuda/tma.cuh"
#include "fa/cuda/warpgroup.cuh"
#include "fa/cuda/wgmma.cuh"
#include "fa/cuda/wgmma_layout.hpp"

namespace fa::test::hopper {

namespace {

using namespace fa::cuda::ptx;
namespace wl = fa::cuda::wgmma_layout;

// Dynamic shared memory rounded up to the 1024-byte alignment a swizzled tile needs.
__device__ unsigned char* aligned_smem(unsigned char* raw) {
    const uint32_t a = smem_address(raw);
    return raw + ((1024u - (a % 1024u)) % 1024u);
}

//! [tma_box_kernel]
// One thread loads `boxes` boxes of box_bytes each with the TMA onto one mbarrier; every thread
// then waits for the phase and copies the raw shared memory out.
__global__ void tma_load_kernel(const __grid_constant__ CUtensorMap map, int boxes, int box_bytes, int c1, int c2, int c3,
                                int rank, uint16_t* out) {
    extern __shared__ unsigned char raw[];
    unsigned char* tile = aligned_smem(raw);
    __shared__ __align__(8) uint64_t bar;
    const uint32_t bar_addr = smem_address(&bar);
    if (threadIdx.x == 0) {
        mbarrier_init(bar_addr, 1);
        fence_mbarrier_init();
    }
    __syncthreads();  // the barrier is initialized before anyone waits on it
    if (threadIdx.x == 0) {
        mbarrier_arrive_expect_tx(bar_addr, uint32_t(boxes * box_bytes));
        for (int i = 0; i < boxes; ++i) {
            const uint32_t dst = smem_address(tile + i * box_bytes);
            if (rank == 2) tma_load_2d(dst, &map, bar_addr, 64 * i, c1);
            else tma_load_4d(dst, &map, bar_addr, 64 * i, c1, c2, c3);
        }
    }
    mbarrier_wait_parity(bar_addr, 0);  // phase 0 completes when every byte has landed
    const uint16_t* words = reinterpret_cast<const uint16_t*>(tile);
    for (int i = int(threadIdx.x); i < boxes * box_bytes / 2; i += int(blockDim.x)) out[i] = words[i];
}
//! [tma_box_kernel]

__global__ void tma_store_kernel(const __grid_constant__ CUtensorMap in, const __grid_constant__ CUtensorMap out, int row0,
                                 int dst_row0) {
    extern __shared__ unsigned char raw[];
    unsigned char* tile = aligned_smem(raw);
    __shared__ __align__(8) uint64_t bar;
    const uint32_t bar_addr = smem_address(&bar);
    if (threadIdx.x == 0) {
        mbarrier_init(bar_addr, 1);
        fence_mbarrier_init();
        mbarrier_arrive_expect_tx(bar_addr, 64 * 128);
        tma_load_2d(smem_address(tile), &in, bar_addr, 0, row0);
        mbarrier_wait_parity(bar_addr, 0);  // the box is in shared memory
        fence_proxy_async();                // the load's bytes, seen by this thread, are ordered before the store reads them
        tma_store_2d(&out, smem_address(tile), 0, dst_row0);
        bulk_commit_group();
        bulk_wait_group<0>();  // the writes are done before the kernel ends
    }
}

__global__ void mbarrier_kernel(int* flags) {
    __shared__ __align__(8) uint64_t bar;
    const uint32_t bar_addr = smem_address(&bar);
    if (threadIdx.x == 0) {
        mbarrier_init(bar_addr, blockDim.x);
        fence_mbarrier_init();
    }
    __syncthreads();  // initialized before use
    for (int p = 0; p < 3; ++p) {
        int* f = flags + (threadIdx.x * 3 + p) * 4;
        f[0] = mbarrier_try_wait_parity(bar_addr, uint32_t(p % 2));  // cannot be complete: this thread has not arrived
        mbarrier_arrive(bar_addr);
        mbarrier_wait_parity(bar_addr, uint32_t(p % 2));
        f[1] = mbarrier_try_wait_parity(bar_addr, uint32_t(p % 2));
        f[2] = mbarrier_try_wait_parity(bar_addr, uint32_t((p + 1) % 2));  // the next phase lacks this thread
        f[3] = 1;
    }
}

__global__ void quad_transpose_kernel(uint32_t* words) {
    const int lane = int(threadIdx.x);
    uint32_t v[4];
    for (int j = 0; j < 4; ++j) v[j] = words[4 * lane + j];
    fa::cuda::quad_transpose(v, lane % 4);
    for (int j = 0; j < 4; ++j) words[4 * lane + j] = v[j];
}

// 384 threads: the register split of stage 11's step 3 (128 x 24 + 256 x 240 <= 65536).
__global__ void __launch_bounds__(384, 1) warp_specialization_kernel(int* codes) {
    __shared__ int token;
    __shared__ int exchange[256];
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
        const int other = (tid - 128 + 128) % 256;
        if (exchange[other] != (other + 128) * 3 && code == 1) code = 3;
    }
    codes[tid] = code;
}

//! [wgmma_kernel]
// D = A B on one warpgroup. The tiles are stored with plain 16-bit stores at the swizzled
// offsets of the host map, so this tests wgmma and the descriptors alone, not the TMA.
template <class T, int N, bool kRS, bool kTransB>
__global__ void __launch_bounds__(128) wgmma_kernel(const T* a, const T* b, int k, int swap_offsets, float* d_out) {
    extern __shared__ unsigned char raw[];
    unsigned char* a_tile = aligned_smem(raw);                 // [64, k] swizzled, k / 64 boxes
    unsigned char* b_tile = a_tile + 64 * 128 * 2;             // [N, k] (K-major) or [k, N] (MN-major)
    const int tid = int(threadIdx.x);
    for (int i = tid; i < 64 * k; i += 128) {
        const int r = i / k, c = i % k;
        *reinterpret_cast<T*>(a_tile + wl::tile_offset(64, r, c)) = a[i];
    }
    if constexpr (!kTransB) {
        for (int i = tid; i < N * k; i += 128) {  // b is [N, k]
            const int r = i / k, c = i % k;
            *reinterpret_cast<T*>(b_tile + wl::tile_offset(N, r, c)) = b[i];
        }
    } else {
        for (int i = tid; i < k * N; i += 128) {  // b is [k, N]
            const int r = i / N, c = i % N;
            *reinterpret_cast<T*>(b_tile + wl::tile_offset(k, r, c)) = b[i];
        }
    }
    fence_proxy_async();  // this thread's plain stores are visible to wgmma's (asynchronous) reads
    __syncthreads();      // ... and every other thread's

    float d[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
    uint32_t a_regs[8][4];
    if constexpr (kRS) {
        for (int ks = 0; ks < k / 16; ++ks)
            for (int reg = 0; reg < 4; ++reg) {
                const wl::Element lo = wl::a_operand_element(tid, reg, 0);
                const float x0 = float(a[lo.row * k + 16 * ks + lo.col]), x1 = float(a[lo.row * k + 16 * ks + lo.col + 1]);
                a_regs[ks][reg] = pack2<T>(x0, x1);
            }
    }
    wgmma_fence();  // the accumulators and A registers written above are ready for wgmma
    const uint32_t a_addr = smem_address(a_tile), b_addr = smem_address(b_tile);
    for (int ks = 0; ks < k / 16; ++ks) {
        uint64_t desc_b = kTransB ? wl::mn_major_descriptor(b_addr, k, ks) : wl::k_major_descriptor(b_addr, N, ks);
        if (swap_offsets) {  // the diagnostic: B's LBO and SBO exchanged
            const wl::Descriptor f = wl::decode_descriptor(desc_b);
            desc_b = wl::encode_descriptor(f.start_address, f.stride_byte_offset, f.leading_byte_offset, f.swizzle);
        }
        if constexpr (kRS) {
            wgmma_m64nNk16_rs<N, T>(d, a_regs[ks], desc_b, ks > 0, kTransB);
        } else {
            wgmma_m64nNk16_ss<N, T>(d, wl::k_major_descriptor(a_addr, 64, ks), desc_b, ks > 0, kTransB);
        }
    }
    wgmma_commit_group();
    wgmma_wait_group<0>();  // the product is in the accumulators
    warpgroup_fence_operands(d);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
        const wl::Element e = wl::accumulator_element(tid, i);
        d_out[e.row * N + e.col] = d[i];
    }
}
//! [wgmma_kernel]

template <class T>
std::vector<T> to_half(const std::vector<float>& x) {
    std::vector<T> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = T(x[i]);
    return h;
}

template <class T, int N, bool kRS, bool kTransB>
std::vector<float> run_wgmma(int k, int swap, const std::vector<float>& a, const std::vector<float>& b) {
    cuda::DeviceBuffer<T> da(a.size()), db(b.size());
    cuda::DeviceBuffer<float> dd(size_t(64) * N);
    const std::vector<T> ha = to_half<T>(a), hb = to_half<T>(b);
    FA_CUDA_CHECK(cudaMemcpy(da.data(), ha.data(), ha.size() * sizeof(T), cudaMemcpyHostToDevice));
    FA_CUDA_CHECK(cudaMemcpy(db.data(), hb.data(), hb.size() * sizeof(T), cudaMemcpyHostToDevice));
    FA_CUDA_CHECK(cudaMemset(dd.data(), 0xFF, size_t(64) * N * sizeof(float)));  // NaN: unwritten shows
    const size_t smem = 1024 + 64 * 128 * 2 + 128 * 128 * 2;
    FA_CUDA_CHECK(cudaFuncSetAttribute(wgmma_kernel<T, N, kRS, kTransB>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    wgmma_kernel<T, N, kRS, kTransB><<<1, 128, smem>>>(da.data(), db.data(), k, swap, dd.data());
    FA_CUDA_CHECK_LAUNCH("wgmma_kernel");
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> d(size_t(64) * N);
    FA_CUDA_CHECK(cudaMemcpy(d.data(), dd.data(), d.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return d;
}

template <class T, int N>
std::vector<float> run_wgmma_forms(int k, bool rs, bool trans_b, int swap, const std::vector<float>& a,
                                   const std::vector<float>& b) {
    if (rs) return trans_b ? run_wgmma<T, N, true, true>(k, swap, a, b) : run_wgmma<T, N, true, false>(k, swap, a, b);
    return trans_b ? run_wgmma<T, N, false, true>(k, swap, a, b) : run_wgmma<T, N, false, false>(k, swap, a, b);
}

std::vector<uint16_t> copy_back(const cuda::DeviceBuffer<uint16_t>& buf, size_t n) {
    std::vector<uint16_t> h(n);
    FA_CUDA_CHECK(cudaMemcpy(h.data(), buf.data(), n * 2, cudaMemcpyDeviceToHost));
    return h;
}

cuda::DeviceBuffer<uint16_t> upload(const std::vector<uint16_t>& h) {
    cuda::DeviceBuffer<uint16_t> d(h.size());
    FA_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    return d;
}

}  // namespace

std::vector<uint16_t> tma_load_box(const std::vector<uint16_t>& matrix, int rows, int stride, int row0) {
    cuda::DeviceBuffer<uint16_t> src = upload(matrix), out(64 * 64);
    CUtensorMap map;
    cuda::make_tensor_map_2d(map, src.data(), cuda::DType::BF16, rows, 64, stride, 64, 64, true, "test matrix");
    const int smem = 1024 + 64 * 128;
    tma_load_kernel<<<1, 128, smem>>>(map, 1, 64 * 128, row0, 0, 0, 2, out.data());
    FA_CUDA_CHECK_LAUNCH("tma_load_kernel (2d)");
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    return copy_back(out, 64 * 64);
}

std::vector<uint16_t> tma_load_bhnd(const std::vector<uint16_t>& tensor, int64_t B, int64_t H, int64_t N, int64_t sb,
                                    int64_t sh, int64_t sn, int b, int h, int row0, int box_rows) {
    cuda::DeviceBuffer<uint16_t> src = upload(tensor), out(size_t(box_rows) * 128);
    CUtensorMap map;
    cuda::make_tensor_map_bhnd(map, src.data(), cuda::DType::BF16, B, H, N, 128, sb, sh, sn, box_rows, "test tensor");
    const int smem = 1024 + box_rows * 256;
    FA_CUDA_CHECK(cudaFuncSetAttribute(tma_load_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    tma_load_kernel<<<1, 128, smem>>>(map, 2, box_rows * 128, row0, h, b, 4, out.data());
    FA_CUDA_CHECK_LAUNCH("tma_load_kernel (4d)");
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    return copy_back(out, size_t(box_rows) * 128);
}

std::vector<uint16_t> tma_store_box(const std::vector<uint16_t>& matrix, std::vector<uint16_t> out, int rows, int row0,
                                    int dst_row0) {
    cuda::DeviceBuffer<uint16_t> src = upload(matrix), dst = upload(out);
    CUtensorMap in_map;
    cuda::make_tensor_map_2d(in_map, src.data(), cuda::DType::BF16, rows, 64, 64, 64, 64, true, "store source");
    CUtensorMap out_map;
    cuda::make_tensor_map_2d(out_map, dst.data(), cuda::DType::BF16, rows, 64, 64, 64, 64, true, "store target");
    tma_store_kernel<<<1, 32, 1024 + 64 * 128>>>(in_map, out_map, row0, dst_row0);
    FA_CUDA_CHECK_LAUNCH("tma_store_kernel");
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    return copy_back(dst, out.size());
}

std::vector<int> mbarrier_round_trip() {
    cuda::DeviceBuffer<int> flags(64 * 3 * 4);
    FA_CUDA_CHECK(cudaMemset(flags.data(), 0x7F, 64 * 3 * 4 * sizeof(int)));
    mbarrier_kernel<<<1, 64>>>(flags.data());
    FA_CUDA_CHECK_LAUNCH("mbarrier_kernel");
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int> h(64 * 3 * 4);
    FA_CUDA_CHECK(cudaMemcpy(h.data(), flags.data(), h.size() * sizeof(int), cudaMemcpyDeviceToHost));
    return h;
}

std::vector<uint32_t> quad_transpose_words(const std::vector<uint32_t>& in) {
    cuda::DeviceBuffer<uint32_t> words(128);
    words.copy_from_host(in.data(), 128);
    quad_transpose_kernel<<<1, 32>>>(words.data());
    FA_CUDA_CHECK_LAUNCH("quad_transpose_kernel");
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint32_t> h(128);
    words.copy_to_host(h.data(), h.size());
    return h;
}

std::vector<int> warp_specialization_round_trip() {
    cuda::DeviceBuffer<int> codes(384);
    FA_CUDA_CHECK(cudaMemset(codes.data(), 0, 384 * sizeof(int)));
    warp_specialization_kernel<<<1, 384>>>(codes.data());
    FA_CUDA_CHECK_LAUNCH("warp_specialization_kernel");
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int> h(384);
    FA_CUDA_CHECK(cudaMemcpy(h.data(), codes.data(), h.size() * sizeof(int), cudaMemcpyDeviceToHost));
    return h;
}

std::vector<float> wgmma_product(cuda::DType dtype, int n, int k, bool rs, bool trans_b, const std::vector<float>& a,
                                 const std::vector<float>& b, bool swap_b_offsets) {
    const int swap = swap_b_offsets ? 1 : 0;
    if (dtype == cuda::DType::BF16) {
        return n == 64 ? run_wgmma_forms<__nv_bfloat16, 64>(k, rs, trans_b, swap, a, b)
                       : run_wgmma_forms<__nv_bfloat16, 128>(k, rs, trans_b, swap, a, b);
    }
    return n == 64 ? run_wgmma_forms<__half, 64>(k, rs, trans_b, swap, a, b)
                   : run_wgmma_forms<__half, 128>(k, rs, trans_b, swap, a, b);
}

}  // namespace fa::test::hopper
