/// \file stages/13_decode/decode_problem.hpp
/// \brief Stage 13's host half: a decoding call over a KV cache (the problem, the cache held
/// contiguously or in pages, the inputs), every refusal, the rule that picks the number of KV
/// splits, and the float64 reference per sequence. Plain C++: built and tested without CUDA.
///
/// A decoding step, as an inference server runs it, is flash_attn_with_kvcache's call: each of B
/// sequences has `cache_seqlens[b]` keys and values already cached; it brings `seq_q` new query
/// rows (1 for plain decoding, a few for a speculative step) and, with `append`, their own K and V,
/// which are written into the cache in place, at positions `cache_seqlens[b] ..`, before attention.
/// The new rows then attend causally, bottom-right aligned: new row i sees every cached key and new
/// keys 0..i. Without `append` the cache already holds the rows' keys (`cache_seqlens[b]` counts
/// them) and the same bottom-right alignment applies; a sequence with no keys gives O = 0 and
/// LSE = -inf.
///
/// Layouts (flash_attn_with_kvcache's): q and o (B, seq_q, Hq, d); the new k, v (B, seq_q, Hk, d);
/// the LSE (B, Hq, seq_q), float32. The cache is either
/// - contiguous: k_cache, v_cache (B, capacity, Hk, d), sequence b's key j at row j of entry b; or
/// - paged: a pool k_pool, v_pool (num_pages, page_size, Hk, d) and a block table (B,
///   pages_per_seq) of int32 page numbers: key j of sequence b lives in page block_table[b][j /
///   page_size], row j % page_size. Pages of one sequence sit anywhere in the pool.
///
/// Both hold the same capacity per sequence, pages_per_seq x page_size keys, so one problem runs
/// in either and must give the same bits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fa/precision.hpp"
#include "fa/reference.hpp"
#include "fa/reference_ext.hpp"
#include "fa/tolerance.hpp"
#include "fa/varlen.hpp"

namespace fa::stage13 {

/// \name Limits of stage 13
///@{
inline constexpr int64_t kMaxSeqQ = 16;        ///< new rows per sequence and call (a speculative step)
inline constexpr int64_t kMinPageSize = 16;    ///< smallest page, in keys
inline constexpr int64_t kMaxPageSize = 512;   ///< largest page, in keys
inline constexpr int kKeysPerTile = 64;        ///< Bc: keys of one K/V tile of the split kernel
inline constexpr int kRowsPerTile = 16;        ///< rows of one tile: (new row, query head) pairs of one K/V head
inline constexpr int kMaxSplits = 128;         ///< most splits of one sequence's keys
inline constexpr int kMinTilesPerSplit = 4;    ///< a split reads at least this many tiles (256 keys)
///@}

/// The head dimensions the kernels are built for.
const std::vector<int>& supported_head_dims();

/// One decoding call: B sequences, their cached lengths, the new rows and the heads.
struct DecodeProblem {
    std::vector<int64_t> cache_seqlens{1000};  ///< keys cached per sequence before the call (0 allowed)
    int64_t seq_q = 1;        ///< new query rows per sequence, 1 to kMaxSeqQ, causal among themselves
    int64_t heads_q = 32;     ///< Hq, query heads
    int64_t heads_k = 8;      ///< Hk, key/value heads, dividing Hq (1: multi-query)
    int64_t head_dim = 128;   ///< d
    std::optional<double> scale;  ///< softmax scale; unset: 1/sqrt(d)
    bool append = true;       ///< the new rows' K and V are written into the cache first

