// Stage 09's main kernels (both steps), its preprocessing and postprocessing kernels, run on the
// CPU by the warp emulator (tools/warp_emulator: one std::thread per CUDA thread, ldmatrix and mma
// lane by lane as the PTX ISA defines them, cp.async copies landing only at cp.async.wait_group).
// No GPU is needed, so this runs in CI: the fragment maps, swizzled addresses, warp pieces, masks
// and barriers of the kernel source are checked against the float64 gradients on every build.
// The GPU tests (test_stage09) remain the check of the compiled kernels.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "emulator.hpp"
#include "stages/09_backward_kernel/warp_tiled.cuh"

namespace fa::stage09 {
// The dynamic shared memory the kernels declare (`extern __shared__ ... smem_raw[]`).
alignas(128) unsigned char smem_raw[232448];
}  // namespace fa::stage09

namespace {

using namespace fa::stage09;

template <class T>
uint16_t to_bits(float f);
template <>
uint16_t to_bits<__nv_bfloat16>(float f) { return emu_f2bf(f); }
template <>
uint16_t to_bits<__half>(float f) { return emu_f2h(f); }

struct Prob {
    int B, H, Nq, Nk;
    bool causal;
    double scale;
};

// Inputs rounded to T, the forward's O (rounded to T) and LSE, and the float64 gradients of the
// rounded inputs. Layout (B, H, N, d), dense.
template <class T, int D>
struct Data {
    Prob p;
    std::vector<uint16_t> q, k, v, o, dout;
    std::vector<float> lse;
    std::vector<double> dq, dk, dv;

