// Stage 09: the backward kernels' instances, the workspace, and the device and host entry points.
#include "attention.cuh"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/error.hpp"
#include "launch.cuh"

namespace fa::stage09 {

namespace {

/// The step that runs for `step` (-1: kDefaultStep); throws for a step that does not exist.
int resolve_step(int step) {
    const int steps = int(road().size());
    if (step < -1 || step >= steps) {
        throw InputError("--step " + std::to_string(step) + " does not exist: stage 09 has steps 0 to " +
                         std::to_string(steps - 1));
    }
    return step < 0 ? kDefaultStep : step;
}

Geometry geometry(int64_t d, int step) {
    step = resolve_step(step);
    switch (d) {
        case 32: return geometry_for<32>(step);
        case 64: return geometry_for<64>(step);
        default: return geometry_for<128>(step);
    }
}

/// Sizes every kernel derives from the problem and the block shape of `step`.
Counts counts(const Problem& p, int step) { return stage09::counts(p, geometry(p.head_dim, step)); }

/// Floats of Workspace::floats for `step`, for a call without stage 10's options (no group split).
int64_t workspace_floats(const Problem& p, int step) {
    return stage09::workspace_floats(p, geometry(p.head_dim, step));
}

template <class T>
void require_device_view(const char* name, const View4<T>& view, int64_t rows, const Problem& p) {
    if (view.shape[0] != p.batch || view.shape[1] != p.heads || view.shape[2] != rows || view.shape[3] != p.head_dim) {
        throw InputError(std::string("stage 09: ") + name + " does not have the problem's shape (B, H, " +
                         (rows == p.seq_q ? "Nq" : "Nk") + ", d)");
    }
    cuda::require_16_byte_rows("stage 09", name, view);
}

//! [run_for_d]
/// The backward for one (T, D): the workspace (grown if needed), then stage 09's launch sequence
/// (launch.cuh: preprocess, the main kernel of `step`, postprocess) on `stream`.
template <class T, int D>
void run_for_d(const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<const T> o,
               View3<const float> lse, View4<const T> dout, View4<T> dq, View4<T> dk, View4<T> dv, bool deterministic,
               cudaStream_t stream, Workspace& ws, int step) {
    step = resolve_step(step);
    const Geometry geo = geometry(D, step);
    const Counts c = stage09::counts(p, geo);
    const size_t floats = size_t(stage09::workspace_floats(p, geo));
    if (ws.floats.size() < floats) ws.floats = cuda::DeviceBuffer<float>(floats);
    if (deterministic && ws.turns.size() < size_t(c.batch_heads * c.q_blocks)) {
        ws.turns = cuda::DeviceBuffer<int>(size_t(c.batch_heads * c.q_blocks));
    }
    const Launches<T> launches = make_launches<T, D>(p, q, k, v, o, lse, dout, dq, dk, dv, ws.floats.data(),
                                                     deterministic ? ws.turns.data() : nullptr, geo);
    const auto launch = [&](auto kernel, const char* name, int64_t blocks, int threads, size_t smem, const auto& args) {
        if (smem > 0) cuda::allow_dynamic_shared_memory<decltype(kernel)::value>(smem);
        decltype(kernel)::value<<<unsigned(blocks), unsigned(threads), smem, stream>>>(args);
        FA_CUDA_CHECK_LAUNCH("stage09 " + std::string(name) + "<d=" + std::to_string(D) + ", step " + std::to_string(step) +
                             (deterministic ? ", deterministic>" : ">"));
    };
    if (deterministic) {
        run_kernels<T, D, true>(launches, step, launch);
    } else {
        run_kernels<T, D, false>(launches, step, launch);
    }
}
//! [run_for_d]

template <class T>
void run_device(const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<const T> o,
                View3<const float> lse, View4<const T> dout, View4<T> dq, View4<T> dk, View4<T> dv, bool deterministic,
                cudaStream_t stream, Workspace* workspace, int step) {
    p.validate();
    check_supported(p, step);
    require_device_view("q", q, p.seq_q, p);
    require_device_view("k", k, p.seq_k, p);
    require_device_view("v", v, p.seq_k, p);
    require_device_view("o", o, p.seq_q, p);
    require_device_view("dout", dout, p.seq_q, p);
    require_device_view("dq", dq, p.seq_q, p);
    require_device_view("dk", dk, p.seq_k, p);
    require_device_view("dv", dv, p.seq_k, p);
    if (lse.shape[0] != p.batch || lse.shape[1] != p.heads || lse.shape[2] != p.seq_q) {
        throw InputError("stage 09: lse does not have the problem's shape (B, H, Nq)");
    }
    Workspace own;
    Workspace& ws = workspace != nullptr ? *workspace : own;
    switch (p.head_dim) {
        case 32: run_for_d<T, 32>(p, q, k, v, o, lse, dout, dq, dk, dv, deterministic, stream, ws, step); break;
        case 64: run_for_d<T, 64>(p, q, k, v, o, lse, dout, dq, dk, dv, deterministic, stream, ws, step); break;
        default: run_for_d<T, 128>(p, q, k, v, o, lse, dout, dq, dk, dv, deterministic, stream, ws, step); break;
    }
    // A workspace made for this call is freed on return: the kernels must be done with it.
    if (workspace == nullptr) FA_CUDA_CHECK(cudaStreamSynchronize(stream));
}


/// The SMs of the current device: the group split's rule (group_split_rule()) fills them.
int sm_count() {
    int device = 0, sms = 0;
    FA_CUDA_CHECK(cudaGetDevice(&device));
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return sms;
}

static_assert(kModelStep == kDefaultStep, "stage 10's switches are on the default main kernel (launch.cuh's kModelStep)");

/// A device view with `heads` heads and `rows` rows per head, or InputError naming what it has.
template <class T>
void require_model_view(const char* name, const View4<T>& view, const Problem& p, int64_t heads, int64_t rows,
                        const char* shape) {
    if (view.shape[0] != p.batch || view.shape[1] != heads || view.shape[2] != rows || view.shape[3] != p.head_dim) {
        throw InputError(std::string("stage 09: ") + name + " must be " + shape + " = (" + std::to_string(p.batch) + ", " +
                         std::to_string(heads) + ", " + std::to_string(rows) + ", " + std::to_string(p.head_dim) + "); got (" +
                         std::to_string(view.shape[0]) + ", " + std::to_string(view.shape[1]) + ", " +
                         std::to_string(view.shape[2]) + ", " + std::to_string(view.shape[3]) + ")");
    }
    cuda::require_16_byte_rows("stage 09", name, view);
}

/// The backward with stage 10's options for one (T, D): as run_for_d, with the launches and the
/// main kernel of the options.
template <class T, int D>
void run_model_for_d(const Problem& p, const ResolvedOptions& m, View4<const T> q, View4<const T> k, View4<const T> v,
                     View4<const T> o, View3<const float> lse, View4<const T> dout, View4<T> dq, View4<T> dk, View4<T> dv,
                     bool deterministic, cudaStream_t stream, Workspace& ws) {
    const Geometry geo = geometry(D, kDefaultStep);
    const Counts c = stage09::counts(p, geo);
    const int split = group_split(c.batch_heads / m.kv_group * c.k_blocks, m.kv_group, c.q_blocks, deterministic,
                                  sm_count(), group_split_from_environment());
    const size_t floats = size_t(stage09::workspace_floats(p, geo, 0, m.kv_group, split));
    if (ws.floats.size() < floats) ws.floats = cuda::DeviceBuffer<float>(floats);
    if (deterministic && ws.turns.size() < size_t(c.batch_heads * c.q_blocks)) {
        ws.turns = cuda::DeviceBuffer<int>(size_t(c.batch_heads * c.q_blocks));
    }
    const Launches<T> launches = make_launches<T, D>(p, m, q, k, v, o, lse, dout, dq, dk, dv, ws.floats.data(),
                                                     deterministic ? ws.turns.data() : nullptr, geo, 0, split);
    const auto launch = [&](auto kernel, const char* name, int64_t blocks, int threads, size_t smem, const auto& args) {
        if (smem > 0) cuda::allow_dynamic_shared_memory<decltype(kernel)::value>(smem);
        decltype(kernel)::value<<<unsigned(blocks), unsigned(threads), smem, stream>>>(args);
        FA_CUDA_CHECK_LAUNCH("stage09 " + std::string(name) + "<d=" + std::to_string(D) + ", stage 10's switches" +
                             (deterministic ? ", deterministic>" : ">"));
    };
    if (deterministic) {
        run_model_kernels<T, D, true>(launches, m, launch);
    } else {
        run_model_kernels<T, D, false>(launches, m, launch);
    }
}

template <class T>
void run_model_device(const Problem& p, const ModelOptions& options, View4<const T> q, View4<const T> k, View4<const T> v,
                      View4<const T> o, View3<const float> lse, View4<const T> dout, View4<T> dq, View4<T> dk,
                      View4<T> dv, bool deterministic, cudaStream_t stream, Workspace* workspace, int step) {
    p.validate();
    check_supported(p, step);
    const ResolvedOptions m = resolve_backward_options(p, options, resolve_step(step));
    if (m.plain()) {  // exactly the call without options, the window (-1, 0) being the causal mask
        Problem plain = p;
        plain.causal = p.causal || m.right == 0;
        run_device<T>(plain, q, k, v, o, lse, dout, dq, dk, dv, deterministic, stream, workspace, step);
        return;
    }
    const int64_t hq = p.heads, hk = p.heads / m.kv_group;
    require_model_view("q", q, p, hq, p.seq_q, "(B, Hq, Nq, d)");
    require_model_view("k", k, p, hk, p.seq_k, "(B, Hk, Nk, d)");
    require_model_view("v", v, p, hk, p.seq_k, "(B, Hk, Nk, d)");
    require_model_view("o", o, p, hq, p.seq_q, "(B, Hq, Nq, d)");
    require_model_view("dout", dout, p, hq, p.seq_q, "(B, Hq, Nq, d)");
    require_model_view("dq", dq, p, hq, p.seq_q, "(B, Hq, Nq, d)");
    require_model_view("dk", dk, p, hk, p.seq_k, "(B, Hk, Nk, d)");
    require_model_view("dv", dv, p, hk, p.seq_k, "(B, Hk, Nk, d)");
    if (lse.shape[0] != p.batch || lse.shape[1] != hq || lse.shape[2] != p.seq_q) {
        throw InputError("stage 09: lse must be (B, Hq, Nq) = (" + std::to_string(p.batch) + ", " + std::to_string(hq) +
                         ", " + std::to_string(p.seq_q) + ")");
    }
    Workspace own;
    Workspace& ws = workspace != nullptr ? *workspace : own;
    switch (p.head_dim) {
        case 32: run_model_for_d<T, 32>(p, m, q, k, v, o, lse, dout, dq, dk, dv, deterministic, stream, ws); break;
        case 64: run_model_for_d<T, 64>(p, m, q, k, v, o, lse, dout, dq, dk, dv, deterministic, stream, ws); break;
        default: run_model_for_d<T, 128>(p, m, q, k, v, o, lse, dout, dq, dk, dv, deterministic, stream, ws); break;
    }
    if (workspace == nullptr) FA_CUDA_CHECK(cudaStreamSynchronize(stream));
}

/// The backward of a packed call for one (T, D): the schedule copied to the device, the workspace
/// (grown if needed), then the three kernels (launch.cuh: make_varlen_launches, run_varlen_kernels).
template <class T, int D>
void run_varlen_for_d(const VarlenProblem& vp, const ResolvedOptions& m, View4<const T> q, View4<const T> k,
                      View4<const T> v, View4<const T> o, View3<const float> lse, View4<const T> dout, View4<T> dq,
                      View4<T> dk, View4<T> dv, const VarlenBackwardArrays& arrays, bool deterministic,
                      cudaStream_t stream, Workspace& ws) {
    const Geometry geo = geometry(D, kDefaultStep);
    const Problem rows = varlen_rows_problem(vp);
    const Counts c = stage09::counts(rows, geo, 1);
    const bool longest_first = packed_longest_first(vp, m, deterministic);
    const std::vector<int32_t> schedule = kv_schedule(vp, m, geo.br, geo.bc, deterministic, longest_first);
    const int64_t entries = int64_t(schedule.size() / 2);
    if (entries * (vp.heads_q / m.kv_group) >= (int64_t(1) << 31)) {
        throw InputError("stage 09: the packed problem needs more than 2^31 thread blocks");
    }
    // The longest sequence's query blocks bound what a block visits per query head.
    const int split = group_split(entries * (vp.heads_q / m.kv_group), m.kv_group, ceil_div(vp.max_seq_q(), geo.br),
                                  deterministic, sm_count(), group_split_from_environment());
    const size_t floats = size_t(stage09::workspace_floats(rows, geo, 1, m.kv_group, split));
    if (ws.floats.size() < floats) ws.floats = cuda::DeviceBuffer<float>(floats);
    if (deterministic && ws.turns.size() < size_t(c.batch_heads * c.seq_q_padded)) {
        ws.turns = cuda::DeviceBuffer<int>(size_t(c.batch_heads * c.seq_q_padded));
    }
    if (entries > 0) {
        if (arrays.cu_seqlens_q == nullptr || arrays.cu_seqlens_k == nullptr || arrays.schedule == nullptr) {
            throw InputError("stage 09: a packed call needs cu_seqlens_q, cu_seqlens_k and the schedule on the device");
        }
        // From pageable memory: the call returns once the schedule is staged, so the vector may go.
        FA_CUDA_CHECK(cudaMemcpyAsync(arrays.schedule, schedule.data(), schedule.size() * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream));
    }
    const Launches<T> launches =
        make_varlen_launches<T, D>(vp, m, q, k, v, o, lse, dout, dq, dk, dv, ws.floats.data(),
                                   deterministic ? ws.turns.data() : nullptr, geo, arrays.cu_seqlens_q,
                                   arrays.cu_seqlens_k, arrays.schedule, entries, longest_first, split);
    const auto launch = [&](auto kernel, const char* name, int64_t blocks, int threads, size_t smem, const auto& args) {
        if (blocks == 0) return;  // no rows (postprocessing) or no keys (the main kernel)
        if (smem > 0) cuda::allow_dynamic_shared_memory<decltype(kernel)::value>(smem);
        decltype(kernel)::value<<<unsigned(blocks), unsigned(threads), smem, stream>>>(args);
        FA_CUDA_CHECK_LAUNCH("stage09 " + std::string(name) + "<d=" + std::to_string(D) + ", packed" +
                             (deterministic ? ", deterministic>" : ">"));
    };
    if (deterministic) {
        run_varlen_kernels<T, D, true>(launches, m, launch);
    } else {
        run_varlen_kernels<T, D, false>(launches, m, launch);
    }
}

template <class T>
void run_varlen_device(const VarlenProblem& vp, const MaxSeqlens& max, View4<const T> q, View4<const T> k,
                       View4<const T> v, View4<const T> o, View3<const float> lse, View4<const T> dout, View4<T> dq,
                       View4<T> dk, View4<T> dv, const VarlenBackwardArrays& arrays, bool deterministic,
                       cudaStream_t stream, Workspace* workspace) {
    const ResolvedOptions m = resolve_varlen_backward(vp, max);
    const Problem rows = varlen_rows_problem(vp);
    check_supported(rows, kDefaultStep);
    const auto require_shape = [](const char* name, const auto& view, int64_t heads, int64_t total, int64_t last) {
        if (view.shape[0] != 1 || view.shape[1] != heads || view.shape[2] != total || view.shape[3] != last) {
            throw InputError(std::string("stage 09: packed ") + name + " must be (1, " + std::to_string(heads) + ", " +
                             std::to_string(total) + ", " + std::to_string(last) + "), a (total, H, d) buffer; got (" +
                             std::to_string(view.shape[0]) + ", " + std::to_string(view.shape[1]) + ", " +
                             std::to_string(view.shape[2]) + ", " + std::to_string(view.shape[3]) + ")");
        }
        cuda::require_16_byte_rows("stage 09", name, view);
    };
    require_shape("q", q, vp.heads_q, vp.total_q, vp.head_dim);
    require_shape("k", k, vp.heads_k, vp.total_k, vp.head_dim);
    require_shape("v", v, vp.heads_k, vp.total_k, vp.head_dim);
    require_shape("o", o, vp.heads_q, vp.total_q, vp.head_dim);
    require_shape("dout", dout, vp.heads_q, vp.total_q, vp.head_dim);
    require_shape("dq", dq, vp.heads_q, vp.total_q, vp.head_dim);
    require_shape("dk", dk, vp.heads_k, vp.total_k, vp.head_dim);
    require_shape("dv", dv, vp.heads_k, vp.total_k, vp.head_dim);
    if (lse.shape[0] != 1 || lse.shape[1] != vp.heads_q || lse.shape[2] != vp.total_q) {
        throw InputError("stage 09: the packed LSE must be (1, " + std::to_string(vp.heads_q) + ", " +
                         std::to_string(vp.total_q) + "), an (Hq, total_q) buffer");
    }
    Workspace own;
    Workspace& ws = workspace != nullptr ? *workspace : own;
    switch (vp.head_dim) {
        case 32: run_varlen_for_d<T, 32>(vp, m, q, k, v, o, lse, dout, dq, dk, dv, arrays, deterministic, stream, ws); break;
        case 64: run_varlen_for_d<T, 64>(vp, m, q, k, v, o, lse, dout, dq, dk, dv, arrays, deterministic, stream, ws); break;
        default: run_varlen_for_d<T, 128>(vp, m, q, k, v, o, lse, dout, dq, dk, dv, arrays, deterministic, stream, ws); break;
    }
    if (workspace == nullptr) FA_CUDA_CHECK(cudaStreamSynchronize(stream));
}

/// A float32 copy on the device of a host view, with the host view's strides (gaps included,
/// copied as they are), and the way back.
struct DeviceCopy {
    cuda::DeviceBuffer<float> buffer;
    View4<float> view;

