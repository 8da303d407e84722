#include "decode.cuh"

#include <algorithm>
#include <climits>
#include <limits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/cuda/timing.hpp"
#include "fa/error.hpp"
#include "fa/cuda/ptx.cuh"
#include "kernel.cuh"

namespace fa::stage13 {

namespace {

template <class T, int D>
void launch_kernels(const DecodeArgs<T>& a, cudaStream_t stream) {
    if (a.append_rows > 0) {
        const int64_t blocks = std::min<int64_t>(ceil_div(append_chunks(a, D), kThreads), 1 << 20);  // a grid-stride loop past that
        append_kv_kernel<T, D><<<unsigned(blocks), kThreads, 0, stream>>>(a);
        FA_CUDA_CHECK_LAUNCH("stage 13 append_kv_kernel");
    }
    constexpr int kSmem = SplitShape<D>::kSmemBytes;
    cuda::allow_dynamic_shared_memory<decode_split_kernel<T, D>>(kSmem);
    decode_split_kernel<T, D><<<unsigned(split_grid(a)), kThreads, kSmem, stream>>>(a);
    FA_CUDA_CHECK_LAUNCH("stage 13 decode_split_kernel");
    if (a.splits > 1) {
        decode_combine_kernel<T, D><<<unsigned(combine_grid(a)), 32 * kCombineRowsPerBlock, 0, stream>>>(a);
        FA_CUDA_CHECK_LAUNCH("stage 13 decode_combine_kernel");
    }
}

// Host floats (already rounded) as the 16-bit bits of `precision`.
std::vector<uint16_t> to_bits(const std::vector<float>& x, Precision precision) {
    std::vector<uint16_t> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = precision == Precision::BFloat16 ? float_to_bf16_bits(x[i]) : float_to_fp16_bits(x[i]);
    return out;
}
std::vector<float> from_bits(const std::vector<uint16_t>& x, Precision precision) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = precision == Precision::BFloat16 ? bf16_bits_to_float(x[i]) : half_to_float(x[i]);
    return out;
}

template <class X>
cuda::DeviceBuffer<X> upload(const std::vector<X>& host) {
    cuda::DeviceBuffer<X> d(std::max<size_t>(1, host.size()));
    if (!host.empty()) d.copy_from_host(host.data(), host.size());
    return d;
}
template <class X>
std::vector<X> download(const cuda::DeviceBuffer<X>& d, size_t n) {
    std::vector<X> out(n);
    if (n > 0) d.copy_to_host(out.data(), n);
    return out;
}

// float32 pairs rounded to T, in place of a 16-bit buffer: the last step of generating inputs on the device.
template <class T>
__global__ void round_pairs_kernel(const float* from, uint32_t* to, int64_t pairs) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += int64_t(gridDim.x) * blockDim.x) {
        to[i] = cuda::ptx::pack2<T>(from[2 * i], from[2 * i + 1]);
    }
}

// `count` (even) seeded standard normal values in the 16-bit type of `precision`, drawn on the
// device a chunk at a time through a float32 scratch buffer (fa::cuda::fill_normal), so that a
// cache of many GiB never passes through the host.
void fill_normal_16bit(uint16_t* data, int64_t count, uint64_t seed, float stddev, Precision precision) {
    constexpr int64_t kChunk = int64_t(1) << 26;  // 256 MiB of float32 scratch
    cuda::DeviceBuffer<float> scratch(size_t(std::min(count, kChunk)));
    for (int64_t at = 0, part = 0; at < count; at += kChunk, ++part) {
        const int64_t n = std::min(kChunk, count - at);
        cuda::fill_normal(scratch.data(), n, seed * 1000003ull + uint64_t(part), stddev);
        const unsigned blocks = unsigned(std::min<int64_t>(ceil_div(n / 2, 256), 1 << 16));
        if (precision == Precision::BFloat16) {
            round_pairs_kernel<__nv_bfloat16><<<blocks, 256>>>(scratch.data(), reinterpret_cast<uint32_t*>(data + at), n / 2);
        } else {
            round_pairs_kernel<__half><<<blocks, 256>>>(scratch.data(), reinterpret_cast<uint32_t*>(data + at), n / 2);
        }
        FA_CUDA_CHECK_LAUNCH("stage 13 round_pairs_kernel");
    }
    FA_CUDA_CHECK(cudaDeviceSynchronize());  // `scratch` is freed on return
}

// Every buffer of one call on the device, in 16-bit bits.
struct DeviceCall {
    cuda::DeviceBuffer<uint16_t> q, k_new, v_new, k_cache, v_cache, o;
    cuda::DeviceBuffer<int32_t> block_table, cache_seqlens;
    cuda::DeviceBuffer<float> lse, o_partial, lse_partial;
    size_t cache_elems = 0, o_elems = 0, lse_elems = 0;

