/// \file fa/cuda/tensor_map.hpp
/// \brief Tensor maps for the TMA, built on the host with the driver's `cuTensorMapEncodeTiled`.
///
/// A tensor map is a 128-byte description of a tensor in global memory (its address, sizes and
/// strides) and of the *box* one TMA copy moves (its size in elements, how it is swizzled in
/// shared memory, what fills the elements outside the tensor). The kernel receives it as a
/// `const __grid_constant__ CUtensorMap` parameter and names boxes by element coordinates
/// (fa/cuda/tma.cuh).
///
/// The strides are what make a view readable without a copy: a (B, H, N, d) tensor in the
/// layout bhnd and one in bnhd differ only in the strides given here, and the TMA follows them.
/// Rows past N (a tile that runs past the end of the sequence) are filled with zeros by the
/// hardware, and never read from the next head.
///
/// The driver function is reached through the runtime (`cudaGetDriverEntryPointByVersion`), so
/// the course links no libcuda; errors name the call and the map.
///
/// **Alignment.** `CUtensorMap` is declared 64-byte aligned, but the builders write it through
/// an out-parameter with a copy that assumes no alignment, rather than returning it by value.
/// Returned by value, the map is built in storage the caller provides; the host code nvcc
/// compiles (stage 11's attention.cu) handed over a temporary on a 16-byte boundary, and this
/// file, compiled with `-march=native` for an AVX-512 CPU, zeroed it with a 64-byte aligned
/// store (`vmovdqa64`): a segmentation fault on the H100 machine (2026-11-23, GCC 13, nvcc 13.0;
/// the same code built without `-march=native` ran). The kernel parameter itself is copied by
/// the runtime, byte by byte, wherever the host object sits.
#pragma once

#include <cstdint>
#include <string>

#include <cuda.h>

#include "fa/cuda/half.hpp"

namespace fa::cuda {

/// A (B, H, N, d) tensor of 16-bit elements on the device, as the TMA reads it: `box_rows` rows
/// of 64 features per copy, 128-byte swizzle (fa/cuda/wgmma_layout.hpp), zero fill outside.
/// Coordinates in the kernel: {feature, row, head, batch}; d = 128 is loaded as two boxes
/// (features 0 and 64), since a swizzled box is at most 128 bytes wide.
///
/// \param data     the tensor's first element (16-byte aligned)
/// \param dtype    bf16 or fp16
/// \param batch, heads, rows, features   B, H, N, d (d a multiple of 64)
/// \param stride_b, stride_h, stride_n   strides in elements (the feature stride is 1); each
///                 a multiple of 8 elements (16 bytes), as the TMA requires
/// \param box_rows rows per box (1..256)
/// \param what     names the tensor in error messages (e.g. "stage 11 q")
/// \param out      where the map is written (see the note on alignment above)
void make_tensor_map_bhnd(CUtensorMap& out, const void* data, DType dtype, int64_t batch, int64_t heads, int64_t rows,
                          int64_t features, int64_t stride_b, int64_t stride_h, int64_t stride_n, int box_rows,
                          const std::string& what);

/// A 2-d [rows, cols] matrix of 16-bit elements (row stride in elements), boxes of
/// [box_rows, box_cols] with the 128-byte swizzle (box_cols = 64) or none (`swizzle` false),
/// zero fill outside. Coordinates in the kernel: {col, row}. For the wrapper tests.
void make_tensor_map_2d(CUtensorMap& out, const void* data, DType dtype, int64_t rows, int64_t cols, int64_t row_stride,
                        int box_rows, int box_cols, bool swizzle, const std::string& what);

/// A 2-d [rows, cols] matrix of float32 (row stride in elements, a multiple of 4), boxes of
/// [box_rows, box_cols] without a swizzle (box_cols a multiple of 4, at most 256), zero fill
/// outside. Coordinates in the kernel: {col, row}. For per-row statistics a kernel streams beside
/// its tiles (stage 12's L_i log2(e) and D_i, one box per query tile).
void make_tensor_map_f32_2d(CUtensorMap& out, const float* data, int64_t rows, int64_t cols, int64_t row_stride, int box_rows,
                            int box_cols, const std::string& what);

}  // namespace fa::cuda
