// Stage 11 executable: the Hopper kernel (wgmma, TMA, warp specialization) in bf16 or fp16,
// checked against stage 07 (mma.sync), stage 04 (CPU tiling) and the float64 reference.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>

#include "../04_cpu_tiling/attention.hpp"
#include "../07_pipelined_fused_kernel/attention.cuh"
#include "attention.cuh"
#include "fa/cuda/buffer.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/half.hpp"
#include "fa/cuda/stage.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/cuda/timing.hpp"
#include "fa/error.hpp"
#include "fa/json.hpp"
#include "fa/stage.hpp"
#include "timeline.hpp"

namespace {

fa::cuda::DType g_dtype = fa::cuda::DType::BF16;
int g_step = -1;  // the final kernel
std::string g_timeline;    // --timeline: where the instrumented run's marks go ("": no timeline)
int g_timeline_block = -1;  // --timeline-block: which block records (-1: the first of the second wave)

//! [timeline_json]
/// Writes the recorded block's marks as JSON (docs/make_timeline.py draws them): the problem,
/// the block and what it computes, the times of the plain and the instrumented kernel, the SM's
/// nanoseconds per cycle as the block measured them, and per warpgroup its marks
/// [cycle from the block's first mark, code, tile].
void write_timeline_json(const std::string& path, const fa::Problem& p, const fa::stage11::TimelineBlock& t, int step,
                         const std::vector<fa::cuda::TimelineMark>& marks, double plain_ms, double instrumented_ms) {
    const int groups = 1 + t.consumers;
    const auto marks_of = [&](int g) { return marks.data() + size_t(g) * fa::stage11::kTimelineMarks; };
    const auto count_of = [&](int g) {
        int n = 0;
        while (n < fa::stage11::kTimelineMarks && marks_of(g)[n].cycle != 0) ++n;
        return n;
    };
    uint64_t first = ~uint64_t(0);
    for (int g = 0; g < groups; ++g) {
        if (count_of(g) > 0) first = std::min(first, marks_of(g)[0].cycle);
    }
    // ns per cycle from the warpgroup whose first and last marks (both read %globaltimer) lie furthest apart.
    double ns_per_cycle = 0.0;
    uint64_t longest = 0;
    for (int g = 0; g < groups; ++g) {
        const fa::cuda::TimelineMark* wg = marks_of(g);
        const int n = count_of(g);
        if (n >= 2 && wg[0].what == fa::stage11::kMarkStart && wg[n - 1].what == fa::stage11::kMarkEnd &&
            wg[n - 1].cycle - wg[0].cycle > longest) {
            longest = wg[n - 1].cycle - wg[0].cycle;
            ns_per_cycle = double(uint32_t(wg[n - 1].ns - wg[0].ns)) / double(longest);
        }
    }
    const fa::cuda::GpuInfo gpu = fa::cuda::gpu_info();
    fa::Json r = {{"stage", "11"}, {"step", step}, {"step_name", fa::stage11::road()[size_t(step)].name}, {"dtype", "bf16"},
                  {"B", p.batch}, {"H", p.heads}, {"Nq", p.seq_q}, {"Nk", p.seq_k}, {"d", p.head_dim}, {"causal", p.causal},
                  {"gpu", gpu.name}, {"date", fa::record_date()}, {"sm_count", gpu.sm_count},
                  {"blocks", t.blocks}, {"block", t.block}, {"q_tile", t.q_tile}, {"q_tiles", t.q_tiles}, {"batch", t.batch},
                  {"head", t.head}, {"key_tiles_unmasked", t.full}, {"key_tiles", t.end}, {"br", t.br}, {"bc", t.bc},
                  {"consumers", t.consumers}, {"ping_pong", t.ping_pong}, {"overlap", t.overlap}, {"persistent", t.persistent},
                  {"median_ms", plain_ms}, {"median_ms_instrumented", instrumented_ms}, {"ns_per_cycle", ns_per_cycle}};
    for (int c = 0; c < fa::stage11::kMarkCodes; ++c) r["codes"].push_back(fa::stage11::timeline_code_name(c));
    for (int g = 0; g < groups; ++g) {
        fa::Json wg_marks = fa::Json::array();
        for (int n = 0; n < count_of(g); ++n) {
            const fa::cuda::TimelineMark& m = marks_of(g)[n];
            wg_marks.push_back({m.cycle - first, m.what, m.tile});
        }
        r["warpgroups"].push_back({{"role", g == 0 ? "producer" : "consumer " + std::to_string(g - 1)}, {"marks", wg_marks}});
    }
    std::ofstream out(path);
    out << fa::json_text(r) << '\n';
    if (!out) throw fa::InputError("--timeline " + path + ": cannot write this file");
}
//! [timeline_json]

// --bench: the 16-bit copies of the inputs are made once, then the kernel alone is timed.
template <class T>
fa::TimingStats bench_half(const fa::Problem& p, const fa::Inputs& in, const fa::CommonOptions& opt) {
    const fa::HostTensor o(p.batch, p.heads, p.seq_q, p.head_dim, opt.layout);
    const std::vector<float> lse(size_t(p.lse_elems()));
    fa::cuda::DeviceTensors dev(p, in.q.cview(), in.k.cview(), in.v.cview(), o.cview(),
                                fa::make_view3(lse.data(), p.batch, p.heads, p.seq_q));
    fa::cuda::HalfTensors<T> half(p, opt.layout);
    half.load(dev.q, dev.k, dev.v);
    const fa::TimingStats stats = fa::cuda::time_on_gpu(
        [&](cudaStream_t s) { fa::stage11::attention_device(p, half.q, half.k, half.v, half.o, dev.lse, s, g_step); },
        std::max(opt.warmup, 1), opt.repeat);
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        if (!g_timeline.empty()) {
            // The instrumented build: timed as the plain one was, then run once more with the marks zeroed.
            const int step = g_step < 0 ? fa::stage11::final_step() : g_step;
            const fa::stage11::TimelineBlock t = fa::stage11::timeline_block(p, step, g_timeline_block);
            const size_t count = size_t(1 + t.consumers) * fa::stage11::kTimelineMarks;
            fa::cuda::DeviceBuffer<fa::cuda::TimelineMark> marks(count);
            const auto run = [&](cudaStream_t s) {
                fa::stage11::attention_device_timeline(p, half.q, half.k, half.v, half.o, dev.lse, s, step, marks.data(), t.block);
            };
            const fa::TimingStats traced = fa::cuda::time_on_gpu(run, std::max(opt.warmup, 1), opt.repeat);
            FA_CUDA_CHECK(cudaMemset(marks.data(), 0, marks.bytes()));
            run(nullptr);
            FA_CUDA_CHECK(cudaDeviceSynchronize());
            std::vector<fa::cuda::TimelineMark> host(count);
            marks.copy_to_host(host.data(), count);
            write_timeline_json(g_timeline, p, t, step, host, stats.median_ms, traced.median_ms);
            const std::string work =
                t.persistent ? "work items taken at run time"
                             : "query tile " + std::to_string(t.q_tile) + " of batch " + std::to_string(t.batch) + ", head " +
                                   std::to_string(t.head) + "; " + std::to_string(t.end) + " key tiles, " + std::to_string(t.full) +
                                   " unmasked";
            std::printf("timeline: block %d of %d (%s), %d warpgroups -> %s; instrumented kernel %.4f ms, plain %.4f ms "
                        "(medians)\n",
                        t.block, t.blocks, work.c_str(), 1 + t.consumers, g_timeline.c_str(), traced.median_ms, stats.median_ms);
        }
    }
    return stats;
}

}  // namespace

