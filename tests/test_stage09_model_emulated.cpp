// Stage 09's default main kernel with stage 10's switches (grouped-query heads, sliding windows, the
// soft cap), with its preprocessing and postprocessing kernels, launched as the stage launches them
// (stages/09_backward_kernel/launch.cuh: the options resolved, the features chosen, the arguments
// built) and run on the CPU by the warp emulator (tools/warp_emulator), against the float64
// gradients of fa/reference_ext.hpp (tests/backward_model_cases.hpp). No GPU is needed, so this
// runs in CI; the GPU tests (test_stage09) remain the check of the compiled kernels.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "backward_model_cases.hpp"
#include "emulator.hpp"
#include "fa/error.hpp"
#include "fa/problem.hpp"
#include "fa/tensor.hpp"
#include "stages/07_pipelined_fused_kernel/launch.cuh"
#include "stages/09_backward_kernel/launch.cuh"

namespace fa::stage09 {
// The dynamic shared memory the kernels declare (`extern __shared__ ... smem_raw[]`).
alignas(128) unsigned char smem_raw[232448];
}  // namespace fa::stage09
namespace fa::stage07 {
// Stage 07's forward (dropout's mask as the forward draws it), the same way.
alignas(128) unsigned char smem_raw[232448];
}  // namespace fa::stage07

