/// \file stages/07_pipelined_fused_kernel/model_options.hpp
/// \brief What a real model's attention call adds to fa::Problem (stage 10): grouped-query
/// heads, a sliding window, a soft cap on the scores and dropout, as stage 07's kernel takes them.
///
/// These are fa/varlen.hpp's definitions (Window, KeyRange, visible_key_range(), the soft cap and
/// the Dropout of VarlenProblem) for a dense call: q is (B, Hq, Nq, d), k and v are (B, Hk, Nk, d), o and lse
/// follow q. Hk divides Hq and query head h reads K/V head h / (Hq/Hk). A packed call (a
/// VarlenProblem with its longest lengths, resolve_varlen()) resolves to the same options. Host
/// code only.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>

#include "fa/error.hpp"
#include "fa/problem.hpp"
#include "fa/varlen.hpp"

namespace fa::stage07 {

/// Grouped-query heads, a window, a soft cap and dropout for one call. The default is the plain call.
struct ModelOptions {
    int64_t kv_heads = 0;  ///< Hk, key/value heads, dividing problem.heads (Hq); 0: Hk = Hq
    /// Keys each query sees around its diagonal, bottom-right aligned; -1 unbounded. With
    /// problem.causal the right bound is 0, whatever it says here (flash-attn's causal=True).
    Window window = Window::full();
    double softcap = 0.0;  ///< c in s <- c tanh(s / c), applied to the scaled scores; 0: off
    /// Dropout on P (fa/philox.hpp): p (0: off), the seed and the offset; sequence b of the map is
    /// the batch entry.
    Dropout dropout;
};

/// ModelOptions checked against a problem, in the form the kernel takes them.
struct ResolvedOptions {
    int kv_group = 1;  ///< Hq / Hk
    /// The window's bounds; a bound that no row reaches past (left >= Nk - 1, right >= Nq - 1) is
    /// -1, so a window wider than the problem is no window at all.
    int left = -1;
    int right = -1;  ///< see left
    double softcap = 0.0;  ///< c; 0: off
    Dropout dropout;       ///< p (0: off), seed, offset

    /// A band of keys narrower than the full or causal window: a left bound, or a right one past
    /// the diagonal.
    bool has_band() const { return left >= 0 || right > 0; }
    /// No grouping, no cap, no dropout, and the window full or causal: the road's final kernel runs
    /// as it is.
    bool plain() const { return kv_group == 1 && softcap == 0.0 && !dropout.enabled() && !has_band(); }
};

/// Checks `options` against `problem` (InputError naming what is wrong and what is allowed) and
/// resolves them: Hq / Hk, the causal flag folded into the window, bounds past the problem
/// dropped; dropout as Dropout::validate() checks it (p in [0, 1) and below 255.5/256, B and Hq at
/// most 2^16 when it is on).
inline ResolvedOptions resolve_options(const Problem& problem, const ModelOptions& options) {
    ResolvedOptions r;
    const int64_t hq = problem.heads, hk = options.kv_heads == 0 ? hq : options.kv_heads;
    if (hk < 1) throw InputError("--kv-heads " + std::to_string(options.kv_heads) + " must be at least 1");
    if (hq % hk != 0) {
        throw InputError("--heads " + std::to_string(hq) + " is not a multiple of --kv-heads " + std::to_string(hk) +
                         ": each key/value head serves the same number of query heads (Hk must divide Hq)");
    }
    r.kv_group = int(hq / hk);
    Window w = options.window;
    if (w.left < -1 || w.right < -1) {
        throw InputError("--window " + std::to_string(w.left) + "," + std::to_string(w.right) +
                         ": each bound is a number of keys (0 or more) or -1 for unbounded");
    }
    if (problem.causal) w.right = 0;
    r.left = w.left < 0 || w.left >= problem.seq_k - 1 ? -1 : int(w.left);
    r.right = w.right < 0 || w.right >= problem.seq_q - 1 ? -1 : int(w.right);
    if (!(options.softcap >= 0.0) || !std::isfinite(options.softcap)) {
        throw InputError("--softcap " + std::to_string(options.softcap) + " must be finite and 0 (off) or more");
    }
    r.softcap = options.softcap;
    options.dropout.validate(problem.batch, problem.heads);
    r.dropout = options.dropout;
    return r;
}

/// The longest sequences of a packed call, as flash_attn_varlen_func takes them (`max_seqlen_q`,
/// `max_seqlen_k`): every sequence must fit in them, and the kernel's options are resolved
/// against them.
struct MaxSeqlens {
    int64_t q = 0;  ///< no sequence has more queries
    int64_t k = 0;  ///< no sequence has more keys
};

/// The dense problem a packed call's options are resolved against: one batch entry, Hq heads,
/// the longest lengths, the scale; never causal (a packed call says causal as the window (-1, 0)).
inline Problem varlen_bounds_problem(const VarlenProblem& vp, const MaxSeqlens& max) {
    Problem p;
    p.batch = 1, p.heads = vp.heads_q, p.seq_q = max.q, p.seq_k = max.k, p.head_dim = vp.head_dim;
    p.scale = vp.scale, p.causal = false;
    return p;
}

/// Checks a packed call (InputError naming what is wrong and what is allowed): the problem itself
/// (VarlenProblem::validate(): cu_seqlens of B+1 entries starting at 0, nondecreasing, ending at
/// total_q and total_k; Hk dividing Hq; the window, the soft cap and dropout, whose b is the
/// sequence's index), and every sequence within the longest lengths `max`. Returns the options the
/// kernel takes, resolved against the longest lengths: a window bound no sequence reaches past is -1.
inline ResolvedOptions resolve_varlen(const VarlenProblem& vp, const MaxSeqlens& max) {
    vp.validate();
    if (max.q < 0 || max.k < 0 || max.q > INT32_MAX || max.k > INT32_MAX) {
        throw InputError("max_seqlen_q " + std::to_string(max.q) + " and max_seqlen_k " + std::to_string(max.k) +
                         " must be between 0 and 2^31 - 1");
    }
    for (int64_t b = 0; b < vp.batch(); ++b) {
        for (const auto& [name, len, most] : {std::tuple{"q", vp.seq_q(b), max.q}, std::tuple{"k", vp.seq_k(b), max.k}}) {
            if (len > most) {
                throw InputError(std::string("cu_seqlens_") + name + " gives sequence " + std::to_string(b) + " length " +
                                 std::to_string(len) + ", more than max_seqlen_" + name + " = " + std::to_string(most) +
                                 ": the longest length must bound every sequence");
            }
        }
    }
    ModelOptions o;
    o.kv_heads = vp.heads_k, o.window = vp.window, o.softcap = vp.softcap, o.dropout = vp.dropout;
    return resolve_options(varlen_bounds_problem(vp, max), o);
}

}  // namespace fa::stage07
