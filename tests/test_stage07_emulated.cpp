// Stage 07's forward kernel with stage 10's switches (grouped-query heads, sliding windows, the soft
// cap, dropout, packed batches), launched as the stage launches it (stages/07_pipelined_fused_kernel/launch.cuh: the options
// resolved, the instance chosen, the arguments built) and run on the CPU by the warp emulator
// (tools/warp_emulator), against the float64 reference of fa/reference_ext.hpp by the low-precision
// rule (fa/tolerance.hpp: twice the error of the same attention computed naively in bf16 or fp16).
// No GPU is needed, so this runs in CI; the GPU tests remain the check of the compiled kernels.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "emulator.hpp"
#include "fa/error.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/precision.hpp"
#include "fa/reference.hpp"
#include "fa/reference_ext.hpp"
#include "fa/tolerance.hpp"
#include "fa/varlen.hpp"
#include "model_cases.hpp"
#include "stages/07_pipelined_fused_kernel/launch.cuh"

namespace fa::stage07 {
// The dynamic shared memory the kernel declares (`extern __shared__ ... smem_raw[]`).
alignas(128) unsigned char smem_raw[232448];
}  // namespace fa::stage07

namespace {

using namespace fa;
using namespace fa::stage07;

// Runs the case through the stage's launch code (launch.cuh: the options resolved, the instance
// chosen, the arguments built) on the emulator, in T at head dimension D; returns whether the
// kernel with stage 10's switches ran (otherwise the road's final kernel did).
template <class T, int D>
bool run_emulated(const test::ModelCase& c, const test::RoundedInputs& in, std::vector<float>& o, std::vector<float>& lse) {
    const Problem p = c.problem();
    const int64_t total_q = int64_t(c.B) * c.Nq;
    const std::vector<uint16_t> q = emu::to_bits<T>(in.q), k = emu::to_bits<T>(in.k), v = emu::to_bits<T>(in.v);
    std::vector<uint16_t> o16(o.size(), 0xffff);  // NaN: what the kernel forgets to write shows
    // (B, H, N, d) views of the packed (total, H, d) buffers; the LSE (B, Hq, Nq) of an (Hq, total_q) buffer.
    const auto view = [&](const std::vector<uint16_t>& x, int64_t h, int64_t n) {
        return View4<const T>{reinterpret_cast<const T*>(x.data()), {c.B, h, n, D}, {n * h * D, D, h * D, 1}};
    };
    const View4<T> ov{reinterpret_cast<T*>(o16.data()), {c.B, c.Hq, c.Nq, D}, {int64_t(c.Nq) * c.Hq * D, D, int64_t(c.Hq) * D, 1}};
    const View3<float> lv{lse.data(), {c.B, c.Hq, c.Nq}, {c.Nq, total_q, 1}};
    const ResolvedOptions m = resolve_options(p, c.options());
    const bool model = with_final_features<D>(m, [&](auto features) {
        using F = decltype(features);
        using S = Shape<T, D, F>;
        const Args<T> a = make_args<T>(p, m, view(q, c.Hq, c.Nq), view(k, c.Hk, c.Nk), view(v, c.Hk, c.Nk), ov, lv,
                                       geometry<T, D, F>());
        REQUIRE(S::kSmemBytes <= sizeof smem_raw);
        CHECK(F::kDropout == c.dropout.enabled());  // dropout 0 runs a kernel without it
        emu::launch(long(grid_blocks(a)), S::kThreads, smem_raw, S::kSmemBytes, [&] { flash_forward_kernel<T, D, F>(a); });
        CHECK(F::kWindow == m.has_band());  // the window's code only for a band
        return F::kGroupedHeads;
    });
    for (size_t i = 0; i < o.size(); ++i) o[i] = emu::to_f<T>(o16[i]);
    return model;
}

template <class T>
bool run_emulated_for(const test::ModelCase& c, const test::RoundedInputs& in, std::vector<float>& o, std::vector<float>& lse) {
    switch (c.d) {
        case 32: return run_emulated<T, 32>(c, in, o, lse);
        case 64: return run_emulated<T, 64>(c, in, o, lse);
        case 128: return run_emulated<T, 128>(c, in, o, lse);
        default: return run_emulated<T, 256>(c, in, o, lse);
    }
}

std::optional<bool> run_case(const test::ModelCase& c, const test::RoundedInputs& in, std::vector<float>& o,
                             std::vector<float>& lse) {
    return c.precision == Precision::BFloat16 ? run_emulated_for<__nv_bfloat16>(c, in, o, lse)
                                              : run_emulated_for<__half>(c, in, o, lse);
}

// A packed call through the stage's launch code for packed batches (resolve_varlen, the tile
// schedule, make_varlen_args) on the emulator, in T at head dimension D; the host arrays stand in
// for the device ones. Returns whether the kernel ran with the varlen switch.
template <class T, int D>
bool run_varlen_emulated(const VarlenProblem& vp, const MaxSeqlens& max, const test::RoundedInputs& in,
                         std::vector<float>& o, std::vector<float>& lse) {
    const std::vector<uint16_t> q = emu::to_bits<T>(in.q), k = emu::to_bits<T>(in.k), v = emu::to_bits<T>(in.v);
    std::vector<uint16_t> o16(o.size(), 0xffff);  // NaN: what the kernel forgets to write shows
    const auto packed = [&](const std::vector<uint16_t>& x, int64_t total, int64_t heads) {
        return make_packed_view(reinterpret_cast<const T*>(x.data()), total, heads, int64_t(D));
    };
    const View4<T> ov = make_packed_view(reinterpret_cast<T*>(o16.data()), vp.total_q, vp.heads_q, int64_t(D));
    const View3<float> lv{lse.data(), {1, vp.heads_q, vp.total_q}, {vp.heads_q * vp.total_q, vp.total_q, 1}};
    const ResolvedOptions m = resolve_varlen(vp, max);
    const bool varlen = with_varlen_features<D>(m, [&](auto features) {
        using F = decltype(features);
        using S = Shape<T, D, F>;
        const std::vector<int32_t> schedule = tile_schedule(vp, m, F::kBr, F::kBc);
        const Args<T> a = make_varlen_args<T>(vp, max, m, packed(q, vp.total_q, vp.heads_q), packed(k, vp.total_k, vp.heads_k),
                                              packed(v, vp.total_k, vp.heads_k), ov, lv, geometry<T, D, F>(),
                                              vp.cu_seqlens_q.data(), vp.cu_seqlens_k.data(), schedule.data(),
                                              int64_t(schedule.size() / 2));
        REQUIRE(S::kSmemBytes <= sizeof smem_raw);
        CHECK(F::kDropout == vp.dropout.enabled());
        CHECK(a.heads_innermost == vp.lengths_differ());  // the two block orders (model_cases.hpp has both)
        emu::launch(long(grid_blocks(a)), S::kThreads, smem_raw, S::kSmemBytes, [&] { flash_forward_kernel<T, D, F>(a); });
        return PacksSequences<F>::value && F::kWindow && F::kGroupedHeads;
    });
    for (size_t i = 0; i < o.size(); ++i) o[i] = emu::to_f<T>(o16[i]);
    return varlen;
}

template <class T>
bool run_varlen_for(const VarlenProblem& vp, const MaxSeqlens& max, const test::RoundedInputs& in, std::vector<float>& o,
                    std::vector<float>& lse) {
    return vp.head_dim == 64 ? run_varlen_emulated<T, 64>(vp, max, in, o, lse) : run_varlen_emulated<T, 128>(vp, max, in, o, lse);
}

}  // namespace