namespace {

using namespace fa;
using namespace fa::stage09;

/// What one emulated run gives: the gradients, and whether the kernel with stage 10's switches ran.
struct Run {
    test::ModelGradients grads;
    bool model = false;
};

/// The launcher the stage's launch sequences call (`launch(Kernel<k>{}, name, blocks, threads,
/// shared_bytes, args)`), here on the emulator: the blocks one at a time, in order of block
/// number, the dynamic shared memory in stage 09's smem_raw.
struct EmulatedLaunch {
    template <class K, class A>
    void operator()(K, const char*, int64_t blocks, int threads, size_t smem, const A& args) const {
        REQUIRE(smem <= sizeof smem_raw);
        emu::launch(long(blocks), threads, smem_raw, smem, [&] { K::value(args); });
    }
};

/// The 16-bit gradients of one run as floats.
template <class T>
std::vector<float> widen(const std::vector<uint16_t>& x) {
    std::vector<float> f(x.size());
    for (size_t i = 0; i < x.size(); ++i) f[i] = emu::to_f<T>(x[i]);
    return f;
}

// The backward of case `c` through the stage's launch code (launch.cuh: the options resolved,
// make_launches, run_model_kernels) on the emulator, in T at head dimension D. q, k, v, o, dout
// in the packed orders of BackwardModelData; the workspace starts as garbage, the turns at 777
// and the gradients as all-ones bits (NaN): what the kernels forget shows. Blocks run one at a
// time in order of block number: in the deterministic mode a block that had to wait for its turn
// would stop the emulator (a wait for a block that runs after it). `split`: the group split S
// (launch.cuh's group_split()).
template <class T, int D>
Run run_emulated(const test::ModelCase& c, const std::vector<float>& q, const std::vector<float>& k,
                 const std::vector<float>& v, const std::vector<float>& o, const std::vector<float>& lse,
                 const std::vector<float>& dout, bool deterministic, int split = 1) {
    const Problem p = c.problem();
    const ResolvedOptions m = resolve_options(p, c.options());
    const Geometry geo = geometry_for<D>(kModelStep);
    const Counts counted = counts(p, geo);
    std::vector<float> workspace(size_t(workspace_floats(p, geo, 0, m.kv_group, split)), 12345.0f);
    std::vector<int> turns(size_t(counted.batch_heads * counted.q_blocks), 777);
    const std::vector<uint16_t> q16 = emu::to_bits<T>(q), k16 = emu::to_bits<T>(k), v16 = emu::to_bits<T>(v),
                                o16 = emu::to_bits<T>(o), do16 = emu::to_bits<T>(dout);
    std::vector<uint16_t> dq16(q.size(), 0xffff), dk16(k.size(), 0xffff), dv16(v.size(), 0xffff);
    // (B, H, N, d) views of the packed (total, H, d) buffers; the LSE (B, Hq, Nq) of an (Hq, total_q) buffer.
    const auto view = [&](const std::vector<uint16_t>& x, int64_t h, int64_t n) {
        return View4<const T>{reinterpret_cast<const T*>(x.data()), {c.B, h, n, D}, {n * h * D, D, h * D, 1}};
    };
    const auto out = [&](std::vector<uint16_t>& x, int64_t h, int64_t n) {
        return View4<T>{reinterpret_cast<T*>(x.data()), {c.B, h, n, D}, {n * h * D, D, h * D, 1}};
    };
    const View3<const float> lv{lse.data(), {c.B, c.Hq, c.Nq}, {c.Nq, int64_t(c.B) * c.Nq, 1}};
    const Launches<T> launches = make_launches<T, D>(
        p, m, view(q16, c.Hq, c.Nq), view(k16, c.Hk, c.Nk), view(v16, c.Hk, c.Nk), view(o16, c.Hq, c.Nq), lv,
        view(do16, c.Hq, c.Nq), out(dq16, c.Hq, c.Nq), out(dk16, c.Hk, c.Nk), out(dv16, c.Hk, c.Nk), workspace.data(),
        deterministic ? turns.data() : nullptr, geo, 0, split);
    if (deterministic) {
        run_model_kernels<T, D, true>(launches, m, EmulatedLaunch{});
    } else {
        run_model_kernels<T, D, false>(launches, m, EmulatedLaunch{});
    }
    Run r;
    r.model = with_model_features<D>(m, [](auto features) { return kGroupedHeads<decltype(features)>; });
    r.grads = {widen<T>(dq16), widen<T>(dk16), widen<T>(dv16)};
    return r;
}

template <class T>
Run run_for_d(const test::ModelCase& c, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
              const std::vector<float>& o, const std::vector<float>& lse, const std::vector<float>& dout, bool deterministic,
              int split) {
    switch (c.d) {
        case 32: return run_emulated<T, 32>(c, q, k, v, o, lse, dout, deterministic, split);
        case 64: return run_emulated<T, 64>(c, q, k, v, o, lse, dout, deterministic, split);
        default: return run_emulated<T, 128>(c, q, k, v, o, lse, dout, deterministic, split);
    }
}

Run run_case(const test::ModelCase& c, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
             const std::vector<float>& o, const std::vector<float>& lse, const std::vector<float>& dout, bool deterministic,
             int split = 1) {
    return c.precision == Precision::BFloat16 ? run_for_d<__nv_bfloat16>(c, q, k, v, o, lse, dout, deterministic, split)
                                              : run_for_d<__half>(c, q, k, v, o, lse, dout, deterministic, split);
}

// A packed call through the stage's launch code for packed batches (resolve_varlen_backward,
// kv_schedule, make_varlen_launches, run_varlen_kernels) on the emulator, in T at head dimension
// D; the host arrays stand in for the device ones. Returns whether the kernel ran with the
// varlen switch (and grouped heads and the window). `split`: the group split S.
template <class T, int D>
Run run_varlen_emulated(const test::VarlenCase& c, const test::BackwardModelData& data, bool deterministic, int split = 1) {
    const VarlenProblem& vp = data.vp;
    const MaxSeqlens max{vp.max_seq_q() + c.extra_max, vp.max_seq_k() + c.extra_max};
    const ResolvedOptions m = resolve_varlen_backward(vp, max);
    const Geometry geo = geometry_for<D>(kModelStep);
    const Problem rows = varlen_rows_problem(vp);
    const Counts counted = counts(rows, geo, 1);
    std::vector<float> workspace(size_t(workspace_floats(rows, geo, 1, m.kv_group, split)), 12345.0f);
    std::vector<int> turns(size_t(counted.batch_heads * counted.seq_q_padded), 777);
    const bool longest_first = packed_longest_first(vp, m, deterministic);
    const std::vector<int32_t> schedule = kv_schedule(vp, m, geo.br, geo.bc, deterministic, longest_first);
    const std::vector<uint16_t> q16 = emu::to_bits<T>(data.q), k16 = emu::to_bits<T>(data.k), v16 = emu::to_bits<T>(data.v),
                                o16 = emu::to_bits<T>(data.o), do16 = emu::to_bits<T>(data.dout);
    std::vector<uint16_t> dq16(data.q.size(), 0xffff), dk16(data.k.size(), 0xffff), dv16(data.v.size(), 0xffff);
    const auto in = [&](const std::vector<uint16_t>& x, int64_t total, int64_t heads) {
        return make_packed_view(reinterpret_cast<const T*>(x.data()), total, heads, int64_t(D));
    };
    const auto out = [&](std::vector<uint16_t>& x, int64_t total, int64_t heads) {
        return make_packed_view(reinterpret_cast<T*>(x.data()), total, heads, int64_t(D));
    };
    const View3<const float> lv{data.lse.data(), {1, vp.heads_q, vp.total_q}, {vp.heads_q * vp.total_q, vp.total_q, 1}};
    const Launches<T> launches = make_varlen_launches<T, D>(
        vp, m, in(q16, vp.total_q, vp.heads_q), in(k16, vp.total_k, vp.heads_k), in(v16, vp.total_k, vp.heads_k),
        in(o16, vp.total_q, vp.heads_q), lv, in(do16, vp.total_q, vp.heads_q), out(dq16, vp.total_q, vp.heads_q),
        out(dk16, vp.total_k, vp.heads_k), out(dv16, vp.total_k, vp.heads_k), workspace.data(),
        deterministic ? turns.data() : nullptr, geo, vp.cu_seqlens_q.data(), vp.cu_seqlens_k.data(), schedule.data(),
        int64_t(schedule.size() / 2), longest_first, split);
    if (deterministic) {
        run_varlen_kernels<T, D, true>(launches, m, EmulatedLaunch{});
    } else {
        run_varlen_kernels<T, D, false>(launches, m, EmulatedLaunch{});
    }
    Run r;
    r.model = stage09::with_varlen_features<D>(m, [](auto features) {
        using F = decltype(features);
        return kPacked<F> && kWindow<F> && kGroupedHeads<F>;
    });
    r.grads = {widen<T>(dq16), widen<T>(dk16), widen<T>(dv16)};
    return r;
}

Run run_varlen_case(const test::VarlenCase& c, const test::BackwardModelData& data, bool deterministic, int split = 1) {
    const bool bf16 = c.precision == Precision::BFloat16;
    switch (c.d) {
        case 32: return bf16 ? run_varlen_emulated<__nv_bfloat16, 32>(c, data, deterministic, split)
                             : run_varlen_emulated<__half, 32>(c, data, deterministic, split);
        case 64: return bf16 ? run_varlen_emulated<__nv_bfloat16, 64>(c, data, deterministic, split)
                             : run_varlen_emulated<__half, 64>(c, data, deterministic, split);
        default: return bf16 ? run_varlen_emulated<__nv_bfloat16, 128>(c, data, deterministic, split)
                             : run_varlen_emulated<__half, 128>(c, data, deterministic, split);
    }
}

// Case `c` in both dQ modes against the float64 gradients; the two modes' dK and dV are the same
// bits (they never leave their block); with grouped heads, the same problem with K and V
// repeated per query head on the plain kernel gives the same dQ, bit for bit (the same products
// added in the same order), and its dK, dV summed over each group the grouped call's dK, dV to
// the rounding of the per-head sums.
void check_case(const test::ModelCase& c) {
    const test::BackwardModelData data = test::backward_model_data(c);
    const bool bf16 = c.precision == Precision::BFloat16;
    test::ModelGradients by_mode[2];
    for (const bool deterministic : {false, true}) {
        const Run r = run_case(c, data.q, data.k, data.v, data.o, data.lse, data.dout, deterministic);
        INFO(c.describe() << std::string(deterministic ? " deterministic" : " atomic"));
        CHECK(r.model == c.model);
        test::check_backward_gradients(c, data, r.grads, deterministic ? "deterministic" : "atomic");
        by_mode[deterministic] = r.grads;
    }
    CHECK(by_mode[0].dk == by_mode[1].dk);
    CHECK(by_mode[0].dv == by_mode[1].dv);
    const test::ModelCase rc = test::repeated_case(c);
    if (c.Hk == c.Hq || rc.model) return;  // the repeated problem on the plain kernel only (a windowed one is slow here)
    const std::vector<float> k = test::repeat_heads(data.k, c.Hk, c.Hq, c.d), v = test::repeat_heads(data.v, c.Hk, c.Hq, c.d);
    const Run r = run_case(rc, data.q, k, v, data.o, data.lse, data.dout, true);
    INFO(c.describe() << ": against K and V repeated per query head");
    CHECK(r.model == rc.model);
    CHECK(r.grads.dq == by_mode[1].dq);
    const std::vector<double> dk = test::sum_over_groups(r.grads.dk, c.Hk, c.Hq, c.d);
    const std::vector<double> dv = test::sum_over_groups(r.grads.dv, c.Hk, c.Hq, c.d);
    int64_t nonfinite = 0;
    const double ek = test::relative_max_error(by_mode[1].dk, dk, nonfinite);
    const double ev = test::relative_max_error(by_mode[1].dv, dv, nonfinite);
    INFO("dK " << ek << ", dV " << ev << " from the sums of the repeated heads' gradients");
    CHECK(nonfinite == 0);
    CHECK(ek <= (bf16 ? 1.6e-2 : 2e-3));
    CHECK(ev <= (bf16 ? 1.6e-2 : 2e-3));
}

}  // namespace

