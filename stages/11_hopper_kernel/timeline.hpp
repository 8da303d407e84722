/// \file stages/11_hopper_kernel/timeline.hpp
/// \brief What the marks of stage 11's instrumented build say (fa/cuda/timeline.cuh): one code per
/// thing a warpgroup waits for or does, shared by the kernel, the executable that writes them out
/// (`--timeline FILE`) and docs/make_timeline.py, which draws them.
///
/// A mark says what has just *ended*; the span from the warpgroup's previous mark to this one is
/// that activity. A consumer warpgroup's tile at steps 4 to 8 reads, mark by mark:
///
///     slot_full   waited for K_j and V_j to land (the full barrier of their slot)
///     turn        waited for its turn on the tensor cores (ping-pong's named barrier)
///     issued      issued S_j = Q K_j^T and P_{j-1} V_{j-1}
///     s_ready     waited for S_j (wgmma.wait_group 1; at step 4, for both products)
///     softmax     the online softmax of S_j
///     pv_done     waited for P_{j-1} V_{j-1} (step 5 on)
///     rescaled    O rescaled by alpha, P_j rounded into the A operand
///
/// At step 3 (no turns) a tile is issued (S), s_ready, softmax, rescaled, issued (P V), pv_done.
/// The producer's marks: slot_empty (waited for a slot the consumers released), load_issued (the
/// TMA copies of K_j and V_j issued). The persistent grid (step 9) opens each work item with an
/// `item` mark (its tile field: how many key tiles the item has) and repeats a consumer's
/// q_landed, tiles and epilogue for each, and the producer's q_empty (waited for the consumers to
/// release Q's buffer, from the second item with keys on), q_issued and tiles.
#pragma once

namespace fa::stage11 {

/// Marks each warpgroup of the recording block keeps; a longer run stops recording there.
constexpr int kTimelineMarks = 4096;

/// The codes of the marks (TimelineMark::what).
enum TimelineCode : unsigned short {
    kMarkStart = 0,    ///< the warpgroup starts its role (after setmaxnreg); carries the ns clock
    kMarkQIssued,      ///< producer: Q's TMA copy issued
    kMarkSlotEmpty,    ///< producer: waited for a slot the consumers released
    kMarkLoadIssued,   ///< producer: the TMA copies of K_j and V_j issued
    kMarkQLanded,      ///< consumer: waited for Q to land
    kMarkSlotFull,     ///< consumer: waited for K_j and V_j to land
    kMarkTurn,         ///< consumer: waited for its turn (ping-pong)
    kMarkIssued,       ///< consumer: issued its GEMMs
    kMarkSReady,       ///< consumer: waited for S_j
    kMarkSoftmax,      ///< consumer: the online softmax of S_j
    kMarkPVDone,       ///< consumer: waited for P V
    kMarkRescaled,     ///< consumer: O rescaled, P rounded into registers
    kMarkEpilogue,     ///< consumer: O and LSE written
    kMarkEnd,          ///< the warpgroup's last mark; carries the ns clock
    kMarkQEmpty,       ///< producer, persistent grid: waited for the consumers to release Q's buffer
    kMarkItem,         ///< persistent grid: a work item taken (its tile field: the item's key tiles)
    kMarkCodes         ///< how many codes there are
};

/// The name of each code, as the executable writes it (index: TimelineCode).
inline const char* timeline_code_name(int code) {
    static const char* const names[kMarkCodes] = {"start",   "q_issued", "slot_empty", "load_issued", "q_landed",
                                                  "slot_full", "turn",   "issued",     "s_ready",     "softmax",
                                                  "pv_done", "rescaled", "epilogue",   "end",         "q_empty",  "item"};
    return code >= 0 && code < kMarkCodes ? names[code] : "?";
}

}  // namespace fa::stage11