    explicit DeviceCopy(View4<const float> host) : buffer(size_t(cuda::span_elements(host))) {
        buffer.copy_from_host(host.data, buffer.size());
        view = {buffer.data(), host.shape, host.stride};
    }
    void copy_to(View4<float> host) const { buffer.copy_to_host(host.data, buffer.size()); }
};

template <class T>
BackwardFn host_entry_for(bool deterministic, int step) {
    return [deterministic, step](const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v,
                           View4<const float> o, View3<const float> lse, View4<const float> dout, View4<float> dq,
                           View4<float> dk, View4<float> dv) {
        check_supported(p, step);
        // The 16-bit copies keep the layout of the float32 views (an axis with the larger stride
        // comes first), so the kernels read either layout through their strides.
        const Layout layout = q.stride[1] >= q.stride[2] ? Layout::BHND : Layout::BNHD;
        cuda::require_device_memory(4.0 * double(2 * p.q_elems() + 2 * p.kv_elems()) + 2.0 * double(2 * p.q_elems() + 2 * p.kv_elems()) +
                                        4.0 * double(workspace_floats(p, step)),
                                    p.describe());
        cuda::DeviceTensors dev(p, q, k, v, o, lse);  // q, k, v, o, lse in float32
        cuda::HalfTensors<T> half(p, layout);         // q, k, v, o in T
        half.load(dev.q, dev.k, dev.v);
        cuda::convert(View4<const float>(dev.o), half.o);
        DeviceCopy dout_f32(dout);
        cuda::DeviceBuffer<T> dout_buf(size_t(p.q_elems())), dq_buf(size_t(p.q_elems()));
        cuda::DeviceBuffer<T> dk_buf(size_t(p.kv_elems())), dv_buf(size_t(p.kv_elems()));
        // All bits set (NaN in bf16 and fp16): a gradient element the kernels forget stays NaN.
        FA_CUDA_CHECK(cudaMemset(dq_buf.data(), 0xff, dq_buf.bytes()));
        FA_CUDA_CHECK(cudaMemset(dk_buf.data(), 0xff, dk_buf.bytes()));
        FA_CUDA_CHECK(cudaMemset(dv_buf.data(), 0xff, dv_buf.bytes()));
        const View4<T> dout_t = make_view<T>(dout_buf.data(), p.batch, p.heads, p.seq_q, p.head_dim, layout);
        const View4<T> dq_t = make_view<T>(dq_buf.data(), p.batch, p.heads, p.seq_q, p.head_dim, layout);
        const View4<T> dk_t = make_view<T>(dk_buf.data(), p.batch, p.heads, p.seq_k, p.head_dim, layout);
        const View4<T> dv_t = make_view<T>(dv_buf.data(), p.batch, p.heads, p.seq_k, p.head_dim, layout);
        cuda::convert(View4<const float>(dout_f32.view), dout_t);
        run_device<T>(p, half.q, half.k, half.v, View4<const T>(half.o), View3<const float>(dev.lse), View4<const T>(dout_t),
                      dq_t, dk_t, dv_t, deterministic, nullptr, nullptr, step);
        // Widened back into float32 copies that have the host views' strides, then copied out.
        DeviceCopy dq_f32(dq), dk_f32(dk), dv_f32(dv);
        cuda::convert(View4<const T>(dq_t), dq_f32.view);
        cuda::convert(View4<const T>(dk_t), dk_f32.view);
        cuda::convert(View4<const T>(dv_t), dv_f32.view);
        FA_CUDA_CHECK(cudaDeviceSynchronize());
        dq_f32.copy_to(dq);
        dk_f32.copy_to(dk);
        dv_f32.copy_to(dv);
    };
}

/// A 16-bit dense copy on the device of a float32 host view (its shape, in `layout`): the view
/// copied with its strides, then rounded on the device.
template <class T>
struct HalfCopy {
    cuda::DeviceBuffer<T> buffer;
    View4<T> view;

