// bench_gpu: times the GPU stages over a sweep of shapes and writes JSON and CSV.
//
// The sweep keeps the work per launch comparable across sequence lengths: B * N = 16384 tokens
// and H * d = 2048 features, so N = 512 runs 32 sequences and N = 16384 runs one. Each point is
// timed with CUDA events after warm-up runs, with the L2 flushed before every run, and the median
// of --repeat runs is reported, in TFLOP/s by fa::attention_flops (4 B H Nq Nk d, halved for
// causal).
//
// Stages 05 and 06 run in float32 on one set of inputs per shape; stage 07 runs in bf16 and/or
// fp16 on copies of the same inputs rounded once per shape, at the final kernel or at any steps
// of its road (--steps). After timing, every point is checked: stage 05 against stage 06 (both
// float32: they must agree to 1e-4), stage 07 against stage 06's float32 output (a gross-error
// guard only: BAD above a relative L2 error of 2e-2 or on any NaN; the tolerances that decide
// correctness live in the tests). A failed check is marked, the sweep goes on, and the exit code
// is 1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "../stages/05_shared_memory_kernel/attention.cuh"
#include "../stages/06_causal_masking/attention.cuh"
#include "../stages/07_pipelined_fused_kernel/attention.cuh"
#include "fa/counts.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/half.hpp"
#include "fa/cuda/stage.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/cuda/timing.hpp"
#include "fa/error.hpp"
#include "fa/metrics.hpp"

namespace {

// Stage 07 against stage 06: bf16 rounding of q, k, v, P and O leaves a relative L2 error of a
// few 1e-3 on these inputs; 2e-2 is far above that and far below what a wrong tile or a missed
// rescale gives.
constexpr double kStage07GrossRelL2 = 2e-2;
// Stage 05 against stage 06: the same float32 arithmetic in a different order.
constexpr double kFp32MaxAbs = 1e-4;

struct Record {
    std::string impl;       // "stage05", "stage06", "stage07" (the final kernel), "stage07_step<i>"
    std::string dtype;      // "fp32", "bf16", "fp16"
    int step = -1;          // stage 07: index into fa::stage07::road(); -1 for the float32 stages
    std::string step_name;  // stage 07: road()[step].name
    fa::Problem problem;
    double median_ms = 0, min_ms = 0, max_ms = 0, tflops = 0;
    int sm_clock_mhz = -1;
    double heavy_first_ms = -1;  // stage 06, causal: the same run with the query tiles heaviest first
    double in_order_ms = -1;     // stage 06, causal: and in order
    std::string check;           // "ok", "BAD", or "" when not checked
    double check_max_abs = -1, check_rel_l2 = -1;
};

std::string today() {
    const std::time_t now = std::time(nullptr);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
    return buf;
}

// A string as a JSON literal.
std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out + "\"";
}

// A string as a CSV field: quoted when it holds a comma or a quote.
std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string out = "\"";
    for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    return out + "\"";
}

// A non-negative figure with six significant digits, or "" for the -1 of "not measured".
std::string optional_number(double x) {
    if (x < 0) return "";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", x);
    return buf;
}

