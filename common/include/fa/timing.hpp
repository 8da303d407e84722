/// \file timing.hpp
/// \brief Wall-clock timing with warm-up and medians, and the process's peak memory.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace fa {

/// Summary of repeated timings, in milliseconds.
struct TimingStats {
    double median_ms = 0;            ///< the figure every report quotes
    double min_ms = 0;               ///< fastest repetition
    double max_ms = 0;               ///< slowest repetition
    std::vector<double> samples_ms;  ///< every repetition, in order
};

/// Sorts a copy of `samples_ms` and fills the summary.
TimingStats summarize(std::vector<double> samples_ms);

/// Runs `fn` `warmup` times untimed, then `repeat` times each timed with a steady clock.
TimingStats time_host(const std::function<void()>& fn, int warmup, int repeat);

/// Peak resident set size of this process in bytes since start or since the last
/// reset_peak_rss() (Linux VmHWM); 0 where the system does not say.
int64_t peak_rss_bytes();

/// Current resident set size in bytes (Linux VmRSS); 0 where unknown.
int64_t current_rss_bytes();

/// Resets the peak so the next peak_rss_bytes() measures only what follows. Returns false
/// where the kernel does not allow it (then the peak covers the whole process).
bool reset_peak_rss();

/// Memory the system could still give this process, in bytes (Linux MemAvailable); -1 if unknown.
int64_t available_memory_bytes();

}  // namespace fa
