// Stage 10's switches on stage 07's forward kernel (grouped-query heads, sliding windows, the soft
// cap, dropout, packed batches of sequences of different lengths), checked the same way on the CPU (test_stage07_emulated: the warp emulator) and on the GPU
// (test_stage07): the cases, the packed float64 reference (fa/reference_ext.hpp), the naive
// attention in bf16 or fp16 that sets the limits (the low-precision rule of fa/tolerance.hpp) and
// the checks. A test supplies only how the kernel runs.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/philox.hpp"
#include "fa/precision.hpp"
#include "fa/reference.hpp"
#include "fa/reference_ext.hpp"
#include "fa/tolerance.hpp"
#include "fa/varlen.hpp"
#include "../stages/07_pipelined_fused_kernel/model_options.hpp"

namespace fa::test {

/// One dense call: B sequences of Nq queries and Nk keys, Hq query heads over Hk key/value heads,
/// head dimension d, in bf16 or fp16.
struct ModelCase {
    int d;
    Precision precision;
    int B, Hq, Hk, Nq, Nk;
    bool causal;
    Window window;
    double softcap;
    double scale;
    bool model;  ///< the stage runs the kernel with stage 10's switches (otherwise the final kernel)
    InputKind inputs = InputKind::Normal;
    Dropout dropout = {};  ///< dropout on P (p = 0: off); the map's b is the batch entry