int main(int argc, char** argv) {
    fa::StageSpec spec;
    spec.number = "11";
    spec.title = "Hopper kernel";
    spec.description =
        "Stage 07's algorithm on Hopper's machinery, bf16 or fp16 with float32 accumulation: wgmma from shared\n"
        "memory (S = Q K^T) and from registers (O += P V), the TMA loading 128-byte-swizzled tiles onto mbarriers,\n"
        "a producer warpgroup and consumer warpgroups (setmaxnreg). d = 64, 128; sm_90a (H100, H200) only.\n"
        "Checked against stage 07 (mma.sync), stage 04 (CPU tiling) and the float64 reference by the low-precision\n"
        "rule. --step runs an earlier step of the road (0: stage 07's kernel itself).";
    spec.run = [](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                  fa::View4<float> o, fa::View3<float> lse) { fa::stage11::host_entry(g_dtype, g_step)(p, q, k, v, o, lse); };
    spec.check_supported = [](const fa::Problem& p) { fa::stage11::check_supported(p, g_step); };
    spec.describe_config = [](const fa::Problem& p) {
        return fa::cuda::to_string(g_dtype) + ", " + fa::stage11::describe_config(p, g_step);
    };
    spec.intermediate_what = "16-bit copies of q, k, v, o on the device; S_ij, P_ij, m_i, l_i and O_i stay on chip";
    spec.intermediate_bytes = [](const fa::Problem& p) { return 2.0 * (2.0 * double(p.q_elems()) + 2.0 * double(p.kv_elems())); };
    spec.needs_gpu = true;
    spec.gpu_unavailable_reason = fa::stage11::gpu_unavailable_reason;
    spec.add_options = [](CLI::App& app) {
        app.add_option_function<std::string>(
               "--dtype", [](const std::string& s) { g_dtype = s == "fp16" ? fa::cuda::DType::FP16 : fa::cuda::DType::BF16; },
               "16-bit type of the inputs and of O: bf16 (range of float32, 8 significant bits) or fp16 (11 bits, max 65504)")
            ->check(CLI::IsMember({"bf16", "fp16"}))
            ->default_str("bf16");
        app.add_option("--step", g_step, fa::road_help(fa::stage11::road(), fa::stage11::final_step()))->check(CLI::Range(0, int(fa::stage11::road().size()) - 1));
        app.add_option("--timeline", g_timeline,
                       "with --bench, bf16: also time the step's instrumented build and write one block's timeline to this "
                       "JSON file (docs/make_timeline.py draws it; steps " + fa::stage11::timeline_steps_text() + ")");
        app.add_option("--timeline-block", g_timeline_block,
                       "with --timeline: the block that records (default: the first block of the second wave)")
            ->check(CLI::NonNegativeNumber);
    };
    spec.validate_options = [](const fa::CommonOptions& opt) {
        if (g_timeline.empty()) {
            if (g_timeline_block >= 0) throw fa::InputError("--timeline-block needs --timeline FILE");
            return;
        }
        if (!opt.bench) throw fa::InputError("--timeline records during the benchmark: add --bench");
        if (g_dtype != fa::cuda::DType::BF16) throw fa::InputError("--timeline: the instrumented build is bf16; use --dtype bf16");
        fa::stage11::timeline_block(opt.problem, g_step, g_timeline_block);  // the step and the block exist, or exit 2
    };
    spec.precision = [] { return g_dtype == fa::cuda::DType::BF16 ? fa::Precision::BFloat16 : fa::Precision::Float16; };
    spec.bench = [](const fa::Problem& p, const fa::Inputs& in, const fa::CommonOptions& opt) {
        return g_dtype == fa::cuda::DType::BF16 ? bench_half<__nv_bfloat16>(p, in, opt) : bench_half<__half>(p, in, opt);
    };
    spec.after_bench = fa::cuda::print_tensor_core_report;
    // Stage 07 in the same precision: the rule's limits are those of --dtype, so the earlier stage
    // must round as this one does.
    spec.checked_against.push_back({"stage 07 (mma.sync, same --dtype)",
                                    [](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k,
                                       fa::View4<const float> v, fa::View4<float> o, fa::View3<float> lse) {
                                        fa::stage07::host_entry(g_dtype)(p, q, k, v, o, lse);
                                    },
                                    {}});
    // The CPU check where it costs at most about as much as the float64 reference (the GPU stage
    // 07 checks every size).
    spec.checked_against.push_back({"stage 04 (CPU tiling)", fa::stage04::attention, [](const fa::Problem& p) {
                                        return 4.0 * double(p.batch * p.heads) * double(p.seq_q) * double(p.seq_k) *
                                                   double(p.head_dim) <= 2e10;
                                    }});
    return fa::run_stage(argc, argv, spec);
}