// A device array of floats, copied to the host.
std::vector<float> to_host(const float* device, int64_t n) {
    std::vector<float> host(static_cast<size_t>(n));
    FA_CUDA_CHECK(cudaMemcpy(host.data(), device, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}

// Largest |a - b| over two equally long device arrays.
double max_abs_diff(const float* a, const float* b, int64_t n) {
    const std::vector<float> ha = to_host(a, n), hb = to_host(b, n);
    double worst = 0;
    for (size_t i = 0; i < ha.size(); ++i) {
        const double d = std::fabs(double(ha[i]) - double(hb[i]));
        if (!(d <= worst)) worst = d;  // NaN counts as the worst
    }
    return worst;
}

// The stage 07 steps --steps names: indices into road(), or every step for "all" / "road".
// Throws fa::InputError naming the bad value and the steps there are.
std::vector<int> resolve_steps(const std::vector<std::string>& args) {
    const auto& road = fa::stage07::road();
    if (args.empty()) return {fa::stage07::final_step()};
    std::vector<int> steps;
    for (const std::string& a : args) {
        if (a == "all" || a == "road") {
            for (int i = 0; i < int(road.size()); ++i) steps.push_back(i);
            continue;
        }
        size_t used = 0;
        int step = -1;
        try {
            step = std::stoi(a, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != a.size() || step < 0 || step >= int(road.size())) {
            std::string list;
            for (size_t i = 0; i < road.size(); ++i) list += "\n  " + std::to_string(i) + " " + road[i].name;
            throw fa::InputError("--steps " + a + " is not a step of stage 07: use all, road, or numbers from 0 to " +
                                 std::to_string(road.size() - 1) + ":" + list);
        }
        steps.push_back(step);
    }
    std::sort(steps.begin(), steps.end());
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    return steps;
}

// Stage 07's inputs in both 16-bit types, rounded once per shape from the float32 inputs.
struct HalfInputs {
    std::optional<fa::cuda::HalfTensors<__nv_bfloat16>> bf16;
    std::optional<fa::cuda::HalfTensors<__half>> fp16;
};

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"flashcourse bench_gpu: GPU stages 05, 06 (float32) and 07 (bf16, fp16) over a sweep of shapes, "
                 "timed with CUDA events"};
    std::vector<int64_t> sizes{512, 1024, 2048, 4096, 8192, 16384};
    std::vector<int64_t> head_dims{64, 128};
    std::vector<std::string> stages{"05", "06", "07"};
    std::vector<std::string> dtypes{"bf16", "fp16"};
    std::vector<std::string> step_args;
    std::string causal_mode = "both";
    int64_t tokens = 16384, width = 2048;
    int repeat = 30, warmup = 5;
    bool check = true;
    bool schedule_ablation = true;
    double mma_ceiling_tflops = 0;
    std::string json_path = "bench_gpu.json", csv_path = "bench_gpu.csv";
    app.add_option("--sizes", sizes, "sequence lengths N (Nq = Nk)")->capture_default_str();
    app.add_option("--head-dims", head_dims, "head dimensions d")->capture_default_str();
    app.add_option("--stages", stages, "stages to time: 05, 06 (float32), 07 (bf16/fp16)")
        ->check(CLI::IsMember({"05", "06", "07"}))
        ->capture_default_str();
    app.add_option("--dtypes", dtypes, "16-bit types stage 07 runs in")->check(CLI::IsMember({"bf16", "fp16"}))->capture_default_str();
    app.add_option("--steps", step_args,
                   "stage 07 steps to time: indices into its road (see stage07 --help), or all / road for every step, "
                   "with the tuning candidates of a -DFA_STAGE07_TUNING=ON build (default: the final kernel)");
    app.add_option("--causal", causal_mode, "no, yes or both")->check(CLI::IsMember({"no", "yes", "both"}))->capture_default_str();
    app.add_option("--tokens", tokens, "B * N: batch = tokens / N")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--width", width, "H * d: heads = width / d")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--repeat", repeat, "timed runs per point (the median is reported)")->check(CLI::Range(1, 10000))->capture_default_str();
    app.add_option("--warmup", warmup, "untimed runs before timing")->check(CLI::Range(0, 1000))->capture_default_str();
    app.add_option("--check", check,
                   "check every point: stage 05 against stage 06, stage 07 against stage 06's float32 output (d <= 128)")
        ->capture_default_str();
    app.add_option("--schedule-ablation", schedule_ablation,
                   "for causal stage 06 points, also time both orders of the query tiles (heaviest first, in order)")
        ->capture_default_str();
    app.add_option("--mma-ceiling-tflops", mma_ceiling_tflops,
                   "the mma.sync bf16 rate mma_ceiling measured: stage 07 points then print their fraction of it")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--json", json_path, "where to write the results as JSON")->capture_default_str();
    app.add_option("--csv", csv_path, "where to write the results as CSV")->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    std::vector<int> steps07;
    try {
        steps07 = resolve_steps(step_args);
    } catch (const fa::InputError& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return fa::kExitBadInput;
    }
    const std::string reason = fa::cuda::gpu_unavailable_reason();
    if (!reason.empty()) {
        std::printf("skipped: bench_gpu needs a CUDA GPU (%s)\n", reason.c_str());
        return fa::kExitSkipped;
    }
    // Course order, whatever the command line's: stage 06's output is then the reference stage 07 meets.
    std::sort(stages.begin(), stages.end());
    stages.erase(std::unique(stages.begin(), stages.end()), stages.end());
    const bool has05 = std::count(stages.begin(), stages.end(), "05") > 0;
    const bool has06 = std::count(stages.begin(), stages.end(), "06") > 0;
    const bool has07 = std::count(stages.begin(), stages.end(), "07") > 0;
    std::vector<bool> causal_values;
    if (causal_mode != "yes") causal_values.push_back(false);
    if (causal_mode != "no") causal_values.push_back(true);
    const fa::cuda::GpuInfo gpu = fa::cuda::gpu_info();
    const std::string date = today();
    const auto& road = fa::stage07::road();
    std::printf("gpu        %s\n", gpu.describe().c_str());
    std::printf("method     CUDA events, %d warm-up runs, L2 flushed (%zu MiB written) before each of %d timed runs, median\n",
                warmup, fa::cuda::l2_flush_bytes() >> 20, repeat);
    if (has07) {
        std::printf("stage 07   %s; steps:", [&] {
            std::string s;
            for (const std::string& t : dtypes) s += (s.empty() ? "" : " and ") + t;
            return s;
        }().c_str());
        for (int s : steps07) std::printf(" %d (%s)", s, road[size_t(s)].name.c_str());
        std::printf("%s\n", int(road.size()) > fa::stage07::final_step() + 1 ? "; tuning build" : "");
    }

    const auto stage06_with = [](fa::stage06::Schedule schedule) -> fa::cuda::DeviceAttentionFn {
        return [schedule](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                          fa::View4<float> o, fa::View3<float> lse, cudaStream_t stream) {
            fa::stage06::attention_device(p, q, k, v, o, lse, stream, schedule);
        };
    };
    std::vector<Record> records;
    size_t points = sizes.size() * head_dims.size() * causal_values.size() *
                    ((has05 ? 1 : 0) + (has06 ? 1 : 0) + (has07 ? dtypes.size() * steps07.size() : 0));
    size_t done = 0;
    bool any_bad = false;
    std::set<std::string> skipped;  // (stage, dtype, step, d) already reported as unsupported

    // Runs `launch` once untimed; false (with one line, once per `key`) when the entry point refuses
    // the problem (a head dimension or step that has no kernel), so the sweep goes on without it.
    const auto supported = [&](const std::string& key, const std::function<void(cudaStream_t)>& launch) {
        try {
            launch(nullptr);
            return true;
        } catch (const fa::InputError& e) {
            if (skipped.insert(key).second) std::printf("          skipped %s: %s\n", key.c_str(), e.what());
            --points;  // planned, not run
            return false;
        }
    };
    const auto print_point = [&](const Record& r) {
        const fa::Problem& p = r.problem;
        std::printf("[%3zu/%3zu] %-15s %-4s d=%-3lld N=%-5lld B=%-2lld H=%-2lld %-10s %9.3f ms  %6.2f TFLOP/s", done, points,
                    r.impl.c_str(), r.dtype.c_str(), (long long)p.head_dim, (long long)p.seq_q, (long long)p.batch,
                    (long long)p.heads, p.causal ? "causal" : "non-causal", r.median_ms, r.tflops);
        if (r.step >= 0 && mma_ceiling_tflops > 0) std::printf("  %4.1f%% of mma", 100.0 * r.tflops / mma_ceiling_tflops);
        std::printf("  (min %.3f, max %.3f; SM %d MHz)%s\n", r.min_ms, r.max_ms, r.sm_clock_mhz,
                    r.step >= 0 ? ("  step " + std::to_string(r.step) + " " + r.step_name).c_str() : "");
        std::fflush(stdout);
    };
    const auto make_record = [&](std::string impl, std::string dtype, const fa::Problem& p, const fa::TimingStats& t) {
        Record r;
        r.impl = std::move(impl), r.dtype = std::move(dtype), r.problem = p;
        r.median_ms = t.median_ms, r.min_ms = t.min_ms, r.max_ms = t.max_ms;
        r.tflops = fa::attention_flops(p) / (t.median_ms * 1e-3) * 1e-12;
        r.sm_clock_mhz = fa::cuda::current_sm_clock_mhz();
        return r;
    };

    try {
        for (int64_t d : head_dims) {
            for (int64_t n : sizes) {
                fa::Problem p;
                p.batch = std::max<int64_t>(1, tokens / n);
                p.heads = std::max<int64_t>(1, width / d);
                p.seq_q = p.seq_k = n;
                p.head_dim = d;
                fa::cuda::DeviceTensors dev(p, fa::Layout::BHND, 1234);
                // A second float32 output: stage 05's result while stage 06 runs, stage 07's widened result.
                fa::cuda::DeviceBuffer<float> o_other(size_t(p.q_elems()));
                const fa::View4<float> o_other_view = fa::make_view(o_other.data(), p.batch, p.heads, p.seq_q, p.head_dim, fa::Layout::BHND);
                HalfInputs half;
                for (const std::string& t : has07 ? dtypes : std::vector<std::string>{}) {
                    if (t == "bf16") {
                        half.bf16.emplace(p, fa::Layout::BHND);
                        half.bf16->load(dev.q, dev.k, dev.v);
                    } else {
                        half.fp16.emplace(p, fa::Layout::BHND);
                        half.fp16->load(dev.q, dev.k, dev.v);
                    }
                }
                for (bool causal : causal_values) {
                    p.causal = causal;
                    // ---- float32 stages: 05 then 06; 06's output stays in dev.o as stage 07's reference.
                    bool have05_output = false;  // stage 05's output of this point waits in o_other
                    bool have_reference = false;  // stage 06's output of this point is in dev.o
                    for (const std::string& s : stages) {
                        if (s == "07") continue;
                        const fa::cuda::DeviceAttentionFn entry =
                            s == "05" ? fa::cuda::DeviceAttentionFn(fa::stage05::attention_device) : stage06_with(fa::stage06::Schedule::Auto);
                        const auto launch = [&](cudaStream_t stream) { entry(p, dev.q, dev.k, dev.v, dev.o, dev.lse, stream); };
                        if (!supported("stage" + s + " d=" + std::to_string(d), launch)) continue;
                        records.push_back(make_record("stage" + s, "fp32", p, fa::cuda::time_on_gpu(launch, warmup, repeat)));
                        ++done;
                        print_point(records.back());
                        if (s == "06" && causal && schedule_ablation) {
                            // Both orders of the query tiles, to see what the order is worth and whether
                            // the rule of Schedule::Auto picked the faster one.
                            const bool auto_heavy = fa::stage06::chosen_schedule(p) == fa::stage06::Schedule::HeavyFirst;
                            double ms[2] = {0, 0};
                            const fa::stage06::Schedule orders[2] = {fa::stage06::Schedule::HeavyFirst, fa::stage06::Schedule::InOrder};
                            for (int k = 0; k < 2; ++k) {
                                const fa::cuda::DeviceAttentionFn entry_k = stage06_with(orders[k]);
                                ms[k] = fa::cuda::time_on_gpu(
                                    [&](cudaStream_t stream) { entry_k(p, dev.q, dev.k, dev.v, dev.o, dev.lse, stream); }, warmup, repeat)
                                            .median_ms;
                            }
                            records.back().heavy_first_ms = ms[0];
                            records.back().in_order_ms = ms[1];
                            std::printf("          stage06 query tiles heaviest first %.3f ms, in order %.3f ms (heaviest first %+.1f%%); "
                                        "Auto picks %s\n",
                                        ms[0], ms[1], 100.0 * (ms[0] / ms[1] - 1.0), auto_heavy ? "heaviest first" : "in order");
                        }
                        if (!check) continue;
                        if (s == "05" && has06) {
                            FA_CUDA_CHECK(cudaMemcpy(o_other.data(), dev.o.data, o_other.bytes(), cudaMemcpyDeviceToDevice));
                            have05_output = true;
                        } else if (s == "06" && have05_output) {
                            const double diff = max_abs_diff(o_other.data(), dev.o.data, p.q_elems());
                            const bool ok = diff <= kFp32MaxAbs;
                            records.back().check = ok ? "ok" : "BAD";
                            records.back().check_max_abs = diff;
                            any_bad = any_bad || !ok;
                            std::printf("          stage 05 vs stage 06 outputs: max |diff| = %.2e%s\n", diff, ok ? "" : "  MISMATCH");
                        }
                        have_reference = have_reference || s == "06";
                    }
                    if (!has07) continue;

                    // ---- stage 07: every dtype and step asked for, checked against stage 06 in float32.
                    if (check && !have_reference) {
                        try {
                            fa::stage06::attention_device(p, dev.q, dev.k, dev.v, dev.o, dev.lse, nullptr);
                            FA_CUDA_CHECK(cudaDeviceSynchronize());
                            have_reference = true;
                        } catch (const fa::InputError&) {
                            // Stage 06 has no kernel for this d (256): stage 07 goes unchecked here.
                        }
                    }
                    const std::vector<float> reference =
                        check && have_reference ? to_host(dev.o.data, p.q_elems()) : std::vector<float>{};
                    for (const std::string& t : dtypes) {
                        for (int step : steps07) {
                            const bool bf = t == "bf16";
                            const auto launch = [&](cudaStream_t stream) {
                                if (bf) {
                                    fa::stage07::attention_device(p, half.bf16->q, half.bf16->k, half.bf16->v, half.bf16->o, dev.lse, stream, step);
                                } else {
                                    fa::stage07::attention_device(p, half.fp16->q, half.fp16->k, half.fp16->v, half.fp16->o, dev.lse, stream, step);
                                }
                            };
                            const std::string key = "stage07 " + t + " step " + std::to_string(step) + " d=" + std::to_string(d);
                            if (!supported(key, launch)) continue;
                            const bool final_kernel = step == fa::stage07::final_step();
                            Record r = make_record(final_kernel ? "stage07" : "stage07_step" + std::to_string(step), t, p,
                                                   fa::cuda::time_on_gpu(launch, warmup, repeat));
                            r.step = step;
                            r.step_name = road[size_t(step)].name;
                            ++done;
                            print_point(r);
                            if (!reference.empty()) {
                                // A fresh run into an output poisoned with NaN, so an element this step
                                // forgets is not hidden by what the timed runs left there.
                                void* o16 = bf ? static_cast<void*>(half.bf16->o.data) : static_cast<void*>(half.fp16->o.data);
                                FA_CUDA_CHECK(cudaMemset(o16, 0xff, size_t(p.q_elems()) * 2));
                                launch(nullptr);
                                if (bf) {
                                    fa::cuda::convert(fa::View4<const __nv_bfloat16>(half.bf16->o), o_other_view);
                                } else {
                                    fa::cuda::convert(fa::View4<const __half>(half.fp16->o), o_other_view);
                                }
                                FA_CUDA_CHECK(cudaDeviceSynchronize());
                                const fa::Metrics m = fa::compare(to_host(o_other.data(), p.q_elems()), reference);
                                const bool ok = m.nonfinite == 0 && m.rel_l2 <= kStage07GrossRelL2;
                                r.check = ok ? "ok" : "BAD";
                                r.check_max_abs = m.max_abs;
                                r.check_rel_l2 = m.rel_l2;
                                any_bad = any_bad || !ok;
                                std::printf("          vs stage 06 (fp32): max_abs %.2e, rel_l2 %.2e%s%s\n", m.max_abs, m.rel_l2,
                                            m.nonfinite ? (", " + std::to_string(m.nonfinite) + " NaN/inf").c_str() : "",
                                            ok ? "" : "  BAD");
                            } else if (check) {
                                std::printf("          not checked: stage 06 has no kernel for d=%lld\n", (long long)d);
                            }
                            std::fflush(stdout);
                            records.push_back(std::move(r));
                        }
                    }
                }
            }
        }
    } catch (const fa::InputError& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return fa::kExitBadInput;
    } catch (const fa::cuda::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return fa::kExitMismatch;
    }

    std::ofstream json(json_path), csv(csv_path);
    if (!json || !csv) {
        std::fprintf(stderr, "error: cannot write %s or %s\n", json_path.c_str(), csv_path.c_str());
        return fa::kExitBadInput;
    }
    json << "{\n  \"gpu\": " << json_string(gpu.name) << ",\n  \"sm_count\": " << gpu.sm_count << ",\n  \"max_sm_clock_mhz\": "
         << gpu.max_sm_clock_mhz << ",\n  \"fp32_peak_tflops\": " << gpu.fp32_peak_flops() * 1e-12 << ",\n  \"date\": \"" << date
         << "\",\n  \"method\": \"CUDA events, " << warmup << " warm-up, L2 flushed, median of " << repeat << "\",\n";
    if (mma_ceiling_tflops > 0) json << "  \"mma_ceiling_tflops\": " << mma_ceiling_tflops << ",\n";
    // Stage 07's road as this build has it: what each step number means (the tuning build adds candidates).
    json << "  \"stage07_final_step\": " << fa::stage07::final_step() << ",\n  \"stage07_road\": [\n";
    for (size_t i = 0; i < road.size(); ++i) {
        json << "    {\"step\": " << i << ", \"name\": " << json_string(road[i].name) << ", \"idea\": " << json_string(road[i].idea)
             << "}" << (i + 1 < road.size() ? ",\n" : "\n");
    }
    json << "  ],\n  \"results\": [\n";
    // The first twelve columns are those of the first sweeps; the page generator reads them by name.
    csv << "impl,dtype,B,H,N,d,causal,median_ms,tflops,gpu,sm_clock_mhz,date,step,step_name,min_ms,max_ms,check,check_max_abs,"
           "check_rel_l2\n";
    for (size_t i = 0; i < records.size(); ++i) {
        const Record& r = records[i];
        const fa::Problem& p = r.problem;
        json << "    {\"impl\": \"" << r.impl << "\", \"dtype\": \"" << r.dtype << "\", \"B\": " << p.batch << ", \"H\": " << p.heads
             << ", \"N\": " << p.seq_q << ", \"d\": " << p.head_dim << ", \"causal\": " << (p.causal ? "true" : "false")
             << ", \"median_ms\": " << r.median_ms << ", \"min_ms\": " << r.min_ms << ", \"max_ms\": " << r.max_ms
             << ", \"tflops\": " << r.tflops << ", \"sm_clock_mhz\": " << r.sm_clock_mhz;
        if (r.step >= 0) json << ", \"step\": " << r.step << ", \"step_name\": " << json_string(r.step_name);
        if (r.heavy_first_ms > 0) json << ", \"heavy_first_ms\": " << r.heavy_first_ms << ", \"in_order_ms\": " << r.in_order_ms;
        if (!r.check.empty()) json << ", \"check\": \"" << r.check << "\", \"check_max_abs\": " << r.check_max_abs;
        if (r.check_rel_l2 >= 0) json << ", \"check_rel_l2\": " << r.check_rel_l2;
        json << "}" << (i + 1 < records.size() ? ",\n" : "\n");
        csv << r.impl << "," << r.dtype << "," << p.batch << "," << p.heads << "," << p.seq_q << "," << p.head_dim << ","
            << (p.causal ? 1 : 0) << "," << r.median_ms << "," << r.tflops << "," << csv_field(gpu.name) << "," << r.sm_clock_mhz
            << "," << date << "," << (r.step >= 0 ? std::to_string(r.step) : "") << "," << csv_field(r.step_name) << ","
            << r.min_ms << "," << r.max_ms << "," << r.check << "," << optional_number(r.check_max_abs) << ","
            << optional_number(r.check_rel_l2) << "\n";
    }
    json << "  ]\n}\n";
    std::printf("wrote      %s and %s (%zu points)\n", json_path.c_str(), csv_path.c_str(), records.size());
    if (any_bad) {
        std::printf("FAILED     at least one point failed its check (marked BAD or MISMATCH above)\n");
        return fa::kExitMismatch;
    }
    return fa::kExitPass;
}
