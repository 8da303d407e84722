/// \file varlen.hpp
/// \brief What stage 10 adds to the problem: packed batches of sequences of different lengths
/// (`cu_seqlens`), grouped-query heads, sliding windows, a soft cap on the scores and dropout.
///
/// Real models do not call attention on a tidy \f$(B, H, N, d)\f$ block. A batch holds sequences
/// of different lengths, stored back to back without padding (flash-attn's
/// `flash_attn_varlen_func`): q is \f$(\text{total}_q, H_q, d)\f$ and sequence \f$b\f$ owns rows
/// \f$[\text{cu\_seqlens\_q}[b], \text{cu\_seqlens\_q}[b+1])\f$. Several query heads share one
/// key/value head (grouped-query attention, \f$H_k\f$ dividing \f$H_q\f$; multi-query when
/// \f$H_k = 1\f$). A query may see only a window of keys around its diagonal (local attention),
/// its scores may be squashed by \f$c \tanh(s/c)\f$ (Gemma 2's soft cap), and training drops
/// entries of \f$P\f$ at random (fa/philox.hpp).
///
/// Every rule of COURSE.md holds per sequence: the diagonal is bottom-right aligned within each
/// sequence, and a query row that sees no key gets \f$O = 0\f$, \f$\text{LSE} = -\infty\f$ and zero
/// gradients.
///
/// Packed tensors are ordinary views (fa/tensor.hpp) with one batch entry: a \f$(\text{total}, H,
/// d)\f$ buffer is the View4 of shape \f$(1, H, \text{total}, d)\f$ in the BNHD layout
/// (make_packed_view(), or `HostTensor(1, H, total, d, Layout::BNHD)`), so the token axis is the
/// view's row axis and sequence \f$b\f$ is a range of rows.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fa/config.hpp"
#include "fa/inputs.hpp"
#include "fa/problem.hpp"
#include "fa/tensor.hpp"

namespace fa {

/// A sliding window of keys around each query's diagonal, FlashAttention's `window_size = (left,
/// right)`: query \f$i\f$ of a sequence with \f$N_q\f$ queries and \f$N_k\f$ keys has its diagonal at
/// key \f$\delta_i = i + N_k - N_q\f$ (bottom-right aligned) and sees key \f$j\f$ iff
/// \f$\delta_i - \text{left} \le j \le \delta_i + \text{right}\f$, a bound of \f$-1\f$ dropping that
/// side's limit. \f$(-1, -1)\f$ is full attention and \f$(-1, 0)\f$ is causal attention exactly.
struct Window {
    int64_t left = -1;   ///< keys before the diagonal a query may see; -1: all of them
    int64_t right = -1;  ///< keys after the diagonal a query may see; -1: all of them, 0: causal

    /// Full attention, \f$(-1, -1)\f$.
    FA_HD static constexpr Window full() { return {-1, -1}; }
    /// Causal attention, bottom-right aligned: \f$(-1, 0)\f$.
    FA_HD static constexpr Window causal() { return {-1, 0}; }
    /// True for \f$(-1, -1)\f$: no key is masked.
    FA_HD constexpr bool is_full() const { return left < 0 && right < 0; }
};

/// The keys \f$[\text{begin}, \text{end})\f$ one query row may see; empty when end <= begin.
struct KeyRange {
    int64_t begin = 0;  ///< first visible key
    int64_t end = 0;    ///< one past the last visible key

