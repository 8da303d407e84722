/// \file fa/cuda/timeline.cuh
/// \brief An instrumented kernel's record of what one thread block did: timestamped *marks*, one
/// list per warpgroup, from which the lessons draw a measured timeline.
///
/// A mark is a point in time and a code saying what has just ended there ("the slot of tile 7 is
/// full", "the softmax of tile 7 is done"); the span between two consecutive marks of a warpgroup
/// is what that warpgroup was doing, named by the mark that ends it. One thread per warpgroup
/// writes the marks of its warpgroup, in the one block the host asked for; every other block (and
/// every kernel built without the instrumentation) records nothing.
///
/// Time is the SM's cycle counter (`clock64`, `%clock64`): it counts at the SM's clock, resolves
/// single instructions and is the same counter for every warp of a block, which all run on one SM.
/// `%globaltimer`, the GPU's nanosecond clock, is read at the first and the last mark of each
/// warpgroup, so that the host can turn cycles into nanoseconds for the block as it ran (the SM
/// clock changes with power and temperature; the nominal rate would not do).
#pragma once

#include <cstdint>

#include "fa/cuda/timeline.hpp"

namespace fa::cuda {

/// The GPU's nanosecond clock (`%globaltimer`). Its value is the same on every SM; how often it
/// advances depends on the GPU (about every 32 ns to 1 us), so it times spans of many microseconds.
__device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/// The SM's cycle counter (`%clock64`), read as a volatile instruction so that the compiler keeps
/// it in order with the other volatile instructions (wgmma, barriers, TMA) around it.
__device__ __forceinline__ uint64_t sm_clock64() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
    return t;
}

//! [timeline_recorder]
/// Writes one warpgroup's marks: `out` points to its `capacity` records when this thread records
/// (one thread of the warpgroup, in the chosen block) and is null otherwise, so that every other
/// thread's mark() is one predicated-off branch. Marks beyond `capacity` are dropped (the host
/// sees the list end early, never a record out of bounds).
class TimelineRecorder {
public:
    /// Records into `out` (`capacity` records), or nothing when `out` is null.
    __device__ TimelineRecorder(TimelineMark* out, int capacity) : out_(out), capacity_(capacity) {}

    /// Records that `what` (of tile `tile`) ended now; `with_ns` also reads the nanosecond clock.
    __device__ __forceinline__ void mark(uint16_t what, int tile = 0, bool with_ns = false) {
        if (out_ == nullptr || count_ >= capacity_) return;
        const uint64_t cycle = sm_clock64();
        out_[count_++] = {cycle, with_ns ? uint32_t(globaltimer_ns()) : 0u, what, uint16_t(tile)};
    }

private:
    TimelineMark* out_;
    int capacity_;
    int count_ = 0;
};
//! [timeline_recorder]

/// The recorder of a kernel built without the instrumentation: mark() is empty, so the calls
/// compile to nothing and the kernel's code is that of the plain build.
struct NoTimeline {
    /// Records nothing.
    __device__ __forceinline__ void mark(uint16_t, int = 0, bool = false) {}
};

}  // namespace fa::cuda
