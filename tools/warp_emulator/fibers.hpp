// The warp emulator's fibers: a block's CUDA threads are fibers (a stack and a saved context each)
// that take turns on the one OS thread that runs emu::launch. A fiber runs until it waits at a
// Barrier (__syncthreads, or a warp collective: ldmatrix, mma, shuffles, __syncwarp), then
// switches straight to the next fiber that can run: a switch of a few registers, no system call.
// The fibers come in gangs (a warp each): the next fiber is the next of the waiting fiber's gang
// that can run (round robin), and only when the whole gang waits (at __syncthreads) or has
// returned, the first that can run of the gangs after it. A fiber that waits at a barrier no
// fiber can still reach (one that returned, or waits elsewhere) stops the emulator with a
// message: every fiber waiting and some not returned is a deadlock, unless `stall` (set by
// async_units.hpp: an asynchronous copy lands, a try_wait times out) lets one run again. Nothing
// preempts a fiber: a thread that spun on memory another thread of its block writes would never
// let it run (the kernels' only spin waits for another block: see __nanosleep in cuda_runtime.h;
// the mbarrier spin loops park in mbarrier.try_wait instead).
//
// The switch: on x86-64, six callee-saved registers pushed, the stack pointer swapped, six
// popped (emu_fiber_switch below); elsewhere, or with EMU_FIBERS_UCONTEXT defined, POSIX
// swapcontext (slower: glibc's makes a sigprocmask system call every switch; ASan warns once
// that it does not fully support it). The floating-point control state (MXCSR, x87) is not
// switched: no fiber changes it. Under AddressSanitizer every switch is announced to it
// (__sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber), and the frames a fiber
// never leaves (fiber_start, reschedule, switch_to) are not instrumented, so a returned fiber's
// stack holds no poisoned bytes when the next block reuses it.
//
// Stacks: kStackBytes each (the kernels keep large register arrays in their frames, ASan adds
// redzones; the kernels of stages 07 and 09 use about 8 KiB, with ASan too), mapped once with a
// guard page below (an overflow faults at once) and reused by every later run(); pages are only
// committed as they are touched.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_FIBERS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_FIBERS_ASAN 1
#endif
#endif
#if defined(EMU_FIBERS_ASAN)
#include <sanitizer/common_interface_defs.h>
#define EMU_FIBERS_NO_ASAN __attribute__((no_sanitize_address, noinline))
#else
#define EMU_FIBERS_NO_ASAN
#endif

#if !defined(__x86_64__) && !defined(EMU_FIBERS_UCONTEXT)
#define EMU_FIBERS_UCONTEXT 1
#endif
#if defined(EMU_FIBERS_UCONTEXT)
#include <ucontext.h>
#else
// emu_fiber_switch(save, load): pushes the callee-saved registers (the return address is already
// on the stack), stores the stack pointer at *save, takes `load` as the stack pointer, pops the
// registers another emu_fiber_switch (or fiber_stack's initial frame) pushed there, and returns on
// that stack. emu_fiber_trampoline: a new fiber's first return lands here; it calls r13(r12).
// Weak symbols: every translation unit that includes this header may define them.
extern "C" void emu_fiber_switch(void** save, void* load);
extern "C" void emu_fiber_trampoline();
__asm__(
    ".text\n"
    ".p2align 4\n"
    ".weak emu_fiber_switch\n"
    ".type emu_fiber_switch, @function\n"
    "emu_fiber_switch:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size emu_fiber_switch, .-emu_fiber_switch\n"
    ".p2align 4\n"
    ".weak emu_fiber_trampoline\n"
    ".type emu_fiber_trampoline, @function\n"
    "emu_fiber_trampoline:\n"
    "  movq %r12, %rdi\n"
    "  callq *%r13\n"
    "  ud2\n"
    ".size emu_fiber_trampoline, .-emu_fiber_trampoline\n");
#endif

namespace emu::fibers {

#if defined(EMU_FIBERS_ASAN)
inline constexpr size_t kStackBytes = size_t(4) << 20;
#else
inline constexpr size_t kStackBytes = size_t(1) << 20;
#endif

/// A meeting point of `count` fibers, used over and over: a phase ends (`phase` grows by one)
/// when the count-th fiber arrives, and releases the fibers that wait for it.
struct Barrier {
    int count;
    const char* what;  // for the deadlock message: "__syncthreads", "a warp collective or __syncwarp"
    int arrived = 0;
    uint64_t phase = 0;
};

struct Fiber {
    Fiber() = default;
    Fiber(const Fiber&) = delete;
    Fiber& operator=(const Fiber&) = delete;
    ~Fiber() {
        if (mapping != nullptr) munmap(mapping, kStackBytes + guard_bytes());
    }
    static size_t guard_bytes() { return size_t(sysconf(_SC_PAGESIZE)); }

