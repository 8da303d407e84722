#include "fa/timing.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

namespace fa {

TimingStats summarize(std::vector<double> samples_ms) {
    TimingStats stats;
    stats.samples_ms = samples_ms;
    if (samples_ms.empty()) return stats;
    std::sort(samples_ms.begin(), samples_ms.end());
    const size_t n = samples_ms.size();
    stats.median_ms = n % 2 ? samples_ms[n / 2] : 0.5 * (samples_ms[n / 2 - 1] + samples_ms[n / 2]);
    stats.min_ms = samples_ms.front();
    stats.max_ms = samples_ms.back();
    return stats;
}

TimingStats time_host(const std::function<void()>& fn, int warmup, int repeat) {
    for (int i = 0; i < warmup; ++i) fn();
    std::vector<double> samples;
    samples.reserve(static_cast<size_t>(repeat));
    for (int i = 0; i < repeat; ++i) {
        const auto start = std::chrono::steady_clock::now();
        fn();
        const auto stop = std::chrono::steady_clock::now();
        samples.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
    }
    return summarize(std::move(samples));
}

namespace {

// Reads a "Key:   123 kB" line from a /proc file; returns bytes or -1.
int64_t read_kb_field(const char* path, const std::string& key) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
        if (line.compare(0, key.size(), key) == 0 && line.size() > key.size() && line[key.size()] == ':') {
            std::istringstream fields(line.substr(key.size() + 1));
            int64_t kb = 0;
            if (fields >> kb) return kb * 1024;
        }
    }
    return -1;
}

}  // namespace

int64_t peak_rss_bytes() { return std::max<int64_t>(0, read_kb_field("/proc/self/status", "VmHWM")); }

int64_t current_rss_bytes() { return std::max<int64_t>(0, read_kb_field("/proc/self/status", "VmRSS")); }

bool reset_peak_rss() {
    // Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    std::ofstream out("/proc/self/clear_refs");
    if (!out) return false;
    out << "5";
    out.flush();
    return static_cast<bool>(out);
}

int64_t available_memory_bytes() { return read_kb_field("/proc/meminfo", "MemAvailable"); }

}  // namespace fa
