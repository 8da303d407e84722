/// \file stages/13_decode/launch.hpp
/// \brief The kernels' arguments from a DecodeProblem and its cache: host code that decode.cu and
/// the emulated test share, so the test launches the kernels exactly as the stage does.
#pragma once

#include <cmath>
#include <cstdint>

#include "decode_problem.hpp"
#include "args.hpp"

namespace fa::stage13 {

/// How the cache is held.
enum class CacheKind {
    Contiguous,  ///< (B, capacity, Hk, d) per K and V
    Paged,       ///< a pool of pages and a block table per sequence
};

/// Where one call's tensors are, in device memory (host memory on the emulator), in T.
template <class T>
struct CallPointers {
    const T* q = nullptr;                    ///< (B, seq_q, Hq, d)
    const T* k_new = nullptr;                ///< (B, seq_q, Hk, d); null without append
    const T* v_new = nullptr;                ///< like k_new
    T* k_cache = nullptr;                    ///< contiguous (B, capacity, Hk, d) or the pool (num_pages, page_size, Hk, d)
    T* v_cache = nullptr;                    ///< like k_cache
    const int32_t* block_table = nullptr;    ///< (B, pages_per_seq); used with CacheKind::Paged only
    const int32_t* cache_seqlens = nullptr;  ///< (B,)
    T* o = nullptr;                          ///< (B, seq_q, Hq, d)
    float* lse = nullptr;                    ///< (B, Hq, seq_q)
    float* o_partial = nullptr;              ///< partial_o_floats(); unused with one split
    float* lse_partial = nullptr;            ///< partial_lse_floats()
};

/// Floats of the splits' partial O: (splits, B, Hq, seq_q, d).
inline int64_t partial_o_floats(const DecodeProblem& p, int splits) {
    return int64_t(splits) * p.batch() * p.heads_q * p.seq_q * p.head_dim;
}
/// Floats of the splits' partial LSE: (splits, B, Hq, seq_q).
inline int64_t partial_lse_floats(const DecodeProblem& p, int splits) { return int64_t(splits) * p.batch() * p.heads_q * p.seq_q; }

/// The kernels' arguments. The problem and the geometry must have passed validate().
template <class T>
DecodeArgs<T> make_decode_args(const DecodeProblem& p, const CacheGeometry& g, CacheKind kind, int splits, const CallPointers<T>& c) {
    DecodeArgs<T> a;
    a.q = c.q, a.k_new = c.k_new, a.v_new = c.v_new, a.k_cache = c.k_cache, a.v_cache = c.v_cache;
    a.block_table = kind == CacheKind::Paged ? c.block_table : nullptr;
    a.cache_seqlens = c.cache_seqlens;
    a.o = c.o, a.lse = c.lse, a.o_partial = c.o_partial, a.lse_partial = c.lse_partial;
    a.batch = int(p.batch()), a.seq_q = int(p.seq_q), a.heads_q = int(p.heads_q), a.heads_k = int(p.heads_k);
    a.group = int(p.group()), a.rows = int(p.rows_per_kv_head()), a.row_tiles = int(p.row_tiles());
    a.splits = splits;
    a.append_rows = p.append ? int(p.seq_q) : 0;
    int shift = 0;
    while ((int64_t(1) << shift) < g.page_size) ++shift;
    a.page_shift = shift;
    a.pages_per_seq = int(g.pages_per_seq);
    a.seq_stride = g.capacity() * p.heads_k * p.head_dim;
    a.page_stride = g.page_size * p.heads_k * p.head_dim;
    a.scale_log2 = float(p.softmax_scale() * 1.4426950408889634);
    return a;
}

}  // namespace fa::stage13
