#include "runner.cuh"

#include <algorithm>
#include <limits>

#include "../07_pipelined_fused_kernel/attention.cuh"
#include "../07_pipelined_fused_kernel/launch.cuh"
#include "../09_backward_kernel/attention.cuh"
#include "../09_backward_kernel/launch.cuh"
#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/half.hpp"
#include "fa/cuda/timing.hpp"

namespace fa::stage10 {

namespace {

// A float32 host tensor on the device, then rounded to T there: (total, heads, d) packed.
template <class T>
struct DevicePacked {
    cuda::DeviceBuffer<T> data;
    int64_t total = 0, heads = 0, d = 0;

    DevicePacked(int64_t total_, int64_t heads_, int64_t d_) : data(size_t(std::max<int64_t>(1, total_ * heads_ * d_))), total(total_), heads(heads_), d(d_) {}
    DevicePacked(const std::vector<float>& host, int64_t total_, int64_t heads_, int64_t d_) : DevicePacked(total_, heads_, d_) {
        if (host.empty()) return;
        cuda::DeviceBuffer<float> f(host.size());
        f.copy_from_host(host.data(), host.size());
        cuda::convert(make_packed_view<const float>(f.data(), total, heads, d), view());
        FA_CUDA_CHECK(cudaDeviceSynchronize());  // `f` is freed on return
    }
    View4<T> view() { return make_packed_view(data.data(), total, heads, d); }
    View4<const T> cview() const { return make_packed_view<const T>(data.data(), total, heads, d); }
    // Rows [row0, row0 + rows) as a dense batch of one: (1, heads, rows, d), the packed strides.
    View4<T> rows(int64_t row0, int64_t rows_) { return make_view(data.data() + row0 * heads * d, 1, heads, rows_, d, Layout::BNHD); }
    View4<const T> crows(int64_t row0, int64_t rows_) const {
        return make_view<const T>(data.data() + row0 * heads * d, 1, heads, rows_, d, Layout::BNHD);
    }
    // Widened back to float32 on the host, in the packed order.
    std::vector<float> to_host() const {
        const size_t n = size_t(total * heads * d);
        std::vector<float> out(n);
        if (n == 0) return out;
        cuda::DeviceBuffer<float> f(n);
        cuda::convert(cview(), make_packed_view(f.data(), total, heads, d));
        f.copy_to_host(out.data(), n);
        return out;
    }
};

cuda::DeviceBuffer<int32_t> ints_on_device(const std::vector<int32_t>& x) {
    cuda::DeviceBuffer<int32_t> d(x.size());
    d.copy_from_host(x.data(), x.size());
    return d;
}

std::vector<float> floats_to_host(const cuda::DeviceBuffer<float>& x, size_t n) {
    std::vector<float> out(n);
    if (n > 0) x.copy_to_host(out.data(), n);
    return out;
}

// The LSE (Hq, total_q) as the View3 (1, Hq, total_q), or the rows of one sequence of it.
View3<float> lse_rows(float* lse, const VarlenProblem& vp, int64_t row0, int64_t rows) {
    return {lse + row0, {1, vp.heads_q, rows}, {vp.heads_q * vp.total_q, vp.total_q, 1}};
}

// Everything a packed call reads and writes, on the device.
template <class T>
struct PackedCall {
    const VarlenProblem& vp;
    stage07::MaxSeqlens max;
    DevicePacked<T> q, k, v, o, dout, dq, dk, dv;
    cuda::DeviceBuffer<float> lse;
    cuda::DeviceBuffer<int32_t> cu_q, cu_k, fwd_schedule, bwd_schedule;
    stage09::Workspace workspace;

    PackedCall(const VarlenProblem& p, const Inputs& in, const HostTensor& d_out)
        : vp(p),
          max{p.max_seq_q(), p.max_seq_k()},
          q(in.q.storage, p.total_q, p.heads_q, p.head_dim),
          k(in.k.storage, p.total_k, p.heads_k, p.head_dim),
          v(in.v.storage, p.total_k, p.heads_k, p.head_dim),
          o(p.total_q, p.heads_q, p.head_dim),
          dout(d_out.storage, p.total_q, p.heads_q, p.head_dim),
          dq(p.total_q, p.heads_q, p.head_dim),
          dk(p.total_k, p.heads_k, p.head_dim),
          dv(p.total_k, p.heads_k, p.head_dim),
          lse(size_t(std::max<int64_t>(1, p.heads_q * p.total_q))),
          cu_q(ints_on_device(p.cu_seqlens_q)),
          cu_k(ints_on_device(p.cu_seqlens_k)),
          fwd_schedule(size_t(std::max<int64_t>(1, stage07::varlen_schedule_ints(p)))),
          bwd_schedule(size_t(std::max<int64_t>(1, stage09::varlen_backward_schedule_ints(p)))) {}

