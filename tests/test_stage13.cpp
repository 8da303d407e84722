// Stage 13 (decoding over a KV cache) on the GPU, bf16 and fp16: the compiled kernels against the
// float64 reference per sequence by the low-precision rule (fa/tolerance.hpp); the paged cache
// against the contiguous one bit for bit at every page size; the cache after the append against
// the host's; the split rule's choice and forced splits; the same bits run to run. Exits 77
// (skipped) without a GPU (gpu_main.cpp).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "../stages/13_decode/decode.cuh"
#include "../stages/13_decode/decode_problem.hpp"
#include "fa/error.hpp"
#include "fa/metrics.hpp"
#include "fa/tolerance.hpp"

using namespace fa;
using namespace fa::stage13;

namespace {

struct Case {
    const char* what;
    std::vector<int64_t> cache_seqlens;
    int64_t seq_q, heads_q, heads_k, head_dim;
    bool append;
    int splits;  // 0: the rule's
};

DecodeProblem problem_of(const Case& c) {
    return make_decode_problem(c.cache_seqlens, c.seq_q, c.heads_q, c.heads_k, c.head_dim, c.append);
}

void check_case(const Case& c, Precision precision, int64_t page_size) {
    const DecodeProblem p = problem_of(c);
    const CacheGeometry g = make_paged_geometry(p, page_size, 3);
    g.validate(p);
    const DecodeInputs in = make_decode_inputs(p, g, precision, 99);
    const SplitChoice split = choose_splits_here(p, c.splits);
    INFO(c.what << ": " << p.describe() << ", " << g.describe() << ", " << to_string(precision) << ", splits " << split.splits);
    const DecodeOutput paged = run_decode(p, g, CacheKind::Paged, precision, in, split.splits);
    const DecodeOutput contiguous = run_decode(p, g, CacheKind::Contiguous, precision, in, split.splits);
    CHECK(same_bits(paged.o, contiguous.o));
    CHECK(same_bits(paged.lse, contiguous.lse));
    const std::vector<float> k_want = reached_rows(p, g, append_on_host(p, g, in.k_cache, in.k_new));
    const std::vector<float> v_want = reached_rows(p, g, append_on_host(p, g, in.v_cache, in.v_new));
    CHECK(same_bits(reached_rows(p, g, paged.k_cache), k_want));
    CHECK(same_bits(reached_rows(p, g, paged.v_cache), v_want));
    CHECK(same_bits(reached_rows(p, g, contiguous.k_cache), k_want));
    CHECK(same_bits(reached_rows(p, g, contiguous.v_cache), v_want));
    const DecodeReference ref = reference_decode(p, g, in, precision);
    const Tolerances tol = decode_tolerance(ref, precision);
    const Metrics mo = compare(paged.o, ref.o), ml = compare(paged.lse, ref.lse);
    INFO("O: max_abs " << mo.max_abs << " (limit " << tol.o.max_abs << "), rel_l2 " << mo.rel_l2 << " (limit " << tol.o.rel_l2
                       << "), nonfinite " << mo.nonfinite << "; LSE: max_abs " << ml.max_abs << " (limit " << tol.lse.max_abs << ")");
    CHECK(passes(mo, tol.o));
    CHECK(passes(ml, tol.lse));
}

const Case kCases[] = {
    {"one key", {0}, 1, 8, 1, 128, true, 0},
    {"ragged lengths, an empty sequence, 4:1", {1000, 37, 0, 4097, 513}, 1, 32, 8, 128, true, 0},
    {"8:1, seq_q 4 (32 rows, two row tiles)", {3000, 64, 65}, 4, 32, 4, 64, true, 0},
    {"1:1, seq_q 16, forced splits", {777, 2000}, 16, 4, 4, 128, true, 7},
    {"MQA, seq_q 2, no append (rows that see no key)", {0, 1, 900}, 2, 16, 1, 64, false, 0},
    {"one long sequence: the rule splits it", {60000}, 1, 8, 2, 128, true, 0},
};

}  // namespace

TEST_CASE("stage 13 matches the float64 reference, paged == contiguous bit for bit, bf16 and fp16") {
    for (Precision precision : {Precision::BFloat16, Precision::Float16})
        for (const Case& c : kCases) check_case(c, precision, 64);
}

TEST_CASE("stage 13 gives the same bits at every page size from 16 to 512") {
    const Case c{"every page size", {1500, 3, 700}, 2, 16, 4, 128, true, 0};
    for (int64_t page = 16; page <= 512; page *= 2) check_case(c, Precision::BFloat16, page);
}

TEST_CASE("stage 13 is deterministic run to run, with and without splits") {
    const DecodeProblem p = problem_of({"", {5000, 300}, 3, 16, 2, 64, true, 0});
    const CacheGeometry g = make_paged_geometry(p, 16, 5);
    const DecodeInputs in = make_decode_inputs(p, g, Precision::Float16, 5);
    for (int splits : {1, 9}) {
        const DecodeOutput a = run_decode(p, g, CacheKind::Paged, Precision::Float16, in, splits);
        const DecodeOutput b = run_decode(p, g, CacheKind::Paged, Precision::Float16, in, splits);
        CHECK(same_bits(a.o, b.o));
        CHECK(same_bits(a.lse, b.lse));
    }
}

TEST_CASE("stage 13's split rule on this GPU: a lone sequence is split, a large batch is not") {
    DecodeProblem p;
    p.heads_q = 32, p.heads_k = 8, p.head_dim = 128;
    p.cache_seqlens = {32768};
    CHECK(choose_splits_here(p).splits > 1);
    p.cache_seqlens.assign(256, 32768);
    CHECK(choose_splits_here(p).splits == 1);
    CHECK(split_blocks_per_sm(128) >= 1);
    CHECK(split_blocks_per_sm(64) >= split_blocks_per_sm(128));
}

TEST_CASE("stage 13's device entry point refuses a split count it cannot run") {
    const DecodeProblem p = problem_of({"", {100}, 1, 4, 1, 64, true, 0});
    const CacheGeometry g = make_paged_geometry(p, 16, 1);
    CallPointers<__nv_bfloat16> c;
    CHECK_THROWS_AS(decode_device<__nv_bfloat16>(p, g, CacheKind::Paged, 0, c), InputError);
    CHECK_THROWS_AS(decode_device<__nv_bfloat16>(p, g, CacheKind::Paged, kMaxSplits + 1, c), InputError);
}

TEST_CASE("stage 13 times a call on inputs drawn on the device (the sweep's path)") {
    const DecodeProblem p = problem_of({"", {4000, 100}, 1, 32, 8, 128, true, 0});
    const CacheGeometry g = make_paged_geometry(p, 64, 2);
    for (CacheKind kind : {CacheKind::Paged, CacheKind::Contiguous}) {
        const TimingStats t = bench_decode_generated(p, g, kind, Precision::BFloat16, choose_splits_here(p).splits, 1, 1, 3);
        CHECK(t.median_ms > 0);
        CHECK(t.samples_ms.size() == 3);
    }
}
