// The warp emulator's cuda.h: the driver's tensor maps, as far as the stages build them.
//
// cuTensorMapEncodeTiled checks what the driver refuses (CUDA_ERROR_INVALID_VALUE: an address or
// a stride not a multiple of 16 bytes, a box side above 256, a swizzled box row wider than its
// swizzle, ...) and writes the map's fields into the 128 opaque bytes of CUtensorMap in a layout of
// its own (emu::TensorMap): the emulated TMA (fa/cuda/tma.cuh here) reads them back. Elements
// outside the tensor read as zeros (the only fill the stages ask for), and element strides other
// than 1, interleaved layouts and the im2col mode are refused, since nothing here models them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

typedef uint64_t cuuint64_t;
typedef uint32_t cuuint32_t;
typedef int CUresult;
inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
inline constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
inline constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;

/// As the driver declares it: 128 bytes, 64-byte aligned.
struct alignas(64) CUtensorMap {
    cuuint64_t opaque[16];
};

enum CUtensorMapDataType {
    CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0,
    CU_TENSOR_MAP_DATA_TYPE_UINT16,
    CU_TENSOR_MAP_DATA_TYPE_UINT32,
    CU_TENSOR_MAP_DATA_TYPE_INT32,
    CU_TENSOR_MAP_DATA_TYPE_UINT64,
    CU_TENSOR_MAP_DATA_TYPE_INT64,
    CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
    CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
    CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
};
enum CUtensorMapInterleave { CU_TENSOR_MAP_INTERLEAVE_NONE = 0, CU_TENSOR_MAP_INTERLEAVE_16B, CU_TENSOR_MAP_INTERLEAVE_32B };
enum CUtensorMapSwizzle { CU_TENSOR_MAP_SWIZZLE_NONE = 0, CU_TENSOR_MAP_SWIZZLE_32B, CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_SWIZZLE_128B };
enum CUtensorMapL2promotion {
    CU_TENSOR_MAP_L2_PROMOTION_NONE = 0,
    CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
    CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
    CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
};
enum CUtensorMapFloatOOBfill { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0, CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA };

namespace emu {

/// What the emulated TMA reads from a CUtensorMap (strides in bytes, dimension 0 contiguous).
struct TensorMap {
    uint64_t magic;                  // kTensorMapMagic: a map cuTensorMapEncodeTiled wrote
    const unsigned char* address;    // the tensor's first element
    uint8_t rank;                    // 1..5
    uint8_t element_bytes;           // 1, 2, 4 or 8
    uint8_t type;                    // a CUtensorMapDataType
    uint8_t swizzle;                 // a CUtensorMapSwizzle
    uint64_t dims[5];                // elements per dimension, innermost first
    uint64_t strides[5];             // bytes from one index to the next; strides[0] = element_bytes
    uint32_t box[5];                 // the box's side per dimension, in elements
};
static_assert(sizeof(TensorMap) <= sizeof(CUtensorMap), "the fields fit the opaque bytes");
inline constexpr uint64_t kTensorMapMagic = 0x70616d726f736e65ull;  // "ensormap"

/// The fields of `map`, or null if no cuTensorMapEncodeTiled wrote them.
inline const TensorMap* tensor_map_fields(const CUtensorMap* map) {
    const TensorMap* m = reinterpret_cast<const TensorMap*>(map);
    return m->magic == kTensorMapMagic ? m : nullptr;
}

inline uint32_t element_bytes_of(CUtensorMapDataType t) {
    switch (t) {
        case CU_TENSOR_MAP_DATA_TYPE_UINT8: return 1;
        case CU_TENSOR_MAP_DATA_TYPE_UINT16:
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
        case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: return 2;
        case CU_TENSOR_MAP_DATA_TYPE_UINT32:
        case CU_TENSOR_MAP_DATA_TYPE_INT32:
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT32: return 4;
        default: return 8;
    }
}

/// The width in bytes a box row may have under `s` (0: any).
inline uint32_t swizzle_bytes(unsigned swizzle) { return swizzle == CU_TENSOR_MAP_SWIZZLE_NONE ? 0u : 16u << swizzle; }

}  // namespace emu

/// The driver's encoder of a tiled tensor map (the arguments as the CUDA driver API documents them:
/// globalStrides has rank - 1 entries, the strides of dimensions 1 .. rank - 1 in bytes).
inline CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                       const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                       const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                       CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill fill) {
    emu::TensorMap m{};
    m.magic = emu::kTensorMapMagic;
    m.address = static_cast<const unsigned char*>(address);
    m.rank = uint8_t(rank);
    m.type = uint8_t(type);
    m.element_bytes = uint8_t(emu::element_bytes_of(type));
    m.swizzle = uint8_t(swizzle);
    if (map == nullptr || rank < 1 || rank > 5 || reinterpret_cast<uintptr_t>(address) % 16 != 0) return CUDA_ERROR_INVALID_VALUE;
    if (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE || fill != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) return CUDA_ERROR_NOT_SUPPORTED;
    m.strides[0] = m.element_bytes;
    for (uint32_t i = 0; i < rank; ++i) {
        if (dims[i] < 1 || dims[i] > (cuuint64_t(1) << 32) || box[i] < 1 || box[i] > 256) return CUDA_ERROR_INVALID_VALUE;
        if (element_strides[i] != 1) return CUDA_ERROR_NOT_SUPPORTED;
        m.dims[i] = dims[i];
        m.box[i] = box[i];
        if (i > 0) {
            if (strides[i - 1] % 16 != 0 || strides[i - 1] >= (cuuint64_t(1) << 40)) return CUDA_ERROR_INVALID_VALUE;
            m.strides[i] = strides[i - 1];
        }
    }
    const uint32_t row_bytes = box[0] * m.element_bytes, width = emu::swizzle_bytes(swizzle);
    if (row_bytes % 16 != 0 || (width != 0 && row_bytes > width)) return CUDA_ERROR_INVALID_VALUE;
    std::memset(map, 0, sizeof(CUtensorMap));
    std::memcpy(static_cast<void*>(map), &m, sizeof m);
    return CUDA_SUCCESS;
}
