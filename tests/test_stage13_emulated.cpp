// Stage 13's kernels (the append, the split-KV attention kernel, the combine) launched as the stage
// launches them (stages/13_decode/launch.hpp builds the arguments) and run on the CPU by the warp
// emulator (tools/warp_emulator), against the float64 reference per sequence by the low-precision
// rule (fa/tolerance.hpp); the paged cache against the contiguous one bit for bit; the cache after
// the append against the host's; the host half's refusals and its split rule. No GPU is needed, so
// this runs in CI; the GPU test (test_stage13.cpp) remains the check of the compiled kernels.
// Four kernel instances (bf16, fp16 x d 64, 128) keep the compile time modest.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "emulator.hpp"
#include "fa/error.hpp"
#include "fa/metrics.hpp"
#include "fa/tolerance.hpp"
#include "stages/13_decode/decode_problem.hpp"
#include "stages/13_decode/kernel.cuh"
#include "stages/13_decode/launch.hpp"

namespace fa::stage13 {
// The dynamic shared memory the kernels declare (`extern __shared__ ... smem_raw[]`).
alignas(128) unsigned char smem_raw[SplitShape<128>::kSmemBytes];
}  // namespace fa::stage13

namespace {

using namespace fa;
using namespace fa::stage13;

struct Output {
    std::vector<float> o;        // (B, seq_q, Hq, d)
    std::vector<float> lse;      // (B, Hq, seq_q)
    std::vector<float> k_cache;  // contiguous (B, capacity, Hk, d) after the call (NaN past each sequence's keys)
    std::vector<float> v_cache;
};

template <class T>
std::vector<float> widen(const std::vector<uint16_t>& x) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = emu::to_f<T>(x[i]);
    return out;
}

// One call through the stage's launch code on the emulator, in T at head dimension D; the host
// arrays stand in for the device ones.
template <class T, int D>
Output run_emulated(const DecodeProblem& p, const CacheGeometry& g, CacheKind kind, const DecodeInputs& in, int splits) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<uint16_t> q = emu::to_bits<T>(in.q), k_new = emu::to_bits<T>(in.k_new), v_new = emu::to_bits<T>(in.v_new);
    const bool paged = kind == CacheKind::Paged;
    std::vector<uint16_t> k_cache = emu::to_bits<T>(paged ? to_paged(p, g, in.k_cache, nan) : in.k_cache);
    std::vector<uint16_t> v_cache = emu::to_bits<T>(paged ? to_paged(p, g, in.v_cache, nan) : in.v_cache);
    std::vector<int32_t> seqlens;
    for (int64_t len : p.cache_seqlens) seqlens.push_back(int32_t(len));
    std::vector<uint16_t> o(size_t(p.batch() * p.seq_q * p.heads_q * D), 0xffff);  // NaN: what the kernels forget to write shows
    std::vector<float> lse(size_t(p.batch() * p.heads_q * p.seq_q), nan);
    std::vector<float> o_part(size_t(partial_o_floats(p, splits)), nan), lse_part(size_t(partial_lse_floats(p, splits)), nan);
    CallPointers<T> c;
    c.q = reinterpret_cast<const T*>(q.data());
    c.k_new = p.append ? reinterpret_cast<const T*>(k_new.data()) : nullptr;
    c.v_new = p.append ? reinterpret_cast<const T*>(v_new.data()) : nullptr;
    c.k_cache = reinterpret_cast<T*>(k_cache.data()), c.v_cache = reinterpret_cast<T*>(v_cache.data());
    c.block_table = g.block_table.data(), c.cache_seqlens = seqlens.data();
    c.o = reinterpret_cast<T*>(o.data()), c.lse = lse.data(), c.o_partial = o_part.data(), c.lse_partial = lse_part.data();
    const DecodeArgs<T> a = make_decode_args<T>(p, g, kind, splits, c);
    if (p.append) {
        emu::launch(long(ceil_div(append_chunks(a, D), kThreads)), kThreads, smem_raw, 0, [&] { append_kv_kernel<T, D>(a); });
    }
    emu::launch(long(split_grid(a)), kThreads, smem_raw, SplitShape<D>::kSmemBytes, [&] { decode_split_kernel<T, D>(a); });
    if (splits > 1) emu::launch(long(combine_grid(a)), 32 * kCombineRowsPerBlock, smem_raw, 0, [&] { decode_combine_kernel<T, D>(a); });
    Output out{widen<T>(o), lse, widen<T>(k_cache), widen<T>(v_cache)};
    if (paged) out.k_cache = from_paged(p, g, out.k_cache), out.v_cache = from_paged(p, g, out.v_cache);
    return out;
}

Output run_case(const DecodeProblem& p, const CacheGeometry& g, CacheKind kind, Precision precision, const DecodeInputs& in,
                int splits) {
    const bool bf16 = precision == Precision::BFloat16;
    if (p.head_dim == 64) return bf16 ? run_emulated<__nv_bfloat16, 64>(p, g, kind, in, splits) : run_emulated<__half, 64>(p, g, kind, in, splits);
    return bf16 ? run_emulated<__nv_bfloat16, 128>(p, g, kind, in, splits) : run_emulated<__half, 128>(p, g, kind, in, splits);
}

