// The warp emulator's fa/cuda/tma.cuh (async_units.hpp holds the engine). A load reads the box at
// the coordinates through the tensor map (cuda.h here: the fields cuTensorMapEncodeTiled wrote),
// zeros for elements outside the tensor, into shared memory row after row (innermost dimension
// first), each 16-byte chunk moved by the swizzle of its address, and counts the box's bytes, zeros
// included, down on the mbarrier. It lands later than issued: when no thread of the block can run,
// one load at a time, in an order shuffled per block (or at once, where a test sets
// emu::hopper::eager_loads). Stores and reductions (float32 .add) join
// the thread's open bulk group; wait_group.read N reads the shared sources of all but N groups,
// wait_group N also writes global memory (elements outside the tensor are left alone), and a
// thread's end writes what it read. prefetch.tensormap only checks the map.
#pragma once
#include <cstdint>

#include <cuda.h>

#include "async_units.hpp"

namespace fa::cuda::ptx {
inline uint64_t tensor_map_address(const CUtensorMap* map) { return reinterpret_cast<uint64_t>(map); }
inline void prefetch_tensormap(const CUtensorMap* map) {
    if (emu::tensor_map_fields(map) == nullptr) emu::hopper::fail("prefetch.tensormap of a map cuTensorMapEncodeTiled did not write");
}
inline void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1) {
    const int c[] = {c0, c1};
    emu::hopper::tma_load(dst, map, bar, c, 2);
}
inline void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2) {
    const int c[] = {c0, c1, c2};
    emu::hopper::tma_load(dst, map, bar, c, 3);
}
inline void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3) {
    const int c[] = {c0, c1, c2, c3};
    emu::hopper::tma_load(dst, map, bar, c, 4);
}
inline void tma_store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
    const int c[] = {c0, c1};
    emu::hopper::tma_to_global(emu::hopper::BulkOp::Store, map, src, c, 2);
}
inline void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
    const int c[] = {c0, c1, c2, c3};
    emu::hopper::tma_to_global(emu::hopper::BulkOp::Store, map, src, c, 4);
}
inline void tma_reduce_add_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
    const int c[] = {c0, c1};
    emu::hopper::tma_to_global(emu::hopper::BulkOp::ReduceAdd, map, src, c, 2);
}
inline void tma_reduce_add_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
    const int c[] = {c0, c1, c2, c3};
    emu::hopper::tma_to_global(emu::hopper::BulkOp::ReduceAdd, map, src, c, 4);
}
inline void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) { emu::hopper::bulk_reduce_add_f32(dst, src, bytes); }
inline void bulk_commit_group() { emu::hopper::bulk_commit_group(); }
template <int N>
inline void bulk_wait_group_read() {
    emu::hopper::bulk_wait_group(N, false);
}
template <int N>
inline void bulk_wait_group() {
    emu::hopper::bulk_wait_group(N, true);
}
}  // namespace fa::cuda::ptx