TEST_CASE("stage 09: under a window, key block j visits query block i iff i is in j's range iff j is in i's; the blocks without a mask are one range") {
    // window_query_blocks() (the pipeline's range), window_key_blocks() (the deterministic turns)
    // and the truth, a real row of block i that sees a real key of block j (visible_key_range()),
    // must agree: the turns count on it, and on the visitors of i being one range. And
    // window_full_query_blocks(), worked out once per key block, against window_block_needs_mask()
    // block by block: the same answer for every whole query block, the mask for the last, partial one.
    const int bounds[][2] = {{-1, -1}, {-1, 0}, {0, 0}, {16, 0}, {20, 7}, {0, 5}, {70, -1}, {-1, 3}, {130, 40}, {1, 200}, {64, 64}};
    for (const auto& [left, right] : bounds)
        for (const int br : {64, 128})
            for (const int bc : {64, 128})
                for (int nq = 1; nq <= 400; nq += 23)
                    for (int nk = 1; nk <= 400; nk += 19) {
                        const int tr = (nq + br - 1) / br, tc = (nk + bc - 1) / bc;
                        for (int i = 0; i < tr; ++i) {
                            int first, last;
                            window_key_blocks(i, br, bc, nq, nk, tc, left, right, first, last);
                            for (int j = 0; j < tc; ++j) {
                                bool sees = false;
                                for (int r = i * br; r < std::min((i + 1) * br, nq) && !sees; ++r) {
                                    const KeyRange keys = visible_key_range(r, nq, nk, Window{left, right});
                                    sees = std::max<int64_t>(keys.begin, int64_t(j) * bc) < std::min<int64_t>(keys.end, int64_t(j + 1) * bc);
                                }
                                int begin, end;
                                window_query_blocks(j, br, bc, nq, nk, left, right, begin, end);
                                int full_begin, full_end;
                                window_full_query_blocks(j, br, bc, nq, nk, left, right, full_begin, full_end);
                                const bool whole = (i + 1) * br <= nq;
                                const bool masked = window_block_needs_mask(i * br, br, j * bc, bc, nq, nk, left, right);
                                INFO("window (" << left << ", " << right << ") Br=" << br << " Bc=" << bc << " Nq=" << nq
                                                << " Nk=" << nk << " i=" << i << " j=" << j);
                                REQUIRE(sees == (begin <= i && i < end));
                                REQUIRE(sees == (first <= j && j <= last));
                                REQUIRE(full_begin <= full_end);
                                REQUIRE((full_begin <= i && i < full_end) == (whole && !masked));
                            }
                        }
                    }
}