struct Case {
    const char* what;
    std::vector<int64_t> cache_seqlens;
    int64_t seq_q, heads_q, heads_k, head_dim, page_size;
    Precision precision;
    bool append;
    int splits;  // 0: the rule's, on the emulator's 4 SMs
    double q_scale = 1.0;  // q times this: scores of order hundreds with 20 (InputKind::Large's factor)
};

// Runs `c` in a contiguous and a paged cache and checks everything a call promises.
void check_case(const Case& c) {
    const DecodeProblem p = make_decode_problem(c.cache_seqlens, c.seq_q, c.heads_q, c.heads_k, c.head_dim, c.append);
    const CacheGeometry g = make_paged_geometry(p, c.page_size, 7);
    g.validate(p);
    const DecodeInputs in = make_decode_inputs(p, g, c.precision, 1234, c.q_scale);
    const SplitChoice split = choose_splits(p, emu::sm_count, 2, c.splits);
    INFO(c.what << ": " << p.describe() << ", " << g.describe() << ", " << to_string(c.precision) << ", splits " << split.splits);
    const Output contiguous = run_case(p, g, CacheKind::Contiguous, c.precision, in, split.splits);
    const Output paged = run_case(p, g, CacheKind::Paged, c.precision, in, split.splits);
    CHECK(same_bits(paged.o, contiguous.o));
    CHECK(same_bits(paged.lse, contiguous.lse));
    // The append, in place: the cache after the call is the host's append (both caches).
    const std::vector<float> k_want = reached_rows(p, g, append_on_host(p, g, in.k_cache, in.k_new));
    const std::vector<float> v_want = reached_rows(p, g, append_on_host(p, g, in.v_cache, in.v_new));
    CHECK(same_bits(reached_rows(p, g, contiguous.k_cache), k_want));
    CHECK(same_bits(reached_rows(p, g, contiguous.v_cache), v_want));
    CHECK(same_bits(reached_rows(p, g, paged.k_cache), k_want));
    CHECK(same_bits(reached_rows(p, g, paged.v_cache), v_want));
    // Against float64, by the low-precision rule.
    const DecodeReference ref = reference_decode(p, g, in, c.precision);
    const Tolerances tol = decode_tolerance(ref, c.precision);
    const Metrics mo = compare(paged.o, ref.o), ml = compare(paged.lse, ref.lse);
    INFO("O: max_abs " << mo.max_abs << " (limit " << tol.o.max_abs << "), rel_l2 " << mo.rel_l2 << " (limit " << tol.o.rel_l2
                       << "), nonfinite " << mo.nonfinite << "; LSE: max_abs " << ml.max_abs << " (limit " << tol.lse.max_abs
                       << "), nonfinite " << ml.nonfinite);
    CHECK(passes(mo, tol.o));
    CHECK(passes(ml, tol.lse));
    // Rows that see no key: O exactly 0 and LSE -inf.
    for (int64_t b = 0; b < p.batch(); ++b) {
        for (int64_t i = 0; i < p.seq_q; ++i) {
            if (p.seq_k(b) - p.seq_q + i + 1 > 0) continue;
            for (int64_t h = 0; h < p.heads_q; ++h) {
                CHECK(paged.lse[size_t((b * p.heads_q + h) * p.seq_q + i)] == -std::numeric_limits<float>::infinity());
                for (int64_t x = 0; x < p.head_dim; ++x) CHECK(paged.o[size_t(((b * p.seq_q + i) * p.heads_q + h) * p.head_dim + x)] == 0.f);
            }
        }
    }
}

std::string refusal(const DecodeProblem& p, const CacheGeometry& g) {
    try {
        p.validate();
        g.validate(p);
    } catch (const InputError& e) {
        return e.what();
    }
    return "(no error)";
}

}  // namespace

