/// \file fa/cuda/backward_bench.hpp
/// \brief --bench of a 16-bit backward stage (09, 12): q, k, v, O and dO copied to the device and
/// rounded to T once, the outputs allocated once, then only the backward's kernels timed.
#pragma once

#include <algorithm>

#include <cuda_runtime.h>

#include "fa/cuda/buffer.hpp"
#include "fa/cuda/half.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/cuda/timing.hpp"
#include "fa/stage.hpp"

namespace fa::cuda {

/// What a backward's device entry point reads and writes, in T on the device (L in float32).
template <class T>
struct BackwardViews {
    View4<const T> q;         ///< (B, H, Nq, d)
    View4<const T> k;         ///< (B, H, Nk, d)
    View4<const T> v;         ///< (B, H, Nk, d)
    View4<const T> o;         ///< the forward's output, rounded to T
    View3<const float> lse;   ///< the forward's log-sum-exp, (B, H, Nq)
    View4<const T> dout;      ///< dO, rounded to T
    View4<T> dq;              ///< written by the backward
    View4<T> dk;              ///< written by the backward
    View4<T> dv;              ///< written by the backward
};

/// Times `run(views, stream)`, the backward's kernels, with time_on_gpu() (CUDA events, warm-up,
/// L2 flushed, median) on the inputs and the forward's `o` and `lse` rounded to T once before.
template <class T, class Run>
TimingStats time_backward_half(const Problem& p, const Inputs& in, View4<const float> o, View3<const float> lse,
                               View4<const float> dout, const CommonOptions& opt, Run run) {
    DeviceTensors dev(p, in.q.cview(), in.k.cview(), in.v.cview(), o, lse);
    HalfTensors<T> half(p, opt.layout);
    half.load(dev.q, dev.k, dev.v);
    convert(View4<const float>(dev.o), half.o);
    DeviceBuffer<float> dout_f32(size_t(span_elements(dout)));
    dout_f32.copy_from_host(dout.data, dout_f32.size());
    DeviceBuffer<T> dout_buf(size_t(p.q_elems())), dq_buf(size_t(p.q_elems()));
    DeviceBuffer<T> dk_buf(size_t(p.kv_elems())), dv_buf(size_t(p.kv_elems()));
    const auto view = [&](T* data, int64_t n) { return make_view<T>(data, p.batch, p.heads, n, p.head_dim, opt.layout); };
    convert(View4<const float>{dout_f32.data(), dout.shape, dout.stride}, view(dout_buf.data(), p.seq_q));
    const BackwardViews<T> views{half.q, half.k, half.v, View4<const T>(half.o), View3<const float>(dev.lse),
                                 View4<const T>(view(dout_buf.data(), p.seq_q)), view(dq_buf.data(), p.seq_q),
                                 view(dk_buf.data(), p.seq_k), view(dv_buf.data(), p.seq_k)};
    return time_on_gpu([&](cudaStream_t s) { run(views, s); }, std::max(opt.warmup, 1), opt.repeat);
}

}  // namespace fa::cuda
