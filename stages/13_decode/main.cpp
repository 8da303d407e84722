// Stage 13 executable: decoding over a KV cache. A ragged batch of sequences, each with its cached
// keys and a few new query rows whose K and V are appended into the cache in place; grouped query
// heads packed into the rows of one tile; the cache held in pages through block tables or
// contiguously; the keys split across thread blocks and the splits merged. Checked against the
// float64 reference per sequence by the low-precision rule, and the paged cache against the
// contiguous one bit for bit. With --serve, a serving loop over the same kernel: requests with seeded
// prompt lengths, their prompts prefilled into pages from a free list, continuous batching, tokens per
// second and the memory the pages hold against a contiguous cache (serve.hpp, serve.cuh).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "decode.cuh"
#include "decode_problem.hpp"
#include "fa/cli.hpp"
#include "fa/counts.hpp"
#include "fa/cuda/device.hpp"
#include "fa/error.hpp"
#include "fa/json.hpp"
#include "fa/stage.hpp"
#include "fa/tolerance.hpp"
#include "serve.cuh"

namespace {

using namespace fa;
using namespace fa::stage13;

struct Options {
    CommonOptions run;                 // --seed --inputs --bench --repeat --warmup --reference --json
    std::string cache_seqlens;         // --cache-seqlens (overrides --batch and --seq-k)
    int64_t batch = 4;                 // --batch, with --seq-k
    int64_t seq_k = 1000;              // --seq-k: keys cached per sequence
    int64_t seq_q = 1;                 // --seq-q
    int64_t heads = 32;                // --heads
    int64_t kv_heads = 8;              // --kv-heads
    int64_t head_dim = 128;            // --head-dim
    std::optional<double> scale;       // --scale
    Precision precision = Precision::BFloat16;  // --dtype
    std::string cache = "paged";       // --cache paged|contiguous
    int64_t page_size = 64;            // --page-size
    std::string block_table;           // --block-table rows;rows (explicit pages)
    int64_t pool_pages = 0;            // --pool-pages (with --block-table)
    int splits = 0;                    // --splits (0: the rule)
    bool no_append = false;            // --no-append
    bool serve = false;                // --serve: the serving loop instead of one call
    ServeConfig serving;               // --requests --max-batch --prompt-min --prompt-max --decode-steps (with --serve)
    std::string prompt_dist = "uniform";  // --prompt-dist
    std::string prefill = "auto";      // --prefill
};

// The options only the serving loop reads, and those only one call reads.
const std::vector<std::string> kServeOnly = {"--requests", "--max-batch", "--prompt-min", "--prompt-max", "--prompt-dist",
                                             "--decode-steps", "--prefill"};
const std::vector<std::string> kCallOnly = {"--cache-seqlens", "--batch", "--seq-k", "--seq-q", "--scale", "--cache",
                                            "--block-table", "--splits", "--no-append", "--inputs", "--bench", "--repeat",
                                            "--warmup"};

void add_options(CLI::App& app, Options& o) {
    app.add_option("--cache-seqlens", o.cache_seqlens, "keys cached per sequence before the call, comma separated (0 allowed); "
                                                       "overrides --batch and --seq-k");
    app.add_option("--batch", o.batch, "B: sequences, each with --seq-k cached keys")->check(CLI::Range(int64_t{1}, int64_t{65535}))->capture_default_str();
    app.add_option("--seq-k", o.seq_k, "keys cached per sequence before the call")->check(CLI::Range(int64_t{0}, int64_t{2147483647}))->capture_default_str();
    app.add_option("--seq-q", o.seq_q, "new query rows per sequence, 1 to 16, causal among themselves")->capture_default_str();
    app.add_option("--heads", o.heads, "Hq: query heads")->check(CLI::Range(int64_t{1}, int64_t{4096}))->capture_default_str();
    app.add_option("--kv-heads", o.kv_heads, "Hk: key/value heads, dividing Hq (Hk = Hq: multi-head, 1: multi-query)")
        ->check(CLI::Range(int64_t{1}, int64_t{4096}))
        ->capture_default_str();
    app.add_option("--head-dim", o.head_dim, "d: 64 or 128")->capture_default_str();
    app.add_option_function<double>("--scale", [&o](const double& s) { o.scale = s; }, "softmax scale (default 1/sqrt(d))")
        ->check(finite_number());
    app.add_option_function<std::string>(
           "--dtype", [&o](const std::string& s) { o.precision = s == "fp16" ? Precision::Float16 : Precision::BFloat16; },
           "16-bit type of q, the cache and o: bf16 or fp16")
        ->check(CLI::IsMember({"bf16", "fp16"}))
        ->default_str("bf16");
    app.add_option("--cache", o.cache, "how the cache is held: paged (a pool of pages, block tables) or contiguous")
        ->check(CLI::IsMember({"paged", "contiguous"}))
        ->capture_default_str();
    app.add_option("--page-size", o.page_size, "keys per page, a power of two from 16 to 512")->capture_default_str();
    app.add_option("--block-table", o.block_table,
                   "explicit block tables, one row of page numbers per sequence: rows separated by '/', e.g. 3,0/2,1 "
                   "(default: the pages in a seeded random order)");
    app.add_option("--pool-pages", o.pool_pages, "pages in the pool with --block-table (default: the largest entry + 1); "
                                                 "with --serve (default: --max-batch x the pages of the longest request)");
    app.add_option("--splits", o.splits, "splits of each sequence's keys (default: the rule, printed in the report)")
        ->check(CLI::Range(1, kMaxSplits));
    app.add_flag("--no-append", o.no_append, "the cache already holds the new rows' keys (cache_seqlens counts them)");
    app.add_flag("--serve", o.serve, "the serving loop: requests prefilled into pages from a free list and decoded in "
                                     "continuous batches; tokens per second, time per step, the pages' memory");
    app.add_option("--requests", o.serving.requests, "--serve: requests, all queued at the start")->capture_default_str();
    app.add_option("--max-batch", o.serving.max_batch, "--serve: sequences decoded together at most")->capture_default_str();
    app.add_option("--prompt-min", o.serving.prompt_min, "--serve: shortest prompt, in tokens")->capture_default_str();
    app.add_option("--prompt-max", o.serving.prompt_max, "--serve: longest prompt, in tokens")->capture_default_str();
    app.add_option("--prompt-dist", o.prompt_dist, "--serve: how prompt lengths are drawn between the two: uniform or "
                                                   "log-uniform (as many of 128-256 tokens as of 2048-4096)")
        ->check(CLI::IsMember({"uniform", "log-uniform"}))
        ->capture_default_str();
    app.add_option("--decode-steps", o.serving.decode_steps, "--serve: T, new tokens per request")->capture_default_str();
    app.add_option("--prefill", o.prefill, "--serve: the prompts' attention: stage11 (sm_90a), stage07, or auto (stage 11 "
                                           "where it runs)")
        ->check(CLI::IsMember({"auto", "stage11", "stage07"}))
        ->capture_default_str();
    add_run_options(app, o.run);
}

DecodeProblem make_problem(const Options& o, const CLI::App& app) {
    std::vector<int64_t> cache_seqlens;
    if (!o.cache_seqlens.empty()) {
        if (app.count("--batch") || app.count("--seq-k")) {
            throw InputError("--cache-seqlens gives every sequence's length: leave out --batch and --seq-k");
        }
        cache_seqlens = parse_lengths(o.cache_seqlens, "--cache-seqlens");
    } else {
        cache_seqlens.assign(size_t(o.batch), o.seq_k);
    }
    return make_decode_problem(std::move(cache_seqlens), o.seq_q, o.heads, o.kv_heads, o.head_dim, !o.no_append, o.scale);
}

CacheGeometry make_geometry(const Options& o, const CLI::App& app, const DecodeProblem& p) {
    check_page_size(o.page_size);
    CacheGeometry g;
    if (!o.block_table.empty()) {
        const std::vector<std::vector<int32_t>> rows = parse_block_table(o.block_table);
        if (int64_t(rows.size()) != p.batch()) {
            throw InputError("--block-table has " + std::to_string(rows.size()) + " rows for " + std::to_string(p.batch()) +
                             " sequences: give one row of page numbers per sequence");
        }
        int64_t largest = -1;
        for (const auto& r : rows)
            for (int32_t x : r) largest = std::max<int64_t>(largest, x);
        const int64_t pool = app.count("--pool-pages") ? o.pool_pages : std::max<int64_t>(1, largest + 1);
        g = geometry_from_table(rows, o.page_size, pool);
    } else {
        if (app.count("--pool-pages")) throw InputError("--pool-pages sizes the pool of --block-table: give both or neither");
        g = make_paged_geometry(p, o.page_size, o.run.seed);
    }
    g.validate(p);
    return g;
}

void print_rule(const std::string& text) {
    std::string rule = text;
    for (size_t at = rule.find('\n'); at != std::string::npos; at = rule.find('\n', at + 1)) rule.insert(at + 1, 11, ' ');
    std::printf("           %s\n", rule.c_str());
}

// --serve: every refusal first (the options, the heads, the pool), then the GPU.
int run_serving(const Options& opt, const CLI::App& app) {
    for (const std::string& name : kCallOnly) {
        if (app.count(name)) {
            throw InputError(name + " sets up one decoding call, and --serve draws its own batches and inputs: leave out " + name +
                             " or --serve");
        }
    }
    ServeConfig c = opt.serving;
    c.page_size = opt.page_size, c.pool_pages = app.count("--pool-pages") ? opt.pool_pages : 0, c.seed = opt.run.seed;
    if (app.count("--pool-pages") && opt.pool_pages < 1) {
        throw InputError("--pool-pages " + std::to_string(opt.pool_pages) + ": give at least " +
                         std::to_string(std::max<int64_t>(1, c.pages_per_seq())) + " pages, or leave it out");
    }
    c.distribution = opt.prompt_dist == "log-uniform" ? PromptDistribution::LogUniform : PromptDistribution::Uniform;
    c.validate();
    const DecodeProblem heads = make_decode_problem({c.prompt_max}, 1, opt.heads, opt.kv_heads, opt.head_dim, true);
    const ServeShape shape{heads.heads_q, heads.heads_k, heads.head_dim, opt.precision};
    const PrefillKernel kernel = opt.prefill == "stage11" ? PrefillKernel::Stage11
                                 : opt.prefill == "stage07" ? PrefillKernel::Stage07
                                                            : PrefillKernel::Auto;
    if (const std::string reason = cuda::gpu_unavailable_reason(); !reason.empty()) {
        std::printf("skipped: stage 13 needs a CUDA GPU (%s)\n", reason.c_str());
        return kExitSkipped;
    }
    if (const std::string reason = prefill_unavailable_reason(kernel); !reason.empty()) {
        std::printf("skipped: --prefill stage11 needs a Hopper GPU (%s); --prefill auto takes stage 07 here\n", reason.c_str());
        return kExitSkipped;
    }
    cuda::require_device_memory(serve_device_bytes(c, shape) * 1.05 + double(int64_t(512) << 20), c.describe());

    const int element = 2;
    const MemoryFigures page = memory_figures(c, 0, 0, shape.heads_k, shape.head_dim, element);
    std::printf("serve      %s\n", c.describe().c_str());
    std::printf("heads      Hq=%lld Hk=%lld (G=%lld) d=%lld %s, causal prompts, one new row per step appended in place\n",
                (long long)shape.heads_q, (long long)shape.heads_k, (long long)heads.group(), (long long)shape.head_dim,
                to_string(opt.precision).c_str());
    std::printf("pages      %lld keys each (%s of K + V), %lld in the pool (%s)%s; block tables of %lld entries\n",
                (long long)c.page_size, format_bytes(page.page_bytes).c_str(), (long long)c.pool(), format_bytes(page.pool_bytes).c_str(),
                app.count("--pool-pages") ? "" : ", max-batch x the pages of the longest request", (long long)c.pages_per_seq());
    std::fflush(stdout);
    const ServeResult r = run_serve(c, shape, kernel, true);
    const MemoryFigures m = memory_figures(c, r.peak_pages, r.keys_at_peak, shape.heads_k, shape.head_dim, element);
    const double tokens_per_s = double(r.decode_tokens) / r.wall_s;
    std::printf("prefill    %s\n", r.prefill.c_str());
    std::printf("run        %lld steps, %lld tokens decoded in %.3f s on the wall clock (prefill included): %.0f tokens/s; "
                "at most %lld running\n",
                (long long)r.steps, (long long)r.decode_tokens, r.wall_s, tokens_per_s, (long long)r.peak_running);
    std::printf("prompts    %lld requests, %lld tokens: attention %.2f ms (%.0f TFLOP/s), written into pages %.2f ms (CUDA events)\n",
                (long long)c.requests, (long long)r.prefill_tokens, r.prefill_attention_ms,
                r.prefill_attention_ms > 0 ? r.prefill_flops / r.prefill_attention_ms * 1e-9 : 0.0, r.page_write_ms);
    std::printf("attention  per decode step %.4f ms median (min %.4f, max %.4f) over %lld steps, %.1f ms in all (CUDA events): "
                "%.0f GB/s of K + V\n",
                r.attention.median_ms, r.attention.min_ms, r.attention.max_ms, (long long)r.steps, r.attention_total_ms,
                r.decode_kv_bytes / r.attention_total_ms * 1e-6);
    std::printf("memory     at the peak %lld pages in use: %s, for %lld keys (%s: the rest is each sequence's last page, part "
                "empty)\n",
                (long long)m.peak_pages, format_bytes(m.paged_bytes).c_str(), (long long)r.keys_at_peak,
                format_bytes(m.peak_keys * m.row_bytes).c_str());
    std::printf("           a cache allocated contiguously at the maximum length holds %s (%lld slots x %lld keys): "
                "the pages need %.2f of it\n",
                format_bytes(m.contiguous_bytes).c_str(), (long long)c.max_batch, (long long)(c.prompt_max + c.decode_steps),
                m.paged_bytes / m.contiguous_bytes);

    // The check: the sampled sequences' pages hold what was written, and their step's output is the
    // float64 reference's on the cache as read back.
    const ServeSample& s = r.sample;
    std::string who;
    for (size_t i = 0; i < s.requests.size(); ++i) {
        who += (i ? "; " : "") + std::string("request ") + std::to_string(s.requests[i]) + " (" +
               std::to_string(s.problem.cache_seqlens[i]) + " keys, " + s.why[i] + ")";
    }
    const int64_t wrong_rows = rows_not_as_written(s, c.seed, opt.precision);
    int64_t rows = 0;
    for (int64_t len : s.problem.cache_seqlens) rows += 2 * (len + 1);
    std::printf("check      step %lld, when the last request was admitted: %s\n", (long long)s.step, who.c_str());
    std::printf("pages      %s\n", wrong_rows == 0 ? ("hold what the prefill and the appends wrote: " + std::to_string(rows) +
                                                      " rows of K and V read back, bit for bit").c_str()
                                                   : ("WRONG: " + std::to_string(wrong_rows) + " of " + std::to_string(rows) +
                                                      " rows of K and V read back are not what was written").c_str());
    std::vector<Check> checks;
    Tolerances tol{};
    const bool run_reference = opt.run.reference != ReferenceMode::Never;
    if (run_reference) {
        const DecodeReference ref = reference_decode(s.problem, s.geometry, s.inputs, opt.precision);
        tol = decode_tolerance(ref, opt.precision);
        Check co{"O   vs float64 reference", compare(s.o, ref.o), tol.o, false, "O"};
        Check cl{"LSE vs float64 reference", compare(s.lse, ref.lse), tol.lse, false, "LSE"};
        for (Check* x : {&co, &cl}) x->ok = passes(x->metrics, x->tol), checks.push_back(*x);
        print_checks(checks);
        std::printf("tolerance  O: max_abs <= %.1e and rel_l2 <= %.1e; LSE: max_abs <= %.1e\n", tol.o.max_abs, tol.o.rel_l2, tol.lse.max_abs);
        print_rule(tol.rule);
    } else {
        std::printf("  note: float64 reference skipped (--reference never)\n");
    }
    std::printf("%s\n", describe_gpu().c_str());
    bool all_ok = wrong_rows == 0;
    for (const Check& x : checks) all_ok = all_ok && x.ok;
    if (!opt.run.json_path.empty()) {
        Json j = {{"stage", "13"}, {"title", "decoding"}, {"mode", "serve"}, {"dtype", to_string(opt.precision)},
                  {"heads", shape.heads_q}, {"kv_heads", shape.heads_k}, {"head_dim", shape.head_dim},
                  {"requests", c.requests}, {"max_batch", c.max_batch}, {"prompt_min", c.prompt_min}, {"prompt_max", c.prompt_max},
                  {"prompt_dist", to_string(c.distribution)}, {"decode_steps", c.decode_steps}, {"page_size", c.page_size},
                  {"pool_pages", c.pool()}, {"seed", c.seed}, {"prefill", r.prefill}, {"steps", r.steps},
                  {"decode_tokens", r.decode_tokens}, {"prefill_tokens", r.prefill_tokens}, {"peak_running", r.peak_running},
                  {"wall_s", r.wall_s}, {"tokens_per_s", tokens_per_s}, {"prefill_attention_ms", r.prefill_attention_ms},
                  {"prefill_tflops", r.prefill_attention_ms > 0 ? r.prefill_flops / r.prefill_attention_ms * 1e-9 : 0.0},
                  {"page_write_ms", r.page_write_ms}, {"step_ms_median", r.attention.median_ms}, {"step_ms_min", r.attention.min_ms},
                  {"step_ms_max", r.attention.max_ms}, {"attention_ms_total", r.attention_total_ms},
                  {"decode_gbps", r.decode_kv_bytes / r.attention_total_ms * 1e-6}, {"page_bytes", m.page_bytes},
                  {"peak_pages", m.peak_pages}, {"keys_at_peak", r.keys_at_peak}, {"paged_bytes", m.paged_bytes},
                  {"contiguous_bytes", m.contiguous_bytes}, {"paged_over_contiguous", m.paged_bytes / m.contiguous_bytes},
                  {"checked_step", s.step}, {"checked_requests", s.requests}, {"rows_not_as_written", wrong_rows},
                  {"checked", run_reference}, {"gpu", cuda::gpu_info().describe()}, {"pass", all_ok}};
        append_json_line(opt.run.json_path, j);
    }
    if (all_ok) {
        std::printf("verdict    PASS: the pages hold what was written%s\n",
                    run_reference ? ", and one step of the sampled sequences is within tolerance of the float64 reference" : "");
        return kExitPass;
    }
    std::printf("verdict    MISMATCH: see above\n");
    return kExitMismatch;
}

int run(const Options& opt, const CLI::App& app) {
    if (opt.serve) return run_serving(opt, app);
    for (const std::string& name : kServeOnly) {
        if (app.count(name)) throw InputError(name + " is an option of the serving loop: add --serve");
    }
    // Every refusal comes before a GPU is looked for, so they read the same on every machine.
    const DecodeProblem p = make_problem(opt, app);
    const CacheGeometry g = make_geometry(opt, app, p);
    const CacheKind kind = opt.cache == "contiguous" ? CacheKind::Contiguous : CacheKind::Paged;
    const CacheKind other = kind == CacheKind::Paged ? CacheKind::Contiguous : CacheKind::Paged;
    if (const std::string reason = cuda::gpu_unavailable_reason(); !reason.empty()) {
        std::printf("skipped: stage 13 needs a CUDA GPU (%s)\n", reason.c_str());
        return kExitSkipped;
    }
    const Precision precision = opt.precision;
    const int element = 2;
    const double cache_rows = std::max(double(p.batch()) * double(g.capacity()), double(g.num_pages) * double(g.page_size));
    cuda::require_device_memory(2.0 * cache_rows * double(p.heads_k * p.head_dim) * element * 1.05 + double(int64_t(256) << 20),
                                p.describe());
    const SplitChoice split = choose_splits_here(p, opt.splits);
    // --bench with --reference never only times: the inputs are drawn on the GPU, and nothing is
    // checked (a cache of many GiB would take minutes to make in float32 on the host).
    const bool timing_only = opt.run.bench && opt.run.reference == ReferenceMode::Never;
    const double q_scale = opt.run.inputs == InputKind::Large ? double(kLargeInputScale) : 1.0;
    const DecodeInputs in = timing_only ? DecodeInputs{} : make_decode_inputs(p, g, precision, opt.run.seed, q_scale);

    std::printf("problem    %s\n", p.describe().c_str());
    if (timing_only) {
        std::printf("inputs     standard normal, drawn on the GPU in %s (seed %llu): --bench with --reference never only times\n",
                    to_string(precision).c_str(), (unsigned long long)opt.run.seed);
    } else {
        std::printf("inputs     %s random, seed %llu, rounded to %s\n", to_string(opt.run.inputs).c_str(),
                    (unsigned long long)opt.run.seed, to_string(precision).c_str());
    }
    std::printf("cache      %s; %s\n", to_string(kind).c_str(), g.describe().c_str());
    const double bytes = p.kv_bytes(element), flops = 4.0 * double(p.heads_q) * double(p.seq_q) * double(p.total_keys()) * double(p.head_dim);
    std::printf("work       K + V read: %s (%lld keys x Hk %lld x d %lld x 2 bytes x 2); %s: %.2f FLOP per byte\n",
                format_bytes(bytes).c_str(), (long long)p.total_keys(), (long long)p.heads_k, (long long)p.head_dim,
                format_flops(flops).c_str(), flops / bytes);
    std::printf("tiles      %lld rows per K/V head (seq_q x G) in %lld tile(s) of %d rows; keys in tiles of %d\n",
                (long long)p.rows_per_kv_head(), (long long)p.row_tiles(), kRowsPerTile, kKeysPerTile);
    std::printf("splits     %d: %s\n", split.splits, split.why.c_str());

    const auto json_record = [&](const std::optional<TimingStats>& time, bool pass) {
        if (opt.run.json_path.empty()) return;
        // seq_k: the cached length when every sequence has the same (-1 for a ragged batch), as sweep13 keys its points.
        const bool equal_lengths = std::all_of(p.cache_seqlens.begin(), p.cache_seqlens.end(),
                                               [&](int64_t n) { return n == p.cache_seqlens[0]; });
        Json r = {{"stage", "13"}, {"title", "decoding"}, {"problem", p.describe()}, {"dtype", to_string(precision)},
                  {"cache", to_string(kind)}, {"page_size", g.page_size}, {"splits", split.splits}, {"kv_bytes", bytes},
                  {"batch", p.batch()}, {"heads", p.heads_q}, {"kv_heads", p.heads_k}, {"head_dim", p.head_dim}, {"seq_q", p.seq_q},
                  {"seq_k", equal_lengths ? p.cache_seqlens[0] : int64_t(-1)}, {"checked", !timing_only}};
        if (time) r["ms"] = time->median_ms, r["gbps"] = bytes / time->median_ms * 1e-6, r["gpu"] = cuda::gpu_info().describe();
        r["pass"] = pass;
        append_json_line(opt.run.json_path, r);
    };
    const auto print_bench = [&](const TimingStats& t) {
        std::printf("bench      %.4f ms median (min %.4f, max %.4f) of %d runs after %d warm-up, CUDA events, L2 flushed: %.0f GB/s of K + V\n",
                    t.median_ms, t.min_ms, t.max_ms, opt.run.repeat, std::max(opt.run.warmup, 1), bytes / t.median_ms * 1e-6);
        std::printf("%s\n", describe_gpu().c_str());
        std::printf("  note: bench/read_ceiling measures what this GPU can read; python3 bench/session.py run sweep13 gives "
                    "each point as a fraction of it\n");
    };
    if (timing_only) {
        const TimingStats t =
            bench_decode_generated(p, g, kind, precision, split.splits, opt.run.seed, std::max(opt.run.warmup, 1), opt.run.repeat);
        print_bench(t);
        json_record(t, true);
        std::printf("verdict    TIMED: nothing checked (--reference never with --bench); run without it to check the call\n");
        return kExitPass;
    }

    const DecodeOutput got = run_decode(p, g, kind, precision, in, split.splits);
    const DecodeOutput twin = run_decode(p, g, other, precision, in, split.splits);

    std::optional<TimingStats> time;
    if (opt.run.bench) {
        time = bench_decode(p, g, kind, precision, in, split.splits, std::max(opt.run.warmup, 1), opt.run.repeat);
        print_bench(*time);
    }

    std::vector<Check> checks;
    std::vector<std::string> notes;
    const double ref_cost = reference_varlen_flops(p.varlen());
    const bool run_reference = opt.run.reference == ReferenceMode::Always ||
                               (opt.run.reference == ReferenceMode::Auto && ref_cost <= kReferenceFlopBudget);
    Tolerances tol{};
    if (run_reference) {
        const DecodeReference ref = reference_decode(p, g, in, precision);
        tol = decode_tolerance(ref, precision);
        Check co{"O   vs float64 reference", compare(got.o, ref.o), tol.o, false, "O"};
        Check cl{"LSE vs float64 reference", compare(got.lse, ref.lse), tol.lse, false, "LSE"};
        for (Check* c : {&co, &cl}) c->ok = passes(c->metrics, c->tol), checks.push_back(*c);
    } else {
        notes.push_back(opt.run.reference == ReferenceMode::Never
                            ? "float64 reference skipped (--reference never)"
                            : "float64 reference skipped: it would cost " + format_flops(ref_cost) + " (budget 2e10; --reference always forces it)");
    }
    const bool bits = same_bits(got.o, twin.o) && same_bits(got.lse, twin.lse);
    const std::vector<float> k_want = reached_rows(p, g, append_on_host(p, g, in.k_cache, in.k_new));
    const std::vector<float> v_want = reached_rows(p, g, append_on_host(p, g, in.v_cache, in.v_new));
    const bool appended = same_bits(reached_rows(p, g, got.k_cache), k_want) && same_bits(reached_rows(p, g, got.v_cache), v_want);
    if (!checks.empty()) print_checks(checks);
    std::printf("bits       O and LSE of the %s cache %s those of the %s cache\n", to_string(kind).c_str(),
                bits ? "are bit for bit" : "DIFFER from", to_string(other).c_str());
    std::printf("append     %s\n", !p.append ? "none (--no-append)"
                                             : appended ? "the cache holds the new rows at cache_seqlens[b] .. and every cached row unchanged"
                                                        : "WRONG: the cache after the call is not the host's append");
    for (const std::string& n : notes) std::printf("  note: %s\n", n.c_str());
    if (run_reference) {
        std::printf("tolerance  O: max_abs <= %.1e and rel_l2 <= %.1e; LSE: max_abs <= %.1e\n", tol.o.max_abs, tol.o.rel_l2, tol.lse.max_abs);
        print_rule(tol.rule);
    }
    bool all_ok = bits && appended;
    for (const Check& c : checks) all_ok = all_ok && c.ok;
    json_record(time, all_ok);
    if (all_ok) {
        std::printf("verdict    PASS: %zu comparisons within tolerance, paged == contiguous bit for bit%s\n", checks.size(),
                    p.append ? ", the append in place" : "");
        return kExitPass;
    }
    std::printf("verdict    MISMATCH: see above\n");
    return kExitMismatch;
}

}  // namespace