    /// One line naming every field.
    std::string describe() const {
        return to_string(precision) + " d=" + std::to_string(d) + " B=" + std::to_string(B) + " Hq=" + std::to_string(Hq) +
               " Hk=" + std::to_string(Hk) + " Nq=" + std::to_string(Nq) + " Nk=" + std::to_string(Nk) +
               (causal ? " causal" : "") + " window=(" + std::to_string(window.left) + "," + std::to_string(window.right) +
               ") softcap=" + std::to_string(softcap) + " scale=" + std::to_string(scale) +
               (inputs == InputKind::Large ? " large" : "") +
               (dropout.enabled() ? " dropout=" + std::to_string(dropout.p) + " seed=" + std::to_string(dropout.seed) +
                                        " offset=" + std::to_string(dropout.offset)
                                  : "");
    }
    /// The problem the stage is called with (heads = Hq).
    Problem problem() const {
        Problem p;
        p.batch = B, p.heads = Hq, p.seq_q = Nq, p.seq_k = Nk, p.head_dim = d, p.scale = scale, p.causal = causal;
        return p;
    }
    /// The options the stage is called with.
    stage07::ModelOptions options() const {
        stage07::ModelOptions o;
        o.kv_heads = Hk, o.window = window, o.softcap = softcap, o.dropout = dropout;
        return o;
    }
};

/// The cases both tests run: Hq/Hk = 1, 2, 4 (MQA), windows narrower than a tile and wider than
/// N, both bounds, causal as (-1, 0), rows that see no key, tails, Nq != Nk both ways, a negative
/// scale, large logits under the soft cap, bf16 and fp16, d = 32, 64, 128, 256.
inline std::vector<ModelCase> model_cases() {
    const Precision bf16 = Precision::BFloat16, fp16 = Precision::Float16;
    return {
        // grouped-query heads
        {64, bf16, 1, 4, 2, 130, 130, false, Window::full(), 0.0, 0.125, true},   // Hq/Hk = 2, tails
        {128, fp16, 2, 4, 1, 77, 200, true, Window::full(), 0.0, 0.088, true},    // MQA, causal, Nq < Nk
        {128, bf16, 1, 4, 4, 70, 45, false, Window::full(), 0.0, 0.088, false},   // Hq/Hk = 1: the final kernel
        {64, fp16, 1, 4, 1, 150, 60, false, Window::causal(), 0.0, 0.125, true},  // (-1, 0) as causal, Nq > Nk: empty rows
        // sliding windows
        {64, bf16, 1, 2, 2, 200, 200, false, Window{16, 0}, 0.0, 0.125, true},     // narrower than a tile
        {64, fp16, 1, 2, 1, 150, 90, false, Window{20, 7}, 0.0, -0.2, true},       // both bounded, Nq > Nk, scale < 0
        {128, bf16, 1, 1, 1, 190, 190, false, Window{32, -1}, 0.0, 0.088, true},   // left bound only
        {128, fp16, 1, 2, 1, 65, 129, false, Window{500, 400}, 0.0, 0.088, true},  // wider than N, with GQA
        {64, fp16, 1, 2, 2, 100, 70, false, Window{300, 300}, 0.0, 0.125, false},  // wider than N: the final kernel
        {64, bf16, 1, 2, 2, 150, 60, false, Window::causal(), 0.0, 0.125, false},  // (-1, 0): the causal kernel
        {64, bf16, 1, 2, 1, 3, 300, true, Window{70, -1}, 0.0, 0.125, true},       // Nq = 3 at the end of 300 keys
        // the soft cap, and the other head dimensions
        {64, fp16, 1, 4, 2, 100, 140, false, Window{40, 0}, 5.0, 0.5, true},
        {128, bf16, 1, 2, 1, 97, 97, true, Window::full(), 30.0, 0.088, true, InputKind::Large},
        {32, bf16, 1, 2, 1, 129, 70, false, Window{10, 3}, 0.0, 0.17, true},
        {256, fp16, 1, 2, 1, 70, 90, false, Window{20, 20}, 10.0, 0.0625, true},
    };
}

/// Cases with dropout, each a case of the kind model_cases() runs with a drop probability, a seed
/// and an offset: p = 0.1 (runs as 26/256), 0.5 and 0.25, causal, windows, grouped heads, the
/// soft cap, tails, Nq != Nk both ways, rows that see no key, bf16 and fp16, d = 32 to 256, and
/// the batch index in the map (B = 2, 3).
inline std::vector<ModelCase> dropout_model_cases() {
    const Precision bf16 = Precision::BFloat16, fp16 = Precision::Float16;
    const auto dropped = [](ModelCase c, double p, uint64_t seed, uint32_t offset) {
        c.dropout = Dropout{p, seed, offset};
        return c;
    };
    return {
        dropped({64, bf16, 2, 2, 2, 130, 130, false, Window::full(), 0.0, 0.125, true}, 0.1, 42, 0),  // tails, B = 2
        dropped({64, fp16, 1, 4, 2, 97, 150, true, Window::full(), 0.0, 0.125, true}, 0.5, 7, 3),     // causal, GQA, Nq < Nk
        dropped({128, bf16, 3, 2, 1, 150, 60, true, Window::full(), 0.0, 0.088, true}, 0.25, 0x0123456789abcdefull, 77),  // Nq > Nk: empty rows
        dropped({64, bf16, 1, 2, 1, 200, 200, false, Window{40, 0}, 0.0, 0.125, true}, 0.1, 1, 1),   // a window narrower than a tile
        dropped({128, fp16, 1, 2, 2, 90, 170, false, Window{50, 20}, 0.0, -0.088, true}, 0.5, 99, 0),  // both bounds, scale < 0
        dropped({32, bf16, 2, 2, 1, 70, 129, false, Window::full(), 0.0, 0.17, true}, 0.1, 5, 9),
        dropped({256, fp16, 1, 2, 1, 70, 90, true, Window::full(), 10.0, 0.0625, true}, 0.1, 3, 2),  // with the soft cap; Bc = 32
        dropped({64, fp16, 1, 1, 1, 65, 65, false, Window::full(), 20.0, 0.125, true, InputKind::Large}, 0.5, 11, 4),
    };
}

/// The same call as a packed problem of B equal sequences: its (total, H, d) buffers are the BNHD
/// tensors the kernel reads as (B, H, N, d), and its window has the causal flag folded in.
inline VarlenProblem packed_problem(const ModelCase& c) {
    VarlenProblem vp;
    vp.cu_seqlens_q = cu_seqlens_from_lengths(std::vector<int64_t>(size_t(c.B), c.Nq));
    vp.cu_seqlens_k = cu_seqlens_from_lengths(std::vector<int64_t>(size_t(c.B), c.Nk));
    vp.total_q = int64_t(c.B) * c.Nq, vp.total_k = int64_t(c.B) * c.Nk;
    vp.heads_q = c.Hq, vp.heads_k = c.Hk, vp.head_dim = c.d, vp.scale = c.scale;
    vp.window = c.window;
    if (c.causal) vp.window.right = 0;
    vp.softcap = c.softcap;
    vp.dropout = c.dropout;
    return vp;
}

// The naive attention in `prec` with the grouped heads, the window, the soft cap and dropout
// (fa::naive_attention_varlen_emulated()): o in the packed order (total_q, Hq, d), lse (Hq, total_q).
inline EmulatedAttention naive_model_emulated(Precision prec, const VarlenProblem& vp, const Inputs& in) {
    return naive_attention_varlen_emulated(prec, vp, in.q.cview(), in.k.cview(), in.v.cview());
}

// InputStats of the packed inputs (fa::input_stats_varlen()).
inline InputStats packed_stats(const VarlenProblem& vp, const Inputs& in) {
    return input_stats_varlen(vp, in.q.cview(), in.k.cview(), in.v.cview());
}

/// The inputs rounded to the case's precision, in the packed order (total, H, d): what the stage
/// reads (their 16-bit values are exact).
struct RoundedInputs {
    std::vector<float> q;  ///< (total_q, Hq, d)
    std::vector<float> k;  ///< (total_k, Hk, d)
    std::vector<float> v;  ///< (total_k, Hk, d)
};

/// One packed call: `run(rounded inputs, o, lse)` runs the stage, writing o (total_q, Hq, d) and
/// lse (Hq, total_q) (both start as NaN, so an element it forgets to write shows) and returning
/// whether the kernel with stage 10's switches ran, if it can tell (checked against `model`).
/// Checked against the float64 reference by the low-precision rule; rows that see no key must be
/// O = 0 and LSE = -inf exactly, every other LSE finite.
template <class Run>
void check_packed_case(const VarlenProblem& vp, Precision precision, InputKind inputs, uint64_t seed, bool model,
                       Run&& run) {
    const Inputs in = make_varlen_inputs(vp, inputs, seed);
    INFO(to_string(precision) << " " << vp.describe() << " seed " << seed);
    const auto rounded = [&](const HostTensor& t) {
        std::vector<float> r(t.storage.size());
        for (size_t i = 0; i < r.size(); ++i) r[i] = round_to(precision, t.storage[i]);
        return r;
    };
    const RoundedInputs r{rounded(in.q), rounded(in.k), rounded(in.v)};
    const int64_t hq = vp.heads_q, d = vp.head_dim, total_q = vp.total_q;
    std::vector<float> o(size_t(total_q * hq * d), std::numeric_limits<float>::quiet_NaN());
    std::vector<float> lse(size_t(hq * total_q), std::numeric_limits<float>::quiet_NaN());
    const std::optional<bool> ran_model = run(r, o, lse);
    if (ran_model) CHECK(*ran_model == model);

    const VarlenReference ref = reference_attention_varlen(vp, in.q.cview(), in.k.cview(), in.v.cview());
    const EmulatedAttention naive = naive_model_emulated(precision, vp, in);
    const Tolerances tol =
        low_precision_tolerance(packed_stats(vp, in), precision, compare(naive.o, ref.o), compare(naive.lse, ref.lse));
    const Metrics mo = compare(o, ref.o), ml = compare(lse, ref.lse);
    INFO("O: max_abs " << mo.max_abs << " rel_l2 " << mo.rel_l2 << " nonfinite " << mo.nonfinite << " (limits " << tol.o.max_abs
                       << ", " << tol.o.rel_l2 << "); LSE: max_abs " << ml.max_abs << " nonfinite " << ml.nonfinite
                       << " (limit " << tol.lse.max_abs << ")\n" << tol.rule);
    CHECK(passes(mo, tol.o));
    CHECK(passes(ml, tol.lse));

    int64_t empty_rows = 0, wrong = 0;
    for (int64_t h = 0; h < hq; ++h)
        for (int64_t t = 0; t < total_q; ++t) {
            const double want = ref.lse[size_t(h * total_q + t)];
            const float got = lse[size_t(h * total_q + t)];
            if (std::isinf(want)) {
                ++empty_rows;
                wrong += !(std::isinf(got) && got < 0);
                for (int64_t x = 0; x < d; ++x) wrong += o[size_t((t * hq + h) * d + x)] != 0.0f;
            } else {
                wrong += !std::isfinite(got);
            }
        }
    INFO(empty_rows << " rows see no key");
    CHECK(wrong == 0);
}

/// One dense case: `run(case, rounded inputs, o, lse)` runs the stage as check_packed_case()'s
/// `run` does, on the case's B equal sequences (packed_problem()).
template <class Run>
void check_model_case(const ModelCase& c, Run&& run) {
    const VarlenProblem vp = packed_problem(c);
    vp.validate();
    const uint64_t seed = 7000 + uint64_t(c.Nq) * 31 + uint64_t(c.Nk) * 7 + uint64_t(c.d) + uint64_t(c.Hq);
    INFO(c.describe());
    check_packed_case(vp, c.precision, c.inputs, seed, c.model,
                      [&](const RoundedInputs& r, std::vector<float>& o, std::vector<float>& lse) { return run(c, r, o, lse); });
}

/// One packed call of sequences of different lengths, as flash_attn_varlen_func takes it.
struct VarlenCase {
    int d;
    Precision precision;
    std::vector<int64_t> seqlens_q;  ///< queries of each sequence
    std::vector<int64_t> seqlens_k;  ///< keys of each sequence
    int Hq, Hk;
    Window window;  ///< (-1, 0): causal, bottom-right aligned in each sequence
    double softcap;
    double scale;
    int64_t extra_max = 0;  ///< max_seqlen_q and max_seqlen_k given this much above the longest sequences
    Dropout dropout = {};   ///< dropout on P (p = 0: off); the map's b is the sequence's index

