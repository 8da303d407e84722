// Stage 07: the tensor-core kernel's instances, its entry points and the road of its features.
#include "attention.cuh"

#include <cstdio>
#include <string>

#include "fa/cuda/check.hpp"
#include "fa/cuda/stage.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/error.hpp"
#include "launch.cuh"

namespace fa::stage07 {

namespace {

#ifdef FA_STAGE07_TUNING
constexpr int kRoadSteps = kFinalStep + 1;  // the candidates are numbered after the road
// Candidate shapes the tuning build times beside the road (steps 9 and up), all with the final
// kernel's switches: Br, Bc, warps, stages, Q in registers, lazy rescale, blocks per SM, Bn.
struct CandidateInfo {
    int br, bc, warps, stages;
    bool q_in_registers, lazy;
    int min_blocks, bn;
};
constexpr CandidateInfo kCandidates[] = {
    {128, 64, 4, 2, true, false, 1, 64},   {128, 128, 4, 2, true, false, 1, 64}, {128, 64, 4, 2, false, false, 1, 32},
    {128, 128, 4, 2, false, false, 1, 32}, {128, 64, 4, 3, false, false, 1, 32}, {128, 64, 4, 2, false, true, 1, 64},
    {128, 128, 8, 2, false, false, 1, 128}, {128, 64, 4, 2, false, true, 1, 32}};
/// The candidate after the tile shapes: step 0 with its query tiles in order (InOrder), against
/// step 0's heaviest first.
constexpr int kInOrderCandidate = int(sizeof kCandidates / sizeof kCandidates[0]);
/// Candidate I as a FeatureSet (kFeatures) for FeaturesOf.
template <int I>
struct CandidateSet {
    static constexpr CandidateInfo c = kCandidates[I];  ///< the candidate's numbers
    /// the final kernel's switches with the candidate's shape
    static constexpr FeatureSet kFeatures = kStep5.with_causal_skip()
                                                .with_tile(c.br, c.bc, c.warps, c.stages, c.q_in_registers)
                                                .with_lazy_rescale(c.lazy)
                                                .with_min_blocks_per_sm(c.min_blocks)
                                                .with_softmax_step(c.bn);
};
#endif

template <class T>
using LaunchFn = void (*)(const Args<T>&, cudaStream_t);


template <class T, int D, class F>
void launch(const Args<T>& a, cudaStream_t stream) {
    using S = Shape<T, D, F>;
    cuda::allow_dynamic_shared_memory<flash_forward_kernel<T, D, F>>(S::kSmemBytes);
    flash_forward_kernel<T, D, F><<<unsigned(grid_blocks(a)), S::kThreads, S::kSmemBytes, stream>>>(a);
    FA_CUDA_CHECK_LAUNCH("stage07 flash_forward_kernel<d=" + std::to_string(D) + ", Br=" + std::to_string(F::kBr) +
                         ", Bc=" + std::to_string(F::kBc) + ">");
}


/// The launcher and geometry of (T, D, step), or nullptr when that instance is not built.
template <class T, int D>
LaunchFn<T> find_for_d(int step, Geometry& geo) {
    switch (step) {
#define FA_STEP(N)                                                   \
    case N:                                                          \
        geo = geometry<T, D, RoadStep<D, N>>();                      \
        return launch<T, D, RoadStep<D, N>>;
        FA_STEP(8)
    }
    if constexpr (D == 64 || D == 128) {
        switch (step) {
            FA_STEP(0)
            FA_STEP(1)
            FA_STEP(2)
            FA_STEP(3)
            FA_STEP(4)
            FA_STEP(5)
            FA_STEP(6)
            FA_STEP(7)
        }
#undef FA_STEP
#ifdef FA_STAGE07_TUNING
        if constexpr (std::is_same_v<T, __nv_bfloat16>) {
            switch (step - kRoadSteps) {
#define FA_CANDIDATE(I)                         \
    case I: {                                   \
        using F = FeaturesOf<CandidateSet<I>>;  \
        geo = geometry<T, D, F>();              \
        return launch<T, D, F>;                 \
    }
                FA_CANDIDATE(0) FA_CANDIDATE(1) FA_CANDIDATE(2) FA_CANDIDATE(3)
                FA_CANDIDATE(4) FA_CANDIDATE(5) FA_CANDIDATE(6) FA_CANDIDATE(7)
#undef FA_CANDIDATE
                case kInOrderCandidate:
                    geo = geometry<T, D, InOrder<RoadStep<D, 0>>>();
                    return launch<T, D, InOrder<RoadStep<D, 0>>>;
            }
        }
#endif
    }
    return nullptr;
}

template <class T>
LaunchFn<T> find_launcher(int d, int step, Geometry& geo) {
    switch (d) {
        case 32: return find_for_d<T, 32>(step, geo);
        case 64: return find_for_d<T, 64>(step, geo);
        case 128: return find_for_d<T, 128>(step, geo);
        case 256: return find_for_d<T, 256>(step, geo);
        default: return nullptr;
    }
}

/// The launcher and geometry of the final kernel for `options` at head dimension D (launch.cuh's
/// with_final_features: the final kernel itself, or it with stage 10's switches).
template <class T, int D>
LaunchFn<T> find_final_for_d(const ResolvedOptions& options, Geometry& geo) {
    return with_final_features<D>(options, [&](auto features) {
        using F = decltype(features);
        geo = geometry<T, D, F>();
        return LaunchFn<T>(launch<T, D, F>);
    });
}

template <class T>
LaunchFn<T> find_final_launcher(int d, const ResolvedOptions& options, Geometry& geo) {
    switch (d) {
        case 32: return find_final_for_d<T, 32>(options, geo);
        case 64: return find_final_for_d<T, 64>(options, geo);
        case 128: return find_final_for_d<T, 128>(options, geo);
        case 256: return find_final_for_d<T, 256>(options, geo);
        default: return nullptr;
    }
}

/// The launcher and geometry of a packed call at head dimension D (launch.cuh's
/// with_varlen_features).
template <class T, int D>
LaunchFn<T> find_varlen_for_d(const ResolvedOptions& options, Geometry& geo) {
    return with_varlen_features<D>(options, [&](auto features) {
        using F = decltype(features);
        geo = geometry<T, D, F>();
        return LaunchFn<T>(launch<T, D, F>);
    });
}

template <class T>
LaunchFn<T> find_varlen_launcher(int d, const ResolvedOptions& options, Geometry& geo) {
    switch (d) {
        case 32: return find_varlen_for_d<T, 32>(options, geo);
        case 64: return find_varlen_for_d<T, 64>(options, geo);
        case 128: return find_varlen_for_d<T, 128>(options, geo);
        case 256: return find_varlen_for_d<T, 256>(options, geo);
        default: return nullptr;
    }
}

int resolve(int step) { return step < 0 ? kFinalStep : step; }

template <class T>
void require_device_view(const char* name, const View4<T>& view) {
    cuda::require_16_byte_rows("stage 07", name, view);
}

template <class T>
void run_device(const Problem& p, const ModelOptions& options, View4<const T> q, View4<const T> k, View4<const T> v,
                View4<T> o, View3<float> lse, cudaStream_t stream, int step) {
    step = resolve(step);
    check_supported(p, step);
    const ResolvedOptions m = resolve_options(p, options);
    if (!m.plain() && step != kFinalStep) {
        throw InputError("stage 07: grouped heads, a window, a soft cap or dropout run on the final kernel only (step " +
                         std::to_string(kFinalStep) + "), not on step " + std::to_string(step));
    }
    Geometry geo{};
    const LaunchFn<T> launcher =
        step == kFinalStep ? find_final_launcher<T>(int(p.head_dim), m, geo) : find_launcher<T>(int(p.head_dim), step, geo);
    if (launcher == nullptr) throw InputError("stage 07: no kernel is built for this head dimension and step");
    require_device_view("q", q);
    require_device_view("k", k);
    require_device_view("v", v);
    require_device_view("o", o);
    if (!m.plain()) {
        // The kernel reads K/V head h / (Hq/Hk) of k and v: views of another head count would be
        // read past their end or only in part.
        const int64_t hk = p.heads / m.kv_group;
        if (q.shape[1] != p.heads || k.shape[1] != hk || v.shape[1] != hk) {
            throw InputError("stage 07: q must have " + std::to_string(p.heads) + " heads and k, v " + std::to_string(hk) +
                             " (Hq / Hk = " + std::to_string(m.kv_group) + "); got " + std::to_string(q.shape[1]) + ", " +
                             std::to_string(k.shape[1]) + " and " + std::to_string(v.shape[1]));
        }
    }
    launcher(make_args<T>(p, m, q, k, v, o, lse, geo), stream);
}

template <class T>
void run_varlen_device(const VarlenProblem& vp, const MaxSeqlens& max, View4<const T> q, View4<const T> k,
                       View4<const T> v, View4<T> o, View3<float> lse, const VarlenDeviceArrays& arrays,
                       cudaStream_t stream) {
    const ResolvedOptions m = resolve_varlen(vp, max);
    Geometry geo{};
    const LaunchFn<T> launcher = find_varlen_launcher<T>(int(vp.head_dim), m, geo);
    if (launcher == nullptr) {
        throw InputError("head_dim " + std::to_string(vp.head_dim) + " is not supported by stage 07: use 32, 64, 128 or 256");
    }
    // The packed views: (1, H, total, d) for q, k, v, o and (1, Hq, total_q) for the LSE.
    const auto require_shape = [](const char* name, const auto& view, int64_t heads, int64_t total, int64_t last) {
        if (view.shape[0] != 1 || view.shape[1] != heads || view.shape[2] != total || view.shape[3] != last) {
            throw InputError(std::string("stage 07: packed ") + name + " must be (1, " + std::to_string(heads) + ", " +
                             std::to_string(total) + ", " + std::to_string(last) + "), a (total, H, d) buffer; got (" +
                             std::to_string(view.shape[0]) + ", " + std::to_string(view.shape[1]) + ", " +
                             std::to_string(view.shape[2]) + ", " + std::to_string(view.shape[3]) + ")");
        }
    };
    require_shape("q", q, vp.heads_q, vp.total_q, vp.head_dim);
    require_shape("k", k, vp.heads_k, vp.total_k, vp.head_dim);
    require_shape("v", v, vp.heads_k, vp.total_k, vp.head_dim);
    require_shape("o", o, vp.heads_q, vp.total_q, vp.head_dim);
    if (lse.shape[0] != 1 || lse.shape[1] != vp.heads_q || lse.shape[2] != vp.total_q) {
        throw InputError("stage 07: the packed LSE must be (1, " + std::to_string(vp.heads_q) + ", " +
                         std::to_string(vp.total_q) + "), an (Hq, total_q) buffer");
    }
    require_device_view("q", q);
    require_device_view("k", k);
    require_device_view("v", v);
    require_device_view("o", o);
    if (vp.total_q > INT32_MAX || vp.total_k > INT32_MAX) {
        throw InputError("stage 07: total_q and total_k must fit in int32 (cu_seqlens are int32)");
    }
    const std::vector<int32_t> schedule = tile_schedule(vp, m, geo.br, geo.bc);
    const int64_t entries = int64_t(schedule.size() / 2);
    if (entries * vp.heads_q >= (int64_t(1) << 31)) {
        throw InputError("stage 07: the packed problem needs more than 2^31 thread blocks");
    }
    if (entries == 0) return;  // every sequence is empty: nothing to write
    if (arrays.cu_seqlens_q == nullptr || arrays.cu_seqlens_k == nullptr || arrays.schedule == nullptr) {
        throw InputError("stage 07: a packed call needs cu_seqlens_q, cu_seqlens_k and the schedule on the device");
    }
    // From pageable memory: the call returns once the schedule is staged, so the vector may go.
    FA_CUDA_CHECK(cudaMemcpyAsync(arrays.schedule, schedule.data(), schedule.size() * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream));
    launcher(make_varlen_args<T>(vp, max, m, q, k, v, o, lse, geo, arrays.cu_seqlens_q, arrays.cu_seqlens_k,
                                 arrays.schedule, entries),
             stream);
}

template <class T>
AttentionFn host_entry_for(int step) {
    return [step](const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<float> o,
                  View3<float> lse) {
        check_supported(p, resolve(step));
        // The 16-bit copies keep the layout of the float32 views (an axis with the larger stride
        // comes first), so the kernel reads either layout through its strides.
        const Layout layout = q.stride[1] >= q.stride[2] ? Layout::BHND : Layout::BNHD;
        cuda::DeviceTensors dev(p, q, k, v, o, lse);
        cuda::HalfTensors<T> half(p, layout);
        half.load(dev.q, dev.k, dev.v);
        run_device<T>(p, ModelOptions{}, half.q, half.k, half.v, half.o, dev.lse, nullptr, step);
        cuda::convert(View4<const T>(half.o), dev.o);
        FA_CUDA_CHECK(cudaDeviceSynchronize());
        dev.copy_outputs_to(o, lse);
    };
}

}  // namespace

const std::vector<Step>& road() {
    static const std::vector<Step> steps = [] {
        std::vector<Step> s = {
            {"tensor cores", "mma.sync m16n8k16; fragments by 32-bit shared loads; load, wait, compute; P via shared memory; expf"},
            {"ldmatrix", "fragments by ldmatrix (.trans for V): one instruction per four 8x8 matrices"},
            {"swizzle", "XOR-swizzled shared tiles: ldmatrix and cp.async free of bank conflicts"},
            {"pipeline", "cp.async ring two tiles deep: tile j+1 loads while tile j is computed"},
            {"P in registers", "P rounded in registers and used as the A operand of P V (no shared memory)"},
            {"exp2", "log2(e) folded into the scale: one FFMA and one ex2 per score"},
            {"tile shape", "the block shape measured best for this d: Br, Bc, warps, pipeline depth, Q kept in registers or re-read"},
            {"causal skip", "tiles above the diagonal skipped, only the diagonal masked"},
            {"lazy rescale", "O rescaled only in tiles where some row's maximum grew, at d = 128 where it measured faster "
                             "(elsewhere the same kernel as the step before); the final kernel"},
        };
#ifdef FA_STAGE07_TUNING
        for (const CandidateInfo& c : kCandidates) {
            s.push_back({"Br" + std::to_string(c.br) + " Bc" + std::to_string(c.bc) + " w" + std::to_string(c.warps) + " s" +
                             std::to_string(c.stages) + (c.q_in_registers ? "" : " Qsmem") + (c.lazy ? " lazy" : "") +
                             " minb" + std::to_string(c.min_blocks) + " Bn" + std::to_string(c.bn),
                         "tuning candidate (bf16 only)"});
        }
        s.push_back({"step 0 in order", "step 0 with its query tiles in order under a causal mask (stage 06's order where its "
                                        "rule picks it) instead of heaviest first (bf16 only)"});
#endif
        return s;
    }();
    return steps;
}

int final_step() { return kFinalStep; }

const std::vector<int>& supported_head_dims() {
    static const std::vector<int> dims{32, 64, 128, 256};
    return dims;
}

const std::vector<int>& road_head_dims() {
    static const std::vector<int> dims{64, 128};
    return dims;
}

void check_supported(const Problem& p, int step) {
    step = resolve(step);
    const int steps = int(road().size());
    if (step >= steps) {
        throw InputError("--step " + std::to_string(step) + " does not exist: stage 07 has steps 0 to " + std::to_string(steps - 1));
    }
    const auto& dims = step == kFinalStep ? supported_head_dims() : road_head_dims();
    bool ok = false;
    std::string list;
    for (int d : dims) {
        ok = ok || d == p.head_dim;
        list += (list.empty() ? "" : ", ") + std::to_string(d);
    }
    if (!ok) {
        throw InputError("--head-dim " + std::to_string(p.head_dim) + " is not supported by stage 07" +
                         (step == kFinalStep ? "" : " step " + std::to_string(step)) + ": use " + list);
    }
    if (p.seq_q > (int64_t(1) << 30) || p.seq_k > (int64_t(1) << 30) || p.batch * p.heads > (int64_t(1) << 24)) {
        throw InputError("stage 07 takes at most 2^30 query or key rows and 2^24 batch x heads (32-bit tile indices)");
    }
    if ((p.seq_q + 63) / 64 * p.batch * p.heads >= (int64_t(1) << 31)) {
        throw InputError("stage 07: the problem needs more than 2^31 thread blocks");
    }
}

void attention_device(const Problem& p, View4<const __nv_bfloat16> q, View4<const __nv_bfloat16> k,
                      View4<const __nv_bfloat16> v, View4<__nv_bfloat16> o, View3<float> lse, cudaStream_t stream, int step) {
    run_device<__nv_bfloat16>(p, ModelOptions{}, q, k, v, o, lse, stream, step);
}

void attention_device(const Problem& p, View4<const __half> q, View4<const __half> k, View4<const __half> v,
                      View4<__half> o, View3<float> lse, cudaStream_t stream, int step) {
    run_device<__half>(p, ModelOptions{}, q, k, v, o, lse, stream, step);
}

void attention_device(const Problem& p, const ModelOptions& options, View4<const __nv_bfloat16> q,
                      View4<const __nv_bfloat16> k, View4<const __nv_bfloat16> v, View4<__nv_bfloat16> o, View3<float> lse,
                      cudaStream_t stream) {
    run_device<__nv_bfloat16>(p, options, q, k, v, o, lse, stream, kFinalStep);
}

void attention_device(const Problem& p, const ModelOptions& options, View4<const __half> q, View4<const __half> k,
                      View4<const __half> v, View4<__half> o, View3<float> lse, cudaStream_t stream) {
    run_device<__half>(p, options, q, k, v, o, lse, stream, kFinalStep);
}

int64_t varlen_schedule_ints(const VarlenProblem& problem) {
    int64_t tiles = 0;
    for (int64_t b = 0; b < problem.batch(); ++b) tiles += (problem.seq_q(b) + 63) / 64;  // Br >= 64 in every instance
    return 2 * tiles;
}

void attention_varlen_device(const VarlenProblem& problem, const MaxSeqlens& max, View4<const __nv_bfloat16> q,
                             View4<const __nv_bfloat16> k, View4<const __nv_bfloat16> v, View4<__nv_bfloat16> o,
                             View3<float> lse, const VarlenDeviceArrays& arrays, cudaStream_t stream) {
    run_varlen_device<__nv_bfloat16>(problem, max, q, k, v, o, lse, arrays, stream);
}

void attention_varlen_device(const VarlenProblem& problem, const MaxSeqlens& max, View4<const __half> q,
                             View4<const __half> k, View4<const __half> v, View4<__half> o, View3<float> lse,
                             const VarlenDeviceArrays& arrays, cudaStream_t stream) {
    run_varlen_device<__half>(problem, max, q, k, v, o, lse, arrays, stream);
}

AttentionFn host_entry(DType dtype, int step) {
    return dtype == DType::BF16 ? host_entry_for<__nv_bfloat16>(step) : host_entry_for<__half>(step);
}

void attention(const Problem& p, View4<const float> q, View4<const float> k, View4<const float> v, View4<float> o,
               View3<float> lse) {
    host_entry(DType::BF16)(p, q, k, v, o, lse);
}

std::string describe_config(const Problem& p, int step) {
    step = resolve(step);
    check_supported(p, step);
    Geometry geo{};
    find_launcher<__nv_bfloat16>(int(p.head_dim), step, geo);
    // Tile classes per (batch, head), as the kernel sees them.
    const int q_tiles = int((p.seq_q + geo.br - 1) / geo.br), k_tiles = int((p.seq_k + geo.bc - 1) / geo.bc);
    long long unmasked = 0, masked = 0;
    for (int t = 0; t < q_tiles; ++t) {
        int full = 0, end = 0;
        key_tiles(t * geo.br, geo.br, geo.bc, int(p.seq_q), int(p.seq_k), p.causal, geo.causal_skip, full, end);
        unmasked += full;
        masked += end - full;
    }
    const long long total = (long long)q_tiles * k_tiles;
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "step %d (%s): Br=%d Bc=%d, %d warps (%d query rows each), %d-stage cp.async ring, Q %s, %zu B shared memory; "
                  "per head %lld of %lld key tiles unmasked, %lld masked, %lld skipped",
                  step, road()[size_t(step)].name.c_str(), geo.br, geo.bc, geo.warps, geo.br / geo.warps, geo.stages,
                  geo.q_in_registers ? "in registers" : "re-read from shared memory", geo.smem,
                  unmasked, total, masked, total - unmasked - masked);
    return buf;
}

}  // namespace fa::stage07
