// The warp emulator's fa/cuda/mbarrier.cuh (async_units.hpp holds the barriers). mbarrier.init
// begins phase 0 expecting `count` arrivals; arrive takes one, arrive.expect_tx first adds bytes to
// the phase's transaction count, which the TMA's loads count down as they land; the phase completes
// when both reach zero, its parity flips and the counts reload. try_wait.parity p is true once the
// current phase's parity is not p. Its time limit: a thread that finds the phase open parks until
// the barrier moves, or, when no thread can run and no load is left to land, answers false (a few
// times in a row at most while nothing in the block changes; a loop still waiting then is
// deadlocked, and the emulator stops with a message naming the barrier and what its phase lacks). The fences order nothing here: the
// emulator cannot see a plain store that a fence.proxy.async should have ordered.
#pragma once
#include <cstdint>

#include "async_units.hpp"

namespace fa::cuda::ptx {
inline void mbarrier_init(uint32_t bar, uint32_t count) { emu::hopper::mbarrier_init(bar, count); }
inline void fence_mbarrier_init() {}
inline void mbarrier_arrive(uint32_t bar) { emu::hopper::mbarrier_arrive(bar, 0, "mbarrier.arrive"); }
inline void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    emu::hopper::mbarrier_arrive(bar, bytes, "mbarrier.arrive.expect_tx");
}
inline bool mbarrier_try_wait_parity(uint32_t bar, uint32_t parity) { return emu::hopper::mbarrier_try_wait_parity(bar, parity); }
inline void mbarrier_wait_parity(uint32_t bar, uint32_t parity) {
    while (!mbarrier_try_wait_parity(bar, parity)) {
    }
}
inline void mbarrier_inval(uint32_t bar) { emu::hopper::mbarrier_inval(bar); }
inline void fence_proxy_async() {}
inline void fence_proxy_async_global() {}
}  // namespace fa::cuda::ptx