    /// No visible key: the row's output is 0 and its LSE is \f$-\infty\f$.
    FA_HD bool empty() const { return end <= begin; }
    /// Number of visible keys (0 when empty).
    FA_HD int64_t size() const { return end > begin ? end - begin : 0; }
};

/// The keys query row `i` of a sequence with `seq_q` queries and `seq_k` keys sees through
/// `window` (Window): \f$[\max(0, \delta_i - \text{left}),\; \min(N_k, \delta_i + \text{right} + 1))\f$
/// with \f$\delta_i = i + N_k - N_q\f$, each bound dropped when it is -1. With Window::causal() the
/// end is visible_key_end() with `causal` set.
FA_HD inline KeyRange visible_key_range(int64_t i, int64_t seq_q, int64_t seq_k, Window window) {
    const int64_t diagonal = i + (seq_k - seq_q);  // the key on query i's diagonal
    int64_t begin = window.left < 0 ? 0 : diagonal - window.left;
    int64_t end = window.right < 0 ? seq_k : diagonal + window.right + 1;
    begin = begin < 0 ? 0 : (begin > seq_k ? seq_k : begin);
    end = end < 0 ? 0 : (end > seq_k ? seq_k : end);
    return {begin, end < begin ? begin : end};
}

/// Dropout on \f$P\f$: each entry is dropped with probability \f$p'\f$, `p` rounded to a multiple of
/// 1/256 (one random byte per entry: dropout_effective_p()), and the survivors are scaled by
/// \f$1/(1-p')\f$; which entries survive is fixed by (`seed`, `offset`) through fa/philox.hpp.
struct Dropout {
    double p = 0.0;       ///< probability of dropping an entry, in [0, 1); 0 turns dropout off
    uint64_t seed = 0;    ///< the Philox key
    uint32_t offset = 0;  ///< Philox counter word 3: calls that share a seed differ by it

    /// True when entries are dropped at all (`p > 0`).
    bool enabled() const { return p > 0.0; }
    /// Throws InputError naming `--dropout` and what is allowed: p outside [0, 1) or of 255.5/256
    /// or more (it would drop every entry: fa/philox.hpp), or (with dropout on) more than
    /// \f$2^{16}\f$ `sequences` (batch entries) or query `heads` for the Philox counter.
    void validate(int64_t sequences, int64_t heads) const;
};

/// Shape and options of one packed attention call, as `flash_attn_varlen_func` takes them.
///
/// Sequence \f$b\f$ has \f$N_q^{(b)}\f$ = cu_seqlens_q[b+1] - cu_seqlens_q[b] queries and
/// \f$N_k^{(b)}\f$ keys; q is \f$(\text{total}_q, H_q, d)\f$, k and v are \f$(\text{total}_k, H_k,
/// d)\f$, o matches q and the LSE is \f$(H_q, \text{total}_q)\f$. Query head \f$h\f$ reads key/value
/// head \f$\lfloor h / (H_q/H_k) \rfloor\f$ (kv_head()). The score is
/// \f$s = \text{scale}\; q \cdot k\f$, then \f$s \leftarrow c \tanh(s / c)\f$ when the soft cap
/// \f$c\f$ is positive, then masked by the window; the LSE is that of these scores, before dropout.
struct VarlenProblem {
    std::vector<int32_t> cu_seqlens_q{0, 1};  ///< B+1 nondecreasing prefix sums from 0 to total_q
    std::vector<int32_t> cu_seqlens_k{0, 1};  ///< B+1 nondecreasing prefix sums from 0 to total_k
    int64_t total_q = 1;                      ///< query rows in the packed q
    int64_t total_k = 1;                      ///< key/value rows in the packed k and v
    int64_t heads_q = 1;                      ///< \f$H_q\f$, query heads
    int64_t heads_k = 1;                      ///< \f$H_k\f$, key/value heads; divides \f$H_q\f$
    int64_t head_dim = 64;                    ///< d, features per head
    std::optional<double> scale;              ///< softmax scale; unset means 1/sqrt(d)
    Window window;                            ///< visible keys around each diagonal; causal is (-1, 0)
    double softcap = 0.0;                     ///< \f$c\f$ in \f$s \leftarrow c\tanh(s/c)\f$; 0: off
    Dropout dropout;                          ///< dropout on P; off by default

