// Tensor maps for the TMA through the driver's cuTensorMapEncodeTiled, reached via the runtime.
#include "fa/cuda/tensor_map.hpp"

#include <cstring>

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "fa/cuda/check.hpp"
#include "fa/error.hpp"

namespace fa::cuda {

namespace {

// The driver entry point, looked up once. The runtime finds it in the driver it already loaded,
// so the executables need not link libcuda.
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult found{};
        FA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess || p == nullptr) {
            throw Error("cudaGetDriverEntryPointByVersion(\"cuTensorMapEncodeTiled\", 12000): the driver has no such "
                        "function (query result " + std::to_string(int(found)) + "); the TMA needs a CUDA 12 driver");
        }
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }();
    return fn;
}

std::string result_name(CUresult r) {
    switch (r) {
        case CUDA_SUCCESS: return "CUDA_SUCCESS";
        case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE (a size, stride, box or alignment the TMA refuses)";
        case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
        case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
        default: return "CUresult " + std::to_string(int(r));
    }
}

// Checks what cuTensorMapEncodeTiled would refuse, with a message that says which value.
void require(bool ok, const std::string& what, const std::string& message) {
    if (!ok) throw InputError(what + ": " + message);
}

CUtensorMap encode(const void* data, CUtensorMapDataType type, cuuint32_t element_bytes, int rank, const cuuint64_t* dims,
                   const cuuint64_t* strides_bytes, const cuuint32_t* box, bool swizzle, const std::string& what) {
    require(reinterpret_cast<uintptr_t>(data) % 16 == 0, what, "the TMA needs a 16-byte aligned start address");
    for (int i = 0; i + 1 < rank; ++i) {
        require(strides_bytes[i] % 16 == 0, what,
                "the TMA needs strides that are multiples of 16 bytes (8 elements); stride " + std::to_string(i + 1) +
                    " is " + std::to_string(strides_bytes[i]) + " bytes");
        require(strides_bytes[i] < (cuuint64_t(1) << 40), what, "a stride is 2^40 bytes or more");
    }
    for (int i = 0; i < rank; ++i) {
        require(dims[i] >= 1 && dims[i] <= (cuuint64_t(1) << 32), what, "a dimension is 0 or above 2^32");
        require(box[i] >= 1 && box[i] <= 256, what, "a box side is 0 or above 256");
    }
    require(!swizzle || box[0] * element_bytes <= 128, what, "a 128-byte swizzled box is at most 128 bytes wide");
    CUtensorMap map{};
    const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
    const CUresult r = encode_tiled()(
        &map, type, cuuint32_t(rank),
        const_cast<void*>(data), dims, strides_bytes, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);  // NONE: elements outside the tensor are filled with zeros
    if (r != CUDA_SUCCESS) {
        std::string shape;
        for (int i = 0; i < rank; ++i) {
            shape += (i ? ", " : "") + std::to_string(dims[i]) + " (box " + std::to_string(box[i]) +
                     (i ? ", stride " + std::to_string(strides_bytes[i - 1]) + " B" : "") + ")";
        }
        throw Error("cuTensorMapEncodeTiled for " + what + " failed: " + result_name(r) + "; dims innermost first: " + shape);
    }
    return map;
}

// A map of 16-bit elements.
CUtensorMap encode(const void* data, DType dtype, int rank, const cuuint64_t* dims, const cuuint64_t* strides_bytes,
                   const cuuint32_t* box, bool swizzle, const std::string& what) {
    return encode(data, dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, rank, dims,
                  strides_bytes, box, swizzle, what);
}

// Copies a map built here (in this function's own, aligned, frame) to the caller's object as
// bytes. The empty asm hides where `dst` came from, so the compiler cannot assume the 64-byte
// alignment CUtensorMap declares and emits unaligned moves (see tensor_map.hpp).
void store_unaligned(CUtensorMap& out, const CUtensorMap& map) {
    void* dst = &out;
    asm("" : "+r"(dst));
    std::memcpy(dst, &map, sizeof(CUtensorMap));
}

}  // namespace

void make_tensor_map_bhnd(CUtensorMap& out, const void* data, DType dtype, int64_t batch, int64_t heads, int64_t rows,
                          int64_t features, int64_t stride_b, int64_t stride_h, int64_t stride_n, int box_rows,
                          const std::string& what) {
    require(features % 64 == 0, what, "the TMA boxes are 64 features wide: d must be a multiple of 64");
    const cuuint64_t dims[4] = {cuuint64_t(features), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(batch)};
    // Strides of dimensions 1..3 in bytes; dimension 0 (the features) is contiguous.
    const cuuint64_t strides[3] = {cuuint64_t(stride_n) * 2, cuuint64_t(stride_h) * 2, cuuint64_t(stride_b) * 2};
    const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
    store_unaligned(out, encode(data, dtype, 4, dims, strides, box, true, what));
}

void make_tensor_map_2d(CUtensorMap& out, const void* data, DType dtype, int64_t rows, int64_t cols, int64_t row_stride,
                        int box_rows, int box_cols, bool swizzle, const std::string& what) {
    const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
    const cuuint64_t strides[1] = {cuuint64_t(row_stride) * 2};
    const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
    store_unaligned(out, encode(data, dtype, 2, dims, strides, box, swizzle, what));
}

void make_tensor_map_f32_2d(CUtensorMap& out, const float* data, int64_t rows, int64_t cols, int64_t row_stride, int box_rows,
                            int box_cols, const std::string& what) {
    const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
    const cuuint64_t strides[1] = {cuuint64_t(row_stride) * 4};
    const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
    store_unaligned(out, encode(data, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, 2, dims, strides, box, false, what));
}

}  // namespace fa::cuda
