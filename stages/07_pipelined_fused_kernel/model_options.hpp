/// \file stages/07_pipelined_fused_kernel/model_options.hpp
/// \brief What a real model's attention call adds to fa::Problem (stage 10): grouped-query
/// heads, a sliding window and a soft cap on the scores, as stage 07's kernel takes them.
///
/// These are fa/varlen.hpp's definitions (Window, KeyRange, visible_key_range(), the soft cap of
/// VarlenProblem) for a dense call: q is (B, Hq, Nq, d), k and v are (B, Hk, Nk, d), o and lse
/// follow q. Hk divides Hq and query head h reads K/V head h / (Hq/Hk). Host code only.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "fa/error.hpp"
#include "fa/problem.hpp"
#include "fa/varlen.hpp"

namespace fa::stage07 {

/// Grouped-query heads, a window and a soft cap for one call. The default is the plain call.
struct ModelOptions {
    int64_t kv_heads = 0;  ///< Hk, key/value heads, dividing problem.heads (Hq); 0: Hk = Hq
    /// Keys each query sees around its diagonal, bottom-right aligned; -1 unbounded. With
    /// problem.causal the right bound is 0, whatever it says here (flash-attn's causal=True).
    Window window = Window::full();
    double softcap = 0.0;  ///< c in s <- c tanh(s / c), applied to the scaled scores; 0: off
};

/// ModelOptions checked against a problem, in the form the kernel takes them.
struct ResolvedOptions {
    int kv_group = 1;  ///< Hq / Hk
    /// The window's bounds; a bound that no row reaches past (left >= Nk - 1, right >= Nq - 1) is
    /// -1, so a window wider than the problem is no window at all.
    int left = -1;
    int right = -1;  ///< see left
    double softcap = 0.0;  ///< c; 0: off

    /// No grouping, no cap, and the window full or causal: the road's final kernel runs as it is.
    bool plain() const { return kv_group == 1 && softcap == 0.0 && left < 0 && right <= 0; }
};

/// Checks `options` against `problem` (InputError naming what is wrong and what is allowed) and
/// resolves them: Hq / Hk, the causal flag folded into the window, bounds past the problem
/// dropped.
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
    return r;
}

}  // namespace fa::stage07