TEST_CASE("emulated stage 07: the window's key tiles cover every visible key and mask every partial tile") {
    // Every (row, key) a row sees lies in a visited tile; every tile called unmasked is seen in
    // full by every row of the query tile; with (-1, 0) the tiles are key_tiles()'s causal ones.
    std::mt19937 rng(11);
    const int shapes[][2] = {{128, 64}, {64, 32}, {64, 64}};
    for (int trial = 0; trial < 3000; ++trial) {
        const int br = shapes[trial % 3][0], bc = shapes[trial % 3][1];
        const int nq = 1 + int(rng() % 300), nk = 1 + int(rng() % 300);
        const Window w{int(rng() % 5) == 0 ? -1 : int(rng() % 200), int(rng() % 5) == 0 ? -1 : int(rng() % 200)};
        for (int q0 = 0; q0 < nq; q0 += br) {
            int first, full_first, full_end, end;
            window_key_tiles(q0, br, bc, nq, nk, w, first, full_first, full_end, end);
            INFO("Nq=" << nq << " Nk=" << nk << " window=(" << w.left << "," << w.right << ") Br=" << br << " Bc=" << bc
                       << " q0=" << q0 << ": tiles [" << first << ", " << end << "), unmasked [" << full_first << ", "
                       << full_end << ")");
            REQUIRE(0 <= first);
            REQUIRE(first <= full_first);
            REQUIRE(full_first <= full_end);
            REQUIRE(full_end <= end);
            bool ok = true;
            for (int i = q0; i < std::min(q0 + br, nq); ++i) {
                const KeyRange r = visible_key_range(i, nq, nk, w);
                if (!r.empty()) ok = ok && r.begin >= int64_t(first) * bc && r.end <= int64_t(end) * bc;
                ok = ok && (full_first == full_end || (r.begin <= int64_t(full_first) * bc && int64_t(full_end) * bc <= r.end));
            }
            REQUIRE(ok);
            if (w.left < 0 && w.right == 0) {
                int full, causal_end;
                key_tiles(q0, br, bc, nq, nk, true, true, full, causal_end);
                CHECK(first == 0);
                CHECK(full_first == 0);
                CHECK(full_end == full);
                CHECK(end == causal_end);
            }
        }
    }
}

