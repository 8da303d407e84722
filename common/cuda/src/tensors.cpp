#include "fa/cuda/tensors.hpp"

#include "fa/cuda/device.hpp"
#include "fa/error.hpp"

namespace fa::cuda {

namespace {

template <size_t Rank>
int64_t span(const std::array<int64_t, Rank>& shape, const std::array<int64_t, Rank>& stride) {
    int64_t last = 0;
    for (size_t i = 0; i < Rank; ++i) {
        if (shape[i] == 0) return 0;
        if (stride[i] < 0) throw InputError("tensor views with negative strides are not supported on the GPU");
        last += (shape[i] - 1) * stride[i];
    }
    return last + 1;
}

// A device view with the strides of `host`, over `device` memory.
template <class T, class U>
View4<T> like(const View4<U>& host, T* device) {
    return {device, host.shape, host.stride};
}
template <class T, class U>
View3<T> like(const View3<U>& host, T* device) {
    return {device, host.shape, host.stride};
}

}  // namespace

int64_t span_elements(const View4<const float>& view) { return span(view.shape, view.stride); }
int64_t span_elements(const View3<const float>& view) { return span(view.shape, view.stride); }

double DeviceTensors::bytes_needed(const Problem& p) {
    return 4.0 * (2.0 * double(p.q_elems()) + 2.0 * double(p.kv_elems()) + double(p.lse_elems()));
}

DeviceTensors::DeviceTensors(const Problem& p, View4<const float> q_host, View4<const float> k_host,
                             View4<const float> v_host, View4<const float> o_host, View3<const float> lse_host) {
    const int64_t nq = span_elements(q_host), nk = span_elements(k_host), nv = span_elements(v_host);
    const int64_t no = span_elements(o_host), nl = span_elements(lse_host);
    require_device_memory(4.0 * double(nq + nk + nv + no + nl), p.describe());
    q_ = DeviceBuffer<float>(size_t(nq));
    k_ = DeviceBuffer<float>(size_t(nk));
    v_ = DeviceBuffer<float>(size_t(nv));
    o_ = DeviceBuffer<float>(size_t(no));
    lse_ = DeviceBuffer<float>(size_t(nl));
    q_.copy_from_host(q_host.data, size_t(nq));
    k_.copy_from_host(k_host.data, size_t(nk));
    v_.copy_from_host(v_host.data, size_t(nv));
    o_.copy_from_host(o_host.data, size_t(no));
    lse_.copy_from_host(lse_host.data, size_t(nl));
    q = like<const float>(q_host, q_.data());
    k = like<const float>(k_host, k_.data());
    v = like<const float>(v_host, v_.data());
    o = like<float>(o_host, o_.data());
    lse = like<float>(lse_host, lse_.data());
}

DeviceTensors::DeviceTensors(const Problem& p, Layout layout, uint64_t seed) {
    require_device_memory(bytes_needed(p), p.describe());
    q_ = DeviceBuffer<float>(size_t(p.q_elems()));
    k_ = DeviceBuffer<float>(size_t(p.kv_elems()));
    v_ = DeviceBuffer<float>(size_t(p.kv_elems()));
    o_ = DeviceBuffer<float>(size_t(p.q_elems()));
    lse_ = DeviceBuffer<float>(size_t(p.lse_elems()));
    fill_normal(q_.data(), p.q_elems(), seed * 3 + 0, 1.0f);
    fill_normal(k_.data(), p.kv_elems(), seed * 3 + 1, 1.0f);
    fill_normal(v_.data(), p.kv_elems(), seed * 3 + 2, 1.0f);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    q = make_view<const float>(q_.data(), p.batch, p.heads, p.seq_q, p.head_dim, layout);
    k = make_view<const float>(k_.data(), p.batch, p.heads, p.seq_k, p.head_dim, layout);
    v = make_view<const float>(v_.data(), p.batch, p.heads, p.seq_k, p.head_dim, layout);
    o = make_view<float>(o_.data(), p.batch, p.heads, p.seq_q, p.head_dim, layout);
    lse = make_view3<float>(lse_.data(), p.batch, p.heads, p.seq_q);
}

void DeviceTensors::copy_outputs_to(View4<float> o_host, View3<float> lse_host) const {
    const int64_t no = span_elements(o_host), nl = span_elements(lse_host);
    if (no != int64_t(o_.size()) || nl != int64_t(lse_.size()) || o_host.stride != o.stride || lse_host.stride != lse.stride) {
        throw InputError("copy_outputs_to: the host views must have the shapes and strides of the device views");
    }
    o_.copy_to_host(o_host.data, size_t(no));
    lse_.copy_to_host(lse_host.data, size_t(nl));
}

}  // namespace fa::cuda
