// Host side of tests/hopper_wrapper_kernels.cu: one small kernel per Hopper wrapper, each run on
// data the test makes and returning what the instruction produced, so a failure points at one
// instruction (tests/test_hopper_wrappers.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "fa/cuda/half.hpp"

namespace fa::test::hopper {

/// TMA load of one [64, 64] box of 16-bit words from a [rows, 64] matrix (row stride `stride`
/// elements) at row `row0`, 128-byte swizzle, completing on an mbarrier; returns the box's
/// 8192 bytes of shared memory as 4096 words, as the TMA left them.
std::vector<uint16_t> tma_load_box(const std::vector<uint16_t>& matrix, int rows, int stride, int row0);

/// TMA load of the [box_rows, 128] tile of head (b, h), rows row0.., from a (B, H, N, 128)
/// tensor in either layout (strides in elements) through make_tensor_map_bhnd: two boxes of 64
/// features; returns the tile's shared memory as words (box 0, then box 1).
std::vector<uint16_t> tma_load_bhnd(const std::vector<uint16_t>& tensor, int64_t B, int64_t H, int64_t N,
                                    int64_t sb, int64_t sh, int64_t sn, int b, int h, int row0, int box_rows);

/// TMA load of a [64, 64] box at row `row0` of `matrix`, then TMA store of it to row `dst_row0`
/// of `out` (same shape; rows past the end are not written). Returns `out` afterwards.
std::vector<uint16_t> tma_store_box(const std::vector<uint16_t>& matrix, std::vector<uint16_t> out, int rows, int row0,
                                    int dst_row0);

/// mbarrier round trip: 64 threads arrive on a barrier expecting 64 arrivals, three phases.
/// Returns, per thread and phase p, four flags: try_wait(p % 2) before arriving (must be 0),
/// after the wait (1), try_wait((p + 1) % 2) after the wait (0: the next phase is open), and
/// whether the wait returned at all (1).
std::vector<int> mbarrier_round_trip();

/// Warp specialization's pieces in one block of three warpgroups: warpgroup 0 gives registers
/// away (setmaxnreg.dec 24), 1 and 2 take them (setmaxnreg.inc 240); warp 0 publishes a value
/// with bar.arrive on named barrier 2 that warpgroup 1 waits for with bar.sync; warpgroups 1 and
/// 2 exchange values through named barrier 1; every warp counts its elect.sync winners. Returns,
/// per thread (384), a code: 1 = all as expected, 2 = wrong value after bar.sync on barrier 2,
/// 3 = wrong neighbour's value after barrier 1, 4 = not exactly one elected lane in the warp;
/// 0 = the thread never got there.
std::vector<int> warp_specialization_round_trip();

/// One wgmma product D (64 x n) = A (64 x k) B (k x n), k / 16 instructions, float32 out.
/// `a` is [64, k] row-major. `b` is [n, k] row-major (K-major B, as K for S = Q K^T) when
/// `trans_b` is false, [k, n] row-major (MN-major B, as V for O += P V) when true. The tiles
/// are written to shared memory by plain stores in the 128-byte-swizzled layout
/// (wgmma_layout::tile_offset), not by the TMA. `rs`: A from registers (the RS form).
/// Returns D [64, n] row-major, each element placed by wgmma_layout::accumulator_element.
/// `swap_b_offsets`: a diagnostic, B's descriptor with LBO and SBO exchanged (to tell, when a
/// product fails, whether the two offsets should be read the other way round).
std::vector<float> wgmma_product(cuda::DType dtype, int n, int k, bool rs, bool trans_b, const std::vector<float>& a,
                                 const std::vector<float>& b, bool swap_b_offsets = false);

/// fa::cuda::quad_transpose in one warp: lane L starts with words in[4L .. 4L + 3]; returns
/// each lane's four words afterwards, in the same order.
std::vector<uint32_t> quad_transpose_words(const std::vector<uint32_t>& in);

}  // namespace fa::test::hopper
