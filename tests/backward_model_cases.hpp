// Stage 10's switches on stage 09's backward kernel (grouped-query heads, sliding windows, the soft
// cap), checked the same way on the CPU (test_stage09_model_emulated: the warp emulator) and on the
// GPU (test_stage09): the cases, their inputs rounded to bf16 or fp16, the forward's O and LSE and
// the gradients from the float64 reference of fa/reference_ext.hpp, and the checks. A test
// supplies only how the backward runs.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fa/inputs.hpp"
#include "fa/philox.hpp"
#include "fa/precision.hpp"
#include "fa/reference_ext.hpp"
#include "fa/varlen.hpp"
#include "model_cases.hpp"

namespace fa::test {

/// The cases of the backward: Hq/Hk = 1, 2, 4 (MQA), windows narrower than a tile and wider than
/// N, both bounds, causal with rows that see no key, keys and whole key blocks no query sees,
/// the soft cap (with large logits too), Nq != Nk both ways, tails, a negative scale, bf16 and
/// fp16, d = 64 and 128. `model` says
/// whether the options ask for the kernel with stage 10's switches (Hq/Hk = 1 with a full or
/// causal window is the plain call).
inline std::vector<ModelCase> backward_model_cases() {
    const Precision bf16 = Precision::BFloat16, fp16 = Precision::Float16;
    return {
        // grouped-query heads
        {64, bf16, 1, 4, 2, 130, 200, false, Window::full(), 0.0, 0.125, true},  // Hq/Hk = 2, tails, Nq < Nk
        {128, fp16, 2, 4, 1, 150, 70, true, Window::full(), 0.0, 0.088, true},   // MQA (4 heads on one), causal, Nq > Nk
        // sliding windows
        {64, bf16, 1, 2, 2, 200, 200, false, Window{16, 0}, 0.0, 0.125, true},      // narrower than a tile, Hq/Hk = 1
        {64, fp16, 1, 2, 1, 150, 90, false, Window{20, 7}, 0.0, -0.2, true},        // both bounded, Nq > Nk: rows see no key
        {128, bf16, 1, 2, 1, 3, 300, true, Window{70, -1}, 0.0, 0.088, true},       // 3 rows at the end of 300 keys: (70, 0)
        {128, fp16, 1, 2, 1, 65, 129, false, Window{500, 400}, 0.0, 0.088, true},  // wider than N: no window, with GQA
        // the soft cap
        {64, fp16, 1, 4, 2, 100, 140, false, Window{40, 0}, 5.0, 0.5, true},      // scores up to ~10 capped at 5, GQA, a window
        {128, bf16, 1, 2, 2, 97, 97, true, Window::full(), 30.0, 0.088, true, InputKind::Large},  // large logits, causal
    };
}

/// One case's data: the inputs rounded to the case's precision (what the kernel reads, exactly),
/// the forward's O (the float64 one, rounded) and LSE as the backward receives them, dO, and the
/// float64 gradients of the rounded inputs. Packed orders: q, o, dout (total_q, Hq, d), k, v
/// (total_k, Hk, d), lse (Hq, total_q), as reference_ext.hpp has them; the kernels read them as
/// (B, H, N, d) views of B equal sequences.
struct BackwardModelData {
    VarlenProblem vp;            ///< the case as a packed problem (packed_problem())
    std::vector<float> q;        ///< (total_q, Hq, d)
    std::vector<float> k;        ///< (total_k, Hk, d)
    std::vector<float> v;        ///< (total_k, Hk, d)
    std::vector<float> dout;     ///< (total_q, Hq, d)
    std::vector<float> o;        ///< (total_q, Hq, d)
    std::vector<float> lse;      ///< (Hq, total_q), -inf for rows that see no key
    VarlenGradients ref;         ///< the float64 gradients
    /// relative_max_error() of the naive backward in the same precision (P and dS rounded before
    /// their products, D from the rounded O: naive_backward_varlen_emulated()) for dQ, dK, dV
    double naive_error[3] = {0.0, 0.0, 0.0};
};

/// max |x - ref| over max |ref| (the absolute error where the reference is all but zero), and the
/// count of elements of x that are not finite: the rule of test_stage09_emulated.
template <class Ref>
double relative_max_error(const std::vector<float>& x, const std::vector<Ref>& ref, int64_t& nonfinite) {
    double e = 0.0, m = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
        const double a = x[i], b = double(ref[i]);
        if (!std::isfinite(a)) ++nonfinite;
        e = std::max(e, std::abs(a - b)), m = std::max(m, std::abs(b));
    }
    return m < 1e-6 ? e : e / m;
}