TEST_CASE("stage 09: a packed call's schedule holds every key block once, longest loop first, in order, or last block first (deterministic)") {
    // kv_schedule(): longest first, the kernel runs its entries in order with the heads innermost,
    // so the order is the launch order; the deterministic mode's blocks wait for smaller numbers.
    const std::vector<int64_t> lengths_q = {700, 0, 37, 1200, 1, 300, 129}, lengths_k = {700, 5, 37, 900, 1, 300, 0};
    const Window windows[] = {{-1, -1}, {-1, 0}, {100, 0}, {20, 300}};
    for (const Window window : windows)
        for (const int br : {64, 128}) {
            VarlenProblem vp;
            vp.cu_seqlens_q = cu_seqlens_from_lengths(lengths_q), vp.cu_seqlens_k = cu_seqlens_from_lengths(lengths_k);
            vp.total_q = vp.cu_seqlens_q.back(), vp.total_k = vp.cu_seqlens_k.back();
            vp.window = window;
            const ResolvedOptions m = resolve_varlen_backward(vp, MaxSeqlens{vp.max_seq_q(), vp.max_seq_k()});
            const int bc = 128;
            const auto visits = [&](int32_t b, int32_t j) {
                int begin, end;
                window_query_blocks(j, br, bc, int(vp.seq_q(b)), int(vp.seq_k(b)), m.left, m.right, begin, end);
                return end - begin;
            };
            std::vector<std::pair<int32_t, int32_t>> all;  // every (sequence, key block), in order
            for (int32_t b = 0; b < int32_t(vp.batch()); ++b)
                for (int32_t j = 0; j * bc < vp.seq_k(b); ++j) all.emplace_back(b, j);
            INFO("window (" << window.left << ", " << window.right << ") Br=" << br);
            CHECK(packed_longest_first(vp, m, false));  // the lengths differ
            CHECK_FALSE(packed_longest_first(vp, m, true));
            for (const int order : {0, 1, 2}) {  // longest first, sequence order, deterministic
                const bool deterministic = order == 2;
                const std::vector<int32_t> s = kv_schedule(vp, m, br, bc, deterministic, order == 0);
                REQUIRE(s.size() == 2 * all.size());
                std::vector<std::pair<int32_t, int32_t>> entries;
                for (size_t e = 0; e < all.size(); ++e) entries.emplace_back(s[2 * e], s[2 * e + 1]);
                for (size_t e = 0; e + 1 < entries.size(); ++e) {
                    const auto [b, j] = entries[e];
                    const auto [b2, j2] = entries[e + 1];
                    if (deterministic) {  // sequence by sequence, each one's last key block first
                        CHECK((b2 > b || (b2 == b && j2 == j - 1)));
                    } else if (order == 1) {  // sequence by sequence, first key block first
                        CHECK((b2 > b || (b2 == b && j2 == j + 1)));
                    } else {  // most query blocks first; ties in sequence and key block order
                        CHECK(visits(b, j) >= visits(b2, j2));
                        if (visits(b, j) == visits(b2, j2)) CHECK(std::make_pair(b, j) < std::make_pair(b2, j2));
                    }
                }
                std::sort(entries.begin(), entries.end());
                CHECK(entries == all);
            }
        }
    // Equal lengths keep the blocks head by head (their heads' Q and dO shared in L2), unless
    // grouped heads see a window (the dense grid's rule).
    VarlenProblem vp;
    vp.cu_seqlens_q = vp.cu_seqlens_k = cu_seqlens_from_lengths({300, 300, 300});
    vp.total_q = vp.total_k = 900;
    vp.window = Window::causal();
    CHECK_FALSE(packed_longest_first(vp, resolve_varlen_backward(vp, MaxSeqlens{300, 300}), false));
    vp.heads_q = 4, vp.heads_k = 2;
    CHECK(packed_longest_first(vp, resolve_varlen_backward(vp, MaxSeqlens{300, 300}), false));
}