    /// The packed problem.
    VarlenProblem problem() const {
        VarlenProblem vp;
        vp.cu_seqlens_q = cu_seqlens_from_lengths(seqlens_q);
        vp.cu_seqlens_k = cu_seqlens_from_lengths(seqlens_k);
        vp.total_q = vp.cu_seqlens_q.back(), vp.total_k = vp.cu_seqlens_k.back();
        vp.heads_q = Hq, vp.heads_k = Hk, vp.head_dim = d, vp.scale = scale;
        vp.window = window, vp.softcap = softcap, vp.dropout = dropout;
        return vp;
    }
};

/// The packed cases: sequences of length 0 and 1 (queries, keys or both), primes, Nq != Nk both
/// ways within one batch, one long sequence among many short ones, Hq/Hk = 1 and 2, causal, a
/// window narrower than a tile, both bounds, no mask at all, the soft cap, a negative scale,
/// longest lengths given larger than needed, bf16 and fp16, d 64 and 128; one batch of equal
/// lengths, whose blocks go head by head.
inline std::vector<VarlenCase> varlen_cases() {
    const Precision bf16 = Precision::BFloat16, fp16 = Precision::Float16;
    return {
        // causal per sequence: empty sequences, a query with no key, Nq > Nk and Nq < Nk
        {64, bf16, {0, 1, 7, 131, 1, 0, 37, 2}, {5, 1, 13, 131, 2, 0, 29, 0}, 4, 2, Window::causal(), 0.0, 0.125},
        // one long sequence among many short ones, MQA, a window narrower than a tile
        {128, fp16, {263, 1, 2, 3, 5, 7, 11, 13, 1}, {263, 3, 2, 1, 5, 17, 11, 13, 1}, 2, 1, Window{40, 0}, 0.0, 0.088},
        // no mask at all, Hq = Hk
        {128, bf16, {67, 0, 130, 1}, {200, 1, 64, 1}, 2, 2, Window::full(), 0.0, 0.088},
        // both bounds, the soft cap, a negative scale, longest lengths larger than needed
        {64, fp16, {97, 1, 61, 0, 19}, {53, 64, 61, 3, 23}, 4, 2, Window{20, 7}, 5.0, -0.3, 50},
        {64, fp16, {29, 131, 3}, {31, 127, 140}, 2, 1, Window::causal(), 0.0, 0.125},
        {128, bf16, {3, 71, 17}, {150, 70, 17}, 2, 1, Window{16, 16}, 30.0, 0.088},
        // equal lengths: the blocks go head by head (the others: entry by entry, heads innermost)
        {64, bf16, {70, 70, 70}, {90, 90, 90}, 4, 2, Window::causal(), 0.0, 0.125},
    };
}

/// Packed cases with dropout: sequences of length 0 and 1, Nq != Nk per sequence (causal rows that
/// see no key), a long sequence among short ones (its b is not 0), grouped heads, windows, the soft
/// cap, p = 0.1, 0.5 and 0.3, bf16 and fp16, d 64 and 128.
inline std::vector<VarlenCase> dropout_varlen_cases() {
    const Precision bf16 = Precision::BFloat16, fp16 = Precision::Float16;
    return {
        {64, bf16, {0, 1, 7, 131, 1, 37, 2}, {5, 1, 13, 131, 2, 29, 0}, 4, 2, Window::causal(), 0.0, 0.125, 0,
         Dropout{0.1, 2024, 0}},
        {128, fp16, {3, 1, 200, 11}, {3, 5, 263, 11}, 2, 1, Window{40, 0}, 0.0, 0.088, 0, Dropout{0.5, 17, 6}},
        {64, fp16, {97, 1, 61, 0, 19}, {53, 64, 61, 3, 23}, 2, 2, Window{20, 7}, 5.0, -0.3, 10, Dropout{0.3, 1u << 31, 1}},
        {128, bf16, {67, 0, 130}, {200, 1, 64}, 2, 2, Window::full(), 0.0, 0.088, 0, Dropout{0.1, 8, 123456}},
    };
}

}  // namespace fa::test
