// Stage 12: its entry points (launch.cuh's kernels queued on a stream), its road's names, the host's facts.
#include "attention.cuh"

#include <algorithm>
#include <cstdio>
#include <string>

#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/hopper.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/error.hpp"
#include "kernel.cuh"
#include "launch.cuh"

namespace fa::stage12 {

namespace {

int resolve(int step) { return step < 0 ? kDefaultStep : step; }

/// Step `step` (1 to kLastStep) of the Hopper kernel at head dimension D, its three kernels queued on `stream`.
template <class T, int D>
void run_hopper(const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<const T> o, View3<const float> lse,
                View4<const T> dout, View4<T> dq, View4<T> dk, View4<T> dv, cudaStream_t stream, Workspace& ws, int step,
                bool deterministic) {
    const size_t floats = size_t(workspace_floats(p));
    if (ws.floats.size() < floats) ws.floats = cuda::DeviceBuffer<float>(floats);
    const auto launch = [&](auto kernel, const char* name, int64_t blocks, int threads, size_t smem, const auto& args) {
        if (blocks == 0) return;
        if (smem > 0) cuda::allow_dynamic_shared_memory<decltype(kernel)::value>(smem);
        decltype(kernel)::value<<<unsigned(blocks), unsigned(threads), smem, stream>>>(args);
        FA_CUDA_CHECK_LAUNCH("stage12 " + std::string(name) + "<d=" + std::to_string(D) + ", step " + std::to_string(step) + ">");
    };
    // The launches of step `Step` (StepN<N>): its block of keys sets the grid.
    const auto run = [&](auto step_type) {
        using Step = decltype(step_type);
        run_kernels<T, D, Step>(make_launches<T, D, Step>(p, q, k, v, o, lse, dout, dq, dk, dv, ws.floats.data()), launch);
    };
    switch (step * 2 + (deterministic ? 1 : 0)) {
        case 2: run(StepN<1>{}); break;
        case 4: run(StepN<2>{}); break;
        case 6: run(StepN<3>{}); break;
        case 7: run(StepN<3, true>{}); break;
        case 8: run(StepN<4>{}); break;
        case 9: run(StepN<4, true>{}); break;
        default:
            throw InputError("stage 12: step " + std::to_string(step) + (deterministic ? " in the deterministic order" : "") +
                             " has no Hopper kernel");
    }
}

template <class T>
void run_device(const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<const T> o, View3<const float> lse,
                View4<const T> dout, View4<T> dq, View4<T> dk, View4<T> dv, cudaStream_t stream, Workspace* workspace, int step,
                bool deterministic) {
    step = resolve(step);
    check_supported(p, step, deterministic);
    Workspace local;
    Workspace& ws = workspace != nullptr ? *workspace : local;
    if (step == 0) {  // the point of departure: stage 09's default backward, on the same views
        stage09::attention_backward_device(p, q, k, v, o, lse, dout, dq, dk, dv, deterministic, stream, &ws.step0);
    } else if (p.head_dim == 64) {
        run_hopper<T, 64>(p, q, k, v, o, lse, dout, dq, dk, dv, stream, ws, step, deterministic);
    } else {
        run_hopper<T, 128>(p, q, k, v, o, lse, dout, dq, dk, dv, stream, ws, step, deterministic);
    }
    if (workspace == nullptr) FA_CUDA_CHECK(cudaStreamSynchronize(stream));  // the local workspace is freed on return
}

/// A float32 device copy of a host view, with its strides.
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
BackwardFn host_entry_for(int step, bool deterministic) {
    return [step, deterministic](const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<const float> o,
                  View3<const float> lse, View4<const float> dout, View4<float> dq, View4<float> dk, View4<float> dv) {
        check_supported(p, step, deterministic);
        // The 16-bit copies keep the layout of the float32 views (an axis with the larger stride
        // comes first), so the tensor maps read either layout through their strides.
        const Layout layout = q.stride[1] >= q.stride[2] ? Layout::BHND : Layout::BNHD;
        cuda::require_device_memory(6.0 * double(2 * p.q_elems() + 2 * p.kv_elems()) + workspace_bytes(p, step, deterministic),
                                    p.describe());
        cuda::DeviceTensors dev(p, q, k, v, o, lse);  // q, k, v, o, lse in float32
        cuda::HalfTensors<T> half(p, layout);         // q, k, v, o in T
        half.load(dev.q, dev.k, dev.v);
        cuda::convert(View4<const float>(dev.o), half.o);
        const DeviceCopy dout_f32(dout);
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
        Workspace ws;
        run_device<T>(p, half.q, half.k, half.v, View4<const T>(half.o), View3<const float>(dev.lse), View4<const T>(dout_t), dq_t,
                      dk_t, dv_t, nullptr, &ws, step, deterministic);
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

}  // namespace

const std::vector<RoadStep>& road() {
    static const std::vector<RoadStep> steps = {
        {"stage 09", "the point of departure: stage 09's default backward (mma.sync, cp.async, atomic dQ), on the same GPU"},
        {"wgmma + TMA", "one warpgroup per key block of 64: K_j, V_j loaded once by the TMA; Q_i, dO_i, L_i, D_i streamed by "
                        "the TMA on a ring of two mbarrier slots; S^T, dP^T by wgmma from shared memory; dV, dK from the "
                        "registers of P^T, dS^T; dQ_i = dS K_j from dS^T read transposed; dQ_i's float32 partial added by "
                        "one bulk reduction per tile"},
        {"warp roles", "a producer warpgroup (one elected thread issues every TMA copy, setmaxnreg 24) and two consumer "
                       "warpgroups (setmaxnreg 240) of 64 keys each, 128 keys a block; full and empty mbarriers per slot "
                       "free the ring without a block-wide barrier; each consumer adds its own dQ_i partial by its own "
                       "bulk reduction"},
        {"dQ writer", "warp 1 of the producer warpgroup issues the bulk reductions: a consumer stores its dQ_i partial, "
                      "arrives on the buffer's full mbarrier and goes on; the writer frees the buffer on its empty mbarrier "
                      "once the reduction has read it, and keeps the deterministic order's turns (--deterministic)"},
        {"shared dQ", "one dQ_i buffer per block: consumer 1 adds its partial onto consumer 0's in shared memory, so the "
                      "writer adds one [64, d] float32 tile into global memory per query tile instead of two"},
    };
    return steps;
}

int final_step() { return kDefaultStep; }

const std::vector<int>& supported_head_dims() {
    static const std::vector<int> dims{64, 128};
    return dims;
}

int first_deterministic_step() { return kFirstDeterministicStep; }

void check_supported(const Problem& p, int step, bool deterministic) {
    const int s = resolve(step);
    if (s < 0 || s > kLastStep) {
        throw InputError("--step " + std::to_string(step) + ": stage 12's road has steps 0 to " + std::to_string(kLastStep));
    }
    if (deterministic && s > 0 && s < kFirstDeterministicStep) {
        throw InputError("--deterministic needs --step 0 or " + std::to_string(kFirstDeterministicStep) + " to " +
                         std::to_string(kLastStep) + " (a dQ writer warp keeps the order), not step " + std::to_string(s));
    }
    if (s == 0) {
        stage09::check_supported(p, -1);
        return;
    }
    check_hopper_kernel_supports(p);
}

std::string gpu_unavailable_reason() {
    const std::string reason = cuda::hopper_unavailable_reason();
    return reason.empty() ? "" : "a Hopper GPU (sm_90a): " + reason;
}

double workspace_bytes(const Problem& p, int step, bool deterministic) {
    return resolve(step) == 0 ? stage09::workspace_bytes(p, deterministic) : 4.0 * double(workspace_floats(p));
}

void attention_backward_device(const Problem& p, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k,
                               View4<const __nv_bfloat16> v, View4<const __nv_bfloat16> o, View3<const float> lse,
                               View4<const __nv_bfloat16> dout, View4<__nv_bfloat16> dq, View4<__nv_bfloat16> dk,
                               View4<__nv_bfloat16> dv, cudaStream_t stream, Workspace* workspace, int step,
                               bool deterministic) {
    run_device<__nv_bfloat16>(p, q, k, v, o, lse, dout, dq, dk, dv, stream, workspace, step, deterministic);
}

void attention_backward_device(const Problem& p, View4<const __half> q, View4<const __half> k, View4<const __half> v,
                               View4<const __half> o, View3<const float> lse, View4<const __half> dout, View4<__half> dq,
                               View4<__half> dk, View4<__half> dv, cudaStream_t stream, Workspace* workspace, int step,
                               bool deterministic) {
    run_device<__half>(p, q, k, v, o, lse, dout, dq, dk, dv, stream, workspace, step, deterministic);
}

BackwardFn host_entry(const Options& options) {
    return options.dtype == DType::BF16 ? host_entry_for<__nv_bfloat16>(options.step, options.deterministic)
                                        : host_entry_for<__half>(options.step, options.deterministic);
}

void attention_backward(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<const float> o,
                        View3<const float> lse, View4<const float> dout, View4<float> dq, View4<float> dk, View4<float> dv) {
    host_entry(Options{})(p, q, k, v, o, lse, dout, dq, dk, dv);
}

std::string describe_config(const Problem& p, const Options& options) {
    check_supported(p, options.step, options.deterministic);
    const int step = resolve(options.step);
    if (step == 0) {
        return "step 0 (stage 09's default backward): " +
               stage09::describe_config(p, stage09::Options{options.dtype, options.deterministic, -1});
    }
    const Features f = kSteps[step];
    const int consumers = f.warp_roles ? 2 : 1, block_keys = 64 * consumers;
    const Counts c = counts(p, block_keys);
    // Tiles of 64 queries x 64 keys (one consumer's): computed with or without the mask, or skipped.
    long long unmasked = 0, masked = 0;
    for (int j = 0; j < int(c.k_blocks); ++j) {
        for (int i = first_query_tile(j, 64, block_keys, int(p.seq_q), int(p.seq_k), p.causal); i < int(c.q_tiles); ++i) {
            for (int w = 0; w < consumers; ++w) {
                if (tile_needs_mask(i * 64, j * block_keys + 64 * w, 64, int(p.seq_q), int(p.seq_k), p.causal)) {
                    ++masked;
                } else {
                    ++unmasked;
                }
            }
        }
    }
    const long long total = (long long)(c.q_tiles * c.k_blocks * consumers);
    const auto smem_of = [&](auto step_type) {
        using Step = decltype(step_type);
        return p.head_dim == 64 ? size_t(Shape<64, Step>::kSmemBytes) : size_t(Shape<128, Step>::kSmemBytes);
    };
    const size_t smem = step == 1 ? smem_of(StepN<1>{}) : step == 2 ? smem_of(StepN<2>{}) : step == 3 ? smem_of(StepN<3>{})
                                                                                                    : smem_of(StepN<4>{});
    const std::string roles =
        f.warp_roles ? "a producer warpgroup (setmaxnreg " + std::to_string(f.producer_registers) + ") and 2 consumer warpgroups (" +
                           std::to_string(f.consumer_registers) + ") of Bc=64 keys each, 128 keys per block"
                     : std::string("one warpgroup per key block, Bc=64 keys");
    std::string dq_path = !f.warp_roles  ? "dQ by one float32 bulk reduction per tile"
                          : f.shared_dq  ? "dQ summed by the two consumers in shared memory, one float32 bulk reduction per tile "
                                           "issued by a writer warp"
                          : f.dq_writer  ? "dQ by one float32 bulk reduction per tile and consumer, issued by a writer warp"
                                         : "dQ by one float32 bulk reduction per tile and consumer";
    dq_path += options.deterministic ? ", in the deterministic order (the last key block first)" : "";
    char buf[1024];
    std::snprintf(buf, sizeof buf,
                  "%s, step %d (%s), %s, Br=64 queries per tile, a ring of %d slots%s, %zu B shared memory; %s; per head "
                  "%lld key blocks x %lld query tiles, %lld tiles of 64 x 64: %lld unmasked, %lld masked, %lld skipped",
                  cuda::to_string(options.dtype).c_str(), step, road()[size_t(step)].name.c_str(), roles.c_str(), f.stages,
                  f.warp_roles ? " (full and empty barriers)" : "", smem, dq_path.c_str(), (long long)c.k_blocks,
                  (long long)c.q_tiles, total, unmasked, masked, total - unmasked - masked);
    return buf;
}

double intermediate_bytes(const Problem& p, const Options& options) {
    return 2.0 * (4.0 * double(p.q_elems()) + 4.0 * double(p.kv_elems())) + workspace_bytes(p, options.step);
}

}  // namespace fa::stage12