    DeviceCall(const DecodeProblem& p, const CacheGeometry& g, CacheKind kind, Precision precision, const DecodeInputs& in, int splits) {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        q = upload(to_bits(in.q, precision));
        k_new = upload(to_bits(in.k_new, precision));
        v_new = upload(to_bits(in.v_new, precision));
        const bool paged = kind == CacheKind::Paged;
        const std::vector<uint16_t> kc = to_bits(paged ? to_paged(p, g, in.k_cache, nan) : in.k_cache, precision);
        cache_elems = kc.size();
        k_cache = upload(kc);
        v_cache = upload(to_bits(paged ? to_paged(p, g, in.v_cache, nan) : in.v_cache, precision));
        block_table = upload(g.block_table);
        std::vector<int32_t> lens;
        for (int64_t len : p.cache_seqlens) lens.push_back(int32_t(len));
        cache_seqlens = upload(lens);
        o_elems = size_t(p.batch() * p.seq_q * p.heads_q * p.head_dim);
        lse_elems = size_t(p.batch() * p.heads_q * p.seq_q);
        o = cuda::DeviceBuffer<uint16_t>(std::max<size_t>(1, o_elems));
        FA_CUDA_CHECK(cudaMemset(o.data(), 0xff, o.bytes()));  // NaN: what the kernels forget to write shows
        lse = cuda::DeviceBuffer<float>(std::max<size_t>(1, lse_elems));
        FA_CUDA_CHECK(cudaMemset(lse.data(), 0xff, lse.bytes()));
        if (splits > 1) {
            o_partial = cuda::DeviceBuffer<float>(size_t(partial_o_floats(p, splits)));
            lse_partial = cuda::DeviceBuffer<float>(size_t(partial_lse_floats(p, splits)));
        }
    }

    // The same buffers with seeded normal values drawn on the device (for timing problems too large
    // for the host's float32 copies): q, the new rows and every row of the cache (rows no key
    // reaches are never read).
    DeviceCall(const DecodeProblem& p, const CacheGeometry& g, CacheKind kind, Precision precision, int splits, uint64_t seed) {
        const int64_t d = p.head_dim, row = p.heads_k * d;
        const int64_t q_elems = p.batch() * p.seq_q * p.heads_q * d, new_elems = p.append ? p.batch() * p.seq_q * row : 0;
        const int64_t cache_rows = kind == CacheKind::Paged ? g.num_pages * g.page_size : p.batch() * g.capacity();
        cache_elems = size_t(cache_rows * row);
        const auto make = [&](cuda::DeviceBuffer<uint16_t>& buffer, int64_t n, uint64_t stream_seed) {
            buffer = cuda::DeviceBuffer<uint16_t>(size_t(std::max<int64_t>(1, n)));
            if (n > 0) fill_normal_16bit(buffer.data(), n, stream_seed, 1.0f, precision);
        };
        make(q, q_elems, seed + 1), make(k_new, new_elems, seed + 2), make(v_new, new_elems, seed + 3);
        make(k_cache, int64_t(cache_elems), seed + 4), make(v_cache, int64_t(cache_elems), seed + 5);
        block_table = upload(g.block_table);
        std::vector<int32_t> lens;
        for (int64_t len : p.cache_seqlens) lens.push_back(int32_t(len));
        cache_seqlens = upload(lens);
        o_elems = size_t(q_elems);
        lse_elems = size_t(p.batch() * p.heads_q * p.seq_q);
        o = cuda::DeviceBuffer<uint16_t>(std::max<size_t>(1, o_elems));
        lse = cuda::DeviceBuffer<float>(std::max<size_t>(1, lse_elems));
        if (splits > 1) {
            o_partial = cuda::DeviceBuffer<float>(size_t(partial_o_floats(p, splits)));
            lse_partial = cuda::DeviceBuffer<float>(size_t(partial_lse_floats(p, splits)));
        }
    }

    template <class T>
    CallPointers<T> pointers(const DecodeProblem& p) const {
        CallPointers<T> c;
        c.q = reinterpret_cast<const T*>(q.data());
        c.k_new = p.append ? reinterpret_cast<const T*>(k_new.data()) : nullptr;
        c.v_new = p.append ? reinterpret_cast<const T*>(v_new.data()) : nullptr;
        c.k_cache = reinterpret_cast<T*>(k_cache.data()), c.v_cache = reinterpret_cast<T*>(v_cache.data());
        c.block_table = block_table.data(), c.cache_seqlens = cache_seqlens.data();
        c.o = reinterpret_cast<T*>(o.data()), c.lse = lse.data(), c.o_partial = o_partial.data(), c.lse_partial = lse_partial.data();
        return c;
    }
};

void launch_call(const DecodeProblem& p, const CacheGeometry& g, CacheKind kind, Precision precision, const DeviceCall& call, int splits,
                 cudaStream_t stream) {
    if (precision == Precision::BFloat16) {
        decode_device<__nv_bfloat16>(p, g, kind, splits, call.pointers<__nv_bfloat16>(p), stream);
    } else {
        decode_device<__half>(p, g, kind, splits, call.pointers<__half>(p), stream);
    }
}

