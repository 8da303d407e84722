#include "fa/cuda/half.hpp"

#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/round.cuh"
#include "fa/error.hpp"

namespace fa::cuda {

std::string to_string(DType dtype) { return dtype == DType::BF16 ? "bf16" : "fp16"; }

namespace {

// A view with plain arrays: std::array's members are host functions, not callable in a kernel.
template <class T>
struct Plain4 {
    T* data;
    int64_t shape[4], stride[4];
    __device__ T& at(int64_t b, int64_t h, int64_t n, int64_t x) const {
        return data[b * stride[0] + h * stride[1] + n * stride[2] + x * stride[3]];
    }
};

template <class T>
Plain4<T> plain(const View4<T>& v) {
    Plain4<T> p{v.data, {}, {}};
    for (int i = 0; i < 4; ++i) p.shape[i] = v.shape[i], p.stride[i] = v.stride[i];
    return p;
}

// One thread per element in logical (b, h, n, x) order, each side through its own strides.
template <class Src, class Dst>
__global__ void convert_kernel(Plain4<const Src> src, Plain4<Dst> dst, int64_t count) {
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += step) {
        const int64_t x = i % src.shape[3], n = i / src.shape[3] % src.shape[2];
        const int64_t h = i / src.shape[3] / src.shape[2] % src.shape[1], b = i / src.shape[3] / src.shape[2] / src.shape[1];
        dst.at(b, h, n, x) = from_float<Dst>(to_float(src.at(b, h, n, x)));
    }
}

template <class Src, class Dst>
void convert_any(View4<const Src> src, View4<Dst> dst, cudaStream_t stream) {
    if (src.shape != dst.shape) throw InputError("convert: the two views must have the same shape");
    const int64_t count = src.shape[0] * src.shape[1] * src.shape[2] * src.shape[3];
    if (count == 0) return;
    const int threads = 256;
    const int64_t wanted = (count + threads - 1) / threads;
    convert_kernel<Src, Dst><<<unsigned(wanted < 65536 ? wanted : 65536), threads, 0, stream>>>(plain(src), plain(dst), count);
    FA_CUDA_CHECK_LAUNCH("convert_kernel");
}

}  // namespace

void convert(View4<const float> src, View4<__nv_bfloat16> dst, cudaStream_t s) { convert_any(src, dst, s); }
void convert(View4<const float> src, View4<__half> dst, cudaStream_t s) { convert_any(src, dst, s); }
void convert(View4<const __nv_bfloat16> src, View4<float> dst, cudaStream_t s) { convert_any(src, dst, s); }
void convert(View4<const __half> src, View4<float> dst, cudaStream_t s) { convert_any(src, dst, s); }

template <class T>
HalfTensors<T>::HalfTensors(const Problem& p, Layout layout) {
    require_device_memory(2.0 * (2.0 * double(p.q_elems()) + 2.0 * double(p.kv_elems())), p.describe());
    q_ = DeviceBuffer<T>(size_t(p.q_elems()));
    k_ = DeviceBuffer<T>(size_t(p.kv_elems()));
    v_ = DeviceBuffer<T>(size_t(p.kv_elems()));
    o_ = DeviceBuffer<T>(size_t(p.q_elems()));
    FA_CUDA_CHECK(cudaMemset(o_.data(), 0xff, o_.bytes()));  // all bits set: NaN in bf16 and fp16
    q = make_view<const T>(q_.data(), p.batch, p.heads, p.seq_q, p.head_dim, layout);
    k = make_view<const T>(k_.data(), p.batch, p.heads, p.seq_k, p.head_dim, layout);
    v = make_view<const T>(v_.data(), p.batch, p.heads, p.seq_k, p.head_dim, layout);
    o = make_view<T>(o_.data(), p.batch, p.heads, p.seq_q, p.head_dim, layout);
}

template <class T>
void HalfTensors<T>::load(View4<const float> q_f32, View4<const float> k_f32, View4<const float> v_f32, cudaStream_t s) {
    convert(q_f32, View4<T>{q_.data(), q.shape, q.stride}, s);
    convert(k_f32, View4<T>{k_.data(), k.shape, k.stride}, s);
    convert(v_f32, View4<T>{v_.data(), v.shape, v.stride}, s);
}

template class HalfTensors<__nv_bfloat16>;
template class HalfTensors<__half>;

}  // namespace fa::cuda