TEST_CASE("emulated stage 09: grouped-query heads, windows and the soft cap match the float64 gradients and K, V repeated per query head") {
    for (const test::ModelCase& c : test::backward_model_cases()) check_case(c);
}

namespace {

// Packed case `c` (inputs drawn with `seed`) in both dQ modes against the float64 gradients; the
// two modes' dK and dV are the same bits. The cases' lengths differ, so with atomic dQ the blocks
// go entry by entry (packed_longest_first()); once more head by head (FA_STAGE09_BLOCK_ORDER=heads,
// the order of equal lengths), whose dK and dV must be the same bits too.
void check_varlen_case(const test::VarlenCase& c, uint64_t seed) {
    const test::BackwardModelData data = test::backward_data(c.problem(), c.precision, InputKind::Normal, seed);
    test::ModelGradients by_mode[2];
    for (const bool deterministic : {false, true}) {
        const Run r = run_varlen_case(c, data, deterministic);
        CHECK(r.model);
        test::check_backward_gradients(c.precision, data, r.grads, deterministic ? "packed, deterministic" : "packed, atomic");
        by_mode[deterministic] = r.grads;
    }
    INFO(data.vp.describe());
    CHECK(by_mode[0].dk == by_mode[1].dk);
    CHECK(by_mode[0].dv == by_mode[1].dv);
    ::setenv("FA_STAGE09_BLOCK_ORDER", "heads", 1);
    const Run heads = run_varlen_case(c, data, false);
    ::unsetenv("FA_STAGE09_BLOCK_ORDER");
    test::check_backward_gradients(c.precision, data, heads.grads, "packed, atomic, head by head");
    CHECK(heads.grads.dk == by_mode[1].dk);
    CHECK(heads.grads.dv == by_mode[1].dv);
}

}  // namespace

TEST_CASE("emulated stage 09: packed batches of different lengths match the float64 gradients") {
    uint64_t seed = 9500;
    for (const test::VarlenCase& c : test::backward_varlen_cases()) check_varlen_case(c, seed++);
}

namespace {

// The group split S (atomic dQ) of a grouped case with G query heads per K/V head, dense or
// packed: `run(S)` gives the gradients with S forced, `check(gradients, S)` checks them against
// the float64 gradients. S = 2 and G; two runs with the same S give the same dK and dV bits (the
// partials are added in a fixed order); dQ is the S = 1 run's bit for bit (the blocks run one at
// a time in order of block number here, and the split is innermost: every query head's dQ
// receives the same additions in the same order as without the split).
template <class Check, class RunSplit>
void check_group_split(int group, const Check& check, const RunSplit& run) {
    const test::ModelGradients base = run(1);
    for (const int split : {2, group}) {
        const test::ModelGradients first = run(split), second = run(split);
        INFO("group split S = " << split << " of G = " << group);
        check(first, split);
        CHECK(first.dk == second.dk);
        CHECK(first.dv == second.dv);
        CHECK(first.dq == base.dq);
    }
}

}  // namespace