TEST_CASE("emulated stage 07: grouped-query heads, sliding windows and the soft cap match the float64 reference") {
    // tests/model_cases.hpp: Hq/Hk = 1, 2, 4, windows narrower than a tile and wider than N, both
    // bounds, causal as (-1, 0), rows that see no key, tails, Nq != Nk, bf16 and fp16, d 32 to 256.
    for (const test::ModelCase& c : test::model_cases()) test::check_model_case(c, run_case);
}

TEST_CASE("emulated stage 07: options that cannot apply are refused with InputError") {
    Problem p;
    p.heads = 6, p.seq_q = 10, p.seq_k = 10;
    const auto message = [&](const ModelOptions& o) -> std::string {
        try {
            resolve_options(p, o);
        } catch (const InputError& e) {
            return e.what();
        }
        return "(no error)";
    };
    ModelOptions o;
    o.kv_heads = 4;
    const std::string m = message(o);
    INFO(m);
    CHECK(m.find("--heads 6") != std::string::npos);
    CHECK(m.find("--kv-heads 4") != std::string::npos);
    o.kv_heads = 3;
    CHECK(message(o) == "(no error)");
    CHECK(resolve_options(p, o).kv_group == 2);
    o.window = Window{-2, 0};
    CHECK(message(o).find("--window -2,0") != std::string::npos);
    o.window = Window::full(), o.softcap = -1.0;
    CHECK(message(o).find("--softcap") != std::string::npos);
    o.softcap = std::numeric_limits<double>::infinity();
    CHECK(message(o).find("--softcap") != std::string::npos);
    o.softcap = 0.0, o.dropout.p = -0.5;
    CHECK(message(o).find("--dropout -0.5 is outside [0, 1)") != std::string::npos);
    o.dropout.p = 0.999;
    CHECK(message(o).find("--dropout 0.999 would drop every entry") != std::string::npos);
    o.dropout.p = 0.5;
    CHECK(message(o) == "(no error)");
    p.batch = 70000;  // the map numbers batch entries in 16 bits
    CHECK(message(o).find("16 bits") != std::string::npos);
    o.dropout.p = 0.0;
    CHECK(message(o) == "(no error)");
}

TEST_CASE("emulated stage 07: the tile schedule of a packed batch has one block per query tile, heaviest first") {
    // Every query tile that holds a query gets exactly one entry (none for an empty sequence,
    // none past a sequence's end), and the key tiles each entry visits never grow along the list.
    std::mt19937 rng(5);
    for (int trial = 0; trial < 200; ++trial) {
        std::vector<int64_t> lq, lk;
        const int batch = 1 + int(rng() % 12);
        for (int b = 0; b < batch; ++b) {
            lq.push_back(rng() % 4 == 0 ? int64_t(rng() % 2) : int64_t(rng() % 700));
            lk.push_back(rng() % 4 == 0 ? int64_t(rng() % 2) : int64_t(rng() % 700));
        }
        VarlenProblem vp;
        vp.cu_seqlens_q = cu_seqlens_from_lengths(lq), vp.cu_seqlens_k = cu_seqlens_from_lengths(lk);
        vp.total_q = vp.cu_seqlens_q.back(), vp.total_k = vp.cu_seqlens_k.back();
        vp.window = trial % 3 == 0 ? Window::full() : trial % 3 == 1 ? Window::causal() : Window{int64_t(rng() % 300), 0};
        const ResolvedOptions m = resolve_varlen(vp, MaxSeqlens{vp.max_seq_q(), vp.max_seq_k()});
        const int br = trial % 2 ? 128 : 64, bc = 64;
        const std::vector<int32_t> schedule = tile_schedule(vp, m, br, bc);
        REQUIRE(schedule.size() % 2 == 0);
        std::vector<std::vector<int>> seen(static_cast<size_t>(batch));  // times each query tile of each sequence is scheduled
        for (int b = 0; b < batch; ++b) seen[size_t(b)].assign(size_t((lq[size_t(b)] + br - 1) / br), 0);
        int64_t out_of_place = 0, previous = INT64_MAX;
        for (size_t i = 0; i < schedule.size(); i += 2) {
            const int b = schedule[i], tile = schedule[i + 1];
            REQUIRE(0 <= b);
            REQUIRE(b < batch);
            REQUIRE(0 <= tile);
            REQUIRE(size_t(tile) < seen[size_t(b)].size());  // a tile that holds a query of sequence b
            ++seen[size_t(b)][size_t(tile)];
            int first, full_first, full_end, end;
            window_key_tiles(tile * br, br, bc, int(lq[size_t(b)]), int(lk[size_t(b)]), Window{m.left, m.right}, first,
                             full_first, full_end, end);
            out_of_place += end - first > previous;
            previous = end - first;
        }
        INFO("trial " << trial << " " << vp.describe());
        int64_t missing_or_twice = 0;
        for (const auto& tiles : seen) missing_or_twice += std::count_if(tiles.begin(), tiles.end(), [](int n) { return n != 1; });
        CHECK(missing_or_twice == 0);
        CHECK(out_of_place == 0);
    }
}

