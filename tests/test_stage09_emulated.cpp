// Stage 09's main kernels (every step of its road), its preprocessing and postprocessing kernels, launched as
// the stage launches them (stages/09_backward_kernel/launch.cuh: tuned shapes, arguments, order),
// run on the CPU by the warp emulator (tools/warp_emulator: one fiber per CUDA thread,
// ldmatrix and mma lane by lane as the PTX ISA defines them, cp.async copies landing only at
// cp.async.wait_group).
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
#include "fa/problem.hpp"
#include "fa/tensor.hpp"
#include "stages/09_backward_kernel/launch.cuh"

namespace fa::stage09 {
// The dynamic shared memory the kernels declare (`extern __shared__ ... smem_raw[]`).
alignas(128) unsigned char smem_raw[232448];
}  // namespace fa::stage09

namespace {

using namespace fa::stage09;

using emu::to_bits;

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

// The backward as stage 09 launches it (launch.cuh: the tuned shapes, the arguments, the three
// kernels in order), main kernel `step`, each kernel run by the emulator. The workspace starts as
// garbage and the gradients as all-ones bits (NaN): what the kernels forget to write shows.
// `last_block_first`: the emulator runs every grid's blocks from the last to the first (the
// atomic mode only: a deterministic block would wait for one that runs after it).
template <class T, int D>
Grads run_backward(const Data<T, D>& in, int step, bool deterministic, bool last_block_first = false) {
    const Prob& pr = in.p;
    fa::Problem p;
    p.batch = pr.B, p.heads = pr.H, p.seq_q = pr.Nq, p.seq_k = pr.Nk, p.head_dim = D, p.scale = pr.scale, p.causal = pr.causal;
    const Geometry geo = geometry_for<D>(step);
    const Counts c = counts(p, geo);
    std::vector<float> workspace(size_t(workspace_floats(p, geo)), 12345.0f);
    std::vector<int> turns(size_t(c.batch_heads * c.q_blocks), 777);
    Grads g{std::vector<uint16_t>(in.dout.size(), 0xffff), std::vector<uint16_t>(in.k.size(), 0xffff),
            std::vector<uint16_t>(in.v.size(), 0xffff)};
    const auto view = [&](const std::vector<uint16_t>& x, int64_t n) {
        return fa::make_view(reinterpret_cast<const T*>(x.data()), p.batch, p.heads, n, D, fa::Layout::BHND);
    };
    const auto out = [&](std::vector<uint16_t>& x, int64_t n) {
        return fa::make_view(reinterpret_cast<T*>(x.data()), p.batch, p.heads, n, D, fa::Layout::BHND);
    };
    const Launches<T> launches = make_launches<T, D>(
        p, view(in.q, p.seq_q), view(in.k, p.seq_k), view(in.v, p.seq_k), view(in.o, p.seq_q),
        fa::make_view3(in.lse.data(), p.batch, p.heads, p.seq_q), view(in.dout, p.seq_q), out(g.dq, p.seq_q),
        out(g.dk, p.seq_k), out(g.dv, p.seq_k), workspace.data(), deterministic ? turns.data() : nullptr, geo);
    // Blocks run one at a time, in order of block number: in the deterministic mode that is the
    // order of the turns (the last key block first), so a turn is always there when a block
    // arrives; a block that had to wait would stop the emulator (its __nanosleep aborts).
    const auto launch = [&](auto kernel, const char*, int64_t blocks, int threads, size_t smem, const auto& args) {
        REQUIRE(smem <= sizeof smem_raw);
        emu::launch(long(blocks), threads, smem_raw, smem, [&] { decltype(kernel)::value(args); }, last_block_first);
    };
    if (deterministic) {
        run_kernels<T, D, true>(launches, step, launch);
    } else {
        run_kernels<T, D, false>(launches, step, launch);
    }
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

// Every main kernel of the road on one problem: each against the float64 gradients (a bound of a few units
// of the 16-bit type's rounding of the largest gradient: the kernels keep float32 sums, so their
// error is the rounding of their inputs and outputs), each later step against the first, every
// element written and finite, and dQ of rows that see no key exactly 0.
template <class T, int D>
void check(const Prob& p, bool deterministic, double magnitude = 1.0) {
    const Data<T, D> in(p, unsigned(1000 + p.Nq + 7 * p.Nk + D), magnitude);
    // Every step of the road; a step whose main kernel at this d is an earlier step's (the same
    // instance: same_kernel_as(), the table run_kernels() launches by) takes that step's result.
    const int steps = kRoadSteps;
    std::vector<Grads> grads;
    for (int step = 0; step < steps; ++step) {
        const int same = same_kernel_as<D>(step);
        grads.push_back(same < step ? grads[size_t(same)] : run_backward(in, step, deterministic));
    }
    const Grads& g0 = grads[0];
    const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
    const double limit = bf16 ? 2e-2 : 4e-3;
    const char* names[3] = {"dQ", "dK", "dV"};
    for (int step = 0; step < steps; ++step) {
        const Grads& g = grads[size_t(step)];
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
    // Step 3 computes step 2's dP^T in another order of columns: every sum is the same, in the same
    // order (and the emulator runs the blocks, so the dQ additions, in one order): bit-identical
    // (at d = 32, 64 step 3 is step 2's kernel).
    CHECK(grads[3].dq == grads[2].dq);
    CHECK(grads[3].dk == grads[2].dk);
    CHECK(grads[3].dv == grads[2].dv);
    // The same float32 sums in another grouping: a few units of the last place of T at most.
    for (int step = 1; step < steps; ++step) {
        const Grads& g = grads[size_t(step)];
        const std::vector<uint16_t>* a[3] = {&g.dq, &g.dk, &g.dv};
        const std::vector<uint16_t>* b[3] = {&g0.dq, &g0.dk, &g0.dv};
        for (int i = 0; i < 3; ++i) {
            int64_t nonfinite = 0;
            const double e = relative_error<T>(*a[i], widen<T>(*b[i]), nonfinite);
            INFO(names[i] << ": step " << step << " against step 0, relative max difference " << e);
            CHECK(e <= (bf16 ? 1.6e-2 : 2e-3));
        }
    }
}

// The deterministic mode adds the same float32 products as the atomic mode, in one fixed order:
// at every query block, the last key block that visits it first, down to key block 0. Running the
// atomic mode's blocks from the last to the first gives exactly that order (block b of a head is
// key block b there), so the two must agree bit for bit, at every step; and the deterministic mode
// run twice (its threads taking turns in another order) gives the same bits again. The float64
// check of the deterministic mode itself is check()'s.
template <class T, int D>
void check_deterministic_order(const Prob& p) {
    const Data<T, D> in(p, unsigned(2000 + p.Nq + 7 * p.Nk + D), 1.0);
    for (int step = 0; step < kRoadSteps; ++step) {
        if (same_kernel_as<D>(step) != step) continue;  // an earlier step's kernel, checked there
        const Grads fixed = run_backward(in, step, true);
        const Grads again = run_backward(in, step, true);
        const Grads reversed_atomic = run_backward(in, step, false, true);
        INFO("d=" << D << " Nq=" << p.Nq << " Nk=" << p.Nk << (p.causal ? " causal" : "") << " step " << step);
        CHECK(fixed.dq == again.dq);
        CHECK(fixed.dk == again.dk);
        CHECK(fixed.dv == again.dv);
        CHECK(fixed.dq == reversed_atomic.dq);
        CHECK(fixed.dk == reversed_atomic.dk);
        CHECK(fixed.dv == reversed_atomic.dv);
    }
}

}  // namespace

TEST_CASE("stage 09: the key blocks that visit query block i are 0 .. last_key_block(i)") {
    // The deterministic turns count on it: key block j's turn at i is last_key_block(i) - j.
    for (const bool causal : {false, true})
        for (const int br : {32, 64, 128})
            for (const int bc : {64, 128})
                for (int nq = 1; nq <= 300; nq += 13)
                    for (int nk = 1; nk <= 300; nk += 11) {
                        const int tr = (nq + br - 1) / br, tc = (nk + bc - 1) / bc;
                        for (int i = 0; i < tr; ++i) {
                            int last = -1;
                            for (int j = 0; j < tc; ++j) {
                                if (first_query_block(j, br, bc, nq, nk, causal) <= i) {
                                    REQUIRE(last == j - 1);  // a prefix 0, 1, ...: no gap
                                    last = j;
                                }
                            }
                            INFO("Br=" << br << " Bc=" << bc << " Nq=" << nq << " Nk=" << nk << " i=" << i);
                            REQUIRE(fa::last_key_block(i, br, bc, nq, nk, tc, causal) == last);
                        }
                    }
}

TEST_CASE("emulated stage 09: the deterministic order is fixed, the last key block first") {
    check_deterministic_order<__nv_bfloat16, 128>({2, 1, 257, 129, true, 0.088});  // Nq > Nk: rows that see no key
    check_deterministic_order<__nv_bfloat16, 128>({1, 1, 70, 300, false, -0.2});   // tails, 3 key blocks of 128
    check_deterministic_order<__half, 64>({1, 1, 200, 300, true, 0.125});          // Nq < Nk, tails
    check_deterministic_order<__half, 32>({1, 2, 131, 250, true, 0.17});
}

TEST_CASE("emulated stage 09: every main kernel matches the float64 gradients and the first, bf16") {
    check<__nv_bfloat16, 64>({1, 2, 200, 300, true, 0.125}, false);    // tails, Nq < Nk, 3 key blocks of 128
    check<__nv_bfloat16, 128>({2, 1, 257, 129, true, 0.088}, true);    // Nq > Nk: 128 rows see no key
    check<__nv_bfloat16, 64>({1, 1, 129, 127, false, -0.3}, false);    // a negative scale
    check<__nv_bfloat16, 64>({1, 1, 100, 100, true, 0.125}, false, 8.0);  // large logits
    check<__nv_bfloat16, 32>({2, 1, 131, 250, true, 0.17}, true);
    // d = 128 in steps 2 and 3's 64 x 128 blocks: a partial last query block (70 = 64 + 6) and
    // key block (300 = 2 x 128 + 44), Nq < Nk, a negative scale, every dP^T piece.
    check<__nv_bfloat16, 128>({1, 2, 70, 300, false, -0.2}, false);
    check<__nv_bfloat16, 128>({1, 2, 70, 300, false, -0.2}, true);
}

TEST_CASE("emulated stage 09: every main kernel matches the float64 gradients and the first, fp16") {
    check<__half, 64>({1, 1, 300, 200, true, 0.125}, true);
    check<__half, 128>({1, 2, 190, 333, true, 0.088}, false);
    check<__half, 128>({1, 1, 1, 1, false, 0.088}, false);
    check<__half, 32>({1, 1, 300, 45, false, 0.17}, false);
    // Causal, Nq > Nk: rows 0 to 122 see no key, and a key block of 77 keys (of 128) crosses the
    // diagonal of two query blocks of 64; the deterministic turns with 128-key blocks.
    check<__half, 128>({1, 1, 200, 77, true, 0.088}, true);
}

TEST_CASE("stage 09: which steps of the road run an earlier step's kernel") {
    // Steps 2 and 3 change d = 128 only, steps 4 and 5 d = 32 and 64 only; steps 6 to 10 are
    // kernels of their own at every d (launch.cuh).
    for (int step = 0; step < kRoadSteps; ++step) {
        const int at32 = same_kernel_as<32>(step), at64 = same_kernel_as<64>(step), at128 = same_kernel_as<128>(step);
        INFO("step " << step);
        CHECK(at32 == at64);
        CHECK(at32 == (step == 2 || step == 3 ? 1 : step));
        CHECK(at128 == (step == 4 || step == 5 ? 2 : step));
    }
}