    Data(Prob pr, unsigned seed, double magnitude) : p(pr) {
        std::mt19937 rng(seed);
        std::normal_distribution<double> normal(0.0, 1.0);
        const size_t nq = size_t(p.B) * p.H * p.Nq * D, nk = size_t(p.B) * p.H * p.Nk * D;
        const auto fill = [&](std::vector<uint16_t>& x, size_t n, double m) {
            x.resize(n);
            for (uint16_t& e : x) e = to_bits<T>(float(m * normal(rng)));
        };
        fill(q, nq, magnitude), fill(k, nk, magnitude), fill(v, nk, 1.0), fill(dout, nq, 1.0);
        o.resize(nq), lse.resize(size_t(p.B) * p.H * p.Nq);
        dq.assign(nq, 0.0), dk.assign(nk, 0.0), dv.assign(nk, 0.0);
        const auto val = [](const std::vector<uint16_t>& x, size_t i) { return double(emu::to_f<T>(x[i])); };
        for (int bh = 0; bh < p.B * p.H; ++bh) {
            const size_t qb = size_t(bh) * p.Nq, kb = size_t(bh) * p.Nk;
            for (int i = 0; i < p.Nq; ++i) {
                const size_t row = qb + size_t(i);
                const int end = p.causal ? std::clamp(i + p.Nk - p.Nq + 1, 0, p.Nk) : p.Nk;
                if (end == 0) {
                    lse[row] = -INFINITY;
                    for (int x = 0; x < D; ++x) o[row * D + x] = to_bits<T>(0.0f);
                    continue;
                }
                std::vector<double> s(static_cast<size_t>(end)), P(static_cast<size_t>(end));
                double m = -INFINITY, l = 0.0;
                for (int j = 0; j < end; ++j) {
                    double a = 0.0;
                    for (int x = 0; x < D; ++x) a += val(q, row * D + x) * val(k, (kb + j) * D + x);
                    s[j] = a * p.scale;
                    m = std::max(m, s[j]);
                }
                for (int j = 0; j < end; ++j) l += (P[j] = std::exp(s[j] - m));
                lse[row] = float(m + std::log(l));
                std::vector<double> O(D, 0.0);
                for (int j = 0; j < end; ++j) {
                    P[j] /= l;
                    for (int x = 0; x < D; ++x) O[x] += P[j] * val(v, (kb + j) * D + x);
                }
                double delta = 0.0;
                for (int x = 0; x < D; ++x) {
                    o[row * D + x] = to_bits<T>(float(O[x]));
                    delta += val(dout, row * D + x) * O[x];
                }
                for (int j = 0; j < end; ++j) {
                    double dp = 0.0;
                    for (int x = 0; x < D; ++x) dp += val(dout, row * D + x) * val(v, (kb + j) * D + x);
                    const double ds = P[j] * (dp - delta);
                    for (int x = 0; x < D; ++x) {
                        dv[(kb + j) * D + x] += P[j] * val(dout, row * D + x);
                        dq[row * D + x] += p.scale * ds * val(k, (kb + j) * D + x);
                        dk[(kb + j) * D + x] += p.scale * ds * val(q, row * D + x);
                    }
                }
            }
        }
    }
};

struct Grads {
    std::vector<uint16_t> dq, dk, dv;
};

// The three kernels of attention.cu's run_for_d, with the main kernel `main_kernel` of shape
// (Br, Bc, threads, shared bytes). Gradients start as all-ones bits (NaN): unwritten ones show.
template <class T, int D, class MainFn>
Grads run_backward(const Data<T, D>& in, int br, int bc, int threads, size_t smem, bool deterministic, MainFn main_kernel) {
    const Prob& p = in.p;
    const int bh = p.B * p.H, q_blocks = (p.Nq + br - 1) / br, k_blocks = (p.Nk + bc - 1) / bc, nqp = q_blocks * br;
    std::vector<float> lse_log2(size_t(bh) * nqp), delta(size_t(bh) * nqp), acc(size_t(bh) * nqp * D, 12345.0f);
    std::vector<int> turns(size_t(bh) * q_blocks, 777);
    Grads g{std::vector<uint16_t>(in.dout.size(), 0xffff), std::vector<uint16_t>(in.k.size(), 0xffff),
            std::vector<uint16_t>(in.v.size(), 0xffff)};
    const auto as_t = [](const std::vector<uint16_t>& x) { return reinterpret_cast<const T*>(x.data()); };
    const int64_t qs = int64_t(p.Nq) * D, ks = int64_t(p.Nk) * D;

    PreprocessArgs<T> pre{};
    pre.o = as_t(in.o), pre.dout = as_t(in.dout), pre.lse = in.lse.data();
    pre.lse_log2 = lse_log2.data(), pre.delta = delta.data(), pre.dq_accum = acc.data();
    pre.turns = deterministic ? turns.data() : nullptr;
    pre.o_sb = pre.do_sb = p.H * qs, pre.o_sh = pre.do_sh = qs, pre.o_sn = pre.do_sn = D;
    pre.lse_sb = int64_t(p.H) * p.Nq, pre.lse_sh = p.Nq, pre.lse_sn = 1;
    pre.rows = int64_t(bh) * nqp, pre.heads = p.H, pre.seq_q = p.Nq, pre.seq_q_padded = nqp, pre.br = br;
    const long rows_per_block = kPrePostThreads / (D / 8);
    emu::launch((pre.rows + rows_per_block - 1) / rows_per_block, kPrePostThreads, smem_raw, 0,
                [&] { backward_preprocess_kernel<T, D>(pre); });

    Args<T> a{};
    a.q = as_t(in.q), a.k = as_t(in.k), a.v = as_t(in.v), a.dout = as_t(in.dout);
    a.dk = reinterpret_cast<T*>(g.dk.data()), a.dv = reinterpret_cast<T*>(g.dv.data());
    a.lse_log2 = lse_log2.data(), a.delta = delta.data(), a.dq_accum = acc.data();
    a.turns = deterministic ? turns.data() : nullptr;
    a.q_sb = a.do_sb = p.H * qs, a.q_sh = a.do_sh = qs, a.q_sn = a.do_sn = D;
    a.k_sb = a.v_sb = a.dk_sb = a.dv_sb = p.H * ks, a.k_sh = a.v_sh = a.dk_sh = a.dv_sh = ks;
    a.k_sn = a.v_sn = a.dk_sn = a.dv_sn = D;
    a.heads = p.H, a.seq_q = p.Nq, a.seq_k = p.Nk, a.seq_q_padded = nqp, a.q_blocks = q_blocks, a.k_blocks = k_blocks;
    a.causal = p.causal, a.scale = float(p.scale), a.scale_log2 = float(p.scale * 1.4426950408889634);
    // Blocks run one at a time, key block 0 first: the deterministic turns never wait.
    emu::launch(long(bh) * k_blocks, threads, smem_raw, smem, [&] { main_kernel(a); });

    PostprocessArgs<T> post{};
    post.dq_accum = acc.data(), post.dq = reinterpret_cast<T*>(g.dq.data());
    post.dq_sb = p.H * qs, post.dq_sh = qs, post.dq_sn = D, post.rows = int64_t(bh) * p.Nq;
    post.heads = p.H, post.seq_q = p.Nq, post.seq_q_padded = nqp, post.scale = float(p.scale);
    emu::launch(2, kPrePostThreads, smem_raw, 0, [&] { backward_postprocess_kernel<T, D>(post); });
    return g;
}

// max |x - ref| over max |ref| (the absolute error where the reference is all but zero).
template <class T, class Ref>
double relative_error(const std::vector<uint16_t>& x, const std::vector<Ref>& ref, int64_t& nonfinite) {
    double e = 0.0, m = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
        const double a = emu::to_f<T>(x[i]), b = double(ref[i]);
        if (!std::isfinite(a)) ++nonfinite;
        e = std::max(e, std::abs(a - b)), m = std::max(m, std::abs(b));
    }
    return m < 1e-6 ? e : e / m;
}

template <class T>
std::vector<float> widen(const std::vector<uint16_t>& x) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = emu::to_f<T>(x[i]);
    return out;
}