    void forward(cudaStream_t s) {
        stage07::attention_varlen_device(vp, max, q.cview(), k.cview(), v.cview(), o.view(), lse_rows(lse.data(), vp, 0, vp.total_q),
                                         stage07::VarlenDeviceArrays{cu_q.data(), cu_k.data(), fwd_schedule.data()}, s);
    }
    void backward(bool deterministic, cudaStream_t s) {
        const View3<float> l = lse_rows(lse.data(), vp, 0, vp.total_q);
        stage09::attention_backward_varlen_device(vp, max, q.cview(), k.cview(), v.cview(), o.cview(), View3<const float>{l.data, l.shape, l.stride},
                                                  dout.cview(), dq.view(), dk.view(), dv.view(),
                                                  stage09::VarlenBackwardArrays{cu_q.data(), cu_k.data(), bwd_schedule.data()},
                                                  deterministic, s, &workspace);
    }
};

template <class T>
RunResult run_packed_as(const VarlenProblem& vp, const Inputs& in, const HostTensor& dout, const RunSettings& s) {
    PackedCall<T> call(vp, in, dout);
    // Outputs filled with NaN (all bits set, in the 16-bit types and in float32), so that an
    // element the kernels forget to write cannot pass.
    for (DevicePacked<T>* t : {&call.o, &call.dq, &call.dk, &call.dv})
        FA_CUDA_CHECK(cudaMemset(t->data.data(), 0xff, t->data.bytes()));
    FA_CUDA_CHECK(cudaMemset(call.lse.data(), 0xff, call.lse.bytes()));
    call.forward(nullptr);
    if (s.backward) call.backward(s.deterministic, nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    RunResult r{call.o.to_host(), floats_to_host(call.lse, size_t(vp.heads_q * vp.total_q)), {}, {}, {}};
    if (s.backward) r.dq = call.dq.to_host(), r.dk = call.dk.to_host(), r.dv = call.dv.to_host();
    return r;
}

// k or v (1, Hk, total_k, d), stored packed (total_k, Hk, d), repeated per query head: (total_k, Hq,
// d), head h holding head h / (Hq/Hk).
std::vector<float> repeat_heads(const VarlenProblem& vp, const HostTensor& x) {
    const int64_t d = vp.head_dim, hq = vp.heads_q, hk = vp.heads_k;
    std::vector<float> r(size_t(vp.total_k * hq * d));
    for (int64_t t = 0; t < vp.total_k; ++t)
        for (int64_t h = 0; h < hq; ++h)
            for (int64_t e = 0; e < d; ++e) r[size_t((t * hq + h) * d + e)] = x.storage[size_t((t * hk + vp.kv_head(h)) * d + e)];
    return r;
}

// Gradients of the repeated heads (total_k, Hq, d) summed over each group: (total_k, Hk, d).
std::vector<float> sum_groups(const VarlenProblem& vp, const std::vector<float>& x) {
    const int64_t d = vp.head_dim, hq = vp.heads_q, hk = vp.heads_k;
    std::vector<float> r(size_t(vp.total_k * hk * d), 0.0f);
    for (int64_t t = 0; t < vp.total_k; ++t)
        for (int64_t h = 0; h < hq; ++h)
            for (int64_t e = 0; e < d; ++e) r[size_t((t * hk + vp.kv_head(h)) * d + e)] += x[size_t((t * hq + h) * d + e)];
    return r;
}

template <class T>
RunResult run_per_sequence_as(const VarlenProblem& vp, const Inputs& in, const HostTensor& dout_host, const RunSettings& s) {
    const int64_t hq = vp.heads_q, d = vp.head_dim;
    DevicePacked<T> q(in.q.storage, vp.total_q, hq, d), o(vp.total_q, hq, d), dout(dout_host.storage, vp.total_q, hq, d);
    DevicePacked<T> k(repeat_heads(vp, in.k), vp.total_k, hq, d), v(repeat_heads(vp, in.v), vp.total_k, hq, d);
    DevicePacked<T> dq(vp.total_q, hq, d), dk(vp.total_k, hq, d), dv(vp.total_k, hq, d);
    // Rows no dense call writes (sequences without keys or queries): the contract's values.
    for (DevicePacked<T>* t : {&o, &dq, &dk, &dv})
        if (t->total > 0) FA_CUDA_CHECK(cudaMemset(t->data.data(), 0, t->data.bytes()));
    std::vector<float> lse_init(size_t(hq * vp.total_q), -std::numeric_limits<float>::infinity());
    cuda::DeviceBuffer<float> lse(std::max<size_t>(1, lse_init.size()));
    if (!lse_init.empty()) lse.copy_from_host(lse_init.data(), lse_init.size());
    stage09::Workspace workspace;
    stage07::ModelOptions options;
    options.kv_heads = hq, options.window = vp.window, options.softcap = vp.softcap;  // no dropout: see the header
    for (int64_t b = 0; b < vp.batch(); ++b) {
        const int64_t nq = vp.seq_q(b), nk = vp.seq_k(b), q0 = vp.cu_seqlens_q[size_t(b)], k0 = vp.cu_seqlens_k[size_t(b)];
        if (nq == 0 || nk == 0) continue;
        Problem p;
        p.batch = 1, p.heads = hq, p.seq_q = nq, p.seq_k = nk, p.head_dim = d, p.scale = vp.scale, p.causal = false;
        const View3<float> l = lse_rows(lse.data(), vp, q0, nq);
        stage07::attention_device(p, options, q.crows(q0, nq), k.crows(k0, nk), v.crows(k0, nk), o.rows(q0, nq), l, nullptr);
        if (s.backward) {
            stage09::attention_backward_device(p, options, q.crows(q0, nq), k.crows(k0, nk), v.crows(k0, nk), o.crows(q0, nq),
                                               View3<const float>{l.data, l.shape, l.stride}, dout.crows(q0, nq), dq.rows(q0, nq),
                                               dk.rows(k0, nk), dv.rows(k0, nk), s.deterministic, nullptr, &workspace);
        }
    }
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    RunResult r{o.to_host(), floats_to_host(lse, lse_init.size()), {}, {}, {}};
    if (s.backward) r.dq = dq.to_host(), r.dk = sum_groups(vp, dk.to_host()), r.dv = sum_groups(vp, dv.to_host());
    return r;
}

template <class T>
PackedTimes bench_as(const VarlenProblem& vp, const Inputs& in, const HostTensor& dout, const RunSettings& s, int warmup, int repeat) {
    PackedTimes t;
    PackedCall<T> call(vp, in, dout);
    t.forward = cuda::time_on_gpu([&](cudaStream_t st) { call.forward(st); }, warmup, repeat);
    if (s.backward) t.backward = cuda::time_on_gpu([&](cudaStream_t st) { call.backward(s.deterministic, st); }, warmup, repeat);

    // The padded batch: B entries of the longest lengths, dense (B, Hq, max Nq, d) in BNHD (the
    // padded form of the packed buffers), zeros (the values do not change the work).
    Problem p;
    p.batch = vp.batch(), p.heads = vp.heads_q, p.seq_q = vp.max_seq_q(), p.seq_k = vp.max_seq_k(), p.head_dim = vp.head_dim;
    p.scale = vp.scale, p.causal = false;
    stage07::ModelOptions options;
    options.kv_heads = vp.heads_k, options.window = vp.window, options.softcap = vp.softcap, options.dropout = vp.dropout;
    const auto zeros = [](int64_t n) {
        cuda::DeviceBuffer<T> b(size_t(std::max<int64_t>(1, n)));
        FA_CUDA_CHECK(cudaMemset(b.data(), 0, b.bytes()));
        return b;
    };
    const int64_t qn = p.batch * p.heads * p.seq_q * p.head_dim, kn = p.batch * vp.heads_k * p.seq_k * p.head_dim;
    cuda::DeviceBuffer<T> q = zeros(qn), k = zeros(kn), v = zeros(kn), o = zeros(qn), dout_p = zeros(qn), dq = zeros(qn),
                          dk = zeros(kn), dv = zeros(kn);
    cuda::DeviceBuffer<float> lse(size_t(std::max<int64_t>(1, p.lse_elems())));
    const auto qv = [&](cuda::DeviceBuffer<T>& x) { return make_view(x.data(), p.batch, p.heads, p.seq_q, p.head_dim, Layout::BNHD); };
    const auto kv = [&](cuda::DeviceBuffer<T>& x) { return make_view(x.data(), p.batch, vp.heads_k, p.seq_k, p.head_dim, Layout::BNHD); };
    const auto c = [](View4<T> x) { return View4<const T>{x.data, x.shape, x.stride}; };
    const View3<float> l = make_view3(lse.data(), p.batch, p.heads, p.seq_q);
    const auto forward = [&](cudaStream_t st) { stage07::attention_device(p, options, c(qv(q)), c(kv(k)), c(kv(v)), qv(o), l, st); };
    t.padded_forward = cuda::time_on_gpu(forward, warmup, repeat);
    if (s.backward) {
        stage09::Workspace workspace;
        forward(nullptr);
        t.padded_backward = cuda::time_on_gpu(
            [&](cudaStream_t st) {
                stage09::attention_backward_device(p, options, c(qv(q)), c(kv(k)), c(kv(v)), c(qv(o)), View3<const float>{l.data, l.shape, l.stride},
                                                   c(qv(dout_p)), qv(dq), kv(dk), kv(dv), s.deterministic, st, &workspace);
            },
            warmup, repeat);
    }
    return t;
}

template <int D>
TileShape tile_of() {
    return {stage07::Tuned<D>::kBr, stage07::Tuned<D>::kBc};
}

}  // namespace

TileShape forward_tile(int64_t d) {
    switch (d) {
        case 32: return tile_of<32>();
        case 64: return tile_of<64>();
        case 128: return tile_of<128>();
        case 256: return tile_of<256>();
        default: throw InputError("stage 10: no forward tile for head dimension " + std::to_string(d));
    }
}

const std::vector<int>& forward_head_dims() { return stage07::supported_head_dims(); }
const std::vector<int>& backward_head_dims() { return stage09::supported_head_dims(); }

void check_backward(const VarlenProblem& problem) {
    try {
        stage09::resolve_varlen_backward(problem, stage09::MaxSeqlens{problem.max_seq_q(), problem.max_seq_k()});
    } catch (const InputError& e) {
        if (!problem.dropout.enabled()) throw;
        throw InputError(std::string(e.what()) + "; --forward-only runs stage 07's forward with dropout");
    }
}

RunResult run_packed(const VarlenProblem& vp, const Inputs& in, const HostTensor& dout, const RunSettings& s) {
    return s.precision == Precision::Float16 ? run_packed_as<__half>(vp, in, dout, s) : run_packed_as<__nv_bfloat16>(vp, in, dout, s);
}

RunResult run_per_sequence(const VarlenProblem& vp, const Inputs& in, const HostTensor& dout, const RunSettings& s) {
    return s.precision == Precision::Float16 ? run_per_sequence_as<__half>(vp, in, dout, s)
                                             : run_per_sequence_as<__nv_bfloat16>(vp, in, dout, s);
}

PackedTimes bench_packed(const VarlenProblem& vp, const Inputs& in, const HostTensor& dout, const RunSettings& s, int warmup,
                         int repeat) {
    return s.precision == Precision::Float16 ? bench_as<__half>(vp, in, dout, s, warmup, repeat)
                                             : bench_as<__nv_bfloat16>(vp, in, dout, s, warmup, repeat);
}

std::string describe_gpu() {
    const cuda::GpuInfo gpu = cuda::gpu_info();
    const int clock = cuda::current_sm_clock_mhz();
    std::string s = "gpu        " + gpu.describe() + "\n";
    s += clock > 0 ? "clock      SM clock " + std::to_string(clock) + " MHz right after the timed runs (NVML)"
                   : "clock      SM clock not readable here (no NVML); the device reports a " + std::to_string(gpu.max_sm_clock_mhz) +
                         " MHz peak";
    return s;
}

}  // namespace fa::stage10
