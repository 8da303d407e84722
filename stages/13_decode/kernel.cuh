/// \file stages/13_decode/kernel.cuh
/// \brief Stage 13's kernels: the append of the new K/V rows into the cache, the split-KV
/// attention kernel (flash-decoding) over a contiguous or a paged cache, and the combine kernel
/// that merges the splits' partial softmaxes.
///
/// What carries over from stage 07: the tensor-core tile machinery of common/cuda (mma.sync
/// m16n8k16, ldmatrix, swizzled tiles, the cp.async ring) and the online softmax in the exp2
/// domain. What is new:
///
/// - **Rows of a tile are (new row, query head) pairs of one K/V head.** A block owns one K/V head
///   g of one sequence and up to 16 rows: with G = Hq/Hk query heads per K/V head and seq_q new
///   rows, row r is new row r / G of query head g G + r % G. Every K and V byte the block loads
///   serves all of them (a decode step at G = 8 fills half of an m16 tile, where one query head
///   per block would fill one row of sixteen and read K/V eight times).
/// - **The keys are split.** Block (s, ...) reads only split s of its sequence's key tiles, so a
///   batch of few sequences still spreads over every SM; it writes its O normalized by its own
///   row sums, and its LSE, in float32, and the combine kernel merges the splits.
/// - **Warps split the keys of a tile, not the rows.** 16 rows are one m16 slab, too few to give
///   each warp rows of its own as stage 07 does: warp w takes keys 16w .. 16w+15 of every 64-key
///   tile, keeps its own m_i, l_i and O_i for all 16 rows, and the four are merged in shared memory
///   at the end, in a fixed order (the same algebra as the combine, inside the block).
/// - **Keys are found through the block table.** Each 16-byte chunk a thread copies looks up the
///   page of its key: a gather of page-sized runs, as fine as the 16-key pages allow.
///
/// Host-callable pieces (the arguments, the grid) are plain code, so the warp emulator's test
/// launches the kernels exactly as decode.cu does.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "args.hpp"
#include "fa/config.hpp"
#include "fa/cuda/fragments.cuh"
#include "fa/cuda/layouts.hpp"
#include "fa/cuda/ptx.cuh"
#include "fa/problem.hpp"

namespace fa::stage13 {

//! [key_row]
/// Element offset of key `j` of sequence `b`, K/V head `g`, feature 0: through the block table
/// in a paged cache (page block_table[b][j >> shift], row j & (page_size - 1) of it), at row j of
/// the sequence's own slab in a contiguous one.
template <class T, int D>
__device__ __forceinline__ int64_t key_row_offset(const DecodeArgs<T>& a, int b, int g, int j) {
    if (a.block_table != nullptr) {
        const int page = a.block_table[int64_t(b) * a.pages_per_seq + (j >> a.page_shift)];
        const int row = j & ((1 << a.page_shift) - 1);
        return int64_t(page) * a.page_stride + (int64_t(row) * a.heads_k + g) * D;
    }
    return int64_t(b) * a.seq_stride + (int64_t(j) * a.heads_k + g) * D;
}
//! [key_row]

//! [append]
/// The append: new row i of sequence b goes to cache position cache_seqlens[b] + i, in place, as
/// flash_attn_with_kvcache writes it before attending. One thread per 16-byte chunk (grid-stride);
/// the chunks of one row are consecutive threads, so both sides are coalesced.
template <class T, int D>
__global__ void append_kv_kernel(const DecodeArgs<T> a) {
    constexpr int kChunks = D / 8;  // 16-byte chunks per row of one head
    const int64_t total = append_chunks(a, D);
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < total; c += int64_t(gridDim.x) * blockDim.x) {
        const int chunk = int(c % kChunks);
        int64_t rest = c / kChunks;
        const int g = int(rest % a.heads_k);
        rest /= a.heads_k;
        const int i = int(rest % a.seq_q), b = int(rest / a.seq_q);
        const int64_t from = ((int64_t(b) * a.seq_q + i) * a.heads_k + g) * D + chunk * 8;
        const int64_t to = key_row_offset<T, D>(a, b, g, a.cache_seqlens[b] + i) + chunk * 8;
        *reinterpret_cast<uint4*>(a.k_cache + to) = *reinterpret_cast<const uint4*>(a.k_new + from);
        *reinterpret_cast<uint4*>(a.v_cache + to) = *reinterpret_cast<const uint4*>(a.v_new + from);
    }
}
//! [append]