/// The data of the packed problem `vp` in `precision`, inputs of `kind` drawn with `seed`.
inline BackwardModelData backward_data(const VarlenProblem& vp, Precision precision, InputKind kind, uint64_t seed) {
    BackwardModelData data;
    data.vp = vp;
    data.vp.validate();
    Inputs in = make_varlen_inputs(data.vp, kind, seed);
    HostTensor dout = make_varlen_output_gradient(data.vp, seed);
    for (HostTensor* t : {&in.q, &in.k, &in.v, &dout})
        for (float& x : t->storage) x = round_to(precision, x);
    data.q = in.q.storage, data.k = in.k.storage, data.v = in.v.storage, data.dout = dout.storage;
    const VarlenReference fwd = reference_attention_varlen(data.vp, in.q.cview(), in.k.cview(), in.v.cview());
    data.o.resize(fwd.o.size());
    for (size_t i = 0; i < fwd.o.size(); ++i) data.o[i] = round_to(precision, float(fwd.o[i]));
    data.lse.resize(fwd.lse.size());
    for (size_t i = 0; i < fwd.lse.size(); ++i) data.lse[i] = float(fwd.lse[i]);
    data.ref = reference_backward_varlen(data.vp, in.q.cview(), in.k.cview(), in.v.cview(), dout.cview());
    const EmulatedGradients naive = naive_backward_varlen_emulated(precision, data.vp, in.q.cview(), in.k.cview(),
                                                                   in.v.cview(), dout.cview());
    int64_t nonfinite = 0;
    data.naive_error[0] = relative_max_error(naive.dq, data.ref.dq, nonfinite);
    data.naive_error[1] = relative_max_error(naive.dk, data.ref.dk, nonfinite);
    data.naive_error[2] = relative_max_error(naive.dv, data.ref.dv, nonfinite);
    return data;
}

/// The data of case `c` (seeded by its shape), as a packed problem of B equal sequences.
inline BackwardModelData backward_model_data(const ModelCase& c) {
    const uint64_t seed = 9000 + uint64_t(c.Nq) * 31 + uint64_t(c.Nk) * 7 + uint64_t(c.d) + uint64_t(c.Hq) * 3 + uint64_t(c.Hk);
    return backward_data(packed_problem(c), c.precision, c.inputs, seed);
}

/// Gradients of one run, widened to float32, in the packed orders of BackwardModelData.
struct ModelGradients {
    std::vector<float> dq;  ///< (total_q, Hq, d)
    std::vector<float> dk;  ///< (total_k, Hk, d)
    std::vector<float> dv;  ///< (total_k, Hk, d)
};

/// The limit of relative_max_error() against float64: a few units of the 16-bit type's rounding
/// of the largest gradient (the kernels keep float32 sums; their error is the rounding of their
/// inputs, O and outputs), as test_stage09_emulated allows the plain kernels.
inline double backward_limit(Precision precision) { return precision == Precision::BFloat16 ? 2e-2 : 4e-3; }