TEST_CASE("emulated stage 07: packed batches of different lengths match the float64 reference") {
    // tests/model_cases.hpp: sequences of length 0 and 1, primes, Nq != Nk per sequence, one long
    // among many short, grouped heads, windows, the soft cap, bf16 and fp16, d 64 and 128.
    uint64_t seed = 9100;
    for (const test::VarlenCase& c : test::varlen_cases()) {
        const VarlenProblem vp = c.problem();
        const MaxSeqlens max{vp.max_seq_q() + c.extra_max, vp.max_seq_k() + c.extra_max};
        test::check_packed_case(vp, c.precision, InputKind::Normal, ++seed, true,
                                [&](const test::RoundedInputs& in, std::vector<float>& o, std::vector<float>& lse) {
                                    return std::optional<bool>(c.precision == Precision::BFloat16
                                                                   ? run_varlen_for<__nv_bfloat16>(vp, max, in, o, lse)
                                                                   : run_varlen_for<__half>(vp, max, in, o, lse));
                                });
    }
}

TEST_CASE("emulated stage 07: packed calls that cannot apply are refused with InputError") {
    VarlenProblem vp;
    vp.cu_seqlens_q = {0, 3, 3, 10}, vp.cu_seqlens_k = {0, 4, 5, 9};
    vp.total_q = 10, vp.total_k = 9, vp.heads_q = 4, vp.heads_k = 2;
    const auto message = [](const VarlenProblem& p, MaxSeqlens max) -> std::string {
        try {
            resolve_varlen(p, max);
        } catch (const InputError& e) {
            return e.what();
        }
        return "(no error)";
    };
    const MaxSeqlens max{7, 4};
    CHECK(message(vp, max) == "(no error)");
    CHECK(resolve_varlen(vp, max).kv_group == 2);
    const auto mentions = [&](const VarlenProblem& p, MaxSeqlens m, const char* what) {
        const std::string text = message(p, m);
        INFO(text);
        CHECK(text.find(what) != std::string::npos);
    };
    mentions(vp, MaxSeqlens{6, 4}, "sequence 2 length 7, more than max_seqlen_q = 6");
    mentions(vp, MaxSeqlens{7, 3}, "sequence 0 length 4, more than max_seqlen_k = 3");
    VarlenProblem bad = vp;
    bad.cu_seqlens_q = {1, 3, 3, 10};
    mentions(bad, max, "cu_seqlens_q[0] is 1");
    bad = vp, bad.cu_seqlens_k = {0, 5, 4, 9};
    mentions(bad, max, "cu_seqlens_k is not nondecreasing");
    bad = vp, bad.total_q = 11;
    mentions(bad, max, "cu_seqlens_q ends at 10 but total_q is 11");
    bad = vp, bad.cu_seqlens_k = {0, 4, 9};
    mentions(bad, max, "but cu_seqlens_k has 3");
    bad = vp, bad.heads_k = 3;
    mentions(bad, max, "--kv-heads 3");
    bad = vp, bad.dropout.p = 1.0;
    mentions(bad, max, "--dropout 1 is outside [0, 1)");
    bad = vp, bad.dropout.p = 0.999;
    mentions(bad, max, "--dropout 0.999 would drop every entry");
    bad = vp, bad.dropout.p = 0.1;  // the packed kernel drops too
    CHECK(message(bad, max) == "(no error)");
    CHECK(resolve_varlen(bad, max).dropout.p == 0.1);
}