//! [gather]
/// Issues the copies of keys [key0, key0 + 64) of (b, g), K and V, into one ring slot, with the
/// block's 128 threads; keys at or past `key_end` are zero-filled (never read). Thread i copies
/// chunk i % (D/8) of tile row i / (D/8), then the same chunk 128 / (D/8) rows further, as
/// load_tile_gmem_to_smem does; what differs is that each row finds its own address through
/// key_row_offset(): rows of one page are contiguous, pages are anywhere.
template <class T, int D>
__device__ __forceinline__ void load_kv_tile(const DecodeArgs<T>& a, uint32_t k_slot, uint32_t v_slot, int b, int g, int key0,
                                             int key_end) {
    using L = typename SplitShape<D>::Layout;
    constexpr int kChunksPerRow = D / 8;
    constexpr int kRowsPerPass = kThreads / kChunksPerRow;
    const int row = int(threadIdx.x) / kChunksPerRow, col = (int(threadIdx.x) % kChunksPerRow) * 8;
#pragma unroll
    for (int pass = 0; pass < kKeysPerTile / kRowsPerPass; ++pass) {
        const int r = row + pass * kRowsPerPass, key = key0 + r;
        const bool valid = key < key_end;
        const int64_t offset = valid ? key_row_offset<T, D>(a, b, g, key) + col : 0;
        const uint32_t dst = uint32_t(L::offset(r, col)) * 2;
        cuda::ptx::cp_async_16(k_slot + dst, a.k_cache + offset, valid);
        cuda::ptx::cp_async_16(v_slot + dst, a.v_cache + offset, valid);
    }
}
//! [gather]

