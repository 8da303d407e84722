/// \file problem.hpp
/// \brief The attention problem every stage solves, and its causal alignment.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "fa/config.hpp"

namespace fa {

/// Blocks of `b` rows that cover `a` rows (the last one possibly partial), for a >= 0 and b > 0.
FA_HD constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// First key index that query row `i` may NOT see, i.e. the visible keys are `[0, end)`.
///
/// Causal attention is bottom-right aligned (FlashAttention >= 2.1): query `i` sees key `j`
/// iff `j <= i + (Nk - Nq)`. Without causality every key is visible. The result is clamped to
/// `[0, Nk]`; 0 means the row sees no key at all (its output is 0 and its LSE is -inf).
FA_HD inline int64_t visible_key_end(int64_t i, int64_t seq_q, int64_t seq_k, bool causal) {
    if (!causal) return seq_k;
    const int64_t end = i + (seq_k - seq_q) + 1;
    return end < 0 ? 0 : (end > seq_k ? seq_k : end);
}

/// The last key block of `bc` keys that visits the query block `i` of `br` rows, or -1 when none
/// does (every row of the block sees no key). Key block j visits i iff (causal) its first key
/// j*Bc is seen by the block's last row (i+1)*Br - 1: j*Bc <= (i+1)*Br - 1 + Nk - Nq. So the key
/// blocks visiting i are 0 .. last_key_block(i): the deterministic backwards (stages 09 and 12)
/// give key block j at query block i the turn last_key_block(i) - j (the last key block adds first).
FA_HD inline int last_key_block(int i, int br, int bc, int seq_q, int seq_k, int k_blocks, bool causal) {
    if (!causal) return k_blocks - 1;
    const int64_t last_key = int64_t(i + 1) * br - 1 + seq_k - seq_q;  // the last key row (i+1)*Br - 1 sees
    if (last_key < 0) return -1;
    const int64_t j = last_key / bc;
    return j < k_blocks - 1 ? int(j) : k_blocks - 1;
}

/// Shape and options of one attention call: `O = softmax(scale * Q K^T [+ causal mask]) V`.
///
/// `q` is `(batch, heads, seq_q, head_dim)`, `k` and `v` are `(batch, heads, seq_k, head_dim)`,
/// `o` matches `q` and `lse` is `(batch, heads, seq_q)`.
struct Problem {
    int64_t batch = 1;              ///< B, independent sequences
    int64_t heads = 1;              ///< H, attention heads per sequence
    int64_t seq_q = 1;              ///< Nq, query rows
    int64_t seq_k = 1;              ///< Nk, key/value rows
    int64_t head_dim = 64;          ///< d, features per head
    std::optional<double> scale;    ///< softmax scale; unset means 1/sqrt(d)
    bool causal = false;            ///< bottom-right aligned causal mask

    /// The scale actually applied to the scores.
    double softmax_scale() const { return scale ? *scale : 1.0 / std::sqrt(double(head_dim)); }
    /// Elements in q or o.
    int64_t q_elems() const { return batch * heads * seq_q * head_dim; }
    /// Elements in k or v.
    int64_t kv_elems() const { return batch * heads * seq_k * head_dim; }
    /// Elements in lse.
    int64_t lse_elems() const { return batch * heads * seq_q; }
    /// Number of (query, key) pairs that are actually visible, summed over all rows of one head.
    int64_t visible_pairs_per_head() const;
    /// Throws InputError naming the first field out of range (all sizes >= 1, the scale
    /// finite, element counts that fit in 64-bit byte offsets).
    void validate() const;
    /// One line such as `B=1 H=2 Nq=128 Nk=256 d=64 scale=0.125 causal`.
    std::string describe() const;
};

}  // namespace fa