/// `got` against the float64 gradients of `data`: each gradient within backward_limit(), or twice
/// the naive backward's error where that is larger (the rounding of O to 16 bits enters D, and a
/// softmax gradient that is zero in exact arithmetic, a sequence of one key, comes out as that
/// rounding times 1/(1-p) under dropout, beside the other sequences' small gradients), every
/// element finite, and exactly 0 where float64 is exactly 0 because nothing reaches it: dQ of rows
/// that see no key (LSE -inf), dK and dV of keys that no query sees.
inline void check_backward_gradients(Precision precision, const BackwardModelData& data, const ModelGradients& got,
                                     const std::string& what) {
    INFO(to_string(precision) << " " << data.vp.describe() << " " << what);
    const char* names[3] = {"dQ", "dK", "dV"};
    const std::vector<float>* g[3] = {&got.dq, &got.dk, &got.dv};
    const std::vector<double>* want[3] = {&data.ref.dq, &data.ref.dk, &data.ref.dv};
    for (int i = 0; i < 3; ++i) {
        REQUIRE(g[i]->size() == want[i]->size());
        int64_t nonfinite = 0;
        const double e = relative_max_error(*g[i], *want[i], nonfinite);
        const double limit = std::max(backward_limit(precision), 2.0 * data.naive_error[i]);
        INFO(std::string(names[i]) << ": relative max error " << e << " (limit " << limit << "; the naive backward's "
                                   << data.naive_error[i] << "), " << nonfinite << " not finite");
        CHECK(nonfinite == 0);
        CHECK(e <= limit);
    }
    // Rows that see no key: dQ exactly 0. Keys no query sees: dK and dV exactly 0.
    const int64_t d = data.vp.head_dim, hq = data.vp.heads_q, total_q = data.vp.total_q;
    int64_t empty_rows = 0, nonzero = 0;
    for (int64_t h = 0; h < hq; ++h)
        for (int64_t t = 0; t < total_q; ++t) {
            if (!std::isinf(data.lse[size_t(h * total_q + t)])) continue;
            ++empty_rows;
            for (int64_t x = 0; x < d; ++x) nonzero += got.dq[size_t((t * hq + h) * d + x)] != 0.0f;
        }
    // With dropout, a key whose every visible score is dropped has dV = 0 exactly, but not dK (dS
    // takes the undropped P): dK is checked where both are 0.
    int64_t unseen = 0;
    for (size_t row = 0; row * size_t(d) < data.ref.dk.size(); ++row) {
        bool dv_zero = true, dk_zero = true;
        for (int64_t x = 0; x < d; ++x) {
            dv_zero = dv_zero && data.ref.dv[row * size_t(d) + size_t(x)] == 0.0;
            dk_zero = dk_zero && data.ref.dk[row * size_t(d) + size_t(x)] == 0.0;
        }
        if (!dv_zero) continue;
        unseen += dk_zero;
        for (int64_t x = 0; x < d; ++x) {
            nonzero += dk_zero && got.dk[row * size_t(d) + size_t(x)] != 0.0f;
            nonzero += got.dv[row * size_t(d) + size_t(x)] != 0.0f;
        }
    }
    INFO(empty_rows << " query rows see no key, " << unseen << " key rows are seen by no query");
    CHECK(nonzero == 0);
}

/// check_backward_gradients() of a dense case.
inline void check_backward_gradients(const ModelCase& c, const BackwardModelData& data, const ModelGradients& got,
                                     const std::string& what) {
    check_backward_gradients(c.precision, data, got, c.describe() + " " + what);
}

/// The packed cases of the backward (cases of varlen_cases() and of the same kind): sequences of
/// length 0 and 1 (queries, keys or both), Nq != Nk both ways within one batch, one long sequence
/// among short ones, Hq/Hk = 2 and 4 (MQA), causal per sequence, a window narrower than a tile,
/// no mask at all, both bounds, the soft cap, a negative scale, longest lengths larger than
/// needed, bf16 and fp16, d 64 and 128.
inline std::vector<VarlenCase> backward_varlen_cases() {
    const Precision bf16 = Precision::BFloat16, fp16 = Precision::Float16;
    return {
        // causal per sequence: empty sequences, a query with no key, Nq > Nk and Nq < Nk
        {64, bf16, {0, 1, 7, 131, 1, 0, 37, 2}, {5, 1, 13, 131, 2, 0, 29, 0}, 4, 2, Window::causal(), 0.0, 0.125},
        // one long sequence among short ones, MQA, a window narrower than a tile
        {128, fp16, {200, 1, 2, 3, 5, 7, 11, 1}, {263, 3, 2, 1, 5, 17, 11, 1}, 4, 1, Window{40, 0}, 0.0, 0.088},
        // both bounds, the soft cap, a negative scale, longest lengths larger than needed
        {64, fp16, {97, 1, 61, 0, 19}, {53, 64, 61, 3, 23}, 2, 2, Window{20, 7}, 5.0, -0.3, 50},
        // no mask at all: only the rows past each sequence and the keys past Nk are hidden
        {64, bf16, {67, 0, 130, 1}, {100, 1, 64, 1}, 2, 2, Window::full(), 0.0, 0.088},
    };
}