//! [split_kernel]
/// One split of one (sequence b, K/V head g, row tile): the online softmax of stage 07 over the
/// split's key tiles, then the four warps merged, then O and the LSE of the split written (the
/// final O and LSE when there is one split).
template <class T, int D>
__global__ void __launch_bounds__(kThreads) decode_split_kernel(const DecodeArgs<T> a) {
    using Shape = SplitShape<D>;
    using L = typename Shape::Layout;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    uint16_t* q_tile = reinterpret_cast<uint16_t*>(smem_raw);                    // [16, D] swizzled
    unsigned char* ring = smem_raw + Shape::kQBytes;                             // kStages x ([64, D] K, [64, D] V)
    const uint32_t q_addr = cuda::ptx::smem_address(q_tile);
    const auto k_slot = [&](int t) { return cuda::ptx::smem_address(ring + (2 * (t % kStages)) * Shape::kTileBytes); };
    const auto v_slot = [&](int t) { return cuda::ptx::smem_address(ring + (2 * (t % kStages) + 1) * Shape::kTileBytes); };

    // Which block: split fastest, then row tile, then K/V head, then sequence.
    int64_t bx = blockIdx.x;
    const int split = int(bx % a.splits);
    bx /= a.splits;
    const int row_tile = int(bx % a.row_tiles);
    bx /= a.row_tiles;
    const int g = int(bx % a.heads_k), b = int(bx / a.heads_k);

    // The split's tiles: the sequence's ceil(seq_k / 64) tiles cut into `splits` runs of equal
    // length (the last ones shorter or empty). Split boundaries depend on seq_k alone, never on
    // the page size: the contiguous and the paged cache run the same tiles and give the same bits.
    const int seq_k = a.cache_seqlens[b] + a.append_rows;
    const int n_tiles = int(ceil_div(seq_k, kKeysPerTile));
    const int per_split = int(ceil_div(n_tiles, a.splits));
    const int tile_begin = imin(n_tiles, split * per_split), tile_end = imin(n_tiles, tile_begin + per_split);
    const int key_end = imin(seq_k, tile_end * kKeysPerTile);  // keys of this split: [tile_begin 64, key_end)

    const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32, gq = lane / 4, tq = lane % 4;

    // Q rows of the tile: row r is new row (16 row_tile + r) / G of query head g G + (16 row_tile + r) % G.
    {
        constexpr int kChunksPerRow = D / 8, kRowsPerPass = kThreads / kChunksPerRow;
        const int row = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
#pragma unroll
        for (int pass = 0; pass < kRowsPerTile / kRowsPerPass; ++pass) {
            const int r = row + pass * kRowsPerPass, rr = row_tile * kRowsPerTile + r;
            const bool valid = rr < a.rows;
            const int i = rr / a.group, h = g * a.group + rr % a.group;
            const int64_t offset = valid ? ((int64_t(b) * a.seq_q + i) * a.heads_q + h) * D + col : 0;
            cuda::ptx::cp_async_16(q_addr + uint32_t(L::offset(r, col)) * 2, a.q + offset, valid);
        }
    }
    if (tile_begin < tile_end) load_kv_tile<T, D>(a, k_slot(0), v_slot(0), b, g, tile_begin * kKeysPerTile, key_end);
    cuda::ptx::cp_async_commit();  // group 0: Q and the first tile

    // Causal limits of this lane's two rows (gq and gq + 8): new row i sees keys [0, seq_k - seq_q + i + 1).
    // Rows past `rows` (padding of the slab) see nothing. Either way the split's own end caps them.
    int limit[2];
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
        const int rr = row_tile * kRowsPerTile + gq + 8 * h2;
        const int end = rr < a.rows ? seq_k - a.seq_q + rr / a.group + 1 : 0;
        limit[h2] = imin(imax(end, 0), key_end);
    }
    // The lowest limit of any real row: tiles that end before it need no mask.
    const int unmasked_end = imin(imax(seq_k - a.seq_q + 1, 0), key_end);

    uint32_t q_frag[D / 16][4];      // A fragments of Q [16, D], loaded once
    float o_acc[D / 8][4];           // this warp's O_i [16, D], unnormalized
    float m_i[2] = {-INFINITY, -INFINITY};  // running max of rows gq, gq+8 (exp2 domain)
    float l_i[2] = {0.f, 0.f};              // this lane's part of the running sums
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o_acc[n][0] = o_acc[n][1] = o_acc[n][2] = o_acc[n][3] = 0.f;

    const uint32_t q_lane = q_addr + cuda::a_lane_bytes<L>(lane);
    for (int t = tile_begin; t < tile_end; ++t) {
        const int step = t - tile_begin;
        if (t + 1 < tile_end) load_kv_tile<T, D>(a, k_slot(step + 1), v_slot(step + 1), b, g, (t + 1) * kKeysPerTile, key_end);
        cuda::ptx::cp_async_commit();  // one group per tile, empty after the last
        cuda::ptx::cp_async_wait<1>();  // this thread's copies of tile t (and Q) have landed
        __syncthreads();                // ... and every thread's: tile t may be read
        if (step == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) cuda::ptx::ldmatrix_x4(q_frag[kk], cuda::fragment_address<L>(q_lane, 0, 16 * kk));
        }

        // S = Q K_w^T for this warp's 16 keys: two n-tiles of 8 keys.
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        const uint32_t k_lane = k_slot(step) + cuda::k_lane_bytes<L>(lane);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t kf[4];
            cuda::ptx::ldmatrix_x4(kf, cuda::fragment_address<L>(k_lane, 16 * warp, 16 * kk));
            const uint32_t b0[2] = {kf[0], kf[1]}, b1[2] = {kf[2], kf[3]};
            cuda::ptx::mma_m16n8k16<T>(s[0], q_frag[kk], b0, s[0]);
            cuda::ptx::mma_m16n8k16<T>(s[1], q_frag[kk], b1, s[1]);
        }

        // Scores to the exp2 domain, masked past each row's limit (only in tiles that reach it).
        const int key_base = t * kKeysPerTile + 16 * warp + 2 * tq;
        const bool masked = (t + 1) * kKeysPerTile > unmasked_end;
        float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = key_base + 8 * n + e % 2;
                float x = s[n][e] * a.scale_log2;
                if (masked && key >= limit[e / 2]) x = -INFINITY;
                s[n][e] = x;
                row_max[e / 2] = fmaxf(row_max[e / 2], x);
            }
        }
        // The online softmax of stage 07, per warp: new max, rescale, P = exp2(x - m).
        float alpha[2], m_use[2];
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
            const float m_new = fmaxf(m_i[h2], cuda::quad_max(row_max[h2]));
            m_use[h2] = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: exp2(-inf - 0) = 0, never NaN
            alpha[h2] = cuda::ptx::ex2(m_i[h2] - m_use[h2]);
            m_i[h2] = m_new;
            l_i[h2] *= alpha[h2];
        }
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[n][e] = cuda::ptx::ex2(s[n][e] - m_use[e / 2]);
                l_i[e / 2] += s[n][e];
            }
        }
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o_acc[n][0] *= alpha[0], o_acc[n][1] *= alpha[0];
            o_acc[n][2] *= alpha[1], o_acc[n][3] *= alpha[1];
        }
        // O_w += P V_w: P [16, 16] is the A fragment as it stands (its two n-tiles are its two k halves).
        const uint32_t p_frag[4] = {cuda::ptx::pack2<T>(s[0][0], s[0][1]), cuda::ptx::pack2<T>(s[0][2], s[0][3]),
                                    cuda::ptx::pack2<T>(s[1][0], s[1][1]), cuda::ptx::pack2<T>(s[1][2], s[1][3])};
        const uint32_t v_lane = v_slot(step) + cuda::v_lane_bytes<L>(lane);
