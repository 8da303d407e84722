/// \file fa/cuda/timeline.hpp
/// \brief One mark of an instrumented kernel's timeline, as the device writes it and the host
/// reads it (the recorder is in fa/cuda/timeline.cuh).
#pragma once

#include <cstdint>

namespace fa::cuda {

/// One mark of a timeline (16 bytes).
struct TimelineMark {
    uint64_t cycle;  ///< the SM's cycle counter (clock64) when the mark was made; 0: no mark
    uint32_t ns;     ///< %globaltimer's low 32 bits, for marks made with `with_ns`; else 0
    uint16_t what;   ///< what ended at this mark (the kernel's own codes)
    uint16_t tile;   ///< which K/V tile (or 0)
};
static_assert(sizeof(TimelineMark) == 16, "the host reads the marks as 16-byte records");

}  // namespace fa::cuda