TEST_CASE("emulated stage 09: the group split (S = 2 and G blocks per group), dense and packed, matches the float64 gradients") {
    // Dense: MQA (G = 4) under a causal mask, Nq > Nk (rows that see no key), a tail in each.
    const test::ModelCase dense{64, Precision::BFloat16, 2, 4, 1, 150, 130, true, Window::full(), 0.0, 0.125, true};
    const test::BackwardModelData data = test::backward_model_data(dense);
    check_group_split(
        4,
        [&](const test::ModelGradients& g, int split) {
            test::check_backward_gradients(dense, data, g, "group split " + std::to_string(split));
        },
        [&](int split) { return run_case(dense, data.q, data.k, data.v, data.o, data.lse, data.dout, false, split).grads; });
    // Packed: G = 4, causal per sequence; a sequence of length 1, a prime length (131), Nq > Nk,
    // and queries without keys.
    const test::VarlenCase packed{128, Precision::Float16, {1, 131, 40, 3}, {1, 131, 67, 0}, 4, 1, Window::causal(), 0.0, 0.088};
    const test::BackwardModelData pdata = test::backward_data(packed.problem(), packed.precision, InputKind::Normal, 9900);
    check_group_split(
        4,
        [&](const test::ModelGradients& g, int split) {
            test::check_backward_gradients(packed.precision, pdata, g, "packed, group split " + std::to_string(split));
        },
        [&](int split) { return run_varlen_case(packed, pdata, false, split).grads; });
}

TEST_CASE("stage 09: the group split's rule, its override and what they refuse") {
    // The smallest divisor of G that gives two blocks per SM, or G (loops of at most 512 query blocks).
    CHECK(group_split_rule(128, 8, 132, 64) == 4);  // 256 < 264 <= 512
    CHECK(group_split_rule(256, 8, 132, 64) == 2);  // 8:1, d = 128, N = 4096: S = 1 loops over 8 x 64 = 512
    CHECK(group_split_rule(264, 8, 132, 64) == 1);
    CHECK(group_split_rule(40, 6, 132, 64) == 6);   // none is enough
    CHECK(group_split_rule(100, 6, 132, 64) == 3);  // 2 does not reach 264, 3 does
    // Four blocks per SM while a block's loop is longer than 512 query blocks.
    CHECK(group_split_rule(256, 8, 132, 256) == 4);   // 8:1, d = 128, N = 16384: S = 2 loops over 1024, 512 < 528
    CHECK(group_split_rule(512, 4, 132, 256) == 2);   // 4:1 there: S = 1 loops over 1024 with 512 < 528 blocks
    CHECK(group_split_rule(512, 8, 132, 128) == 2);   // 8:1, d = 64, N = 16384: S = 2 loops over 512
    CHECK(group_split_rule(1024, 4, 132, 128) == 1);  // 4:1 there: S = 1 loops over 512
    CHECK(group_split_rule(10, 8, 132, 4096) == 8);   // none is enough
    CHECK(group_split(256, 8, 64, false, 132, 0) == 2);
    CHECK(group_split(256, 8, 64, false, 132, 2) == 2);  // the override
    CHECK(group_split(256, 8, 64, true, 132, 2) == 1);   // the deterministic mode keeps one block per group
    CHECK(group_split(256, 1, 64, false, 132, 0) == 1);
    CHECK_THROWS_WITH_AS(group_split(256, 8, 64, false, 132, 3),
                         "stage 09: a group split of 3 blocks (FA_STAGE09_GROUP_SPLIT) does not divide the 8 query heads "
                         "per K/V head: use 0 (the rule) or one of 1, 2, 4, 8",
                         InputError);
    CHECK_THROWS_AS(group_split(256, 8, 64, false, 132, -1), InputError);
    // make_launches() refuses a split the group or the mode cannot take.
    Problem p;
    p.batch = 2, p.heads = 8, p.seq_q = 100, p.seq_k = 300, p.head_dim = 64;
    ResolvedOptions m;
    m.kv_group = 4;
    const Geometry geo = geometry_for<64>(kModelStep);
    std::vector<float> workspace(size_t(workspace_floats(p, geo, 0, 4, 4)));
    const auto launches = [&](int split, int* turns) {
        using T = __nv_bfloat16;
        make_launches<T, 64>(p, m, View4<const T>{}, View4<const T>{}, View4<const T>{}, View4<const T>{}, View3<const float>{},
                             View4<const T>{}, View4<T>{}, View4<T>{}, View4<T>{}, workspace.data(), turns, geo, 0, split);
    };
    int turn = 0;
    CHECK_THROWS_AS(launches(3, nullptr), InputError);
    CHECK_THROWS_AS(launches(2, &turn), InputError);
    // The workspace grows by the partial dK and dV, 2 S B Hk Nk d floats, with a split only.
    CHECK(workspace_floats(p, geo, 0, 4, 1) == workspace_floats(p, geo));
    CHECK(workspace_floats(p, geo, 0, 4, 2) - workspace_floats(p, geo) == 2 * 2 * 2 * 2 * 300 * 64);
}