void require_16_bit(Precision precision) {
    if (precision != Precision::BFloat16 && precision != Precision::Float16) {
        throw InputError("stage 13 computes in bf16 or fp16: --dtype bf16 or fp16");
    }
}

}  // namespace

std::string to_string(CacheKind kind) { return kind == CacheKind::Paged ? "paged" : "contiguous"; }

int split_blocks_per_sm(int64_t d) {
    int blocks = 0;
    if (d == 64) {
        cuda::allow_dynamic_shared_memory<decode_split_kernel<__nv_bfloat16, 64>>(SplitShape<64>::kSmemBytes);
        FA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, decode_split_kernel<__nv_bfloat16, 64>, kThreads,
                                                                    SplitShape<64>::kSmemBytes));
    } else {
        cuda::allow_dynamic_shared_memory<decode_split_kernel<__nv_bfloat16, 128>>(SplitShape<128>::kSmemBytes);
        FA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, decode_split_kernel<__nv_bfloat16, 128>, kThreads,
                                                                    SplitShape<128>::kSmemBytes));
    }
    return std::max(1, blocks);
}

SplitChoice choose_splits_here(const DecodeProblem& p, int forced) {
    return choose_splits(p, cuda::gpu_info().sm_count, split_blocks_per_sm(p.head_dim), forced);
}

template <class T>
void decode_device(const DecodeProblem& p, const CacheGeometry& g, CacheKind kind, int splits, const CallPointers<T>& c,
                   cudaStream_t stream) {
    if (splits < 1 || splits > kMaxSplits) {
        throw InputError("stage 13: " + std::to_string(splits) + " splits: use 1 to " + std::to_string(kMaxSplits));
    }
    const DecodeArgs<T> a = make_decode_args<T>(p, g, kind, splits, c);
    if (split_grid(a) > INT32_MAX || combine_grid(a) > INT32_MAX) {
        throw InputError("stage 13: " + std::to_string(split_grid(a)) + " blocks (B x Hk x row tiles x splits): at most 2^31 - 1");
    }
    if (p.head_dim == 64) {
        launch_kernels<T, 64>(a, stream);
    } else if (p.head_dim == 128) {
        launch_kernels<T, 128>(a, stream);
    } else {
        throw InputError("--head-dim " + std::to_string(p.head_dim) + " is not supported by stage 13: use 64 or 128");
    }
}

template void decode_device<__nv_bfloat16>(const DecodeProblem&, const CacheGeometry&, CacheKind, int, const CallPointers<__nv_bfloat16>&,
                                           cudaStream_t);
template void decode_device<__half>(const DecodeProblem&, const CacheGeometry&, CacheKind, int, const CallPointers<__half>&, cudaStream_t);

DecodeOutput run_decode(const DecodeProblem& p, const CacheGeometry& g, CacheKind kind, Precision precision, const DecodeInputs& in,
                        int splits) {
    require_16_bit(precision);
    DeviceCall call(p, g, kind, precision, in, splits);
    launch_call(p, g, kind, precision, call, splits, nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    DecodeOutput out;
    out.o = from_bits(download(call.o, call.o_elems), precision);
    out.lse = download(call.lse, call.lse_elems);
    out.k_cache = from_bits(download(call.k_cache, call.cache_elems), precision);
    out.v_cache = from_bits(download(call.v_cache, call.cache_elems), precision);
    if (kind == CacheKind::Paged) out.k_cache = from_paged(p, g, out.k_cache), out.v_cache = from_paged(p, g, out.v_cache);
    return out;
}

TimingStats bench_decode(const DecodeProblem& p, const CacheGeometry& g, CacheKind kind, Precision precision, const DecodeInputs& in,
                         int splits, int warmup, int repeat) {
    require_16_bit(precision);
    DeviceCall call(p, g, kind, precision, in, splits);
    return cuda::time_on_gpu([&](cudaStream_t s) { launch_call(p, g, kind, precision, call, splits, s); }, warmup, repeat);
}

TimingStats bench_decode_generated(const DecodeProblem& p, const CacheGeometry& g, CacheKind kind, Precision precision, int splits,
                                   uint64_t seed, int warmup, int repeat) {
    require_16_bit(precision);
    DeviceCall call(p, g, kind, precision, splits, seed);
    return cuda::time_on_gpu([&](cudaStream_t s) { launch_call(p, g, kind, precision, call, splits, s); }, warmup, repeat);
}

std::string describe_gpu() {
    const int clock = cuda::current_sm_clock_mhz();
    return "gpu        " + cuda::gpu_info().describe() + "\nclock      SM " + (clock > 0 ? std::to_string(clock) + " MHz" : std::string("unknown")) +
           " just after the timed runs";
}

}  // namespace fa::stage13