/// Dropout on the default main kernel, dense: p = 0.1, 0.5 and 0.9 (p' = 26/256, 1/2, 230/256),
/// with grouped heads, causal rows that see no key, a window and the soft cap on large logits,
/// d = 32, 64 and 128, bf16 and fp16.
inline std::vector<ModelCase> backward_dropout_cases() {
    const Precision bf16 = Precision::BFloat16, fp16 = Precision::Float16;
    return {
        // GQA, Nq < Nk, two batch entries, p = 0.1
        {64, bf16, 2, 4, 2, 70, 130, false, Window::full(), 0.0, 0.125, true, InputKind::Normal, Dropout{0.1, 0x1234abcdull, 7}},
        // d = 32, causal with Nq > Nk (rows that see no key), MQA, p = 0.5
        {32, fp16, 1, 2, 1, 61, 47, true, Window::full(), 0.0, 0.17, true, InputKind::Normal, Dropout{0.5, 99, 0}},
        // d = 128, both bounds, the cap on large logits, p = 0.9
        {128, bf16, 1, 2, 1, 37, 97, false, Window{20, 7}, 30.0, 0.088, true, InputKind::Large, Dropout{0.9, 5, 3}},
    };
}

/// Dropout on packed batches: lengths 0 and 1, primes, Nq != Nk both ways, grouped heads, causal,
/// both bounds with the cap, d = 32, 64 and 128, p = 0.1, 0.5 and 0.9.
inline std::vector<VarlenCase> backward_dropout_varlen_cases() {
    const Precision bf16 = Precision::BFloat16, fp16 = Precision::Float16;
    return {
        {64, bf16, {0, 1, 7, 37, 2}, {5, 1, 13, 29, 0}, 4, 2, Window::causal(), 0.0, 0.125, 0, Dropout{0.1, 77, 1}},
        {128, fp16, {1, 67, 0, 3}, {2, 41, 3, 131}, 2, 1, Window{20, 7}, 5.0, -0.3, 0, Dropout{0.5, 0xfeedull << 32, 2}},
        {32, bf16, {13, 31}, {17, 3}, 2, 2, Window::full(), 0.0, 0.17, 9, Dropout{0.9, 1, 0}},
    };
}

/// Dropout's mask read back from a kernel's output, so that a test fails on a single wrong bit.
/// Q = 0 makes every visible score 0 and P uniform, 1/Nk in each row (no window): every entry of
/// P~ is then 1/(Nk (1 - p')) where kept and exactly 0 where dropped. dO row i of query head h is
/// the unit vector of feature (h mod G) rows + i (G = Hq/Hk, rows = d/G query rows per head at
/// most), so dV = P~^T dO holds, at feature (h mod G) rows + i of key j of K/V head h/G, the single
/// entry P~_ij of query head h: the backward's mask, one entry per score (mask_from_dv()). V_j the
/// unit vector of feature j - part d (keys of one part of d at a time; the others 0) makes O_ix =
/// P~_{i, part d + x}: the forward's mask (mask_from_o()). Comparing those with dropout_keep()
/// (expected()) entry by entry, every (b, h, i, j) of every sequence, flips of any one bit show.
struct DropoutProbe {
    VarlenProblem vp;        ///< the problem (dropout on, no window, no cap)
    int64_t rows = 0;        ///< dO features per query head of a group: d / G
    std::vector<float> q;    ///< (total_q, Hq, d) zeros
    std::vector<float> k;    ///< (total_k, Hk, d) anything finite (Q = 0)
    std::vector<float> dout; ///< (total_q, Hq, d) unit vectors
    std::vector<float> o;    ///< (total_q, Hq, d) zeros (D = 0: dV does not depend on it)
    std::vector<float> lse;  ///< (Hq, total_q) log Nk of the row's sequence

