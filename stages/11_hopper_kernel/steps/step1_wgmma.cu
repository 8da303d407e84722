/// \file stages/11_hopper_kernel/steps/step1_wgmma.cu
/// \brief Stage 11, step 1 on its own: stage 07's kernel with wgmma in place of mma.sync.
///
/// Over stage 07: one *consumer warpgroup* (4 warps, 128 threads) owns 64 query rows. Per K/V
/// tile it issues S = Q K^T as d/16 wgmma with Q and K both read from shared memory through
/// descriptors, runs the online softmax in registers, and issues O += P V as Bc/16 wgmma with P
/// from registers and V read transposed. The tiles still arrive by cp.async (every thread copies),
/// into the 128-byte swizzle that wgmma reads, a ring of two slots. The switch kernel's step 1.
#include "common.cuh"
#include "fa/cuda/check.hpp"
#include "fa/cuda/mbarrier.cuh"  // fence_proxy_async
#include "steps.cuh"

namespace fa::stage11::step1 {

using namespace fa::stage11::steps;

constexpr char kStep[] = "stage 11 step 1";  ///< names the step in messages

/// The block's shape: Br = 64 query rows per consumer warpgroup, Bc keys per K/V tile.
template <int D>
struct Shape {
    static constexpr int kConsumers = 1;                    ///< consumer warpgroups
    static constexpr int kBr = 64 * kConsumers, kBc = 128;  ///< query rows per block, keys per tile
    static constexpr int kStages = 2;                       ///< slots of the ring, each a K and a V tile
    static constexpr int kThreads = 128 * kConsumers;       ///< threads per block
    static constexpr int kQBytes = kBr * D * 2, kKVBytes = kBc * D * 2;  ///< the Q tile, one K (or V) tile
    /// 1024 bytes to align the tiles (the swizzle's atom), Q, the ring.
    static constexpr int kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVBytes;
};

/// What the kernel reads: CommonArgs, and Q, K and V (B, H, N, d) in global memory (strides in
/// elements: batch, head, row; the features contiguous).
template <class T>
struct Args : CommonArgs<T> {
    const T *q, *k, *v;
    int64_t q_s[3], k_s[3], v_s[3];  ///< strides of q, k, v
};

/// Copies rows [row0, row0 + kRows) of a [n_rows, D] matrix into `tile`, in the layout the TMA
/// would leave (D/64 swizzled boxes [kRows, 64]), 16 bytes per cp.async; rows past n_rows are zero.
template <class T, int D, int kRows>
__device__ __forceinline__ void load_tile(unsigned char* tile, const T* gmem, int64_t row_stride, int row0, int n_rows, int thread) {
    const uint32_t base = smem_address(tile);
    for (int i = thread; i < kRows * D / 8; i += Shape<D>::kThreads) {
        const int r = i / (D / 8), c = i % (D / 8) * 8;
        const bool valid = row0 + r < n_rows;
        cp_async_16(base + wl::tile_offset(kRows, r, c), valid ? gmem + int64_t(row0 + r) * row_stride + c : gmem, valid);
    }
}

//! [consume_tile]
/// One K/V tile for the consumer warpgroup, one thing after the other: S = Q K^T, the softmax, O += P V.
template <class T, int D>
__device__ __forceinline__ void consume_tile(ConsumerState<D>& st, uint32_t q_rows, uint32_t k_tile, uint32_t v_tile, int tile,
                                             int full, int row_lo, const Args<T>& a, int thread) {
    using S = Shape<D>;
    float s[S::kBc / 2], alpha[2];
    uint32_t p[S::kBc / 16][4];
    wgmma_fence();  // s is free for the wgmma to write
    issue_s<T, D, S::kBr, S::kBc>(s, q_rows, k_tile);
    wgmma_commit_group();
    wgmma_wait_group<0>();  // S is in registers
    warpgroup_fence_operands(s);
    softmax_tile<S::kBc>(st, s, alpha, tile, full, row_lo, a, thread);
    rescale_o<D>(st.o, alpha);
    pack_p<T, S::kBc>(s, p);
    wgmma_fence();  // O was rescaled and P written by ordinary instructions
    issue_pv<T, D, S::kBc>(st.o, p, v_tile);
    wgmma_commit_group();
    wgmma_wait_group<0>();  // O is in registers, and the slot is no longer read
    warpgroup_fence_operands(st.o);
}
//! [consume_tile]

//! [kernel]
/// The forward pass of one query tile of one (batch, head): block i runs work item i.
template <class T, int D>
__global__ void __launch_bounds__(Shape<D>::kThreads, 1) attention_kernel(const __grid_constant__ Args<T> a) {
    using S = Shape<D>;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* q_tile = smem_raw + (1024u - smem_address(smem_raw) % 1024u) % 1024u;  // [Br, d]: d/64 boxes [Br, 64]
    unsigned char* kv_ring = q_tile + S::kQBytes;  // kStages x (K [Bc, d], V [Bc, d])
    const Item it = work_item<S::kBr, S::kBc>(blockIdx.x, a);
    const int thread = int(threadIdx.x), consumer = thread / 128, ct = thread % 128;
    const int row_lo = it.q0 + 64 * consumer + 16 * (ct / 32) + ct % 32 / 4;  // row g of this warp; g + 8 is the other
    const uint32_t q_rows = smem_address(q_tile) + uint32_t(consumer) * 64 * 128;  // this warpgroup's 64 rows of Q
    ConsumerState<D> st;
    st.clear();
    if (it.end > 0) {
        //! [mainloop]
        // Every thread copies with cp.async (stage 07's loads); K/V tile j goes to slot j % kStages.
        const auto load_kv = [&](int tile) {
            unsigned char* k_dst = kv_ring + 2 * (tile % S::kStages) * S::kKVBytes;
            load_tile<T, D, S::kBc>(k_dst, a.k + it.b * a.k_s[0] + it.h * a.k_s[1], a.k_s[2], tile * S::kBc, a.seq_k, thread);
            load_tile<T, D, S::kBc>(k_dst + S::kKVBytes, a.v + it.b * a.v_s[0] + it.h * a.v_s[1], a.v_s[2], tile * S::kBc, a.seq_k, thread);
        };
        load_tile<T, D, S::kBr>(q_tile, a.q + it.b * a.q_s[0] + it.h * a.q_s[1], a.q_s[2], it.q0, a.seq_q, thread);
        for (int i = 0; i < S::kStages - 1; ++i) {
            if (i < it.end) load_kv(i);
            cp_async_commit();  // Q travels in group 0; empty groups keep the count uniform
        }
        for (int tile = 0; tile < it.end; ++tile) {
            cp_async_wait<S::kStages - 2>();  // this thread's copies of `tile` have landed ...
            fence_proxy_async();               // ... and are visible to the wgmma (the async proxy)
            __syncthreads();  // every thread's copies are in, and every wgmma of tile - 1 is done: its slot is free
            if (tile + S::kStages - 1 < it.end) load_kv(tile + S::kStages - 1);
            cp_async_commit();
            const uint32_t k_tile = smem_address(kv_ring + 2 * (tile % S::kStages) * S::kKVBytes);
            consume_tile<T, D>(st, q_rows, k_tile, k_tile + S::kKVBytes, tile, it.full, row_lo, a, ct);
        }
        cp_async_wait<0>();  // nothing may still be landing when the block exits
        //! [mainloop]
    }
    write_output<T, D>(st, a, it.b, it.h, row_lo, ct);
}
//! [kernel]

//! [launch]
/// Fills the kernel's arguments.
template <class T, int D>
void fill_args(Args<T>& a, const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<T> o, View3<float> lse) {
    a.q = q.data, a.k = k.data, a.v = v.data;
    for (int i = 0; i < 3; ++i) a.q_s[i] = q.stride[i], a.k_s[i] = k.stride[i], a.v_s[i] = v.stride[i];
    fill_common(a, p, o, lse, Shape<D>::kBr);
}

#if !defined(FA_WARP_EMULATOR)  // the warp emulator runs the kernel with fill_args()' arguments itself
/// Launches one block per query tile and head.
template <class T, int D>
void launch(const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<T> o, View3<float> lse, cudaStream_t stream) {
    using S = Shape<D>;
    Args<T> a{};
    fill_args<T, D>(a, p, q, k, v, o, lse);
    cuda::allow_dynamic_shared_memory<attention_kernel<T, D>>(S::kSmemBytes);
    attention_kernel<T, D><<<unsigned(a.q_tiles * p.batch * p.heads), S::kThreads, S::kSmemBytes, stream>>>(a);
    FA_CUDA_CHECK_LAUNCH(std::string(kStep) + " attention_kernel<d=" + std::to_string(D) + ">");
}

void attention_device(const Problem& p, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k, View4<const __nv_bfloat16> v,
                      View4<__nv_bfloat16> o, View3<float> lse, cudaStream_t stream) {
    check_problem(p, q, k, v, o, kStep);
    p.head_dim == 64 ? launch<__nv_bfloat16, 64>(p, q, k, v, o, lse, stream) : launch<__nv_bfloat16, 128>(p, q, k, v, o, lse, stream);
}

void attention_device(const Problem& p, View4<const __half> q, View4<const __half> k, View4<const __half> v, View4<__half> o,
                      View3<float> lse, cudaStream_t stream) {
    check_problem(p, q, k, v, o, kStep);
    p.head_dim == 64 ? launch<__half, 64>(p, q, k, v, o, lse, stream) : launch<__half, 128>(p, q, k, v, o, lse, stream);
}
#endif
//! [launch]

}  // namespace fa::stage11::step1