namespace {

// Stage 07's forward of the probe's problem with V = probe.v(part), bf16, d = D, on the emulator:
// O in the packed order. `dense`: a dense call of B equal sequences (the map's b the batch entry),
// otherwise the packed call (b the sequence).
template <int D>
std::vector<float> forward_o(const test::DropoutProbe& probe, int part, bool dense) {
    using T = __nv_bfloat16;
    const VarlenProblem& vp = probe.vp;
    const std::vector<uint16_t> q = emu::to_bits<T>(probe.q), k = emu::to_bits<T>(probe.k), v = emu::to_bits<T>(probe.v(part));
    std::vector<uint16_t> o16(probe.q.size(), 0xffff);
    std::vector<float> lse(size_t(vp.heads_q * vp.total_q));
    const auto packed = [&](const std::vector<uint16_t>& x, int64_t total, int64_t heads) {
        return make_packed_view(reinterpret_cast<const T*>(x.data()), total, heads, int64_t(D));
    };
    const View4<T> op = make_packed_view(reinterpret_cast<T*>(o16.data()), vp.total_q, vp.heads_q, int64_t(D));
    const auto run = [&](const auto& a, auto features) {
        using F = decltype(features);
        using S = stage07::Shape<T, D, F>;
        REQUIRE(F::kDropout);
        REQUIRE(S::kSmemBytes <= sizeof stage07::smem_raw);
        emu::launch(long(stage07::grid_blocks(a)), S::kThreads, stage07::smem_raw, S::kSmemBytes,
                    [&] { stage07::flash_forward_kernel<T, D, F>(a); });
    };
    if (dense) {
        const int64_t batch = vp.batch(), nq = vp.seq_q(0), nk = vp.seq_k(0);
        Problem p;
        p.batch = batch, p.heads = vp.heads_q, p.seq_q = nq, p.seq_k = nk, p.head_dim = D;
        stage07::ModelOptions options;
        options.kv_heads = vp.heads_k, options.dropout = vp.dropout;
        const stage07::ResolvedOptions m = stage07::resolve_options(p, options);
        const auto view = [&](const std::vector<uint16_t>& x, int64_t h, int64_t n) {
            return View4<const T>{reinterpret_cast<const T*>(x.data()), {batch, h, n, D}, {n * h * D, D, h * D, 1}};
        };
        const View4<T> ov{reinterpret_cast<T*>(o16.data()), {batch, vp.heads_q, nq, D}, {nq * vp.heads_q * D, D, vp.heads_q * D, 1}};
        const View3<float> lv{lse.data(), {batch, vp.heads_q, nq}, {nq, batch * nq, 1}};
        stage07::with_final_features<D>(m, [&](auto features) {
            using F = decltype(features);
            run(stage07::make_args<T>(p, m, view(q, vp.heads_q, nq), view(k, vp.heads_k, nk), view(v, vp.heads_k, nk), ov,
                                      lv, stage07::geometry<T, D, F>()),
                features);
        });
    } else {
        const stage07::MaxSeqlens max{vp.max_seq_q(), vp.max_seq_k()};
        const stage07::ResolvedOptions m = stage07::resolve_varlen(vp, max);
        const View3<float> lv{lse.data(), {1, vp.heads_q, vp.total_q}, {vp.heads_q * vp.total_q, vp.total_q, 1}};
        stage07::with_varlen_features<D>(m, [&](auto features) {
            using F = decltype(features);
            const std::vector<int32_t> schedule = stage07::tile_schedule(vp, m, F::kBr, F::kBc);
            run(stage07::make_varlen_args<T>(vp, max, m, packed(q, vp.total_q, vp.heads_q), packed(k, vp.total_k, vp.heads_k),
                                             packed(v, vp.total_k, vp.heads_k), op, lv, stage07::geometry<T, D, F>(),
                                             vp.cu_seqlens_q.data(), vp.cu_seqlens_k.data(), schedule.data(),
                                             int64_t(schedule.size() / 2)),
                features);
        });
    }
    std::vector<float> o(o16.size());
    for (size_t i = 0; i < o.size(); ++i) o[i] = emu::to_f<T>(o16[i]);
    return o;
}

// The probe through stage 07's forward (every part) and stage 09's backward (both dQ modes), bf16
// at d = D, dense or packed: both masks must be the map's, bit for bit.
template <int D>
void check_mask_probe(const VarlenProblem& vp, bool dense) {
    const test::DropoutProbe probe = test::dropout_probe(vp);
    test::check_dropout_probe(
        probe, dense ? "(dense)" : "(packed)", [&](int part) { return forward_o<D>(probe, part, dense); },
        [&](const test::BackwardModelData& data, bool deterministic) {
            if (dense) {
                return run_emulated<__nv_bfloat16, D>(test::dense_probe_case(vp), data.q, data.k, data.v, data.o, data.lse,
                                                      data.dout, deterministic).grads.dv;
            }
            const test::VarlenCase c{D, Precision::BFloat16, {}, {}, int(vp.heads_q), int(vp.heads_k), Window::full(), 0.0, 0.125};
            return run_varlen_emulated<__nv_bfloat16, D>(c, data, deterministic).grads.dv;
        });
}

}  // namespace

