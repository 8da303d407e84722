// Stage 13 executable: decoding over a KV cache. A ragged batch of sequences, each with its cached
// keys and a few new query rows whose K and V are appended into the cache in place; grouped query
// heads packed into the rows of one tile; the cache held in pages through block tables or
// contiguously; the keys split across thread blocks and the splits merged. Checked against the
// float64 reference per sequence by the low-precision rule, and the paged cache against the
// contiguous one bit for bit.
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
};

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
    app.add_option("--pool-pages", o.pool_pages, "pages in the pool with --block-table (default: the largest entry + 1)");
    app.add_option("--splits", o.splits, "splits of each sequence's keys (default: the rule, printed in the report)")
        ->check(CLI::Range(1, kMaxSplits));
    app.add_flag("--no-append", o.no_append, "the cache already holds the new rows' keys (cache_seqlens counts them)");
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

int run(const Options& opt, const CLI::App& app) {
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
        "and the paged cache against the contiguous one bit for bit."};
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