    /// Parts of d keys the forward's probes need.
    int parts() const { return int((vp.max_seq_k() + vp.head_dim - 1) / vp.head_dim); }

    /// V of part `part`: V_j = unit vector of feature j - part d for keys j in [part d, part d + d).
    std::vector<float> v(int part) const {
        const int64_t d = vp.head_dim;
        std::vector<float> x(size_t(vp.total_k * vp.heads_k * d), 0.0f);
        for (int64_t b = 0; b < vp.batch(); ++b)
            for (int64_t j = part * d; j < std::min(vp.seq_k(b), (part + 1) * d); ++j)
                for (int64_t h = 0; h < vp.heads_k; ++h) x[size_t(((vp.cu_seqlens_k[b] + j) * vp.heads_k + h) * d + j - part * d)] = 1.0f;
        return x;
    }

    /// Calls `f(b, h, i, j)` for every score of every sequence, in the order of the masks below.
    template <class F>
    void for_each_score(F&& f) const {
        for (int64_t b = 0; b < vp.batch(); ++b)
            for (int64_t h = 0; h < vp.heads_q; ++h)
                for (int64_t i = 0; i < vp.seq_q(b); ++i)
                    for (int64_t j = 0; j < vp.seq_k(b); ++j) f(b, h, i, j);
    }

    /// dropout_keep() of every score: the map (fa/philox.hpp).
    std::vector<uint8_t> expected() const {
        std::vector<uint8_t> m;
        for_each_score([&](int64_t b, int64_t h, int64_t i, int64_t j) {
            m.push_back(dropout_keep(vp.dropout.seed, vp.dropout.offset, uint32_t(b), uint32_t(h), uint32_t(i), uint32_t(j),
                                     vp.dropout.p));
        });
        return m;
    }

    /// The backward's mask: entry (b, h, i, j) is whether dV of key j holds P~_ij of head h.
    std::vector<uint8_t> mask_from_dv(const std::vector<float>& dv) const {
        const int64_t d = vp.head_dim, group = vp.heads_q / vp.heads_k;
        std::vector<uint8_t> m;
        for_each_score([&](int64_t b, int64_t h, int64_t i, int64_t j) {
            const int64_t key = vp.cu_seqlens_k[size_t(b)] + j;
            m.push_back(dv[size_t((key * vp.heads_k + h / group) * d + (h % group) * rows + i)] != 0.0f);
        });
        return m;
    }

    /// The forward's mask, from O of the run with v(part): the entries of the keys of that part.
    void mask_from_o(const std::vector<float>& out, int part, std::vector<uint8_t>& m) const {
        const int64_t d = vp.head_dim;
        size_t n = 0;
        for_each_score([&](int64_t b, int64_t h, int64_t i, int64_t j) {
            const int64_t row = vp.cu_seqlens_q[size_t(b)] + i;
            if (j / d == part) m[n] = out[size_t((row * vp.heads_q + h) * d + j - part * d)] != 0.0f;
            ++n;
        });
    }
};

/// The DropoutProbe of `vp` (dropout on; no window, no cap; every sequence's Nq at most d Hk / Hq).
inline DropoutProbe dropout_probe(const VarlenProblem& vp) {
    DropoutProbe probe;
    probe.vp = vp;
    probe.vp.validate();
    const int64_t d = vp.head_dim, group = vp.heads_q / vp.heads_k;
    probe.rows = d / group;
    REQUIRE(vp.max_seq_q() <= probe.rows);
    probe.q.assign(size_t(vp.total_q * vp.heads_q * d), 0.0f);
    probe.o = probe.q;
    probe.dout = probe.q;
    probe.k.assign(size_t(vp.total_k * vp.heads_k * d), 0.25f);
    probe.lse.assign(size_t(vp.heads_q * vp.total_q), 0.0f);
    for (int64_t b = 0; b < vp.batch(); ++b)
        for (int64_t h = 0; h < vp.heads_q; ++h)
            for (int64_t i = 0; i < vp.seq_q(b); ++i) {
                const int64_t row = vp.cu_seqlens_q[size_t(b)] + i;
                probe.dout[size_t((row * vp.heads_q + h) * d + (h % group) * probe.rows + i)] = 1.0f;
                probe.lse[size_t(h * vp.total_q + row)] = float(std::log(double(vp.seq_k(b))));
            }
    return probe;
}

