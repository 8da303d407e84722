// bench_gpu's records: bench_gpu.json (fa::Json: the run, the roads, what was skipped, one row per
// result with every figure its lines print) and bench_gpu.csv (one row per result, the columns the
// page generators read). bench_gpu.hpp lists every field.
#include <cstdio>
#include <fstream>

#include "../../stages/05_shared_memory_kernel/attention.cuh"
#include "../../stages/07_pipelined_fused_kernel/attention.cuh"
#include "bench_gpu.hpp"
#include "fa/cuda/timing.hpp"
#include "fa/json.hpp"
#ifdef FA_HAVE_STAGE11
#include "../../stages/11_hopper_kernel/attention.cuh"
#endif

namespace bench {

namespace {

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

// A time or rate as a JSON value: null for the -1 of a refused row.
fa::Json time_or_null(double x) { return x < 0 ? fa::Json() : fa::Json(x); }

// A road as this build has it: what each step number means (stage 07's tuning build adds candidates).
fa::Json road_json(const std::vector<fa::RoadStep>& road) {
    fa::Json steps = fa::Json::array();
    for (size_t i = 0; i < road.size(); ++i) steps.push_back({{"step", i}, {"name", road[i].name}, {"idea", road[i].idea}});
    return steps;
}

// One result. The optional fields are there where the row has them (bench_gpu.hpp).
fa::Json result_json(const Record& r) {
    const fa::Problem& p = r.problem;
    fa::Json j = {{"impl", r.impl}, {"dtype", r.dtype}, {"B", p.batch}, {"H", p.heads}};
    if (r.kv_heads >= 0) j["Hk"] = r.kv_heads;
    j["N"] = p.seq_q, j["d"] = p.head_dim, j["causal"] = p.causal, j["pass"] = r.pass;
    j["median_ms"] = time_or_null(r.median_ms), j["min_ms"] = time_or_null(r.min_ms), j["max_ms"] = time_or_null(r.max_ms);
    j["tflops"] = time_or_null(r.tflops), j["sm_clock_mhz"] = r.sm_clock_mhz;
    if (r.step >= 0) j["step"] = r.step, j["step_name"] = r.step_name;
    if (r.heavy_first_ms > 0) j["heavy_first_ms"] = r.heavy_first_ms, j["in_order_ms"] = r.in_order_ms, j["schedule_auto"] = r.schedule_auto;
    if (!r.check.empty()) j["check"] = r.check, j["check_max_abs"] = r.check_max_abs;
    // The figures a row has or not: -1 where it has none.
    const std::pair<const char*, double> figures[] = {
        {"check_rel_l2", r.check_rel_l2},           {"check_limit", r.check_limit},
        {"check_lse_max_abs", r.check_lse_max_abs}, {"check_dv_sum_rel", r.dv_sum_rel},
        {"check_dk_sum_ratio", r.dk_sum_ratio},     {"sum_of_medians_ms", r.sum_of_medians_ms},
        {"time_over_atomic", r.time_over_atomic},   {"time_over_causal", r.time_over_causal},
        {"rate_over_dense_uniform", r.rate_over_dense_uniform}};
    const std::pair<const char*, int64_t> counts[] = {{"check_nonfinite", r.check_nonfinite},
                                                      {"check_zero_gradients", r.zero_gradients},
                                                      {"longest", r.longest},
                                                      {"uniform_length", r.uniform_length}};
    for (const auto& [key, value] : figures) {
        if (value >= 0) j[key] = value;
    }
    for (const auto& [key, value] : counts) {
        if (value >= 0) j[key] = value;
    }
    if (!r.spec.empty()) j["spec"] = r.spec;
    if (!r.note.empty()) j["note"] = r.note;
    return j;
}

}  // namespace

bool write_records(const Sweep& sweep, const fa::cuda::GpuInfo& gpu, const std::string& date) {
    const Settings& s = sweep.s;
    std::ofstream json(s.json_path), csv(s.csv_path);
    if (!json || !csv) {
        std::fprintf(stderr, "error: cannot write %s or %s\n", s.json_path.c_str(), s.csv_path.c_str());
        return false;
    }
    fa::Json run = {{"gpu", gpu.name},
                    {"sm_count", gpu.sm_count},
                    {"max_sm_clock_mhz", gpu.max_sm_clock_mhz},
                    {"fp32_peak_tflops", gpu.fp32_peak_flops() * 1e-12},
                    {"date", date},
                    {"method", "CUDA events, " + std::to_string(s.warmup) + " warm-up, L2 flushed, median of " + std::to_string(s.repeat)},
                    {"warmup", s.warmup},
                    {"repeat", s.repeat},
                    {"l2_flush_bytes", fa::cuda::l2_flush_bytes()},
                    {"compute_capability", std::to_string(gpu.compute_major) + "." + std::to_string(gpu.compute_minor)},
                    {"memory_bytes", gpu.global_memory_bytes},
                    {"l2_bytes", gpu.l2_bytes}};
    run["dtypes"] = s.dtypes;
    if (s.mma_ceiling_tflops > 0) run["mma_ceiling_tflops"] = s.mma_ceiling_tflops;
    run["stage07_final_step"] = fa::stage07::final_step();
    run["stage07_road"] = road_json(fa::stage07::road());
    if (s.has07) run["stage07_steps"] = s.steps07;
    if (s.has05 && s.road05) run["stage05_final_step"] = fa::stage05::final_step(), run["stage05_road"] = road_json(fa::stage05::road());
    if (s.has09) {
        run["stage09_default_step"] = fa::stage09::kDefaultStep;
        run["stage09_road"] = road_json(fa::stage09::road());
        run["stage09_steps"] = s.steps09;
        run["stage09_steps_backward_only"] = s.steps09_backward_only;
    }
#ifdef FA_HAVE_STAGE11
    if (s.has11) {
        run["stage11_final_step"] = fa::stage11::final_step();
        run["stage11_road"] = road_json(fa::stage11::road());
        run["stage11_steps"] = s.steps11;
    }
#endif
    if (s.wgmma_ceiling_tflops > 0) run["wgmma_ceiling_tflops"] = s.wgmma_ceiling_tflops;
    run["skipped"] = fa::Json::array();
    for (const Skip& k : sweep.skipped) {
        fa::Json& entry = run["skipped"].emplace_back(fa::Json{{"stage", k.stage}});
        if (!k.dtype.empty()) entry["dtype"] = k.dtype;
        if (k.step >= 0) entry["step"] = k.step;
        if (k.head_dim >= 0) entry["d"] = k.head_dim;
        entry["reason"] = k.reason;
    }
    run["results"] = fa::Json::array();
    for (const Record& r : sweep.records) run["results"].push_back(result_json(r));
    json << fa::json_text(run) << '\n';

    // The first twelve columns are those of the first sweeps; the page generator reads them by name.
    // Later columns are added at the end: `pass` (forward, backward, fwd+bwd) came with stage 09,
    // `spec` and `note` with stage 10 (a refused row has empty times and its reason in the note).
    csv << "impl,dtype,B,H,N,d,causal,median_ms,tflops,gpu,sm_clock_mhz,date,step,step_name,min_ms,max_ms,check,check_max_abs,"
           "check_rel_l2,pass,spec,note\n";
    for (const Record& r : sweep.records) {
        const fa::Problem& p = r.problem;
        csv << r.impl << "," << r.dtype << "," << p.batch << "," << p.heads << "," << p.seq_q << "," << p.head_dim << ","
            << (p.causal ? 1 : 0) << "," << optional_number(r.median_ms) << "," << optional_number(r.tflops) << ","
            << csv_field(gpu.name) << "," << r.sm_clock_mhz << "," << date << "," << (r.step >= 0 ? std::to_string(r.step) : "")
            << "," << csv_field(r.step_name) << "," << optional_number(r.min_ms) << "," << optional_number(r.max_ms) << ","
            << r.check << "," << optional_number(r.check_max_abs) << "," << optional_number(r.check_rel_l2) << "," << r.pass << ","
            << csv_field(r.spec) << "," << csv_field(r.note) << "\n";
    }
    json.flush(), csv.flush();
    if (!json || !csv) {
        std::fprintf(stderr, "error: writing %s or %s failed\n", s.json_path.c_str(), s.csv_path.c_str());
        return false;
    }
    return true;
}

}  // namespace bench
