// The warp emulator's launch: runs a kernel body on the CPU, each block's CUDA threads as fibers
// that take turns on the calling thread (see cuda_runtime.h and fibers.hpp here), beside the
// block's Hopper units (async_units.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "async_units.hpp"
#include "fa/cuda/ptx.cuh"

namespace emu {

inline std::vector<std::unique_ptr<Thread>> thread_pool;  // grown to the largest block, reused (stacks too)
inline const std::function<void()>* running_body = nullptr;
inline uint64_t blocks_run = 0;  // every block so far, of every launch: seeds each block's order of turns

/// A CUDA thread, from its fiber's start: the kernel, then the check that no copy is left pending
/// (cp.async here, wgmma and bulk copies in async_units.hpp).
inline void thread_main(fibers::Fiber*) {
    (*running_body)();
    const Thread& t = *self();
    if (!t.groups.empty() || !t.open_group.empty()) {
        std::fprintf(stderr, "emulator: cp.async copies left pending at the end of a thread\n");
        std::abort();
    }
    hopper::end_thread();
}

/// Runs `body` as `blocks` blocks of `threads` threads, one block after the other (block 0 first,
/// or with `last_block_first` the last block first), in `smem` bytes of shared memory at `shared`
/// filled with garbage before each block. Aborts on a cp.async group left pending at a thread's
/// end, on a deadlock (a barrier that not all of its block's or warp's threads reach, a wait that
/// nothing will end), and on what async_units.hpp checks at a thread's and a block's end.
/// A block's threads take turns (fibers.hpp) warp by warp: a warp's lanes one after the other up to
/// each of its collectives, and the next warp only when the whole warp waits at __syncthreads
/// (or has returned). So one warp runs from a __syncthreads to the next before the others start:
/// a __syncthreads missing between one warp's stores to shared memory and another's loads shows
/// as the loads reading what was there before (a __syncwarp missing, the same between lanes).
/// Which warp goes first, and the order of the lanes in each warp, are shuffled anew for each
/// block, from the count of blocks run so far: the same in every run of a program.
inline void launch(long blocks, int threads, unsigned char* shared, size_t smem, const std::function<void()>& body,
                   bool last_block_first = false) {
    if (threads <= 0 || threads % 32 != 0) {
        std::fprintf(stderr, "emulator: %d threads per block, not a positive multiple of 32\n", threads);
        std::abort();
    }
    smem_base = shared;
    smem_limit = smem;
    running_body = &body;
    while (thread_pool.size() < size_t(threads)) thread_pool.push_back(std::make_unique<Thread>());
    std::vector<fibers::Fiber*> order(static_cast<size_t>(threads));
    for (long n = 0; n < blocks; ++n) {
        const long b = last_block_first ? blocks - 1 - n : n;
        std::memset(shared, 0xAB, smem);
        std::vector<Warp> warps(size_t(threads / 32));
        fibers::Barrier bar{threads, "__syncthreads"};
        block_bar = &bar;
        for (int t = 0; t < threads; ++t) {
            Thread& th = *thread_pool[size_t(t)];
            th.tid = {unsigned(t), 0, 0}, th.bid = {unsigned(b), 0, 0};
            th.bdim = {unsigned(threads), 0, 0}, th.gdim = {unsigned(blocks), 0, 0};
            th.lane = t % 32, th.warp = t / 32, th.gen = 0;
            th.w = &warps[size_t(th.warp)];
            th.groups.clear(), th.open_group.clear();
        }
        // The order of turns: the warps shuffled, and the lanes of each (Fisher-Yates, splitmix64
        // written out: the same order from every standard library).
        uint64_t s = 0x9e3779b97f4a7c15ull * ++blocks_run;
        hopper::begin_block(threads, s);  // its TMA loads land in an order drawn from the same seed
        const auto shuffle = [&s](int* x, int count) {
            for (int i = 0; i < count; ++i) x[i] = i;
            for (int i = count - 1; i > 0; --i) {
                uint64_t z = (s += 0x9e3779b97f4a7c15ull);
                z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
                z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
                std::swap(x[i], x[int((z ^ (z >> 31)) % uint64_t(i + 1))]);
            }
        };
        std::vector<int> warp_order(warps.size());
        shuffle(warp_order.data(), int(warps.size()));
        for (size_t i = 0; i < warps.size(); ++i) {
            int lanes[32];
            shuffle(lanes, 32);
            for (int k = 0; k < 32; ++k) order[32 * i + size_t(k)] = thread_pool[size_t(32 * warp_order[i] + lanes[k])].get();
        }
        fibers::run(order.data(), threads, 32, &thread_main, b);
        hopper::end_block(b);
        block_bar = nullptr;
    }
    running_body = nullptr;
}

}  // namespace emu