TEST_CASE("emulated stage 07: dropout, dense and packed, matches the float64 reference given the same mask") {
    // tests/model_cases.hpp: p = 0.1, 0.25, 0.3 and 0.5; causal, windows, grouped heads, the soft
    // cap, tails, Nq != Nk, empty rows and sequences, d 32 to 256. The reference draws the same
    // mask from fa/philox.hpp's map, so a kernel that keeps one wrong score is off by a whole
    // term of O.
    for (const test::ModelCase& c : test::dropout_model_cases()) test::check_model_case(c, run_case);
    uint64_t seed = 9300;
    for (const test::VarlenCase& c : test::dropout_varlen_cases()) {
        const VarlenProblem vp = c.problem();
        const MaxSeqlens max{vp.max_seq_q() + c.extra_max, vp.max_seq_k() + c.extra_max};
        test::check_packed_case(vp, c.precision, InputKind::Normal, ++seed, true,
                                [&](const test::RoundedInputs& in, std::vector<float>& o, std::vector<float>& lse) {
                                    return std::optional<bool>(c.precision == Precision::BFloat16
                                                                   ? run_varlen_for<__nv_bfloat16>(vp, max, in, o, lse)
                                                                   : run_varlen_for<__half>(vp, max, in, o, lse));
                                });
    }
}

TEST_CASE("emulated stage 07: the dropout check tells masks apart, and dropout 0 is the kernel without it") {
    // The same call with another offset draws another mask: the reference of that mask must fail
    // the check the kernel passes, or the cases above could not see a wrong mask.
    test::ModelCase c{64, Precision::BFloat16, 1, 2, 1, 96, 130, true, Window::full(), 0.0, 0.125, true};
    c.dropout = Dropout{0.1, 31, 5};
    const VarlenProblem vp = test::packed_problem(c);
    const Inputs in = make_varlen_inputs(vp, InputKind::Normal, 8001);
    const auto rounded = [&](const HostTensor& t) {
        std::vector<float> r(t.storage.size());
        for (size_t i = 0; i < r.size(); ++i) r[i] = round_to(c.precision, t.storage[i]);
        return r;
    };
    const test::RoundedInputs r{rounded(in.q), rounded(in.k), rounded(in.v)};
    std::vector<float> o(size_t(vp.total_q * vp.heads_q * vp.head_dim)), lse(size_t(vp.heads_q * vp.total_q));
    run_case(c, r, o, lse);
    const auto o_check = [&](const VarlenProblem& ref_problem) {
        const VarlenReference ref = reference_attention_varlen(ref_problem, in.q.cview(), in.k.cview(), in.v.cview());
        const EmulatedAttention naive = test::naive_model_emulated(c.precision, ref_problem, in);
        const Tolerances tol = low_precision_tolerance(test::packed_stats(ref_problem, in), c.precision,
                                                       compare(naive.o, ref.o), compare(naive.lse, ref.lse));
        const Metrics m = compare(o, ref.o);
        INFO(ref_problem.describe() << ": O max_abs " << m.max_abs << " rel_l2 " << m.rel_l2 << " (limits " << tol.o.max_abs
                                    << ", " << tol.o.rel_l2 << ")");
        return passes(m, tol.o);
    };
    CHECK(o_check(vp));
    VarlenProblem other = vp;
    other.dropout.offset += 1;
    CHECK_FALSE(o_check(other));
    other = vp, other.dropout.p = 0.0;
    CHECK_FALSE(o_check(other));

    // p = 0 with every other option plain runs the road's final kernel; with a window, the kernel
    // with the switches but without dropout.
    ModelOptions plain;
    plain.dropout = Dropout{0.0, 123, 4};
    const Problem p = c.problem();
    CHECK(with_final_features<64>(resolve_options(p, plain),
                                  [](auto f) { return std::is_same_v<decltype(f), RoadStep<64, kFinalStep>>; }));
    plain.window = Window{10, 0};
    CHECK(with_final_features<64>(resolve_options(p, plain),
                                  [](auto f) { return std::is_same_v<decltype(f), ModelStep<64, false, false>>; }));
    plain.dropout.p = 0.1;
    CHECK(with_final_features<64>(resolve_options(p, plain),
                                  [](auto f) { return std::is_same_v<decltype(f), ModelStep<64, false, true>>; }));
    // Without a band (the full or causal window), the instance without the window's code.
    plain.window = Window::causal();
    CHECK(with_final_features<64>(resolve_options(p, plain),
                                  [](auto f) { return std::is_same_v<decltype(f), ModelStep<64, false, true, false>>; }));
}