#pragma unroll
        for (int j = 0; j < D / 16; ++j) {
            uint32_t vf[4];
            cuda::ptx::ldmatrix_x4_trans(vf, cuda::fragment_address<L>(v_lane, 16 * warp, 16 * j));
            const uint32_t b0[2] = {vf[0], vf[1]}, b1[2] = {vf[2], vf[3]};
            cuda::ptx::mma_m16n8k16<T>(o_acc[2 * j], p_frag, b0, o_acc[2 * j]);
            cuda::ptx::mma_m16n8k16<T>(o_acc[2 * j + 1], p_frag, b1, o_acc[2 * j + 1]);
        }
        __syncthreads();  // every warp is done with slot `step` before the next iteration's copy refills it
    }
    cuda::ptx::cp_async_wait<0>();  // nothing left in flight (the empty last group, or Q when the split has no tile)
    __syncthreads();                // ... for every thread: the ring may now hold the merge

    // The four warps' (m, l, O) merged in shared memory (the ring is free now).
    float* merge_o = reinterpret_cast<float*>(ring);                     // [kWarps, 16, D]
    float* merge_m = merge_o + kWarps * kRowsPerTile * D;                   // [kWarps, 16]
    float* merge_l = merge_m + kWarps * kRowsPerTile;                       // [kWarps, 16]
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
        const float l = cuda::quad_sum(l_i[h2]);
        if (tq == 0) merge_m[warp * kRowsPerTile + gq + 8 * h2] = m_i[h2], merge_l[warp * kRowsPerTile + gq + 8 * h2] = l;
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        float* row0 = merge_o + (warp * kRowsPerTile + gq) * D + 8 * n + 2 * tq;
        row0[0] = o_acc[n][0], row0[1] = o_acc[n][1];
        row0[8 * D] = o_acc[n][2], row0[8 * D + 1] = o_acc[n][3];
    }
    __syncthreads();  // every warp's m, l and O are in shared memory before any thread merges them

    // Row r of the block: M = max_w m_w, weights exp2(m_w - M), L = sum_w weight_w l_w;
    // O = sum_w weight_w O_w / L and LSE = (M + log2 L) ln 2, the warps taken in order 0..3.
    // Each thread takes two neighbouring features of a row, stored as one 32-bit pair.
    const bool direct = a.splits == 1;
    for (int e = tid; e < kRowsPerTile * D / 2; e += kThreads) {
        const int r = e / (D / 2), c = 2 * (e % (D / 2)), rr = row_tile * kRowsPerTile + r;
        if (rr >= a.rows) continue;
        float m_max = -INFINITY;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) m_max = fmaxf(m_max, merge_m[w * kRowsPerTile + r]);
        float l_sum = 0.f, o_sum[2] = {0.f, 0.f};
        if (m_max != -INFINITY) {
#pragma unroll
            for (int w = 0; w < kWarps; ++w) {
                const float weight = cuda::ptx::ex2(merge_m[w * kRowsPerTile + r] - m_max);
                const float* o_w = merge_o + (w * kRowsPerTile + r) * D + c;
                l_sum += weight * merge_l[w * kRowsPerTile + r];
                o_sum[0] += weight * o_w[0], o_sum[1] += weight * o_w[1];
            }
        }
        const bool empty = !(l_sum > 0.f);  // the row saw no key of this split
        const float o0 = empty ? 0.f : o_sum[0] / l_sum, o1 = empty ? 0.f : o_sum[1] / l_sum;
        const float lse_val = empty ? -INFINITY : (m_max + log2f(l_sum)) * 0.6931471805599453f;
        const int i = rr / a.group, h = g * a.group + rr % a.group;
        const int64_t row_lse = (int64_t(b) * a.heads_q + h) * a.seq_q + i;
        if (direct) {
            *reinterpret_cast<uint32_t*>(a.o + ((int64_t(b) * a.seq_q + i) * a.heads_q + h) * D + c) = cuda::ptx::pack2<T>(o0, o1);
            if (c == 0) a.lse[row_lse] = lse_val;
        } else {
            const int64_t part = int64_t(split) * a.batch * a.heads_q * a.seq_q + row_lse;
            *reinterpret_cast<float2*>(a.o_partial + part * D + c) = make_float2(o0, o1);
            if (c == 0) a.lse_partial[part] = lse_val;
        }
    }
}
//! [split_kernel]