    /// B.
    int64_t batch() const { return int64_t(cache_seqlens.size()); }
    /// G = Hq / Hk, query heads per K/V head.
    int64_t group() const { return heads_q / heads_k; }
    /// Keys sequence `b` attends to: its cached ones, plus the new ones with `append`.
    int64_t seq_k(int64_t b) const { return cache_seqlens[size_t(b)] + (append ? seq_q : 0); }
    /// The longest seq_k().
    int64_t max_seq_k() const;
    /// Sum of seq_k() over the batch.
    int64_t total_keys() const;
    /// Rows of one K/V head's work: seq_q x G (new row, query head) pairs.
    int64_t rows_per_kv_head() const { return seq_q * group(); }
    /// Tiles of kRowsPerTile rows that hold them: each reads the K/V head's keys once.
    int64_t row_tiles() const { return ceil_div(rows_per_kv_head(), kRowsPerTile); }
    /// The scale applied to the scores.
    double softmax_scale() const;
    /// Throws InputError naming the option and what is allowed: no sequence, a negative length,
    /// seq_q outside 1..16, heads below 1, Hq not a multiple of Hk, d not supported, a scale that is
    /// not finite, a total beyond int32 keys.
    void validate() const;
    /// One line: `B=4 seq_q=1 Hq=32 Hk=8 (G=4) d=128 cache_seqlens=777,0,1,4096 append scale=0.0884`.
    std::string describe() const;
    /// The same attention as a packed call of stage 10's reference: sequence b's seq_q queries
    /// against its seq_k(b) keys, causal (window (-1, 0)), the grouped heads.
    VarlenProblem varlen() const;
    /// Bytes of K and V the attention reads at `bytes_per_element`: every key of every sequence
    /// once per K/V head (what the split kernel reads when row_tiles() is 1).
    double kv_bytes(int bytes_per_element) const;
};

/// The problem of B = cache_seqlens.size() sequences with `seq_q` new rows each, `heads_q` query and
/// `heads_k` key/value heads of dimension `head_dim`, the new rows appended or not, at `scale`
/// (unset: 1/sqrt(d)); validate() checked, so a problem it returns is one the stage runs.
DecodeProblem make_decode_problem(std::vector<int64_t> cache_seqlens, int64_t seq_q, int64_t heads_q, int64_t heads_k,
                                  int64_t head_dim, bool append, std::optional<double> scale = std::nullopt);

/// Where a sequence's keys live. Contiguous and paged caches hold the same capacity
/// (pages_per_seq x page_size keys per sequence), so one problem fits both.
struct CacheGeometry {
    int64_t page_size = 64;      ///< keys per page, a power of two from 16 to 512
    int64_t pages_per_seq = 1;   ///< entries of each block table row
    int64_t num_pages = 1;       ///< pages in the pool
    /// (B, pages_per_seq) page numbers, row major; -1 for an entry no key of the sequence reaches
    std::vector<int32_t> block_table;

