// The warp emulator's Hopper units: what works beside a block's threads on an H100 (its mbarriers,
// the TMA, the tensor cores' queue of wgmma, the named barriers), as the state the emulated
// wrappers of fa/cuda/{mbarrier,tma,wgmma,warpgroup}.cuh here share.
//
// The asynchrony is kept, so that the bugs it causes show here as on the GPU:
// - a TMA load lands (its bytes in shared memory, then its complete_tx on the mbarrier) only when
//   no thread of the block can run, one load at a time, in an order shuffled anew for each block:
//   a thread that reads a tile before its phase completes reads the garbage the block started with
//   (a test may set eager_loads instead: each load lands as it is issued, which shows a slot
//   released to the producer too early);
// - a wgmma reads its operands and writes its accumulators only when every thread of its warpgroup
//   has reached a wgmma.wait_group that covers it: a kernel that overwrites an operand, or touches
//   an accumulator, before the wait computes with what is there then;
// - a bulk store or reduction reads its shared source at cp.async.bulk.wait_group.read (or
//   wait_group), and writes global memory at wait_group, or at the thread's end at the latest;
//   the thread that waits lets every other thread run first, until none can (the read lands in
//   stall()), so a buffer handed back to its writers before the read is overwritten under it.
//
// A thread that waits (mbarrier.try_wait, bar.sync, wgmma.wait_group) is a fiber parked on a
// fibers::Barrier that moves when what it waits for may have changed. When no fiber can run,
// stall() lands the next TMA load; with none left, each waiting try_wait returns false (the
// hardware's time limit, after which the caller's loop may ask again), unless its thread has timed
// out kTimeouts times in a row while nothing in the block changed: a loop that can only spin. With
// none left to time out, the block is deadlocked, and the message names what each thread waits for.
// What the PTX ISA leaves undefined stops the emulator with a message too: an mbarrier used before
// mbarrier.init or overwritten by plain stores, loads still landing at the block's end, a named
// barrier left half full, wgmma groups never waited for, bulk stores whose source was never read.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>

#include "fa/cuda/ptx.cuh"

