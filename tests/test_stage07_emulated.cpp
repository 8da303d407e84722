// Stage 07's forward kernel with stage 10's switches (grouped-query heads, sliding windows, the soft
// cap), launched as the stage launches it (stages/07_pipelined_fused_kernel/launch.cuh: the options
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
#include "stages/07_pipelined_fused_kernel/launch.cuh"

namespace fa::stage07 {
// The dynamic shared memory the kernel declares (`extern __shared__ ... smem_raw[]`).
alignas(128) unsigned char smem_raw[232448];
}  // namespace fa::stage07

namespace {

using namespace fa;
using namespace fa::stage07;

template <class T>
uint16_t to_bits(float f);
template <>
uint16_t to_bits<__nv_bfloat16>(float f) { return emu_f2bf(f); }
template <>
uint16_t to_bits<__half>(float f) { return emu_f2h(f); }

template <class T>
constexpr Precision precision_of = std::is_same_v<T, __nv_bfloat16> ? Precision::BFloat16 : Precision::Float16;

// One dense call: B sequences of Nq queries and Nk keys, Hq query heads over Hk key/value heads.
struct Case {
    int B, Hq, Hk, Nq, Nk;
    bool causal;
    Window window;
    double softcap;
    double scale;
};

std::string describe(const Case& c, int d, bool bf16) {
    return std::string(bf16 ? "bf16" : "fp16") + " d=" + std::to_string(d) + " B=" + std::to_string(c.B) +
           " Hq=" + std::to_string(c.Hq) + " Hk=" + std::to_string(c.Hk) + " Nq=" + std::to_string(c.Nq) +
           " Nk=" + std::to_string(c.Nk) + (c.causal ? " causal" : "") + " window=(" + std::to_string(c.window.left) +
           "," + std::to_string(c.window.right) + ") softcap=" + std::to_string(c.softcap) +
           " scale=" + std::to_string(c.scale);
}

// The same call as a packed problem of B equal sequences: its (total, H, d) buffers are the BNHD
// tensors the kernel reads as (B, H, N, d), and its window has the causal flag folded in.
VarlenProblem packed_problem(const Case& c, int d) {
    VarlenProblem vp;
    vp.cu_seqlens_q = cu_seqlens_from_lengths(std::vector<int64_t>(size_t(c.B), c.Nq));
    vp.cu_seqlens_k = cu_seqlens_from_lengths(std::vector<int64_t>(size_t(c.B), c.Nk));
    vp.total_q = int64_t(c.B) * c.Nq, vp.total_k = int64_t(c.B) * c.Nk;
    vp.heads_q = c.Hq, vp.heads_k = c.Hk, vp.head_dim = d, vp.scale = c.scale;
    vp.window = c.window;
    if (c.causal) vp.window.right = 0;
    vp.softcap = c.softcap;
    return vp;
}

// The naive attention in `prec`, as naive_attention_emulated() (fa/reference.hpp) computes it,
// with the grouped heads, the window and the soft cap: inputs rounded, S summed in float32 and
// scaled (then capped), P normalized in float32 and rounded, O summed in float32 and rounded.
// o in the packed order (total_q, Hq, d), lse (Hq, total_q), as reference_attention_varlen().
EmulatedAttention naive_model_emulated(Precision prec, const VarlenProblem& vp, const Inputs& in) {
    const int64_t d = vp.head_dim, hq = vp.heads_q, hk = vp.heads_k;
    const float scale = float(vp.softmax_scale()), cap = float(vp.softcap);
    EmulatedAttention out{std::vector<float>(size_t(vp.total_q * hq * d)), std::vector<float>(size_t(hq * vp.total_q))};
    const auto rounded = [&](const HostTensor& t) {
        std::vector<float> r(t.storage.size());
        for (size_t i = 0; i < r.size(); ++i) r[i] = round_to(prec, t.storage[i]);
        return r;
    };
    const std::vector<float> q = rounded(in.q), k = rounded(in.k), v = rounded(in.v);  // packed (total, H, d)
    for (int64_t b = 0; b < vp.batch(); ++b) {
        const int64_t nq = vp.seq_q(b), nk = vp.seq_k(b), q0 = vp.cu_seqlens_q[size_t(b)], k0 = vp.cu_seqlens_k[size_t(b)];
        for (int64_t h = 0; h < hq; ++h) {
            const int64_t g = vp.kv_head(h);
            for (int64_t i = 0; i < nq; ++i) {
                const KeyRange r = visible_key_range(i, nq, nk, vp.window);
                const int64_t t = q0 + i;
                float* o_row = &out.o[size_t((t * hq + h) * d)];
                if (r.empty()) {
                    out.lse[size_t(h * vp.total_q + t)] = -std::numeric_limits<float>::infinity();
                    std::fill(o_row, o_row + d, 0.0f);
                    continue;
                }
                std::vector<float> s(size_t(r.size()));
                for (int64_t j = r.begin; j < r.end; ++j) {
                    float acc = 0.0f;
                    for (int64_t x = 0; x < d; ++x) acc += q[size_t((t * hq + h) * d + x)] * k[size_t(((k0 + j) * hk + g) * d + x)];
                    acc *= scale;
                    s[size_t(j - r.begin)] = cap > 0.0f ? cap * std::tanh(acc / cap) : acc;
                }
                const float m = *std::max_element(s.begin(), s.end());
                float l = 0.0f;
                for (float& e : s) l += (e = std::exp(e - m));
                std::vector<float> o(size_t(d), 0.0f);
                for (int64_t j = r.begin; j < r.end; ++j) {
                    const float p = round_to(prec, s[size_t(j - r.begin)] / l);
                    for (int64_t x = 0; x < d; ++x) o[size_t(x)] += p * v[size_t(((k0 + j) * hk + g) * d + x)];
                }
                for (int64_t x = 0; x < d; ++x) o_row[x] = round_to(prec, o[size_t(x)]);
                out.lse[size_t(h * vp.total_q + t)] = m + std::log(l);
            }
        }
    }
    return out;
}

// InputStats of the packed inputs (fa/tolerance.hpp): the score bound over every query head and
// the key/value head it reads, the largest |v|, d and the longest key sequence.
InputStats packed_stats(const VarlenProblem& vp, const Inputs& in) {
    const int64_t d = vp.head_dim;
    const auto max_norm = [&](const HostTensor& t) {
        double m = 0.0;
        for (size_t row = 0; row * size_t(d) < t.storage.size(); ++row) {
            double n = 0.0;
            for (int64_t x = 0; x < d; ++x) n += double(t.storage[row * size_t(d) + size_t(x)]) * t.storage[row * size_t(d) + size_t(x)];
            m = std::max(m, std::sqrt(n));
        }
        return m;
    };
    InputStats s;
    s.score_bound = std::fabs(vp.softmax_scale()) * max_norm(in.q) * max_norm(in.k);
    for (float x : in.v.storage) s.max_abs_v = std::max(s.max_abs_v, double(std::fabs(x)));
    s.head_dim = d;
    s.seq_k = vp.max_seq_k();
    return s;
}

// Runs the case through the stage's launch code on the emulator; returns whether the kernel with
// stage 10's switches ran (otherwise the road's final kernel did). o (total_q, Hq, d) and lse
// (Hq, total_q) start as NaN, so an element the kernel forgets to write shows.
template <class T, int D>
bool run_stage(const Case& c, const ModelOptions& options, const std::vector<uint16_t>& q, const std::vector<uint16_t>& k,
               const std::vector<uint16_t>& v, std::vector<uint16_t>& o, std::vector<float>& lse) {
    Problem p;
    p.batch = c.B, p.heads = c.Hq, p.seq_q = c.Nq, p.seq_k = c.Nk, p.head_dim = D, p.scale = c.scale, p.causal = c.causal;
    const int64_t total_q = int64_t(c.B) * c.Nq;
    o.assign(size_t(total_q * c.Hq * D), 0xffff);
    lse.assign(size_t(c.Hq * total_q), std::numeric_limits<float>::quiet_NaN());
    // (B, H, N, d) views of the packed (total, H, d) buffers; the LSE (B, Hq, Nq) of an (Hq, total_q) buffer.
    const auto view = [&](const std::vector<uint16_t>& x, int64_t h, int64_t n) {
        return View4<const T>{reinterpret_cast<const T*>(x.data()), {c.B, h, n, D}, {n * h * D, D, h * D, 1}};
    };
    const View4<T> ov{reinterpret_cast<T*>(o.data()), {c.B, c.Hq, c.Nq, D}, {int64_t(c.Nq) * c.Hq * D, D, int64_t(c.Hq) * D, 1}};
    const View3<float> lv{lse.data(), {c.B, c.Hq, c.Nq}, {c.Nq, total_q, 1}};
    const ResolvedOptions m = resolve_options(p, options);
    return with_final_features<D>(m, [&](auto features) {
        using F = decltype(features);
        using S = Shape<T, D, F>;
        const Args<T> a = make_args<T>(p, m, view(q, c.Hq, c.Nq), view(k, c.Hk, c.Nk), view(v, c.Hk, c.Nk), ov, lv,
                                       geometry<T, D, F>());
        REQUIRE(S::kSmemBytes <= sizeof smem_raw);
        emu::launch(long(grid_blocks(a)), S::kThreads, smem_raw, S::kSmemBytes, [&] { flash_forward_kernel<T, D, F>(a); });
        return F::kWindow;
    });
}

// One case: the stage on the emulator against the float64 reference by the low-precision rule,
// every element written and finite, rows that see no key O = 0 and LSE = -inf exactly, and the
// instance the stage chose (`model`: the kernel with stage 10's switches).
template <class T, int D>
void check(const Case& c, bool model, InputKind kind = InputKind::Normal) {
    const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
    const Precision prec = precision_of<T>;
    const VarlenProblem vp = packed_problem(c, D);
    vp.validate();
    const uint64_t seed = 7000 + uint64_t(c.Nq) * 31 + uint64_t(c.Nk) * 7 + D + uint64_t(c.Hq);
    const Inputs in = make_varlen_inputs(vp, kind, seed);
    INFO(describe(c, D, bf16) << " seed " << seed);
    const auto bits = [](const HostTensor& t) {
        std::vector<uint16_t> r(t.storage.size());
        for (size_t i = 0; i < r.size(); ++i) r[i] = to_bits<T>(t.storage[i]);
        return r;
    };
    ModelOptions options;
    options.kv_heads = c.Hk, options.window = c.window, options.softcap = c.softcap;
    std::vector<uint16_t> o16;
    std::vector<float> lse;
    const bool ran_model = run_stage<T, D>(c, options, bits(in.q), bits(in.k), bits(in.v), o16, lse);
    CHECK(ran_model == model);

    const VarlenReference ref = reference_attention_varlen(vp, in.q.cview(), in.k.cview(), in.v.cview());
    const EmulatedAttention naive = naive_model_emulated(prec, vp, in);
    const Tolerances tol = low_precision_tolerance(packed_stats(vp, in), prec, compare(naive.o, ref.o), compare(naive.lse, ref.lse));
    std::vector<float> o(o16.size());
    for (size_t i = 0; i < o.size(); ++i) o[i] = emu::to_f<T>(o16[i]);
    const Metrics mo = compare(o, ref.o), ml = compare(lse, ref.lse);
    INFO("O: max_abs " << mo.max_abs << " rel_l2 " << mo.rel_l2 << " nonfinite " << mo.nonfinite << " (limits " << tol.o.max_abs
                       << ", " << tol.o.rel_l2 << "); LSE: max_abs " << ml.max_abs << " nonfinite " << ml.nonfinite
                       << " (limit " << tol.lse.max_abs << ")\n" << tol.rule);
    CHECK(passes(mo, tol.o));
    CHECK(passes(ml, tol.lse));

    // Rows that see no key: exactly 0 and -inf (never NaN); every other LSE finite.
    int64_t empty_rows = 0, wrong = 0;
    const int64_t total_q = vp.total_q;
    for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t t = 0; t < total_q; ++t) {
            const double want = ref.lse[size_t(h * total_q + t)];
            const float got = lse[size_t(h * total_q + t)];
            if (std::isinf(want)) {
                ++empty_rows;
                wrong += !(std::isinf(got) && got < 0);
                for (int x = 0; x < D; ++x) wrong += o[size_t((t * c.Hq + h) * D + x)] != 0.0f;
            } else {
                wrong += !std::isfinite(got);
            }
        }
    INFO(empty_rows << " rows see no key");
    CHECK(wrong == 0);
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

TEST_CASE("emulated stage 07: grouped-query heads, bf16 and fp16") {
    check<__nv_bfloat16, 64>({1, 4, 2, 130, 130, false, Window::full(), 0.0, 0.125}, true);  // Hq/Hk = 2, tails
    check<__half, 128>({2, 4, 1, 77, 200, true, Window::full(), 0.0, 0.088}, true);          // MQA, causal, Nq < Nk
    check<__nv_bfloat16, 128>({1, 4, 4, 70, 45, false, Window::full(), 0.0, 0.088}, false);   // Hq/Hk = 1: the final kernel
    check<__half, 64>({1, 4, 1, 150, 60, false, Window::causal(), 0.0, 0.125}, true);        // (-1, 0) as causal, Nq > Nk: empty rows
}

TEST_CASE("emulated stage 07: sliding windows, bf16 and fp16") {
    check<__nv_bfloat16, 64>({1, 2, 2, 200, 200, false, Window{16, 0}, 0.0, 0.125}, true);    // narrower than a tile
    check<__half, 64>({1, 2, 1, 150, 90, false, Window{20, 7}, 0.0, -0.2}, true);             // both bounded, Nq > Nk, scale < 0
    check<__nv_bfloat16, 128>({1, 1, 1, 190, 190, false, Window{32, -1}, 0.0, 0.088}, true);  // left bound only
    check<__half, 128>({1, 2, 1, 65, 129, false, Window{500, 400}, 0.0, 0.088}, true);        // wider than N, with GQA
    check<__half, 64>({1, 2, 2, 100, 70, false, Window{300, 300}, 0.0, 0.125}, false);       // wider than N: the final kernel
    check<__nv_bfloat16, 64>({1, 2, 2, 150, 60, false, Window::causal(), 0.0, 0.125}, false);  // (-1, 0): the causal kernel
    check<__nv_bfloat16, 64>({1, 2, 1, 3, 300, true, Window{70, -1}, 0.0, 0.125}, true);      // Nq = 3 at the end of 300 keys
}

TEST_CASE("emulated stage 07: the soft cap, and the other head dimensions") {
    check<__half, 64>({1, 4, 2, 100, 140, false, Window{40, 0}, 5.0, 0.5}, true);
    check<__nv_bfloat16, 128>({1, 2, 1, 97, 97, true, Window::full(), 30.0, 0.088}, true, InputKind::Large);
    check<__nv_bfloat16, 32>({1, 2, 1, 129, 70, false, Window{10, 3}, 0.0, 0.17}, true);
    check<__half, 256>({1, 2, 1, 70, 90, false, Window{20, 20}, 10.0, 0.0625}, true);
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
}