//! [combine]
/// Merges the splits of each row (b, h, i): with lse_max the largest of their LSEs, split s
/// weighs w_s = exp(lse_s - lse_max), O = sum_s w_s O_s / sum_s w_s and LSE = lse_max + log sum_s
/// w_s. One warp per row, each lane D/32 features; splits without a visible key (LSE -inf) weigh
/// 0 and their O is not read. The splits are added in order: the result is the same bits every run.
template <class T, int D>
__global__ void __launch_bounds__(32 * kCombineRowsPerBlock) decode_combine_kernel(const DecodeArgs<T> a) {
    constexpr int kPerLane = D / 32;
    const int lane = int(threadIdx.x) % 32;
    const int64_t row = int64_t(blockIdx.x) * kCombineRowsPerBlock + int(threadIdx.x) / 32;  // (b, h, i) flattened
    const int64_t rows = int64_t(a.batch) * a.heads_q * a.seq_q;
    if (row >= rows) return;
    float lse_max = -INFINITY;
    for (int s = 0; s < a.splits; ++s) lse_max = fmaxf(lse_max, a.lse_partial[int64_t(s) * rows + row]);
    float acc[kPerLane];
#pragma unroll
    for (int x = 0; x < kPerLane; ++x) acc[x] = 0.f;
    float weight_sum = 0.f;
    if (lse_max != -INFINITY) {
        for (int s = 0; s < a.splits; ++s) {
            const float lse_s = a.lse_partial[int64_t(s) * rows + row];
            if (lse_s == -INFINITY) continue;
            const float w = expf(lse_s - lse_max);
            weight_sum += w;
            const float* o_s = a.o_partial + (int64_t(s) * rows + row) * D + lane * kPerLane;
#pragma unroll
            for (int x = 0; x < kPerLane; ++x) acc[x] += w * o_s[x];
        }
    }
    // (b, h, i) of the row, for O's (B, seq_q, Hq, D) order; the LSE is (B, Hq, seq_q) like the row.
    const int i = int(row % a.seq_q), h = int((row / a.seq_q) % a.heads_q), b = int(row / (int64_t(a.seq_q) * a.heads_q));
    T* o = a.o + ((int64_t(b) * a.seq_q + i) * a.heads_q + h) * D + lane * kPerLane;
    const bool empty = !(weight_sum > 0.f);
#pragma unroll
    for (int x = 0; x < kPerLane; x += 2) {
        *reinterpret_cast<uint32_t*>(o + x) =
            cuda::ptx::pack2<T>(empty ? 0.f : acc[x] / weight_sum, empty ? 0.f : acc[x + 1] / weight_sum);
    }
    if (lane == 0) a.lse[row] = empty ? -INFINITY : lse_max + logf(weight_sum);
}
//! [combine]

}  // namespace fa::stage13