    void* mapping = nullptr;                // guard page, then the stack
    unsigned char* stack = nullptr;         // the stack's lowest byte (kStackBytes of them)
    size_t stack_bytes = 0;                 // (main_fiber's: the thread's stack, as ASan reports it)
#if defined(EMU_FIBERS_UCONTEXT)
    ucontext_t context;
#else
    void* sp = nullptr;                     // where emu_fiber_switch left the registers
#endif
    void* fake_stack = nullptr;             // ASan's, while switched away
    const Barrier* wait_at = nullptr;       // the barrier this fiber waits at, if any,
    uint64_t wait_phase = 0;                // and the phase it arrived in
    const char* why = nullptr;              // for the deadlock message, if the barrier's name is not enough
    bool done = false;                      // returned from its entry
    int turn = 0;                           // its place in run()'s order
};

inline Fiber* current = nullptr;        // the fiber running now
inline Fiber main_fiber;                // the stack that called run()
inline Fiber* const* turns = nullptr;   // run()'s fibers, in the order they take turns
inline int round_size = 0, gang_size = 1, returned = 0;
inline void (*entry)(Fiber*) = nullptr;
inline long round_label = 0;            // for the deadlock message (the block)
inline Fiber* switched_from = nullptr;  // the fiber the last switch left
/// Called when no fiber can run and some have not returned: may make one runnable (a copy lands,
/// a wait times out) and then returns true; false means the block is deadlocked.
inline bool (*stall)() = nullptr;

inline bool runnable(const Fiber* f) { return !f->done && (f->wait_at == nullptr || f->wait_at->phase != f->wait_phase); }

[[noreturn]] inline void deadlock() {
    int waiting = 0, ended = 0;
    const char* whats[8];  // the first distinct waits, each with its count
    int counts[8], kinds = 0;
    for (int i = 0; i < round_size; ++i) {
        const Fiber* f = turns[i];
        if (f->done) {
            ++ended;
            continue;
        }
        if (f->wait_at == nullptr) continue;
        ++waiting;
        const char* what = f->why != nullptr ? f->why : f->wait_at->what;
        int k = 0;
        while (k < kinds && std::strcmp(whats[k], what) != 0) ++k;
        if (k == kinds && kinds < 8) whats[kinds] = what, counts[kinds++] = 0;
        if (k < kinds) ++counts[k];
    }
    std::fprintf(stderr,
                 "emulator: deadlock in block %ld: %d threads wait, %d have returned: a barrier that not every thread "
                 "of its block or warp reaches, or a wait that nothing will end:\n",
                 round_label, waiting, ended);
    for (int k = 0; k < kinds; ++k) std::fprintf(stderr, "  %d at %s\n", counts[k], whats[k]);
    std::abort();
}

/// Leaves the current fiber for `to`; returns when some fiber switches back to this one.
EMU_FIBERS_NO_ASAN inline void switch_to(Fiber* to) {
    Fiber* const from = current;
    switched_from = from;
    current = to;
#if defined(EMU_FIBERS_ASAN)
    // A fiber that returned never runs again: its fake stack goes.
    __sanitizer_start_switch_fiber(from->done ? nullptr : &from->fake_stack, to->stack, to->stack_bytes);
#endif
#if defined(EMU_FIBERS_UCONTEXT)
    if (swapcontext(&from->context, &to->context) != 0) {
        std::fprintf(stderr, "emulator: swapcontext failed\n");
        std::abort();
    }
#else
    emu_fiber_switch(&from->sp, to->sp);
#endif
#if defined(EMU_FIBERS_ASAN)
    const void* bottom;
    size_t bytes;
    __sanitizer_finish_switch_fiber(current->fake_stack, &bottom, &bytes);
    if (switched_from == &main_fiber) {
        main_fiber.stack = static_cast<unsigned char*>(const_cast<void*>(bottom));
        main_fiber.stack_bytes = bytes;
    }
#endif
}

/// Runs the next fiber that can run: of the current fiber's gang first (round robin from it),
/// else of the gangs after it, in order, each from its first fiber. Back to run()'s caller once
/// all have returned. When none can run and some have not returned, `stall` may make one
/// runnable; if it cannot, that is a deadlock.
EMU_FIBERS_NO_ASAN inline void reschedule() {
    Fiber* const self = current;
    const int base = self->turn - self->turn % gang_size;
    for (;;) {
        for (int k = 0, j = self->turn; k < gang_size; ++k) {
            if (++j == base + gang_size) j = base;
            if (runnable(turns[j])) {
                if (turns[j] != self) switch_to(turns[j]);
                return;
            }
        }
        for (int g = base + gang_size;; g += gang_size) {
            if (g == round_size) g = 0;
            if (g == base) break;
            for (int i = g; i < g + gang_size; ++i) {
                if (runnable(turns[i])) {
                    switch_to(turns[i]);
                    return;
                }
            }
        }
        if (returned == round_size) {
            switch_to(&main_fiber);
            return;
        }
        if (stall == nullptr || !stall()) deadlock();
    }
}

/// Where a new fiber starts (on its own stack): the entry, then the next fiber for good.
EMU_FIBERS_NO_ASAN inline void fiber_start(Fiber* self) {
#if defined(EMU_FIBERS_ASAN)
    const void* bottom;
    size_t bytes;
    __sanitizer_finish_switch_fiber(nullptr, &bottom, &bytes);
    if (switched_from == &main_fiber) {
        main_fiber.stack = static_cast<unsigned char*>(const_cast<void*>(bottom));
        main_fiber.stack_bytes = bytes;
    }
#endif
    entry(self);
    self->done = true;
    ++returned;
    reschedule();
    std::fprintf(stderr, "emulator: a returned fiber ran again\n");
    std::abort();
}

#if defined(EMU_FIBERS_UCONTEXT)
inline void ucontext_start() { fiber_start(current); }
#endif

/// Gives `f` its stack (once) and a context that starts at fiber_start(f).
inline void prepare(Fiber* f) {
    if (f->mapping == nullptr) {
        const size_t guard = Fiber::guard_bytes();
        void* m = mmap(nullptr, kStackBytes + guard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED || mprotect(m, guard, PROT_NONE) != 0) {
            std::fprintf(stderr, "emulator: no memory for a fiber's stack\n");
            std::abort();
        }
        f->mapping = m;
        f->stack = static_cast<unsigned char*>(m) + guard;
        f->stack_bytes = kStackBytes;
    }
#if defined(EMU_FIBERS_UCONTEXT)
    if (getcontext(&f->context) != 0) {
        std::fprintf(stderr, "emulator: getcontext failed\n");
        std::abort();
    }
    f->context.uc_stack.ss_sp = f->stack;
    f->context.uc_stack.ss_size = f->stack_bytes;
    f->context.uc_link = nullptr;
    makecontext(&f->context, &ucontext_start, 0);
#else
    // The frame emu_fiber_switch pops: r15, r14, r13 = fiber_start, r12 = f, rbx, rbp = 0 (the end
    // of the frame-pointer chain), then the return address, the trampoline. Above it the stack
    // pointer is 16-aligned, so fiber_start is entered as after an ordinary call.
    const uintptr_t top = (reinterpret_cast<uintptr_t>(f->stack) + f->stack_bytes - 64) & ~uintptr_t(15);
    void** sp = reinterpret_cast<void**>(top);
    *--sp = reinterpret_cast<void*>(&emu_fiber_trampoline);
    *--sp = nullptr;  // rbp
    *--sp = nullptr;  // rbx
    *--sp = f;        // r12
    *--sp = reinterpret_cast<void*>(&fiber_start);  // r13
    *--sp = nullptr;  // r14
    *--sp = nullptr;  // r15
    f->sp = sp;
#endif
    f->fake_stack = nullptr;
    f->wait_at = nullptr;
    f->done = false;
}

/// Runs `fibers[0 .. n)`, each `body(fiber)` from the start, and returns when all have returned.
/// They take turns in gangs of `gang` (fibers[0 .. gang), then the next `gang`, ...; n a multiple
/// of it): a fiber that waits hands over to the next of its gang that can run, and only when none
/// can, to the next gang. `label` names them in the deadlock message (emu::launch: the block).
inline void run(Fiber* const* fibers, int n, int gang, void (*body)(Fiber*), long label) {
    if (current != nullptr || gang <= 0 || n % gang != 0) {
        std::fprintf(stderr, "emulator: fibers started from a fiber, or %d fibers in gangs of %d\n", n, gang);
        std::abort();
    }
    turns = fibers, round_size = n, gang_size = gang, returned = 0, entry = body, round_label = label;
    for (int i = 0; i < n; ++i) {
        prepare(fibers[i]);
        fibers[i]->turn = i;
    }
    if (n == 0) return;
    current = &main_fiber;
    switch_to(fibers[0]);
    current = nullptr;
    turns = nullptr, round_size = 0;
}

/// Parks the current fiber until `b`'s phase is no longer `phase` (other fibers run meanwhile), or
/// until another party clears its wait_at (async_units.hpp: try_wait's time limit). `why`, if given,
/// names the wait in a deadlock message (it must live until the fiber runs again).
inline void wait_for(const Barrier& b, uint64_t phase, const char* why = nullptr) {
    Fiber* const self = current;
    self->wait_at = &b;
    self->wait_phase = phase;
    self->why = why;
    reschedule();
    self->wait_at = nullptr;
    self->why = nullptr;
}

/// Arrives at `b` and waits for the rest of its fibers (other fibers run meanwhile).
inline void arrive_and_wait(Barrier& b) {
    if (++b.arrived < b.count) {
        wait_for(b, b.phase);
    } else {
        b.arrived = 0;
        ++b.phase;
    }
}

}  // namespace emu::fibers