TEST_CASE("emulated stage 09: dropout, dense and packed, matches the float64 gradients in both dQ modes") {
    for (const test::ModelCase& c : test::backward_dropout_cases()) check_case(c);
    uint64_t seed = 9800;
    for (const test::VarlenCase& c : test::backward_dropout_varlen_cases()) check_varlen_case(c, seed++);
}

TEST_CASE("emulated stage 09: the backward regenerates stage 07's dropout mask bit for bit, dense and packed") {
    // Dense, d = 64 (P^T in registers), two batch entries, keys in two key blocks.
    VarlenProblem dense;
    dense.cu_seqlens_q = {0, 64, 128}, dense.cu_seqlens_k = {0, 150, 300};
    dense.total_q = 128, dense.total_k = 300, dense.heads_q = 2, dense.heads_k = 2, dense.head_dim = 64;
    dense.dropout = Dropout{0.5, 0x0123456789abcdefull, 77};
    check_mask_probe<64>(dense, true);
    // Packed, d = 128 (P^T through shared memory), Hq/Hk = 2: rows and keys start mid-tile.
    VarlenProblem packed;
    packed.cu_seqlens_q = {0, 45, 109, 112}, packed.cu_seqlens_k = {0, 150, 187, 188};
    packed.total_q = 112, packed.total_k = 188, packed.heads_q = 2, packed.heads_k = 1, packed.head_dim = 128;
    packed.dropout = Dropout{0.1, 42, 5};
    check_mask_probe<128>(packed, false);
}

TEST_CASE("stage 09: stage 10's options it cannot apply are refused with InputError, naming what is allowed") {
    Problem p;
    p.heads = 6, p.seq_q = 100, p.seq_k = 100;
    const auto message = [&](const ModelOptions& o, int step = kModelStep) -> std::string {
        try {
            resolve_backward_options(p, o, step);
        } catch (const InputError& e) {
            return e.what();
        }
        return "(no error)";
    };
    ModelOptions o;
    o.kv_heads = 4;
    CHECK(message(o).find("--heads 6 is not a multiple of --kv-heads 4") != std::string::npos);
    o.kv_heads = 3;
    CHECK(message(o) == "(no error)");
    CHECK(resolve_backward_options(p, o, kModelStep).kv_group == 2);
    // The switches run on the default main kernel only; plain options run on any step.
    CHECK(message(o, 2).find("default main kernel only (--step " + std::to_string(kModelStep) + "), not on step 2") != std::string::npos);
    CHECK(message(ModelOptions{}, 0) == "(no error)");
    o.window = Window{-2, 0};
    CHECK(message(o).find("--window -2,0") != std::string::npos);
    o.window = Window{10, 3}, o.softcap = -1.0;
    CHECK(message(o).find("--softcap") != std::string::npos);
    o.softcap = 5.0, o.dropout.p = 1.0;
    CHECK(message(o).find("--dropout 1 is outside [0, 1)") != std::string::npos);
    o.dropout.p = 0.999;
    CHECK(message(o).find("--dropout 0.999 would drop every entry") != std::string::npos);
    o.dropout.p = 0.1;  // dropout runs on the default main kernel, and on it alone
    CHECK(message(o, 3).find("dropout run on the default main kernel only (--step " + std::to_string(kModelStep) + "), not on step 3") != std::string::npos);
    const ResolvedOptions m = resolve_backward_options(p, o, kModelStep);
    CHECK(m.left == 10);
    CHECK(m.right == 3);
    CHECK(m.softcap == 5.0);
    CHECK(m.dropout.p == 0.1);
    // Bounds no row reaches past are no bounds: a window wider than the problem is the plain call.
    o = ModelOptions{};
    o.window = Window{500, 400};
    CHECK(resolve_backward_options(p, o, 0).plain());
}