namespace emu::hopper {

[[noreturn]] inline void fail(const char* format, ...) {
    std::va_list args;
    va_start(args, format);
    std::fputs("emulator: ", stderr);
    std::vfprintf(stderr, format, args);
    std::fputc('\n', stderr);
    va_end(args);
    std::abort();
}

/// One mbarrier (mbarrier.init): the PTX ISA's pending arrival count and transaction count of its
/// current phase, and how many phases have completed (the current phase's parity is `completed & 1`).
struct Mbarrier {
    uint32_t count = 0;     // arrivals each phase expects
    uint32_t pending = 0;   // arrivals the current phase still lacks
    int64_t tx = 0;         // transaction bytes it still lacks: expect_tx adds, complete_tx takes away
    uint64_t completed = 0;
    fibers::Barrier changed{0, "an mbarrier"};  // its phase moves with `completed`
};

/// bar.sync / bar.arrive `id`: the thread count the current use announced, and the arrivals so far.
struct NamedBarrier {
    uint32_t expected = 0, arrived = 0;
    fibers::Barrier done{0, "a named barrier"};
};

/// One wgmma.mma_async of a warpgroup: the instruction (the same in all 128 threads) and each
/// thread's registers: its accumulators and, in the RS form, its A fragment.
struct WgmmaOp {
    int n = 0;
    bool f16 = false, rs = false, trans_b = false, accumulate = false;
    bool trans_a = false;  // SS form only: A stored MN-major (imm-trans-a)
    uint64_t desc_a = 0, desc_b = 0;
    float* d[128] = {};
    const uint32_t* a[128] = {};
    int issued = 0;
};

/// A warpgroup's wgmma in flight: every op issued so far that has not run, and its groups.
struct Warpgroup {
    std::deque<WgmmaOp> ops;         // ops [base, base + size) of the warpgroup's sequence
    size_t base = 0;
    std::vector<size_t> group_end;   // group g holds the ops [group_end[g - 1], group_end[g])
    size_t executed = 0;             // groups run so far
    size_t cover[128] = {};          // per thread: the groups its latest wgmma.wait_group needs run
    fibers::Barrier done{0, "wgmma.wait_group"};
    std::vector<int> setmaxnreg[4];  // per warp: the register counts its setmaxnreg asked for, in order
};

/// A cp.async.bulk operation of one thread, from shared memory to global: a TMA store or
/// reduction of a box (`map`), or a plain reduction of `bytes` bytes at `dst`.
struct BulkOp {
    enum Kind { Store, ReduceAdd, ReduceAddPlain } kind;
    CUtensorMap map;
    int coords[5];
    uint32_t src;
    float* dst;
    uint32_t bytes;
    std::vector<unsigned char> data;  // the shared source, once read
    bool read = false;
};

/// A TMA load in flight: the box at `coords` of `map` into shared memory at `dst`, counted on `bar`.
struct TmaLoad {
    CUtensorMap map;
    int coords[5];
    uint32_t dst, bar;
};

/// What one thread keeps besides its registers: its bulk groups, its count of wgmma issued and
/// groups committed, and what it waits for (for the deadlock message).
struct ThreadState {
    std::vector<std::vector<BulkOp>> bulk_groups;  // committed, oldest first
    std::vector<BulkOp> bulk_open;                 // since the last cp.async.bulk.commit_group
    size_t wgmma_issued = 0, wgmma_committed = 0;
    bool wgmma_fenced = false;
    enum class Wait { None, Mbarrier, Named, Wgmma } wait = Wait::None;
    uint32_t wait_on = 0, wait_parity = 0;
    bool polling = false;             // parked in an mbarrier.try_wait, which may time out
    uint64_t timed_out_at = ~0ull;    // Block::progress at its latest time-out,
    int timeouts = 0;                 // and its time-outs since the block last changed
    char why[224] = {};
};

/// The running block's units.
struct Block {
    int threads = 0;
    std::vector<ThreadState> thread;
    std::map<uint32_t, Mbarrier> mbarriers;  // by shared address
    NamedBarrier named[16];
    std::vector<Warpgroup> warpgroups;
    std::vector<TmaLoad> loads;  // issued, not landed
    uint64_t progress = 0;       // grows with every change a try_wait might wait for
    uint64_t rng = 0;            // which load lands next
    // Threads at a cp.async.bulk.wait_group(.read) whose copies have not yet read their source:
    // they wait on `bulk_settle` until no other thread can run (stall() moves it), so the read
    // happens as late as the hardware may do it, after whatever the others do meanwhile.
    fibers::Barrier bulk_settle{0, "cp.async.bulk.wait_group: the copies read their shared source only when no thread can run"};
    int bulk_readers = 0;
};
inline Block block;

/// Time-outs of one thread's try_wait in a row, nothing in the block changing, before its wait counts
/// as one that nothing will end (a spin loop on a phase that never completes).
inline constexpr int kTimeouts = 4;

inline ThreadState& me() { return block.thread[self()->tid.x]; }

inline uint64_t next_random() {
    uint64_t z = (block.rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

inline unsigned char* shared(uint32_t address, uint32_t bytes) {
    check_smem(address, bytes);
    return smem_base + address;
}

/// The swizzle of TMA boxes and wgmma operands (Swizzle<b, 4, 3> of the PTX ISA on byte
/// addresses): bits [4, 4 + b) of the address XOR bits [7, 7 + b), b = log2(width / 16) for a
/// swizzle `width` bytes wide (32, 64 or 128; 0: none). A function of the address, not of the
/// position in the tile: why a swizzled tile starts on a multiple of 1024 bytes, and why a
/// descriptor 32 bytes further reads the next 16 columns.
inline uint32_t swizzle_address(uint32_t address, uint32_t width) {
    const uint32_t mask = width >= 32 ? width / 16 - 1 : 0;
    return address ^ (((address >> 7) & mask) << 4);
}

// ------------------------------------------------------------------ mbarrier

inline uint64_t mbarrier_tag(uint32_t address) { return 0x6d62617200000000ull ^ address; }  // "mbar"

/// The live mbarrier at `address`; aborts if there is none, or if plain stores overwrote its 8 bytes.
inline Mbarrier& mbarrier(uint32_t address, const char* op) {
    const auto it = block.mbarriers.find(address);
    if (it == block.mbarriers.end()) fail("%s on shared address 0x%x, where no mbarrier.init made an mbarrier", op, address);
    uint64_t word;
    std::memcpy(&word, shared(address, 8), 8);
    if (word != mbarrier_tag(address)) {
        fail("%s on the mbarrier at shared 0x%x, whose 8 bytes ordinary stores have overwritten", op, address);
    }
    return it->second;
}

/// The current phase completes when it lacks no arrival and no transaction byte: the parity flips,
/// the counts reload, and the threads that wait for it run again.
inline void settle(Mbarrier& b) {
    if (b.pending != 0 || b.tx != 0) return;
    ++b.completed;
    b.pending = b.count;
    ++b.changed.phase;
    ++block.progress;
}

inline void mbarrier_init(uint32_t address, uint32_t count) {
    if (address % 8 != 0) fail("mbarrier.init at shared 0x%x: not 8-byte aligned", address);
    if (count < 1 || count >= (1u << 20)) fail("mbarrier.init at shared 0x%x with count %u (1 .. 2^20 - 1)", address, count);
    if (block.mbarriers.count(address)) fail("mbarrier.init at shared 0x%x on a live mbarrier (mbarrier.inval it first)", address);
    Mbarrier& b = block.mbarriers[address];
    b.count = b.pending = count;
    const uint64_t tag = mbarrier_tag(address);
    std::memcpy(shared(address, 8), &tag, 8);
    ++block.progress;
}

/// mbarrier.arrive{.expect_tx}: `bytes` more transaction bytes for the current phase, then one arrival.
inline void mbarrier_arrive(uint32_t address, uint32_t bytes, const char* op) {
    Mbarrier& b = mbarrier(address, op);
    if (bytes >= (1u << 20)) fail("%s on shared 0x%x with %u bytes: the transaction count holds at most 2^20 - 1", op, address, bytes);
    if (b.pending == 0) fail("%s on shared 0x%x: its phase has all its %u arrivals and waits for bytes only", op, address, b.count);
    b.tx += bytes;
    --b.pending;
    ++block.progress;
    settle(b);
}

/// complete_tx of a TMA load that landed.
inline void mbarrier_complete_tx(uint32_t address, uint32_t bytes) {
    Mbarrier& b = mbarrier(address, "a TMA load's complete_tx");
    b.tx -= bytes;
    ++block.progress;
    settle(b);
}

inline void describe_wait(ThreadState& t);

/// mbarrier.try_wait.parity: whether the phase of parity `parity` has completed, i.e. the current
/// phase's parity is the other one. If not, the thread parks until the barrier's phase moves, or
/// until stall() lets it time out (it answers false then).
inline bool mbarrier_try_wait_parity(uint32_t address, uint32_t parity) {
    const char* op = "mbarrier.try_wait.parity";
    if ((mbarrier(address, op).completed & 1) != (parity & 1)) return true;
    ThreadState& t = me();
    t.wait = ThreadState::Wait::Mbarrier, t.wait_on = address, t.wait_parity = parity & 1;
    describe_wait(t);
    t.polling = true;
    Mbarrier& b = mbarrier(address, op);
    fibers::wait_for(b.changed, b.changed.phase, t.why);
    t.polling = false;
    t.wait = ThreadState::Wait::None;
    return (mbarrier(address, op).completed & 1) != (parity & 1);
}

inline void mbarrier_inval(uint32_t address) {
    mbarrier(address, "mbarrier.inval");
    block.mbarriers.erase(address);
}

// ------------------------------------------------------------------ named barriers

/// bar.arrive (`wait` false) or bar.sync (`wait` true) on barrier `id` for `count` threads.
inline void named_barrier(uint32_t id, uint32_t count, bool wait) {
    const char* op = wait ? "bar.sync" : "bar.arrive";
    if (id == 0 || id > 15) fail("%s %u: barriers 1..15 are modeled (0 is __syncthreads')", op, id);
    if (count == 0 || count % 32 != 0 || int(count) > block.threads) {
        fail("%s %u, %u: the thread count must be a multiple of 32 up to the block's %d", op, id, count, block.threads);
    }
    NamedBarrier& nb = block.named[id];
    if (nb.arrived == 0) nb.expected = count;
    if (nb.expected != count) fail("%s %u, %u while the barrier's current use counts %u threads", op, id, count, nb.expected);
    ++block.progress;
    if (++nb.arrived == nb.expected) {
        nb.arrived = 0;
        ++nb.done.phase;
        return;
    }
    if (!wait) return;
    ThreadState& t = me();
    t.wait = ThreadState::Wait::Named, t.wait_on = id;
    describe_wait(t);
    fibers::wait_for(nb.done, nb.done.phase, t.why);
    t.wait = ThreadState::Wait::None;
}

// ------------------------------------------------------------------ the TMA

/// The fields of the map a TMA instruction names, checked against the instruction's rank.
inline const TensorMap& tensor_map(const CUtensorMap* map, uint32_t rank, const char* op) {
    const TensorMap* m = tensor_map_fields(map);
    if (m == nullptr) fail("%s: the tensor map was not written by cuTensorMapEncodeTiled", op);
    if (m->rank != rank) fail("%s: a %ud instruction on a tensor map of rank %u", op, rank, m->rank);
    return *m;
}

inline uint32_t box_bytes(const TensorMap& m) {
    uint32_t n = m.element_bytes;
    for (uint32_t i = 0; i < m.rank; ++i) n *= m.box[i];
    return n;
}

/// Calls `element(shared address, global address or null outside the tensor)` for every element of
/// the box at `coords` of map `m`, whose shared copy starts at `box` (the box's elements row after
/// row, innermost dimension first, each row swizzled by its address).
template <class Fn>
void for_each_box_element(const TensorMap& m, const int* coords, uint32_t box, Fn element) {
    uint32_t index[5] = {0, 0, 0, 0, 0};
    const uint32_t count = box_bytes(m) / m.element_bytes;
    const uint32_t width = swizzle_bytes(m.swizzle);
    for (uint32_t e = 0; e < count; ++e) {
        bool inside = true;
        int64_t offset = 0;
        for (uint32_t i = 0; i < m.rank; ++i) {
            const int64_t c = int64_t(coords[i]) + index[i];
            inside = inside && c >= 0 && uint64_t(c) < m.dims[i];
            offset += c * int64_t(m.strides[i]);
        }
        element(swizzle_address(box + e * m.element_bytes, width), inside ? m.address + offset : nullptr);
        for (uint32_t i = 0; i < m.rank && ++index[i] == m.box[i]; ++i) index[i] = 0;
    }
}

/// Checks a box's shared address as the PTX ISA asks (128-byte aligned; with a swizzle, rows as
/// wide as it, since narrower swizzled rows are not modeled here) and that it fits.
inline void check_box(const TensorMap& m, uint32_t box, const char* op) {
    const uint32_t width = swizzle_bytes(m.swizzle);
    if (box % 128 != 0) fail("%s: shared address 0x%x is not 128-byte aligned", op, box);
    if (width != 0 && m.box[0] * m.element_bytes != width) {
        fail("%s: a box row of %u bytes under a %u-byte swizzle (only rows as wide as the swizzle are modeled)", op,
             m.box[0] * m.element_bytes, width);
    }
    check_smem(box, box_bytes(m));
}

/// When true, a TMA load lands the moment it is issued instead of when no thread can run: the
/// other extreme of the hardware's timing. Landing late shows a tile read before its full barrier's
/// phase completes; landing at once shows a slot handed back to the producer (an empty barrier
/// arrived on) while its readers still need it: the next round's bytes replace the tile under
/// them. Off by default; a test sets it around the launches it checks that way.
inline bool eager_loads = false;

inline void land(const TmaLoad& load);

/// cp.async.bulk.tensor (load): remembered; it lands in stall() (or here, with eager_loads).
inline void tma_load(uint32_t dst, const CUtensorMap* map, uint32_t bar, const int* coords, uint32_t rank) {
    const char* op = "cp.async.bulk.tensor (load)";
    const TensorMap& m = tensor_map(map, rank, op);
    check_box(m, dst, op);
    mbarrier(bar, op);
    TmaLoad load{*map, {0, 0, 0, 0, 0}, dst, bar};
    std::memcpy(load.coords, coords, rank * sizeof(int));
    if (eager_loads) {
        land(load);
        return;
    }
    block.loads.push_back(load);
}

/// A TMA load lands: the box's bytes (zeros outside the tensor), then their count on the mbarrier.
inline void land(const TmaLoad& load) {
    const TensorMap& m = *tensor_map_fields(&load.map);
    for_each_box_element(m, load.coords, load.dst, [&](uint32_t s, const unsigned char* g) {
        if (g != nullptr) std::memcpy(smem_base + s, g, m.element_bytes);
        else std::memset(smem_base + s, 0, m.element_bytes);
    });
    mbarrier_complete_tx(load.bar, box_bytes(m));
}

/// cp.async.bulk.tensor (store) and cp.reduce.async.bulk.tensor: joins this thread's open bulk group.
inline void tma_to_global(BulkOp::Kind kind, const CUtensorMap* map, uint32_t src, const int* coords, uint32_t rank) {
    const char* op = kind == BulkOp::Store ? "cp.async.bulk.tensor (store)" : "cp.reduce.async.bulk.tensor .add";
    const TensorMap& m = tensor_map(map, rank, op);
    if (kind == BulkOp::ReduceAdd && m.type != CU_TENSOR_MAP_DATA_TYPE_FLOAT32) {
        fail("%s: a tensor map of type %d (only the .add of float32 is modeled)", op, int(m.type));
    }
    check_box(m, src, op);
    BulkOp b{kind, *map, {0, 0, 0, 0, 0}, src, nullptr, box_bytes(m), {}, false};
    std::memcpy(b.coords, coords, rank * sizeof(int));
    me().bulk_open.push_back(std::move(b));
}

/// cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32: joins this thread's open bulk group.
inline void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
    const char* op = "cp.reduce.async.bulk .add.f32";
    if (bytes == 0 || bytes % 16 != 0) fail("%s of %u bytes: a positive multiple of 16", op, bytes);
    if (src % 16 != 0 || reinterpret_cast<uintptr_t>(dst) % 16 != 0) fail("%s: addresses must be 16-byte aligned", op);
    check_smem(src, bytes);
    me().bulk_open.push_back(BulkOp{BulkOp::ReduceAddPlain, {}, {0, 0, 0, 0, 0}, src, dst, bytes, {}, false});
}

inline void bulk_read(BulkOp& b) {
    if (b.read) return;
    b.data.assign(smem_base + b.src, smem_base + b.src + b.bytes);
    b.read = true;
}

/// The global writes of an operation whose source has been read: outside the tensor, nothing.
inline void bulk_write(BulkOp& b) {
    bulk_read(b);
    if (b.kind == BulkOp::ReduceAddPlain) {
        for (uint32_t i = 0; i < b.bytes / 4; ++i) {
            float x;
            std::memcpy(&x, b.data.data() + 4 * i, 4);
            b.dst[i] += x;
        }
        return;
    }
    const TensorMap& m = *tensor_map_fields(&b.map);
    for_each_box_element(m, b.coords, b.src, [&](uint32_t s, const unsigned char* g) {
        if (g == nullptr) return;
        unsigned char* out = const_cast<unsigned char*>(g);
        const unsigned char* in = b.data.data() + (s - b.src);
        if (b.kind == BulkOp::Store) {
            std::memcpy(out, in, m.element_bytes);
        } else {
            float x, y;
            std::memcpy(&x, out, 4), std::memcpy(&y, in, 4);
            x += y;
            std::memcpy(out, &x, 4);
        }
    });
}

inline void bulk_commit_group() {
    ThreadState& t = me();
    t.bulk_groups.push_back(std::move(t.bulk_open));
    t.bulk_open.clear();
}

/// cp.async.bulk.wait_group.read N (`write` false): the oldest groups with a source not yet read
/// read theirs, until at most N such groups are left. cp.async.bulk.wait_group N (`write` true): the
/// oldest groups read and write theirs and are gone, until at most N are left.
inline void bulk_wait_group(int n, bool write) {
    std::vector<std::vector<BulkOp>>& groups = me().bulk_groups;
    bool unread_beyond_n = false;
    for (size_t g = 0; g + size_t(n) < groups.size(); ++g)
        for (const BulkOp& b : groups[g]) unread_beyond_n = unread_beyond_n || !b.read;
    if (unread_beyond_n) {  // the reads land late: everyone else runs first
        ++block.bulk_readers;
        fibers::wait_for(block.bulk_settle, block.bulk_settle.phase, block.bulk_settle.what);
        --block.bulk_readers;
    }
    if (write) {
        while (int(groups.size()) > n) {
            for (BulkOp& b : groups.front()) bulk_write(b);
            groups.erase(groups.begin());
        }
        return;
    }
    const auto unread = [](const std::vector<BulkOp>& g) {
        for (const BulkOp& b : g)
            if (!b.read) return true;
        return false;
    };
    int pending = 0;
    for (const auto& g : groups) pending += unread(g);
    for (auto& g : groups) {
        if (pending <= n) break;
        if (!unread(g)) continue;
        for (BulkOp& b : g) bulk_read(b);
        --pending;
    }
}

// ------------------------------------------------------------------ wgmma

inline Warpgroup& warpgroup(const char* op) {
    const unsigned w = self()->tid.x / 128;
    if (w >= block.warpgroups.size()) fail("%s in thread %u: the block's threads are not whole warpgroups", op, self()->tid.x);
    return block.warpgroups[w];
}

/// The shared address of element (mn, k) of a 16-bit wgmma operand (mn: the row of A or the
/// column of B; k < 16) through `desc`, by the PTX ISA's canonical layouts in units of T = 8
/// elements: K-major ((8,m),(T,2k)):((W/2,SBO),(1,T)) under a W-byte swizzle and
/// ((8,m),(T,2k)):((T,SBO),(1,LBO)) without; MN-major ((T,W/16,m),(8,k)):((1,T,LBO),(W/2,SBO)) and
/// ((T,1,m),(8,k)):((1,T,SBO),(T,LBO)); then the swizzle on the address.
inline uint32_t operand_address(uint64_t desc, bool mn_major, int mn, int k) {
    const uint32_t start = uint32_t(desc & 0x3FFF) << 4, lbo = uint32_t((desc >> 16) & 0x3FFF) << 4;
    const uint32_t sbo = uint32_t((desc >> 32) & 0x3FFF) << 4, base_offset = uint32_t(desc >> 49) & 7;
    const uint32_t mode = uint32_t(desc >> 62), width = mode == 0 ? 0 : 256u >> mode;  // 1: 128 B, 2: 64 B, 3: 32 B
    if (base_offset != 0) fail("wgmma descriptor 0x%llx: a base offset other than 0 is not modeled", (unsigned long long)desc);
    const uint32_t m = uint32_t(mn), kk = uint32_t(k);
    uint32_t off;
    if (!mn_major) {
        off = width ? (m % 8) * width + (m / 8) * sbo + kk * 2 : (m % 8) * 16 + (m / 8) * sbo + (kk / 8) * lbo + (kk % 8) * 2;
    } else if (width) {
        const uint32_t per_row = width / 2;  // elements of MN in one swizzled row
        off = (m % per_row) * 2 + (m / per_row) * lbo + (kk % 8) * width + (kk / 8) * sbo;
    } else {
        off = (m % 8) * 2 + (m / 8) * sbo + (kk % 8) * 16 + (kk / 8) * lbo;
    }
    return swizzle_address(start + off, width);
}

inline float operand(uint64_t desc, bool mn_major, int mn, int k, bool f16) {
    uint16_t h;
    std::memcpy(&h, shared(operand_address(desc, mn_major, mn, k), 2), 2);
    return f16 ? to_f<__half>(h) : to_f<__nv_bfloat16>(h);
}

/// Runs one wgmma for its whole warpgroup: D (64 x N) = A (64 x 16) B (16 x N) + (accumulate ? D : 0),
/// each sum in float32, k in order. The fragments by the PTX ISA (register fragments of
/// wgmma.m64nNk16): thread t's accumulator i is D(16 w + g + 8 ((i % 4) / 2), 8 (i / 4) + 2 q + i % 2);
/// its A register r holds A(16 w + g + 8 (r % 2), 8 (r / 2) + 2 q + half), with w = t / 32,
/// g = (t % 32) / 4, q = t % 4, the lower half first.
inline void run_wgmma(const WgmmaOp& op) {
    static float A[64][16], B[16][256], D[64][256];
    for (int t = 0; t < 128; ++t) {
        const int w = t / 32, g = (t % 32) / 4, q = t % 4;
        for (int i = 0; i < op.n / 2; ++i) {
            D[16 * w + g + 8 * ((i % 4) / 2)][8 * (i / 4) + 2 * q + i % 2] = op.accumulate ? op.d[t][i] : 0.0f;
        }
        if (op.rs) {
            for (int r = 0; r < 4; ++r)
                for (int half = 0; half < 2; ++half) {
                    const uint16_t h = uint16_t(op.a[t][r] >> (16 * half));
                    A[16 * w + g + 8 * (r % 2)][8 * (r / 2) + 2 * q + half] = op.f16 ? to_f<__half>(h) : to_f<__nv_bfloat16>(h);
                }
        }
    }
    if (!op.rs) {
        for (int m = 0; m < 64; ++m)
            for (int k = 0; k < 16; ++k) A[m][k] = operand(op.desc_a, op.trans_a, m, k, op.f16);
    }
    for (int k = 0; k < 16; ++k)
        for (int n = 0; n < op.n; ++n) B[k][n] = operand(op.desc_b, op.trans_b, n, k, op.f16);
    for (int m = 0; m < 64; ++m)
        for (int n = 0; n < op.n; ++n) {
            float s = D[m][n];
            for (int k = 0; k < 16; ++k) s = std::fma(A[m][k], B[k][n], s);
            D[m][n] = s;
        }
    for (int t = 0; t < 128; ++t) {
        const int w = t / 32, g = (t % 32) / 4, q = t % 4;
        for (int i = 0; i < op.n / 2; ++i) op.d[t][i] = D[16 * w + g + 8 * ((i % 4) / 2)][8 * (i / 4) + 2 * q + i % 2];
    }
}

/// wgmma.mma_async: joins the warpgroup's queue; its product waits for wgmma.wait_group.
inline void wgmma_issue(int n, bool f16, bool rs, bool trans_b, bool accumulate, uint64_t desc_a, uint64_t desc_b, float* d,
                        const uint32_t* a, bool trans_a = false) {
    const char* op = "wgmma.mma_async";
    Warpgroup& wg = warpgroup(op);
    ThreadState& t = me();
    if (!t.wgmma_fenced) fail("%s in thread %u before any wgmma.fence (the PTX ISA asks for one first)", op, self()->tid.x);
    const size_t seq = t.wgmma_issued++;
    if (seq < wg.base) fail("%s: thread %u issues an op its warpgroup has already run", op, self()->tid.x);
    if (seq - wg.base == wg.ops.size()) {
        WgmmaOp w;
        w.n = n, w.f16 = f16, w.rs = rs, w.trans_b = trans_b, w.accumulate = accumulate, w.desc_a = rs ? 0 : desc_a, w.desc_b = desc_b;
        w.trans_a = trans_a;
        wg.ops.push_back(w);
    }
    WgmmaOp& w = wg.ops[seq - wg.base];
    if (w.n != n || w.f16 != f16 || w.rs != rs || w.trans_b != trans_b || w.trans_a != trans_a || w.accumulate != accumulate ||
        w.desc_a != (rs ? 0 : desc_a) || w.desc_b != desc_b) {
        fail("%s: thread %u's op %zu differs from its warpgroup's (shape, type, form, transpose, scale-d or descriptors)", op,
             self()->tid.x, seq);
    }
    const int lane = int(self()->tid.x % 128);
    w.d[lane] = d, w.a[lane] = a;
    ++w.issued;
}

inline void wgmma_fence() { me().wgmma_fenced = true; }

inline void wgmma_commit_group() {
    Warpgroup& wg = warpgroup("wgmma.commit_group");
    ThreadState& t = me();
    const size_t g = t.wgmma_committed++;
    if (g == wg.group_end.size()) wg.group_end.push_back(t.wgmma_issued);
    if (wg.group_end[g] != t.wgmma_issued) {
        fail("wgmma.commit_group: thread %u's group %zu holds other ops than its warpgroup's", self()->tid.x, g);
    }
}

/// wgmma.wait_group N: the groups but the newest N run, once every thread of the warpgroup waits for them.
inline void wgmma_wait_group(int n) {
    Warpgroup& wg = warpgroup("wgmma.wait_group");
    ThreadState& t = me();
    const size_t target = t.wgmma_committed > size_t(n) ? t.wgmma_committed - size_t(n) : 0;
    wg.cover[self()->tid.x % 128] = target;
    while (wg.executed < target) {
        size_t ready = target;
        for (size_t c : wg.cover) ready = c < ready ? c : ready;
        if (ready > wg.executed) {
            for (; wg.executed < ready; ++wg.executed) {
                while (wg.base < wg.group_end[wg.executed]) {
                    if (wg.ops.front().issued != 128) fail("wgmma: an op run before all 128 threads issued it");
                    run_wgmma(wg.ops.front());
                    wg.ops.pop_front();
                    ++wg.base;
                }
            }
            ++wg.done.phase;
            ++block.progress;
            continue;
        }
        t.wait = ThreadState::Wait::Wgmma, t.wait_on = uint32_t(target - 1);
        describe_wait(t);
        fibers::wait_for(wg.done, wg.done.phase, t.why);
        t.wait = ThreadState::Wait::None;
    }
}

/// setmaxnreg: the warp's threads meet (.sync); the count is recorded per warp, so that the block's
/// end can check that every warp of the warpgroup asked for the same (.aligned). The register file
/// itself is not modeled: an .inc never waits for registers another warpgroup has not given back.
inline void setmaxnreg(int count) {
    Thread& th = *self();
    fibers::arrive_and_wait(th.w->bar);
    if (th.lane == 0) warpgroup("setmaxnreg").setmaxnreg[th.warp % 4].push_back(count);
}

// ------------------------------------------------------------------ the block

inline void describe_wait(ThreadState& t) {
    const size_t n = sizeof t.why;
    switch (t.wait) {
        case ThreadState::Wait::Mbarrier: {
            const auto it = block.mbarriers.find(t.wait_on);
            if (it == block.mbarriers.end()) {
                std::snprintf(t.why, n, "mbarrier at shared 0x%x (no longer live)", t.wait_on);
                break;
            }
            const Mbarrier& b = it->second;
            std::snprintf(t.why, n,
                          "mbarrier.try_wait.parity %u at shared 0x%x: its phase %llu (parity %u) lacks %u of %u arrivals "
                          "and %lld transaction bytes",
                          t.wait_parity, t.wait_on, (unsigned long long)b.completed, unsigned(b.completed & 1), b.pending,
                          b.count, (long long)b.tx);
            break;
        }
        case ThreadState::Wait::Named: {
            const NamedBarrier& nb = block.named[t.wait_on];
            std::snprintf(t.why, n, "bar.sync %u, %u: %u threads have arrived", t.wait_on, nb.expected, nb.arrived);
            break;
        }
        case ThreadState::Wait::Wgmma:
            std::snprintf(t.why, n, "wgmma.wait_group: group %u of warpgroup %u, which runs once all 128 of its threads wait for it",
                          t.wait_on, unsigned(&t - block.thread.data()) / 128);
            break;
        case ThreadState::Wait::None: t.why[0] = '\0'; break;
    }
}

/// No thread can run: the next TMA load lands; else the waiting try_waits time out (but not one
/// that timed out kTimeouts times since the block last changed); else nothing can change (and each
/// waiter's message is brought up to date).
inline bool stall() {
    if (block.bulk_readers > 0) {  // the bulk copies waited for read their sources now
        ++block.bulk_settle.phase;
        return true;
    }
    if (!block.loads.empty()) {
        const size_t i = size_t(next_random() % block.loads.size());
        const TmaLoad load = block.loads[i];
        block.loads.erase(block.loads.begin() + long(i));
        land(load);
        return true;
    }
    bool woke = false;
    for (int i = 0; i < fibers::round_size; ++i) {
        fibers::Fiber* f = fibers::turns[i];
        ThreadState& t = block.thread[static_cast<Thread*>(f)->tid.x];
        if (f->done || !t.polling || f->wait_at == nullptr) continue;
        if (t.timed_out_at != block.progress) t.timed_out_at = block.progress, t.timeouts = 0;
        if (t.timeouts == kTimeouts) continue;
        ++t.timeouts;
        f->wait_at = nullptr;
        woke = true;
    }
    if (!woke) {
        for (ThreadState& t : block.thread) describe_wait(t);
    }
    return woke;
}

inline void begin_block(int threads, uint64_t seed) {
    block.threads = threads;
    block.thread.assign(size_t(threads), ThreadState{});
    block.mbarriers.clear();
    for (NamedBarrier& nb : block.named) nb.expected = nb.arrived = 0;
    block.warpgroups.clear();
    block.warpgroups.resize(size_t(threads / 128));
    block.loads.clear();
    block.progress = 0;
    block.rng = seed;
    block.bulk_readers = 0;
    fibers::stall = &stall;
}

/// A thread's end: its wgmma all waited for, its bulk groups committed and read (then written).
inline void end_thread() {
    ThreadState& t = me();
    const unsigned tid = self()->tid.x;
    if (t.wgmma_issued > 0) {
        const Warpgroup& wg = block.warpgroups[tid / 128];
        if (t.wgmma_committed == 0 || wg.group_end[t.wgmma_committed - 1] != t.wgmma_issued) {
            fail("thread %u ended with wgmma not committed to a group", tid);
        }
        if (wg.executed < t.wgmma_committed) fail("thread %u ended with wgmma groups it never waited for (wgmma.wait_group)", tid);
    }
    if (!t.bulk_open.empty()) fail("thread %u ended with bulk copies not committed (cp.async.bulk.commit_group)", tid);
    for (auto& g : t.bulk_groups) {
        for (BulkOp& b : g) {
            if (!b.read) fail("thread %u ended before its bulk stores read shared memory (cp.async.bulk.wait_group.read)", tid);
            bulk_write(b);
        }
    }
    t.bulk_groups.clear();
}

/// The block's end: no load still landing, no named barrier half full, each warpgroup's warps
/// having asked setmaxnreg for the same counts.
inline void end_block(long label) {
    fibers::stall = nullptr;
    if (!block.loads.empty()) fail("block %ld ended with %zu TMA loads still landing in its shared memory", label, block.loads.size());
    for (uint32_t id = 1; id < 16; ++id) {
        const NamedBarrier& nb = block.named[id];
        if (nb.arrived != 0) {
            fail("block %ld ended with named barrier %u half full: %u of %u threads arrived", label, id, nb.arrived, nb.expected);
        }
    }
    for (size_t w = 0; w < block.warpgroups.size(); ++w) {
        const Warpgroup& wg = block.warpgroups[w];
        for (int k = 1; k < 4; ++k) {
            if (wg.setmaxnreg[k] != wg.setmaxnreg[0]) {
                fail("block %ld: the warps of warpgroup %zu asked setmaxnreg for different counts", label, w);
            }
        }
    }
}

}  // namespace emu::hopper