    HalfCopy(View4<const float> host, Layout layout)
        : buffer(size_t(host.shape[0] * host.shape[1] * host.shape[2] * host.shape[3])),
          view(make_view<T>(buffer.data(), host.shape[0], host.shape[1], host.shape[2], host.shape[3], layout)) {
        const DeviceCopy wide(host);
        cuda::convert(View4<const float>(wide.view), view);
        FA_CUDA_CHECK(cudaDeviceSynchronize());  // the float32 copy is freed on return
    }
    /// A copy to be written (all bits set: NaN in bf16 and fp16, so an element the kernels forget stays NaN).
    HalfCopy(const std::array<int64_t, 4>& shape, Layout layout)
        : buffer(size_t(shape[0] * shape[1] * shape[2] * shape[3])),
          view(make_view<T>(buffer.data(), shape[0], shape[1], shape[2], shape[3], layout)) {
        FA_CUDA_CHECK(cudaMemset(buffer.data(), 0xff, buffer.bytes()));
    }
    /// Widened back into the float32 host view `host` (its strides).
    void copy_to(View4<float> host) const {
        DeviceCopy wide(host);
        cuda::convert(View4<const T>(view), wide.view);
        FA_CUDA_CHECK(cudaDeviceSynchronize());
        wide.copy_to(host);
    }
};

template <class T>
BackwardFn model_host_entry_for(bool deterministic, int step, const ModelOptions& model) {
    return [deterministic, step, model](const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v,
                                        View4<const float> o, View3<const float> lse, View4<const float> dout,
                                        View4<float> dq, View4<float> dk, View4<float> dv) {
        check_supported(p, step);
        resolve_backward_options(p, model, resolve_step(step));
        const Layout layout = q.stride[1] >= q.stride[2] ? Layout::BHND : Layout::BNHD;
        const HalfCopy<T> q16(q, layout), k16(k, layout), v16(v, layout), o16(o, layout), dout16(dout, layout);
        HalfCopy<T> dq16(dq.shape, layout), dk16(dk.shape, layout), dv16(dv.shape, layout);
        cuda::DeviceBuffer<float> lse_buf(size_t(cuda::span_elements(lse)));
        lse_buf.copy_from_host(lse.data, lse_buf.size());
        const View3<const float> lse_dev{lse_buf.data(), lse.shape, lse.stride};
        run_model_device<T>(p, model, View4<const T>(q16.view), View4<const T>(k16.view), View4<const T>(v16.view),
                            View4<const T>(o16.view), lse_dev, View4<const T>(dout16.view), dq16.view, dk16.view,
                            dv16.view, deterministic, nullptr, nullptr, step);
        dq16.copy_to(dq);
        dk16.copy_to(dk);
        dv16.copy_to(dv);
    };
}

}  // namespace

const std::vector<RoadStep>& road() {
    static const std::vector<RoadStep> steps = {
        {"warps own keys", "each warp owns 16 keys of the block: S^T, P^T, dP^T, dS^T stay in its registers and feed dV, "
                           "dK directly; 64-key blocks"},
        {"warp-tiled", "warps tile every product in two dimensions (32 x 32 and more), P^T and dS^T through shared "
                       "memory: each fragment feeds two m-tiles; 128-key blocks at d = 32, 64 (half the dQ additions)"},
        {"128-key blocks", "step 1 with 128-key blocks at d = 128 as well: 64 queries by 128 keys, warps of 32 keys by 64 "
                           "features of dK, dV; half the dQ additions of step 1 at d = 128 (d = 32, 64: step 1)"},
        {"dP in pieces", "step 2 with dP^T computed 16 query columns at a time at d = 128, beside the whole step's P^T: "
                         "fewer registers live, spills of 76 bytes down to 16-24 (d = 32, 64: step 2)"},
        {"P^T in registers", "step 2 with dV and dK fed from the registers of P^T and dS^T at d = 32, 64: each warp holds "
                             "dK, dV for its keys and all features, partial sums added at the end; no P^T tile, a fifth "
                             "fewer shared-memory reads (d = 128: step 2)"},
        {"16-column steps", "step 4 with S^T and dP^T 16 query columns at a time: no spills at d = 64, K_w and V_w read "
                            "twice as often (d = 128: step 2)"},
        {"fresh offsets", "step 4 with each warp's shared-memory offsets computed afresh in every query block instead "
                          "of once before the loop and spilled: no spills at d = 32, 64, 128, but more instructions "
                          "(slower than step 4 on the H100)"},
        {"scalar dQ adds", "step 4 adding dQ_i one float32 per red.global.add (FlashAttention-2's form) instead of "
                           "pairs (a fifth slower than step 4 on the H100)"},
        {"dQ adds of four", "step 4 adding dQ_i four float32 per red.global.add.v4 (sm_90), neighbouring lanes "
                            "trading pairs first: half the additions, spills gone at d = 64 (no faster than step 4 "
                            "on the H100)"},
        {"dQ in tiles", "step 4 with the float32 dQ accumulator stored in 8 x 8 tiles, so that each pair a warp adds "
                        "lands on two whole 128-byte lines instead of eight rows' pieces (a tenth faster than "
                        "step 4 on the H100: the default)"},
        {"tiles, adds of four", "step 8's additions of four into the tiles of step 9: four whole lines per warp "
                                "instruction (slower than step 9 on the H100)"},
    };
    // One name per main kernel that run_kernels() (launch.cuh) can launch.
    if (steps.size() != size_t(kRoadSteps)) throw std::logic_error("stage 09: road() and kRoadSteps disagree");
    return steps;
}

const std::vector<int>& supported_head_dims() {
    static const std::vector<int> dims{32, 64, 128};
    return dims;
}

void check_supported(const Problem& p, int step) {
    resolve_step(step);
    bool ok = false;
    std::string list;
    for (int d : supported_head_dims()) {
        ok = ok || d == p.head_dim;
        list += (list.empty() ? "" : ", ") + std::to_string(d);
    }
    if (!ok) throw InputError("--head-dim " + std::to_string(p.head_dim) + " is not supported by stage 09: use " + list);
    if (p.seq_q > (int64_t(1) << 30) || p.seq_k > (int64_t(1) << 30) || p.batch * p.heads > (int64_t(1) << 24)) {
        throw InputError("stage 09 takes at most 2^30 query or key rows and 2^24 batch x heads (32-bit indices)");
    }
    const Counts c = counts(p, step);
    // The main grid has B*H*Tc blocks, the preprocessing grid B*H*Nq_padded/16 at most.
    if (c.batch_heads * c.k_blocks >= (int64_t(1) << 31) || c.batch_heads * c.seq_q_padded / 16 >= (int64_t(1) << 31)) {
        throw InputError("stage 09: the problem needs more than 2^31 thread blocks");
    }
}

double workspace_bytes(const Problem& p, bool deterministic, int step) {
    const Counts c = counts(p, step);
    return 4.0 * double(workspace_floats(p, step)) + (deterministic ? 4.0 * double(c.batch_heads * c.q_blocks) : 0.0);
}

void attention_backward_device(const Problem& p, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k,
                               View4<const __nv_bfloat16> v, View4<const __nv_bfloat16> o, View3<const float> lse,
                               View4<const __nv_bfloat16> dout, View4<__nv_bfloat16> dq, View4<__nv_bfloat16> dk,
                               View4<__nv_bfloat16> dv, bool deterministic, cudaStream_t stream, Workspace* workspace,
                               int step) {
    run_device<__nv_bfloat16>(p, q, k, v, o, lse, dout, dq, dk, dv, deterministic, stream, workspace, step);
}

void attention_backward_device(const Problem& p, View4<const __half> q, View4<const __half> k, View4<const __half> v,
                               View4<const __half> o, View3<const float> lse, View4<const __half> dout, View4<__half> dq,
                               View4<__half> dk, View4<__half> dv, bool deterministic, cudaStream_t stream,
                               Workspace* workspace, int step) {
    run_device<__half>(p, q, k, v, o, lse, dout, dq, dk, dv, deterministic, stream, workspace, step);
}

void attention_backward_device(const Problem& p, const ModelOptions& options, View4<const __nv_bfloat16> q,
                               View4<const __nv_bfloat16> k, View4<const __nv_bfloat16> v, View4<const __nv_bfloat16> o,
                               View3<const float> lse, View4<const __nv_bfloat16> dout, View4<__nv_bfloat16> dq,
                               View4<__nv_bfloat16> dk, View4<__nv_bfloat16> dv, bool deterministic, cudaStream_t stream,
                               Workspace* workspace, int step) {
    run_model_device<__nv_bfloat16>(p, options, q, k, v, o, lse, dout, dq, dk, dv, deterministic, stream, workspace, step);
}

void attention_backward_device(const Problem& p, const ModelOptions& options, View4<const __half> q, View4<const __half> k,
                               View4<const __half> v, View4<const __half> o, View3<const float> lse,
                               View4<const __half> dout, View4<__half> dq, View4<__half> dk, View4<__half> dv,
                               bool deterministic, cudaStream_t stream, Workspace* workspace, int step) {
    run_model_device<__half>(p, options, q, k, v, o, lse, dout, dq, dk, dv, deterministic, stream, workspace, step);
}

int64_t varlen_backward_schedule_ints(const VarlenProblem& vp) {
    int64_t blocks = 0;
    for (int64_t b = 0; b < vp.batch(); ++b) blocks += ceil_div(vp.seq_k(b), int64_t(geometry(vp.head_dim, kDefaultStep).bc));
    return 2 * blocks;
}

void attention_backward_varlen_device(const VarlenProblem& vp, const MaxSeqlens& max, View4<const __nv_bfloat16> q,
                                      View4<const __nv_bfloat16> k, View4<const __nv_bfloat16> v,
                                      View4<const __nv_bfloat16> o, View3<const float> lse,
                                      View4<const __nv_bfloat16> dout, View4<__nv_bfloat16> dq, View4<__nv_bfloat16> dk,
                                      View4<__nv_bfloat16> dv, const VarlenBackwardArrays& arrays, bool deterministic,
                                      cudaStream_t stream, Workspace* workspace) {
    run_varlen_device<__nv_bfloat16>(vp, max, q, k, v, o, lse, dout, dq, dk, dv, arrays, deterministic, stream, workspace);
}

void attention_backward_varlen_device(const VarlenProblem& vp, const MaxSeqlens& max, View4<const __half> q,
                                      View4<const __half> k, View4<const __half> v, View4<const __half> o,
                                      View3<const float> lse, View4<const __half> dout, View4<__half> dq,
                                      View4<__half> dk, View4<__half> dv, const VarlenBackwardArrays& arrays,
                                      bool deterministic, cudaStream_t stream, Workspace* workspace) {
    run_varlen_device<__half>(vp, max, q, k, v, o, lse, dout, dq, dk, dv, arrays, deterministic, stream, workspace);
}

BackwardFn host_entry(const Options& options, const ModelOptions& model) {
    return options.dtype == DType::BF16 ? model_host_entry_for<__nv_bfloat16>(options.deterministic, options.step, model)
                                        : model_host_entry_for<__half>(options.deterministic, options.step, model);
}

BackwardFn host_entry(const Options& options) {
    return options.dtype == DType::BF16 ? host_entry_for<__nv_bfloat16>(options.deterministic, options.step)
                                        : host_entry_for<__half>(options.deterministic, options.step);
}

void attention_backward(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v,
                        View4<const float> o, View3<const float> lse, View4<const float> dout, View4<float> dq,
                        View4<float> dk, View4<float> dv) {
    host_entry(Options{})(p, q, k, v, o, lse, dout, dq, dk, dv);
}

std::string describe_config(const Problem& p, const Options& options) {
    check_supported(p, options.step);
    const int step = resolve_step(options.step);
    const Geometry geo = geometry(p.head_dim, step);
    const Counts c = counts(p, step);
    // Block classes per head, as the kernel sees them.
    long long unmasked = 0, masked = 0;
    for (int j = 0; j < int(c.k_blocks); ++j) {
        const int begin = first_query_block(j, geo.br, geo.bc, int(p.seq_q), int(p.seq_k), p.causal);
        for (int i = begin; i < int(c.q_blocks); ++i) {
            if (block_needs_mask(i * geo.br, j * geo.bc, geo.bc, int(p.seq_q), int(p.seq_k), p.causal)) {
                ++masked;
            } else {
                ++unmasked;
            }
        }
    }
    const long long total = (long long)(c.q_blocks * c.k_blocks);
    char warps[256];
    if (step == 0) {
        std::snprintf(warps, sizeof warps, "%d warps (16 keys each), %d query columns per step, K_w/V_w %s", geo.warps,
                      geo.bn, geo.kv_in_registers ? "in registers" : "re-read from shared memory");
    } else {
        std::snprintf(warps, sizeof warps, "%d warps (%d along the keys x %d, %d keys each), %d query columns per step, %s",
                      geo.warps, geo.key_warps, geo.warps / geo.key_warps, geo.bc / geo.key_warps, geo.bn,
                      geo.pt_in_registers ? "dV and dK from the registers of P^T and dS^T, dS^T through shared memory"
                                          : "P^T and dS^T through shared memory");
    }
    char buf[768];
    std::snprintf(buf, sizeof buf,
                  "%s, step %d (%s), Br=%d Bc=%d, %s, %zu B shared memory; "
                  "dQ %s; per head %lld key blocks x %lld query blocks: %lld unmasked, %lld masked, %lld skipped",
                  cuda::to_string(options.dtype).c_str(), step, road()[size_t(step)].name.c_str(), geo.br, geo.bc, warps,
                  geo.smem, options.deterministic ? "added in key-block order, last first (deterministic)" : "by float32 atomic additions",
                  (long long)c.k_blocks, (long long)c.q_blocks, unmasked, masked, total - unmasked - masked);
    return buf;
}

double intermediate_bytes(const Problem& p, const Options& options) {
    return 2.0 * (4.0 * double(p.q_elems()) + 4.0 * double(p.kv_elems())) + workspace_bytes(p, options.deterministic, options.step);
}

}  // namespace fa::stage09