/// The probe's checks: the forward's mask from O of `forward(part)` (O in the packed order of q)
/// for every part, and the backward's from dV of `backward(data, deterministic)` (the probe's
/// inputs as BackwardModelData, dV in the packed order of v) in both dQ modes, each equal to the
/// map entry by entry. `what` names the run.
template <class Forward, class Backward>
void check_dropout_probe(const DropoutProbe& probe, const std::string& what, Forward&& forward, Backward&& backward) {
    const std::vector<uint8_t> want = probe.expected();
    int64_t kept = 0;
    for (const uint8_t x : want) kept += x;
    INFO(probe.vp.describe() << " " << what << ": " << kept << " of " << want.size() << " scores kept");
    REQUIRE((kept > 0 && kept < int64_t(want.size())));  // both kinds of entries, or the probe proves nothing
    const auto first_difference = [&](const std::vector<uint8_t>& got) {
        size_t n = 0;
        while (n < want.size() && got[n] == want[n]) ++n;
        return n;
    };
    std::vector<uint8_t> fwd(want.size(), 2);
    for (int part = 0; part < probe.parts(); ++part) probe.mask_from_o(forward(part), part, fwd);
    INFO("forward: first differing score " << first_difference(fwd));
    CHECK(fwd == want);
    BackwardModelData data;
    data.vp = probe.vp, data.q = probe.q, data.k = probe.k, data.v = probe.v(0), data.o = probe.o, data.lse = probe.lse;
    data.dout = probe.dout;
    for (const bool deterministic : {false, true}) {
        const std::vector<uint8_t> bwd = probe.mask_from_dv(backward(data, deterministic));
        INFO(std::string(deterministic ? "deterministic" : "atomic") << ": first differing score " << first_difference(bwd));
        CHECK(bwd == want);
    }
}

/// The ModelCase of a dense probe (B equal sequences; bf16, no window, no cap).
inline ModelCase dense_probe_case(const VarlenProblem& vp) {
    return {int(vp.head_dim), Precision::BFloat16, int(vp.batch()), int(vp.heads_q), int(vp.heads_k), int(vp.seq_q(0)),
            int(vp.seq_k(0)), false, Window::full(), 0.0, 0.125, true, InputKind::Normal, vp.dropout};
}

/// The same case with K and V repeated per query head (Hk = Hq): without a window or a soft cap,
/// the plain kernel's problem. Its dK and dV, summed over each group, are the grouped call's; its
/// dQ is the grouped call's.
inline ModelCase repeated_case(const ModelCase& c) {
    ModelCase r = c;
    r.Hk = c.Hq;
    r.model = !stage07::resolve_options(r.problem(), r.options()).plain();
    return r;
}

/// k or v (total_k, Hk, d) repeated per query head: (total_k, Hq, d), head h holding K/V head h / (Hq/Hk).
inline std::vector<float> repeat_heads(const std::vector<float>& x, int64_t hk, int64_t hq, int64_t d) {
    const int64_t total = int64_t(x.size()) / (hk * d), group = hq / hk;
    std::vector<float> r(size_t(total * hq * d));
    for (int64_t t = 0; t < total; ++t)
        for (int64_t h = 0; h < hq; ++h)
            std::copy_n(&x[size_t((t * hk + h / group) * d)], d, &r[size_t((t * hq + h) * d)]);
    return r;
}

/// Gradients of the repeated problem (total_k, Hq, d) summed over each group: (total_k, Hk, d), in float64.
inline std::vector<double> sum_over_groups(const std::vector<float>& x, int64_t hk, int64_t hq, int64_t d) {
    const int64_t total = int64_t(x.size()) / (hq * d), group = hq / hk;
    std::vector<double> r(size_t(total * hk * d), 0.0);
    for (int64_t t = 0; t < total; ++t)
        for (int64_t h = 0; h < hq; ++h)
            for (int64_t e = 0; e < d; ++e) r[size_t((t * hk + h / group) * d + e)] += x[size_t((t * hq + h) * d + e)];
    return r;
}

}  // namespace fa::test