    /// Keys one sequence can hold.
    int64_t capacity() const { return pages_per_seq * page_size; }
    /// Entry (b, j) of the block table.
    int32_t page(int64_t b, int64_t j) const { return block_table[size_t(b * pages_per_seq + j)]; }
    /// Throws InputError for a page size not allowed, a table of the wrong size, a sequence longer
    /// than its table (seq_k(b) > capacity()), an entry a key reaches that is outside the pool
    /// [0, num_pages), or (with append, which writes pages) one page reached by two entries.
    /// Entries past a sequence's last key are not read and may hold anything (-1 by convention).
    void validate(const DecodeProblem& problem) const;
    /// One line: `page 64 keys, 75 pages in the pool, block tables of 64 entries`.
    std::string describe() const;
};

/// Throws InputError unless `page_size` is a power of two from 16 to 512.
void check_page_size(int64_t page_size);

/// A pool with just the pages the sequences need (at least one) and `spare_pages` more, the
/// pages of all sequences in one seeded random order (a server's pool after many requests came
/// and went), block tables of ceil(max seq_k / page_size) entries (at least 1), -1 past each
/// sequence's last page. Checks the page size first.
CacheGeometry make_paged_geometry(const DecodeProblem& problem, int64_t page_size, uint64_t seed, int64_t spare_pages = 1);

/// The geometry of an explicit block table: `rows` one per sequence, `num_pages` in the pool;
/// pages_per_seq is the longest row (shorter rows padded with -1). validate() decides.
CacheGeometry geometry_from_table(const std::vector<std::vector<int32_t>>& rows, int64_t page_size, int64_t num_pages);

/// Parses `--block-table` text: rows separated by '/', entries by ',' ("3,0/2,1,5"; a '/' needs no quoting in a shell or a CMake list); each entry a
/// whole number (from -1). InputError naming the option and the bad item.
std::vector<std::vector<int32_t>> parse_block_table(const std::string& text);

/// Parses a comma-separated list of lengths (each from 0 to 2^31 - 1); InputError naming `option`.
std::vector<int64_t> parse_lengths(const std::string& text, const std::string& option);

/// A decoding call's inputs in float32, each value already rounded to the call's 16-bit type (the
/// values the kernels read, so the reference sees them too).
struct DecodeInputs {
    std::vector<float> q;        ///< (B, seq_q, Hq, d)
    std::vector<float> k_new;    ///< (B, seq_q, Hk, d); empty without append
    std::vector<float> v_new;    ///< (B, seq_q, Hk, d); empty without append
    /// The cache before the call, contiguous (B, capacity, Hk, d): the first cache_seqlens[b] rows
    /// of entry b hold keys, the rest NaN (a kernel that reads a row it should not shows it)
    std::vector<float> k_cache;
    std::vector<float> v_cache;  ///< like k_cache
};

/// Seeded standard normal inputs (q times `q_scale`), rounded to `precision`.
DecodeInputs make_decode_inputs(const DecodeProblem& problem, const CacheGeometry& geometry, Precision precision,
                                uint64_t seed, double q_scale = 1.0);

/// The contiguous cache (B, capacity, Hk, d) after the call: `cache` with the new rows written
/// at cache_seqlens[b] .. (the append), what the kernels leave in the cache.
std::vector<float> append_on_host(const DecodeProblem& problem, const CacheGeometry& geometry,
                                  const std::vector<float>& cache, const std::vector<float>& rows);

/// The paged pool (num_pages, page_size, Hk, d) that holds the contiguous `cache` through the
/// block tables; pages (and rows) no key reaches hold `fill`.
std::vector<float> to_paged(const DecodeProblem& problem, const CacheGeometry& geometry, const std::vector<float>& cache,
                            float fill);

/// The contiguous cache (B, capacity, Hk, d) a paged `pool` holds (rows past seq_k(b): NaN).
std::vector<float> from_paged(const DecodeProblem& problem, const CacheGeometry& geometry, const std::vector<float>& pool);

/// The contiguous cache (B, capacity, Hk, d) `cache` with the rows past each sequence's keys
/// (rows seq_k(b) .. capacity) set to NaN: the rows a call must leave as the append makes them,
/// the rest free to hold anything.
std::vector<float> reached_rows(const DecodeProblem& problem, const CacheGeometry& geometry, std::vector<float> cache);

/// True when `x` and `y` hold the same bits element by element, a NaN equal to any NaN (the rows
/// reached_rows() blanks, the cache rows no key reaches): paged and contiguous runs of one call
/// must give the same bits.
bool same_bits(const std::vector<float>& x, const std::vector<float>& y);

/// The float64 reference and the naive 16-bit baseline of one call, in the call's orders:
/// o (B, seq_q, Hq, d), lse (B, Hq, seq_q).
struct DecodeReference {
    std::vector<double> o;    ///< float64 O
    std::vector<double> lse;  ///< float64 LSE; -inf for rows that see no key
    EmulatedAttention naive;  ///< the same attention computed naively in the 16-bit type
    InputStats stats;         ///< what the tolerance rule reads from the inputs
};

/// stage 10's packed reference (fa/reference_ext.hpp) on the keys of each sequence after the
/// append, per sequence, with the grouped heads, and its naive emulation in `precision`.
DecodeReference reference_decode(const DecodeProblem& problem, const CacheGeometry& geometry, const DecodeInputs& in,
                                 Precision precision);

/// The course's low-precision rule (fa/tolerance.hpp) for `ref`.
Tolerances decode_tolerance(const DecodeReference& ref, Precision precision);

/// How many splits the keys of each sequence are cut into, and why.
struct SplitChoice {
    int splits = 1;        ///< thread blocks per (sequence, K/V head, row tile)
    int64_t blocks = 0;    ///< blocks of the split kernel: B x Hk x row tiles x splits
    double wave_fill = 0;  ///< blocks / (whole waves x slots): how full the last wave is
    std::string why;       ///< the rule with its numbers, for the report
};

/// The rule (the lesson derives it). Without splitting the grid has `base` = B x Hk x row tiles
/// blocks; the GPU runs `slots` = SMs x blocks per SM of them at once. Each split must read at
/// least kMinTilesPerSplit tiles of the longest sequence (below that the combine's traffic and a
/// block's start outweigh what it adds), which caps n at n_max. For every n from 1 to n_max the
/// last wave is f(n) = (n base / slots) / ceil(n base / slots) full; the rule takes the smallest n
/// whose f(n) is within 85% of the best, so that splitting stops once the SMs are busy.
/// `forced` > 0 (`--splits`) is taken as given, capped at the tiles of the longest sequence
/// (a split without a tile does nothing) and at kMaxSplits.
SplitChoice choose_splits(const DecodeProblem& problem, int sm_count, int blocks_per_sm, int forced = 0);

}  // namespace fa::stage13