TEST_CASE("emulated stage 13: one key, ragged lengths, empty sequences, causal new rows, every grouping, d 64/128, bf16/fp16") {
    const Precision bf = Precision::BFloat16, fp = Precision::Float16;
    const Case cases[] = {
        {"one key (MQA)", {0}, 1, 4, 1, 64, 16, bf, true, 0},
        {"lengths not a multiple of a page or a tile, 4:1", {100, 37, 250}, 1, 8, 2, 128, 32, fp, true, 0},
        {"the same, three splits (the combine)", {100, 37, 250}, 1, 8, 2, 128, 32, fp, true, 3},
        {"empty sequences, no append (rows that see no key)", {0, 70, 0, 1}, 2, 4, 4, 64, 16, bf, false, 2},
        {"seq_q 5 causal, 8:1 (40 rows: three row tiles)", {130, 3}, 5, 16, 2, 64, 64, bf, true, 2},
        {"seq_q 16, 1:1, splits 2", {200}, 16, 2, 2, 128, 128, bf, true, 2},
        {"MQA 8:1, seq_q 3 (24 rows), no append", {300, 17}, 3, 8, 1, 64, 16, fp, false, 4},
        {"4:1, seq_q 4, pages of 512", {600, 5}, 4, 4, 1, 128, 512, fp, true, 0},
        {"one long sequence: the rule splits it", {3000}, 1, 4, 1, 128, 256, bf, true, 0},
        {"more splits than a short sequence has tiles (empty splits)", {2000, 10, 0}, 2, 8, 2, 64, 32, fp, true, 6},
        {"large logits (q x 20)", {900, 33}, 3, 4, 2, 64, 64, bf, true, 3, 20.0},
        {"large logits in fp16, 8:1", {500}, 1, 8, 1, 128, 16, fp, true, 2, 20.0},
    };
    for (const Case& c : cases) check_case(c);
    DecodeProblem lone;
    lone.cache_seqlens = {3000}, lone.heads_q = 4, lone.heads_k = 1, lone.head_dim = 128;
    CHECK(choose_splits(lone, emu::sm_count, 2).splits > 1);  // the case above ran through the combine
}

TEST_CASE("emulated stage 13: bad inputs are refused with a message naming what is wrong and what is allowed") {
    DecodeProblem p;
    p.cache_seqlens = {100, 20}, p.heads_q = 8, p.heads_k = 2, p.head_dim = 64;
    const CacheGeometry good = make_paged_geometry(p, 64, 1);
    CHECK(refusal(p, good) == "(no error)");
    for (int64_t size : {8, 24, 1024, 0}) {
        std::string m;
        try {
            check_page_size(size);
        } catch (const InputError& e) {
            m = e.what();
        }
        INFO(m);
        CHECK(m.find("--page-size " + std::to_string(size) + " is not allowed: use a power of two from 16 to 512") != std::string::npos);
    }
    CacheGeometry outside = good;
    outside.block_table[0] = int32_t(outside.num_pages);
    CHECK(refusal(p, outside).find("block_table[0][0] = " + std::to_string(outside.num_pages) + " is outside the pool") !=
          std::string::npos);
    outside.block_table[0] = -1;
    CHECK(refusal(p, outside).find("is outside the pool") != std::string::npos);
    DecodeProblem longer = p;
    longer.cache_seqlens[1] = 128;  // 129 keys after the append, the table holds 2 pages of 64
    CHECK(refusal(longer, good).find("sequence 1 has 129 keys after the append (128 cached + 1 new), beyond its block table") !=
          std::string::npos);
    CacheGeometry shared = good;
    shared.block_table[size_t(shared.pages_per_seq)] = shared.block_table[0];  // sequence 1's first page is sequence 0's
    CHECK(refusal(p, shared).find("the append writes pages") != std::string::npos);
    DecodeProblem read_only = p;
    read_only.append = false;
    CHECK(refusal(read_only, shared) == "(no error)");  // shared pages read only: a prefix cache
    DecodeProblem heads = p;
    heads.heads_k = 3;
    CHECK(refusal(heads, good).find("--heads 8 is not a multiple of --kv-heads 3") != std::string::npos);
    DecodeProblem rows = p;
    rows.seq_q = 17;
    CHECK(refusal(rows, good).find("--seq-q 17 is not supported by stage 13: give 1 to 16") != std::string::npos);
    DecodeProblem dim = p;
    dim.head_dim = 96;
    CHECK(refusal(dim, good).find("--head-dim 96 is not supported by stage 13: use 64 or 128") != std::string::npos);
    DecodeProblem negative = p;
    negative.cache_seqlens[0] = -1;
    CHECK(refusal(negative, good).find("cache_seqlens[0] is -1") != std::string::npos);
    CHECK_THROWS_AS(parse_block_table("1,x/2"), InputError);
    CHECK(parse_block_table("3,0/2").size() == 2);
}

TEST_CASE("emulated stage 13: the split rule fills the SMs and keeps each split at least four tiles long") {
    DecodeProblem p;
    p.heads_q = 32, p.heads_k = 8, p.head_dim = 128;
    p.cache_seqlens = std::vector<int64_t>(64, 32768);  // 512 blocks unsplit: more than a wave of 132 x 2
    CHECK(choose_splits(p, 132, 2).splits == 1);
    p.cache_seqlens = {32768};  // 8 blocks unsplit on 264 slots
    const SplitChoice one = choose_splits(p, 132, 2);
    CHECK(one.splits > 16);
    CHECK(one.wave_fill > 0.8);
    p.cache_seqlens = {300};  // 5 tiles: a single split of at least 4 tiles
    CHECK(choose_splits(p, 132, 2).splits == 1);
    CHECK(choose_splits(p, 132, 2, 50).splits == 5);  // --splits capped at the tiles
    CHECK(choose_splits(p, 132, 2, 3).splits == 3);
}