    /// B, the number of sequences.
    int64_t batch() const { return int64_t(cu_seqlens_q.size()) - 1; }
    /// \f$N_q^{(b)}\f$, queries of sequence `b`.
    int64_t seq_q(int64_t b) const { return int64_t(cu_seqlens_q[size_t(b) + 1]) - cu_seqlens_q[size_t(b)]; }
    /// \f$N_k^{(b)}\f$, keys of sequence `b`.
    int64_t seq_k(int64_t b) const { return int64_t(cu_seqlens_k[size_t(b) + 1]) - cu_seqlens_k[size_t(b)]; }
    /// The longest query sequence (`max_seqlen_q` of flash-attn); 0 when every sequence is empty.
    int64_t max_seq_q() const;
    /// The longest key sequence (`max_seqlen_k`).
    int64_t max_seq_k() const;
    /// Whether two sequences differ in length (queries or keys): the kernels then order a packed
    /// call's blocks entry by entry, heads innermost, so that every head's longest tiles start first.
    bool lengths_differ() const {
        for (int64_t b = 1; b < batch(); ++b) {
            if (seq_q(b) != seq_q(0) || seq_k(b) != seq_k(0)) return true;
        }
        return false;
    }
    /// Query heads per key/value head, \f$H_q / H_k\f$.
    int64_t group_size() const { return heads_q / heads_k; }
    /// The key/value head query head `h` reads.
    int64_t kv_head(int64_t h) const { return h / group_size(); }
    /// The scale actually applied to the scores.
    double softmax_scale() const;
    /// Visible (query, key) pairs of one query head, summed over the sequences: the real work,
    /// \f$4 d\f$ FLOPs each in the forward.
    int64_t visible_pairs_per_head() const;
    /// Throws InputError naming the first thing wrong and what is allowed: heads or head_dim
    /// below 1, \f$H_q\f$ not a multiple of \f$H_k\f$, cu_seqlens of the wrong size, not starting at
    /// 0, decreasing or not ending at the totals, a window bound below -1, a soft cap that is
    /// negative or not finite, a dropout probability outside [0, 1) or of 255.5/256 or more (it
    /// would drop every entry: fa/philox.hpp), or (with dropout) more than \f$2^{16}\f$ sequences or
    /// query heads for the Philox counter.
    void validate() const;
    /// One line such as `B=3 Hq=8 Hk=2 seqlens_q=5,0,17 seqlens_k=5,3,20 d=64 scale=0.125
    /// window=(-1,0) softcap=30 dropout=0.1 (runs as 26/256) seed=7 offset=0`.
    std::string describe() const;
};

/// The packed problem that equals `problem` (B sequences of \f$N_q\f$ and \f$N_k\f$ rows, \f$H_q =
/// H_k = H\f$, causal as the window \f$(-1, 0)\f$, no soft cap, no dropout). Its packed tensors
/// are the BNHD tensors of `problem` read as \f$(B N, H, d)\f$.
VarlenProblem varlen_from(const Problem& problem);

/// cu_seqlens of sequences of `lengths`: \f$0, \ell_0, \ell_0 + \ell_1, \dots\f$ (B+1 entries).
/// Throws InputError for a negative length or a total beyond int32.
std::vector<int32_t> cu_seqlens_from_lengths(const std::vector<int64_t>& lengths);

/// A view of a packed \f$(\text{total}, H, d)\f$ buffer: shape \f$(1, H, \text{total}, d)\f$, the
/// BNHD strides (token-major, then head, then feature).
template <class T>
View4<T> make_packed_view(T* data, int64_t total, int64_t heads, int64_t head_dim) {
    return make_view(data, 1, heads, total, head_dim, Layout::BNHD);
}

/// Seeded packed q \f$(1, H_q, \text{total}_q, d)\f$ and k, v \f$(1, H_k, \text{total}_k, d)\f$, as
/// make_inputs() draws them (never zeros; InputKind::Large multiplies q and k). Stored BNHD, i.e.
/// as packed \f$(\text{total}, H, d)\f$ buffers.
Inputs make_varlen_inputs(const VarlenProblem& problem, InputKind kind, uint64_t seed);

/// Seeded packed dO, shaped like o \f$(1, H_q, \text{total}_q, d)\f$, from a stream distinct from
/// those of make_varlen_inputs().
HostTensor make_varlen_output_gradient(const VarlenProblem& problem, uint64_t seed);

}  // namespace fa
