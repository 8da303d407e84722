// The warp emulator's fa/cuda/timeline.cuh: the recorder of the instrumented builds, its clocks a
// count of the marks made so far (so the marks of one block come out in the order the fibers made
// them, and never read 0, "no mark").
#pragma once
#include <cstdint>

#include "fa/cuda/timeline.hpp"

namespace fa::cuda {
inline uint64_t emulated_clock = 0;
inline uint64_t globaltimer_ns() { return ++emulated_clock; }
inline uint64_t sm_clock64() { return ++emulated_clock; }
class TimelineRecorder {
public:
    TimelineRecorder(TimelineMark* out, int capacity) : out_(out), capacity_(capacity) {}
    void mark(uint16_t what, int tile = 0, bool with_ns = false) {
        if (out_ == nullptr || count_ >= capacity_) return;
        const uint64_t cycle = sm_clock64();
        out_[count_++] = {cycle, with_ns ? uint32_t(globaltimer_ns()) : 0u, what, uint16_t(tile)};
    }

private:
    TimelineMark* out_;
    int capacity_;
    int count_ = 0;
};
struct NoTimeline {
    void mark(uint16_t, int = 0, bool = false) {}
};
}  // namespace fa::cuda
