/// \file fa/cuda/mbarrier.cuh
/// \brief Hopper's asynchronous barriers (`mbarrier` in shared memory) and the proxy fences that
/// go with the TMA and wgmma, one inline function per instruction (sm_90).
///
/// An mbarrier is a 64-bit word in shared memory that counts two things down for its current
/// *phase*: arrivals (threads calling arrive) and transaction bytes (announced with
/// `expect_tx`, counted down by the TMA as its copies land). When both reach zero the phase
/// completes, its *parity* bit flips, and the counts reload for the next phase. A waiter asks
/// "has the phase with parity p completed?", so a ring of buffers needs only one bit per slot:
///
///     producer: mbarrier_arrive_expect_tx(full[s], bytes); tma_load_...(..., full[s]);
///     consumer: mbarrier_wait_parity(full[s], phase);  ... use slot s ...  phase ^= (s wraps)
///
/// Addresses are 32-bit shared-memory addresses (fa::cuda::ptx::smem_address in ptx.cuh, or
/// __cvta_generic_to_shared), 8-byte aligned.
#pragma once

#include <cstdint>

namespace fa::cuda::ptx {

//! [mbarrier]
/// `mbarrier.init.shared::cta.b64 [bar], count`: phase 0 begins, expecting `count` arrivals
/// (and no transaction bytes). One thread initializes; fence_mbarrier_init() and a block-wide
/// barrier must follow before any other thread (or the TMA) uses it.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

/// `fence.mbarrier_init.release.cluster`: makes this thread's mbarrier_init visible to the
/// asynchronous proxy (the TMA unit), which will count transaction bytes on it.
__device__ __forceinline__ void fence_mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

/// `mbarrier.arrive.shared::cta.b64`: one arrival on the current phase (release semantics: this
/// thread's earlier writes are visible to whoever sees the phase complete).
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}

/// `mbarrier.arrive.expect_tx.shared::cta.b64 [bar], bytes`: announces that `bytes` more
/// transaction bytes will land in this phase (the TMA copies about to be issued), then arrives
/// once. The phase completes when the arrivals are in and every announced byte has landed.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}

/// `mbarrier.try_wait.parity.shared::cta.b64`: true once the phase with parity `parity` (0 or
/// 1) has completed. It may wait a while in hardware before answering false; call it in a loop
/// (mbarrier_wait_parity). Acquire semantics: after true, the data the phase guarded (e.g. the
/// bytes the TMA wrote) is visible to this thread.
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done != 0;
}

/// Waits until the phase with parity `parity` of `bar` has completed (mbarrier_try_wait_parity
/// in a loop).
__device__ __forceinline__ void mbarrier_wait_parity(uint32_t bar, uint32_t parity) {
    while (!mbarrier_try_wait_parity(bar, parity)) {
    }
}

/// `mbarrier.inval.shared::cta.b64`: ends the barrier's life, so its 8 bytes may be reused as
/// ordinary shared memory.
__device__ __forceinline__ void mbarrier_inval(uint32_t bar) {
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
//! [mbarrier]

//! [proxy]
/// `fence.proxy.async.shared::cta`: orders this thread's ordinary (generic-proxy) accesses to
/// shared memory with the asynchronous proxy's (wgmma operands read through descriptors, TMA
/// loads and stores). Needed after cp.async or plain stores fill a tile a wgmma will read, and
/// after plain stores fill a tile a TMA store will write out; a barrier then orders the other
/// threads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/// `fence.proxy.async.global`: the same for global memory. Orders this thread's ordinary accesses
/// to global memory (an acquiring load of a turn counter, the increment that passes the turn on)
/// with the asynchronous proxy's (a bulk reduction issued after the load, one completed before the
/// increment).
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }
//! [proxy]

}  // namespace fa::cuda::ptx
