// The warp emulator's launch: runs a kernel body on CPU threads (see cuda_runtime.h here).
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "fa/cuda/ptx.cuh"

namespace emu {

/// Runs `body` as `blocks` blocks of `threads` threads, one block after the other (block 0 first,
/// or with `last_block_first` the last block first), in `smem` bytes of shared memory at `shared`
/// filled with garbage before each block. Aborts on a cp.async group left pending at a thread's end.
inline void launch(long blocks, int threads, unsigned char* shared, size_t smem, const std::function<void()>& body,
                   bool last_block_first = false) {
    smem_base = shared;
    smem_limit = smem;
    for (long n = 0; n < blocks; ++n) {
        const long b = last_block_first ? blocks - 1 - n : n;
        std::memset(shared, 0xAB, smem);
        std::vector<Warp> warps(size_t(threads / 32));
        // The block's barrier lives on the heap and block_bar is cleared once the block's threads
        // have joined: the global never holds the address of a local that has gone out of scope.
        const auto bar = std::make_unique<std::barrier<>>(threads);
        block_bar = bar.get();
        std::vector<std::thread> pool;
        pool.reserve(size_t(threads));
        for (int t = 0; t < threads; ++t) {
            pool.emplace_back([&, t] {
                tid.x = unsigned(t), bid.x = unsigned(b), bdim.x = unsigned(threads), gdim.x = unsigned(blocks);
                lane = t % 32, warp = t / 32, gen = 0;
                w = &warps[size_t(warp)];
                groups.clear(), open_group.clear();
                body();
                if (!groups.empty() || !open_group.empty()) {
                    std::fprintf(stderr, "emulator: cp.async copies left pending at the end of a thread\n");
                    std::abort();
                }
            });
        }
        for (std::thread& th : pool) th.join();
        block_bar = nullptr;
    }
}

}  // namespace emu
