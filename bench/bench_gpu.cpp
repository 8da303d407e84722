// bench_gpu: times the GPU stages over a sweep of shapes and writes JSON and CSV.
//
// The sweep keeps the work per launch comparable across sequence lengths: B * N = 16384 tokens
// and H * d = 2048 features, so N = 512 runs 32 sequences and N = 16384 runs one. Each point is
// timed with CUDA events after warm-up runs, with the L2 flushed before every run, and the median
// of --repeat runs is reported, in TFLOP/s by fa::attention_flops (4 B H Nq Nk d, halved for
// causal). After timing, stage 05 and stage 06 outputs are compared with each other.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "../stages/05_shared_memory_kernel/attention.cuh"
#include "../stages/06_causal_masking/attention.cuh"
#include "fa/counts.hpp"
#include "fa/cuda/check.hpp"
#include "fa/cuda/device.hpp"
#include "fa/cuda/stage.hpp"
#include "fa/cuda/tensors.hpp"
#include "fa/cuda/timing.hpp"
#include "fa/error.hpp"

namespace {

struct Record {
    std::string impl;  // "stage05", "stage06"
    fa::Problem problem;
    double median_ms = 0, min_ms = 0, max_ms = 0, tflops = 0;
    int sm_clock_mhz = -1;
    double heavy_first_ms = -1;  // stage 06, causal: the same run with the query tiles heaviest first
    double in_order_ms = -1;     // stage 06, causal: and in order
};

std::string today() {
    const std::time_t now = std::time(nullptr);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
    return buf;
}

// Largest |a - b| over two equally long device arrays, copied to the host.
double max_abs_diff(const float* a, const float* b, int64_t n) {
    std::vector<float> ha(static_cast<size_t>(n)), hb(static_cast<size_t>(n));
    FA_CUDA_CHECK(cudaMemcpy(ha.data(), a, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost));
    FA_CUDA_CHECK(cudaMemcpy(hb.data(), b, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0;
    for (size_t i = 0; i < ha.size(); ++i) {
        const double d = std::fabs(double(ha[i]) - double(hb[i]));
        if (!(d <= worst)) worst = d;  // NaN counts as the worst
    }
    return worst;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"flashcourse bench_gpu: stages 05 and 06 over a sweep of shapes, timed with CUDA events"};
    std::vector<int64_t> sizes{512, 1024, 2048, 4096, 8192, 16384};
    std::vector<int64_t> head_dims{64, 128};
    std::vector<std::string> stages{"05", "06"};
    std::string causal_mode = "both";
    int64_t tokens = 16384, width = 2048;
    int repeat = 30, warmup = 5;
    bool check = true;
    bool schedule_ablation = true;
    std::string json_path = "bench_gpu.json", csv_path = "bench_gpu.csv";
    app.add_option("--sizes", sizes, "sequence lengths N (Nq = Nk)")->capture_default_str();
    app.add_option("--head-dims", head_dims, "head dimensions d")->capture_default_str();
    app.add_option("--stages", stages, "stages to time: 05, 06")->check(CLI::IsMember({"05", "06"}))->capture_default_str();
    app.add_option("--causal", causal_mode, "no, yes or both")->check(CLI::IsMember({"no", "yes", "both"}))->capture_default_str();
    app.add_option("--tokens", tokens, "B * N: batch = tokens / N")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--width", width, "H * d: heads = width / d")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--repeat", repeat, "timed runs per point (the median is reported)")->check(CLI::Range(1, 10000))->capture_default_str();
    app.add_option("--warmup", warmup, "untimed runs before timing")->check(CLI::Range(0, 1000))->capture_default_str();
    app.add_option("--check", check, "compare stage 05 and stage 06 outputs at every point")->capture_default_str();
    app.add_option("--schedule-ablation", schedule_ablation,
                   "for causal stage 06 points, also time both orders of the query tiles (heaviest first, in order)")
        ->capture_default_str();
    app.add_option("--json", json_path, "where to write the results as JSON")->capture_default_str();
    app.add_option("--csv", csv_path, "where to write the results as CSV")->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    const std::string reason = fa::cuda::gpu_unavailable_reason();
    if (!reason.empty()) {
        std::printf("skipped: bench_gpu needs a CUDA GPU (%s)\n", reason.c_str());
        return fa::kExitSkipped;
    }
    std::vector<bool> causal_values;
    if (causal_mode != "yes") causal_values.push_back(false);
    if (causal_mode != "no") causal_values.push_back(true);
    const fa::cuda::GpuInfo gpu = fa::cuda::gpu_info();
    const std::string date = today();
    std::printf("gpu        %s\n", gpu.describe().c_str());
    std::printf("method     CUDA events, %d warm-up runs, L2 flushed (%zu MiB written) before each of %d timed runs, median\n",
                warmup, fa::cuda::l2_flush_bytes() >> 20, repeat);

    const auto stage06_with = [](fa::stage06::Schedule schedule) -> fa::cuda::DeviceAttentionFn {
        return [schedule](const fa::Problem& p, fa::View4<const float> q, fa::View4<const float> k, fa::View4<const float> v,
                          fa::View4<float> o, fa::View3<float> lse, cudaStream_t stream) {
            fa::stage06::attention_device(p, q, k, v, o, lse, stream, schedule);
        };
    };
    const fa::cuda::DeviceAttentionFn entries[] = {fa::stage05::attention_device, stage06_with(fa::stage06::Schedule::Auto)};
    std::vector<Record> records;
    const size_t points = sizes.size() * head_dims.size() * causal_values.size() * stages.size();
    size_t done = 0;
    try {
        for (int64_t d : head_dims) {
            for (int64_t n : sizes) {
                fa::Problem p;
                p.batch = std::max<int64_t>(1, tokens / n);
                p.heads = std::max<int64_t>(1, width / d);
                p.seq_q = p.seq_k = n;
                p.head_dim = d;
                fa::cuda::DeviceTensors dev(p, fa::Layout::BHND, 1234);
                // A second output buffer, so stage 05 and 06 results can be compared.
                fa::cuda::DeviceBuffer<float> o_other(size_t(p.q_elems()));
                for (bool causal : causal_values) {
                    p.causal = causal;
                    for (const std::string& s : stages) {
                        const fa::cuda::DeviceAttentionFn& entry = entries[s == "05" ? 0 : 1];
                        const fa::TimingStats t = fa::cuda::time_on_gpu(
                            [&](cudaStream_t stream) { entry(p, dev.q, dev.k, dev.v, dev.o, dev.lse, stream); }, warmup, repeat);
                        Record r{"stage" + s, p, t.median_ms, t.min_ms, t.max_ms, fa::attention_flops(p) / (t.median_ms * 1e-3) * 1e-12,
                                 fa::cuda::current_sm_clock_mhz()};
                        records.push_back(r);
                        ++done;
                        std::printf("[%2zu/%2zu] %s d=%-3lld N=%-5lld B=%-2lld H=%-2lld %-10s %9.3f ms  %6.2f TFLOP/s  (min %.3f, max %.3f; SM %d MHz)\n",
                                    done, points, r.impl.c_str(), (long long)d, (long long)n, (long long)p.batch, (long long)p.heads,
                                    causal ? "causal" : "non-causal", r.median_ms, r.tflops, r.min_ms, r.max_ms, r.sm_clock_mhz);
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
                            std::printf("         stage06 query tiles heaviest first %.3f ms, in order %.3f ms (heaviest first %+.1f%%); "
                                        "Auto picks %s\n",
                                        ms[0], ms[1], 100.0 * (ms[0] / ms[1] - 1.0), auto_heavy ? "heaviest first" : "in order");
                        }
                        std::fflush(stdout);
                        if (check && stages.size() == 2) {
                            if (s == stages.front()) {
                                FA_CUDA_CHECK(cudaMemcpy(o_other.data(), dev.o.data, o_other.bytes(), cudaMemcpyDeviceToDevice));
                            } else {
                                const double diff = max_abs_diff(o_other.data(), dev.o.data, p.q_elems());
                                std::printf("         stage 05 vs stage 06 outputs: max |diff| = %.2e%s\n", diff, diff <= 1e-4 ? "" : "  MISMATCH");
                                if (!(diff <= 1e-4)) return fa::kExitMismatch;
                            }
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
    json << "{\n  \"gpu\": \"" << gpu.name << "\",\n  \"sm_count\": " << gpu.sm_count << ",\n  \"max_sm_clock_mhz\": "
         << gpu.max_sm_clock_mhz << ",\n  \"fp32_peak_tflops\": " << gpu.fp32_peak_flops() * 1e-12 << ",\n  \"date\": \"" << date
         << "\",\n  \"method\": \"CUDA events, " << warmup << " warm-up, L2 flushed, median of " << repeat
         << "\",\n  \"results\": [\n";
    csv << "impl,dtype,B,H,N,d,causal,median_ms,tflops,gpu,sm_clock_mhz,date\n";
    for (size_t i = 0; i < records.size(); ++i) {
        const Record& r = records[i];
        const fa::Problem& p = r.problem;
        json << "    {\"impl\": \"" << r.impl << "\", \"dtype\": \"fp32\", \"B\": " << p.batch << ", \"H\": " << p.heads
             << ", \"N\": " << p.seq_q << ", \"d\": " << p.head_dim << ", \"causal\": " << (p.causal ? "true" : "false")
             << ", \"median_ms\": " << r.median_ms << ", \"min_ms\": " << r.min_ms << ", \"max_ms\": " << r.max_ms
             << ", \"tflops\": " << r.tflops << ", \"sm_clock_mhz\": " << r.sm_clock_mhz;
        if (r.heavy_first_ms > 0) json << ", \"heavy_first_ms\": " << r.heavy_first_ms << ", \"in_order_ms\": " << r.in_order_ms;
        json << "}"
             << (i + 1 < records.size() ? ",\n" : "\n");
        csv << r.impl << ",fp32," << p.batch << "," << p.heads << "," << p.seq_q << "," << p.head_dim << ","
            << (p.causal ? 1 : 0) << "," << r.median_ms << "," << r.tflops << "," << gpu.name << "," << r.sm_clock_mhz << ","
            << date << "\n";
    }
    json << "  ]\n}\n";
    std::printf("wrote      %s and %s (%zu points)\n", json_path.c_str(), csv_path.c_str(), records.size());
    return fa::kExitPass;
}
