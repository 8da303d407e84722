// Stage 09: the backward kernels' instances, the workspace, and the device and host entry points.
#include "attention.cuh"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <string>

#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/error.hpp"
#include "kernel.cuh"
#include "warp_tiled.cuh"

namespace fa::stage09 {

namespace {

//! [tuned]
/// The block shape for head dimension D: query rows per query block, warps (16 keys each),
/// query columns per step, K/V fragments in registers or re-read, blocks per SM. Every thread
/// holds dK_w and dV_w (d/2 float32 registers each) for the whole kernel, and S^T and dP^T
/// (Bn/2 each) per step. Chosen from the compiler's register counts (`-Xptxas -v`): at d = 32
/// and 64, Bn = 32 with K_w, V_w re-read keeps a thread under 168 registers without spills, so
/// three blocks (12 warps) share an SM; at d = 128 dK_w and dV_w alone take 128 registers and two
/// blocks (the shared memory allows no more) fit at 255. The alternatives timed at d = 64 (the
/// lesson's road: K_w, V_w in registers, Bn = 16 or 64) were within -10% and +1.5% of this.
template <int D>
struct Tuned;
template <>
struct Tuned<32> {
    using F = Features<64, 4, 32, false, 3>;
};
template <>
struct Tuned<64> {
    using F = Features<64, 4, 32, false, 3>;
};
template <>
struct Tuned<128> {
    using F = Features<64, 4, 32, false, 1>;
};
//! [tuned]

//! [tuned_tiled]
/// The warp-tiled kernel's shape for head dimension D: query rows, keys, warps, warps along the
/// keys, query columns per step, blocks per SM. Each warp holds dK and dV for 32 keys and
/// d / (Warps / KeyWarps) features. Chosen from the compiler's register counts (`-Xptxas -v`,
/// CUDA 13.0, sm_90): at d = 32 and 64 a 128 x 128 block (8 warps, 4 x 2) takes 156 and 225
/// registers without spills. At d = 128 the same block needs 64 registers of dK and dV per 32
/// keys and spills 76 bytes; Br = 128 queries by Bc = 64 keys (2 x 4 warps: 32 keys by 32
/// features of dK, dV each) fits in 255 without spills.
template <int D>
struct TunedTiled;
template <>
struct TunedTiled<32> {
    using F = TiledFeatures<128, 128, 8, 4, 32, 1>;
};
template <>
struct TunedTiled<64> {
    using F = TiledFeatures<128, 128, 8, 4, 32, 1>;
};
template <>
struct TunedTiled<128> {
    using F = TiledFeatures<128, 64, 8, 2, 32, 1>;
};
//! [tuned_tiled]

/// The step that runs for `step` (-1: kDefaultStep); throws for a step that does not exist.
int resolve_step(int step) {
    const int steps = int(road().size());
    if (step < -1 || step >= steps) {
        throw InputError("--step " + std::to_string(step) + " does not exist: stage 09 has steps 0 to " +
                         std::to_string(steps - 1));
    }
    return step < 0 ? kDefaultStep : step;
}

/// The shape of one instance, for the host: block counts, padding, the workspace, the report.
struct Geometry {
    int br, bc, warps, bn;
    int key_warps;         // warps along the keys (step 0: all of them, 16 keys each)
    bool kv_in_registers;  // step 0 only
    size_t smem;
};

template <int D>
Geometry geometry_for(int step) {
    if (step == 0) {
        using F = typename Tuned<D>::F;
        return {F::kBr, F::kBc, F::kWarps, F::kBn, F::kWarps, F::kKVInRegisters, Shape<__nv_bfloat16, D, F>::kSmemBytes};
    }
    using F = typename TunedTiled<D>::F;
    return {F::kBr, F::kBc, F::kWarps, F::kBn, F::kKeyWarps, false, TiledShape<__nv_bfloat16, D, F>::kSmemBytes};
}

Geometry geometry(int64_t d, int step) {
    step = resolve_step(step);
    switch (d) {
        case 32: return geometry_for<32>(step);
        case 64: return geometry_for<64>(step);
        default: return geometry_for<128>(step);
    }
}

/// Sizes every kernel derives from the problem and the block shape.
struct Counts {
    int64_t batch_heads;   // B * H
    int64_t q_blocks;      // Tr
    int64_t k_blocks;      // Tc
    int64_t seq_q_padded;  // Tr * Br
};

Counts counts(const Problem& p, int step) {
    const Geometry geo = geometry(p.head_dim, step);
    Counts c{};
    c.batch_heads = p.batch * p.heads;
    c.q_blocks = ceil_div(p.seq_q, geo.br);
    c.k_blocks = ceil_div(p.seq_k, geo.bc);
    c.seq_q_padded = c.q_blocks * geo.br;
    return c;
}

/// Floats of Workspace::floats: L log2(e) and D (one per padded row), the dQ accumulator (d per padded row).
int64_t workspace_floats(const Problem& p, int step) {
    const Counts c = counts(p, step);
    return c.batch_heads * c.seq_q_padded * (2 + p.head_dim);
}

template <class T>
void require_device_view(const char* name, const View4<T>& view, int64_t rows, const Problem& p) {
    if (view.shape[0] != p.batch || view.shape[1] != p.heads || view.shape[2] != rows || view.shape[3] != p.head_dim) {
        throw InputError(std::string("stage 09: ") + name + " does not have the problem's shape (B, H, " +
                         (rows == p.seq_q ? "Nq" : "Nk") + ", d)");
    }
    cuda::require_16_byte_rows("stage 09", name, view);
}

template <class T, int D, class F, bool kDeterministic>
void launch_main(const Args<T>& a, int64_t blocks, cudaStream_t stream) {
    using S = Shape<T, D, F>;
    cuda::allow_dynamic_shared_memory<flash_backward_kernel<T, D, F, kDeterministic>>(S::kSmemBytes);
    flash_backward_kernel<T, D, F, kDeterministic><<<unsigned(blocks), S::kThreads, S::kSmemBytes, stream>>>(a);
    FA_CUDA_CHECK_LAUNCH("stage09 flash_backward_kernel<d=" + std::to_string(D) + ", Br=" + std::to_string(F::kBr) +
                         ", Bc=" + std::to_string(F::kBc) + (kDeterministic ? ", deterministic>" : ">"));
}

template <class T, int D, class F, bool kDeterministic>
void launch_tiled(const Args<T>& a, int64_t blocks, cudaStream_t stream) {
    using S = TiledShape<T, D, F>;
    cuda::allow_dynamic_shared_memory<flash_backward_tiled_kernel<T, D, F, kDeterministic>>(S::kSmemBytes);
    flash_backward_tiled_kernel<T, D, F, kDeterministic><<<unsigned(blocks), S::kThreads, S::kSmemBytes, stream>>>(a);
    FA_CUDA_CHECK_LAUNCH("stage09 flash_backward_tiled_kernel<d=" + std::to_string(D) + ", Br=" + std::to_string(F::kBr) +
                         ", Bc=" + std::to_string(F::kBc) + (kDeterministic ? ", deterministic>" : ">"));
}

//! [run]
/// The three kernels for one (T, D): preprocess (D_i, L_i log2 e, zeroed accumulator and turns),
/// the main kernel, postprocess (dQ rounded to T).
template <class T, int D>
void run_for_d(const Problem& p, View4<const T> q, View4<const T> k, View4<const T> v, View4<const T> o,
               View3<const float> lse, View4<const T> dout, View4<T> dq, View4<T> dk, View4<T> dv, bool deterministic,
               cudaStream_t stream, Workspace& ws, int step) {
    const Geometry geo = geometry(D, step);
    const Counts c = counts(p, step);
    const size_t floats = size_t(workspace_floats(p, step));
    if (ws.floats.size() < floats) ws.floats = cuda::DeviceBuffer<float>(floats);
    if (deterministic && ws.turns.size() < size_t(c.batch_heads * c.q_blocks)) {
        ws.turns = cuda::DeviceBuffer<int>(size_t(c.batch_heads * c.q_blocks));
    }
    float* lse_log2 = ws.floats.data();                          // [B*H, Nq_padded]
    float* delta = lse_log2 + c.batch_heads * c.seq_q_padded;    // [B*H, Nq_padded]
    float* dq_accum = delta + c.batch_heads * c.seq_q_padded;    // [B*H, Nq_padded, d] (16-byte aligned: Nq_padded % 64 == 0)
    int* turns = deterministic ? ws.turns.data() : nullptr;      // [B*H, Tr]
    const double scale = p.softmax_scale();

    PreprocessArgs<T> pre{};
    pre.o = o.data, pre.dout = dout.data, pre.lse = lse.data;
    pre.lse_log2 = lse_log2, pre.delta = delta, pre.dq_accum = dq_accum, pre.turns = turns;
    pre.o_sb = o.stride[0], pre.o_sh = o.stride[1], pre.o_sn = o.stride[2];
    pre.do_sb = dout.stride[0], pre.do_sh = dout.stride[1], pre.do_sn = dout.stride[2];
    pre.lse_sb = lse.stride[0], pre.lse_sh = lse.stride[1], pre.lse_sn = lse.stride[2];
    pre.rows = c.batch_heads * c.seq_q_padded;
    pre.heads = int(p.heads), pre.seq_q = int(p.seq_q), pre.seq_q_padded = int(c.seq_q_padded), pre.br = geo.br;
    const int64_t rows_per_block = kPrePostThreads / (D / 8);
    backward_preprocess_kernel<T, D><<<unsigned(ceil_div(pre.rows, rows_per_block)), kPrePostThreads, 0, stream>>>(pre);
    FA_CUDA_CHECK_LAUNCH("stage09 backward_preprocess_kernel<d=" + std::to_string(D) + ">");

    Args<T> a{};
    a.q = q.data, a.k = k.data, a.v = v.data, a.dout = dout.data, a.dk = dk.data, a.dv = dv.data;
    a.lse_log2 = lse_log2, a.delta = delta, a.dq_accum = dq_accum, a.turns = turns;
    a.q_sb = q.stride[0], a.q_sh = q.stride[1], a.q_sn = q.stride[2];
    a.k_sb = k.stride[0], a.k_sh = k.stride[1], a.k_sn = k.stride[2];
    a.v_sb = v.stride[0], a.v_sh = v.stride[1], a.v_sn = v.stride[2];
    a.do_sb = dout.stride[0], a.do_sh = dout.stride[1], a.do_sn = dout.stride[2];
    a.dk_sb = dk.stride[0], a.dk_sh = dk.stride[1], a.dk_sn = dk.stride[2];
    a.dv_sb = dv.stride[0], a.dv_sh = dv.stride[1], a.dv_sn = dv.stride[2];
    a.heads = int(p.heads), a.seq_q = int(p.seq_q), a.seq_k = int(p.seq_k), a.seq_q_padded = int(c.seq_q_padded);
    a.q_blocks = int(c.q_blocks), a.k_blocks = int(c.k_blocks);
    a.causal = p.causal;
    // The scale keeps its sign: P = exp2(s * scale*log2e - L*log2e) is right for either sign, and
    // masked entries are zeroed after the exponential. A zero scale gives uniform weights.
    a.scale = float(scale);
    a.scale_log2 = float(scale * 1.4426950408889634);  // log2(e)
    const int64_t blocks = c.batch_heads * c.k_blocks;
    if (resolve_step(step) == 0) {
        using F = typename Tuned<D>::F;
        deterministic ? launch_main<T, D, F, true>(a, blocks, stream) : launch_main<T, D, F, false>(a, blocks, stream);
    } else {
        using F = typename TunedTiled<D>::F;
        deterministic ? launch_tiled<T, D, F, true>(a, blocks, stream) : launch_tiled<T, D, F, false>(a, blocks, stream);
    }

    PostprocessArgs<T> post{};
    post.dq_accum = dq_accum, post.dq = dq.data;
    post.dq_sb = dq.stride[0], post.dq_sh = dq.stride[1], post.dq_sn = dq.stride[2];
    post.rows = c.batch_heads * p.seq_q;
    post.heads = int(p.heads), post.seq_q = int(p.seq_q), post.seq_q_padded = int(c.seq_q_padded);
    post.scale = float(scale);
    const int64_t units = post.rows * (D / 8);
    const int64_t post_blocks = std::min<int64_t>(ceil_div(units, kPrePostThreads), int64_t(1) << 16);
    backward_postprocess_kernel<T, D><<<unsigned(post_blocks), kPrePostThreads, 0, stream>>>(post);
    FA_CUDA_CHECK_LAUNCH("stage09 backward_postprocess_kernel<d=" + std::to_string(D) + ">");
}
//! [run]

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

}  // namespace

const std::vector<RoadStep>& road() {
    static const std::vector<RoadStep> steps = {
        {"warps own keys", "each warp owns 16 keys of the block: S^T, P^T, dP^T, dS^T stay in its registers and feed dV, "
                           "dK directly; 64-key blocks"},
        {"warp-tiled", "warps tile every product in two dimensions (32 x 32 and more), P^T and dS^T through shared "
                       "memory: each fragment feeds two m-tiles; 128-key blocks at d = 32, 64 (half the dQ additions)"},
    };
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
    char warps[160];
    if (step == 0) {
        std::snprintf(warps, sizeof warps, "%d warps (16 keys each), %d query columns per step, K_w/V_w %s", geo.warps,
                      geo.bn, geo.kv_in_registers ? "in registers" : "re-read from shared memory");
    } else {
        std::snprintf(warps, sizeof warps, "%d warps (%d along the keys x %d, %d keys each), %d query columns per step, "
                      "P^T and dS^T through shared memory", geo.warps, geo.key_warps, geo.warps / geo.key_warps,
                      geo.bc / geo.key_warps, geo.bn);
    }
    char buf[640];
    std::snprintf(buf, sizeof buf,
                  "%s, step %d (%s), Br=%d Bc=%d, %s, %zu B shared memory; "
                  "dQ %s; per head %lld key blocks x %lld query blocks: %lld unmasked, %lld masked, %lld skipped",
                  cuda::to_string(options.dtype).c_str(), step, road()[size_t(step)].name.c_str(), geo.br, geo.bc, warps,
                  geo.smem, options.deterministic ? "added in key-block order (deterministic)" : "by float32 atomic additions",
                  (long long)c.k_blocks, (long long)c.q_blocks, unmasked, masked, total - unmasked - masked);
    return buf;
}

double intermediate_bytes(const Problem& p, const Options& options) {
    return 2.0 * (4.0 * double(p.q_elems()) + 4.0 * double(p.kv_elems())) + workspace_bytes(p, options.deterministic, options.step);
}

}  // namespace fa::stage09