// Both main kernels on one problem: each against the float64 gradients (a bound of a few units
// of the 16-bit type's rounding of the largest gradient: the kernels keep float32 sums, so their
// error is the rounding of their inputs and outputs), the tiled kernel against the first, every
// element written and finite, and dQ of rows that see no key exactly 0.
template <class T, int D>
void check(const Prob& p, bool deterministic, double magnitude = 1.0) {
    using F0 = Features<64, 4, 32, false, 3>;
    using S0 = Shape<T, D, F0>;
    using F1 = TiledFeatures<128, (D == 128 ? 64 : 128), 8, (D == 128 ? 2 : 4), 32, 1>;
    using S1 = TiledShape<T, D, F1>;
    const Data<T, D> in(p, unsigned(1000 + p.Nq + 7 * p.Nk + D), magnitude);
    const Grads g0 = run_backward(in, F0::kBr, F0::kBc, S0::kThreads, S0::kSmemBytes, deterministic, [&](const Args<T>& a) {
        deterministic ? flash_backward_kernel<T, D, F0, true>(a) : flash_backward_kernel<T, D, F0, false>(a);
    });
    const Grads g1 = run_backward(in, F1::kBr, F1::kBc, S1::kThreads, S1::kSmemBytes, deterministic, [&](const Args<T>& a) {
        deterministic ? flash_backward_tiled_kernel<T, D, F1, true>(a) : flash_backward_tiled_kernel<T, D, F1, false>(a);
    });
    const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
    const double limit = bf16 ? 2e-2 : 4e-3;
    const char* names[3] = {"dQ", "dK", "dV"};
    for (int step = 0; step < 2; ++step) {
        const Grads& g = step == 0 ? g0 : g1;
        const std::vector<uint16_t>* got[3] = {&g.dq, &g.dk, &g.dv};
        const std::vector<double>* want[3] = {&in.dq, &in.dk, &in.dv};
        for (int i = 0; i < 3; ++i) {
            int64_t nonfinite = 0;
            const double e = relative_error<T>(*got[i], *want[i], nonfinite);
            INFO((bf16 ? "bf16" : "fp16") << " d=" << D << " B=" << p.B << " H=" << p.H << " Nq=" << p.Nq << " Nk=" << p.Nk
                                          << (p.causal ? " causal" : "") << " scale=" << p.scale
                                          << (deterministic ? " deterministic" : "") << " step " << step << " " << names[i]
                                          << ": relative max error " << e << " (limit " << limit << ")");
            CHECK(nonfinite == 0);
            CHECK(e <= limit);
        }
        int64_t nonzero = 0;
        for (int bh = 0; bh < p.B * p.H; ++bh)
            for (int r = 0; r < p.Nq; ++r) {
                if (p.causal && r + p.Nk - p.Nq + 1 > 0) continue;
                if (!p.causal) continue;
                for (int x = 0; x < D; ++x) nonzero += emu::to_f<T>(g.dq[(size_t(bh) * p.Nq + r) * D + x]) != 0.0f;
            }
        CHECK(nonzero == 0);
    }
    // The same float32 sums in another grouping: a few units of the last place of T at most.
    const std::vector<uint16_t>* a[3] = {&g1.dq, &g1.dk, &g1.dv};
    const std::vector<uint16_t>* b[3] = {&g0.dq, &g0.dk, &g0.dv};
    for (int i = 0; i < 3; ++i) {
        int64_t nonfinite = 0;
        const double e = relative_error<T>(*a[i], widen<T>(*b[i]), nonfinite);
        INFO(names[i] << ": step 1 against step 0, relative max difference " << e);
        CHECK(e <= (bf16 ? 1.6e-2 : 2e-3));
    }
}

}  // namespace

TEST_CASE("emulated stage 09: both main kernels match the float64 gradients and each other, bf16") {
    check<__nv_bfloat16, 64>({1, 2, 200, 300, true, 0.125}, false);    // tails, Nq < Nk, 3 key blocks of 128
    check<__nv_bfloat16, 128>({2, 1, 257, 129, true, 0.088}, true);    // Nq > Nk: 128 rows see no key
    check<__nv_bfloat16, 64>({1, 1, 129, 127, false, -0.3}, false);    // a negative scale
    check<__nv_bfloat16, 64>({1, 1, 100, 100, true, 0.125}, false, 8.0);  // large logits
    check<__nv_bfloat16, 32>({2, 1, 131, 250, true, 0.17}, true);
}

TEST_CASE("emulated stage 09: both main kernels match the float64 gradients and each other, fp16") {
    check<__half, 64>({1, 1, 300, 200, true, 0.125}, true);
    check<__half, 128>({1, 2, 190, 333, true, 0.088}, false);
    check<__half, 128>({1, 1, 1, 1, false, 0.088}, false);
    check<__half, 32>({1, 1, 300, 45, false, 0.17}, false);
}