int main(int argc, char** argv) {
    Options opt;
    CLI::App app{
        "flashcourse stage 13: decoding over a KV cache\n\n"
        "A ragged batch of sequences (--cache-seqlens), each bringing --seq-q new query rows whose K and V are appended\n"
        "into the cache in place; grouped query heads (--kv-heads) packed into the rows of one tile; the cache in pages\n"
        "through block tables (--page-size) or contiguous (--cache contiguous); the keys split across thread blocks\n"
        "(--splits, default by a rule the report prints) and merged. Checked against the float64 reference per sequence,\n"
        "and the paged cache against the contiguous one bit for bit.\n\n"
        "--serve runs a serving loop over the same kernel instead: --requests with prompt lengths drawn between\n"
        "--prompt-min and --prompt-max, prefilled into pages from a free list, decoded --decode-steps tokens each in\n"
        "batches of up to --max-batch; tokens per second, time per step, the pages' memory against a contiguous cache."};
    app.get_formatter()->column_width(34);
    add_options(app, opt);
    if (const int code = parse_command_line(app, argc, argv); code >= 0) return code;
    std::printf("== flashcourse stage 13: decoding ==\n");
    try {
        return run(opt, app);
    } catch (const InputError& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "error: %s\n", e.what());
        return kExitBadInput;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "error: out of memory: use fewer or shorter sequences\n");
        return kExitBadInput;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "error: %s\n", e.what());
        return kExitMismatch;
    }
}
